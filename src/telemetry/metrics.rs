//! Prometheus metrics, served on `/metrics` in the OpenMetrics text format.
//!
//! Every label has a fixed, small set of values (no workflow or namespace
//! names), and every series a dashboard or alert reads is created at zero up
//! front: `increase()` and `rate()` then see a request's first observation,
//! and a panel shows 0 rather than "no data" before anything happened.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

use crate::engine::budget::{Bucket, BudgetConfig, BudgetObserver, Priority, Verb};
use crate::engine::queue::QueueDepths;
use crate::engine::workers::Unsent;
use crate::telemetry::process::ProcessCollector;

/// The `result` label values of `rewind_retry_duration_seconds` (what
/// `retry::report::Ending::metric_label` gives).
pub const RESULTS: [&str; 5] = [
    "succeeded",
    "failed",
    "transient_error",
    "interrupted",
    "already_observed",
];

/// Which flow a retry runs: the `kind` label of the step metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryKind {
    /// A workflow in the cluster (an annotation, or a WorkflowRetry naming it).
    Live,
    /// A workflow from Argo's archive (a WorkflowRetry naming its UID).
    Archived,
}

impl RetryKind {
    fn as_str(self) -> &'static str {
        match self {
            RetryKind::Live => "live",
            RetryKind::Archived => "archived",
        }
    }

    /// The steps a retry of this kind goes through, in order.
    fn steps(self) -> [Step; 5] {
        let last = match self {
            RetryKind::Live => Step::Commit,
            RetryKind::Archived => Step::Create,
        };
        [Step::Read, Step::Plan, Step::Delete, Step::Confirm, last]
    }
}

/// A step of a retry: the `step` label of the step metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Reading the workflow (live: from the API server, with offloaded
    /// nodes; archived: the archive's row).
    Read,
    /// Planning the retry (Argo's rules).
    Plan,
    /// Deleting the plan's pods: lists, delete requests, and waits for pods
    /// that terminate gracefully.
    Delete,
    /// The last list of the deletion, the one that found every plan pod gone.
    Confirm,
    /// Writing the reset workflow (live).
    Commit,
    /// Creating the workflow anew (archived).
    Create,
}

impl Step {
    fn as_str(self) -> &'static str {
        match self {
            Step::Read => "read",
            Step::Plan => "plan",
            Step::Delete => "delete",
            Step::Confirm => "confirm",
            Step::Commit => "commit",
            Step::Create => "create",
        }
    }
}

/// The container's resource limits, as the downward API gives them (the
/// chart sets them); without them the memory and CPU limit gauges are not
/// exported, rather than exported as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContainerLimits {
    pub memory_bytes: Option<u64>,
    pub cpu_cores: Option<f64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    /// Priority class: interactive (user retries) or background (GC).
    class: &'static str,
    /// ready, waiting (out a backoff or delay) or leased (to a worker).
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    /// The HTTP status, or "error" when no response came.
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    bucket: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabels {
    bucket: &'static str,
    priority: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    /// See `engine::workers::Unsent`.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// workflow (an annotation request) or workflowretry.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    /// live or archived.
    kind: &'static str,
    /// read, plan, delete, confirm, commit (live) or create (archived).
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IdentityLabels {
    /// The replica's name in the Lease (its pod's name): one value per
    /// replica, so bounded.
    identity: String,
}

const BUCKETS: [Bucket; 2] = [Bucket::Read, Bucket::Write];

/// The bucket bounds of `rewind_retry_duration_seconds`.
const RETRY_SECONDS: [f64; 11] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// The bucket bounds of `rewind_retry_step_seconds`.
const STEP_SECONDS: [f64; 13] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

/// Registers `metric` and returns it: its clones share its value, so the
/// returned one is the handle `Metrics` updates.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// `family`, with the series of `labels` created at zero.
fn at_zero<'l, S, M, C>(
    family: Family<S, M, C>,
    labels: impl IntoIterator<Item = &'l S>,
) -> Family<S, M, C>
where
    S: Clone + std::hash::Hash + Eq + 'l,
    C: MetricConstructor<M>,
{
    for labels in labels {
        drop(family.get_or_create(labels));
    }
    family
}

