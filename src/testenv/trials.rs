//! Crash trials (rule 4 under SIGKILL): a failed workflow with real pods, the real `rewind
//! controller` binary asked to retry it, killed with SIGKILL at a chosen moment, started
//! again, and the end checked against the planner (the oracle) and the API server's audit
//! log: exactly one reset (live) or create (archived), the workflow the planner formulates,
//! every plan pod gone, every other pod (an outsider labelled with the workflow's name among
//! them) still there with its UID, and the request Succeeded.
//!
//! Shared by the `faults` benchmark (thousands of pods, 20 trials) and a small cluster test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::argo::plan::compress::CompressError;
use crate::argo::plan::{Plan, PlanError, RetryOptions, plan_retry_at};
use crate::argo::workflow::{Workflow, labels};
use crate::protocol::crd::{CREATED_BY, WorkflowRetry, WorkflowRetrySpec};
use crate::protocol::request::{self, RetryPhase, annotations};
use crate::testenv::db::argodb::ArgoDbTool;
use crate::testenv::db::{CREDENTIALS_SECRET, DbError, DbServer, PASSWORD, USER};
use crate::testenv::localcluster::{self, CONTROLLER_NAME, LocalCluster};
use crate::testenv::workload::{FailedDag, delete_workflow, hydrated};
use crate::testenv::{IoError, io_error};

const WORKFLOW: &str = "wf";
const TOKEN: &str = "trial";
const REQUEST: &str = "trial";
/// The name of Argo's ConfigMap [`install_argo_config`] creates.
pub const CONFIGMAP: &str = "workflow-controller-configmap";
/// Stands for "the time of the retry" in the planner's output.
pub const NOW: &str = "2000-01-01T00:00:00Z";
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Cluster(#[from] localcluster::Error),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Compress(#[from] CompressError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] IoError),
    /// The controller or the request did not behave well enough to be checked at all.
    #[error("{0}")]
    Run(String),
}

pub(crate) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> TrialError {
    let action = action.into();
    move |source| TrialError::Kube { action, source }
}

/// What is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// A failed workflow in the cluster, asked through its `rewind.dev/retry` annotation.
    Live,
    /// A workflow Argo's own `ArchiveWorkflow` stored in PostgreSQL, deleted from the cluster
    /// with its pods left behind, asked through a WorkflowRetry.
    Archived,
}

/// Where trials run: a control plane with an audit log, the controller binary, and for
/// archived trials Argo's database on a PostgreSQL server with Argo's tables.
pub struct Bench<'a> {
    pub cluster: &'a LocalCluster,
    /// The `rewind` binary.
    pub binary: PathBuf,
    /// Extra `rewind controller` flags (a budget, `--no-bulk`).
    pub controller_args: Vec<String>,
    /// Failed pods (the plan) and succeeded ones (kept).
    pub failed: usize,
    pub succeeded: usize,
    pub target: Target,
    /// Argo's database and its code, for archived trials.
    pub archive: Option<(&'a DbServer, ArgoDbTool)>,
    /// The cluster runs a garbage collector, which deletes the pods of a deleted workflow:
    /// they are created held by Argo's pod finalizer, as Argo does, so the archived
    /// workflow's pods stay behind.
    pub garbage_collected: bool,
    /// Where the controller's logs go.
    pub logs: PathBuf,
}

/// What one trial saw.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub namespace: String,
    /// When the first controller was killed, from its start; `None`: it was not.
    pub kill_at: Option<Duration>,
    /// The request's phase as the killed controller left it.
    pub phase_at_kill: Option<RetryPhase>,
    /// Plan pods gone right after the kill.
    pub gone_at_kill: usize,
    pub planned: usize,
    /// From the first controller's start until the request was seen finished.
    pub total: Duration,
    /// Successful resets (live: updates of the workflow) or creates (archived) by the controller.
    pub resets: usize,
    /// Each failed check, said in words; empty when the trial passed.
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

