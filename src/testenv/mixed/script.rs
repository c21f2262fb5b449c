//! A randomized trial's script: what is asked, which faults and kills come, and when, all
//! drawn from the trial's seed so a failure replays. Pure: no I/O.

use std::time::Duration;

use http::Method;
use tokio_util::sync::CancellationToken;

use crate::argo::workflow::labels;
use crate::testenv::faultproxy::{Fault, Matcher, Rule};
use crate::testenv::trials::Target;

use super::{ARCHIVED, LEASE, LIVE};

/// How a request is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// `kubectl annotate` on the live workflow.
    Annotation,
    /// A WorkflowRetry.
    WorkflowRetry,
    /// Argo's retry call, on a replica's Argo API listener.
    ArgoApi,
}

/// One request of a trial's script.
#[derive(Clone, Debug)]
pub struct Ask {
    pub target: Target,
    pub via: Via,
    pub at: Duration,
}

/// A fault the proxy applies while it lasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// 429 with Retry-After on the DeleteCollection and on one plan pod's delete.
    ThrottleDeletes { retry_after: u32, times: usize },
    /// The workflows' writes (status patch, reset, archived create) held.
    HoldWorkflowWrites { hold: Duration, times: usize },
    /// 429 on status writes (the WorkflowRetries').
    ThrottleStatus { retry_after: u32, times: usize },
    /// The pods' watch stalls after a few events.
    StallPodWatch { after: usize },
    /// The workflows' and WorkflowRetries' watches cut after a few events.
    CutWatches { after: usize, times: usize },
    /// The pod watch's events about one plan pod skipped but the latest (an unobserved
    /// state; a watch never loses the latest state, so neither does this fault).
    SkipPodEvents,
    /// The workflow watch's events about the live workflow skipped but the latest.
    SkipWorkflowEvents,
    /// Lists of pods answered as they were before the requests.
    StalePodLists { times: usize },
    /// Lists of workflows answered as they were before the requests.
    StaleWorkflowLists { times: usize },
    /// The Lease's requests held past its duration: the leader cannot renew.
    HoldLease { hold: Duration },
    /// The workflows' writes (status patch, reset, archived create, finalizer release) and
    /// the WorkflowRetries' status writes land, and their answers are lost.
    LoseWriteAnswers { times: usize },
    /// The lists that re-prove bulk deletes fail (500).
    FailProofLists { times: usize },
    /// The lists that re-prove bulk deletes answer late, past a proof's age.
    LateProofs { hold: Duration, times: usize },
    /// Lists of pods (any page) fail (500).
    FailPodLists { times: usize },
}

impl FaultKind {
    /// Every kind's name, for the coverage of a run.
    pub const NAMES: [&'static str; 14] = [
        "throttle-deletes",
        "hold-workflow-writes",
        "throttle-status",
        "stall-pod-watch",
        "cut-watches",
        "skip-pod-events",
        "skip-workflow-events",
        "stale-pod-lists",
        "stale-workflow-lists",
        "hold-lease",
        "lose-write-answers",
        "fail-proof-lists",
        "late-proofs",
        "fail-pod-lists",
    ];

