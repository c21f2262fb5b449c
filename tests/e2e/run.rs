//! One scenario run twice on the same cluster, with Argo's workflow-controller running the
//! workflows: once retried by rewind (its controller in process), once by Argo's own retry
//! code (tools/peer: the Argo Server's `RetryWorkflow`, in process). Each copy lives in its
//! own namespace under the same name, so node IDs and pod names are the same on both sides
//! and the final workflows compare node by node.
//!
//! A scenario may keep the failed workflow in Argo's database ([`Mode`]): archived (Argo
//! archives it, the live workflow is then deleted, and the retry comes from the archive: a
//! WorkflowRetry for rewind, `RetryArchivedWorkflow` for Argo), or with its nodes offloaded.
//! Both sides then read Argo's database from the ConfigMap Argo's controller uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rewind::argo::db::{ArgoDatabase, Sql};
use rewind::argo::plan::ArgoVersion;
use rewind::argo::workflow::{Workflow, labels};
use rewind::controller::{Controller, Options};
use rewind::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::retry::Scope;
use rewind::testenv::argo::Outcomes;
use rewind::testenv::localcluster::{LocalCluster, Role};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// How the failed workflow is retried (the same on both sides).
#[derive(Clone, Debug, Default)]
pub struct Retry {
    pub restart_successful: bool,
    pub node_field_selector: Option<&'static str>,
    pub parameters: Vec<String>,
}

/// A workflow, which of its nodes fail on the first run, and how it is retried.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The workflow's name, and the prefix of its two namespaces.
    pub name: String,
    pub workflow: Workflow,
    /// Node names without the workflow's name (e.g. `.b` or `[0].b`) whose first pod fails.
    pub fails: Vec<String>,
    pub retry: Retry,
    /// How long each of: the first run, a retry to Succeeded.
    pub timeout: Duration,
    /// Which Argo line runs it (rewind's rules, the peer's version) ...
    pub argo_version: ArgoVersion,
    /// ... and which of the cluster's Argo controllers (Argo's `instanceID`).
    pub instance_id: Option<String>,
    pub mode: Mode,
    /// That controller's ConfigMap (`NAMESPACE/NAME`), for a [`Mode`] that needs its
    /// database: rewind's `--argo-configmap`, the peer's `--configmap`.
    pub argo_configmap: Option<String>,
}

/// Where the failed workflow is when it is retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Live, its nodes in its status.
    #[default]
    Live,
    /// Archived by Argo (`archive: true`), the live workflow deleted (its pods with it, as
    /// Argo's TTL deletes it).
    Archived,
    /// Archived, the live workflow deleted with its pods orphaned (`--cascade=orphan`): they
    /// stay, owned by nothing. Argo's retry deletes the plan's pods by name; rewind deletes
    /// only pods the archived workflow owns, so it refuses (nothing deleted, nothing created)
    /// and names the pod; once the user deletes the failed pods, as told, a new
    /// WorkflowRetry ends where Argo's retry does.
    ArchivedOrphaned,
    /// Live, its nodes offloaded by Argo (ALWAYS_OFFLOAD_NODE_STATUS=true); both retries run
    /// with the same setting, as Argo's Server would next to its controller.
    Offloaded,
}

/// The budgets each side retries with.
#[derive(Clone, Copy, Debug)]
pub struct Budgets {
    /// rewind's write budget.
    pub rewind_qps: u32,
    pub rewind_burst: u32,
    /// Argo's client (20/30 as the Argo Server, 5/10 as `argo retry` in kube mode).
    pub argo_qps: u32,
    pub argo_burst: u32,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            rewind_qps: 20,
            rewind_burst: 30,
            argo_qps: 20,
            argo_burst: 30,
        }
    }
}

