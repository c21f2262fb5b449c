//! The controller: watches Workflow metadata and keeps an in-memory index of it.
//!
//! Only metadata is watched, so memory does not grow with
//! the size of workflow statuses: a 10,000-node workflow costs the same as an
//! empty one. Retry requests are annotations, which metadata carries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt, future, stream};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::workflow::{Workflow, labels};

/// The annotation a user sets (to any new value) to request a retry.
pub const RETRY_ANNOTATION: &str = "rewind.dev/retry";

/// Which workflows this controller serves.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Namespaces to watch; empty means all namespaces.
    pub namespaces: Vec<String>,
    /// Serve only workflows labelled with this Argo controller instance ID;
    /// `None` serves only workflows without the label, as Argo does.
    pub instance_id: Option<String>,
}

impl Scope {
    /// The label selector that picks this instance's workflows.
    pub fn label_selector(&self) -> String {
        match &self.instance_id {
            Some(id) => format!("{}={id}", labels::CONTROLLER_INSTANCE_ID),
            None => format!("!{}", labels::CONTROLLER_INSTANCE_ID),
        }
    }
}

/// Shared state the HTTP endpoints read.
#[derive(Clone, Debug, Default)]
pub struct State {
    ready: Arc<AtomicBool>,
}

impl State {
    /// True once every watched namespace has been listed once.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// Watches workflow metadata until `shutdown` is cancelled.
pub async fn run(client: Client, scope: Scope, state: State, shutdown: CancellationToken) {
    // `Api<PartialObjectMeta<_>>` makes metadata-only list and watch requests.
    let apis: Vec<Api<PartialObjectMeta<Workflow>>> = if scope.namespaces.is_empty() {
        vec![Api::all(client)]
    } else {
        scope.namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
    };
    let config = watcher::Config::default().labels(&scope.label_selector());
    let (stores, streams): (Vec<Store<PartialObjectMeta<Workflow>>>, Vec<_>) = apis
        .into_iter()
        .map(|api| {
            let (store, writer) = reflector::store();
            let stream = reflector::reflector(writer, watcher(api, config.clone()))
                .default_backoff()
                .applied_objects()
                .boxed();
            (store, stream)
        })
        .unzip();

    let readiness = {
        let state = state.clone();
        async move {
            future::join_all(stores.iter().map(|s| s.wait_until_ready())).await;
            state.ready.store(true, Ordering::Relaxed);
            info!(namespaces = ?scope.namespaces, "workflow metadata cache synced");
            future::pending::<()>().await
        }
    };

    let events = stream::select_all(streams).for_each(|event| async move {
        match event {
            Ok(meta) => {
                if let Some(token) = meta.annotations().get(RETRY_ANNOTATION) {
                    debug!(workflow = %meta.name_any(), namespace = meta.namespace().unwrap_or_default(),
                        token, "workflow carries a retry request");
                }
            }
            Err(error) => warn!(%error, "workflow watch failed; retrying with backoff"),
        }
    });

    tokio::select! {
        _ = shutdown.cancelled() => info!("controller stopping"),
        _ = readiness => {}
        _ = events => warn!("workflow watch ended"),
    }
}
