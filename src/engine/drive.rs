//! The one loop that deletes a plan's pods, for every request: list the
//! workflow's pods, assess them against the plan, queue the exact requests,
//! await their answers, count, and list again until every plan pod is gone
//! (rule 2: only then may the reset be written).
//!
//! A [`Deletion`] keeps what it learned across passes and across re-plans
//! (the UID each plan pod had, which are gone), so a pod recreated under a
//! planned name is never deleted (rule 3) and progress never goes back. What
//! the request tells its user in between is its [`Sink`]'s business.
//!
//! Every wait ends (rule 7): the answers to what it queued come from every
//! lease of its items, and if the queue no longer holds any of them it lists
//! again rather than wait; a plan pod that is deleted but stays (a finalizer
//! nobody removes, a node that does not answer) is named in the count's note
//! after a short while and ends the deletion with [`HeldPods`] after
//! [`DriveConfig::terminating_timeout`]; a plan pod Argo has not finished
//! with (rule 8) is not deleted until Argo labels it, which the watch of
//! the workflow's pods reports, and ends the deletion with [`UnsettledPods`]
//! after [`DriveConfig::settle_timeout`] (or is deleted then, if
//! [`DriveConfig::on_settle_timeout`] says so).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::engine::Engine;
use crate::engine::assess::{
    Assessment, DeleteWork, Listed, Progress, Recreated, Terminating, Tracker, split_bulk,
};
use crate::engine::fault;
use crate::engine::pods::{PodEvent, list_workflow_pods, watch_pods};
use crate::engine::queue::Class;
use crate::engine::workers::{
    Done, Outcome, READ_TIMEOUT, RequestKey, Unsent, WorkError, WorkItem,
};

/// How a deletion goes about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveConfig {
    /// Use DeleteCollection where it is provably exact.
    pub allow_bulk: bool,
    /// Split a bulk delete into this many DeleteCollections by node.
    pub bulk_parallelism: usize,
    /// How often to look again at plan pods terminating gracefully, when no
    /// watch follows them (and the least time between two lists).
    pub terminating_poll: Duration,
    /// How often the sink hears of progress while requests are out.
    pub tick: Duration,
    /// How long a plan pod may stay terminating (deleted, but kept by a
    /// finalizer or a node that does not confirm) before the deletion ends
    /// with [`HeldPods`]; the note names it after a tenth of this (at most
    /// [`HELD_NOTE_AFTER`]).
    pub terminating_timeout: Duration,
    /// How long a plan pod of a live workflow may wait for Argo to finish
    /// with it (label it completed=true) before [`DriveConfig::on_settle_timeout`].
    pub settle_timeout: Duration,
    pub on_settle_timeout: OnSettleTimeout,
}

/// What a deletion does with plan pods Argo has not finished with at
/// [`DriveConfig::settle_timeout`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnSettleTimeout {
    /// End the request, naming them; none of them is deleted, the workflow not reset.
    #[default]
    Fail,
    /// Delete them anyway, and say so in the request's message.
    Delete,
}

/// The default [`DriveConfig::settle_timeout`]. Argo v4.1.4 labels finished
/// pods from one clean-up queue per controller, rate limited by client-go's
/// default controller limiter (a bucket of 10 a second after a burst of 100):
/// 2.7 s for one pod, 20 s for 200. Under load it is slower than its rate:
/// every workflow update queues again each finished pod not labelled yet, and
/// each such call takes a token of the shared bucket, so the labels lag by the
/// updates times the pods. Measured with 20 workflows of 100 pods failing at
/// once (tests/e2e, fast-retries-20x100): labels landed up to 7 minutes after
/// the failures, and 2 minutes failed every retry. 10 minutes leaves room
/// above that; a request that reaches it says what to do.
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(600);

/// The default [`DriveConfig::terminating_timeout`]: past the 30 s grace
/// period a running pod gets and a kubelet's slow stop, short enough that a
/// stuck retry gives its share back and tells why within minutes.
pub const DEFAULT_TERMINATING_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest a plan pod stays terminating before the count's note names
/// it: a pod on a healthy node is gone within a few seconds.
pub const HELD_NOTE_AFTER: Duration = Duration::from_secs(10);

/// How long a deletion waits for answers without hearing one before it asks
/// whether the queue still holds any of its items (a pass over every queued
/// item, so not at every tick).
const SILENCE: Duration = Duration::from_secs(10);

/// How long a deletion that waits only for terminating pods, and follows
/// them on its watch, goes without listing them again: the watch says when
/// one goes, and lists are due anyway when the note names them and at the
/// bound. A list of a large workflow's pods is tens of pages; twice a second
/// for a held pod it took a tenant's whole read budget.
const HELD_RELIST: Duration = Duration::from_secs(30);

/// Bulk requests in a row a deletion lets go unsent for want of a timely
/// proof (its list failed, or the send could not follow it within
/// `MAX_PROOF_AGE`: a namespace's long write line, slow answers) before it
/// deletes the rest one by one, each preconditioned on its UID and so exact
/// however late it is sent. Without a bound such a request lists and
/// re-proves without end, spending a read for every pass.
const UNPROVEN_BULK_LIMIT: usize = 3;

/// How long [`Deletion::stop`] waits for sends already under way: as long
/// as a send may last ([`READ_TIMEOUT`], past which kube gives it up), and a
/// little more for its answer to reach the request. A DeleteCollection of
/// thousands of pods takes tens of seconds; a stop that gave up before it
/// ended would say "deleted nothing more" while the API server still deletes.
const STOP_WAIT: Duration = READ_TIMEOUT.saturating_add(Duration::from_secs(5));

/// How long sends under way are waited for once the controller itself stops
/// (a SIGTERM, a lost Lease), by [`Deletion::stop`] and by the controller for
/// its delete workers. Their requests stay pending and the next leader
/// proves their pods again, so nothing reported depends on the wait; the
/// whole stop must fit in the pod's grace period (the chart's 30 s, less the
/// reports' and the Lease's own time).
pub const LEAVING_WAIT: Duration = Duration::from_secs(10);

