//! Retries asked the moment a workflow turns Failed (rule 8), under Argo's real
//! workflow-controller: each workflow's phase is polled and the retry annotated as soon as it
//! reads Failed, with no wait for Argo to label its pods. Argo v4.1.4 labels finished pods
//! completed=true from a clean-up queue keyed by pod name and rate limited to 10 a second;
//! a pod deleted before its label lands is re-created under the same name, gets the label,
//! drops out of Argo's pod informer and its node stays Pending for good. rewind waits for
//! the label before deleting, so every workflow must end Succeeded.
//!
//! The workflows take turns among every way of asking ([`Trigger`]): the annotation, a
//! WorkflowRetry, `rewind retry`, and `argo retry` (Argo's own CLI) against rewind's Argo
//! API. Argo v3.7.6 labels pods with the same queue, key and limiter
//! (`workflow/controller/pod/queue.go`, `cleanup.go` and `pod_cleanup.go` differ from
//! v4.1.4's only in logging and the context argument), so v4.1.4 stands for both.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use rewind::argo::plan::ArgoVersion;
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::{self, RetryPhase};
use rewind::testenv::argo::Outcomes;
use rewind::testenv::clients::client_mode_api;
use rewind::testenv::free_port;
use rewind::testenv::localcluster::{LocalCluster, Role};
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};

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
pub fn workflow(name: &str, pods: usize) -> Workflow {
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

/// One way of asking rewind for a retry; workflow `i` is asked the `i % 4`th way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// `rewind.dev/retry` on the workflow.
    Annotation,
    /// A WorkflowRetry naming it.
    WorkflowRetry,
    /// `rewind retry NAME`, which creates a WorkflowRetry and follows it to its end.
    RewindCli,
    /// `argo retry NAME` (Argo's CLI) against rewind's Argo API, as a ServiceAccount.
    ArgoCli,
}

const TRIGGERS: [Trigger; 4] = [
    Trigger::Annotation,
    Trigger::WorkflowRetry,
    Trigger::RewindCli,
    Trigger::ArgoCli,
];

/// What the CLI triggers run: the binaries, the admin kubeconfig, rewind's Argo API and a
/// caller's token for it.
struct Askers {
    namespace: String,
    kubeconfig: PathBuf,
    argo: PathBuf,
    argo_api: SocketAddr,
    token: String,
    retries: Api<WorkflowRetry>,
}

/// A request asked, and how to tell how it ended.
enum Asked {
    Annotation,
    Object(String),
    /// The CLI still running (`rewind retry` until the request ends), or its output.
    Cli(&'static str, Child),
}

impl Askers {
    async fn ask(
        &self,
        trigger: Trigger,
        workflows: &Api<Workflow>,
        name: &str,
    ) -> anyhow::Result<Asked> {
        Ok(match trigger {
            Trigger::Annotation => {
                run::request_rewind(workflows, name, &run::Retry::default()).await?;
                Asked::Annotation
            }
            Trigger::WorkflowRetry => {
                let spec = WorkflowRetrySpec {
                    workflow_name: Some(name.to_owned()),
                    ..Default::default()
                };
                let object = WorkflowRetry::new(&format!("retry-{name}"), spec);
                self.retries
                    .create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("creating WorkflowRetry retry-{name}"))?;
                Asked::Object(format!("retry-{name}"))
            }
            Trigger::RewindCli => {
                let child = Command::new(env!("CARGO_BIN_EXE_rewind"))
                    .args(["retry", name, "-n", &self.namespace])
                    .env("KUBECONFIG", &self.kubeconfig)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .context("running rewind retry")?;
                Asked::Cli("rewind retry", child)
            }
            Trigger::ArgoCli => {
                let child = Command::new(&self.argo)
                    .args(["retry", name, "-n", &self.namespace])
                    .env_clear()
                    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                    .env("HOME", std::env::temp_dir())
                    .env("ARGO_SERVER", self.argo_api.to_string())
                    .env("ARGO_HTTP1", "true")
                    .env("ARGO_SECURE", "false")
                    .env("ARGO_TOKEN", format!("Bearer {}", self.token))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .context("running argo retry")?;
                Asked::Cli("argo retry", child)
            }
        })
    }

    /// The request's failure message, once it has failed.
    async fn failed(
        &self,
        asked: &mut Asked,
        workflow: &Workflow,
    ) -> anyhow::Result<Option<String>> {
        Ok(match asked {
            Asked::Annotation => {
                let annotations = workflow.metadata.annotations.clone().unwrap_or_default();
                request::status_of(&annotations, run::TOKEN)?
                    .filter(|s| s.phase == RetryPhase::Failed)
                    .map(|s| s.message)
            }
            Asked::Object(name) => self
                .retries
                .get(name)
                .await?
                .status
                .filter(|s| s.phase == Some(RetryPhase::Failed))
                .map(|s| s.message),
            Asked::Cli(what, child) => match child.try_wait()? {
                Some(status) if !status.success() => {
                    let mut out = String::new();
                    if let Some(mut stdout) = child.stdout.take() {
                        stdout.read_to_string(&mut out).await?;
                    }
                    if let Some(mut stderr) = child.stderr.take() {
                        stderr.read_to_string(&mut out).await?;
                    }
                    Some(format!("{what} exited {status}:\n{out}"))
                }
                _ => None,
            },
        })
    }

