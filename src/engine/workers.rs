//! Delete workers: take items from the queue, send one API request each, and
//! report the outcome to every request that queued the item.
//!
//! Every request goes through the budgeted client, so the number of workers
//! bounds concurrency while the token bucket bounds the rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::client::retry::RetryPolicy;
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, warn};

use crate::argo::workflow::labels;
use crate::engine::Observer;
use crate::engine::assess::DeleteWork;
use crate::engine::budget::{Budget, Priority, admitted_at, on_behalf_of, with_priority};
use crate::engine::fault::{self, api_code, is_transient};
use crate::engine::pods::{delete_collection, selected};
use crate::engine::queue::{Class, Lease, Request, WorkQueue};

/// A queued unit of work: one API request in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkItem {
    pub namespace: String,
    pub work: DeleteWork,
}

/// Identifies the request (a retry, or a GC sweep) that queued an item: its
/// outcomes go back to it, and its items take turns in its asker's lane. One
/// scheme for every request, so no two requests share a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// Who asked: requests asked together (one token on many workflows, as
    /// `rewind retry -l` asks) share a lane, so a batch of 200 takes the
    /// turns one request would beside another user's single retry.
    asker: Arc<str>,
    id: Arc<str>,
}

impl RequestKey {
    /// A retry request: `token` asked on the object with UID `uid` (the
    /// workflow, or the WorkflowRetry) in `namespace`.
    pub fn retry(namespace: &str, uid: &str, token: &str) -> Self {
        RequestKey {
            asker: format!("{namespace}/{token}").into(),
            id: format!("retry/{namespace}/{uid}/{token}").into(),
        }
    }

    /// Pod garbage collection's sweeps.
    pub fn gc() -> Self {
        RequestKey {
            asker: "gc".into(),
            id: "gc".into(),
        }
    }

    /// Who asked, as a budget flow names it.
    pub fn asker(&self) -> &str {
        &self.asker
    }
}

impl Request for RequestKey {
    type Lane = Arc<str>;

    fn lane(&self) -> Arc<str> {
        self.asker.clone()
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

pub type Queue = WorkQueue<WorkItem, RequestKey>;

/// What happened to one item (cloned for each request that queued it).
#[derive(Clone, Debug)]
pub struct Outcome {
    pub item: WorkItem,
    pub result: Result<Done, WorkError>,
}

/// An item that needs no more work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// The request removed this many pods (or released their finalizers).
    Deleted(usize),
    /// The pod was already gone.
    AlreadyGone,
    /// The pod under that name has another UID now: the planned pod is gone
    /// and the new one must not be touched.
    Replaced,
    /// A bulk request ended without an answer naming what it removed: the API
    /// server cut it at its request timeout (504), failed part way (500), or
    /// the connection broke. Some of its pods may be gone. It is not sent
    /// again as it was: the request lists the pods again and decides anew.
    Unfinished,
    /// Not sent, for the reason given (a bulk request's proof, mostly).
    /// Nothing was deleted; the request lists the pods again and decides anew.
    Stale(Unsent),
}

/// Why a worker's request was not sent at its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsent {
    /// The list that would re-prove a bulk request failed.
    ProofFailed,
    /// Right before the send, a bulk request's selectors took a pod its
    /// proof did not show (by UID).
    ProofChanged,
    /// A bulk request's pods were all gone already.
    NothingLeft,
    /// A bulk request's send could not follow its re-proof's start within
    /// [`MAX_PROOF_AGE`].
    ProofExpired,
    /// A bulk request the API server throttled (429 or 503) is not resent
    /// as is: its proof is older than [`MAX_PROOF_AGE`] by then.
    Throttled,
    /// Its request stopped, or the Lease was lost.
    Unwanted,
}

