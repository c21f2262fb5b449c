//! Watches Workflow metadata and WorkflowRetry objects and hands each event
//! to the [`Dispatcher`].
//!
//! Only workflow metadata is watched, so memory does not grow with the size
//! of workflow statuses: a 10,000-node workflow costs the same as an empty
//! one. Retry requests are annotations, which metadata carries. Every list,
//! relist and event re-checks the annotations, so a request seen while the
//! controller was down is picked up at start (rule 4).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt as _, future, stream};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::argo::workflow::{Workflow, labels};
use crate::controller::dispatch::{Dispatcher, panic_message};
use crate::controller::expiry::Expiry;
use crate::protocol::crd::WorkflowRetry;
use crate::protocol::request;
use crate::retry::cache::WorkflowCache;
use crate::retry::{Context, Scope};

/// How often the cache is walked for pending requests that no task serves.
const RESYNC: Duration = Duration::from_secs(60);

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
pub async fn run(
    ctx: Context,
    writers: Vec<Writer<PartialObjectMeta<Workflow>>>,
    state: State,
    shutdown: CancellationToken,
) {
    let client: Client = ctx.client();
    let scope = ctx.scope.clone();
    // `Api<PartialObjectMeta<_>>` makes metadata-only list and watch requests.
    let apis: Vec<Api<PartialObjectMeta<Workflow>>> = scoped_apis(&client, &scope);
    let config = watcher::Config::default().labels(&scope.label_selector());
    let streams: Vec<_> = apis
        .into_iter()
        .zip(writers)
        .map(|(api, writer)| {
            let (store, mut writer, cache) = (writer.as_reader(), writer, ctx.workflows.clone());
            watcher(api, config.clone())
                .modify(keep_what_requests_read)
                .inspect_ok(move |event| cache_only_requested(&mut writer, &cache, event))
                .default_backoff()
                .flat_map(move |event| stream::iter(seen(&store, event)))
                .boxed()
        })
        .collect();
    let cache = ctx.workflows.clone();
    let metrics = ctx.metrics.clone();
    let expiry = Expiry::new();
    let dispatcher = Dispatcher::new(Arc::new(ctx), expiry.clone(), shutdown.clone());

    let objects = stream::select_all(scoped_apis::<WorkflowRetry>(&client, &scope).into_iter().map(
        |api| {
            watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed()
        },
    ))
    .for_each(|event| {
        match event {
            Ok(watcher::Event::Delete(object)) => expiry.forget(&object.uid().unwrap_or_default()),
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                expiry.note(&object);
                let (name, namespace) = (object.name_any(), object.namespace());
                let started = std::panic::catch_unwind(AssertUnwindSafe(|| dispatcher.object(object)));
                if let Err(panic) = started {
                    error!(workflowretry = name, namespace, panic = panic_message(&*panic), "starting the WorkflowRetry panicked; it is skipped");
                    metrics.request_panicked("workflowretry");
                }
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(error) => {
                warn!(%error, "WorkflowRetry watch failed (is its CRD installed?); retrying with backoff")
            }
        }
        future::ready(())
    });

    let readiness = {
        let (state, cache, dispatcher) = (state.clone(), cache.clone(), dispatcher.clone());
        async move {
            future::join_all(cache.stores().iter().map(|s| s.wait_until_ready())).await;
            state.ready.store(true, Ordering::Relaxed);
            info!(namespaces = ?scope.namespaces, "workflow metadata cache synced");
            // Rule 7's safety net: a request the cache shows pending that no task serves (its
            // end could not be written, say, and no event came since) is served again.
            let mut resync = tokio::time::interval(RESYNC);
            resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            resync.tick().await;
            loop {
                resync.tick().await;
                let started = cache
                    .stores()
                    .iter()
                    .flat_map(|s| s.state())
                    .filter(|meta| dispatcher.workflow(meta))
                    .count();
                if started > 0 {
                    warn!(
                        started,
                        "requests pending but served by no task were started again"
                    );
                }
            }
        }
    };

    let workflows = stream::select_all(streams).for_each(|event| {
        match event {
            Ok(Seen::Gone(meta)) => {
                cache.changed(&meta.namespace().unwrap_or_default(), &meta.name_any())
            }
            Ok(Seen::Cached(meta)) => {
                cache.changed(&meta.namespace().unwrap_or_default(), &meta.name_any());
                let started =
                    std::panic::catch_unwind(AssertUnwindSafe(|| dispatcher.workflow(&meta)));
                if let Err(panic) = started {
                    error!(
                        workflow = meta.name_any(),
                        namespace = meta.namespace(),
                        panic = panic_message(&*panic),
                        "starting the workflow's retry panicked; it is skipped"
                    );
                    metrics.request_panicked("workflow");
                }
            }
            Err(error) => warn!(%error, "workflow watch failed; retrying with backoff"),
        }
        future::ready(())
    });

    tokio::select! {
        _ = shutdown.cancelled() => info!("controller stopping"),
        _ = readiness => {}
        _ = expiry.run(client.clone(), shutdown.clone()) => {}
        _ = workflows => warn!("workflow watch ended"),
        _ = objects => warn!("WorkflowRetry watch ended"),
    }
    // Requests stop at once, but a reset already written is still reported.
    dispatcher.stopped().await;
}

