//! Retries asked the moment a workflow turns Failed (rule 8), under Argo's real
//! workflow-controller: each workflow's phase is polled and the retry annotated as soon as it
//! reads Failed, with no wait for Argo to label its pods. Argo v4.1.4 labels finished pods
//! completed=true from a clean-up queue keyed by pod name and rate limited to 10 a second;
//! a pod deleted before its label lands is re-created under the same name, gets the label,
//! drops out of Argo's pod informer and its node stays Pending for good. rewind waits for
//! the label before deleting, so every workflow must end Succeeded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use rewind::argo::plan::ArgoVersion;
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::{self, RetryPhase};
use rewind::testenv::argo::Outcomes;
use rewind::testenv::localcluster::LocalCluster;

use crate::run::{self, Budgets, Mode, Retry, Scenario};

/// How many workflows, of how many pods each.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub workflows: usize,
    pub pods: usize,
}

/// Every this many of a workflow's pods, one fails on its first run.
const FAIL_EVERY: usize = 5;

/// A workflow of `pods` parallel steps `flaky(i:i)`.
fn workflow(name: &str, pods: usize) -> Workflow {
    let yaml = format!(
        r#"apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: {name}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - name: flaky
        template: work
        withSequence: {{count: "{pods}"}}
  - name: work
    container:
      image: busybox
      command: [echo]
      args: [hello]
"#
    );
    serde_yaml_ng::from_str(&yaml).expect("a valid workflow")
}

/// Whether node `node` (`WF[0].flaky(i:i)`) fails its first pod.
fn fails_first(node: &str) -> bool {
    node.rsplit_once("flaky(")
        .and_then(|(_, rest)| rest.split_once(':'))
        .and_then(|(i, _)| i.parse::<usize>().ok())
        .is_some_and(|i| i % FAIL_EVERY == 2)
}

/// Runs `size` workflows in `namespace`, retries each through rewind the moment it reads
/// Failed, and fails unless every one ends Succeeded within `bound` of its request.
pub async fn retried_the_moment_they_fail(
    cluster: &LocalCluster,
    namespace: &str,
    size: Size,
    bound: Duration,
) -> anyhow::Result<()> {
    cluster.create_namespace(namespace).await?;
    let _outcomes = Outcomes::start(
        Api::namespaced(cluster.admin_client(), namespace),
        Arc::new(|_, node| fails_first(node)),
    );
    let scenario = Scenario {
        name: namespace.to_owned(),
        workflow: workflow("unused", 1),
        fails: Vec::new(),
        retry: Retry::default(),
        timeout: bound,
        argo_version: ArgoVersion::V4,
        instance_id: None,
        mode: Mode::Live,
        argo_configmap: None,
    };
    let budgets = Budgets::default();
    let rewind = run::start_rewind(cluster, namespace, &scenario, budgets, None, None).await?;
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), namespace);
    let names: Vec<String> = (0..size.workflows).map(|i| format!("wf-{i}")).collect();
    for name in &names {
        workflows
            .create(&PostParams::default(), &workflow(name, size.pods))
            .await
            .with_context(|| format!("creating workflow {namespace}/{name}"))?;
    }
    let each = names.iter().map(|name| {
        let workflows = workflows.clone();
        async move { retry_when_failed(&workflows, name, bound).await }
    });
    let ends = futures::future::join_all(each).await;
    rewind.stop().await?;
    let mut failures = Vec::new();
    for (name, end) in names.iter().zip(ends) {
        match end {
            Ok(took) => tracing::info!(
                workflow = name,
                ms = took.as_millis() as u64,
                "retried the moment it failed, then Succeeded"
            ),
            Err(error) => {
                let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
                let stuck = stuck_nodes(&workflows, &pods, name).await?;
                failures.push(format!("{name}: {error:#}; nodes not done: {stuck}"));
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} workflows did not end Succeeded:\n{}",
            failures.len(),
            names.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// Polls `name` (every 50 ms) until it reads Failed, asks rewind for a retry at once, and
/// waits for Succeeded; returns the time from the request to Succeeded.
async fn retry_when_failed(
    workflows: &Api<Workflow>,
    name: &str,
    bound: Duration,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + bound * 2;
    loop {
        let wf = workflows.get(name).await?;
        match wf.status.phase.as_deref() {
            Some("Failed") => break,
            Some("Succeeded") => bail!("it succeeded on its first run: no pod failed"),
            _ if Instant::now() > deadline => bail!("not Failed within {:?}", bound * 2),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let asked = Instant::now();
    run::request_rewind(workflows, name, &Retry::default()).await?;
    loop {
        let wf = workflows.get(name).await?;
        let annotations = wf.metadata.annotations.clone().unwrap_or_default();
        let status = request::status_of(&annotations, run::TOKEN)?;
        if let Some(s) = &status
            && s.phase == RetryPhase::Failed
        {
            bail!("rewind's request failed: {}", s.message);
        }
        if wf.status.phase.as_deref() == Some("Succeeded") {
            if let Some(s) = status.filter(|s| s.phase != RetryPhase::Succeeded) {
                bail!(
                    "Succeeded, but rewind's status says {:?}: {}",
                    s.phase,
                    s.message
                );
            }
            return Ok(asked.elapsed());
        }
        if asked.elapsed() > bound {
            bail!(
                "still {:?} {:?} after the retry was asked {bound:?} ago (rewind: {:?})",
                wf.status.phase,
                wf.status.message,
                status.map(|s| (s.phase, s.message))
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The nodes of `name` that are not finished, each with its pod's phase and completed label:
/// a node Pending whose pod finished and carries completed=true is the strand.
async fn stuck_nodes(
    workflows: &Api<Workflow>,
    pods: &Api<Pod>,
    name: &str,
) -> anyhow::Result<String> {
    let wf = workflows.get(name).await?;
    let listed = pods
        .list(&ListParams::default().labels(&format!("{}={name}", labels::WORKFLOW)))
        .await?;
    let by_node: BTreeMap<String, &Pod> = listed
        .items
        .iter()
        .filter_map(|p| {
            let node = p.metadata.annotations.as_ref()?.get(labels::NODE_ID)?;
            Some((node.clone(), p))
        })
        .collect();
    let mut out = Vec::new();
    for (id, node) in wf.status.nodes.iter().flatten() {
        if node.type_ != "Pod" || matches!(node.phase.as_deref(), Some("Succeeded")) {
            continue;
        }
        let pod = by_node.get(id).map(|p| {
            let completed = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::COMPLETED))
                .cloned();
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            format!(
                "pod {} {phase:?} completed={completed:?}",
                p.metadata.name.as_deref().unwrap_or_default()
            )
        });
        out.push(format!(
            "{} {:?} ({})",
            node.name,
            node.phase,
            pod.unwrap_or_else(|| "no pod".into())
        ));
    }
    Ok(out.join("; "))
}
