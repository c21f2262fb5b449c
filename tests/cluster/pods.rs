//! What a bulk DeleteCollection does to pods labelled like Argo's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use rewind::argo::workflow::labels;
use rewind::testenv::localcluster::LocalCluster;
use serde_json::json;

/// Enough requests in flight to be quick, few enough to be polite to a shared API server.
const CONCURRENCY: usize = 16;
/// No scheduler serves this name, so pods not bound at creation stay unscheduled.
const NO_SCHEDULER: &str = "rewind-test-unscheduled";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending,
    Failed,
    Succeeded,
}

impl Phase {
    fn of(index: usize) -> Self {
        match index % 3 {
            0 => Phase::Failed,
            1 => Phase::Succeeded,
            _ => Phase::Pending,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Failed => "Failed",
            Phase::Succeeded => "Succeeded",
        }
    }
}

struct PlannedPod {
    workflow: &'static str,
    index: usize,
    name: String,
    phase: Phase,
    /// Half the pods that finish ran on a (fake) node, as Argo's pods do; the others never
    /// got one. Pending pods stay unscheduled.
    node: Option<String>,
}

fn plan(workflow: &'static str, count: usize) -> Vec<PlannedPod> {
    (0..count)
        .map(|index| {
            let phase = Phase::of(index);
            let node = (phase != Phase::Pending && index % 2 == 0)
                .then(|| format!("kwok-node-{}", index % 4 / 2));
            PlannedPod {
                workflow,
                index,
                name: format!("{workflow}-{index}"),
                phase,
                node,
            }
        })
        .collect()
}

fn argo_pod(planned: &PlannedPod) -> Pod {
    // Shaped like Argo's node IDs: the workflow name and a number derived from the node.
    let node_id = format!(
        "{}-{}",
        planned.workflow,
        1_000_000_000 + planned.index * 7919
    );
    let completed = planned.phase != Phase::Pending;
    Pod {
        metadata: ObjectMeta {
            name: Some(planned.name.clone()),
            labels: Some(BTreeMap::from([
                (labels::WORKFLOW.to_owned(), planned.workflow.to_owned()),
                (labels::COMPLETED.to_owned(), completed.to_string()),
            ])),
            annotations: Some(BTreeMap::from([
                (labels::NODE_ID.to_owned(), node_id),
                (
                    labels::NODE_NAME.to_owned(),
                    format!("{}[0].step({})", planned.workflow, planned.index),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            scheduler_name: Some(NO_SCHEDULER.to_owned()),
            node_name: planned.node.clone(),
            restart_policy: Some("Never".to_owned()),
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some("quay.io/argoproj/argosay:v2".to_owned()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

// The streams own their items (names, pods, cloned clients): borrowed ones trip the
// compiler's Send check for futures handed to the test runner.
async fn create_all(pods: &Api<Pod>, planned: &[PlannedPod]) -> anyhow::Result<()> {
    let creates: Vec<Pod> = planned.iter().map(argo_pod).collect();
    stream::iter(creates)
        .map(|pod| {
            let pods = pods.clone();
            async move {
                let name = pod.metadata.name.clone().unwrap_or_default();
                pods.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating pod {name}"))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    wait_until_bound_pods_run(pods, planned).await?;
    // Through the status subresource, as a kubelet (or kwok) would.
    let finished: Vec<(String, Phase)> = planned
        .iter()
        .filter(|p| p.phase != Phase::Pending)
        .map(|p| (p.name.clone(), p.phase))
        .collect();
    stream::iter(finished)
        .map(|(name, phase)| {
            let pods = pods.clone();
            async move {
                let patch = Patch::Merge(json!({"status": {"phase": phase.as_str()}}));
                pods.patch_status(&name, &PatchParams::default(), &patch)
                    .await
                    .with_context(|| format!("setting pod {name} to {}", phase.as_str()))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// kwok marks pods on its nodes Running; that write must land before ours marks them
/// finished, or it would overwrite the finished phase (the API server does not forbid
/// leaving a terminal phase; kubelets simply never do).
async fn wait_until_bound_pods_run(pods: &Api<Pod>, planned: &[PlannedPod]) -> anyhow::Result<()> {
    let workflow = planned.first().map_or("", |p| p.workflow);
    let bound = planned.iter().filter(|p| p.node.is_some()).count();
    let selector = ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let running = pods
            .list(&selector)
            .await?
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running == bound {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{running} of {bound} pods bound to fake nodes are Running after 60s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn delete_collection_removes_exactly_the_unsucceeded_pods_at_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), &namespace);
    let retried = plan("wf-retried", 1000);
    let other = plan("wf-other", 60);
    let started = Instant::now();
    create_all(&pods, &retried).await?;
    create_all(&pods, &other).await?;
    tracing::info!(pods = retried.len() + other.len(), elapsed = ?started.elapsed(), "created pods and set their phases");

    let before = pods.list(&ListParams::default()).await?;
    let phases: BTreeMap<String, String> = before
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default(),
            )
        })
        .collect();
    for p in retried.iter().chain(&other) {
        ensure!(
            phases.get(&p.name).map(String::as_str) == Some(p.phase.as_str()),
            "pod {} is not {}: {:?}",
            p.name,
            p.phase.as_str(),
            phases.get(&p.name)
        );
    }
    let nodes: BTreeMap<String, Option<String>> = before
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
            )
        })
        .collect();
    for p in retried.iter().chain(&other) {
        ensure!(
            nodes.get(&p.name) == Some(&p.node),
            "pod {} is on node {:?}, expected {:?}",
            p.name,
            nodes.get(&p.name),
            p.node
        );
    }

    let selector = ListParams::default()
        .labels(&format!("{}=wf-retried", labels::WORKFLOW))
        .fields("status.phase!=Succeeded");
    let started = Instant::now();
    let response = pods
        .delete_collection(&DeleteParams::default(), &selector)
        .await?;
    tracing::info!(elapsed = ?started.elapsed(), "deletecollection");

    let expected_deleted: BTreeSet<&str> = retried
        .iter()
        .filter(|p| p.phase != Phase::Succeeded)
        .map(|p| p.name.as_str())
        .collect();
    let Some(deleted) = response.left() else {
        bail!("deletecollection answered with a Status, not the deleted pods")
    };
    let deleted: BTreeSet<String> = deleted
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    ensure!(
        deleted.iter().map(String::as_str).collect::<BTreeSet<_>>() == expected_deleted,
        "deletecollection reports {} pods deleted, expected the {} non-succeeded ones",
        deleted.len(),
        expected_deleted.len()
    );

    // Listed right after the call: a pod waiting out a grace period would still be here, terminating.
    let after = pods.list(&ListParams::default()).await?;
    let remaining: BTreeSet<&str> = after
        .items
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    let expected_remaining: BTreeSet<&str> = retried
        .iter()
        .filter(|p| p.phase == Phase::Succeeded)
        .chain(&other)
        .map(|p| p.name.as_str())
        .collect();
    let lingering: Vec<_> = remaining.intersection(&expected_deleted).collect();
    ensure!(
        lingering.is_empty(),
        "{} deleted pods are still present, e.g. {:?}",
        lingering.len(),
        lingering.first()
    );
    ensure!(
        remaining == expected_remaining,
        "remaining pods differ: {} present, {} expected",
        remaining.len(),
        expected_remaining.len()
    );
    if let Some(terminating) = after
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_some())
    {
        bail!(
            "pod {:?} is terminating but should be untouched",
            terminating.metadata.name
        );
    }
    Ok(())
}