/// Registers the budget's settings: what each bucket refills and holds.
fn register_budget(registry: &mut Registry, budget: &BudgetConfig) {
    let qps = register(
        registry,
        "api_budget_qps",
        "Tokens each budget bucket refills per second (--qps, --read-qps)",
        Family::<BucketLabels, Gauge>::default(),
    );
    let burst = register(
        registry,
        "api_budget_burst",
        "Tokens each budget bucket holds at most (--burst, --read-burst)",
        Family::<BucketLabels, Gauge>::default(),
    );
    for (bucket, rate) in [(Bucket::Read, budget.reads), (Bucket::Write, budget.writes)] {
        let labels = BucketLabels {
            bucket: bucket.as_str(),
        };
        qps.get_or_create(&labels).set(rate.qps.get().into());
        burst.get_or_create(&labels).set(rate.burst.get().into());
    }
}

/// Registers who the replica is and, where known, its container's limits.
fn register_replica(registry: &mut Registry, identity: &str, limits: ContainerLimits) {
    registry.register(
        "replica",
        "This replica's identity (its name in the Lease); rewind_leader says whether it leads",
        Info::new(IdentityLabels {
            identity: identity.to_owned(),
        }),
    );
    if let Some(bytes) = limits.memory_bytes {
        let limit = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        limit.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        registry.register(
            "memory_limit_bytes",
            "The container's memory limit (--memory-limit; the chart sets it from the downward API)",
            limit,
        );
    }
    if let Some(cores) = limits.cpu_cores {
        let limit = Gauge::<f64, AtomicU64>::default();
        limit.set(cores);
        registry.register(
            "cpu_limit_cores",
            "The container's CPU limit in cores (--cpu-limit; the chart sets it from the downward API)",
            limit,
        );
    }
}

/// A bucket's place in per-bucket arrays.
fn slot(bucket: Bucket) -> usize {
    match bucket {
        Bucket::Read => 0,
        Bucket::Write => 1,
    }
}

/// The most tokens a budget bucket gave out within one second, over the
/// last minute. A minute, longer than any scrape interval, so no peak falls
/// between two scrapes.
#[derive(Debug)]
struct BusiestSecond {
    /// When tokens were taken in the last second, oldest first: at most
    /// burst + qps of them (see `engine::budget`).
    recent: VecDeque<Instant>,
    /// For each of the last 60 seconds (since `origin`, modulo 60): that
    /// second, and the most tokens a one-second window ending in it held.
    peaks: [(u64, u64); 60],
}

impl BusiestSecond {
    fn new() -> Self {
        BusiestSecond {
            recent: VecDeque::new(),
            peaks: [(0, 0); 60],
        }
    }

    fn took(&mut self, now: Instant, origin: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        let second = now.duration_since(origin).as_secs();
        let peak = &mut self.peaks[(second % 60) as usize];
        if peak.0 != second {
            *peak = (second, 0);
        }
        peak.1 = peak.1.max(self.recent.len() as u64);
    }

    fn busiest(&self, now: Instant, origin: Instant) -> u64 {
        let second = now.duration_since(origin).as_secs();
        self.peaks
            .iter()
            .filter(|(at, _)| second - at < 60)
            .map(|(_, peak)| *peak)
            .max()
            .unwrap_or(0)
    }
}

/// Every metric rewind exports.
pub struct Metrics {
    registry: Registry,
    queue_depth: Family<QueueLabels, Gauge>,
    api_requests: Family<RequestLabels, Counter>,
    token_wait: Family<BucketLabels, Counter<f64, AtomicU64>>,
    tokens: Family<BucketLabels, Counter>,
    priority_tokens: Family<PriorityLabels, Counter>,
    events_dropped: Counter,
    busiest_second: Family<BucketLabels, Gauge>,
    busiest: Mutex<[BusiestSecond; 2]>,
    /// Where the busiest-second windows count their seconds from.
    origin: Instant,
    pauses: Family<BucketLabels, Counter>,
    pause_seconds: Family<BucketLabels, Counter<f64, AtomicU64>>,
    in_flight: Gauge,
    pods_deleted: Counter,
    deletes_unsent: Family<ReasonLabels, Counter>,
    retry_duration: Family<ResultLabels, Histogram>,
    step_seconds: Family<StepLabels, Histogram>,
    in_progress: Family<StepLabels, Gauge>,
    leader: Gauge,
    leader_changes: Counter,
    panics: Family<KindLabels, Counter>,
    stranded_nodes: Counter,
    /// Plain totals beside the families, which are costly to sum.
    requests_total: AtomicU64,
    mutating_total: AtomicU64,
}

/// API requests answered (or failed) so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub total: u64,
    pub mutating: u64,
}

impl std::ops::Sub for RequestCounts {
    type Output = RequestCounts;

    fn sub(self, earlier: RequestCounts) -> RequestCounts {
        RequestCounts {
            total: self.total - earlier.total,
            mutating: self.mutating - earlier.mutating,
        }
    }
}

