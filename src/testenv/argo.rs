//! Argo's own workflow-controller against the local control plane, for end-to-end runs, and
//! a driver that decides how each of its pods ends.
//!
//! The controller is built from Argo's Go module by tools/argo/build.sh (cached like the
//! control plane) and runs as a child process with the admin's kubeconfig, leader election
//! off and metrics off. Pods need a cluster started with `Options { scheduling: true, .. }`:
//! kwok runs them, and [`Outcomes`] annotates each new pod with [`OUTCOME_ANNOTATION`], which
//! kwok's `pod-outcome-*` stages (localcluster/kwok-stages.yaml) turn into a finished pod,
//! Succeeded or Failed, with every container terminated.
//!
//! With [`Persistence`] the controller gets a `persistence` block on a database fixture
//! ([`crate::testenv::db::DbServer`]), its credentials in a Secret of its namespace; Argo
//! creates its tables with its own migration when it starts.

use std::collections::HashSet;
use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use tokio::task::JoinHandle;

use crate::argo::workflow::labels;
use crate::testenv::db;
use crate::testenv::localcluster::{self, LocalCluster, Role};
use crate::testenv::{IoError, io_error};

/// Set on a pod to `Succeeded` or `Failed`: kwok then finishes the running pod that way.
pub const OUTCOME_ANNOTATION: &str = "e2e.rewind.dev/outcome";
/// The namespace the controller runs "in": its ConfigMap lives there.
pub const CONTROLLER_NAMESPACE: &str = "argo";
const CONFIGMAP: &str = "workflow-controller-configmap";
const BUILD_SCRIPT: &str = "tools/argo/build.sh";
const STOP_GRACE: Duration = Duration::from_secs(10);
const CRD_TIMEOUT: Duration = Duration::from_secs(30);
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Which Argo release's controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// v4.1.4
    V4,
    /// v3.7.6
    V3,
}

impl Version {
    fn target(self) -> &'static str {
        match self {
            Version::V4 => "v4",
            Version::V3 => "v3",
        }
    }

    fn executor_image(self) -> &'static str {
        match self {
            Version::V4 => "quay.io/argoproj/argoexec:v4.1.4",
            Version::V3 => "quay.io/argoproj/argoexec:v3.7.6",
        }
    }
}

/// Why Argo's controller (or the driver) could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Build(#[from] crate::testenv::BuildError),

    #[error(transparent)]
    Io(#[from] IoError),

    #[error("Argo CRD {path} is not a valid CustomResourceDefinition: {source}")]
    Crd {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },

    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("{0}")]
    Cluster(#[from] localcluster::Error),

    #[error("{what} exited ({status}); last lines of {log}:\n{log_tail}")]
    ProcessExited {
        what: &'static str,
        status: ExitStatus,
        log: PathBuf,
        log_tail: String,
    },

    #[error("writing Argo's configuration as YAML: {0}")]
    Config(#[from] serde_yaml_ng::Error),

    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },

    #[error("logging {user} in through Argo's SSO and dex: {what}")]
    SsoLogin { user: String, what: String },

    #[error(
        "Argo's workflow-controller exited ({status}); last lines of {log}:\n{log_tail}\n\
         (check the ConfigMap, which Argo parses strictly, and the CRDs)"
    )]
    Exited {
        status: ExitStatus,
        log: PathBuf,
        log_tail: String,
    },
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// Builds (once; cached under ~/.cache/rewind) what tools/argo/build.sh makes for `target`
/// (`v4`, `v3` or `peer`) and returns the binary's path.
pub fn binary(target: &str) -> Result<PathBuf, Error> {
    Ok(crate::testenv::build_tool(BUILD_SCRIPT, &[target])?)
}