impl Default for DriveConfig {
    fn default() -> Self {
        DriveConfig {
            allow_bulk: true,
            bulk_parallelism: 1,
            terminating_poll: Duration::from_millis(500),
            tick: Duration::from_secs(2),
            terminating_timeout: DEFAULT_TERMINATING_TIMEOUT,
            settle_timeout: DEFAULT_SETTLE_TIMEOUT,
            on_settle_timeout: OnSettleTimeout::Fail,
        }
    }
}

impl DriveConfig {
    /// When a terminating plan pod is named in the count's note.
    fn held_note_after(&self) -> Duration {
        (self.terminating_timeout / 10).min(HELD_NOTE_AFTER)
    }
}

/// Why the plan's pods could not all be deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("listing the pods of workflow {workflow} in namespace {namespace} failed: {}", fault::explain(.source))]
    List {
        namespace: String,
        workflow: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Recreated(#[from] Recreated),
    #[error(transparent)]
    Work(#[from] WorkError),
    #[error(transparent)]
    Foreign(#[from] ForeignPods),
    #[error(transparent)]
    Held(#[from] HeldPods),
    #[error(transparent)]
    Unsettled(#[from] UnsettledPods),
    #[error("the controller is shutting down; the request stays pending and resumes on restart")]
    Stopped,
}

impl DeleteError {
    /// Whether a later attempt may succeed (see [`fault::is_transient`]).
    pub fn is_transient(&self) -> bool {
        match self {
            DeleteError::List { source, .. } => fault::is_transient(source),
            DeleteError::Work(e) => fault::is_transient(&e.source),
            DeleteError::Stopped => true,
            DeleteError::Recreated(_)
            | DeleteError::Foreign(_)
            | DeleteError::Held(_)
            | DeleteError::Unsettled(_) => false,
        }
    }
}

/// Plan pods owned by another object than the workflow whose pods the
/// request deletes (see [`Deletion::owned_by`]): deleting them is not
/// rewind's to do, and Argo would adopt them, so the request stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}; rewind deletes only the archived workflow's pods and Argo would adopt these: delete them (kubectl delete pod -n {namespace} {}), then create a new WorkflowRetry",
    strangers(pods, owners, uid),
    named(pods, " ")
)]
pub struct ForeignPods {
    /// Every such pod, sorted, so one message says all there is to delete.
    pub pods: Vec<String>,
    pub namespace: String,
    pub uid: String,
    /// Their owners' UIDs, sorted and deduplicated; empty when orphaned.
    pub owners: Vec<String>,
}

/// The most pods (or owners) a message names; the log names them all.
const NAMED: usize = 10;

/// The first [`NAMED`] of `names` joined by `sep`, and how many more.
fn named(names: &[String], sep: &str) -> String {
    let shown = names[..names.len().min(NAMED)].join(sep);
    match names.len().saturating_sub(NAMED) {
        0 => shown,
        more => format!("{shown}{sep}(and {more} more, named in the controller's log)"),
    }
}

/// The first clause of [`ForeignPods`]' message.
fn strangers(pods: &[String], owners: &[String], uid: &str) -> String {
    let owners = if owners.is_empty() {
        "nothing (orphaned)".to_owned()
    } else {
        named(owners, ", ")
    };
    match pods {
        [one] => format!(
            "pod {one} has the name of a pod the retry recreates, but is owned by {owners}, not by the archived workflow {uid}"
        ),
        many => format!(
            "pods {} have the names of pods the retry recreates, but are owned by {owners}, not by the archived workflow {uid}",
            named(many, ", ")
        ),
    }
}

/// Plan pods deleted that stayed terminating past
/// [`DriveConfig::terminating_timeout`]: the reset cannot be written over them
/// (rule 2: Argo would adopt a pod still there), so the request ends, naming
/// them, what keeps each and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: the workflow was not reset, as Argo would adopt a pod still there; {}, then ask for the retry again",
    held_clause(pods, &format!("still there after {}", seconds(*waited))),
    held_advice(pods, namespace)
)]
pub struct HeldPods {
    /// Every plan pod still terminating, by name.
    pub pods: Vec<HeldPod>,
    pub namespace: String,
    pub waited: Duration,
}

/// One plan pod being deleted that stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPod {
    pub name: String,
    /// Its deletion timestamp and finalizers.
    pub terminating: Terminating,
    /// The node it ran on, as the workflow records it.
    pub node: Option<String>,
}

impl std::fmt::Display for HeldPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (being deleted since {}",
            self.name, self.terminating.since
        )?;
        if let Some(node) = &self.node {
            write!(f, " on node {node}")?;
        }
        match self.terminating.finalizers.as_slice() {
            [] => write!(
                f,
                ", no finalizer: its node has not confirmed that its containers stopped)"
            ),
            [one] => write!(f, ", held by finalizer {one})"),
            many => write!(f, ", held by finalizers {})", many.join(", ")),
        }
    }
}

/// Plan pods Argo had not finished with (not labelled completed=true) at
/// [`DriveConfig::settle_timeout`]: deleted, Argo would re-create them under
/// the same name and its queued label could land on the new pod, leaving its
/// node Pending for good; so none of them was deleted and the workflow was
/// not reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Argo's workflow-controller has not finished with {} after {}: {} not labelled workflows.argoproj.io/completed=true, so rewind did not delete {} and did not reset the workflow (deleting a pod before Argo labels it lets the label land on the pod Argo re-creates under that name, and its node stays Pending); check that Argo's workflow-controller runs and watches namespace {namespace} (kubectl logs of it name each pod it labels), then ask for the retry again, or run rewind with --on-settle-timeout=delete to delete such pods at the bound",
    unsettled_pods(pods),
    seconds(*waited),
    if pods.len() == 1 { "it is" } else { "they are" },
    if pods.len() == 1 { "it" } else { "them" }
)]
pub struct UnsettledPods {
    /// Every plan pod still waited for, by name.
    pub pods: Vec<String>,
    pub namespace: String,
    pub waited: Duration,
}