    pub fn name(&self) -> &'static str {
        let i = match self {
            FaultKind::ThrottleDeletes { .. } => 0,
            FaultKind::HoldWorkflowWrites { .. } => 1,
            FaultKind::ThrottleStatus { .. } => 2,
            FaultKind::StallPodWatch { .. } => 3,
            FaultKind::CutWatches { .. } => 4,
            FaultKind::SkipPodEvents => 5,
            FaultKind::SkipWorkflowEvents => 6,
            FaultKind::StalePodLists { .. } => 7,
            FaultKind::StaleWorkflowLists { .. } => 8,
            FaultKind::HoldLease { .. } => 9,
            FaultKind::LoseWriteAnswers { .. } => 10,
            FaultKind::FailProofLists { .. } => 11,
            FaultKind::LateProofs { .. } => 12,
            FaultKind::FailPodLists { .. } => 13,
        };
        Self::NAMES[i]
    }

    fn draw(rng: &mut fastrand::Rng, lease: Duration) -> FaultKind {
        let seconds = |rng: &mut fastrand::Rng, from: u64, to: u64| {
            Duration::from_millis(rng.u64(from * 1000..to * 1000))
        };
        match rng.usize(..Self::NAMES.len()) {
            0 => FaultKind::ThrottleDeletes {
                retry_after: rng.u32(1..=3),
                times: rng.usize(1..=6),
            },
            1 => FaultKind::HoldWorkflowWrites {
                hold: seconds(rng, 1, 5),
                times: rng.usize(1..=3),
            },
            2 => FaultKind::ThrottleStatus {
                retry_after: rng.u32(1..=3),
                times: rng.usize(1..=4),
            },
            3 => FaultKind::StallPodWatch {
                after: rng.usize(0..50),
            },
            4 => FaultKind::CutWatches {
                after: rng.usize(0..10),
                times: rng.usize(1..=3),
            },
            5 => FaultKind::SkipPodEvents,
            6 => FaultKind::SkipWorkflowEvents,
            7 => FaultKind::StalePodLists {
                times: rng.usize(1..=2),
            },
            8 => FaultKind::StaleWorkflowLists {
                times: rng.usize(1..=2),
            },
            9 => FaultKind::HoldLease {
                hold: lease + seconds(rng, 1, 3),
            },
            10 => FaultKind::LoseWriteAnswers {
                times: rng.usize(1..=3),
            },
            // The proof faults stay under a deletion's limit of unproven bulk deletes in a
            // row: at three its 1,000 pods go one by one at the write budget, longer than
            // the trial's bound (tests/cluster/faults.rs tests that fallback).
            11 => FaultKind::FailProofLists {
                times: rng.usize(1..=2),
            },
            12 => FaultKind::LateProofs {
                hold: Duration::from_millis(rng.u64(600..1500)),
                times: rng.usize(1..=2),
            },
            _ => FaultKind::FailPodLists {
                times: rng.usize(1..=2),
            },
        }
    }

    /// The proxy's rules for this fault in `namespace`: `pod` is a plan pod, `before` the
    /// resourceVersion from before the requests; `healed` is cancelled when it ends.
    pub(super) fn rules(
        &self,
        namespace: &str,
        pod: &str,
        before: &str,
        healed: &CancellationToken,
    ) -> Vec<Rule> {
        let get = |path: &str, watch: bool| Matcher::new(Method::GET, path).watch(watch);
        match self {
            FaultKind::ThrottleDeletes { retry_after, times } => {
                let fault = Fault::TooManyRequests {
                    retry_after_seconds: *retry_after,
                };
                vec![
                    Rule::new(
                        Matcher::new(Method::DELETE, format!("/namespaces/{namespace}/pods")),
                        fault.clone(),
                    )
                    .times(*times),
                    Rule::new(Matcher::new(Method::DELETE, format!("/pods/{pod}")), fault)
                        .times(*times),
                ]
            }
            FaultKind::HoldWorkflowWrites { hold, times } => [
                Matcher::new(Method::PATCH, format!("/workflows/{LIVE}")),
                Matcher::new(Method::PUT, format!("/workflows/{LIVE}")),
                Matcher::new(Method::POST, "/workflows"),
            ]
            .into_iter()
            .map(|m| Rule::new(m, Fault::Hold(*hold)).times(*times))
            .collect(),
            FaultKind::ThrottleStatus { retry_after, times } => vec![
                Rule::new(
                    Matcher::new(Method::PATCH, "/status"),
                    Fault::TooManyRequests {
                        retry_after_seconds: *retry_after,
                    },
                )
                .times(*times),
            ],
            FaultKind::StallPodWatch { after } => vec![
                Rule::new(
                    get("/pods", true),
                    Fault::StallWatch {
                        after_events: *after,
                    },
                )
                .times(1),
            ],
            FaultKind::CutWatches { after, times } => ["/workflows", "/workflowretries"]
                .into_iter()
                .map(|path| {
                    Rule::new(
                        get(path, true),
                        Fault::CutWatch {
                            after_events: *after,
                        },
                    )
                    .times(*times)
                })
                .collect(),
            FaultKind::SkipPodEvents => vec![Rule::new(
                get("/pods", true),
                Fault::SkipEvents {
                    containing: pod.to_owned(),
                    until: healed.clone(),
                },
            )],
            FaultKind::SkipWorkflowEvents => vec![Rule::new(
                get("/workflows", true),
                Fault::SkipEvents {
                    containing: LIVE.to_owned(),
                    until: healed.clone(),
                },
            )],
            FaultKind::StalePodLists { times } => vec![
                Rule::new(
                    get("/pods", false),
                    Fault::StaleList {
                        resource_version: before.to_owned(),
                    },
                )
                .times(*times),
            ],
            FaultKind::StaleWorkflowLists { times } => vec![
                Rule::new(
                    get("/workflows", false),
                    Fault::StaleList {
                        resource_version: before.to_owned(),
                    },
                )
                .times(*times),
            ],
            FaultKind::HoldLease { hold } => vec![
                Rule::new(
                    Matcher::any_method(format!("/leases/{LEASE}")),
                    Fault::Hold(*hold),
                )
                .times(1),
            ],
            FaultKind::LoseWriteAnswers { times } => [
                Matcher::new(Method::PATCH, format!("/workflows/{LIVE}")),
                Matcher::new(Method::PUT, format!("/workflows/{LIVE}")),
                Matcher::new(Method::POST, "/workflows"),
                Matcher::new(Method::PATCH, format!("/workflows/{ARCHIVED}")),
                Matcher::new(Method::PATCH, "/status"),
            ]
            .into_iter()
            .map(|m| Rule::new(m, Fault::LoseAnswer).times(*times))
            .collect(),
            FaultKind::FailProofLists { times } => vec![
                Rule::new(
                    get("/pods", false).query_contains(labels::COMPLETED),
                    Fault::InternalError,
                )
                .times(*times),
            ],
            FaultKind::LateProofs { hold, times } => vec![
                Rule::new(
                    get("/pods", false).query_contains(labels::COMPLETED),
                    Fault::HoldAnswer(*hold),
                )
                .times(*times),
            ],
            FaultKind::FailPodLists { times } => {
                vec![Rule::new(get("/pods", false), Fault::InternalError).times(*times)]
            }
        }
    }
}