impl Unsent {
    pub const ALL: [Unsent; 6] = [
        Unsent::ProofFailed,
        Unsent::ProofChanged,
        Unsent::NothingLeft,
        Unsent::ProofExpired,
        Unsent::Throttled,
        Unsent::Unwanted,
    ];

    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Unsent::ProofFailed => "proof_failed",
            Unsent::ProofChanged => "proof_changed",
            Unsent::NothingLeft => "nothing_left",
            Unsent::ProofExpired => "proof_expired",
            Unsent::Throttled => "throttled",
            Unsent::Unwanted => "unwanted",
        }
    }
}

/// An item that failed for good (after retries, or at once for errors that
/// retrying cannot fix, such as missing RBAC).
#[derive(Debug, thiserror::Error)]
#[error("{action} in namespace {namespace} failed: {}", crate::engine::fault::explain(.source))]
#[derive(Clone)]
pub struct WorkError {
    pub action: String,
    pub namespace: String,
    /// Shared by the requests that queued the same item.
    #[source]
    pub source: Arc<kube::Error>,
}

/// Where workers send outcomes: one channel per request.
#[derive(Clone, Default)]
pub struct Outcomes {
    senders: Arc<Mutex<HashMap<RequestKey, mpsc::UnboundedSender<Outcome>>>>,
}

impl Outcomes {
    /// Registers a request; its outcomes arrive on the returned receiver
    /// until [`Outcomes::unregister`].
    pub fn register(&self, key: RequestKey) -> mpsc::UnboundedReceiver<Outcome> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().insert(key, tx);
        rx
    }

    pub fn unregister(&self, key: &RequestKey) {
        self.lock().remove(key);
    }

    fn send(&self, key: &RequestKey, outcome: Outcome) {
        if let Some(tx) = self.lock().get(key) {
            // A request that stopped listening has nothing left to learn.
            let _ = tx.send(outcome);
        }
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<RequestKey, mpsc::UnboundedSender<Outcome>>> {
        self.senders.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Attempts per item before a transient error is reported as a failure.
const MAX_ATTEMPTS: u32 = 8;

/// Whose turn it is to take an item: one worker at a time leases an item and, for a bulk
/// delete, takes its place in the line for a slot, so items start in the queue's order. Each
/// then waits for its own write token in its namespace's flow (see
/// [`Budget::take_write_token`]).
pub type Turn = Arc<tokio::sync::Mutex<()>>;

/// Queued items per buffer in front of kube's HTTP service, as in [`crate::engine::budget::client`].
const BUFFER: usize = 1024;

/// The client the workers delete with: the budget's
/// ([`crate::engine::budget::client`]) with a read timeout, a [`Gate`] on
/// every send, and a retry of 429 and 503 that leaves out 504. A bulk request
/// cut by the API server's request timeout may have removed part of its pods
/// and was proven exact against a list that is now old, so it is never resent
/// as is (see [`Done::Unfinished`]); a single delete cut so comes back through
/// the queue, whose next lease sends it again only if it is still wanted.
pub fn delete_client(mut config: kube::Config, budget: &Budget) -> Result<Client, kube::Error> {
    config.default_retry = false;
    config.read_timeout = Some(READ_TIMEOUT);
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::buffer::BufferLayer::new(BUFFER))
        .with_layer(&tower::layer::layer_fn(|inner| Gated { inner }))
        .with_layer(&budget.layer())
        .with_layer(&tower::retry::RetryLayer::new(NotOnTimeout(
            RetryPolicy::server_retry(),
        )))
        .build())
}

/// How long a delete's answer may keep the connection silent: past the API
/// server's own request timeout (60 s by default, when it answers 504), so
/// only a connection nobody answers on any more (a stalled proxy, a dead
/// server) ends here, as [`Done::Unfinished`] for a bulk delete.
pub const READ_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a bulk request's send may follow the start of the list that
/// re-proved it (the list's answer, its budget admission: a pause ordered by
/// a 429, a slot). Past
/// it the proof is too old to trust and the request is not sent
/// ([`Done::Stale`]). A resend after a 429 or 503 always waits longer than
/// this (Retry-After is at least a second), so it is never sent either.
pub const MAX_PROOF_AGE: Duration = Duration::from_millis(500);

