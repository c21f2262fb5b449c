//! Running the controller in-process, asking for retries, and checking what it did.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rewind::argo::plan::{RetryOptions, plan_retry_at};
use rewind::argo::workflow::{Workflow, labels};
use rewind::controller::{Controller, Options};
use rewind::protocol::request::{self, RetryStatus, annotations};
use rewind::retry::Scope;
use rewind::testenv::faultproxy::{FaultProxy, Rule};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role};
use rewind::testenv::workload::{FailedDag, through_transient};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A controller running in this process with the controller's credentials.
pub struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), rewind::controller::RunError>>,
}

/// Starts a controller serving `namespace` only, and waits until its cache has synced.
pub async fn start(
    cluster: &LocalCluster,
    namespace: &str,
    options: Options,
) -> anyhow::Result<Running> {
    start_with_archive(cluster, namespace, options, None).await
}

/// [`start_as`] with the controller's API requests going through a fault proxy that
/// applies `rules` (more can be added to it while the controller runs).
pub async fn start_behind_proxy(
    cluster: &LocalCluster,
    namespace: &str,
    rules: impl IntoIterator<Item = Rule>,
    options: Options,
    archive: Option<std::sync::Arc<dyn rewind::argo::db::ArgoDatabase>>,
) -> anyhow::Result<(
    FaultProxy,
    Running,
    std::sync::Arc<rewind::telemetry::metrics::Metrics>,
)> {
    let proxy = FaultProxy::start(cluster).await?;
    for rule in rules {
        proxy.add(rule);
    }
    let config = proxy.config(cluster, Role::Controller).await?;
    let (running, metrics) = start_as(config, namespace, options, archive).await?;
    Ok((proxy, running, metrics))
}

/// [`start`], serving archived retries from `archive`.
pub async fn start_with_archive(
    cluster: &LocalCluster,
    namespace: &str,
    options: Options,
    archive: Option<std::sync::Arc<dyn rewind::argo::db::ArgoDatabase>>,
) -> anyhow::Result<Running> {
    Ok(start_observed(cluster, namespace, options, archive)
        .await?
        .0)
}

/// [`start_with_archive`], also handing back the controller's metrics.
pub async fn start_observed(
    cluster: &LocalCluster,
    namespace: &str,
    options: Options,
    archive: Option<std::sync::Arc<dyn rewind::argo::db::ArgoDatabase>>,
) -> anyhow::Result<(Running, std::sync::Arc<rewind::telemetry::metrics::Metrics>)> {
    let config = cluster.config(Role::Controller).await?;
    start_as(config, namespace, options, archive).await
}

/// [`start_observed`] with the credentials of `config`.
pub async fn start_as(
    config: kube::Config,
    namespace: &str,
    options: Options,
    archive: Option<std::sync::Arc<dyn rewind::argo::db::ArgoDatabase>>,
) -> anyhow::Result<(Running, std::sync::Arc<rewind::telemetry::metrics::Metrics>)> {
    start_serving(config, &[namespace], options, archive).await
}