/// How to run the controller.
#[derive(Clone, Debug)]
pub struct Options {
    pub version: Version,
    /// Watch only this namespace (`--namespaced --managed-namespace`); `None` watches all.
    pub managed_namespace: Option<String>,
    /// The controller's client budget (`--qps`, `--burst`); Argo's defaults are 20/30.
    pub qps: u32,
    pub burst: u32,
    /// Argo's `instanceID`: serve only workflows labelled
    /// `workflows.argoproj.io/controller-instanceid` with it (`None`: only unlabelled ones),
    /// so controllers of two versions can share a cluster.
    pub instance_id: Option<String>,
    /// Argo's `persistence` block; `None`: no database.
    pub persistence: Option<Persistence>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            version: Version::V4,
            managed_namespace: None,
            qps: 20,
            burst: 30,
            instance_id: None,
            persistence: None,
        }
    }
}

/// Argo's `persistence` block on a database fixture.
#[derive(Clone, Debug)]
pub struct Persistence {
    /// The database part ([`db::DbServer::argo_db_config`]); its Secret
    /// ([`db::CREDENTIALS_SECRET`]) is created in the controller's namespace.
    pub database: serde_json::Value,
    /// `archive: true`: Argo archives every completed workflow.
    pub archive: bool,
    /// `nodeStatusOffLoad: true`, and `ALWAYS_OFFLOAD_NODE_STATUS=true` in the controller's
    /// environment so that a small workflow's nodes are offloaded too.
    pub offload: bool,
}

/// A running workflow-controller. Stop it with [`ArgoController::stop`]; dropping it kills it.
pub struct ArgoController {
    child: Option<Child>,
    dir: tempfile::TempDir,
    configmap: String,
}

impl ArgoController {
    /// Installs the CRDs the controller watches, its namespace and ConfigMap (once per
    /// cluster; a second start reuses them), and starts it with the admin's credentials.
    pub async fn start(cluster: &LocalCluster, options: &Options) -> Result<Self, Error> {
        let binary = tokio::task::spawn_blocking({
            let target = options.version.target();
            move || binary(target)
        })
        .await
        .expect("the build thread does not panic")?;
        let crd_dir = binary.with_file_name("crds");
        install_crds(&cluster.admin_client(), &crd_dir).await?;
        let configmap = install_config(
            cluster,
            options.instance_id.as_deref(),
            options.persistence.as_ref(),
        )
        .await?;

        let dir = tempfile::Builder::new()
            .prefix("rewind-argo-")
            .tempdir()
            .map_err(io_error(
                "creating a temporary directory in",
                std::env::temp_dir(),
            ))?;
        let log = dir.path().join("workflow-controller.log");
        let out = File::create(&log).map_err(io_error("creating", &log))?;
        let err = out.try_clone().map_err(io_error("opening", &log))?;
        let mut command = Command::new(&binary);
        command
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path(Role::Admin))
            .args(["--namespace", CONTROLLER_NAMESPACE])
            .args(["--configmap", &configmap])
            .args(["--executor-image", options.version.executor_image()])
            .args(["--qps", &options.qps.to_string()])
            .args(["--burst", &options.burst.to_string()])
            .args(["--loglevel", "info"])
            .env("LEADER_ELECTION_DISABLE", "true")
            // The workflow queue's rate limiter waits 10 s by default, which makes a small
            // workflow take tens of seconds; 1 s changes when it runs, not what it does.
            .env("DEFAULT_REQUEUE_TIME", "1s")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        if let Some(namespace) = &options.managed_namespace {
            command.args(["--namespaced", "--managed-namespace", namespace]);
        }
        if options.persistence.as_ref().is_some_and(|p| p.offload) {
            command.env("ALWAYS_OFFLOAD_NODE_STATUS", "true");
        }
        let child = spawn_tied(&mut command).map_err(io_error("starting", &binary))?;
        tracing::info!(pid = child.id(), version = ?options.version, log = %log.display(), "Argo's workflow-controller started");
        let mut controller = ArgoController {
            child: Some(child),
            dir,
            configmap,
        };
        controller.wait_started().await?;
        Ok(controller)
    }

    /// Its ConfigMap as `NAMESPACE/NAME` (what rewind's `--argo-configmap` takes).
    pub fn configmap(&self) -> String {
        format!("{CONTROLLER_NAMESPACE}/{}", self.configmap)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("workflow-controller.log")
    }

    /// An error if the controller has exited.
    pub fn check_running(&mut self) -> Result<(), Error> {
        let log = self.log_path();
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        match child.try_wait().map_err(io_error("waiting for", &log))? {
            Some(status) => Err(Error::Exited {
                status,
                log_tail: log_tail(&log),
                log,
            }),
            None => Ok(()),
        }
    }

    /// Waits until the controller has read its configuration and starts its informers
    /// (it logs no line once they have synced; workflows created earlier wait for that).
    async fn wait_started(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + START_TIMEOUT;
        let log = self.log_path();
        loop {
            self.check_running()?;
            let text = fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Starting Workflow Controller") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "Argo's workflow-controller to start; its log:\n{}",
                        log_tail(&log)
                    ),
                    waited: START_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; removes the log directory. An error if it had
    /// already exited on its own.
    pub async fn stop(mut self) -> Result<(), Error> {
        let result = self.check_running();
        if let Some(child) = self.child.take() {
            tokio::task::spawn_blocking(move || stop(child))
                .await
                .expect("the stop thread does not panic");
        }
        result
    }
}