/// What a worker's send must still be true of once the budget has admitted
/// it, checked again at each of kube's resends: the budget may have held it
/// for seconds (a slot, a pause ordered by a 429, Retry-After), and a request
/// that stopped meanwhile, or a Lease lost, must not see a pod deleted after
/// it said it deleted nothing more.
#[derive(Clone)]
struct Gate {
    queue: Queue,
    item: WorkItem,
    /// A bulk request's: until when its proof holds (see [`MAX_PROOF_AGE`]).
    send_by: Option<tokio::time::Instant>,
    /// Sends it let through: past the first, a send is kube's resend after a
    /// 429 or 503.
    passed: std::cell::Cell<u32>,
}

tokio::task_local! {
    /// The gate of the send this task makes.
    static GATE: Gate;
}

impl Gate {
    fn refusal(&self) -> Option<NotSent> {
        let now = tokio::time::Instant::now();
        if let Some(deadline) = self.send_by
            && now > deadline
        {
            // Throttled, it was proved in time: a new proof may well be too.
            if self.passed.get() > 0 {
                return Some(NotSent::Throttled);
            }
            return Some(NotSent::ProofExpired {
                late: now - deadline,
            });
        }
        if !self.queue.wanted(&self.item) {
            return Some(NotSent::Unwanted);
        }
        self.passed.set(self.passed.get() + 1);
        None
    }
}

/// Why a worker's request was not sent: see [`Gate`].
#[derive(Debug, thiserror::Error)]
pub enum NotSent {
    #[error("bulk delete not sent: admitted {late:?} after its proof expired; list the pods again")]
    ProofExpired { late: Duration },
    #[error(
        "bulk delete not sent again: the API server throttled it (429 or 503) and its proof is too old now; list the pods again"
    )]
    Throttled,
    #[error("delete not sent: its request stopped or the Lease was lost")]
    Unwanted,
    #[error("delete not sent: it was made outside a delete worker's gate (a bug in rewind)")]
    Ungated,
}

/// Sits between the budget and kube's HTTP stack of [`delete_client`], so it
/// runs once the budget has admitted the request: refuses to send it when
/// the task's [`Gate`] says no.
#[derive(Clone)]
struct Gated<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Gated<S>
where
    S: tower::Service<http::Request<B>, Error = tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, tower::BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // Fails closed: a send outside a worker's gate is refused, so no code path can
        // delete without the checks above.
        let refusal = GATE
            .try_with(Gate::refusal)
            .unwrap_or(Some(NotSent::Ungated));
        if let Some(refusal) = refusal {
            return Box::pin(async move { Err(refusal.into()) });
        }
        Box::pin(self.inner.call(request))
    }
}

/// kube's retry policy, except for a 504 (Gateway Timeout).
#[derive(Clone)]
struct NotOnTimeout(RetryPolicy);

impl<B> tower::retry::Policy<http::Request<kube::client::Body>, http::Response<B>, tower::BoxError>
    for NotOnTimeout
{
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut http::Request<kube::client::Body>,
        result: &mut Result<http::Response<B>, tower::BoxError>,
    ) -> Option<Self::Future> {
        match result {
            Ok(response) if response.status() == http::StatusCode::GATEWAY_TIMEOUT => None,
            _ => self.0.retry(request, result),
        }
    }

    fn clone_request(
        &mut self,
        request: &http::Request<kube::client::Body>,
    ) -> Option<http::Request<kube::client::Body>> {
        tower::retry::Policy::<_, http::Response<B>, _>::clone_request(&mut self.0, request)
    }
}