/// A fault or a SIGKILL of the leader.
#[derive(Clone, Debug)]
pub enum Disturbance {
    Fault {
        kind: FaultKind,
        at: Duration,
        lasts: Duration,
    },
    /// The leader (or, with none, a replica) killed at `at`, started again `down` later.
    Kill { at: Duration, down: Duration },
}

impl Disturbance {
    /// When it is over: the fault removed, the replica started again.
    pub fn over(&self) -> Duration {
        match self {
            Disturbance::Fault { at, lasts, .. } => *at + *lasts,
            Disturbance::Kill { at, down } => *at + *down,
        }
    }
}

/// A trial's script, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Script {
    pub asks: Vec<Ask>,
    pub disturbances: Vec<Disturbance>,
}

impl Script {
    /// Requests asked within the first half of `span`, two to four faults and up to two
    /// kills within `span`; `lease` is the replicas' Lease duration.
    pub fn draw(seed: u64, span: Duration, lease: Duration) -> Script {
        let mut rng = fastrand::Rng::with_seed(seed);
        let within = |rng: &mut fastrand::Rng, d: Duration| d.mul_f64(rng.f64());
        let mut asks = Vec::new();
        for (target, vias) in [
            (
                Target::Live,
                &[Via::Annotation, Via::WorkflowRetry, Via::ArgoApi][..],
            ),
            (Target::Archived, &[Via::WorkflowRetry, Via::ArgoApi][..]),
        ] {
            let mut chosen: Vec<Via> = vias.iter().copied().filter(|_| rng.bool()).collect();
            if chosen.is_empty() {
                chosen.push(vias[rng.usize(..vias.len())]);
            }
            // A second of the same kind: a double click, a client that retries its call,
            // two WorkflowRetries for one archived UID.
            if rng.f64() < 0.4 {
                let again = chosen[rng.usize(..chosen.len())];
                if again != Via::Annotation {
                    chosen.push(again);
                }
            }
            for via in chosen {
                asks.push(Ask {
                    target,
                    via,
                    at: within(&mut rng, span / 2),
                });
            }
        }
        asks.sort_by_key(|a| a.at);
        let mut disturbances = Vec::new();
        for _ in 0..rng.usize(2..=4) {
            disturbances.push(Disturbance::Fault {
                kind: FaultKind::draw(&mut rng, lease),
                at: within(&mut rng, span),
                lasts: Duration::from_millis(rng.u64(1_000..10_000)),
            });
        }
        for _ in 0..rng.usize(0..=2) {
            disturbances.push(Disturbance::Kill {
                at: within(&mut rng, span),
                down: Duration::from_millis(rng.u64(0..1_500)),
            });
        }
        disturbances.sort_by_key(|d| match d {
            Disturbance::Fault { at, .. } | Disturbance::Kill { at, .. } => *at,
        });
        Script { asks, disturbances }
    }

