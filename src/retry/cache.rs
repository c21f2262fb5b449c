//! Workflow metadata as the controller's watches cache it, and word of each
//! workflow's changes: what a request that follows a workflow (a
//! WorkflowRetry naming a live one) reads instead of asking the API server
//! again and again. A thousand such requests cost no API request at all
//! while they wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use tokio::sync::Notify;

use crate::argo::workflow::Workflow;

/// (namespace, name) -> the notifier its followers wait on, and how many
/// follow it.
type Waiters = HashMap<(String, String), (Arc<Notify>, usize)>;

/// The caches of the watched namespaces (one per watch), and who waits for
/// which workflow.
pub struct WorkflowCache {
    stores: Vec<Store<PartialObjectMeta<Workflow>>>,
    waiters: Mutex<Waiters>,
}

impl WorkflowCache {
    /// A cache of `watches` stores, and the writers the watches fill them with.
    pub fn new(watches: usize) -> (Arc<Self>, Vec<Writer<PartialObjectMeta<Workflow>>>) {
        let (stores, writers) = (0..watches).map(|_| reflector::store()).unzip();
        let cache = WorkflowCache {
            stores,
            waiters: Mutex::default(),
        };
        (Arc::new(cache), writers)
    }

    /// The stores, to wait until they are ready.
    pub fn stores(&self) -> &[Store<PartialObjectMeta<Workflow>>] {
        &self.stores
    }

    /// Workflow `namespace/name` as cached; `None` also for one that carries
    /// none of rewind's annotations and that no request follows (the watches
    /// keep only those), so a caller that must know reads the API server.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<PartialObjectMeta<Workflow>>> {
        let reference = ObjectRef::new(name).within(namespace);
        self.stores.iter().find_map(|s| s.get(&reference))
    }

    /// Follows workflow `namespace/name`: the subscription's notifier wakes
    /// at each change the watch sees.
    pub fn follow(self: &Arc<Self>, namespace: &str, name: &str) -> Following {
        let key = (namespace.to_owned(), name.to_owned());
        let notify = {
            let mut waiters = self.lock();
            let entry = waiters
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        Following {
            cache: self.clone(),
            key,
            notify,
        }
    }

    /// Whether a request follows workflow `namespace/name`: the watches keep
    /// it cached then, asked or not.
    pub fn followed(&self, namespace: &str, name: &str) -> bool {
        self.lock()
            .contains_key(&(namespace.to_owned(), name.to_owned()))
    }

    /// The watch saw workflow `namespace/name` change (the cache already has it).
    pub fn changed(&self, namespace: &str, name: &str) {
        let waiters = self.lock();
        if let Some((notify, _)) = waiters.get(&(namespace.to_owned(), name.to_owned())) {
            notify.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One follower of one workflow; dropping it stops following.
pub struct Following {
    cache: Arc<WorkflowCache>,
    key: (String, String),
    notify: Arc<Notify>,
}

impl Following {
    /// Resolves at the workflow's next change after this call; check the
    /// cache after calling it and await it after, so no change is missed.
    pub fn notified(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut notified = Box::pin(self.notify.notified());
        notified.as_mut().enable();
        notified
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut waiters = self.cache.lock();
        if let Some(entry) = waiters.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                waiters.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_follower_wakes_on_its_workflows_change_only_and_leaves_no_trace() {
        let (cache, _writers) = WorkflowCache::new(1);
        let following = cache.follow("ns", "wf");
        let other = cache.follow("ns", "other");
        let woken = following.notified();
        let not_woken = other.notified();
        cache.changed("ns", "wf");
        tokio::time::timeout(std::time::Duration::from_secs(1), woken)
            .await
            .expect("the follower of wf is woken");
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(50), not_woken).await;
        assert!(
            quiet.is_err(),
            "the follower of another workflow stays asleep"
        );
        drop(following);
        drop(other);
        assert!(cache.lock().is_empty());
    }
}