impl Metrics {
    /// The metrics of the replica named `identity`, which spends `budget`
    /// and runs within `limits`.
    pub fn new(identity: &str, budget: &BudgetConfig, limits: ContainerLimits) -> Self {
        let mut root = Registry::default();
        // The process metrics keep the names every Prometheus client gives them.
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("rewind");
        // By area, in the order /metrics lists them; `at_zero` creates the
        // series the module doc says are there from the start.

        // The delete queue; `encode` sets its depths at each scrape.
        let queue_depth = register(
            registry,
            "queue_depth",
            "Delete work items in the queue, by priority class and state",
            Family::default(),
        );

        // API requests and the budget that paces them.
        let buckets = BUCKETS.map(|bucket| BucketLabels {
            bucket: bucket.as_str(),
        });
        let api_requests = register(
            registry,
            "api_requests",
            "Kubernetes API requests sent, by verb and HTTP response code (error: no response)",
            Family::default(),
        );
        let token_wait = register(
            registry,
            "api_token_wait_seconds",
            "Seconds API requests spent waiting for a budget token, by bucket (read or write)",
            at_zero(Family::default(), &buckets),
        );
        let tokens = register(
            registry,
            "api_tokens",
            "Tokens taken from each budget bucket (one per API request sent), by bucket",
            at_zero(Family::default(), &buckets),
        );
        let priority_tokens = register(
            registry,
            "api_priority_tokens",
            "Tokens taken from each budget bucket by the priority of the work they served (retry, answer, background, report)",
            at_zero(
                Family::default(),
                &BUCKETS
                    .into_iter()
                    .flat_map(|bucket| {
                        Priority::ALL.map(|priority| PriorityLabels {
                            bucket: bucket.as_str(),
                            priority: priority.as_str(),
                        })
                    })
                    .collect::<Vec<_>>(),
            ),
        );
        let events_dropped = register(
            registry,
            "events_dropped",
            "Events not published because the write budget was short (Events are best effort)",
            Counter::default(),
        );
        let busiest_second = register(
            registry,
            "api_tokens_busiest_second",
            "The most tokens taken from a budget bucket within one second, over the last minute (at most qps + burst)",
            at_zero(Family::default(), &buckets),
        );
        register_budget(registry, budget);
        let pauses = register(
            registry,
            "api_pauses",
            "Pauses of a budget bucket ordered by the API server (429 or 503 with Retry-After)",
            at_zero(Family::default(), &buckets),
        );
        let pause_seconds = register(
            registry,
            "api_pause_seconds",
            "Seconds of the pauses the API server ordered with Retry-After, by bucket",
            at_zero(Family::default(), &buckets),
        );
        let in_flight = register(
            registry,
            "api_requests_in_flight",
            "Kubernetes API requests in flight (watches excluded)",
            Gauge::default(),
        );

        // Retries: the pods they delete, how they end, and their steps.
        let pods_deleted = register(
            registry,
            "pods_deleted",
            "Pods deleted (or released from Argo's finalizer) for retries and pod GC",
            Counter::default(),
        );
        let deletes_unsent = register(
            registry,
            "deletes_unsent",
            "Delete work not sent at its turn, by reason: a bulk delete whose proof failed, changed or expired (proof_failed, proof_changed, proof_expired), one the API server throttled, not resent on its old proof (throttled), whose pods were gone (nothing_left), or whose request had stopped (unwanted)",
            at_zero(
                Family::default(),
                &Unsent::ALL.map(|why| ReasonLabels {
                    reason: why.as_str(),
                }),
            ),
        );
        let retry_duration: Family<ResultLabels, Histogram> = register(
            registry,
            "retry_duration_seconds",
            "Seconds from picking up a retry request to its end, by result",
            at_zero(
                Family::new_with_constructor(|| Histogram::new(RETRY_SECONDS)),
                &RESULTS.map(|result| ResultLabels { result }),
            ),
        );
        let steps: Vec<StepLabels> = [RetryKind::Live, RetryKind::Archived]
            .into_iter()
            .flat_map(|kind| {
                kind.steps().map(|step| StepLabels {
                    kind: kind.as_str(),
                    step: step.as_str(),
                })
            })
            .collect();
        let step_seconds: Family<StepLabels, Histogram> = register(
            registry,
            "retry_step_seconds",
            "Seconds each step of a retry took, by kind (live, archived) and step (read, plan, delete, confirm, commit, create)",
            at_zero(
                Family::new_with_constructor(|| Histogram::new(STEP_SECONDS)),
                &steps,
            ),
        );
        // The confirming list is in progress as part of the delete step.
        let in_progress = register(
            registry,
            "retries_in_progress",
            "Retries in progress, by kind (live, archived) and the step each is in (read, plan, delete, commit, create; delete includes its confirming list)",
            at_zero(
                Family::default(),
                steps.iter().filter(|l| l.step != Step::Confirm.as_str()),
            ),
        );

        // This replica: whether it leads, who it is, what it may use.
        let leader = register(
            registry,
            "leader",
            "1 while this replica works (holds the lease, or runs without leader election), 0 while it stands by",
            Gauge::default(),
        );
        let leader_changes = register(
            registry,
            "leader_changes",
            "Times this replica started or stopped working as the leader",
            Counter::default(),
        );
        register_replica(registry, identity, limits);

        // Bugs: requests that panicked.
        let panics = register(
            registry,
            "request_panics",
            "Requests that panicked and were ended Failed, by kind (workflow, workflowretry); each is a bug to report",
            at_zero(
                Family::default(),
                &["workflow", "workflowretry"].map(|kind| KindLabels { kind }),
            ),
        );
        // Argo's: reset nodes it will not pick up (rule 8).
        let stranded_nodes = register(
            registry,
            "stranded_nodes",
            "Reset nodes whose new pod was labelled workflows.argoproj.io/completed=true while the node was not finished: Argo no longer follows the pod and the node stays as it is until the label is removed (docs/runbook.md)",
            Counter::default(),
        );
        Metrics {
            registry: root,
            panics,
            stranded_nodes,
            leader,
            leader_changes,
            queue_depth,
            api_requests,
            token_wait,
            tokens,
            priority_tokens,
            events_dropped,
            busiest_second,
            busiest: Mutex::new([BusiestSecond::new(), BusiestSecond::new()]),
            origin: Instant::now(),
            pauses,
            pause_seconds,
            in_flight,
            pods_deleted,
            deletes_unsent,
            retry_duration,
            step_seconds,
            in_progress,
            requests_total: AtomicU64::new(0),
            mutating_total: AtomicU64::new(0),
        }
    }

