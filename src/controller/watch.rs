//! Watches Workflow metadata and WorkflowRetry objects and hands each event
//! to the [`Dispatcher`].
//!
//! Only workflow metadata is watched, so memory does not grow with the size
//! of workflow statuses: a 10,000-node workflow costs the same as an empty
//! one. Retry requests are annotations, which metadata carries. Every list,
//! relist and event re-checks the annotations, so a request seen while the
//! controller was down is picked up at start (rule 4).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt, future, stream};
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::argo::workflow::Workflow;
use crate::controller::dispatch::Dispatcher;
use crate::protocol::crd::WorkflowRetry;
use crate::retry::{Context, Scope};

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

/// Watches workflow metadata and WorkflowRetry objects, and runs retries
/// until `shutdown` is cancelled; returns once every request has stopped.
pub async fn run(ctx: Context, state: State, shutdown: CancellationToken) {
    let client: Client = ctx.client();
    let scope = ctx.scope.clone();
    // `Api<PartialObjectMeta<_>>` makes metadata-only list and watch requests.
    let apis: Vec<Api<PartialObjectMeta<Workflow>>> = scoped_apis(&client, &scope);
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
    let stores = Arc::new(stores);
    let dispatcher = Dispatcher::new(Arc::new(ctx), stores.clone(), shutdown.clone());

    let objects = stream::select_all(scoped_apis::<WorkflowRetry>(&client, &scope).into_iter().map(
        |api| {
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed()
        },
    ))
    .for_each(|event| {
        match event {
            Ok(object) => dispatcher.object(object),
            Err(error) => {
                warn!(%error, "WorkflowRetry watch failed (is its CRD installed?); retrying with backoff")
            }
        }
        future::ready(())
    });

    let readiness = {
        let (state, stores) = (state.clone(), stores.clone());
        async move {
            future::join_all(stores.iter().map(|s| s.wait_until_ready())).await;
            state.ready.store(true, Ordering::Relaxed);
            info!(namespaces = ?scope.namespaces, "workflow metadata cache synced");
            future::pending::<()>().await
        }
    };

    let workflows = stream::select_all(streams).for_each(|event| {
        match event {
            Ok(meta) => dispatcher.workflow(&meta),
            Err(error) => warn!(%error, "workflow watch failed; retrying with backoff"),
        }
        future::ready(())
    });

    tokio::select! {
        _ = shutdown.cancelled() => info!("controller stopping"),
        _ = readiness => {}
        _ = workflows => warn!("workflow watch ended"),
        _ = objects => warn!("WorkflowRetry watch ended"),
    }
    // Requests stop at once, but a reset already written is still reported.
    dispatcher.stopped().await;
}

/// One API per watched namespace, or one for all namespaces.
fn scoped_apis<K>(client: &Client, scope: &Scope) -> Vec<Api<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    if scope.namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        scope
            .namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    }
}
