//! A neighbour: another tenant of the API server, as its own user in its own
//! namespace, sending a steady stream of small requests (GET a pod, LIST
//! workflows, PATCH a ConfigMap) while a retry runs. Its latency is what the
//! retry costs everyone else.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Error;
use super::audit::{Audited, seconds};
use super::cache_wait::{self, CacheWait};
use super::stats::percentile;
use super::usage::{CpuShare, Cpus};
use crate::argo::workflow::Workflow;
use crate::testenv::localcluster::{LocalCluster, USER_NAME};
use crate::testenv::workload::FailedDag;

/// The neighbour's namespace, apart from the retried workflow's.
pub const NAMESPACE: &str = "neighbours";
const POD: &str = "neighbour";
const CONFIGMAP: &str = "neighbour";
const WORKFLOW: &str = "neighbour";
/// One request every 50 ms: 20 a second, a third of each kind.
pub const INTERVAL: Duration = Duration::from_millis(50);

/// Creates the neighbour's namespace, its small pod, workflow and ConfigMap, and a Role
/// letting [`USER_NAME`] do exactly what the neighbour does.
pub async fn prepare(cluster: &LocalCluster) -> Result<(), Error> {
    cluster.create_namespace(NAMESPACE).await?;
    let admin = cluster.admin_client();
    let kube_err = |action: &str| {
        let action = action.to_owned();
        move |source| Error::Kube { action, source }
    };
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    let pp = PostParams::default();
    let pod = Pod {
        metadata: meta(POD),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            // Never scheduled: it only has to exist.
            scheduler_name: Some("rewind-neighbour-unscheduled".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&pp, &pod)
        .await
        .map_err(kube_err("creating the neighbour's pod"))?;
    let small = FailedDag {
        name: WORKFLOW.into(),
        failed: 1,
        succeeded: 2,
    };
    Api::<Workflow>::namespaced(admin.clone(), NAMESPACE)
        .create(&pp, &small.workflow(NAMESPACE))
        .await
        .map_err(kube_err("creating the neighbour's workflow"))?;
    let configmap = ConfigMap {
        metadata: meta(CONFIGMAP),
        data: Some([("n".to_owned(), "0".to_owned())].into()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .create(&pp, &configmap)
        .await
        .map_err(kube_err("creating the neighbour's ConfigMap"))?;
    let rule = |group: &str, resource: &str, verb: &str| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: vec![verb.to_owned()],
        ..Default::default()
    };
    let role = Role {
        metadata: meta("neighbour"),
        rules: Some(vec![
            rule("", "pods", "get"),
            rule("argoproj.io", "workflows", "list"),
            rule("", "configmaps", "patch"),
        ]),
    };
    Api::<Role>::namespaced(admin.clone(), NAMESPACE)
        .create(&pp, &role)
        .await
        .map_err(kube_err("creating the neighbour's Role"))?;
    let binding = RoleBinding {
        metadata: meta("neighbour"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "neighbour".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: USER_NAME.into(),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, NAMESPACE)
        .create(&pp, &binding)
        .await
        .map_err(kube_err("binding the neighbour's Role"))?;
    Ok(())
}

/// The neighbour's latency over a stretch of time, in milliseconds (`None`: nothing answered),
/// and what explains it: the same requests as the API server served them, how long its watch
/// cache kept LISTs waiting, and who kept the CPUs busy meanwhile (absent in runs saved before
/// they were measured).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub requests: usize,
    pub errors: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// p99 of each kind of request ([`KINDS`]) as the neighbour saw it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub p99_ms_by_kind: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<Served>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<CpuShare>,
    /// How long consistent LISTs of workflows (the neighbour's among them) waited for the API
    /// server's watch cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflows_cache_wait: Option<CacheWait>,
    /// When the neighbour started and stopped sending; only while the benchmark runs.
    #[serde(skip)]
    pub window: Option<(Timestamp, Timestamp)>,
}

/// The neighbour's requests as the API server served them: from the audit log's received to
/// answered, so without the neighbour's own side (its process waiting for a CPU, the network).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Served {
    pub requests: usize,
    pub p99_ms: Option<f64>,
    pub p99_ms_by_kind: BTreeMap<String, f64>,
}

/// What the neighbour sends, in turn: (name, audit verb, audit resource).
pub const KINDS: [(&str, &str, &str); 3] = [
    ("get pod", "get", "pods"),
    ("list workflows", "list", "workflows"),
    ("patch configmap", "patch", "configmaps"),
];

fn p99s_by_kind(samples: &[(usize, f64)]) -> BTreeMap<String, f64> {
    KINDS
        .iter()
        .enumerate()
        .filter_map(|(k, (name, ..))| {
            let ms: Vec<f64> = samples.iter().filter(|s| s.0 == k).map(|s| s.1).collect();
            (!ms.is_empty()).then(|| ((*name).to_owned(), percentile(&ms, 99.0)))
        })
        .collect()
}

impl Latency {
    /// Of some answered requests' kinds (indices into [`KINDS`]) and durations, and a count
    /// of failed ones.
    pub fn of(samples: &[(usize, Duration)], errors: usize) -> Latency {
        let kinded: Vec<(usize, f64)> = samples
            .iter()
            .map(|(k, d)| (*k, d.as_secs_f64() * 1e3))
            .collect();
        let ms: Vec<f64> = kinded.iter().map(|s| s.1).collect();
        let at = |p| (!ms.is_empty()).then(|| percentile(&ms, p));
        Latency {
            requests: ms.len() + errors,
            errors,
            p50_ms: at(50.0),
            p99_ms: at(99.0),
            max_ms: at(100.0),
            p99_ms_by_kind: p99s_by_kind(&kinded),
            ..Latency::default()
        }
    }

    /// Fills in [`Latency::served`] from the audit log `log`: the neighbour's requests
    /// received within its window.
    pub fn serve_from(&mut self, log: &[Audited]) {
        let Some((from, to)) = self.window else {
            return;
        };
        let served: Vec<(usize, f64)> = log
            .iter()
            .filter(|a| {
                a.user == USER_NAME
                    && a.namespace == NAMESPACE
                    && a.received >= from
                    && a.received <= to
            })
            .filter_map(|a| {
                let kind = KINDS
                    .iter()
                    .position(|(_, verb, resource)| a.verb == *verb && a.resource == *resource)?;
                Some((kind, seconds(a.received, a.completed) * 1e3))
            })
            .collect();
        let ms: Vec<f64> = served.iter().map(|s| s.1).collect();
        self.served = Some(Served {
            requests: ms.len(),
            p99_ms: (!ms.is_empty()).then(|| percentile(&ms, 99.0)),
            p99_ms_by_kind: p99s_by_kind(&served),
        });
    }
}

/// What is measured beside the neighbour's own latency.
#[derive(Clone, Default)]
pub struct Observe {
    /// Processes (name, pid) whose CPU time is measured, with the machine's.
    pub processes: Vec<(String, u32)>,
    /// A client allowed to read the API server's metrics, for [`Latency::workflows_cache_wait`].
    pub metrics: Option<kube::Client>,
}

/// A running neighbour; [`Neighbour::finish`] stops it and returns its latency.
pub struct Neighbour {
    stop: CancellationToken,
    task: JoinHandle<(Vec<(usize, Duration)>, usize)>,
    observe: Observe,
    started: Timestamp,
    cpus: Option<Cpus>,
    metrics: Option<String>,
}

impl Neighbour {
    /// Starts sending, as the client `user` (the cluster's [`USER_NAME`]), one request
    /// every [`INTERVAL`]; a request slower than that delays the next, as a real client's
    /// would. What `observe` names is measured from before the first request.
    pub async fn start(user: kube::Client, observe: &Observe) -> Neighbour {
        let metrics = match &observe.metrics {
            Some(admin) => cache_wait::scrape(admin).await.ok(),
            None => None,
        };
        let cpus = Cpus::now(&observe.processes).ok();
        let started = Timestamp::now();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(user.clone(), NAMESPACE);
            let workflows: Api<Workflow> = Api::namespaced(user.clone(), NAMESPACE);
            let configmaps: Api<ConfigMap> = Api::namespaced(user, NAMESPACE);
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut samples, mut errors) = (Vec::new(), 0);
            for i in 0u64.. {
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let started = Instant::now();
                let kind = (i % KINDS.len() as u64) as usize;
                let ok = match kind {
                    0 => pods.get(POD).await.is_ok(),
                    1 => workflows.list(&ListParams::default()).await.is_ok(),
                    _ => {
                        let patch = serde_json::json!({"data": {"n": i.to_string()}});
                        configmaps
                            .patch(CONFIGMAP, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                            .is_ok()
                    }
                };
                match ok {
                    true => samples.push((kind, started.elapsed())),
                    false => errors += 1,
                }
            }
            (samples, errors)
        });
        Neighbour {
            stop,
            task,
            observe: observe.clone(),
            started,
            cpus,
            metrics,
        }
    }

    pub async fn finish(self) -> Latency {
        self.stop.cancel();
        let (samples, errors) = self.task.await.unwrap_or_default();
        let ended = Timestamp::now();
        let cpus = match (&self.cpus, Cpus::now(&self.observe.processes)) {
            (Some(before), Ok(after)) => Some(after.since(before)),
            _ => None,
        };
        let metrics = match &self.observe.metrics {
            Some(admin) => cache_wait::scrape(admin).await.ok(),
            None => None,
        };
        let workflows_cache_wait = match (&self.metrics, &metrics) {
            (Some(before), Some(after)) => cache_wait::between(before, after, "workflows"),
            _ => None,
        };
        Latency {
            cpus,
            workflows_cache_wait,
            window: Some((self.started, ended)),
            ..Latency::of(&samples, errors)
        }
    }
}