/// One side's run: its final workflow, its pods before and after the retry, and how long the
/// retry took from the request to the workflow Succeeded.
pub struct Side {
    pub namespace: String,
    pub before: BTreeMap<String, PodSeen>,
    pub after: BTreeMap<String, PodSeen>,
    pub workflow: Workflow,
    /// From the request to the reset workflow written (its phase no longer Failed).
    pub reset_took: Duration,
    /// From the request to the workflow Succeeded.
    pub retry_took: Duration,
    /// Whether the failed and the final workflow had their nodes offloaded
    /// (`workflow` is hydrated from Argo's database).
    pub offloaded: (bool, bool),
    /// The message of a first WorkflowRetry rewind refused ([`Mode::ArchivedOrphaned`]).
    pub refused: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSeen {
    pub uid: String,
    pub phase: String,
    /// The Argo node it runs.
    pub node: String,
}

/// Both sides of a scenario.
pub struct Outcome {
    pub rewind: Side,
    pub argo: Side,
}

/// Runs both sides, together, or one after the other when `sequential` (so that one
/// side's load does not skew the other's timing).
pub async fn run(
    cluster: &LocalCluster,
    peer: &Path,
    scenario: &Scenario,
    budgets: Budgets,
    sequential: bool,
    client: Option<&dyn ApiClient>,
) -> anyhow::Result<Outcome> {
    let rewind = Via::Rewind(budgets, client);
    let (rewind, argo) = if sequential {
        // Argo's side first, so rewind's is not the one that runs on a fresh cluster.
        let argo = side(cluster, scenario, Via::Argo(peer, budgets)).await;
        (side(cluster, scenario, rewind).await, argo)
    } else {
        tokio::join!(
            side(cluster, scenario, rewind),
            side(cluster, scenario, Via::Argo(peer, budgets)),
        )
    };
    let rewind = rewind.context("retried by rewind")?;
    let argo = argo.context("retried by Argo's RetryWorkflow")?;
    Ok(Outcome { rewind, argo })
}

/// One of Argo's clients asking rewind for the retry through rewind's Argo API, as it would
/// ask Argo's server: the rewind side's controller serves the API as [`ApiClient::listener`]
/// says, and the client's call replaces the annotation or the WorkflowRetry.
pub trait ApiClient: Sync {
    /// Where and how rewind's controller serves Argo's retry API for one side.
    fn listener(&self, namespace: &str) -> anyhow::Result<rewind::controller::ArgoApiOptions>;
    /// Retries the side's workflow (`archived_uid`: from Argo's archive) through `api`.
    fn retry<'a>(&'a self, call: ApiCall<'a>) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// One retry through rewind's Argo API.
pub struct ApiCall<'a> {
    pub cluster: &'a LocalCluster,
    pub api: &'a rewind::controller::ArgoApiOptions,
    pub namespace: &'a str,
    pub scenario: &'a Scenario,
    pub archived_uid: Option<&'a str>,
}

enum Via<'a> {
    /// rewind, asked by annotation or WorkflowRetry, or by `ApiClient` through its Argo API.
    Rewind(Budgets, Option<&'a dyn ApiClient>),
    Argo(&'a Path, Budgets),
}

async fn side(cluster: &LocalCluster, scenario: &Scenario, via: Via<'_>) -> anyhow::Result<Side> {
    let suffix = match via {
        Via::Rewind(_, _) => "rewind",
        Via::Argo(..) => "argo",
    };
    let namespace = format!("{}-{suffix}", scenario.name);
    cluster.create_namespace(&namespace).await?;
    let name = scenario.name.clone();
    let fails: BTreeSet<String> = scenario.fails.iter().cloned().collect();
    let _outcomes = Outcomes::start(
        Api::namespaced(cluster.admin_client(), &namespace),
        Arc::new(move |workflow, node| {
            workflow == name
                && node
                    .strip_prefix(workflow)
                    .is_some_and(|rest| fails.contains(rest))
        }),
    );
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), &namespace);
    let mut workflow = scenario.workflow.clone();
    workflow.metadata.name = Some(scenario.name.clone());
    workflow.metadata.namespace = Some(namespace.clone());
    if let Some(id) = &scenario.instance_id {
        workflow
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(labels::CONTROLLER_INSTANCE_ID.into(), id.clone());
    }
    workflows
        .create(&PostParams::default(), &workflow)
        .await
        .with_context(|| format!("creating workflow {namespace}/{}", scenario.name))?;
    wait_phase(
        &workflows,
        &scenario.name,
        |p| p == "Failed",
        scenario.timeout,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), &namespace);
    wait_settled(&pods, &scenario.name, scenario.timeout).await?;
    let before = pods_of(&pods, &scenario.name).await?;
    let database = match &scenario.argo_configmap {
        Some(configmap) => Some(argo_database(cluster, configmap).await?),
        None => None,
    };
    let failed = workflows.get(&scenario.name).await?;
    let first_offloaded = failed.status.offload_node_status_version.is_some();
    let archived_uid = match scenario.mode {
        Mode::Archived | Mode::ArchivedOrphaned => Some(
            archive_and_delete(
                &workflows,
                &pods,
                &scenario.name,
                scenario.mode == Mode::ArchivedOrphaned,
                scenario.timeout,
            )
            .await?,
        ),
        Mode::Live | Mode::Offloaded => None,
    };
    let mut refused = None;

    let (reset_took, retry_took) = match via {
        Via::Rewind(budgets, Some(client)) => {
            let api = client.listener(&namespace)?;
            let controller = start_rewind(
                cluster,
                &namespace,
                scenario,
                budgets,
                database.clone(),
                Some(api.clone()),
            )
            .await?;
            let started = Instant::now();
            let call = ApiCall {
                cluster,
                api: &api,
                namespace: &namespace,
                scenario,
                archived_uid: archived_uid.as_deref(),
            };
            let name = &scenario.name;
            let (retried, took) = tokio::join!(
                client.retry(call),
                until_succeeded(&workflows, name, started, scenario.timeout)
            );
            controller.stop().await?;
            retried?;
            took?
        }
        Via::Rewind(budgets, None) => {
            let controller = start_rewind(
                cluster,
                &namespace,
                scenario,
                budgets,
                database.clone(),
                None,
            )
            .await?;
            let started = Instant::now();
            let took = async {
                match &archived_uid {
                    Some(uid) => {
                        if scenario.mode == Mode::ArchivedOrphaned {
                            refused = Some(
                                refused_then_cleared(cluster, &namespace, uid, scenario, &before)
                                    .await?,
                            );
                        }
                        request_archived(cluster, &namespace, "e2e-archived", uid, &scenario.retry)
                            .await?
                    }
                    None => request_rewind(&workflows, &scenario.name, &scenario.retry).await?,
                }
                until_succeeded(&workflows, &scenario.name, started, scenario.timeout).await
            }
            .await;
            controller.stop().await?;
            took?
        }
        Via::Argo(peer, budgets) => {
            let started = Instant::now();
            let name = &scenario.name;
            let (retried, took) = tokio::join!(
                retry_argo(
                    cluster,
                    peer,
                    &namespace,
                    scenario,
                    budgets,
                    archived_uid.as_deref()
                ),
                until_succeeded(&workflows, name, started, scenario.timeout)
            );
            retried?;
            took?
        }
    };
    if archived_uid.is_some() {
        // Argo archives the retried workflow too; its label says when, so both sides are
        // compared after it.
        wait_archived(&workflows, &scenario.name, scenario.timeout).await?;
    }
    let mut workflow = workflows.get(&scenario.name).await?;
    let final_offloaded = hydrate(&mut workflow, database.as_deref()).await?;
    let after = pods_of(&pods, &scenario.name).await?;
    Ok(Side {
        namespace,
        before,
        after,
        workflow,
        reset_took,
        retry_took,
        offloaded: (first_offloaded, final_offloaded),
        refused,
    })
}

