//! Prometheus metrics, served on `/metrics` in the text exposition format.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::engine::budget::{Bucket, BudgetObserver, Verb};
use crate::engine::queue::QueueDepths;

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
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// workflow (an annotation request) or workflowretry.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    /// read, plan, delete or create.
    step: &'static str,
}

/// Every metric rewind exports.
pub struct Metrics {
    registry: Registry,
    queue_depth: Family<QueueLabels, Gauge>,
    api_requests: Family<RequestLabels, Counter>,
    token_wait: Family<BucketLabels, Counter<f64, AtomicU64>>,
    pauses: Family<BucketLabels, Counter>,
    pause_seconds: Family<BucketLabels, Counter<f64, AtomicU64>>,
    in_flight: Gauge,
    pods_deleted: Counter,
    retry_duration: Family<ResultLabels, Histogram>,
    archived_step: Family<StepLabels, Histogram>,
    leader: Gauge,
    panics: Family<KindLabels, Counter>,
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

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("rewind");
        let queue_depth = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "queue_depth",
            "Delete work items in the queue, by priority class and state",
            queue_depth.clone(),
        );
        let api_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Kubernetes API requests sent, by verb and HTTP response code (error: no response)",
            api_requests.clone(),
        );
        let token_wait = Family::<BucketLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "api_token_wait_seconds",
            "Seconds API requests spent waiting for a budget token, by bucket (read or write)",
            token_wait.clone(),
        );
        let pauses = Family::<BucketLabels, Counter>::default();
        registry.register(
            "api_pauses",
            "Pauses of a budget bucket ordered by the API server (429 or 503 with Retry-After)",
            pauses.clone(),
        );
        let pause_seconds = Family::<BucketLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "api_pause_seconds",
            "Seconds of the pauses the API server ordered with Retry-After, by bucket",
            pause_seconds.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "api_requests_in_flight",
            "Kubernetes API requests in flight (watches excluded)",
            in_flight.clone(),
        );
        let pods_deleted = Counter::default();
        registry.register(
            "pods_deleted",
            "Pods deleted (or released from Argo's finalizer) for retries and pod GC",
            pods_deleted.clone(),
        );
        let retry_duration = Family::<ResultLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
            ])
        });
        registry.register(
            "retry_duration_seconds",
            "Seconds from picking up a retry request to its end, by result",
            retry_duration.clone(),
        );
        let archived_step = Family::<StepLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            ])
        });
        registry.register(
            "archived_retry_step_seconds",
            "Seconds each step of an archived retry took, by step (read, plan, delete, create)",
            archived_step.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica works (holds the lease, or runs without leader election), 0 while it stands by",
            leader.clone(),
        );
        let panics = Family::<KindLabels, Counter>::default();
        registry.register(
            "request_panics",
            "Requests that panicked and were ended Failed, by kind (workflow, workflowretry); each is a bug to report",
            panics.clone(),
        );
        Metrics {
            registry,
            panics,
            leader,
            queue_depth,
            api_requests,
            token_wait,
            pauses,
            pause_seconds,
            in_flight,
            pods_deleted,
            retry_duration,
            archived_step,
            requests_total: AtomicU64::new(0),
            mutating_total: AtomicU64::new(0),
        }
    }
}

impl Metrics {
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

    /// One step of an archived retry ended: `step` is read, plan, delete or create.
    pub fn observe_archived_step(&self, step: &'static str, elapsed: Duration) {
        self.archived_step
            .get_or_create(&StepLabels { step })
            .observe(elapsed.as_secs_f64());
    }

    pub fn api_requests(&self) -> RequestCounts {
        RequestCounts {
            total: self.requests_total.load(Ordering::Relaxed),
            mutating: self.mutating_total.load(Ordering::Relaxed),
        }
    }

    /// A request of `kind` (workflow or workflowretry) panicked.
    pub fn request_panicked(&self, kind: &'static str) {
        self.panics.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(leading.into());
    }
}

impl crate::engine::Observer for Metrics {
    fn pods_deleted(&self, n: usize) {
        self.pods_deleted.inc_by(n as u64);
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

    #[test]
    fn exposition_has_every_family() {
        let m = Metrics::default();
        m.response(Verb::Delete, Some(StatusCode::OK));
        m.response(Verb::Delete, None);
        m.token_wait(Bucket::Write, Duration::from_millis(250));
        m.paused(Bucket::Write, Duration::from_secs(1));
        m.observe_retry("succeeded", Duration::from_secs(3));
        m.observe_archived_step("delete", Duration::from_millis(1500));
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
            r#"rewind_api_pauses_total{bucket="write"} 1"#,
            r#"rewind_api_pause_seconds_total{bucket="write"} 1.0"#,
            r#"rewind_queue_depth{class="interactive",state="ready"} 2"#,
            r#"rewind_queue_depth{class="interactive",state="leased"} 3"#,
            r#"rewind_queue_depth{class="background",state="waiting"} 0"#,
            "rewind_pods_deleted_total 5",
            r#"rewind_retry_duration_seconds_count{result="succeeded"} 1"#,
            "# TYPE rewind_archived_retry_step_seconds histogram",
            r#"rewind_archived_retry_step_seconds_sum{step="delete"} 1.5"#,
            r#"rewind_archived_retry_step_seconds_bucket{le="2.0",step="delete"} 1"#,
            r#"rewind_archived_retry_step_seconds_bucket{le="1.0",step="delete"} 0"#,
            "rewind_api_requests_in_flight 0",
            "rewind_leader 1",
            r#"rewind_request_panics_total{kind="workflow"} 1"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // One label per idea: no state hides in the class label any more.
        for mixed in [r#"class="waiting""#, r#"class="leased""#] {
            assert!(!text.contains(mixed), "{mixed} in\n{text}");
        }
        // Prometheus conventions: counters end in _total, every family has help and a type.
        for family in [
            "api_requests",
            "api_token_wait_seconds",
            "api_pauses",
            "api_pause_seconds",
            "pods_deleted",
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
    }
}
