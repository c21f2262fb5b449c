//! Watches Workflow metadata and starts a retry for each new request it sees.
//!
//! Only metadata is watched, so memory does not grow with the size of
//! workflow statuses: a 10,000-node workflow costs the same as an empty one.
//! Retry requests are annotations, which metadata carries. Every list, relist
//! and event re-checks the annotations, so a request seen while the
//! controller was down is picked up at start (rule 4).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{StreamExt, future, stream};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use crate::request;
use crate::retry::{self, Target};
use crate::workflow::{Workflow, labels};
use crate::workflowretry::WorkflowRetry;
use crate::workflowretry::serve::{self as wfr, ServeError};

/// Wait before trying a request again after a transient error, doubling up to
/// [`RETRY_BACKOFF_MAX`].
const RETRY_BACKOFF_START: Duration = Duration::from_secs(1);
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Which workflows this controller serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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

/// Watches workflow metadata and WorkflowRetry objects, and runs retries
/// until `shutdown` is cancelled.
pub async fn run(ctx: retry::Context, scope: Scope, state: State, shutdown: CancellationToken) {
    let client: Client = ctx.client.clone();
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
    let ctx = Arc::new(ctx);
    let dispatcher = Dispatcher {
        ctx: ctx.clone(),
        active: Arc::default(),
        stores: stores.clone(),
        shutdown: shutdown.clone(),
        tasks: TaskTracker::new(),
    };
    let requests = WorkflowRetries {
        ctx,
        scope: scope.clone(),
        active: Arc::default(),
        shutdown: shutdown.clone(),
    };
    let retry_objects = stream::select_all(
        scoped_apis::<WorkflowRetry>(&client, &scope)
            .into_iter()
            .map(|api| {
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed()
            }),
    )
    .for_each(|event| {
        match event {
            Ok(object) => requests.start(object),
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

    let events = stream::select_all(streams).for_each(|event| {
        match event {
            Ok(meta) => dispatcher.start_pending(&meta),
            Err(error) => warn!(%error, "workflow watch failed; retrying with backoff"),
        }
        future::ready(())
    });

    tokio::select! {
        _ = shutdown.cancelled() => info!("controller stopping"),
        _ = readiness => {}
        _ = events => warn!("workflow watch ended"),
        _ = retry_objects => warn!("WorkflowRetry watch ended"),
    }
    // Requests stop at once, but a reset already written is still reported.
    dispatcher.tasks.close();
    dispatcher.tasks.wait().await;
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

/// Serves WorkflowRetry objects, one task per object (by UID), and deletes
/// finished ones after their TTL.
#[derive(Clone)]
struct WorkflowRetries {
    ctx: Arc<retry::Context>,
    scope: Scope,
    active: Arc<Mutex<HashSet<String>>>,
    shutdown: CancellationToken,
}

impl WorkflowRetries {
    fn start(&self, object: WorkflowRetry) {
        let Some(uid) = object.uid() else {
            return;
        };
        if object.is_finished() && wfr::expires_at(&object).is_none() {
            return;
        }
        if !self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.clone())
        {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = this.shutdown.cancelled() => {}
                _ = this.serve(object, &uid) => {}
            }
            this.active
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&uid);
        });
    }

    /// The object as the API server has it now; `None` if it is gone or
    /// replaced. A watch event can be older than our own last status write.
    async fn fresh(&self, object: &WorkflowRetry, uid: &str) -> Option<WorkflowRetry> {
        let api: Api<WorkflowRetry> =
            Api::namespaced(self.ctx.client.clone(), &object.namespace()?);
        let mut delay = RETRY_BACKOFF_START;
        loop {
            match api.get_opt(&object.name_any()).await {
                Ok(found) => return found.filter(|o| o.uid().as_deref() == Some(uid)),
                Err(error) => {
                    warn!(workflowretry = object.name_any(), %error, "reading the WorkflowRetry failed; trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_BACKOFF_MAX);
                }
            }
        }
    }

    async fn serve(&self, object: WorkflowRetry, uid: &str) {
        let span = info_span!(
            "workflowretry",
            name = object.name_any(),
            namespace = object.namespace()
        );
        let mut delay = RETRY_BACKOFF_START;
        let mut object = object;
        loop {
            let Some(now) = self.fresh(&object, uid).await else {
                return;
            };
            object = now;
            if object.is_finished() {
                break;
            }
            let served = wfr::serve(&self.ctx, &self.scope, &object)
                .instrument(span.clone())
                .await;
            match served {
                Err(e @ ServeError::Api(_)) if !e.is_transient() => return,
                Err(e) if e.is_transient() => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_BACKOFF_MAX);
                }
                _ => {}
            }
        }
        wfr::delete_when_expired(self.ctx.client.clone(), &object).await;
    }
}