/// [`start_as`], serving every namespace of `namespaces`.
pub async fn start_serving(
    config: kube::Config,
    namespaces: &[&str],
    mut options: Options,
    archive: Option<std::sync::Arc<dyn rewind::argo::db::ArgoDatabase>>,
) -> anyhow::Result<(Running, std::sync::Arc<rewind::telemetry::metrics::Metrics>)> {
    options.scope = Scope {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        instance_id: None,
    };
    let mut controller = Controller::new(config, options)?;
    if let Some(archive) = archive {
        controller = controller.with_database(archive);
    }
    let state = controller.state();
    let metrics = controller.metrics();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(controller.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !state.is_ready() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller's workflow cache did not sync within 30s"
        );
        ensure!(
            !task.is_finished(),
            "the controller stopped before its cache synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((Running { shutdown, task }, metrics))
}

impl Running {
    /// True while the controller runs (it has not returned or panicked).
    pub fn is_up(&self) -> bool {
        !self.task.is_finished()
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        (&mut self.task)
            .await
            .context("the controller task panicked")?
            .context("the controller failed")
    }
}

/// A test that fails early stops its controller too, so it does not act on the cluster
/// while other tests run.
impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Options with a write budget of `qps`/`burst` and the bulk path on or off.
pub fn options(qps: u32, burst: u32, allow_bulk: bool) -> Options {
    let mut options = Options::default();
    options.budget.writes = rewind::engine::budget::Rate::new(qps, burst).expect("non-zero rate");
    options.retry.allow_bulk = allow_bulk;
    options
}

/// Asks for a retry as a user would (`kubectl annotate ... rewind.dev/retry=TOKEN`), with
/// the admin's credentials (the test user has no RoleBinding in fresh namespaces).
pub async fn request_retry(
    cluster: &LocalCluster,
    namespace: &str,
    workflow: &str,
    token: &str,
) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {annotations::RETRY: token}}});
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    through_transient(|| workflows.patch_metadata(workflow, &params, &patch))
        .await
        .with_context(|| {
            format!(
                "annotating workflow {namespace}/{workflow} with {}={token}",
                annotations::RETRY
            )
        })?;
    Ok(())
}

/// The request's `rewind.dev/retry-status`, if it is about `token`.
pub fn status_of(wf: &Workflow, token: &str) -> anyhow::Result<Option<RetryStatus>> {
    let on_workflow = wf.metadata.annotations.clone().unwrap_or_default();
    request::status_of(&on_workflow, token).with_context(|| {
        format!(
            "{} is not a retry status: {:?}",
            annotations::STATUS,
            on_workflow.get(annotations::STATUS)
        )
    })
}

/// Waits until the request `token` on `workflow` reports a final phase.
pub async fn wait_finished(
    api: &Api<Workflow>,
    workflow: &str,
    token: &str,
    timeout: Duration,
) -> anyhow::Result<(Workflow, RetryStatus)> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        let wf = through_transient(|| api.get(workflow)).await?;
        if let Some(status) = status_of(&wf, token)? {
            if status.phase.is_finished() {
                return Ok((wf, status));
            }
            last = Some(status);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "retry {token} of {workflow} did not finish within {timeout:?}; last status: {last:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Names of the pods `selector` picks (all with an empty one).
pub async fn pod_names(
    cluster: &LocalCluster,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
    let lp = ListParams::default().labels(selector);
    let mut names: Vec<String> = through_transient(|| pods.list_metadata(&lp))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Creates a pod labelled with `workflow` and sets its phase (as a kubelet would).
pub async fn create_pod(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    workflow: &str,
    phase: Option<&str>,
) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
    let created = pods
        .create(&PostParams::default(), &pod(name, workflow))
        .await
        .with_context(|| format!("creating pod {name}"))?;
    match phase {
        Some(phase) => {
            let status = serde_json::json!({"status": {"phase": phase}});
            Ok(pods
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("setting pod {name} to {phase}"))?)
        }
        None => Ok(created),
    }
}

/// A pod labelled like Argo's for `workflow`, never scheduled (no scheduler serves its
/// scheduler name), so no fake node overwrites its phase.
pub fn pod(name: &str, workflow: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {labels::WORKFLOW: workflow, labels::COMPLETED: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "schedulerName": "rewind-test-unscheduled",
            "containers": [{"name": "main", "image": "argoproj/argosay:v2"}],
        },
    }))
    .expect("a valid pod")
}

/// A failed workflow `wf` of 120 failed and 10 succeeded pods, as the tests that kill
/// a controller mid-retry start from: its plan, and its pods before the retry.
pub struct KillTarget {
    pub name: String,
    pub plan: rewind::argo::plan::Plan,
    /// The plan's pods.
    pub planned: BTreeSet<String>,
    /// The label selector of the workflow's pods.
    pub selector: String,
    pub pods_before: BTreeSet<String>,
}