/// DeleteCollections in flight at once by default, across requests.
///
/// A DeleteCollection is one write of the budget, but the API server deletes
/// its pods one by one (`--delete-collection-workers`, 1 by default), so a few
/// at once keep it as busy as it gets (docs/operating.md, "Beyond the serial floor");
/// more only queue inside it, where every other client waits too. Measured
/// on 2 cores, 200 workflows of 100 pods retried at once, one run each: with
/// 32 in flight the batch took 41 s and another user's reads saw a p99 of
/// 94 ms; with 2, 51 s and 42 ms (bench/results/retry-batch-bulk32.md,
/// retry-batch.md).
pub const DEFAULT_MAX_BULK_IN_FLIGHT: usize = 2;

/// The most pods a DeleteCollection may select and go without a bulk slot: the slots bound
/// the deletions one write token sets going inside the API server, and these few cost it no
/// more than a second of single deletes at the default budget. Under many tenants' small
/// retries, each waiting for one of a few slots took seconds of every retry's time, a quiet
/// tenant's large one included.
pub const SMALL_BULK: usize = 20;

/// The clients a worker sends with: `client` for the list that re-proves a
/// bulk delete, `delete` (see [`delete_client`]) for every delete, bulk ones
/// as `bulk_slots` lets them.
#[derive(Clone)]
pub struct Clients {
    pub client: Client,
    pub delete: Client,
    pub bulk_slots: BulkSlots,
}

/// When a DeleteCollection may be sent: while fewer than the limit are in
/// flight, and besides those, one for an asker that has none in flight. A
/// batch of 200 bulk deletes keeps the limit busy; without the spare, another
/// user's bulk delete waited for one of the batch's to end (1.4 s of its
/// 2.7 s in a 200 × 100 batch), however fair its turn.
#[derive(Clone)]
pub struct BulkSlots {
    shared: Arc<Semaphore>,
    spare: Arc<Semaphore>,
    in_flight: Arc<Mutex<HashMap<Arc<str>, usize>>>,
    /// Bulk deletes waiting for a slot, in the order they were leased (a
    /// fair mutex serves its waiters in the order they first asked).
    line: Arc<tokio::sync::Mutex<()>>,
}

impl BulkSlots {
    /// At most `limit` (at least one) DeleteCollections in flight, plus the spare.
    pub fn new(limit: usize) -> Self {
        BulkSlots {
            shared: Arc::new(Semaphore::new(limit.clamp(1, Semaphore::MAX_PERMITS))),
            spare: Arc::new(Semaphore::new(1)),
            in_flight: Arc::default(),
            line: Arc::default(),
        }
    }

    /// Takes a place in the line for a slot now (in the workers' turn, so
    /// bulk deletes start in the queue's order); the future returned waits
    /// for the slot from that place, outside the turn. A bulk delete that
    /// waited for its slot in the turn held up every worker: while the slots
    /// were busy (tens of seconds at 8,000 pods), other users' single
    /// deletes, finalizer releases and pod GC all waited too.
    async fn line_up(&self, asker: Arc<str>) -> impl Future<Output = BulkSlot> + use<> {
        let mut place = Box::pin(self.line.clone().lock_owned());
        // Polled once so the place is taken here, not when awaited.
        let now = futures::poll!(place.as_mut());
        let slots = self.clone();
        async move {
            let _place = match now {
                std::task::Poll::Ready(place) => place,
                std::task::Poll::Pending => place.await,
            };
            slots.acquire(asker).await
        }
    }

    /// Waits for a slot for a DeleteCollection of `asker`'s. Only one worker
    /// waits at a time (the one first in line), so whether the asker has one
    /// in flight cannot change while it waits, except by one ending.
    async fn acquire(&self, asker: Arc<str>) -> BulkSlot {
        let idle = !self.lock().contains_key(&asker);
        let permit = tokio::select! {
            biased;
            permit = self.shared.clone().acquire_owned() => permit,
            permit = self.spare.clone().acquire_owned(), if idle => permit,
        }
        .expect("the bulk slots are never closed");
        *self.lock().entry(asker.clone()).or_default() += 1;
        BulkSlot {
            _permit: permit,
            asker,
            slots: self.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, usize>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A DeleteCollection's place in flight, given back when dropped.
struct BulkSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    asker: Arc<str>,
    slots: BulkSlots,
}

impl Drop for BulkSlot {
    fn drop(&mut self) {
        let mut in_flight = self.slots.lock();
        if let Some(n) = in_flight.get_mut(&self.asker) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.asker);
            }
        }
    }
}