    /// The text exposition, with queue depths as of `queue`.
    pub fn encode(&self, queue: QueueDepths) -> String {
        for (class, depths) in [
            ("interactive", queue.interactive),
            ("background", queue.background),
        ] {
            for (state, depth) in [
                ("ready", depths.ready),
                ("waiting", depths.waiting),
                ("leased", depths.leased),
            ] {
                self.queue_depth
                    .get_or_create(&QueueLabels { class, state })
                    .set(depth as i64);
            }
        }
        let busiest = self.busiest.lock().unwrap_or_else(PoisonError::into_inner);
        for bucket in BUCKETS {
            let peak = busiest[slot(bucket)].busiest(Instant::now(), self.origin);
            self.busiest_second
                .get_or_create(&BucketLabels {
                    bucket: bucket.as_str(),
                })
                .set(i64::try_from(peak).unwrap_or(i64::MAX));
        }
        drop(busiest);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }

    pub fn observe_retry(&self, result: &'static str, elapsed: Duration) {
        self.retry_duration
            .get_or_create(&ResultLabels { result })
            .observe(elapsed.as_secs_f64());
    }

    /// A retry of `kind` starts `step`: it counts as in progress until the
    /// returned timer is dropped, and its time is observed when the timer
    /// says the step is done (a step that fails is not timed).
    pub fn step(&self, kind: RetryKind, step: Step) -> StepTimer<'_> {
        let labels = StepLabels {
            kind: kind.as_str(),
            step: step.as_str(),
        };
        self.in_progress.get_or_create(&labels).inc();
        StepTimer {
            metrics: self,
            labels,
            started: Instant::now(),
        }
    }

    /// A step's time, in `rewind_retry_step_seconds` and, for whoever asks
    /// why one request took long, in the request's log at debug level.
    fn observe_step(&self, kind: &'static str, step: &'static str, elapsed: Duration) {
        self.step_seconds
            .get_or_create(&StepLabels { kind, step })
            .observe(elapsed.as_secs_f64());
        tracing::debug!(
            kind,
            step,
            ms = elapsed.as_millis() as u64,
            "retry step done"
        );
    }

    pub fn api_requests(&self) -> RequestCounts {
        RequestCounts {
            total: self.requests_total.load(Ordering::Relaxed),
            mutating: self.mutating_total.load(Ordering::Relaxed),
        }
    }

    /// An Event was dropped: the write budget had no room for it in time.
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// A request of `kind` (workflow or workflowretry) panicked.
    pub fn request_panicked(&self, kind: &'static str) {
        self.panics.get_or_create(&KindLabels { kind }).inc();
    }

    /// A reset node's new pod carries Argo's completed label while the node
    /// is not finished (see `retry::pickup`).
    pub fn node_stranded(&self) {
        self.stranded_nodes.inc();
    }

    pub fn set_leader(&self, leading: bool) {
        let was = self.leader.set(leading.into());
        if was != i64::from(leading) {
            self.leader_changes.inc();
        }
    }
}