impl KillTarget {
    pub async fn create(cluster: &LocalCluster, namespace: &str) -> anyhow::Result<Self> {
        let dag = FailedDag {
            name: "wf".into(),
            failed: 120,
            succeeded: 10,
        };
        let created = dag
            .create(&cluster.admin_client(), namespace, 16, || ())
            .await?;
        let plan = expected_plan(&created)?;
        let selector = format!("{}={}", labels::WORKFLOW, dag.name);
        Ok(KillTarget {
            planned: plan.pods_to_delete.iter().cloned().collect(),
            pods_before: pod_names(cluster, namespace, &selector)
                .await?
                .into_iter()
                .collect(),
            name: dag.name,
            plan,
            selector,
        })
    }

    /// The plan's pods still there.
    pub async fn planned_left(
        &self,
        cluster: &LocalCluster,
        namespace: &str,
    ) -> anyhow::Result<usize> {
        let present = pod_names(cluster, namespace, &self.selector).await?;
        Ok(present.iter().filter(|p| self.planned.contains(*p)).count())
    }

    /// Checks that exactly the pods outside the plan remain.
    pub async fn ensure_only_outsiders_left(
        &self,
        cluster: &LocalCluster,
        namespace: &str,
    ) -> anyhow::Result<()> {
        let after: BTreeSet<String> = pod_names(cluster, namespace, &self.selector)
            .await?
            .into_iter()
            .collect();
        let expected: BTreeSet<String> = self
            .pods_before
            .difference(&self.planned)
            .cloned()
            .collect();
        anyhow::ensure!(
            after == expected,
            "expected only the {} pods outside the plan to remain, found {after:?}",
            expected.len()
        );
        Ok(())
    }
}

/// What the planner says the retry must produce from `before`, with every
/// timestamp Argo sets to "now" replaced by [`NOW`].
pub fn expected_plan(before: &Workflow) -> anyhow::Result<rewind::argo::plan::Plan> {
    let now: Timestamp = NOW.parse().expect("a valid timestamp");
    Ok(plan_retry_at(before, &RetryOptions::default(), now)?)
}

/// Stands for "the time of the retry" in [`expected_plan`].
pub use rewind::testenv::trials::NOW;

/// Checks that `actual` (read after the retry) is `expected` (the planner's output),
/// apart from what the API server and the request itself write: resourceVersion,
/// generation, managedFields and the rewind.dev/* annotations. Each place the plan
/// has [`NOW`] must hold a time within `[from, to]`.
pub fn ensure_reset_as_planned(
    actual: &Workflow,
    expected: &Workflow,
    from: Timestamp,
    to: Timestamp,
) -> anyhow::Result<()> {
    let differences = rewind::testenv::trials::differences(
        serde_json::to_value(actual)?,
        serde_json::to_value(expected)?,
        from,
        to,
    );
    ensure!(
        differences.is_empty(),
        "the workflow after the retry differs from the planner's output: {differences:?}"
    );
    Ok(())
}

/// A normal retry in `namespace` (a small failed workflow, asked by annotation) is
/// served: it succeeds and resets the workflow as planned. How a test shows the
/// controller still serves everyone after a hostile input.
pub async fn serves_a_normal_retry(
    cluster: &LocalCluster,
    namespace: &str,
) -> anyhow::Result<Duration> {
    let admin = cluster.admin_client();
    let dag = rewind::testenv::workload::FailedDag {
        name: "normal".into(),
        failed: 10,
        succeeded: 2,
    };
    let before = dag.create(&admin, namespace, 8, || ()).await?;
    let plan = expected_plan(&before)?;
    let workflows: Api<Workflow> = Api::namespaced(admin, namespace);
    // The status's times are whole seconds.
    let from = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(1);
    let asked = tokio::time::Instant::now();
    request_retry(cluster, namespace, &dag.name, "normal-1").await?;
    let (after, status) =
        wait_finished(&workflows, &dag.name, "normal-1", Duration::from_secs(60)).await?;
    let took = asked.elapsed();
    ensure!(
        status.phase == request::RetryPhase::Succeeded,
        "the normal retry in {namespace} did not succeed: {status:?}"
    );
    let to = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(1);
    ensure_reset_as_planned(&after, &plan.workflow, from, to)?;
    Ok(took)
}

