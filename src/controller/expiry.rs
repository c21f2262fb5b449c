//! Deleting finished WorkflowRetry objects after `spec.ttlSecondsAfterFinished`:
//! one task for all of them, fed by the WorkflowRetry watch, sleeping until
//! the earliest is due. A task per object would keep a thousand finished
//! objects' sleeping tasks for up to a year, and read each one again at every
//! start.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::protocol::crd::WorkflowRetry;
use crate::retry::workflowretry::expires_at;

/// Wait before trying again a delete the API server refused (not for a
/// reason that says the object is gone or replaced).
const RETRY_DELETE: Duration = Duration::from_secs(60);

/// One object due for deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    at: Timestamp,
    namespace: String,
    name: String,
}

/// The objects due, by UID and by time.
#[derive(Debug, Default)]
struct Due {
    by_time: BTreeSet<(Timestamp, String)>,
    by_uid: HashMap<String, Entry>,
}

impl Due {
    fn put(&mut self, uid: String, entry: Entry) {
        self.remove(&uid);
        self.by_time.insert((entry.at, uid.clone()));
        self.by_uid.insert(uid, entry);
    }

    fn remove(&mut self, uid: &str) -> Option<Entry> {
        let old = self.by_uid.remove(uid)?;
        self.by_time.remove(&(old.at, uid.to_owned()));
        Some(old)
    }

    /// The earliest entry: taken out if due at `now`, else when it is due.
    fn next(&mut self, now: Timestamp) -> Option<Result<(String, Entry), Timestamp>> {
        let (at, uid) = self.by_time.first()?.clone();
        if at > now {
            return Some(Err(at));
        }
        let entry = self.remove(&uid)?;
        Some(Ok((uid, entry)))
    }
}

/// The finished WorkflowRetry objects waiting out their TTL: as many entries
/// as such objects the watch has shown, and one task.
#[derive(Debug, Default)]
pub struct Expiry {
    due: Mutex<Due>,
    changed: Notify,
}

impl Expiry {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Notes `object` as seen now: due at its expiry if it finished with a
    /// TTL, else not due (a TTL past what a timestamp holds never expires).
    pub fn note(&self, object: &WorkflowRetry) {
        let Some(uid) = object.uid() else {
            return;
        };
        let mut due = self.lock();
        match expires_at(object) {
            Some(at) => {
                let entry = Entry {
                    at,
                    namespace: object.namespace().unwrap_or_default(),
                    name: object.name_any(),
                };
                if due.by_uid.get(&uid) != Some(&entry) {
                    due.put(uid, entry);
                    self.changed.notify_one();
                }
            }
            None => {
                due.remove(&uid);
            }
        }
    }

    /// Forgets the object with `uid` (it was deleted).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Deletes each object as it falls due, until `shutdown`.
    pub async fn run(&self, client: kube::Client, shutdown: CancellationToken) {
        loop {
            let changed = self.changed.notified();
            let next = self.lock().next(Timestamp::now());
            let wait = match next {
                Some(Ok((uid, entry))) => {
                    if !delete(&client, &uid, &entry).await {
                        let at = Timestamp::now()
                            .checked_add(SignedDuration::try_from(RETRY_DELETE).unwrap_or_default())
                            .unwrap_or(entry.at);
                        self.lock().put(uid, Entry { at, ..entry });
                    }
                    continue;
                }
                Some(Err(at)) => Duration::try_from(at.duration_since(Timestamp::now()))
                    .unwrap_or(Duration::ZERO),
                // Nothing due: until an object is noted.
                None => Duration::MAX,
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changed => {}
                _ = tokio::time::sleep(wait.min(Duration::from_secs(86_400))) => {}
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Due> {
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Deletes the object (only that one: its UID is the delete's precondition);
/// false if it should be tried again.
async fn delete(client: &kube::Client, uid: &str, entry: &Entry) -> bool {
    let api: Api<WorkflowRetry> = Api::namespaced(client.clone(), &entry.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&entry.name, &params).await {
        Ok(_) => {
            info!(
                workflowretry = entry.name,
                namespace = entry.namespace,
                "deleted after ttlSecondsAfterFinished"
            );
            true
        }
        // Gone already, or replaced by a new object of the same name.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
        Err(error) => {
            warn!(
                workflowretry = entry.name,
                namespace = entry.namespace,
                %error,
                "could not delete the finished WorkflowRetry after its TTL; trying again in a minute"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: &str, name: &str) -> Entry {
        Entry {
            at: at.parse().unwrap(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_earliest_due_object_comes_first_and_a_new_expiry_replaces_the_old() {
        let mut due = Due::default();
        due.put("a".into(), entry("2026-01-01T00:00:10Z", "a"));
        due.put("b".into(), entry("2026-01-01T00:00:05Z", "b"));
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(
            due.next(now),
            Some(Err("2026-01-01T00:00:05Z".parse().unwrap()))
        );
        // b's TTL grew: a comes first now, and b has one entry only.
        due.put("b".into(), entry("2026-01-01T00:00:20Z", "b"));
        assert_eq!((due.by_time.len(), due.by_uid.len()), (2, 2));
        let later: Timestamp = "2026-01-01T00:00:15Z".parse().unwrap();
        assert_eq!(
            due.next(later),
            Some(Ok(("a".into(), entry("2026-01-01T00:00:10Z", "a"))))
        );
        assert_eq!(
            due.next(later),
            Some(Err("2026-01-01T00:00:20Z".parse().unwrap()))
        );
        assert_eq!(due.remove("b"), Some(entry("2026-01-01T00:00:20Z", "b")));
        assert_eq!(due.next(later), None);
        assert!(due.by_time.is_empty() && due.by_uid.is_empty());
    }
}
