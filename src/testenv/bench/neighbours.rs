//! A neighbour: another tenant of the API server, as its own user in its own
//! namespace, sending a steady stream of small requests (GET a pod, LIST
//! workflows, PATCH a ConfigMap) while a retry runs. Its latency is what the
//! retry costs everyone else.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Error;
use super::stats::percentile;
use crate::testenv::localcluster::{LocalCluster, USER_NAME};
use crate::testenv::workload::FailedDag;
use crate::workflow::Workflow;

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

/// The neighbour's latency over a stretch of time, in milliseconds (`None`: nothing answered).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub requests: usize,
    pub errors: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Latency {
    /// Of some answered requests' durations and a count of failed ones.
    pub fn of(samples: &[Duration], errors: usize) -> Latency {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let at = |p| (!ms.is_empty()).then(|| percentile(&ms, p));
        Latency {
            requests: ms.len() + errors,
            errors,
            p50_ms: at(50.0),
            p99_ms: at(99.0),
            max_ms: at(100.0),
        }
    }
}

/// A running neighbour; [`Neighbour::finish`] stops it and returns its latency.
pub struct Neighbour {
    stop: CancellationToken,
    task: JoinHandle<(Vec<Duration>, usize)>,
}

impl Neighbour {
    /// Starts sending, as the client `user` (the cluster's [`USER_NAME`]), one request
    /// every [`INTERVAL`]; a request slower than that delays the next, as a real client's would.
    pub fn start(user: kube::Client) -> Neighbour {
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
                let ok = match i % 3 {
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
                    true => samples.push(started.elapsed()),
                    false => errors += 1,
                }
            }
            (samples, errors)
        });
        Neighbour { stop, task }
    }

    pub async fn finish(self) -> Latency {
        self.stop.cancel();
        let (samples, errors) = self.task.await.unwrap_or_default();
        Latency::of(&samples, errors)
    }
}

/// The neighbour's latency over `period` with nothing else going on, after a second of
/// warming up: its first requests open connections (TLS handshakes), which is not what
/// the API server's load costs.
pub async fn idle(user: kube::Client, period: Duration) -> Latency {
    let warming = Neighbour::start(user.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    warming.finish().await;
    let neighbour = Neighbour::start(user);
    tokio::time::sleep(period).await;
    neighbour.finish().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_counts_errors_apart() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let l = Latency::of(&samples, 2);
        assert_eq!(l.requests, 102);
        assert_eq!(l.errors, 2);
        assert_eq!(
            (l.p50_ms, l.p99_ms, l.max_ms),
            (Some(50.0), Some(99.0), Some(100.0))
        );
        assert_eq!(Latency::of(&[], 3).p99_ms, None);
    }
}