/// The reasons of the Events about `workflow`, oldest first.
pub async fn event_reasons(
    cluster: &LocalCluster,
    namespace: &str,
    workflow: &str,
) -> anyhow::Result<Vec<String>> {
    Ok(events_about(cluster, namespace, workflow)
        .await?
        .into_iter()
        .map(|(reason, _)| reason)
        .collect())
}

/// The reasons and notes of the Events about the object named `name`, oldest first.
async fn events_about(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(cluster.admin_client(), namespace);
    let mut about: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    about.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(about
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

/// Waits (up to 20 s, polling every 20 ms) until pod `name` is gone; `who` names what
/// should have deleted it, for the failure message.
pub async fn wait_gone(pods: &Api<Pod>, name: &str, who: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while pods.get_opt(name).await?.is_some() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{who} did not delete {name} within 20s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Waits (up to 10 s) until an Event with `reason` is about `workflow`.
pub async fn wait_event(
    cluster: &LocalCluster,
    namespace: &str,
    workflow: &str,
    reason: &str,
) -> anyhow::Result<()> {
    wait_event_note(cluster, namespace, workflow, reason, "").await
}

/// Waits (up to 10 s) until an Event with `reason` and a note containing `note` is
/// about the object named `name`.
pub async fn wait_event_note(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    reason: &str,
    note: &str,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events = events_about(cluster, namespace, name).await?;
        if events.iter().any(|(r, n)| r == reason && n.contains(note)) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "expected a {reason} Event saying {note:?} on {name} within 10s, found {events:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request in the API server's audit log.
#[derive(Clone, Debug)]
pub struct Audited {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub name: String,
    pub code: u16,
    /// A dry run (`?dryRun=All`): admitted and validated, never stored.
    pub dry_run: bool,
    /// When the API server received the request.
    pub received: Timestamp,
}

impl Audited {
    pub fn is_mutating(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// The requests in `namespace` the audit log holds so far.
pub fn audit_log(cluster: &LocalCluster, namespace: &str) -> anyhow::Result<Vec<Audited>> {
    let path = cluster
        .audit_log_path()
        .context("the shared cluster has audit logging on")?;
    read_audit_log(&path, namespace)
}

fn read_audit_log(path: &Path, namespace: &str) -> anyhow::Result<Vec<Audited>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        // The log is written while we read it: a last line may be incomplete.
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let object = &event["objectRef"];
        if object["namespace"] != namespace {
            continue;
        }
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let received = s(&event["requestReceivedTimestamp"]);
        out.push(Audited {
            user: s(&event["user"]["username"]),
            verb: s(&event["verb"]),
            resource: s(&object["resource"]),
            name: s(&object["name"]),
            code: event["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
            dry_run: s(&event["requestURI"]).contains("dryRun=All"),
            received: received
                .parse()
                .with_context(|| format!("audit timestamp {received:?}"))?,
        });
    }
    Ok(out)
}

/// Counts of the requests by `user`, keyed by verb and resource, for fail messages.
pub fn summary(log: &[Audited], user: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in log.iter().filter(|a| a.user == user) {
        *counts
            .entry(format!("{} {}", a.verb, a.resource))
            .or_default() += 1;
    }
    counts
}

/// The resets of workflow `name` the controller wrote (updates the API server took).
pub fn resets(log: &[Audited], name: &str) -> usize {
    log.iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "update"
                && a.resource == "workflows"
                && a.name == name
                && a.code == 200
        })
        .count()
}