impl Drop for ArgoController {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `command`, killed with us if this thread (a runtime worker) or the process dies first.
pub(crate) fn spawn_tied(command: &mut Command) -> std::io::Result<Child> {
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// SIGTERM, then SIGKILL after 10 s.
pub(crate) fn stop(mut child: Child) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; the child is not reaped yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::warn!(
        pid,
        "a child process did not stop after SIGTERM; killing it"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The last 30 lines of a log, for an error message.
pub fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| format!("(cannot read: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Every CRD in `dir` (server-side apply, so the ones the cluster already has are kept).
async fn install_crds(client: &kube::Client, dir: &Path) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("reading", dir))? {
        let path = entry.map_err(io_error("reading", dir))?.path();
        let yaml = fs::read_to_string(&path).map_err(io_error("reading", &path))?;
        let crd: CustomResourceDefinition =
            serde_yaml_ng::from_str(&yaml).map_err(|source| Error::Crd {
                path: path.clone(),
                source,
            })?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("rewind-testenv-argo").force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(kube_err(format!("installing CRD {name}")))?;
        names.push(name);
    }
    let deadline = Instant::now() + CRD_TIMEOUT;
    for name in names {
        loop {
            let crd = api
                .get(&name)
                .await
                .map_err(kube_err(format!("reading CRD {name}")))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("CRD {name} to be Established"),
                    waited: CRD_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// The controller's namespace and ConfigMap (one per instance ID): metrics off (their port
/// is fixed), the instance ID, the persistence block (with the Secret it names), nothing
/// else. Returns the ConfigMap's name.
pub async fn install_config(
    cluster: &LocalCluster,
    instance_id: Option<&str>,
    persistence: Option<&Persistence>,
) -> Result<String, Error> {
    let name = match instance_id {
        Some(id) => format!("{CONFIGMAP}-{id}"),
        None => CONFIGMAP.to_owned(),
    };
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.admin_client(), CONTROLLER_NAMESPACE);
    if configmaps
        .get_opt(&name)
        .await
        .map_err(kube_err("reading Argo's ConfigMap"))?
        .is_some()
    {
        return Ok(name);
    }
    let namespaces: Api<Namespace> = Api::all(cluster.admin_client());
    if namespaces
        .get_opt(CONTROLLER_NAMESPACE)
        .await
        .map_err(kube_err("reading Argo's namespace"))?
        .is_none()
    {
        cluster.create_namespace(CONTROLLER_NAMESPACE).await?;
    }
    let mut config = serde_json::json!({
        "metricsConfig": {"enabled": false},
        "telemetryConfig": {"enabled": false},
    });
    if let Some(id) = instance_id {
        config["instanceID"] = id.into();
    }
    if let Some(persistence) = persistence {
        let mut block = persistence.database.clone();
        block["archive"] = persistence.archive.into();
        block["nodeStatusOffLoad"] = persistence.offload.into();
        config["persistence"] = block;
        install_credentials(cluster).await?;
    }
    let configmap = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        data: Some([("config".to_owned(), serde_yaml_ng::to_string(&config)?)].into()),
        ..Default::default()
    };
    configmaps
        .create(&PostParams::default(), &configmap)
        .await
        .map_err(kube_err(format!(
            "creating ConfigMap {CONTROLLER_NAMESPACE}/{name}"
        )))?;
    Ok(name)
}

/// The database fixture's user and password, in the Secret its persistence block names
/// (once: controllers sharing the database share it).
async fn install_credentials(cluster: &LocalCluster) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(cluster.admin_client(), CONTROLLER_NAMESPACE);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(db::CREDENTIALS_SECRET.to_owned()),
            ..Default::default()
        },
        string_data: Some(
            [
                ("username".to_owned(), db::USER.to_owned()),
                ("password".to_owned(), db::PASSWORD.to_owned()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    secrets
        .patch(
            db::CREDENTIALS_SECRET,
            &PatchParams::apply("rewind-testenv-argo").force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(kube_err(format!(
            "creating Secret {CONTROLLER_NAMESPACE}/{}",
            db::CREDENTIALS_SECRET
        )))?;
    Ok(())
}

/// Decides how Argo's pods end (those `pods` reaches: a namespace's, or all): the first pod
/// of each node for which the rule returns true fails, every other pod succeeds. A node's
/// later pods (after a retry, or a new attempt of a retryStrategy) therefore succeed.
pub struct Outcomes {
    task: JoinHandle<()>,
}

/// Which nodes' first pod fails: gets the workflow name and the node name.
pub type FailFirst = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

impl Outcomes {
    pub fn start(pods: Api<Pod>, fail_first: FailFirst) -> Self {
        let task = tokio::spawn(drive(pods, fail_first));
        Outcomes { task }
    }
}

impl Drop for Outcomes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn drive(pods: Api<Pod>, fail_first: FailFirst) {
    let config = watcher::Config::default().labels(labels::WORKFLOW);
    // By namespace too: `pods` may reach every namespace, where workflows' names repeat.
    let mut seen_nodes: HashSet<(String, String, String)> = HashSet::new();
    let mut decided: HashSet<String> = HashSet::new();
    let mut events = std::pin::pin!(watcher(pods.clone(), config));
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(error) => {
                tracing::debug!(%error, "watching Argo's pods; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let meta = &pod.metadata;
        let uid = meta.uid.clone().unwrap_or_default();
        let annotations = meta.annotations.clone().unwrap_or_default();
        if annotations.contains_key(OUTCOME_ANNOTATION) || !decided.insert(uid) {
            continue;
        }
        let workflow = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::WORKFLOW))
            .cloned()
            .unwrap_or_default();
        let node = annotations
            .get(labels::NODE_NAME)
            .cloned()
            .unwrap_or_default();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let first = seen_nodes.insert((namespace.clone(), workflow.clone(), node.clone()));
        let outcome = if first && fail_first(&workflow, &node) {
            "Failed"
        } else {
            "Succeeded"
        };
        let name = meta.name.clone().unwrap_or_default();
        tracing::debug!(pod = %name, %workflow, %node, first, outcome, "pod outcome");
        // The pod's own namespace: `pods` may reach all of them, and patches need one.
        let pods: Api<Pod> = Api::namespaced(pods.clone().into_client(), &namespace);
        // Concurrent, so a burst of new pods is not served one round trip at a time.
        tokio::spawn(async move {
            let patch =
                serde_json::json!({"metadata": {"annotations": {OUTCOME_ANNOTATION: outcome}}});
            if let Err(error) = pods
                .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(pod = %name, %error, "cannot set the pod's outcome");
            }
        });
    }
}