/// Argo's database as the ConfigMap (`NAMESPACE/NAME`) configures it, as rewind's
/// `--argo-configmap` reads it (here with the admin's credentials).
async fn argo_database(
    cluster: &LocalCluster,
    configmap: &str,
) -> anyhow::Result<Arc<dyn ArgoDatabase>> {
    let persistence =
        rewind::controller::argo_config::load_persistence(&cluster.admin_client(), configmap)
            .await?
            .with_context(|| format!("Argo's ConfigMap {configmap} has no persistence block"))?;
    Ok(Arc::new(Sql::connect(&persistence).await?))
}

/// Replaces offloaded nodes with the ones Argo saved; whether they were offloaded.
async fn hydrate(
    workflow: &mut Workflow,
    database: Option<&dyn ArgoDatabase>,
) -> anyhow::Result<bool> {
    let Some(version) = workflow.status.offload_node_status_version.take() else {
        return Ok(false);
    };
    let database =
        database.context("the workflow's nodes are offloaded but no database is configured")?;
    let uid = workflow.metadata.uid.clone().unwrap_or_default();
    workflow.status.nodes = Some(database.offloaded_nodes(&uid, &version).await?);
    Ok(true)
}

/// Waits until Argo has archived the workflow, then deletes it: as Argo's TTL does
/// (background propagation), waiting until it and its pods are gone, or orphaning its pods,
/// waiting until it is gone and they are owned by nothing. Returns its UID.
async fn archive_and_delete(
    workflows: &Api<Workflow>,
    pods: &Api<Pod>,
    name: &str,
    orphan: bool,
    timeout: Duration,
) -> anyhow::Result<String> {
    let archived = wait_archived(workflows, name, timeout).await?;
    let uid = archived.metadata.uid.clone().unwrap_or_default();
    let params = if orphan {
        DeleteParams::orphan()
    } else {
        DeleteParams::background()
    };
    workflows.delete(name, &params).await?;
    let deadline = Instant::now() + timeout;
    let selector = format!("{}={name}", labels::WORKFLOW);
    loop {
        let left = pods.list(&ListParams::default().labels(&selector)).await?;
        let done = if orphan {
            !left.items.is_empty()
                && left.items.iter().all(|p| {
                    p.metadata
                        .owner_references
                        .as_ref()
                        .is_none_or(Vec::is_empty)
                })
        } else {
            left.items.is_empty()
        };
        if workflows.get_opt(name).await?.is_none() && done {
            return Ok(uid);
        }
        ensure!(
            Instant::now() < deadline,
            "workflow {name} is still there {timeout:?} after its deletion, or its {} pods \
             are not as the deletion leaves them (orphaned: {orphan})",
            left.items.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until Argo's controller labels the workflow archived.
async fn wait_archived(
    workflows: &Api<Workflow>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Workflow> {
    let deadline = Instant::now() + timeout;
    loop {
        let wf = workflows.get(name).await?;
        let status = wf
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::WORKFLOW_ARCHIVING_STATUS))
            .cloned();
        if status.as_deref() == Some("Archived") {
            return Ok(wf);
        }
        ensure!(
            Instant::now() < deadline,
            "Argo did not archive workflow {name} within {timeout:?} (archiving status {status:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asks rewind to retry an archived workflow: WorkflowRetry `name` naming its UID.
async fn request_archived(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    uid: &str,
    retry: &Retry,
) -> anyhow::Result<()> {
    let retries: Api<WorkflowRetry> = Api::namespaced(cluster.admin_client(), namespace);
    let request = WorkflowRetry::new(
        name,
        WorkflowRetrySpec {
            archived_workflow_uid: Some(uid.to_owned()),
            restart_successful: retry.restart_successful,
            node_field_selector: retry.node_field_selector.map(str::to_owned),
            parameters: (!retry.parameters.is_empty()).then(|| retry.parameters.clone()),
            ..Default::default()
        },
    );
    retries
        .create(&PostParams::default(), &request)
        .await
        .with_context(|| format!("creating WorkflowRetry {namespace}/{name}"))?;
    Ok(())
}

/// rewind's answer to an archived retry while pods of the plan's names are orphaned: the
/// WorkflowRetry fails, naming them all, with every pod as it was and no workflow created. Then
/// does what the message says (deletes the first run's failed pods) and returns it.
async fn refused_then_cleared(
    cluster: &LocalCluster,
    namespace: &str,
    uid: &str,
    scenario: &Scenario,
    before: &BTreeMap<String, PodSeen>,
) -> anyhow::Result<String> {
    const NAME: &str = "e2e-refused";
    request_archived(cluster, namespace, NAME, uid, &scenario.retry).await?;
    let retries: Api<WorkflowRetry> = Api::namespaced(cluster.admin_client(), namespace);
    let deadline = Instant::now() + scenario.timeout;
    let status = loop {
        let request = retries.get(NAME).await?;
        if request.is_finished() {
            break request.status.unwrap_or_default();
        }
        ensure!(
            Instant::now() < deadline,
            "WorkflowRetry {NAME} did not finish within {:?}: {:?}",
            scenario.timeout,
            request.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        status.phase == Some(RetryPhase::Failed),
        "rewind should refuse to delete pods the archived workflow does not own: {status:?}"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
    ensure!(
        pods_of(&pods, &scenario.name).await? == *before,
        "rewind touched pods while refusing"
    );
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), namespace);
    ensure!(
        workflows.get_opt(&scenario.name).await?.is_none(),
        "rewind created the workflow while refusing"
    );
    let failed: Vec<&String> = before
        .iter()
        .filter(|(_, pod)| pod.phase == "Failed")
        .map(|(name, _)| name)
        .collect();
    for name in &failed {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    while pods_of(&pods, &scenario.name)
        .await?
        .keys()
        .any(|name| failed.contains(&name))
    {
        ensure!(
            Instant::now() < deadline,
            "the failed pods were not deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(status.message)
}

/// How long after `started` the workflow was reset (no longer Failed), then Succeeded.
async fn until_succeeded(
    api: &Api<Workflow>,
    name: &str,
    started: Instant,
    timeout: Duration,
) -> anyhow::Result<(Duration, Duration)> {
    wait_phase(api, name, |p| p != "Failed", timeout).await?;
    let reset = started.elapsed();
    wait_phase(api, name, |p| p == "Succeeded", timeout).await?;
    Ok((reset, started.elapsed()))
}

/// rewind's controller, in process, serving `namespace` with the controller's credentials.
pub struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), rewind::controller::RunError>>,
}

impl Running {
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task
            .await
            .context("rewind's controller panicked")?
            .context("rewind's controller failed")
    }
}

pub async fn start_rewind(
    cluster: &LocalCluster,
    namespace: &str,
    scenario: &Scenario,
    budgets: Budgets,
    database: Option<Arc<dyn ArgoDatabase>>,
    argo_api: Option<rewind::controller::ArgoApiOptions>,
) -> anyhow::Result<Running> {
    let mut options = Options {
        argo_api,
        ..Options::default()
    };
    options.budget.writes =
        rewind::engine::budget::Rate::new(budgets.rewind_qps, budgets.rewind_burst)
            .context("a non-zero rewind budget")?;
    options.retry.argo_version = scenario.argo_version;
    options.retry.always_offload_node_status = scenario.mode == Mode::Offloaded;
    options.scope = Scope {
        namespaces: vec![namespace.to_owned()],
        instance_id: scenario.instance_id.clone(),
    };
    let mut controller = Controller::new(cluster.config(Role::Controller).await?, options)?;
    if let Some(database) = database {
        controller = controller.with_database(database);
    }
    let state = controller.state();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !state.is_ready() {
        ensure!(
            Instant::now() < deadline,
            "rewind's workflow cache did not sync within 30s"
        );
        ensure!(
            !task.is_finished(),
            "rewind's controller stopped at startup"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Running { shutdown, task })
}

/// The token of rewind's request.
pub const TOKEN: &str = "e2e-1";

/// Asks rewind for a retry as a user does: annotations on the workflow.
pub async fn request_rewind(api: &Api<Workflow>, name: &str, retry: &Retry) -> anyhow::Result<()> {
    let mut wanted = serde_json::Map::new();
    wanted.insert(annotations::RETRY.into(), TOKEN.into());
    if retry.restart_successful {
        wanted.insert(annotations::RESTART_SUCCESSFUL.into(), "true".into());
    }
    if let Some(selector) = retry.node_field_selector {
        wanted.insert(annotations::NODE_FIELD_SELECTOR.into(), selector.into());
    }
    if !retry.parameters.is_empty() {
        wanted.insert(
            annotations::PARAMETERS.into(),
            serde_json::to_string(&retry.parameters)?.into(),
        );
    }
    let patch = serde_json::json!({"metadata": {"annotations": wanted}});
    api.patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating workflow {name} for a retry"))?;
    Ok(())
}

/// Argo's own retry: tools/peer runs the Argo Server's RetryWorkflow (or, given the UID of
/// an archived workflow, RetryArchivedWorkflow) in process.
async fn retry_argo(
    cluster: &LocalCluster,
    peer: &Path,
    namespace: &str,
    scenario: &Scenario,
    budgets: Budgets,
    archived_uid: Option<&str>,
) -> anyhow::Result<()> {
    let (name, retry) = (&scenario.name, &scenario.retry);
    let mut command = tokio::process::Command::new(peer);
    match archived_uid {
        Some(uid) => command.args(["retry-archived", "--uid", uid]),
        None => command.args(["retry", "--name", name.as_str()]),
    };
    command
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path(Role::Admin))
        .args(["--namespace", namespace])
        .args(["--qps", &budgets.argo_qps.to_string()])
        .args(["--burst", &budgets.argo_burst.to_string()])
        .kill_on_drop(true);
    if let Some(configmap) = &scenario.argo_configmap {
        command.args(["--configmap", configmap]);
    }
    if scenario.mode == Mode::Offloaded {
        command.env("ALWAYS_OFFLOAD_NODE_STATUS", "true");
    }
    if retry.restart_successful {
        command.arg("--restart-successful");
    }
    if let Some(selector) = retry.node_field_selector {
        command.args(["--node-field-selector", selector]);
    }
    for parameter in &retry.parameters {
        command.args(["--parameter", parameter]);
    }
    // Only tools/peer/v3 takes it (v4's serves unlabelled workflows only, or reads the
    // instance ID from the ConfigMap).
    if let (Some(id), None) = (&scenario.instance_id, &scenario.argo_configmap) {
        command.args(["--instance-id", id]);
    }
    let output = command
        .output()
        .await
        .with_context(|| format!("running {}", peer.display()))?;
    ensure!(
        output.status.success(),
        "{} retry {namespace}/{name} failed ({}): {}",
        peer.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Polls (every 100 ms) until the workflow exists (an archived retry creates it) with a
/// phase `wanted` accepts.
pub async fn wait_phase(
    api: &Api<Workflow>,
    name: &str,
    wanted: impl Fn(&str) -> bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let wf = api.get_opt(name).await?;
        let now = wf
            .as_ref()
            .map(|wf| wf.status.phase.as_deref().unwrap_or_default());
        if let Some(now) = now
            && wanted(now)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "workflow {name} is {} after {timeout:?}; message {:?}",
                match &wf {
                    Some(_) => format!("still {now:?}"),
                    None => "not there".to_owned(),
                },
                wf.as_ref().and_then(|wf| wf.status.message.as_ref())
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until Argo's controller has labelled every pod of the workflow completed.
///
/// Its pod-cleanup queue is keyed by pod name and rate limited (10/s after a burst of 100),
/// so a label queued for a failed pod can land seconds later on the new pod of the same
/// name that a fast retry made Argo create: that pod then drops out of Argo's pod informer
/// and its node stays Pending forever (seen here with 100 pods). A retry of a settled
/// workflow does not race with that queue.
async fn wait_settled(pods: &Api<Pod>, workflow: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let selector = format!(
        "{}={workflow},{}!=true",
        labels::WORKFLOW,
        labels::COMPLETED
    );
    loop {
        let left = pods.list(&ListParams::default().labels(&selector)).await?;
        if left.items.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} pods of workflow {workflow} are still not labelled {}=true after {timeout:?}",
                left.items.len(),
                labels::COMPLETED
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn pods_of(pods: &Api<Pod>, workflow: &str) -> anyhow::Result<BTreeMap<String, PodSeen>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW)))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|pod| {
            let seen = PodSeen {
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                phase: pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default(),
                node: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(labels::NODE_NAME))
                    .cloned()
                    .unwrap_or_default(),
            };
            (pod.metadata.name.unwrap_or_default(), seen)
        })
        .collect())
}

/// What a retry did to the pods: kept (same UID), replaced (same name, new UID), new (no pod
/// of that name before), gone (not there after).
#[derive(Debug, PartialEq, Eq)]
pub struct PodFates {
    pub kept: BTreeSet<String>,
    pub replaced: BTreeSet<String>,
    pub new: BTreeSet<String>,
    pub gone: BTreeSet<String>,
}

impl Side {
    pub fn fates(&self) -> PodFates {
        let mut fates = PodFates {
            kept: BTreeSet::new(),
            replaced: BTreeSet::new(),
            new: BTreeSet::new(),
            gone: BTreeSet::new(),
        };
        for (name, after) in &self.after {
            match self.before.get(name) {
                Some(before) if before.uid == after.uid => fates.kept.insert(name.clone()),
                Some(_) => fates.replaced.insert(name.clone()),
                None => fates.new.insert(name.clone()),
            };
        }
        for name in self.before.keys() {
            if !self.after.contains_key(name) {
                fates.gone.insert(name.clone());
            }
        }
        fates
    }

    /// First-run pods in `phase`.
    pub fn before_in(&self, phase: &str) -> BTreeSet<String> {
        self.before
            .iter()
            .filter(|(_, p)| p.phase == phase)
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// The differences between the two final workflows beyond timestamps and identities, as
/// "path: rewind value != argo value" lines.
pub fn differences(rewind: &Workflow, argo: &Workflow) -> anyhow::Result<Vec<String>> {
    let rewind = normalized(rewind)?;
    let argo = normalized(argo)?;
    let mut out = Vec::new();
    diff(&rewind, &argo, "", &mut out);
    Ok(out)
}

/// Fields that differ by nature between two runs: times, identities, where pods ran, and
/// rewind's own request annotations.
fn normalized(wf: &Workflow) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(wf)?;
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "generation",
            "namespace",
        ] {
            meta.remove(key);
        }
        if let Some(meta_labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            // Argo archives a finished workflow in the background: the label says Pending
            // until the row is written, a moment that falls differently in two runs.
            if meta_labels.get(labels::WORKFLOW_ARCHIVING_STATUS) == Some(&Value::from("Pending")) {
                meta_labels.insert(labels::WORKFLOW_ARCHIVING_STATUS.into(), "Archived".into());
            }
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            // Argo's controller gives every workflow its own trace ID.
            annotations.retain(|k, _| {
                !k.starts_with("rewind.dev/") && k != "workflows.argoproj.io/trace-id"
            });
            if annotations.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
        for key in [
            "startedAt",
            "finishedAt",
            "estimatedDuration",
            "resourcesDuration",
        ] {
            status.remove(key);
        }
        if let Some(nodes) = status.get_mut("nodes").and_then(Value::as_object_mut) {
            for node in nodes.values_mut().filter_map(Value::as_object_mut) {
                for key in [
                    "startedAt",
                    "finishedAt",
                    "estimatedDuration",
                    "resourcesDuration",
                    "hostNodeName",
                ] {
                    node.remove(key);
                }
            }
        }
    }
    Ok(v)
}

fn diff(rewind: &Value, argo: &Value, path: &str, out: &mut Vec<String>) {
    match (rewind, argo) {
        (Value::Object(r), Value::Object(a)) => {
            let keys: BTreeSet<&String> = r.keys().chain(a.keys()).collect();
            for key in keys {
                let sub = format!("{path}.{key}");
                match (r.get(key), a.get(key)) {
                    (Some(x), Some(y)) => diff(x, y, &sub, out),
                    (x, y) => out.push(format!("{sub}: rewind {x:?} != argo {y:?}")),
                }
            }
        }
        (Value::Array(r), Value::Array(a)) if r.len() == a.len() => {
            for (i, (x, y)) in r.iter().zip(a).enumerate() {
                diff(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (x, y) if x != y => out.push(format!("{path}: rewind {x} != argo {y}")),
        _ => {}
    }
}