/// The neighbour's latency over `period` with nothing else going on, after a second of
/// warming up: its first requests open connections (TLS handshakes), which is not what
/// the API server's load costs.
pub async fn idle(user: kube::Client, period: Duration, observe: &Observe) -> Latency {
    let warming = Neighbour::start(user.clone(), &Observe::default()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    warming.finish().await;
    let neighbour = Neighbour::start(user, observe).await;
    tokio::time::sleep(period).await;
    neighbour.finish().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    #[test]
    fn latency_counts_errors_apart() {
        let samples: Vec<(usize, Duration)> = (1..=100)
            .map(|i| (i as usize % 3, Duration::from_millis(i)))
            .collect();
        let l = Latency::of(&samples, 2);
        assert_eq!(l.requests, 102);
        assert_eq!(l.errors, 2);
        assert_eq!(
            (l.p50_ms, l.p99_ms, l.max_ms),
            (Some(50.0), Some(99.0), Some(100.0))
        );
        assert_eq!(Latency::of(&[], 3).p99_ms, None);
        assert_eq!(
            l.p99_ms_by_kind,
            BTreeMap::from([
                ("get pod".to_owned(), 99.0),
                ("list workflows".to_owned(), 100.0),
                ("patch configmap".to_owned(), 98.0)
            ])
        );
    }

    #[test]
    fn served_counts_the_neighbours_requests_in_its_window_only() {
        let t = |ms: i64| Timestamp::UNIX_EPOCH + SignedDuration::from_millis(ms);
        let audited = |user: &str, namespace: &str, verb: &str, resource: &str, at, took| Audited {
            user: user.into(),
            verb: verb.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: String::new(),
            received: t(at),
            completed: t(at + took),
        };
        let log = [
            audited(USER_NAME, NAMESPACE, "get", "pods", 5, 900), // before the window
            audited(USER_NAME, NAMESPACE, "get", "pods", 10, 4),
            audited(USER_NAME, NAMESPACE, "list", "workflows", 20, 7),
            audited(USER_NAME, NAMESPACE, "patch", "configmaps", 30, 12),
            audited("someone", NAMESPACE, "get", "pods", 40, 800),
            audited(USER_NAME, "elsewhere", "get", "pods", 50, 700),
            audited(USER_NAME, NAMESPACE, "get", "pods", 200, 600), // after it
        ];
        let mut latency = Latency {
            window: Some((t(10), t(100))),
            ..Latency::default()
        };
        latency.serve_from(&log);
        let served = latency.served.unwrap();
        assert_eq!(served.requests, 3);
        assert_eq!(served.p99_ms, Some(12.0));
        assert_eq!(served.p99_ms_by_kind["get pod"], 4.0);
        assert_eq!(served.p99_ms_by_kind["list workflows"], 7.0);
        assert_eq!(served.p99_ms_by_kind["patch configmap"], 12.0);
    }
}