    /// Fails unless the request ended Succeeded, once its workflow has.
    async fn succeeded(&self, asked: Asked, workflow: &Workflow) -> anyhow::Result<()> {
        match asked {
            Asked::Annotation => {
                let annotations = workflow.metadata.annotations.clone().unwrap_or_default();
                if let Some(s) = request::status_of(&annotations, run::TOKEN)?
                    .filter(|s| s.phase != RetryPhase::Succeeded)
                {
                    bail!(
                        "Succeeded, but rewind's status says {:?}: {}",
                        s.phase,
                        s.message
                    );
                }
            }
            Asked::Object(name) => {
                let status = self.retries.get(&name).await?.status;
                ensure!(
                    status.as_ref().and_then(|s| s.phase) == Some(RetryPhase::Succeeded),
                    "Succeeded, but WorkflowRetry {name} says {status:?}"
                );
            }
            Asked::Cli(what, child) => {
                let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
                    .await
                    .with_context(|| format!("{what} still running 30 s after Succeeded"))??;
                ensure!(
                    out.status.success(),
                    "Succeeded, but {what} exited {}:\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        Ok(())
    }
}

/// Runs `size` workflows in `namespace`, retries each through rewind the moment it reads
/// Failed, taking turns among the [`TRIGGERS`], and fails unless every one ends Succeeded
/// within `bound` of its request.
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
    let admin = cluster.admin_client();
    // rewind's Argo API in plain HTTP on loopback.
    let api = client_mode_api(SocketAddr::from(([127, 0, 0, 1], free_port()?)), None);
    let askers = Askers {
        namespace: namespace.to_owned(),
        kubeconfig: cluster.kubeconfig_path(Role::Admin),
        argo: tokio::task::spawn_blocking(|| rewind::testenv::argo::binary("cli")).await??,
        argo_api: api.addr,
        token: crate::clients::token(
            &admin,
            namespace,
            "retrier",
            &["get", "list", "watch", "update", "create"],
            true,
        )
        .await?,
        retries: Api::namespaced(admin.clone(), namespace),
    };
    let budgets = Budgets::default();
    let rewind = run::start_rewind(cluster, namespace, &scenario, budgets, None, Some(api)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin, namespace);
    let names: Vec<String> = (0..size.workflows).map(|i| format!("wf-{i}")).collect();
    for name in &names {
        workflows
            .create(&PostParams::default(), &workflow(name, size.pods))
            .await
            .with_context(|| format!("creating workflow {namespace}/{name}"))?;
    }
    let each = names.iter().enumerate().map(|(i, name)| {
        let (workflows, askers) = (workflows.clone(), &askers);
        let trigger = TRIGGERS[i % TRIGGERS.len()];
        async move {
            let end = retry_when_failed(askers, trigger, &workflows, name, bound).await;
            (trigger, end)
        }
    });
    let ends = futures::future::join_all(each).await;
    rewind.stop().await?;
    let mut failures = Vec::new();
    for (name, (trigger, end)) in names.iter().zip(ends) {
        match end {
            Ok(took) => tracing::info!(
                workflow = name,
                ?trigger,
                ms = took.as_millis() as u64,
                "retried the moment it failed, then Succeeded"
            ),
            Err(error) => {
                let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
                let stuck = stuck_nodes(&workflows, &pods, name).await?;
                failures.push(format!(
                    "{name} ({trigger:?}): {error:#}; nodes not done: {stuck}"
                ));
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

/// Polls `name` (every 50 ms) until it reads Failed, asks rewind for a retry at once by
/// `trigger`, and waits for Succeeded; returns the time from the request to Succeeded.
async fn retry_when_failed(
    askers: &Askers,
    trigger: Trigger,
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
    let mut request = askers.ask(trigger, workflows, name).await?;
    loop {
        let wf = workflows.get(name).await?;
        if let Some(message) = askers.failed(&mut request, &wf).await? {
            bail!("rewind's request failed: {message}");
        }
        if wf.status.phase.as_deref() == Some("Succeeded") {
            askers.succeeded(request, &wf).await?;
            return Ok(asked.elapsed());
        }
        if asked.elapsed() > bound {
            bail!(
                "still {:?} {:?} after the retry was asked {bound:?} ago",
                wf.status.phase,
                wf.status.message,
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