impl Bench<'_> {
    /// Prepares a workload in a fresh `namespace`, starts the controller, kills it with SIGKILL
    /// `kill_at` after its start (unless `None`), starts it again and checks the end.
    pub async fn trial(
        &self,
        namespace: &str,
        kill_at: Option<Duration>,
    ) -> Result<Outcome, TrialError> {
        self.cluster.create_namespace(namespace).await?;
        let prepared = self.prepare(namespace, WORKFLOW, self.target).await?;
        let audit = self
            .cluster
            .audit_log_path()
            .ok_or_else(|| TrialError::Run("the control plane writes no audit log".into()))?;
        let audit_from = AuditMark::now(audit)?;
        let from = Timestamp::now() - SignedDuration::from_secs(1);
        self.ask(namespace, &prepared).await?;

        let started = Instant::now();
        let mut child = self.spawn(namespace, "first")?;
        let (mut phase_at_kill, mut gone_at_kill) = (None, 0);
        if let Some(kill_at) = kill_at {
            tokio::select! {
                exit = child.wait() => {
                    return Err(TrialError::Run(format!(
                        "the controller exited by itself ({exit:?}) before the kill:\n{}",
                        self.log_tail(namespace, "first")
                    )));
                }
                () = tokio::time::sleep(kill_at) => {}
            }
            child
                .start_kill()
                .map_err(io_error("killing", &self.binary))?;
            child
                .wait()
                .await
                .map_err(io_error("waiting for", &self.binary))?;
            phase_at_kill = self.phase(namespace).await?;
            let left = self.present(namespace, WORKFLOW).await?;
            gone_at_kill = prepared
                .plan
                .pods_to_delete
                .iter()
                .filter(|p| !left.contains_key(*p))
                .count();
            child = self.spawn(namespace, "restarted")?;
        }
        let finished = self.wait_finished(namespace, &mut child, started).await;
        let total = started.elapsed();
        let to = Timestamp::now() + SignedDuration::from_secs(1);
        // The API server logs a request once it has answered it: the reset's line may come
        // after the status it carries was read. Waited for before the controller is stopped
        // (stopped mid-answer, its reset would be logged as a 504), then a moment more for
        // any second reset.
        let deadline = Instant::now() + Duration::from_secs(10);
        while mark_writes(&audit_from, namespace, &prepared)?.is_empty()
            && Instant::now() < deadline
        {
            tokio::time::sleep(POLL).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Stopped before the checks, so nothing changes while they look.
        let _ = child.start_kill();
        let _ = child.wait().await;
        let last = if kill_at.is_some() {
            "restarted"
        } else {
            "first"
        };
        let phase = finished
            .map_err(|e| TrialError::Run(format!("{e}\n{}", self.log_tail(namespace, last))))?;

        let mut failures = Vec::new();
        if phase.0 != RetryPhase::Succeeded {
            failures.push(format!("the request ended {:?}: {}", phase.0, phase.1));
        }
        let (writes, resets) = self.resets(&audit_from, namespace, &prepared).await?;
        if resets != 1 {
            let codes: Vec<String> = writes
                .iter()
                .map(|w| format!("{} {}", w.verb, w.code))
                .collect();
            failures.push(format!(
                "expected exactly one {} of the workflow by the controller, {resets} landed; the audit log has {codes:?}",
                match self.target {
                    Target::Live => "reset (update)",
                    Target::Archived => "create",
                }
            ));
        }
        failures.extend(self.check_workflow(namespace, &prepared, from, to).await?);
        let after = self.present(namespace, WORKFLOW).await?;
        let left: Vec<&String> = prepared
            .plan
            .pods_to_delete
            .iter()
            .filter(|p| after.contains_key(*p))
            .collect();
        if !left.is_empty() {
            failures.push(format!(
                "{} plan pods were left, e.g. {:?}",
                left.len(),
                &left[..left.len().min(5)]
            ));
        }
        let lost: Vec<&String> = prepared
            .kept
            .iter()
            .filter(|(name, uid)| after.get(*name) != Some(*uid))
            .map(|(name, _)| name)
            .collect();
        if !lost.is_empty() {
            failures.push(format!(
                "{} pods outside the plan were deleted or replaced, e.g. {:?}",
                lost.len(),
                &lost[..lost.len().min(5)]
            ));
        }
        Ok(Outcome {
            namespace: namespace.to_owned(),
            kill_at,
            phase_at_kill,
            gone_at_kill,
            planned: prepared.plan.pods_to_delete.len(),
            total,
            resets,
            failures,
        })
    }

    /// The controller's writes of the workflow since `mark`, and how many resets (live:
    /// updates) or creates (archived) landed. The answer to a write says whether it was
    /// applied, except a 504: the client went away (a SIGKILL while it waited) or the
    /// server stopped waiting, and the API server carries the write on regardless. So a
    /// live trial counts what the workflow shows: its generation rises with each write of
    /// more than metadata, which only a reset is. An archived trial's workflow has one name:
    /// a create answered 504 landed if no create succeeded and the workflow exists.
    pub(crate) async fn resets(
        &self,
        mark: &AuditMark,
        namespace: &str,
        prepared: &Prepared,
    ) -> Result<(Vec<Write>, usize), TrialError> {
        let writes = mark_writes(mark, namespace, prepared)?;
        let workflows: Api<Workflow> = Api::namespaced(self.cluster.admin_client(), namespace);
        let now = workflows
            .get_opt(&prepared.name)
            .await
            .map_err(kube("reading the workflow"))?;
        let resets = match prepared.target {
            Target::Live => {
                let generation = |wf: Option<&Workflow>| {
                    wf.and_then(|w| w.metadata.generation).unwrap_or_default()
                };
                usize::try_from(generation(now.as_ref()) - prepared.generation).unwrap_or(0)
            }
            Target::Archived => {
                let created = writes.iter().filter(|w| w.code == 201).count();
                let unanswered = writes.iter().any(|w| w.code == 504);
                created + usize::from(created == 0 && unanswered && now.is_some())
            }
        };
        Ok((writes, resets))
    }

    /// Failed workflow `name` in `namespace`, its pods and an outsider (`{name}-outsider`: a
    /// failed pod labelled with the workflow and owned by it that no plan holds: no node names
    /// it, and without Argo's node annotations or completed label no bulk delete may select
    /// it); for an archived `target`, archived by Argo's code and deleted, with the ConfigMap
    /// that points the controller at the database (one archived workflow per namespace).
    pub(crate) async fn prepare(
        &self,
        namespace: &str,
        name: &str,
        target: Target,
    ) -> Result<Prepared, TrialError> {
        let admin = self.cluster.admin_client();
        let dag = FailedDag {
            name: name.into(),
            failed: self.failed,
            succeeded: self.succeeded,
        };
        let workflows: Api<Workflow> = Api::namespaced(admin.clone(), namespace);
        let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
        let held = self.garbage_collected && target == Target::Archived;
        let created = if held {
            let created = workflows
                .create(&PostParams::default(), &dag.workflow(namespace))
                .await
                .map_err(kube("creating the workflow"))?;
            for (pod, phase) in dag.pods(&created) {
                create_pod(&pods, pod, phase, true).await?;
            }
            created
        } else {
            dag.create(&admin, namespace, 64, || ())
                .await
                .map_err(kube("creating the workflow and its pods"))?
        };
        let mut outsider = dag
            .pods(&created)
            .pop()
            .ok_or_else(|| TrialError::Run("a workflow without pods".into()))?
            .0;
        outsider.metadata.name = Some(format!("{name}-outsider"));
        outsider.metadata.annotations = None;
        outsider
            .labels_mut()
            .insert(labels::COMPLETED.into(), "false".into());
        create_pod(&pods, outsider, "Failed", held).await?;

        let read = workflows
            .get(name)
            .await
            .map_err(kube("reading the workflow"))?;
        let generation = read.metadata.generation.unwrap_or_default();
        let before = match target {
            Target::Live => read,
            Target::Archived => {
                let (db, argo) = self.archive.as_ref().ok_or_else(|| {
                    TrialError::Run("an archived trial needs Argo's database".into())
                })?;
                // As Argo's controller archives: hydrated, then ArchiveWorkflow. The oracle
                // plans from the row as Argo's code reads it back (Go fills empty fields in).
                let uid = read.uid().unwrap_or_default();
                let archive = db.archive_request(&hydrated(read)?);
                let get = db.argodb_request("getArchived", json!({"uid": uid}));
                let argo = argo.clone();
                let answer = tokio::task::spawn_blocking(move || {
                    argo.one(archive)?;
                    argo.one(get)
                })
                .await
                .map_err(|e| TrialError::Run(format!("Argo's ArchiveWorkflow: {e}")))??;
                let row: Workflow = serde_json::from_str(&answer.json)?;
                let deleted = delete_workflow(&workflows, name, Duration::from_secs(60))
                    .await
                    .map_err(kube("deleting the archived workflow"))?;
                if !deleted {
                    return Err(TrialError::Run(
                        "the archived workflow was not deleted within 60 s".into(),
                    ));
                }
                install_argo_config(self.cluster, namespace, db).await?;
                row
            }
        };
        let now: Timestamp = NOW.parse().expect("a valid timestamp");
        let plan = plan_retry_at(&before, &RetryOptions::default(), now)?;
        let present = self.present(namespace, name).await?;
        let planned: BTreeSet<&String> = plan.pods_to_delete.iter().collect();
        if let Some(missing) = planned.iter().find(|p| !present.contains_key(**p)) {
            return Err(TrialError::Run(format!(
                "plan pod {missing} does not exist before the retry"
            )));
        }
        let kept = present
            .into_iter()
            .filter(|(name, _)| !planned.contains(name))
            .collect();
        Ok(Prepared {
            name: name.to_owned(),
            target,
            plan,
            kept,
            old_uid: before.uid().unwrap_or_default(),
            generation,
        })
    }

    /// Asks for the retry as a user would.
    async fn ask(&self, namespace: &str, prepared: &Prepared) -> Result<(), TrialError> {
        let admin = self.cluster.admin_client();
        match self.target {
            Target::Live => {
                let patch = json!({"metadata": {"annotations": {annotations::RETRY: TOKEN}}});
                Api::<Workflow>::namespaced(admin, namespace)
                    .patch_metadata(WORKFLOW, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube("asking for the retry"))?;
            }
            Target::Archived => {
                let request = WorkflowRetry::new(
                    REQUEST,
                    WorkflowRetrySpec {
                        archived_workflow_uid: Some(prepared.old_uid.clone()),
                        ..Default::default()
                    },
                );
                Api::<WorkflowRetry>::namespaced(admin, namespace)
                    .create(&PostParams::default(), &request)
                    .await
                    .map_err(kube("creating the WorkflowRetry"))?;
            }
        }
        Ok(())
    }

    fn log_path(&self, namespace: &str, run: &str) -> PathBuf {
        self.logs.join(format!("{namespace}-{run}.log"))
    }

    fn log_tail(&self, namespace: &str, run: &str) -> String {
        let text = std::fs::read_to_string(self.log_path(namespace, run)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The real binary serving `namespace`, its logs in a file of its own.
    fn spawn(&self, namespace: &str, run: &str) -> Result<Child, TrialError> {
        let configmap = match self.target {
            Target::Live => String::new(),
            Target::Archived => format!("{namespace}/{CONFIGMAP}"),
        };
        let kubeconfig = self.cluster.kubeconfig_path(localcluster::Role::Controller);
        let child = self
            .controller(namespace, &kubeconfig, &self.log_path(namespace, run))?
            .arg(format!("--argo-configmap={configmap}"))
            .args(&self.controller_args)
            .spawn()
            .map_err(io_error("starting", &self.binary))?;
        Ok(child)
    }

    /// The binary's `rewind controller` serving `namespace` through `kubeconfig`, its
    /// output in `log`, killed if dropped; REWIND_CONTROLLER_LOG sets its RUST_LOG.
    pub(crate) fn controller(
        &self,
        namespace: &str,
        kubeconfig: &Path,
        log: &Path,
    ) -> Result<Command, TrialError> {
        let out = std::fs::File::create(log).map_err(io_error("creating", log))?;
        let err = out.try_clone().map_err(io_error("opening", log))?;
        let filter =
            std::env::var("REWIND_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        let mut command = Command::new(&self.binary);
        command
            .args(["--log-format", "json", "controller"])
            .args(["--namespace", namespace, "--http-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        Ok(command)
    }

    /// The request's phase and message, if it has any.
    async fn status(&self, namespace: &str) -> Result<Option<(RetryPhase, String)>, TrialError> {
        let admin = self.cluster.admin_client();
        Ok(match self.target {
            Target::Live => {
                let meta = Api::<Workflow>::namespaced(admin, namespace)
                    .get_metadata(WORKFLOW)
                    .await
                    .map_err(kube("reading the workflow's status"))?;
                request::status_of(meta.annotations(), TOKEN)?.map(|s| (s.phase, s.message))
            }
            Target::Archived => {
                let object = Api::<WorkflowRetry>::namespaced(admin, namespace)
                    .get(REQUEST)
                    .await
                    .map_err(kube("reading the WorkflowRetry"))?;
                object.status.and_then(|s| s.phase.map(|p| (p, s.message)))
            }
        })
    }

    async fn phase(&self, namespace: &str) -> Result<Option<RetryPhase>, TrialError> {
        Ok(self.status(namespace).await?.map(|s| s.0))
    }

    async fn wait_finished(
        &self,
        namespace: &str,
        child: &mut Child,
        started: Instant,
    ) -> Result<(RetryPhase, String), TrialError> {
        let limit = Duration::from_secs(900);
        loop {
            if let Some(status) = self.status(namespace).await?
                && status.0.is_finished()
            {
                return Ok(status);
            }
            if let Some(exit) = child
                .try_wait()
                .map_err(io_error("waiting for", &self.binary))?
            {
                return Err(TrialError::Run(format!(
                    "the controller exited by itself ({exit}) before the request finished"
                )));
            }
            if started.elapsed() > limit {
                return Err(TrialError::Run(format!(
                    "the request did not finish within {limit:?}; its status: {:?}",
                    self.status(namespace).await?
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every pod labelled with workflow `name`, by name, with its UID.
    pub(crate) async fn present(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<BTreeMap<String, String>, TrialError> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.admin_client(), namespace);
        let lp = ListParams::default().labels(&format!("{}={name}", labels::WORKFLOW));
        Ok(pods
            .list_metadata(&lp)
            .await
            .map_err(kube("listing the workflow's pods"))?
            .items
            .into_iter()
            .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
            .collect())
    }

    /// The workflow in the cluster against the planner's: equal once both are hydrated, apart
    /// from what the API server and rewind's own annotations add, every time the planner sets
    /// to "now" within `[from, to]`. An archived trial's workflow is created anew by the
    /// request, so its UID, resourceVersion and creation time are the API server's.
    pub(crate) async fn check_workflow(
        &self,
        namespace: &str,
        prepared: &Prepared,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<String>, TrialError> {
        let workflows: Api<Workflow> = Api::namespaced(self.cluster.admin_client(), namespace);
        let Some(actual) = workflows
            .get_opt(&prepared.name)
            .await
            .map_err(kube("reading the workflow"))?
        else {
            return Ok(vec!["the workflow does not exist after the retry".into()]);
        };
        let mut failures = Vec::new();
        let mut expected = hydrated(prepared.plan.workflow.clone())?;
        let mut actual = hydrated(actual)?;
        if prepared.target == Target::Archived {
            let created_by = actual.annotation(CREATED_BY).map(str::to_owned);
            if created_by.is_none() || actual.uid() == Some(prepared.old_uid.clone()) {
                failures.push(format!(
                    "expected the workflow created anew by the request, found UID {:?} ({CREATED_BY} {created_by:?})",
                    actual.uid()
                ));
            }
            for wf in [&mut expected, &mut actual] {
                wf.metadata.uid = None;
                wf.metadata.resource_version = None;
                wf.metadata.creation_timestamp = None;
            }
        }
        failures.extend(differences(
            serde_json::to_value(&actual)?,
            serde_json::to_value(&expected)?,
            from,
            to,
        ));
        Ok(failures)
    }
}

/// A workflow ready to be retried, and what its retry must do.
pub(crate) struct Prepared {
    pub(crate) name: String,
    pub(crate) target: Target,
    pub(crate) plan: Plan,
    /// Pods outside the plan, by name, with their UIDs.
    pub(crate) kept: BTreeMap<String, String>,
    /// The workflow's UID (for an archived trial, the archived one's).
    pub(crate) old_uid: String,
    /// The live workflow's generation before the retry.
    generation: i64,
}

/// Creates `pod` with `phase` set through the status subresource, as a kubelet would,
/// optionally held by Argo's pod finalizer.
async fn create_pod(
    pods: &Api<Pod>,
    mut pod: Pod,
    phase: &str,
    held: bool,
) -> Result<(), TrialError> {
    if held {
        pod.metadata.finalizers = Some(vec![labels::POD_STATUS_FINALIZER.into()]);
    }
    let name = pod.name_any();
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(kube(format!("creating pod {name}")))?;
    let status = json!({"status": {"phase": phase}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(kube(format!("setting pod {name} {phase}")))?;
    Ok(())
}

/// Argo's ConfigMap with its `persistence` block (archive on) and the Secret it names, in
/// `namespace`, and a Role letting the controller read them (the chart's archive Role); waits
/// until it may, since the binary reads them once at start.
pub async fn install_argo_config(
    cluster: &LocalCluster,
    namespace: &str,
    db: &DbServer,
) -> Result<(), TrialError> {
    let admin = cluster.admin_client();
    let mut persistence = db.argo_db_config();
    persistence["archive"] = json!(true);
    let configmap = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIGMAP.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "persistence".to_owned(),
            serde_yaml_ng::to_string(&persistence)
                .map_err(|e| TrialError::Run(format!("Argo's persistence as YAML: {e}")))?,
        )])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &configmap)
        .await
        .map_err(kube("creating Argo's ConfigMap"))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CREDENTIALS_SECRET.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("username".to_owned(), ByteString(USER.into())),
            ("password".to_owned(), ByteString(PASSWORD.into())),
        ])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(kube("creating the database Secret"))?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "rewind-archive"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIGMAP], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [CREDENTIALS_SECRET], "verbs": ["get"]},
        ],
    }))?;
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .map_err(kube("creating the archive Role"))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "rewind-archive"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rewind-archive"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CONTROLLER_NAME}],
    }))?;
    Api::<RoleBinding>::namespaced(admin, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .map_err(kube("creating the archive RoleBinding"))?;
    let controller = kube::Client::try_from(cluster.config(localcluster::Role::Controller).await?)
        .map_err(kube("building the controller's client"))?;
    let as_controller = Api::<Secret>::namespaced(controller, namespace);
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = as_controller.get(CREDENTIALS_SECRET).await {
        if Instant::now() > deadline {
            return Err(TrialError::Run(format!(
                "the controller may not read Secret {CREDENTIALS_SECRET}: {e}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The controller's resets (live: updates) or creates (archived) of the prepared workflow
/// since `mark`, whatever their answers.
fn mark_writes(
    mark: &AuditMark,
    namespace: &str,
    prepared: &Prepared,
) -> Result<Vec<Write>, TrialError> {
    let verb = match prepared.target {
        Target::Live => "update",
        Target::Archived => "create",
    };
    let mut writes = mark.writes_since(namespace, &prepared.name)?;
    writes.retain(|w| w.verb == verb);
    Ok(writes)
}

/// A write of the workflow by the controller, as the audit log has it.
pub(crate) struct Write {
    verb: String,
    code: u16,
}

/// Where the audit log ended at a moment. The API server rotates it at 100 MB (a few
/// trials of thousands of pods): the file is renamed, keeping its inode, and a new one begun.
pub(crate) struct AuditMark {
    path: PathBuf,
    inode: u64,
    offset: u64,
    at: std::time::SystemTime,
    /// The other audit files there were at the mark, by inode. A file's
    /// modification time alone cannot tell: the kernel stamps it from a
    /// coarse clock that can run a few milliseconds behind `at`.
    earlier: std::collections::BTreeSet<u64>,
}

/// The audit log at `path` and its rotated files beside it, with their metadata.
fn audit_files(path: &Path) -> Result<Vec<(PathBuf, std::fs::Metadata)>, TrialError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error("reading", dir))? {
        let entry = entry.map_err(io_error("reading", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(stem) && name.ends_with(".log")) {
            continue;
        }
        let path = entry.path();
        let meta = entry.metadata().map_err(io_error("reading", &path))?;
        files.push((path, meta));
    }
    Ok(files)
}

impl AuditMark {
    pub(crate) fn now(path: PathBuf) -> Result<AuditMark, TrialError> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(&path).map_err(io_error("reading", &path))?;
        let at = std::time::SystemTime::now();
        let earlier = audit_files(&path)?
            .into_iter()
            .map(|(_, meta)| meta.ino())
            .filter(|&inode| inode != meta.ino())
            .collect();
        Ok(AuditMark {
            inode: meta.ino(),
            offset: meta.len(),
            at,
            earlier,
            path,
        })
    }

    /// The audit lines written since the mark: the marked file past its offset, wherever it
    /// was renamed, and every audit file begun since.
    fn lines_since(&self) -> Result<String, TrialError> {
        use std::os::unix::fs::MetadataExt as _;
        let mut text = String::new();
        for (path, meta) in audit_files(&self.path)? {
            // A file there at the mark and not written since is older; a file
            // begun since (a new inode, or an old one reused and written) is new.
            let older =
                self.earlier.contains(&meta.ino()) && meta.modified().is_ok_and(|m| m < self.at);
            let from = if meta.ino() == self.inode {
                self.offset
            } else if !older {
                0
            } else {
                continue;
            };
            let mut file = std::fs::File::open(&path).map_err(io_error("opening", &path))?;
            file.seek(SeekFrom::Start(from))
                .map_err(io_error("reading", &path))?;
            file.read_to_string(&mut text)
                .map_err(io_error("reading", &path))?;
            text.push('\n');
        }
        Ok(text)
    }

    /// The controller's writes (update, create) of workflow `name` since the mark.
    fn writes_since(&self, namespace: &str, name: &str) -> Result<Vec<Write>, TrialError> {
        let text = self.lines_since()?;
        let needle = format!("\"namespace\":\"{namespace}\"");
        let mut writes = Vec::new();
        // Most lines are about pods; only the few naming the namespace and workflows are parsed.
        for line in text
            .lines()
            .filter(|l| l.contains(&needle) && l.contains("\"workflows\""))
        {
            // The log is written while it is read: a last line may be incomplete.
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let object = &event["objectRef"];
            if event["user"]["username"] != CONTROLLER_NAME
                || object["namespace"] != namespace
                || object["resource"] != "workflows"
                || object["subresource"].is_string()
                || object["name"] != name
            {
                continue;
            }
            let verb = event["verb"].as_str().unwrap_or_default();
            if matches!(verb, "update" | "create") {
                writes.push(Write {
                    verb: verb.to_owned(),
                    code: event["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
                });
            }
        }
        Ok(writes)
    }
}

/// Where `actual` differs from `expected`, ignoring what the API server manages and rewind's
/// own annotations; every place `expected` has [`NOW`] must hold a time within `[from, to]`.
pub fn differences(
    mut actual: Value,
    mut expected: Value,
    from: Timestamp,
    to: Timestamp,
) -> Vec<String> {
    for value in [&mut actual, &mut expected] {
        let Some(meta) = value["metadata"].as_object_mut() else {
            continue;
        };
        for server_managed in ["resourceVersion", "generation", "managedFields"] {
            meta.remove(server_managed);
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.retain(|k, _| !k.starts_with("rewind.dev/"));
            if annotations.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    let mut out = Vec::new();
    replace_now(&mut actual, &expected, from, to, "", &mut out);
    diff(&actual, &expected, "", &mut out);
    if out.len() > 10 {
        let more = out.len() - 10;
        out.truncate(10);
        out.push(format!(
            "... and {more} more differences from the planner's workflow"
        ));
    }
    out
}

fn replace_now(
    actual: &mut Value,
    expected: &Value,
    from: Timestamp,
    to: Timestamp,
    path: &str,
    bad: &mut Vec<String>,
) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for (k, ev) in e {
                if let Some(av) = a.get_mut(k) {
                    replace_now(av, ev, from, to, &format!("{path}/{k}"), bad);
                }
            }
        }
        (Value::Array(a), Value::Array(e)) => {
            for (i, (av, ev)) in a.iter_mut().zip(e).enumerate() {
                replace_now(av, ev, from, to, &format!("{path}/{i}"), bad);
            }
        }
        (a @ Value::String(_), Value::String(e)) if e == NOW => {
            let within = a
                .as_str()
                .and_then(|s| s.parse::<Timestamp>().ok())
                .is_some_and(|t| t >= from && t <= to);
            if !within {
                bad.push(format!("{path}: {a} is not within [{from}, {to}]"));
            }
            // Said once: the comparison that follows sees it as planned.
            *a = Value::String(NOW.into());
        }
        _ => {}
    }
}

fn diff(actual: &Value, expected: &Value, path: &str, out: &mut Vec<String>) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for k in a.keys().chain(e.keys().filter(|k| !a.contains_key(*k))) {
                match (a.get(k), e.get(k)) {
                    (Some(av), Some(ev)) => diff(av, ev, &format!("{path}/{k}"), out),
                    (av, ev) => out.push(format!("{path}/{k}: got {av:?}, planned {ev:?}")),
                }
            }
        }
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => {
            for (i, (av, ev)) in a.iter().zip(e).enumerate() {
                diff(av, ev, &format!("{path}/{i}"), out);
            }
        }
        (a, e) if a != e => out.push(format!("{path}: got {a}, planned {e}")),
        _ => {}
    }
}

/// A kill moment drawn uniformly from `[0, over)` by a generator seeded with `seed`, so a
/// trial is replayed by its seed.
pub fn kill_moment(seed: u64, over: Duration) -> Duration {
    over.mul_f64(fastrand::Rng::with_seed(seed).f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_moment_within_the_span() {
        let over = Duration::from_secs(30);
        let moments: Vec<Duration> = (0..200).map(|s| kill_moment(s, over)).collect();
        assert!(moments.iter().all(|m| *m < over));
        assert_eq!(kill_moment(7, over), kill_moment(7, over));
        // Spread over the span, not bunched at one end.
        assert!(moments.iter().any(|m| *m < over / 4));
        assert!(moments.iter().any(|m| *m > over * 3 / 4));
    }

    #[test]
    fn the_audit_lines_since_a_mark_survive_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "before\n").unwrap();
        let old = dir.path().join("audit-2026-01-01T00-00-00.000.log");
        std::fs::write(&old, "older file\n").unwrap();
        let mark = AuditMark::now(path.clone()).unwrap();
        let rotated = dir.path().join("audit-2026-12-03T10-22-20.663.log");
        std::fs::rename(&path, &rotated).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&rotated)
            .unwrap();
        std::io::Write::write_all(&mut file, b"after, rotated\n").unwrap();
        std::fs::write(&path, "after, new file\n").unwrap();
        let text = mark.lines_since().unwrap();
        let mut lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        lines.sort();
        // Not the rotated file before the mark, nor the marked file's earlier lines.
        assert_eq!(lines, ["after, new file", "after, rotated"]);
    }

    #[test]
    fn differences_ignore_server_fields_and_check_now_within_the_window() {
        let from: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let to: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let expected = json!({
            "metadata": {"name": "wf"},
            "status": {"startedAt": NOW, "phase": "Running"},
        });
        let actual = json!({
            "metadata": {"name": "wf", "resourceVersion": "9",
                         "annotations": {"rewind.dev/retry-status": "{}"}},
            "status": {"startedAt": "2026-01-01T00:00:30Z", "phase": "Running"},
        });
        assert!(differences(actual.clone(), expected.clone(), from, to).is_empty());
        let mut late = actual.clone();
        late["status"]["startedAt"] = json!("2026-01-01T00:05:00Z");
        assert_eq!(differences(late, expected.clone(), from, to).len(), 1);
        let mut other = actual;
        other["status"]["phase"] = json!("Failed");
        let found = differences(other, expected, from, to);
        assert!(found[0].contains("/status/phase"), "{found:?}");
    }
}