/// Runs one worker until the queue shuts down.
pub async fn run(
    clients: Clients,
    budget: Budget,
    turn: Turn,
    queue: Queue,
    outcomes: Outcomes,
    observer: Arc<dyn Observer>,
) {
    loop {
        let (lease, bulk_slot, leased) = {
            let _turn = turn.lock().await;
            let Some(lease) = queue.next().await else {
                break;
            };
            let leased = std::time::Instant::now();
            // In line in the turn, so the next bulk delete to start is the
            // queue's next (its turns between requests), not any worker's.
            let bulk_slot = match &lease.item.work {
                DeleteWork::Bulk { pods, .. } if pods.len() > SMALL_BULK => {
                    Some(clients.bulk_slots.line_up(lease.request.lane()).await)
                }
                _ => None,
            };
            (lease, bulk_slot, leased)
        };
        let bulk_slot = match bulk_slot {
            Some(slot) => Some(slot.await),
            None => None,
        };
        // The token is the item's namespace's and asker's, at its class's priority: a
        // tenant's deletes take that tenant's turns, and a retry's go before background work
        // and reports, whichever worker carries them. The proof's list is theirs too.
        let priority = match lease.class {
            Class::Interactive => Priority::Retry,
            Class::Background => Priority::Background,
        };
        let work = async {
            let slot_ms = leased.elapsed().as_millis() as u64;
            // A bulk delete holds its slot: it takes its token ahead of the line.
            let token = match bulk_slot.is_some() {
                true => budget.take_write_token_ahead(&lease.item.namespace).await,
                false => budget.take_write_token(&lease.item.namespace).await,
            };
            // Where an item's time went before it was sent, for whoever asks why one
            // request waited.
            debug!(request = %lease.request, slot_ms, token_ms = leased.elapsed().as_millis() as u64 - slot_ms, "delete work sent");
            token.spend_on(execute(&clients, &queue, &lease.item)).await
        };
        // The asker's deletes wait in a line of their own beside its other writes (its
        // progress, its reset): with every worker's token in one line, a request's progress
        // waited behind up to a token per worker.
        let deletes = format!("{} (deletes)", lease.request.lane()).into();
        let result = match with_priority(priority, on_behalf_of(deletes, work)).await {
            Err(e) if cut_short(&lease.item.work, &e) => {
                warn!(namespace = lease.item.namespace, work = %describe(&lease.item.work), error = %e, "bulk delete cut short; its pods will be listed again");
                Ok(Done::Unfinished)
            }
            result => result,
        };
        drop(bulk_slot);
        match result {
            Err(e) if is_transient(&e) && lease.failures + 1 < MAX_ATTEMPTS => {
                debug!(namespace = lease.item.namespace, work = ?lease.item.work, error = %e, "transient failure; requeued");
                queue.requeue(lease);
            }
            result => {
                match result {
                    Ok(Done::Deleted(n)) => observer.pods_deleted(n),
                    Ok(Done::Stale(why)) => observer.unsent(why),
                    _ => {}
                }
                queue.forget(&lease.item);
                let Lease { item, owners, .. } = &lease;
                let result = result.map_err(|source| WorkError {
                    action: describe(&item.work),
                    namespace: item.namespace.clone(),
                    source: Arc::new(source),
                });
                if let Err(e) = &result {
                    warn!(error = %e, "delete work failed");
                }
                // Every request that queued the item waits for its answer; the
                // answers go out before the lease ends (see `WorkQueue::answers_to`).
                let outcome = Outcome {
                    item: item.clone(),
                    result,
                };
                for owner in owners {
                    outcomes.send(owner, outcome.clone());
                }
                queue.done(lease);
            }
        }
    }
}

