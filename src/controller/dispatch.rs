//! Starting and tracking the requests the watches see: one task per
//! workflow with a pending request, one per WorkflowRetry object. Every task
//! is tracked, stops at shutdown (its request stays pending and resumes at
//! the next start), and is awaited before the controller returns.

use std::any::Any;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use kube::ResourceExt;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info_span, warn};

use crate::argo::workflow::Workflow;
use crate::controller::expiry::Expiry;
use crate::engine::budget::on_behalf_of;
use crate::engine::workers::RequestKey;
use crate::protocol::crd::{WorkflowRetry, WorkflowRetryStatus};
use crate::protocol::request::{self, workflowretry_token};
use crate::retry::Context;
use crate::retry::live::{self, Target};
use crate::retry::pickup;
use crate::retry::report;
use crate::retry::workflowretry::{self, Served};

/// Resets whose pickup by Argo is checked at once (see [`Dispatcher::follow`]).
const MAX_FOLLOWED: usize = 64;

/// Wait before trying a request again after a transient error, doubling up to
/// [`RETRY_BACKOFF_MAX`].
const RETRY_BACKOFF_START: Duration = Duration::from_secs(1);
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// WorkflowRetry objects served at once in each namespace; the others wait
/// their turn here by name and UID alone, in the order they came. A burst of
/// thousands in one namespace then holds a few tasks, not thousands, and
/// costs that namespace's turns only (the workflows' own requests are bounded
/// by the workflows: one task per workflow).
#[derive(Default)]
struct Intake(Mutex<HashMap<String, Waiting>>);

#[derive(Default)]
struct Waiting {
    open: usize,
    next: VecDeque<(String, String)>,
}

impl Intake {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a request in `namespace` if fewer than `limit` are open there;
    /// otherwise queues `(name, uid)` and returns how many are open.
    fn open(&self, namespace: &str, limit: usize, name: &str, uid: &str) -> Result<(), usize> {
        let mut namespaces = self.lock();
        let waiting = namespaces.entry(namespace.to_owned()).or_default();
        if waiting.open < limit {
            waiting.open += 1;
            return Ok(());
        }
        waiting.next.push_back((name.to_owned(), uid.to_owned()));
        Err(waiting.open)
    }

    /// Closes a request in `namespace`: the next waiting one takes its place
    /// (it stays open), or the namespace has one fewer open.
    fn close(&self, namespace: &str) -> Option<(String, String)> {
        let mut namespaces = self.lock();
        let waiting = namespaces.get_mut(namespace)?;
        if let Some(next) = waiting.next.pop_front() {
            return Some(next);
        }
        waiting.open -= 1;
        if waiting.open == 0 {
            namespaces.remove(namespace);
        }
        None
    }
}

/// The keys of the requests being served: one task per key at a time.
struct Active<K>(Mutex<HashSet<K>>);