/// What a workflow watch event tells the requests: a workflow as the cache
/// now has it, or one gone from it.
#[derive(Debug)]
enum Seen {
    Cached(Arc<PartialObjectMeta<Workflow>>),
    Gone(Arc<PartialObjectMeta<Workflow>>),
}

/// The workflows `event` shows as `store` has them once the reflector applied
/// it. A (re)list's objects are shown when it is complete (`InitDone`), all of
/// them from the store, not one by one as they come in: until then the store
/// still holds the view from before the list (empty at start), and a request
/// started from a list's first page, while later pages took seconds, read its
/// workflow as gone there, ended without a word and was never served again.
fn seen(
    store: &reflector::Store<PartialObjectMeta<Workflow>>,
    event: Result<watcher::Event<PartialObjectMeta<Workflow>>, watcher::Error>,
) -> Vec<Result<Seen, watcher::Error>> {
    match event {
        Ok(watcher::Event::Apply(meta)) => vec![Ok(Seen::Cached(Arc::new(meta)))],
        Ok(watcher::Event::Delete(meta)) => vec![Ok(Seen::Gone(Arc::new(meta)))],
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Vec::new(),
        Ok(watcher::Event::InitDone) => store
            .state()
            .into_iter()
            .map(|m| Ok(Seen::Cached(m)))
            .collect(),
        Err(error) => vec![Err(error)],
    }
}

/// One API per watched namespace, or one for all namespaces.
pub(super) fn scoped_apis<K>(client: &Client, scope: &Scope) -> Vec<Api<K>>
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

/// Applies `event` to the cache, which keeps only workflows that carry one of
/// rewind's annotations or that a request follows (a WorkflowRetry about to
/// ask): the others, nearly all of a cluster's (100,000 in the largest), are
/// what no request reads, and would cost their memory for nothing. One that
/// loses its last annotation leaves the cache.
fn cache_only_requested(
    writer: &mut Writer<PartialObjectMeta<Workflow>>,
    cache: &WorkflowCache,
    event: &watcher::Event<PartialObjectMeta<Workflow>>,
) {
    // `keep_what_requests_read` left only rewind's annotations, or none.
    let kept = |meta: &PartialObjectMeta<Workflow>| {
        meta.metadata.annotations.is_some()
            || cache.followed(
                meta.metadata.namespace.as_deref().unwrap_or_default(),
                meta.metadata.name.as_deref().unwrap_or_default(),
            )
    };
    match event {
        watcher::Event::Apply(meta) if !kept(meta) => {
            writer.apply_watcher_event(&watcher::Event::Delete(meta.clone()));
        }
        watcher::Event::InitApply(meta) if !kept(meta) => {}
        event => writer.apply_watcher_event(event),
    }
}

/// The labels requests read from the cache: whether the workflow runs again,
/// and which Argo controller it belongs to.
const KEPT_LABELS: [&str; 3] = [
    labels::COMPLETED,
    labels::PHASE,
    labels::CONTROLLER_INSTANCE_ID,
];