async fn execute(clients: &Clients, queue: &Queue, item: &WorkItem) -> Result<Done, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(clients.delete.clone(), &item.namespace);
    let gate = Gate {
        queue: queue.clone(),
        item: item.clone(),
        send_by: None,
        passed: std::cell::Cell::new(0),
    };
    let sent = match &item.work {
        DeleteWork::Bulk {
            label_selector,
            field_selector,
            uids,
            ..
        } => {
            // Re-proved right before the send: the list that proved the
            // request exact may be seconds old (a bulk slot, a write token,
            // a pause, requeues), and a pod recreated under a planned name
            // since then may already be selected (docs/DESIGN.md, rule 3).
            // A failed proof list sent nothing: the delete is stale, not cut short (which
            // would count it as partly done and turn bulk deletes off for the request).
            // The proof's age counts from the list's send (once the budget let it go):
            // the API server takes its snapshot somewhere between the send and the
            // answer, and an answer can be slow to arrive (a congested network, a paused
            // process). Counted from before the list's wait for its read turn, a busy
            // cluster's proofs all expired and its retries deleted one pod at a time.
            let asked = tokio::time::Instant::now();
            let (listed, sent) = admitted_at(selected(
                &clients.client,
                &item.namespace,
                label_selector,
                field_selector,
            ))
            .await;
            let proving = sent.unwrap_or(asked);
            let now = match listed {
                Ok(now) => now,
                Err(e) => {
                    warn!(namespace = item.namespace, work = %describe(&item.work), error = %fault::explain(&e), "listing a bulk delete's pods to prove it failed; not sent, its pods will be listed again");
                    return Ok(Done::Stale(Unsent::ProofFailed));
                }
            };
            if let Some((pod, uid)) = now.iter().find(|(_, uid)| !uids.contains(uid)) {
                warn!(namespace = item.namespace, pod, uid, work = %describe(&item.work), "a bulk delete would take a pod its proof did not show; not sent");
                return Ok(Done::Stale(Unsent::ProofChanged));
            }
            // Its pods went meanwhile (an earlier leader's delete landing):
            // nothing to send; the request's next list confirms them gone.
            if now.is_empty() {
                return Ok(Done::Stale(Unsent::NothingLeft));
            }
            let gate = Gate {
                send_by: Some(proving + MAX_PROOF_AGE),
                ..gate
            };
            let delete = delete_collection(
                &clients.delete,
                &item.namespace,
                label_selector,
                field_selector,
            );
            GATE.scope(gate, delete).await.map(Done::Deleted)
        }
        DeleteWork::Pod { name, uid } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let delete = pods.delete(name, &dp);
            GATE.scope(gate, delete)
                .await
                .map(|_| Done::Deleted(1))
                .or_else(gone_or)
        }
        DeleteWork::Finalizer { name, uid, index } => {
            let params = PatchParams::default();
            let patch = without_finalizer(uid, *index, labels::POD_STATUS_FINALIZER);
            GATE.scope(gate, pods.patch(name, &params, &patch))
                .await
                .map(|_| Done::Deleted(1))
                .or_else(gone_or)
        }
    };
    let refusal = match &sent {
        Err(kube::Error::Service(e)) => e.downcast_ref::<NotSent>(),
        _ => None,
    };
    match refusal {
        None => sent,
        Some(NotSent::Unwanted) => {
            debug!(namespace = item.namespace, work = %describe(&item.work), "delete not sent: its request stopped or the Lease was lost");
            Ok(Done::Stale(Unsent::Unwanted))
        }
        Some(NotSent::Ungated) => sent,
        Some(refusal @ NotSent::ProofExpired { .. }) => {
            warn!(namespace = item.namespace, error = %refusal, "bulk delete not sent; its pods will be listed again");
            Ok(Done::Stale(Unsent::ProofExpired))
        }
        Some(refusal @ NotSent::Throttled) => {
            debug!(namespace = item.namespace, error = %refusal, "bulk delete not sent again; its pods will be listed again");
            Ok(Done::Stale(Unsent::Throttled))
        }
    }
}