/// "plan pod P" or "N plan pods: P, …", naming at most [`NAMED`] pods.
fn unsettled_pods(pods: &[String]) -> String {
    match pods {
        [one] => format!("plan pod {one}"),
        many => format!("{} plan pods: {}", many.len(), named(many, ", ")),
    }
}

/// Follows since when each of `pods` has been waited for (first seen now,
/// forgotten once no longer among them); returns the longest wait.
fn waiting(since: &mut BTreeMap<String, Instant>, pods: &BTreeSet<String>) -> Duration {
    let now = Instant::now();
    since.retain(|pod, _| pods.contains(pod));
    for pod in pods {
        since.entry(pod.clone()).or_insert(now);
    }
    since
        .values()
        .map(|at| now.duration_since(*at))
        .max()
        .unwrap_or_default()
}

/// A wait as a person reads it, in the flag's own units: whole minutes or seconds.
fn seconds(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// "pod P (…) is {what}" or "N plan pods are {what}: P (…), …", naming at
/// most [`NAMED`] pods.
fn held_clause(pods: &[HeldPod], what: &str) -> String {
    let named: Vec<String> = pods.iter().take(NAMED).map(ToString::to_string).collect();
    let mut out = match pods {
        [one] => format!("plan pod {one} is {what}"),
        _ => format!("{} plan pods are {what}: {}", pods.len(), named.join(", ")),
    };
    if pods.len() > NAMED {
        let _ = write!(
            out,
            " (and {} more, named in the controller's log)",
            pods.len() - NAMED
        );
    }
    out
}

/// What the user can do about `pods`: remove finalizers, check nodes.
fn held_advice(pods: &[HeldPod], namespace: &str) -> String {
    let mut advice = Vec::new();
    if let Some(held) = pods.iter().find(|p| !p.terminating.finalizers.is_empty()) {
        advice.push(format!(
            "remove a finalizer once whatever set it is done with the pod (kubectl edit pod -n {namespace} {})",
            held.name
        ));
    }
    if let Some(stuck) = pods.iter().find(|p| p.terminating.finalizers.is_empty()) {
        let node = stuck.node.as_deref().unwrap_or("NODE");
        advice.push(format!(
            "check its node (kubectl describe node {node}); if the node is gone for good, kubectl delete pod -n {namespace} {} --grace-period=0 --force removes the pod",
            stuck.name
        ));
    }
    advice.join("; ")
}

/// Where a deletion stands, for its sink.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Plan pods.
    pub total: usize,
    /// Plan pods gone, counted by name (never twice, never backwards), as
    /// lists and answers confirm them.
    pub deleted: usize,
    /// Besides, plan pods the API server has removed while a bulk request
    /// runs, seen on a watch, not yet confirmed.
    pub removing: usize,
    /// Something the user should know about the way the pods go (plan pods
    /// that are deleted but stay, a bulk delete cut short), if anything
    /// happened.
    pub note: Option<String>,
}

impl Count {
    /// Plan pods to show as deleted: confirmed, and seen removed.
    pub fn shown(&self) -> usize {
        (self.deleted + self.removing).min(self.total)
    }
}

/// What a request does with a deletion's progress.
pub trait Sink: Send {
    /// The request's error, which a [`DeleteError`] becomes.
    type Error: From<DeleteError> + Send;

    /// Requests are about to be queued (the first pass that has any): the
    /// request is now deleting pods.
    fn deleting(&mut self, count: &Count) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Every [`DriveConfig::tick`] while requests are out: progress, and the
    /// sink's chance to stop the deletion (with an error).
    fn tick(&mut self, count: &Count) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Whether someone sees [`Count::removing`]: only then is a bulk
    /// request's progress watched, as the watch costs the API server an event
    /// per pod while it deletes them.
    fn shows_removals(&self) -> bool;
}

/// One request's deletion of its plan's pods. Registered with the engine
/// for its answers while it lives; dropping it withdraws what it queued.
pub struct Deletion {
    engine: Engine,
    key: RequestKey,
    namespace: String,
    workflow: String,
    /// Only pods owned by this UID are the plan's (an archived workflow's
    /// leftovers); `None` takes every pod labelled with the workflow.
    owner: Option<String>,
    /// A plan pod owned by another object than this UID (the live
    /// workflow's) is not the plan's.
    plan_owner: Option<String>,
    /// The revision the plan was read at, until the plan pods as they were
    /// then are recorded (see [`Deletion::read_at`]).
    read_at: Option<String>,
    config: DriveConfig,
    outcomes: UnboundedReceiver<Outcome>,
    tracker: Tracker,
    progress: Progress,
    /// The node each plan pod ran on, as the workflow records it (a hint for
    /// splitting a bulk delete).
    pod_nodes: BTreeMap<String, String>,
    /// Pods this deletion's requests removed.
    removed: usize,
    /// Bulk requests in a row not sent because they could not be proved in
    /// time (see [`UNPROVEN_BULK_LIMIT`]).
    unproven: usize,
    note: Option<String>,
    /// How long the list took that last found every plan pod gone.
    confirm_took: Duration,
    /// The revision of the last list.
    revision: Option<String>,
    /// Plan pods the lists show terminating, and since when.
    terminating_since: BTreeMap<String, Instant>,
    /// What the note says of them, once they stayed a while.
    held_note: Option<String>,
    /// Plan pods owned by this UID (the live workflow's) wait for Argo to
    /// finish with them before they are deleted; `None` waits for none.
    settle_owner: Option<String>,
    /// Plan pods waiting for Argo (name, UID as listed), and since when.
    settling: BTreeMap<String, String>,
    settling_since: BTreeMap<String, Instant>,
}