/// Workflows (namespace, UID) with a request being served. One request per
/// workflow at a time: two would wait on the same queued pods.
type Active = Arc<Mutex<HashSet<(String, String)>>>;

/// The request `meta` carries that is not finished yet, if any.
fn pending_target(meta: &PartialObjectMeta<Workflow>) -> Option<Target> {
    // A request with bad options is pending too: serving it answers it.
    let _ = request::pending(meta.annotations())?;
    Some(Target {
        namespace: meta.namespace()?,
        name: meta.name_any(),
        uid: meta.uid()?,
        token: meta.annotations()[request::annotations::RETRY]
            .trim()
            .to_owned(),
    })
}

/// Serves retry requests, one per workflow at a time, until shutdown.
#[derive(Clone)]
struct Dispatcher {
    ctx: Arc<retry::Context>,
    active: Active,
    stores: Arc<Vec<Store<PartialObjectMeta<Workflow>>>>,
    /// Stops the requests in progress; they stay pending and resume at the
    /// next start.
    shutdown: CancellationToken,
    /// The requests being served, awaited at shutdown.
    tasks: TaskTracker,
}

impl Dispatcher {
    /// Starts serving the request `meta` carries, unless none is pending or
    /// the workflow's requests are being served already: that task takes the
    /// newest token from the cache when its current request ends.
    fn start_pending(&self, meta: &PartialObjectMeta<Workflow>) {
        let Some(target) = pending_target(meta) else {
            return;
        };
        let key = (target.namespace.clone(), target.uid.clone());
        if !self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone())
        {
            return;
        }
        let this = self.clone();
        self.tasks
            .spawn(async move { this.serve_workflow(target, key).await });
    }

    /// Serves `target`, then each newer request of the same workflow.
    async fn serve_workflow(&self, mut target: Target, key: (String, String)) {
        loop {
            let span = info_span!(
                "retry",
                workflow = target.name,
                namespace = target.namespace,
                token = target.token
            );
            serve(&self.ctx, &target, &self.shutdown)
                .instrument(span)
                .await;
            if self.shutdown.is_cancelled() {
                return;
            }
            // Under the lock, so that an event handled after this check finds
            // the workflow inactive and starts its request itself (the cache
            // is updated before its event is handled).
            let mut active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
            let reference = ObjectRef::new(&target.name).within(&target.namespace);
            let next = self
                .stores
                .iter()
                .find_map(|s| s.get(&reference))
                .and_then(|meta| pending_target(&meta))
                .filter(|next| next.uid == target.uid && next.token != target.token);
            match next {
                Some(next) => target = next,
                None => {
                    active.remove(&key);
                    return;
                }
            }
        }
    }
}

/// Runs one request to its end. Errors were reported to the user and logged
/// by `retry::run`; transient ones are tried again, so no request is lost.
async fn serve(ctx: &retry::Context, target: &Target, shutdown: &CancellationToken) {
    let mut delay = RETRY_BACKOFF_START;
    while let Err(e) = retry::run(ctx, target, shutdown).await {
        if !e.is_transient() {
            break;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(RETRY_BACKOFF_MAX);
    }
}