/// A JSON patch removing `finalizer`, at `index` of the finalizers, from the
/// object with UID `uid`. Its `test` ops make it exact: only that object, and
/// only that finalizer, even if others were added or removed meanwhile (the
/// API server answers 422 then).
pub fn without_finalizer(uid: &str, index: usize, finalizer: &str) -> Patch<()> {
    let path = format!("/metadata/finalizers/{index}");
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]))
    .expect("a well-formed JSON patch");
    Patch::Json(patch)
}

/// NotFound means done; a failed UID precondition (409) or `test` op (422)
/// means the pod under that name is not the one planned.
fn gone_or(e: kube::Error) -> Result<Done, kube::Error> {
    match api_code(&e) {
        Some(404) => Ok(Done::AlreadyGone),
        Some(409 | 422) => Ok(Done::Replaced),
        _ => Err(e),
    }
}

/// Whether `e` ended bulk `work` in a way that may have removed part of its
/// pods: the request timeout (504), a server error (500), a broken
/// connection. Throttling (429, 503) refuses a request before it runs.
fn cut_short(work: &DeleteWork, e: &kube::Error) -> bool {
    let cut = match e {
        kube::Error::Api(status) => matches!(status.code, 500 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    };
    cut && matches!(work, DeleteWork::Bulk { .. })
}

fn describe(work: &DeleteWork) -> String {
    match work {
        DeleteWork::Bulk {
            workflow,
            label_selector,
            field_selector,
            pods,
            ..
        } => format!(
            "deleting the {} pods of workflow {workflow} with labels {label_selector} and fields {field_selector}",
            pods.len()
        ),
        DeleteWork::Pod { name, .. } => format!("deleting pod {name}"),
        DeleteWork::Finalizer { name, .. } => format!(
            "removing finalizer {} from pod {name}",
            labels::POD_STATUS_FINALIZER
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_send_outside_a_workers_gate_is_refused() {
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = sent.clone();
        let mut gated = Gated {
            inner: tower::service_fn(move |_: http::Request<()>| {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
                async { Ok::<_, tower::BoxError>(http::Response::new(())) }
            }),
        };
        let refused = tower::Service::call(&mut gated, http::Request::new(())).await;
        let refusal = refused.expect_err("refused").downcast::<NotSent>();
        assert!(
            matches!(refusal.as_deref(), Ok(NotSent::Ungated)),
            "{refusal:?}"
        );
        assert!(!sent.load(std::sync::atomic::Ordering::SeqCst), "sent");
    }

    async fn soon(slots: &BulkSlots, asker: &str) -> Option<BulkSlot> {
        tokio::time::timeout(Duration::from_millis(50), slots.acquire(asker.into()))
            .await
            .ok()
    }

    #[tokio::test]
    async fn an_asker_with_nothing_in_flight_gets_the_spare_beside_a_batch() {
        let slots = BulkSlots::new(2);
        let batch = [soon(&slots, "batch").await, soon(&slots, "batch").await];
        assert!(batch.iter().all(Option::is_some), "the limit's two");
        assert!(
            soon(&slots, "batch").await.is_none(),
            "the batch waits past the limit"
        );
        let user = soon(&slots, "user").await;
        assert!(
            user.is_some(),
            "another asker's first goes beside the batch's"
        );
        assert!(
            soon(&slots, "user").await.is_none(),
            "its second waits: the spare is one, for an asker with none in flight"
        );
        assert!(soon(&slots, "third").await.is_none(), "the spare is taken");
        drop(user);
        assert!(
            soon(&slots, "third").await.is_some(),
            "given back, the spare serves again"
        );
        let [first, _] = batch;
        drop(first);
        assert!(
            soon(&slots, "batch").await.is_some(),
            "an ended bulk delete frees its slot"
        );
    }
}