impl<K: Eq + Hash> Active<K> {
    fn new() -> Arc<Self> {
        Arc::new(Active(Mutex::new(HashSet::new())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<K>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts the requests the watches see, until shutdown; clones share it.
#[derive(Clone)]
pub struct Dispatcher {
    ctx: Arc<Context>,
    /// Workflows (namespace, UID) whose requests are being served: one at a
    /// time per workflow, as two would wait on the same queued pods.
    workflows: Arc<Active<(String, String)>>,
    /// WorkflowRetry objects (UID) being served or waiting in `intake`.
    objects: Arc<Active<String>>,
    /// Each namespace's open WorkflowRetry objects and those waiting their turn.
    intake: Arc<Intake>,
    /// Resets followed after their commit (see [`Dispatcher::follow`]).
    followed: Arc<Semaphore>,
    /// Finished objects waiting out their TTL.
    expiry: Arc<Expiry>,
    /// Stops the requests in progress.
    shutdown: CancellationToken,
    /// Every request's task, awaited at shutdown.
    tasks: TaskTracker,
}

impl Dispatcher {
    pub fn new(ctx: Arc<Context>, expiry: Arc<Expiry>, shutdown: CancellationToken) -> Self {
        Dispatcher {
            ctx,
            workflows: Active::new(),
            objects: Active::new(),
            intake: Arc::default(),
            followed: Arc::new(Semaphore::new(MAX_FOLLOWED)),
            expiry,
            shutdown,
            tasks: TaskTracker::new(),
        }
    }

    /// Waits for every request's task to stop (after shutdown was asked).
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Starts serving the request `meta` carries, unless none is pending or
    /// the workflow's requests are being served already: that task takes the
    /// newest token from the cache when its current request ends. True if
    /// it started one.
    pub fn workflow(&self, meta: &PartialObjectMeta<Workflow>) -> bool {
        let Some(target) = pending_target(meta) else {
            return false;
        };
        let key = (target.namespace.clone(), target.uid.clone());
        if !self.workflows.lock().insert(key.clone()) {
            return false;
        }
        let this = self.clone();
        self.tasks
            .spawn(async move { this.serve_workflow(target, key).await });
        true
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
            self.serve_request(&target).instrument(span).await;
            if self.shutdown.is_cancelled() {
                return;
            }
            // Under the lock, so that an event handled after this check finds
            // the workflow inactive and starts its request itself (the cache
            // is updated before its event is handled).
            let mut active = self.workflows.lock();
            let next = self
                .ctx
                .workflows
                .get(&target.namespace, &target.name)
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

    /// Runs one request to its end. Errors were reported to the user and
    /// logged by `live::run`; transient ones are tried again, so no request
    /// is lost. A panic ends the request Failed (and answered, so it is not
    /// replayed at every start); the controller goes on serving the rest.
    async fn serve_request(&self, target: &Target) {
        let mut delay = RETRY_BACKOFF_START;
        loop {
            match guarded(live::run(&self.ctx, target, &self.shutdown)).await {
                Ok(Ok(live::Finished::Retried {
                    reset: Some(reset), ..
                })) => {
                    self.follow(reset);
                    return;
                }
                Ok(Ok(_)) => return,
                Ok(Err(e)) => {
                    if !e.is_transient() || !self.pause(&mut delay).await {
                        return;
                    }
                }
                Err(panic) => {
                    error!(
                        workflow = target.name,
                        namespace = target.namespace,
                        token = target.token,
                        panic,
                        "the retry panicked; it ends Failed"
                    );
                    self.ctx.metrics.request_panicked("workflow");
                    live::answer_panic(&self.ctx, target, &panic).await;
                    return;
                }
            }
        }
    }

    /// Checks, beside the requests and for `--settle-timeout`, that Argo's
    /// controller picks `reset` up (see [`pickup`]); ends at shutdown. At
    /// most [`MAX_FOLLOWED`] resets are followed at once: each holds a watch
    /// for up to the bound, and a busy cluster resets thousands of workflows
    /// in that time. A reset past it is not checked (the check is a tripwire;
    /// the settle wait is what keeps rewind from stranding a node).
    fn follow(&self, reset: pickup::Reset) {
        let Ok(permit) = self.followed.clone().try_acquire_owned() else {
            debug!(
                namespace = reset.namespace,
                workflow = reset.workflow,
                "not checking that Argo picks this reset up: {MAX_FOLLOWED} resets are followed already"
            );
            return;
        };
        let (ctx, shutdown) = (self.ctx.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let bound = ctx.config.settle_timeout;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = pickup::follow(&ctx, reset, bound) => {}
            }
        });
    }

    /// Starts serving a WorkflowRetry object, unless it is finished (its
    /// TTL is [`Expiry`]'s) or served already, or, when its namespace has
    /// `--max-open-per-namespace` open, queues it (see [`Intake`]).
    pub fn object(&self, object: WorkflowRetry) {
        let (Some(uid), Some(namespace)) = (object.uid(), object.namespace()) else {
            return;
        };
        if object.is_finished() {
            return;
        }
        if !self.objects.lock().insert(uid.clone()) {
            return;
        }
        let limit = self.ctx.config.max_open_per_namespace;
        match self
            .intake
            .open(&namespace, limit, &object.name_any(), &uid)
        {
            Ok(()) => {
                let this = self.clone();
                self.tasks
                    .spawn(async move { this.serve_in_turn(Some(object), namespace).await });
            }
            Err(open) => {
                let this = self.clone();
                self.tasks
                    .spawn(async move { this.note_waiting(object, open).await });
            }
        }
    }

    /// Serves `object`, then each WorkflowRetry that waited its turn in the
    /// namespace, read again as it comes: one task for a namespace's queue.
    async fn serve_in_turn(&self, mut object: Option<WorkflowRetry>, namespace: String) {
        loop {
            if let Some(object) = object.take()
                && let Some(uid) = object.uid()
            {
                let span = info_span!(
                    "workflowretry",
                    name = object.name_any(),
                    namespace = namespace
                );
                self.serve_object(object, &uid).instrument(span).await;
                self.objects.lock().remove(&uid);
            }
            if self.shutdown.is_cancelled() {
                return;
            }
            let Some((name, uid)) = self.intake.close(&namespace) else {
                return;
            };
            object = self.waited(&namespace, &name, &uid).await;
            if object.is_none() {
                self.objects.lock().remove(&uid);
            }
        }
    }

    /// A WorkflowRetry that waited its turn, as the API server has it now;
    /// `None` if it is gone, replaced or finished meanwhile.
    async fn waited(&self, namespace: &str, name: &str, uid: &str) -> Option<WorkflowRetry> {
        let api: Api<WorkflowRetry> = Api::namespaced(self.ctx.client(), namespace);
        let mut delay = RETRY_BACKOFF_START;
        loop {
            match api.get_opt(name).await {
                Ok(found) => {
                    return found.filter(|o| o.uid().as_deref() == Some(uid) && !o.is_finished());
                }
                Err(error) => {
                    warn!(workflowretry = name, namespace, %error, "reading a WorkflowRetry that waited its turn failed; trying again");
                    if !self.pause(&mut delay).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Tells a WorkflowRetry that waits its turn why, once, as a report (see
    /// [`report::best_effort`]).
    async fn note_waiting(&self, object: WorkflowRetry, open: usize) {
        let limit = self.ctx.config.max_open_per_namespace;
        let message = format!(
            "waiting: {open} WorkflowRetries of this namespace are being served, the most at once (--max-open-per-namespace {limit}); this one starts when one of them ends"
        );
        if object.status.as_ref().map(|s| s.message.as_str()) == Some(message.as_str()) {
            return;
        }
        // On the version the watch showed only: once its turn came and it was written to,
        // this note would be stale (it names no phase, so it never undoes one).
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": object.resource_version()},
            "status": {"message": message},
        });
        let api: Api<WorkflowRetry> =
            Api::namespaced(self.ctx.client(), &object.namespace().unwrap_or_default());
        let (name, params, patch) = (
            object.name_any(),
            PatchParams::default(),
            Patch::Merge(&patch),
        );
        if let Some(Err(error)) =
            report::best_effort(api.patch_status(&name, &params, &patch)).await
        {
            debug!(workflowretry = object.name_any(), %error, "could not say why a WorkflowRetry waits");
        }
    }

    /// Serves a WorkflowRetry to its end, then hands it to [`Expiry`]. A
    /// request that is not finished after being served (a transient error)
    /// is served again after a backoff; one whose end could not be recorded
    /// is not served again: its end is written, after a backoff, until it is.
    async fn serve_object(&self, mut object: WorkflowRetry, uid: &str) {
        let mut delay = RETRY_BACKOFF_START;
        let mut served = false;
        let mut unrecorded: Option<Box<WorkflowRetryStatus>> = None;
        loop {
            // A new object's event is as fresh as a read (no status of ours yet to be
            // older than); after serving, the API server's copy is read again.
            if served || object.status.is_some() {
                let Some(now) = self.fresh(&object, uid).await else {
                    return;
                };
                object = now;
            }
            if object.is_finished() {
                break;
            }
            if served && !self.pause(&mut delay).await {
                return;
            }
            if let Some(end) = &unrecorded {
                if let Err(error) =
                    workflowretry::record_end(&self.ctx, &object, (**end).clone()).await
                {
                    warn!(workflowretry = object.name_any(), %error, "writing how the WorkflowRetry ended failed; trying again");
                }
                continue;
            }
            // Its end is reported (status, Event) by `serve`. Its requests take turns with
            // other askers' in the namespace, as a retry it asks for does.
            let asker = RequestKey::retry(
                &object.namespace().unwrap_or_default(),
                uid,
                &workflowretry_token(uid),
            );
            // Boxed: a request's future is large, and unboxed it overflowed a worker's stack
            // in a debug build.
            let serving = Box::pin(workflowretry::serve(&self.ctx, &object, &self.shutdown));
            let outcome = match guarded(on_behalf_of(asker.asker().into(), serving)).await {
                Ok(outcome) => outcome,
                Err(panic) => {
                    error!(
                        workflowretry = object.name_any(),
                        namespace = object.namespace(),
                        panic,
                        "serving the WorkflowRetry panicked; it ends Failed"
                    );
                    self.ctx.metrics.request_panicked("workflowretry");
                    workflowretry::answer_panic(&self.ctx, &object, &panic).await
                }
            };
            match outcome {
                // Its end is written; its watch event hands it to [`Expiry`]. Read again to
                // confirm it, every request would cost one more read.
                Served::Ended => return,
                Served::Unrecorded(end) => unrecorded = Some(end),
                Served::Reported => {}
            }
            served = true;
        }
        // Its watch event says the same, unless it comes before our last write.
        self.expiry.note(&object);
    }

    /// The object as the API server has it now; `None` if it is gone or
    /// replaced, or at shutdown. A watch event can be older than our own last
    /// status write.
    async fn fresh(&self, object: &WorkflowRetry, uid: &str) -> Option<WorkflowRetry> {
        let api: Api<WorkflowRetry> = Api::namespaced(self.ctx.client(), &object.namespace()?);
        let mut delay = RETRY_BACKOFF_START;
        loop {
            match api.get_opt(&object.name_any()).await {
                Ok(found) => return found.filter(|o| o.uid().as_deref() == Some(uid)),
                Err(error) => {
                    warn!(workflowretry = object.name_any(), %error, "reading the WorkflowRetry failed; trying again");
                    if !self.pause(&mut delay).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Waits `delay` (doubled for next time, up to [`RETRY_BACKOFF_MAX`]);
    /// false if shutdown came first.
    async fn pause(&self, delay: &mut Duration) -> bool {
        let wait = *delay;
        *delay = (*delay * 2).min(RETRY_BACKOFF_MAX);
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}

/// Runs `work`, catching a panic in it as its message.
pub async fn guarded<F: Future>(work: F) -> Result<F::Output, String> {
    AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|panic| panic_message(&*panic))
}

/// The words of a panic's payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The request `meta` carries that is not finished yet, if any.
fn pending_target(meta: &PartialObjectMeta<Workflow>) -> Option<Target> {
    // A request with bad options is pending too: serving it answers it.
    let _ = request::pending(meta.annotations())?;
    Some(Target {
        namespace: meta.namespace()?,
        name: meta.name_any(),
        uid: meta.uid()?,
        token: request::token(meta.annotations())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_a_request_is_caught_with_its_words() {
        assert_eq!(guarded(async { 7 }).await, Ok(7));
        let caught = guarded(async {
            let ttl = std::hint::black_box(i64::MAX);
            ttl.checked_add(1)
                .expect("adding signed duration to timestamp overflowed")
        })
        .await;
        assert_eq!(
            caught,
            Err("adding signed duration to timestamp overflowed".to_owned())
        );
        let formatted = guarded(async { panic!("plan of {} failed", "wf") }).await;
        assert_eq!(formatted, Err::<(), _>("plan of wf failed".to_owned()));
    }
}