impl Deletion {
    pub fn new(
        engine: &Engine,
        key: RequestKey,
        namespace: &str,
        workflow: &str,
        config: DriveConfig,
    ) -> Self {
        Deletion {
            outcomes: engine.outcomes.register(key.clone()),
            engine: engine.clone(),
            key,
            namespace: namespace.to_owned(),
            workflow: workflow.to_owned(),
            owner: None,
            plan_owner: None,
            read_at: None,
            config,
            tracker: Tracker::default(),
            progress: Progress::default(),
            pod_nodes: BTreeMap::new(),
            removed: 0,
            unproven: 0,
            note: None,
            confirm_took: Duration::ZERO,
            revision: None,
            terminating_since: BTreeMap::new(),
            held_note: None,
            settle_owner: None,
            settling: BTreeMap::new(),
            settling_since: BTreeMap::new(),
        }
    }

    /// Takes as the plan's only the pods owned by `uid`; a pod of another
    /// owner under a plan pod's name stops the deletion ([`ForeignPods`]),
    /// and while any other pod carries the workflow's label, no bulk delete
    /// is sent (it could select that pod).
    pub fn owned_by(mut self, uid: &str) -> Self {
        self.owner = Some(uid.to_owned());
        self
    }

    /// Takes as the plan's only pods that are not owned by another object
    /// than `uid` (a live workflow's pods are owned by it): a plan pod that
    /// is stops the deletion ([`ForeignPods`]). Other pods with the label
    /// change nothing (the bulk path already spares what is not finished).
    ///
    /// Its plan pods are Argo's, which Argo labels once it has finished with
    /// them: one not labelled yet waits (see [`Assessment::settle`]). An
    /// archived workflow's pods do not: nothing labels a deleted workflow's.
    pub fn plan_owned_by(mut self, uid: &str) -> Self {
        self.plan_owner = Some(uid.to_owned());
        self.settle_owner = Some(uid.to_owned());
        self
    }

    /// The plan was made from the workflow at `revision`: the plan pods are
    /// the pods that had their names then. The next run first lists them as
    /// they were at that revision, so a pod created under a planned name
    /// since (a re-run of the workflow) is a recreated pod, never deleted
    /// ([`Recreated`]), however soon after the read it came.
    pub fn read_at(&mut self, revision: Option<String>) {
        self.read_at = revision;
    }

    /// Adds pods to delete (a first plan, or a re-plan after the workflow
    /// changed), with the node each ran on.
    pub fn plan(
        &mut self,
        pods: impl IntoIterator<Item = String>,
        pod_nodes: &BTreeMap<String, String>,
    ) {
        self.tracker.extend(pods);
        self.pod_nodes
            .extend(pod_nodes.iter().map(|(p, n)| (p.clone(), n.clone())));
    }

    /// Plan pods, and how many are gone.
    pub fn count(&self) -> Count {
        Count {
            total: self.tracker.plan().len(),
            deleted: self.progress.deleted(),
            removing: self.progress.watched(),
            note: self
                .held_note
                .clone()
                .or_else(|| self.settle_note())
                .or_else(|| self.note.clone()),
        }
    }

    /// What the count's note says of the plan pods waiting for Argo.
    fn settle_note(&self) -> Option<String> {
        let (them, pods) = match self.settling.len() {
            0 => return None,
            1 => ("it", "1 pod".to_owned()),
            n => ("them", format!("{n} pods")),
        };
        let bound = seconds(self.config.settle_timeout);
        let then = match self.config.on_settle_timeout {
            OnSettleTimeout::Fail => format!("the retry fails if Argo has not after {bound}"),
            OnSettleTimeout::Delete => format!("rewind deletes {them} anyway after {bound}"),
        };
        Some(format!(
            "waiting for Argo to finish with {pods} (label {them} workflows.argoproj.io/completed=true) before deleting {them}; {then}"
        ))
    }

    /// The plan's pods, by name.
    pub fn planned(&self) -> &BTreeSet<String> {
        self.tracker.plan()
    }

    /// True when the last list showed every plan pod gone: nothing to do
    /// unless the plan grows.
    pub fn confirmed(&self) -> bool {
        self.tracker.all_seen_gone()
    }

    /// Ends the deletion before its end: its queued work is withdrawn and the
    /// sends already under way are waited for (up to [`STOP_WAIT`]), so a
    /// request that then says it deleted nothing more has told the truth.
    /// Once `shutdown` (the controller's own stop) is cancelled the wait is
    /// [`LEAVING_WAIT`] at most. Dropping a deletion withdraws its work too,
    /// without waiting.
    pub async fn stop(self, shutdown: &CancellationToken) {
        let leased = self.engine.queue.withdraw(&self.key);
        if leased.is_empty() {
            return;
        }
        let released = self.engine.queue.released(&leased);
        let leaving = async {
            shutdown.cancelled().await;
            tokio::time::sleep(LEAVING_WAIT).await;
        };
        let why = tokio::select! {
            _ = released => return,
            _ = tokio::time::sleep(STOP_WAIT) => "the request stopped with deletes still under way; they may still land",
            _ = leaving => "the controller stopped with deletes still under way; they may still land, and the next leader lists the pods again",
        };
        warn!(
            namespace = self.namespace,
            workflow = self.workflow,
            sends = leased.len(),
            "{why}"
        );
    }

    /// Pods this deletion's requests removed (some may have gone otherwise).
    pub fn removed(&self) -> usize {
        self.removed
    }

    /// How long the list took that confirmed every plan pod gone, when
    /// [`Deletion::run`] last returned: the part of its time that is not
    /// deleting (the step metrics tell it apart).
    pub fn confirm_took(&self) -> Duration {
        self.confirm_took
    }