/// What the cache keeps of a workflow's metadata: what requests read (its
/// name, UID, version, the labels above and rewind's own annotations). The
/// rest is dropped: a cluster of 100,000 workflows keeps 100,000 of these,
/// and other labels, owner references, finalizers and annotations
/// (`kubectl.kubernetes.io/last-applied-configuration` alone can be as large
/// as the workflow) would double their size for nothing.
fn keep_what_requests_read(meta: &mut PartialObjectMeta<Workflow>) {
    let meta = &mut meta.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.creation_timestamp = None;
    meta.generate_name = None;
    meta.generation = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|key, _| KEPT_LABELS.contains(&key.as_str()));
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, _| key.starts_with(request::annotations::PREFIX));
    }
    for map in [&mut meta.labels, &mut meta.annotations] {
        if map.as_ref().is_some_and(|m| m.is_empty()) {
            *map = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow(name: &str) -> PartialObjectMeta<Workflow> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": "ns"},
        }))
        .unwrap()
    }

    /// The names `seen` shows for `event`, applied to the store first as the reflector does.
    fn shown(
        writer: &mut Writer<PartialObjectMeta<Workflow>>,
        event: watcher::Event<PartialObjectMeta<Workflow>>,
    ) -> Vec<String> {
        writer.apply_watcher_event(&event);
        let mut names: Vec<String> = seen(&writer.as_reader(), Ok(event))
            .into_iter()
            .map(|s| match s.unwrap() {
                Seen::Cached(m) => m.name_any(),
                Seen::Gone(m) => format!("gone {}", m.name_any()),
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_lists_workflows_are_shown_once_the_store_holds_the_whole_list() {
        let (store, mut writer) = reflector::store();
        assert!(shown(&mut writer, watcher::Event::Init).is_empty());
        // A first page: the store still holds the view from before the list.
        assert!(shown(&mut writer, watcher::Event::InitApply(workflow("a"))).is_empty());
        assert!(
            store
                .get(&reflector::ObjectRef::new("a").within("ns"))
                .is_none()
        );
        assert!(shown(&mut writer, watcher::Event::InitApply(workflow("b"))).is_empty());
        assert_eq!(shown(&mut writer, watcher::Event::InitDone), ["a", "b"]);
        assert_eq!(
            shown(&mut writer, watcher::Event::Apply(workflow("c"))),
            ["c"]
        );
        assert_eq!(
            shown(&mut writer, watcher::Event::Delete(workflow("a"))),
            ["gone a"]
        );
        assert_eq!(store.state().len(), 2);
    }

    #[test]
    fn the_cache_keeps_what_requests_read_and_nothing_else() {
        let mut meta: PartialObjectMeta<Workflow> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "wf",
                "uid": "u",
                "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["workflows.argoproj.io/artifact-gc"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "o"}],
                "labels": {
                    "workflows.argoproj.io/phase": "Failed",
                    "workflows.argoproj.io/completed": "true",
                    "workflows.argoproj.io/creator": "someone",
                },
                "annotations": {
                    request::annotations::RETRY: "1",
                    request::annotations::STATUS: "{}",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                },
                "managedFields": [{"manager": "argo"}],
            },
        }))
        .unwrap();
        keep_what_requests_read(&mut meta);
        let annotations: Vec<&str> = meta.annotations().keys().map(String::as_str).collect();
        assert_eq!(
            annotations,
            [request::annotations::RETRY, request::annotations::STATUS]
        );
        let labels: Vec<&str> = meta.labels().keys().map(String::as_str).collect();
        assert_eq!(labels, [labels::COMPLETED, labels::PHASE]);
        let kept = &meta.metadata;
        assert_eq!(
            (kept.uid.as_deref(), kept.resource_version.as_deref()),
            (Some("u"), Some("7"))
        );
        assert!(kept.managed_fields.is_none() && kept.owner_references.is_none());
        assert!(kept.finalizers.is_none() && kept.creation_timestamp.is_none());

        // A workflow nobody asked to retry keeps no maps at all.
        let mut plain: PartialObjectMeta<Workflow> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {"name": "wf", "annotations": {"a": "b"}, "labels": {"c": "d"}},
        }))
        .unwrap();
        keep_what_requests_read(&mut plain);
        assert!(plain.metadata.annotations.is_none() && plain.metadata.labels.is_none());
    }
}