/// A step of one retry in progress; see [`Metrics::step`].
pub struct StepTimer<'m> {
    metrics: &'m Metrics,
    labels: StepLabels,
    started: Instant,
}

impl StepTimer<'_> {
    /// The step ended: its time goes into `rewind_retry_step_seconds`.
    /// Returns that time.
    pub fn done(self) -> Duration {
        let elapsed = self.started.elapsed();
        self.metrics
            .observe_step(self.labels.kind, self.labels.step, elapsed);
        elapsed
    }

    /// A delete step ended, its last `confirm` spent on the list that found
    /// every pod gone: that part is the confirm step, the rest the delete.
    /// Returns the whole time.
    pub fn done_confirmed(self, confirm: Duration) -> Duration {
        let elapsed = self.started.elapsed();
        let confirm = confirm.min(elapsed);
        let kind = self.labels.kind;
        self.metrics
            .observe_step(kind, Step::Delete.as_str(), elapsed - confirm);
        self.metrics
            .observe_step(kind, Step::Confirm.as_str(), confirm);
        elapsed
    }
}

impl Drop for StepTimer<'_> {
    fn drop(&mut self) {
        self.metrics.in_progress.get_or_create(&self.labels).dec();
    }
}

impl crate::engine::Observer for Metrics {
    fn pods_deleted(&self, n: usize) {
        self.pods_deleted.inc_by(n as u64);
    }

    fn unsent(&self, why: Unsent) {
        self.deletes_unsent
            .get_or_create(&ReasonLabels {
                reason: why.as_str(),
            })
            .inc();
    }
}

impl BudgetObserver for Metrics {
    fn token_wait(&self, bucket: Bucket, waited: Duration) {
        self.token_wait
            .get_or_create(&BucketLabels {
                bucket: bucket.as_str(),
            })
            .inc_by(waited.as_secs_f64());
    }

    fn token_taken(&self, bucket: Bucket, priority: Priority) {
        self.tokens
            .get_or_create(&BucketLabels {
                bucket: bucket.as_str(),
            })
            .inc();
        self.priority_tokens
            .get_or_create(&PriorityLabels {
                bucket: bucket.as_str(),
                priority: priority.as_str(),
            })
            .inc();
        self.busiest.lock().unwrap_or_else(PoisonError::into_inner)[slot(bucket)]
            .took(Instant::now(), self.origin);
    }

    fn in_flight(&self, requests: usize) {
        self.in_flight.set(requests as i64);
    }