    /// Deletes the plan's pods until a fresh list shows every one gone, or
    /// the sink or `stop` ends it.
    pub async fn run<S: Sink>(
        &mut self,
        sink: &mut S,
        stop: &CancellationToken,
    ) -> Result<(), S::Error> {
        let mut next_tick = Instant::now() + self.config.tick;
        let mut announced = false;
        // The first list shows the pods as the plan was read (see `read_at`).
        let mut at = self.read_at.take();
        loop {
            let listing = Instant::now();
            // Until the deletion is under way, the sink hears the time pass
            // while the list waits for the read budget: a request queued
            // behind a batch's reads says where it stands (at most once per
            // status interval), not nothing. Later lists are not ticked
            // through: after a bulk request cut short, the count stands
            // lower until the list counts what it removed.
            let (count, tick) = (self.count(), self.config.tick);
            let listed = {
                let list = self.list(at.take());
                tokio::pin!(list);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return Err(DeleteError::Stopped.into()),
                        listed = &mut list => break listed?,
                        _ = tokio::time::sleep_until(next_tick), if !announced => {
                            next_tick = Instant::now() + tick;
                            sink.tick(&count).await?;
                        }
                    }
                }
            };
            debug!(
                ms = listing.elapsed().as_millis() as u64,
                pods = listed.0.len(),
                "pods listed"
            );
            let mut assessment = self.assess(&listed)?;
            self.held(&assessment, &listed.0)
                .map_err(DeleteError::from)?;
            self.settle(&mut assessment, &listed.0)
                .map_err(DeleteError::from)?;
            let total = self.tracker.plan().len();
            if assessment.all_gone(total) {
                self.confirm_took = listing.elapsed();
                return Ok(());
            }
            if !announced {
                announced = true;
                sink.deleting(&self.count()).await?;
            }
            let mut work = split_bulk(
                assessment.work,
                self.config.bulk_parallelism,
                &self.pod_nodes,
            );
            // One answer comes per distinct item (the queue merges the same
            // item queued twice), so each is counted once.
            work.sort();
            work.dedup();
            let bulk = work.iter().any(|w| matches!(w, DeleteWork::Bulk { .. }));
            let shows_removals = bulk && sink.shows_removals();
            let held = !assessment.terminating.is_empty();
            // Argo's labels, and pods that stay terminating, are followed on
            // the same watch, not by listing again.
            let mut events = if shows_removals || !self.settling.is_empty() || held {
                tokio::select! {
                    _ = stop.cancelled() => return Err(DeleteError::Stopped.into()),
                    watch = self.watch() => watch,
                }
            } else {
                None
            };
            let mut pending = work.len();
            for work in work {
                let item = WorkItem {
                    namespace: self.namespace.clone(),
                    work,
                };
                self.engine
                    .queue
                    .add(self.key.clone(), Class::Interactive, item);
            }
            debug!(items = pending, "delete work queued");
            // Without a watch, pods waiting for Argo are looked at again as
            // terminating ones are.
            let wait_terminating = held || (!self.settling.is_empty() && events.is_none());
            let mut relist_at = Instant::now()
                + if held && events.is_some() {
                    self.held_relist()
                } else {
                    self.config.terminating_poll
                };
            // At the bound, the next list ends the wait (see `settle`).
            let settle_bound = self
                .settling_since
                .values()
                .min()
                .map(|since| *since + self.config.settle_timeout);
            let mut heard = Instant::now();
            while pending > 0 || wait_terminating || (!self.settling.is_empty() && events.is_some())
            {
                let outcome = tokio::select! {
                    _ = stop.cancelled() => return Err(DeleteError::Stopped.into()),
                    o = self.outcomes.recv(), if pending > 0 => o.ok_or(DeleteError::Stopped)?,
                    // Pods on a node shut down gracefully: look again shortly,
                    // or, while the watch follows them, when one goes, when the
                    // note is due and at the bound (see `held_relist`).
                    _ = tokio::time::sleep_until(relist_at), if pending == 0 && wait_terminating => break,
                    _ = tokio::time::sleep_until(next_tick) => {
                        next_tick = Instant::now() + self.config.tick;
                        sink.tick(&self.count()).await?;
                        if pending > 0 && heard.elapsed() >= SILENCE {
                            heard = Instant::now();
                            if self.unanswerable(&mut pending)? {
                                break;
                            }
                        }
                        continue;
                    }
                    _ = async { tokio::time::sleep_until(settle_bound?).await; Some(()) },
                        if pending == 0 && !self.settling.is_empty() && settle_bound.is_some() => break,
                    event = async { events.as_mut()?.next().await }, if events.is_some() => {
                        match event {
                            Some(PodEvent::Removed { name, uid }) => {
                                // A held pod went: list at once to confirm it.
                                if assessment.terminating.contains(&name) {
                                    relist_at = Instant::now();
                                }
                                if shows_removals && self.tracker.holds(&name, &uid) {
                                    self.progress.seen_removed(name);
                                }
                            }
                            Some(PodEvent::Settled { name, uid })
                                if self.settling.get(&name) == Some(&uid) =>
                            {
                                // Argo is done with it: deleted now, by its UID.
                                self.settling.remove(&name);
                                self.settling_since.remove(&name);
                                let item = WorkItem {
                                    namespace: self.namespace.clone(),
                                    work: DeleteWork::Pod { name, uid },
                                };
                                self.engine
                                    .queue
                                    .add(self.key.clone(), Class::Interactive, item);
                                pending += 1;
                            }
                            Some(_) => {}
                            None => {
                                events = None;
                                relist_at = relist_at.min(Instant::now() + self.config.terminating_poll);
                            }
                        }
                        continue;
                    }
                };
                heard = Instant::now();
                pending -= 1;
                debug!(left = pending, "delete work answered");
                self.answered(outcome)?;
            }
        }
    }

    /// How long a wait on terminating pods that the watch follows goes
    /// before the next list: until the note is due to name them, until the
    /// bound, or [`HELD_RELIST`], whichever comes first.
    fn held_relist(&self) -> Duration {
        let now = Instant::now();
        let first = self
            .terminating_since
            .values()
            .min()
            .copied()
            .unwrap_or(now);
        [
            first + self.config.held_note_after(),
            first + self.config.terminating_timeout,
        ]
        .into_iter()
        .filter(|at| *at > now)
        .map(|at| at - now)
        .fold(HELD_RELIST, Duration::min)
        .max(self.config.terminating_poll)
    }

    /// Whether the answers this deletion waits for can no longer come: the
    /// queue holds none of its items (every answer was sent before its lease
    /// ended), and none is left to read. Then it lists again, which decides
    /// anew, instead of waiting forever.
    fn unanswerable(&mut self, pending: &mut usize) -> Result<bool, DeleteError> {
        if self.engine.queue.answers_to(&self.key) {
            return Ok(false);
        }
        while *pending > 0 {
            let Ok(outcome) = self.outcomes.try_recv() else {
                break;
            };
            *pending -= 1;
            self.answered(outcome)?;
        }
        if *pending > 0 {
            warn!(
                namespace = self.namespace,
                workflow = self.workflow,
                request = %self.key,
                missing = *pending,
                "answers to queued delete work never came; listing the pods again"
            );
        }
        Ok(*pending > 0)
    }

    /// Follows the plan pods a fresh list shows terminating: named in the
    /// note once they stayed [`DriveConfig::held_note_after`], an error
    /// once one stayed [`DriveConfig::terminating_timeout`].
    fn held(&mut self, assessment: &Assessment, listed: &[Listed]) -> Result<(), HeldPods> {
        let longest = waiting(&mut self.terminating_since, &assessment.terminating);
        if longest < self.config.held_note_after() {
            self.held_note = None;
            return Ok(());
        }
        let pods: Vec<HeldPod> = listed
            .iter()
            .filter(|p| self.terminating_since.contains_key(&p.name))
            .filter_map(|p| {
                let held = HeldPod {
                    name: p.name.clone(),
                    terminating: (**p.terminating.as_ref()?).clone(),
                    node: self
                        .pod_nodes
                        .get(&p.name)
                        .filter(|n| !n.is_empty())
                        .cloned(),
                };
                Some((p.name.clone(), held))
            })
            // By name, once each.
            .collect::<BTreeMap<_, _>>()
            .into_values()
            .collect();
        if longest >= self.config.terminating_timeout {
            let held = HeldPods {
                pods,
                namespace: self.namespace.clone(),
                waited: self.config.terminating_timeout,
            };
            warn!(
                namespace = self.namespace,
                workflow = self.workflow,
                pods = ?held.pods,
                "plan pods deleted but still there past the terminating timeout; the request stops"
            );
            return Err(held);
        }
        let deadline = seconds(self.config.terminating_timeout);
        let (them, they) = match pods.len() {
            1 => ("it", "it is"),
            _ => ("them", "they are"),
        };
        self.held_note = Some(format!(
            "{}; the retry waits for {them} and fails if {they} still there after {deadline}",
            held_clause(&pods, "still there")
        ));
        Ok(())
    }

    /// Takes out of `assessment` the deletes of plan pods Argo has not
    /// finished with (see [`Assessment::settle`]) and waits for them; once
    /// one has waited [`DriveConfig::settle_timeout`], ends the deletion
    /// with [`UnsettledPods`], or with [`OnSettleTimeout::Delete`] leaves
    /// their deletes in and waits for no pod any more, saying so.
    fn settle(
        &mut self,
        assessment: &mut Assessment,
        listed: &[Listed],
    ) -> Result<(), UnsettledPods> {
        let Some(owner) = &self.settle_owner else {
            return Ok(());
        };
        let settling = assessment.settle(listed, owner);
        let names: BTreeSet<String> = settling.keys().cloned().collect();
        let longest = waiting(&mut self.settling_since, &names);
        if settling.is_empty() || longest < self.config.settle_timeout {
            self.settling = settling;
            return Ok(());
        }
        let pods: Vec<String> = settling.keys().cloned().collect();
        self.settling.clear();
        self.settling_since.clear();
        let waited = seconds(self.config.settle_timeout);
        match self.config.on_settle_timeout {
            OnSettleTimeout::Fail => {
                warn!(
                    namespace = self.namespace,
                    workflow = self.workflow,
                    ?pods,
                    "plan pods Argo has not finished with past the settle timeout; the request stops"
                );
                Err(UnsettledPods {
                    pods,
                    namespace: self.namespace.clone(),
                    waited: self.config.settle_timeout,
                })
            }
            OnSettleTimeout::Delete => {
                warn!(
                    namespace = self.namespace,
                    workflow = self.workflow,
                    ?pods,
                    "plan pods Argo has not finished with past the settle timeout; deleting them anyway"
                );
                self.note = Some(format!(
                    "Argo's workflow-controller had not finished with {} after {waited} (not labelled workflows.argoproj.io/completed=true); rewind deleted them anyway (--on-settle-timeout=delete): if one of their nodes stays Pending, its new pod carries the label, and removing it (kubectl label pod -n {} POD workflows.argoproj.io/completed=false --overwrite) lets Argo take it up",
                    unsettled_pods(&pods),
                    self.namespace
                ));
                assessment.work.extend(
                    settling
                        .into_iter()
                        .map(|(name, uid)| DeleteWork::Pod { name, uid }),
                );
                // Waited once, for the bound: the rest of the deletion does not wait.
                self.settle_owner = None;
                Ok(())
            }
        }
    }

    /// A plan pod owned by another object than [`Deletion::plan_owned_by`]'s.
    fn foreign(&self, listed: &[Listed]) -> Result<(), DeleteError> {
        let Some(owner) = &self.plan_owner else {
            return Ok(());
        };
        let strangers: Vec<&Listed> = listed
            .iter()
            .filter(|p| self.tracker.plan().contains(&p.name))
            .filter(|p| !p.owners.is_empty() && !p.owners.contains(owner))
            .collect();
        self.refuse(strangers, owner)
    }

    /// Stops the deletion if `strangers`, plan pods of other owners than
    /// `owner`, is not empty.
    fn refuse(&self, mut strangers: Vec<&Listed>, owner: &str) -> Result<(), DeleteError> {
        if !strangers.is_empty() {
            strangers.sort_by(|a, b| a.name.cmp(&b.name));
            let owners: BTreeSet<String> = strangers
                .iter()
                .flat_map(|p| p.owners.iter().cloned())
                .collect();
            let pods: Vec<String> = strangers.iter().map(|p| p.name.clone()).collect();
            warn!(
                namespace = self.namespace,
                workflow = self.workflow,
                ?pods,
                "plan pods owned by another object; the request stops"
            );
            return Err(ForeignPods {
                pods,
                namespace: self.namespace.clone(),
                uid: owner.to_owned(),
                owners: owners.into_iter().collect(),
            }
            .into());
        }
        Ok(())
    }

    /// A fresh list of the workflow's pods, or with `at` the pods as they
    /// were at that revision: with an owner, only its pods, and bulk deletes
    /// off while any other carries the label.
    ///
    /// A list at the workflow's read revision is exact for a first
    /// assessment: its UIDs are the plan's, every single delete is
    /// preconditioned on one and every bulk delete is proven again against a
    /// fresh list before it is sent. Past etcd's compaction (410) there is no
    /// such list; a fresh one records the plan pods, as it did before.
    async fn list(&mut self, at: Option<String>) -> Result<(Vec<Listed>, bool), DeleteError> {
        // Plan pods seen gone are looked for again only by the list that
        // finds the rest gone too: it confirms the whole plan.
        let left = self.tracker.left();
        let wanted = match left.is_empty() {
            true => self.tracker.plan(),
            false => &left,
        };
        let client = &self.engine.client;
        let listed = async |at| {
            list_workflow_pods(client, &self.namespace, &self.workflow, wanted, at).await
        };
        let snapshot = match listed(at.as_deref()).await {
            Err(error) if at.is_some() && fault::api_code(&error) == Some(410) => {
                warn!(
                    namespace = self.namespace,
                    workflow = self.workflow,
                    revision = at,
                    "the pods as the workflow was read are compacted away; a fresh list records them"
                );
                listed(None).await
            }
            snapshot => snapshot,
        }
        .map_err(|source| DeleteError::List {
            namespace: self.namespace.clone(),
            workflow: self.workflow.clone(),
            source,
        })?;
        self.revision = snapshot.revision;
        let listed = snapshot.pods;
        self.foreign(&listed)?;
        let Some(owner) = &self.owner else {
            return Ok((listed, false));
        };
        let owned = |p: &Listed| p.owners.contains(owner);
        let (ours, theirs): (Vec<Listed>, Vec<Listed>) = listed.into_iter().partition(owned);
        let strangers: Vec<&Listed> = theirs
            .iter()
            .filter(|p| self.tracker.plan().contains(&p.name))
            .collect();
        self.refuse(strangers, owner)?;
        Ok((ours, !theirs.is_empty()))
    }

    /// Assesses a fresh list; after a bulk request cut short, counts what it
    /// removed, and if nothing, goes on pod by pod (another bulk request
    /// would likely meet the same end).
    fn assess(
        &mut self,
        (listed, strangers): &(Vec<Listed>, bool),
    ) -> Result<crate::engine::assess::Assessment, DeleteError> {
        let bulk = self.config.allow_bulk && !strangers;
        let mut assessment = self.tracker.assess(&self.workflow, listed, bulk)?;
        if let Some(removed) = self.progress.listed(&assessment.gone) {
            self.removed += removed;
            self.engine.observer.pods_deleted(removed);
            self.note = Some(if removed > 0 {
                format!(
                    "a bulk delete was cut short (by the API server's request timeout or an error) after it removed {removed} pods; rewind listed the pods again and deletes the rest"
                )
            } else {
                self.config.allow_bulk = false;
                assessment = self.tracker.assess(&self.workflow, listed, false)?;
                "a bulk delete was cut short (by the API server's request timeout or an error) before it removed any pod; rewind deletes the rest one by one".to_owned()
            });
            warn!(
                namespace = self.namespace,
                workflow = self.workflow,
                removed,
                bulk = self.config.allow_bulk,
                left = self.tracker.plan().len() - assessment.gone.len(),
                "bulk delete cut short; pods listed again"
            );
        }
        Ok(assessment)
    }

    /// The workflow's pods as the API server removes them or Argo labels
    /// them, from the last list's revision on: a bulk request's progress,
    /// which its answer gives only at the end, and the plan pods Argo has
    /// finished with. Without the watch (it could not start) the count waits
    /// for the answer, and pods waiting for Argo are listed again shortly.
    async fn watch(&self) -> Option<BoxStream<'static, PodEvent>> {
        let revision = self.revision.as_deref()?;
        match watch_pods(
            &self.engine.client,
            &self.namespace,
            &self.workflow,
            revision,
        )
        .await
        {
            Ok(removals) => Some(removals),
            Err(error) => {
                debug!(
                    namespace = self.namespace,
                    workflow = self.workflow,
                    error = %fault::explain(&error),
                    "watching the bulk delete's pods failed; progress shows when it answers"
                );
                None
            }
        }
    }

    /// Counts what a work item's answer says.
    fn answered(&mut self, outcome: Outcome) -> Result<(), DeleteError> {
        let work = &outcome.item.work;
        match outcome.result? {
            Done::Unfinished => self.progress.cut_short(work),
            // Not sent: the next list decides anew.
            Done::Stale(Unsent::ProofFailed | Unsent::ProofExpired) => self.unproven(),
            Done::Stale(_) => {}
            done => {
                if let Done::Deleted(n) = done {
                    self.removed += n;
                }
                if matches!(work, DeleteWork::Bulk { .. }) {
                    self.unproven = 0;
                }
                self.progress.answered(self.tracker.plan(), work);
            }
        }
        Ok(())
    }

    /// Counts a bulk request not sent for want of a timely proof; at
    /// [`UNPROVEN_BULK_LIMIT`] in a row, the rest goes one by one.
    fn unproven(&mut self) {
        self.unproven += 1;
        if self.unproven < UNPROVEN_BULK_LIMIT || !self.config.allow_bulk {
            return;
        }
        self.config.allow_bulk = false;
        self.note = Some(format!(
            "{} bulk deletes in a row could not be proved exact in time (their proof list failed or the send came too late after it); rewind deletes the rest one by one",
            self.unproven
        ));
        warn!(
            namespace = self.namespace,
            workflow = self.workflow,
            unproven = self.unproven,
            "bulk deletes could not be proved in time; deleting one by one"
        );
    }
}

