//! A strand under Argo's real workflow-controller (v4.1.4), and the fix rewind names for it,
//! run as written (rule 8). The test decides each pod's end itself (kwok's outcome
//! annotation, no [`Outcomes`](rewind::testenv::argo::Outcomes)), so it can label a reset
//! node's new pod `completed=true` before the pod ends, as a label Argo queued for the old
//! pod does. Argo's pod informer then drops the pod and the node stays unfinished after the
//! pod has Succeeded; rewind reports it with a `kubectl label` command; running that
//! command must let Argo finish the node and the workflow.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rewind::argo::plan::ArgoVersion;
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::{self, RetryPhase};
use rewind::testenv::argo::OUTCOME_ANNOTATION;
use rewind::testenv::localcluster::{Binaries, LocalCluster, Role};

use crate::fast;
use crate::run::{self, Budgets, Mode, Retry, Scenario};

/// The node whose first pod fails, and whose new pod the test strands.
const STRANDED_NODE: &str = "flaky(2:2)";

/// How long an unfinished node is watched to show it stays so.
const STAYS: Duration = Duration::from_secs(10);

pub async fn the_fix_rewind_names_lets_argo_finish_the_node(
    cluster: &LocalCluster,
    namespace: &str,
) -> anyhow::Result<()> {
    cluster.create_namespace(namespace).await?;
    let admin = cluster.admin_client();
    let scenario = Scenario {
        name: namespace.to_owned(),
        workflow: fast::workflow("unused", 1),
        fails: Vec::new(),
        retry: Retry::default(),
        timeout: Duration::from_secs(120),
        argo_version: ArgoVersion::V4,
        instance_id: None,
        mode: Mode::Live,
        argo_configmap: None,
    };
    let rewind = run::start_rewind(
        cluster,
        namespace,
        &scenario,
        Budgets::default(),
        None,
        None,
    )
    .await?;
    let result = strand_and_fix(cluster, namespace, &admin).await;
    rewind.stop().await?;
    result
}

async fn strand_and_fix(
    cluster: &LocalCluster,
    namespace: &str,
    admin: &kube::Client,
) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    workflows
        .create(&PostParams::default(), &fast::workflow("wf", 3))
        .await?;
    // The first run: flaky(2:2) fails, the others succeed.
    let first = end_pods(&pods, 3, |node| {
        if node.ends_with(STRANDED_NODE) {
            "Failed"
        } else {
            "Succeeded"
        }
    })
    .await?;
    run::wait_phase(&workflows, "wf", |p| p == "Failed", Duration::from_secs(60)).await?;
    run::request_rewind(&workflows, "wf", &Retry::default()).await?;

    // The reset node's new pod, under the old name: labelled completed=true while Pending,
    // then run to Succeeded.
    let old = first
        .iter()
        .find(|(_, node)| node.ends_with(STRANDED_NODE))
        .map(|(uid, _)| uid.clone())
        .context("the failed pod's UID")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let new =
        loop {
            let listed = pods.list(&ListParams::default()).await?;
            if let Some(pod) = listed.items.into_iter().find(|p| {
                p.uid().is_some_and(|u| u != old) && node_name(p).ends_with(STRANDED_NODE)
            }) {
                break pod;
            }
            ensure!(
                Instant::now() < deadline,
                "Argo made no new pod for {STRANDED_NODE}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
    let name = new.name_any();
    let label = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: "true"}}});
    pods.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let outcome =
        serde_json::json!({"metadata": {"annotations": {OUTCOME_ANNOTATION: "Succeeded"}}});
    pods.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&outcome))
        .await?;

    // rewind reports the strand with its fix.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fix = loop {
        let wf = workflows.get("wf").await?;
        let status = request::status_of(&wf.annotations().clone(), run::TOKEN)?;
        if let Some(s) = &status
            && let Some(at) = s.message.find("kubectl label pod")
        {
            ensure!(
                s.phase == RetryPhase::Succeeded,
                "the reset was written, yet the request says {:?}: {}",
                s.phase,
                s.message
            );
            break s.message[at..].to_owned();
        }
        ensure!(
            Instant::now() < deadline,
            "no strand reported within a minute; the request's status: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        fix.contains(&name),
        "the fix does not name the stranded pod {name}: {fix}"
    );

    // Under Argo's own controller the node stays unfinished while its pod has Succeeded.
    let pod_done = Instant::now() + Duration::from_secs(30);
    loop {
        let phase = pods.get(&name).await?.status.and_then(|s| s.phase);
        if phase.as_deref() == Some("Succeeded") {
            break;
        }
        ensure!(
            Instant::now() < pod_done,
            "pod {name} did not succeed: {phase:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(STAYS).await;
    let wf = workflows.get("wf").await?;
    let node = wf
        .status
        .nodes
        .iter()
        .flatten()
        .find(|(_, n)| n.name.ends_with(STRANDED_NODE))
        .map(|(_, n)| n.phase.clone());
    ensure!(
        wf.status.phase.as_deref() == Some("Running") && node != Some(Some("Succeeded".into())),
        "expected the strand: workflow Running with {STRANDED_NODE} unfinished {STAYS:?} after \
         its pod Succeeded; workflow {:?}, node {node:?}",
        wf.status.phase
    );

    // The command as rewind wrote it.
    let words: Vec<&str> = fix.split_whitespace().collect();
    ensure!(
        words.first() == Some(&"kubectl"),
        "not a kubectl command: {fix}"
    );
    let kubectl = Binaries::locate(None)?.dir().join("kubectl");
    let out = tokio::process::Command::new(kubectl)
        .args(&words[1..])
        .env("KUBECONFIG", cluster.kubeconfig_path(Role::Admin))
        .output()
        .await
        .context("running kubectl")?;
    ensure!(
        out.status.success(),
        "{fix} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fixed_at = Instant::now();
    run::wait_phase(
        &workflows,
        "wf",
        |p| p == "Succeeded",
        Duration::from_secs(60),
    )
    .await
    .with_context(|| format!("after `{fix}`"))?;
    tracing::info!(
        ms = fixed_at.elapsed().as_millis() as u64,
        %fix,
        "the stranded workflow Succeeded after rewind's fix"
    );
    Ok(())
}

fn node_name(pod: &Pod) -> String {
    pod.annotations()
        .get(labels::NODE_NAME)
        .cloned()
        .unwrap_or_default()
}

/// Ends the first `count` pods of the namespace as `outcome` of their node says, each once;
/// returns each one's UID and node.
async fn end_pods(
    pods: &Api<Pod>,
    count: usize,
    outcome: impl Fn(&str) -> &'static str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut ended = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < count {
        if Instant::now() > deadline {
            bail!("only {} of {count} pods appeared", ended.len());
        }
        for pod in pods.list(&ListParams::default()).await?.items {
            let (Some(uid), node) = (pod.uid(), node_name(&pod)) else {
                continue;
            };
            if node.is_empty() || ended.contains_key(&uid) {
                continue;
            }
            let patch = serde_json::json!({"metadata": {"annotations": {OUTCOME_ANNOTATION: outcome(&node)}}});
            pods.patch_metadata(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
            ended.insert(uid, node);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(ended)
}