    fn response(&self, verb: Verb, status: Option<StatusCode>) {
        let code = status.map_or_else(|| "error".to_owned(), |s| s.as_u16().to_string());
        self.api_requests
            .get_or_create(&RequestLabels {
                verb: verb.as_str(),
                code,
            })
            .inc();
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        if verb.bucket() == Bucket::Write {
            self.mutating_total.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn paused(&self, bucket: Bucket, pause: Duration) {
        let labels = BucketLabels {
            bucket: bucket.as_str(),
        };
        self.pauses.get_or_create(&labels).inc();
        self.pause_seconds
            .get_or_create(&labels)
            .inc_by(pause.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::queue::ClassDepths;

    fn metrics(limits: ContainerLimits) -> Metrics {
        Metrics::new("rewind-a", &BudgetConfig::default(), limits)
    }

    #[test]
    fn exposition_has_every_family() {
        let m = metrics(ContainerLimits {
            memory_bytes: Some(512 << 20),
            cpu_cores: Some(0.5),
        });
        m.response(Verb::Delete, Some(StatusCode::OK));
        m.response(Verb::Delete, None);
        m.token_wait(Bucket::Write, Duration::from_millis(250));
        m.token_taken(Bucket::Write, Priority::Retry);
        m.token_taken(Bucket::Write, Priority::Report);
        m.event_dropped();
        m.paused(Bucket::Write, Duration::from_secs(1));
        m.observe_retry("succeeded", Duration::from_secs(3));
        drop(m.step(RetryKind::Live, Step::Read));
        m.step(RetryKind::Archived, Step::Create).done();
        let deleting = m.step(RetryKind::Live, Step::Delete);
        crate::engine::Observer::pods_deleted(&m, 5);
        m.set_leader(true);
        m.request_panicked("workflow");
        assert_eq!(
            m.api_requests(),
            RequestCounts {
                total: 2,
                mutating: 2
            }
        );
        let text = m.encode(QueueDepths {
            interactive: ClassDepths {
                ready: 2,
                leased: 3,
                ..Default::default()
            },
            ..Default::default()
        });
        for needle in [
            r#"rewind_api_requests_total{verb="DELETE",code="200"} 1"#,
            r#"rewind_api_requests_total{verb="DELETE",code="error"} 1"#,
            r#"rewind_api_token_wait_seconds_total{bucket="write"} 0.25"#,
            r#"rewind_api_tokens_total{bucket="write"} 2"#,
            r#"rewind_api_tokens_total{bucket="read"} 0"#,
            r#"rewind_api_priority_tokens_total{bucket="write",priority="retry"} 1"#,
            r#"rewind_api_priority_tokens_total{bucket="write",priority="report"} 1"#,
            r#"rewind_events_dropped_total 1"#,
            r#"rewind_api_tokens_busiest_second{bucket="write"} 2"#,
            r#"rewind_api_budget_qps{bucket="write"} 20"#,
            r#"rewind_api_budget_burst{bucket="write"} 30"#,
            r#"rewind_api_budget_qps{bucket="read"} 50"#,
            r#"rewind_api_budget_burst{bucket="read"} 100"#,
            r#"rewind_api_pauses_total{bucket="write"} 1"#,
            r#"rewind_api_pauses_total{bucket="read"} 0"#,
            r#"rewind_api_pause_seconds_total{bucket="write"} 1.0"#,
            r#"rewind_queue_depth{class="interactive",state="ready"} 2"#,
            r#"rewind_queue_depth{class="interactive",state="leased"} 3"#,
            r#"rewind_queue_depth{class="background",state="waiting"} 0"#,
            "rewind_pods_deleted_total 5",
            r#"rewind_retry_duration_seconds_count{result="succeeded"} 1"#,
            r#"rewind_retry_duration_seconds_count{result="transient_error"} 0"#,
            "# TYPE rewind_retry_step_seconds histogram",
            // A step dropped unfinished is not timed; its series is there from the start.
            r#"rewind_retry_step_seconds_count{kind="live",step="read"} 0"#,
            r#"rewind_retry_step_seconds_count{kind="live",step="confirm"} 0"#,
            r#"rewind_retry_step_seconds_count{kind="archived",step="create"} 1"#,
            r#"rewind_retry_step_seconds_bucket{le="0.01",kind="archived",step="create"} 1"#,
            r#"rewind_retries_in_progress{kind="live",step="delete"} 1"#,
            r#"rewind_retries_in_progress{kind="live",step="read"} 0"#,
            r#"rewind_retries_in_progress{kind="archived",step="create"} 0"#,
            "rewind_api_requests_in_flight 0",
            "rewind_leader 1",
            "rewind_leader_changes_total 1",
            r#"rewind_replica_info{identity="rewind-a"} 1"#,
            "rewind_memory_limit_bytes 536870912",
            "rewind_cpu_limit_cores 0.5",
            r#"rewind_request_panics_total{kind="workflow"} 1"#,
            r#"rewind_request_panics_total{kind="workflowretry"} 0"#,
            "# TYPE process_cpu_seconds counter",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_start_time_seconds gauge",
            "# EOF",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // Only the steps each kind has, and no in-progress series for the
        // confirming list, which is part of the delete step.
        for absent in [
            r#"kind="live",step="create""#,
            r#"kind="archived",step="commit""#,
            r#"rewind_retries_in_progress{kind="live",step="confirm"}"#,
        ] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
        // One label per idea: no state hides in the class label any more.
        for mixed in [r#"class="waiting""#, r#"class="leased""#] {
            assert!(!text.contains(mixed), "{mixed} in\n{text}");
        }
        // Prometheus conventions: counters end in _total, every family has help and a type.
        for family in [
            "api_requests",
            "api_token_wait_seconds",
            "api_tokens",
            "api_priority_tokens",
            "events_dropped",
            "api_pauses",
            "api_pause_seconds",
            "pods_deleted",
            "deletes_unsent",
            "leader_changes",
            "request_panics",
            "stranded_nodes",
        ] {
            assert!(
                text.contains(&format!("# TYPE rewind_{family} counter")),
                "{family}\n{text}"
            );
            assert!(
                text.contains(&format!("# HELP rewind_{family} ")),
                "{family}\n{text}"
            );
        }
        drop(deleting);
        let text = m.encode(QueueDepths::default());
        assert!(text.contains(r#"rewind_retries_in_progress{kind="live",step="delete"} 0"#));
    }

    /// Dashboards, alerts and docs name these families: each keeps its
    /// name, help and type, /metrics lists them in this order, and each
    /// histogram keeps its bucket bounds.
    #[test]
    fn every_family_keeps_its_name_help_type_and_buckets() {
        let m = metrics(ContainerLimits {
            memory_bytes: Some(1),
            cpu_cores: Some(1.0),
        });
        // A family is listed once it has a series; this one starts with none.
        m.response(Verb::Get, Some(StatusCode::OK));
        let text = m.encode(QueueDepths::default());
        let described: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# HELP rewind_") || l.starts_with("# TYPE rewind_"))
            .collect();
        assert_eq!(
            described,
            [
                "# HELP rewind_queue_depth Delete work items in the queue, by priority class and state.",
                "# TYPE rewind_queue_depth gauge",
                "# HELP rewind_api_requests Kubernetes API requests sent, by verb and HTTP response code (error: no response).",
                "# TYPE rewind_api_requests counter",
                "# HELP rewind_api_token_wait_seconds Seconds API requests spent waiting for a budget token, by bucket (read or write).",
                "# TYPE rewind_api_token_wait_seconds counter",
                "# HELP rewind_api_tokens Tokens taken from each budget bucket (one per API request sent), by bucket.",
                "# TYPE rewind_api_tokens counter",
                "# HELP rewind_api_priority_tokens Tokens taken from each budget bucket by the priority of the work they served (retry, answer, background, report).",
                "# TYPE rewind_api_priority_tokens counter",
                "# HELP rewind_events_dropped Events not published because the write budget was short (Events are best effort).",
                "# TYPE rewind_events_dropped counter",
                "# HELP rewind_api_tokens_busiest_second The most tokens taken from a budget bucket within one second, over the last minute (at most qps + burst).",
                "# TYPE rewind_api_tokens_busiest_second gauge",
                "# HELP rewind_api_budget_qps Tokens each budget bucket refills per second (--qps, --read-qps).",
                "# TYPE rewind_api_budget_qps gauge",
                "# HELP rewind_api_budget_burst Tokens each budget bucket holds at most (--burst, --read-burst).",
                "# TYPE rewind_api_budget_burst gauge",
                "# HELP rewind_api_pauses Pauses of a budget bucket ordered by the API server (429 or 503 with Retry-After).",
                "# TYPE rewind_api_pauses counter",
                "# HELP rewind_api_pause_seconds Seconds of the pauses the API server ordered with Retry-After, by bucket.",
                "# TYPE rewind_api_pause_seconds counter",
                "# HELP rewind_api_requests_in_flight Kubernetes API requests in flight (watches excluded).",
                "# TYPE rewind_api_requests_in_flight gauge",
                "# HELP rewind_pods_deleted Pods deleted (or released from Argo's finalizer) for retries and pod GC.",
                "# TYPE rewind_pods_deleted counter",
                "# HELP rewind_deletes_unsent Delete work not sent at its turn, by reason: a bulk delete whose proof failed, changed or expired (proof_failed, proof_changed, proof_expired), one the API server throttled, not resent on its old proof (throttled), whose pods were gone (nothing_left), or whose request had stopped (unwanted).",
                "# TYPE rewind_deletes_unsent counter",
                "# HELP rewind_retry_duration_seconds Seconds from picking up a retry request to its end, by result.",
                "# TYPE rewind_retry_duration_seconds histogram",
                "# HELP rewind_retry_step_seconds Seconds each step of a retry took, by kind (live, archived) and step (read, plan, delete, confirm, commit, create).",
                "# TYPE rewind_retry_step_seconds histogram",
                "# HELP rewind_retries_in_progress Retries in progress, by kind (live, archived) and the step each is in (read, plan, delete, commit, create; delete includes its confirming list).",
                "# TYPE rewind_retries_in_progress gauge",
                "# HELP rewind_leader 1 while this replica works (holds the lease, or runs without leader election), 0 while it stands by.",
                "# TYPE rewind_leader gauge",
                "# HELP rewind_leader_changes Times this replica started or stopped working as the leader.",
                "# TYPE rewind_leader_changes counter",
                "# HELP rewind_replica This replica's identity (its name in the Lease); rewind_leader says whether it leads.",
                "# TYPE rewind_replica info",
                "# HELP rewind_memory_limit_bytes The container's memory limit (--memory-limit; the chart sets it from the downward API).",
                "# TYPE rewind_memory_limit_bytes gauge",
                "# HELP rewind_cpu_limit_cores The container's CPU limit in cores (--cpu-limit; the chart sets it from the downward API).",
                "# TYPE rewind_cpu_limit_cores gauge",
                "# HELP rewind_request_panics Requests that panicked and were ended Failed, by kind (workflow, workflowretry); each is a bug to report.",
                "# TYPE rewind_request_panics counter",
                "# HELP rewind_stranded_nodes Reset nodes whose new pod was labelled workflows.argoproj.io/completed=true while the node was not finished: Argo no longer follows the pod and the node stays as it is until the label is removed (docs/runbook.md).",
                "# TYPE rewind_stranded_nodes counter",
            ]
        );
        // One series of each histogram: its bucket bounds, in order.
        let bounds = |series: &str, labels: &str| -> Vec<&str> {
            let prefix = format!("{series}_bucket{{le=\"");
            text.lines()
                .filter_map(|l| l.strip_prefix(&prefix)?.split_once("\","))
                .filter(|(_, rest)| rest.starts_with(labels))
                .map(|(le, _)| le)
                .collect()
        };
        assert_eq!(
            bounds("rewind_retry_duration_seconds", r#"result="failed"}"#),
            [
                "0.5", "1.0", "2.0", "5.0", "10.0", "20.0", "30.0", "60.0", "120.0", "300.0",
                "600.0", "+Inf"
            ]
        );
        assert_eq!(
            bounds("rewind_retry_step_seconds", r#"kind="live",step="read"}"#),
            [
                "0.01", "0.05", "0.1", "0.5", "1.0", "2.0", "5.0", "10.0", "20.0", "30.0", "60.0",
                "120.0", "300.0", "+Inf"
            ]
        );
    }

    #[test]
    fn unknown_limits_are_not_exported_as_zero() {
        let text = metrics(ContainerLimits::default()).encode(QueueDepths::default());
        for name in ["rewind_memory_limit_bytes", "rewind_cpu_limit_cores"] {
            assert!(!text.contains(name), "{name} in\n{text}");
        }
    }

    #[test]
    fn a_delete_step_gives_its_last_list_to_the_confirm_step() {
        let m = metrics(ContainerLimits::default());
        let delete = m.step(RetryKind::Live, Step::Delete);
        std::thread::sleep(Duration::from_millis(30));
        let whole = delete.done_confirmed(Duration::from_millis(10));
        assert!(whole >= Duration::from_millis(30));
        let sum = |step: &str| {
            let text = m.encode(QueueDepths::default());
            let prefix = format!(r#"rewind_retry_step_seconds_sum{{kind="live",step="{step}"}} "#);
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        };
        assert_eq!(sum("confirm"), 0.01);
        assert!((sum("delete") + 0.01 - whole.as_secs_f64()).abs() < 1e-9);
    }

    #[test]
    fn leader_changes_count_transitions_only() {
        let m = metrics(ContainerLimits::default());
        // A standby starts as one: no change.
        m.set_leader(false);
        m.set_leader(true);
        m.set_leader(true);
        m.set_leader(false);
        assert!(
            m.encode(QueueDepths::default())
                .contains("rewind_leader_changes_total 2")
        );
    }

    #[test]
    fn the_busiest_second_is_the_fullest_sliding_second_of_the_last_minute() {
        let origin = Instant::now();
        let at = |ms: u64| origin + Duration::from_millis(ms);
        let mut busiest = BusiestSecond::new();
        assert_eq!(busiest.busiest(at(0), origin), 0);
        // 30 at once, then one each 50 ms: the second from 0 holds 30 + 19.
        for _ in 0..30 {
            busiest.took(at(0), origin);
        }
        for i in 1..=40 {
            busiest.took(at(i * 50), origin);
        }
        assert_eq!(busiest.busiest(at(2000), origin), 49);
        // Slower later: the peak stays for a minute, then is forgotten.
        for i in 0..10 {
            busiest.took(at(30_000 + i * 500), origin);
        }
        assert_eq!(busiest.busiest(at(59_000), origin), 49);
        assert_eq!(busiest.busiest(at(63_000), origin), 2);
        assert_eq!(busiest.busiest(at(120_000), origin), 0);
    }
}