impl Drop for Deletion {
    fn drop(&mut self) {
        self.engine.outcomes.unregister(&self.key);
        self.engine.queue.cancel(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(name: &str, finalizers: &[&str], node: Option<&str>) -> HeldPod {
        HeldPod {
            name: name.into(),
            terminating: Terminating {
                since: "2026-12-02T18:25:22Z".into(),
                finalizers: finalizers.iter().map(|f| f.to_string()).collect(),
            },
            node: node.map(str::to_owned),
        }
    }

    #[test]
    fn pods_that_will_not_go_are_named_with_what_holds_them_and_what_to_do() {
        let one = HeldPods {
            pods: vec![held("wf-1", &["example.com/hold"], Some("n1"))],
            namespace: "argo".into(),
            waited: Duration::from_secs(300),
        }
        .to_string();
        assert_eq!(
            one,
            "plan pod wf-1 (being deleted since 2026-12-02T18:25:22Z on node n1, held by finalizer example.com/hold) is still there after 5m: the workflow was not reset, as Argo would adopt a pod still there; remove a finalizer once whatever set it is done with the pod (kubectl edit pod -n argo wf-1), then ask for the retry again"
        );
        let two = HeldPods {
            pods: vec![
                held("wf-1", &["a.io/x", "b.io/y"], None),
                held("wf-2", &[], Some("gone")),
            ],
            namespace: "argo".into(),
            waited: Duration::from_secs(90),
        }
        .to_string();
        assert!(
            two.starts_with("2 plan pods are still there after 90s: wf-1 (being deleted since 2026-12-02T18:25:22Z, held by finalizers a.io/x, b.io/y), wf-2 (being deleted since 2026-12-02T18:25:22Z on node gone, no finalizer: its node has not confirmed that its containers stopped):"),
            "{two}"
        );
        assert!(two.contains("(kubectl edit pod -n argo wf-1)"), "{two}");
        assert!(
            two.contains("check its node (kubectl describe node gone); if the node is gone for good, kubectl delete pod -n argo wf-2 --grace-period=0 --force removes the pod"),
            "{two}"
        );
        let many = HeldPods {
            pods: (0..25)
                .map(|i| held(&format!("wf-{i:02}"), &["x.io/y"], None))
                .collect(),
            namespace: "argo".into(),
            waited: Duration::from_secs(300),
        }
        .to_string();
        assert!(many.contains("wf-09") && !many.contains("wf-10"), "{many}");
        assert!(
            many.contains("(and 15 more, named in the controller's log)"),
            "{many}"
        );
    }

    #[test]
    fn pods_argo_never_labelled_are_named_with_what_is_missing_and_what_to_do() {
        let one = UnsettledPods {
            pods: vec!["wf-1".into()],
            namespace: "argo".into(),
            waited: Duration::from_secs(600),
        }
        .to_string();
        assert!(
            one.starts_with("Argo's workflow-controller has not finished with plan pod wf-1 after 10m: it is not labelled workflows.argoproj.io/completed=true, so rewind did not delete it and did not reset the workflow"),
            "{one}"
        );
        assert!(one.contains("watches namespace argo"), "{one}");
        assert!(
            one.ends_with("--on-settle-timeout=delete to delete such pods at the bound"),
            "{one}"
        );
        let many = UnsettledPods {
            pods: (0..12).map(|i| format!("wf-{i:02}")).collect(),
            namespace: "argo".into(),
            waited: Duration::from_secs(90),
        }
        .to_string();
        assert!(
            many.starts_with(
                "Argo's workflow-controller has not finished with 12 plan pods: wf-00, "
            ),
            "{many}"
        );
        assert!(
            many.contains(
                "(and 2 more, named in the controller's log) after 90s: they are not labelled"
            ),
            "{many}"
        );
        assert!(many.contains("did not delete them"), "{many}");
    }

    #[test]
    fn held_pods_are_named_after_a_tenth_of_the_timeout_at_most_ten_seconds() {
        let config = |secs| DriveConfig {
            terminating_timeout: Duration::from_secs(secs),
            ..DriveConfig::default()
        };
        assert_eq!(DriveConfig::default().held_note_after(), HELD_NOTE_AFTER);
        assert_eq!(config(6).held_note_after(), Duration::from_millis(600));
        assert_eq!(config(3600).held_note_after(), HELD_NOTE_AFTER);
    }

    #[test]
    fn a_refusal_names_ten_pods_and_how_many_more() {
        let pods: Vec<String> = (0..25).map(|i| format!("wf-{i:02}")).collect();
        let text = ForeignPods {
            pods,
            namespace: "argo".into(),
            uid: "old".into(),
            owners: vec![],
        }
        .to_string();
        assert!(text.contains("wf-09") && !text.contains("wf-10"), "{text}");
        assert!(
            text.contains("(and 15 more, named in the controller's log)"),
            "{text}"
        );
    }

    #[test]
    fn a_refusal_names_every_foreign_pod_and_how_to_delete_them() {
        let one = ForeignPods {
            pods: vec!["wf-a-1".into()],
            namespace: "argo".into(),
            uid: "old".into(),
            owners: vec![],
        }
        .to_string();
        assert!(
            one.starts_with("pod wf-a-1 has the name of a pod the retry recreates, but is owned by nothing (orphaned), not by the archived workflow old;"),
            "{one}"
        );
        assert!(one.contains("kubectl delete pod -n argo wf-a-1)"), "{one}");
        let two = ForeignPods {
            pods: vec!["wf-a-1".into(), "wf-b-2".into()],
            namespace: "argo".into(),
            uid: "old".into(),
            owners: vec!["new".into()],
        }
        .to_string();
        assert!(
            two.starts_with("pods wf-a-1, wf-b-2 have the names of pods the retry recreates, but are owned by new, not by the archived workflow old;"),
            "{two}"
        );
        assert!(
            two.contains("kubectl delete pod -n argo wf-a-1 wf-b-2)"),
            "{two}"
        );
    }
}