    /// When the last fault or restart is over.
    pub fn calm_from(&self) -> Duration {
        self.disturbances
            .iter()
            .map(Disturbance::over)
            .max()
            .unwrap_or_default()
    }

    pub fn kills(&self) -> usize {
        self.disturbances
            .iter()
            .filter(|d| matches!(d, Disturbance::Kill { .. }))
            .count()
    }

    /// The script in one line.
    pub fn describe(&self) -> String {
        let asks: Vec<String> = self
            .asks
            .iter()
            .map(|a| format!("{:?}/{:?}@{:.1}", a.target, a.via, a.at.as_secs_f64()))
            .collect();
        let disturbances: Vec<String> = self
            .disturbances
            .iter()
            .map(|d| match d {
                Disturbance::Fault { kind, at, lasts } => format!(
                    "{}@{:.1}+{:.1}",
                    kind.name(),
                    at.as_secs_f64(),
                    lasts.as_secs_f64()
                ),
                Disturbance::Kill { at, down } => {
                    format!("kill@{:.1}+{:.1}", at.as_secs_f64(), down.as_secs_f64())
                }
            })
            .collect();
        format!("asks [{}]; {}", asks.join(" "), disturbances.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_seed_gives_one_script_and_fifty_seeds_cover_every_kind() {
        let (span, lease) = (Duration::from_secs(8), Duration::from_secs(4));
        let describe = |seed| Script::draw(seed, span, lease).describe();
        assert_eq!(describe(7), describe(7));
        assert_ne!(describe(7), describe(8));
        let scripts: Vec<Script> = (1000..1050).map(|s| Script::draw(s, span, lease)).collect();
        let kinds: BTreeSet<&str> = scripts
            .iter()
            .flat_map(|s| &s.disturbances)
            .filter_map(|d| match d {
                Disturbance::Fault { kind, .. } => Some(kind.name()),
                Disturbance::Kill { .. } => None,
            })
            .collect();
        assert_eq!(kinds.len(), FaultKind::NAMES.len(), "{kinds:?}");
        assert!(scripts.iter().any(|s| s.kills() == 2));
        for s in &scripts {
            assert!(s.asks.iter().any(|a| a.target == Target::Live));
            assert!(s.asks.iter().any(|a| a.target == Target::Archived));
            assert!(s.asks.iter().all(|a| a.at < span / 2));
            assert!(s.disturbances.len() >= 2 && s.calm_from() < span + Duration::from_secs(10));
        }
        // Some trials ask twice the same way, on one workflow.
        assert!(scripts.iter().any(|s| {
            let mut seen = BTreeSet::new();
            s.asks.iter().any(|a| !seen.insert((a.target, a.via)))
        }));
    }
}
