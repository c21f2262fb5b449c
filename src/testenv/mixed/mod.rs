//! Randomized trials (issue 34): requests of every kind, overlapping and some on the same
//! workflow, against two `rewind controller` replicas that elect a leader, both reaching the
//! API server through the fault proxy, while faults drawn at random come and go and the
//! leader is killed with SIGKILL; then the invariants are checked. A trial's whole script
//! (what is asked, which faults, which kills, and when) follows from its seed, printed so a
//! failure replays.
//!
//! Each trial has a live failed workflow ([`LIVE`]) and an archived one ([`ARCHIVED`], in
//! Argo's archive on PostgreSQL, deleted from the cluster). Asked through the workflow's
//! annotation as `kubectl annotate` does, through WorkflowRetries, and through Argo's retry
//! API on either replica (server auth mode: the call acts as the Argo Server's
//! ServiceAccount, which rewind authorizes with a SubjectAccessReview). The invariants:
//! - every request ends (Succeeded, or Failed with a message) within [`END_BOUND`] of the
//!   last fault or restart;
//! - no pod is removed but the plans' own (by UID, from a watch begun before the requests);
//! - each workflow is reset (live) or created (archived) at most once, exactly once if a
//!   request on it succeeded, and then it is the planner's and its plan pods are gone;
//! - a user's own annotation on the workflow survives;
//! - each request's last written status agrees with what landed: the WorkflowRetry whose
//!   archived create landed ended Succeeded, whether or not the answers to its writes came
//!   back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{
    Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::argo::workflow::Workflow;
use crate::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use crate::protocol::request::{self, RetryPhase, annotations};
use crate::testenv::faultproxy::{FaultProxy, RuleId};
use crate::testenv::free_port;
use crate::testenv::io_error;
use crate::testenv::ledger::{PodLedger, current_version};
use crate::testenv::localcluster::Role;
use crate::testenv::trials::{AuditMark, Bench, CONFIGMAP, Prepared, Target, TrialError, kube};

mod script;

pub use script::{Ask, Disturbance, FaultKind, Script, Via};

/// The live workflow of a trial.
pub const LIVE: &str = "wf-live";
/// The archived workflow of a trial.
pub const ARCHIVED: &str = "wf-arch";
const LEASE: &str = "rewind";
/// The token a user's `kubectl annotate` asks with.
const USER_TOKEN: &str = "user-1";
/// A user's own annotation on the live workflow, which no request may lose.
const USER_ANNOTATION: (&str, &str) = ("example.com/team", "data");
/// The Argo Server's ServiceAccount, as which Argo API calls act (server auth mode).
const ARGO_SERVER: &str = "argo-server";
/// Issue 34: each request ends within 60 s of the last restart (here, of the last fault too).
pub const END_BOUND: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
/// How long a replica that exited by itself stays down.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// What one randomized trial saw.
#[derive(Debug)]
pub struct MixedOutcome {
    pub script: Script,
    /// Each request, its phase at the end (None: it never ended) and message.
    pub requests: Vec<(String, Option<RetryPhase>, String)>,
    /// The Argo API calls' HTTP answers (0: the call was cut, e.g. by a kill).
    pub calls: Vec<u16>,
    /// Resets of the live workflow and creates of the archived one.
    pub resets: (usize, usize),
    /// From the last fault or restart until the last request ended.
    pub settled_after: Option<Duration>,
    pub failures: Vec<String>,
}

impl MixedOutcome {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Randomized trials over [`Bench`]'s cluster, binary, workload sizes and archive.
pub struct Mixed<'a> {
    pub bench: Bench<'a>,
    /// The span requests, faults and kills are drawn over.
    pub span: Duration,
    /// The replicas' Lease duration.
    pub lease: Duration,
}

/// The trial's replicas of the controller, and how often they were started.
struct Replicas {
    namespace: String,
    kubeconfig: PathBuf,
    running: Vec<Replica>,
    started: usize,
    /// When one was last started after a kill or an exit.
    last_restart: Instant,
}

impl Replicas {
    /// Starts a replica named `name`, or after the first two, a new name.
    fn start(&mut self, mixed: &Mixed<'_>, name: &str) -> Result<(), TrialError> {
        let name = match name.is_empty() {
            true => format!("r{}", self.started - 1),
            false => name.to_owned(),
        };
        self.started += 1;
        let replica = mixed.spawn(&self.namespace, &name, &self.kubeconfig)?;
        self.running.push(replica);
        if self.started > 2 {
            self.last_restart = Instant::now();
        }
        Ok(())
    }

    /// Kills the Lease's holder (or, with none, the oldest replica) with SIGKILL.
    async fn kill_leader(&mut self, admin: &kube::Client) -> Result<(), TrialError> {
        if self.running.is_empty() {
            return Ok(());
        }
        let holder = lease_holder(admin, &self.namespace).await?;
        let victim = self
            .running
            .iter()
            .position(|r| Some(&r.name) == holder.as_ref())
            .unwrap_or_default();
        let mut replica = self.running.remove(victim);
        let _ = replica.child.start_kill();
        let _ = replica.child.wait().await;
        Ok(())
    }

    /// Starts again, a second later, each replica that exited by itself (one that lost its
    /// Lease exits), as Kubernetes restarts a pod's container.
    fn supervise(&mut self, mixed: &Mixed<'_>) -> Result<(), TrialError> {
        let mut exited = Vec::new();
        for (i, replica) in self.running.iter_mut().enumerate() {
            match replica.exited {
                Some(at) if at.elapsed() >= RESTART_DELAY => exited.push(i),
                Some(_) => {}
                None => {
                    let status = replica
                        .child
                        .try_wait()
                        .map_err(io_error("waiting for", &mixed.bench.binary))?;
                    if status.is_some() {
                        replica.exited = Some(Instant::now());
                    }
                }
            }
        }
        for i in exited.into_iter().rev() {
            self.running.remove(i);
            self.start(mixed, "")?;
        }
        Ok(())
    }

    /// The Argo API port of the running replica request `i` goes to (in turn, so a seed
    /// replays); none while all are down.
    fn port_for(&self, i: usize) -> Option<u16> {
        (!self.running.is_empty()).then(|| self.running[i % self.running.len()].api_port)
    }

    async fn stop(self) {
        for mut r in self.running {
            let _ = r.child.start_kill();
            let _ = r.child.wait().await;
        }
    }
}

/// A replica of the controller.
struct Replica {
    name: String,
    child: Child,
    api_port: u16,
    /// When it was seen to have exited by itself.
    exited: Option<Instant>,
}

impl Mixed<'_> {
    /// Runs the trial `seed` in a fresh `namespace` and checks it.
    pub async fn trial(&self, namespace: &str, seed: u64) -> Result<MixedOutcome, TrialError> {
        let script = Script::draw(seed, self.span, self.lease);
        let cluster = self.bench.cluster;
        let admin = cluster.admin_client();
        cluster.create_namespace(namespace).await?;
        let mut live = self.bench.prepare(namespace, LIVE, Target::Live).await?;
        let archived = self
            .bench
            .prepare(namespace, ARCHIVED, Target::Archived)
            .await?;
        let workflows: Api<Workflow> = Api::namespaced(admin.clone(), namespace);
        let mark = json!({"metadata": {"annotations": {USER_ANNOTATION.0: USER_ANNOTATION.1}}});
        workflows
            .patch_metadata(LIVE, &PatchParams::default(), &Patch::Merge(&mark))
            .await
            .map_err(kube("annotating the live workflow"))?;
        // Argo's retry keeps the workflow's annotations.
        live.plan
            .workflow
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(USER_ANNOTATION.0.into(), USER_ANNOTATION.1.into());
        grant_argo_server(&admin, namespace).await?;

        let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
        let mut planned = BTreeSet::new();
        for p in [&live, &archived] {
            let present = self.bench.present(namespace, &p.name).await?;
            planned.extend(
                p.plan
                    .pods_to_delete
                    .iter()
                    .filter_map(|name| present.get(name).cloned()),
            );
        }
        let ledger = PodLedger::start(pods.clone()).await?;
        let before = current_version(&pods).await?;
        let statuses = StatusLedger::start(workflows.clone(), USER_TOKEN).await?;
        let audit = cluster
            .audit_log_path()
            .ok_or_else(|| TrialError::Run("the control plane writes no audit log".into()))?;
        let audit_from = AuditMark::now(audit)?;
        let from = Timestamp::now() - SignedDuration::from_secs(1);

        let proxy = FaultProxy::start(cluster)
            .await
            .map_err(|e| TrialError::Run(format!("starting the fault proxy: {e}")))?;
        let kubeconfig = self.proxy_kubeconfig(namespace, &proxy.url())?;
        let mut replicas = Replicas {
            namespace: namespace.to_owned(),
            kubeconfig,
            running: Vec::new(),
            started: 0,
            last_restart: Instant::now(),
        };
        for name in ["a", "b"] {
            replicas.start(self, name)?;
        }

        let plan_pod = live
            .plan
            .pods_to_delete
            .first()
            .cloned()
            .unwrap_or_default();
        let t0 = Instant::now();
        let mut timeline: Vec<(Duration, Step)> = Vec::new();
        for (i, ask) in script.asks.iter().enumerate() {
            timeline.push((ask.at, Step::Ask(i)));
        }
        for (i, d) in script.disturbances.iter().enumerate() {
            match d {
                Disturbance::Fault { at, lasts, .. } => {
                    timeline.push((*at, Step::Fault(i)));
                    timeline.push((*at + *lasts, Step::Heal(i)));
                }
                Disturbance::Kill { at, down } => {
                    timeline.push((*at, Step::Kill));
                    timeline.push((*at + *down, Step::Restart));
                }
            }
        }
        timeline.sort_by_key(|(at, _)| *at);
        let mut rules: BTreeMap<usize, (Vec<RuleId>, CancellationToken)> = BTreeMap::new();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let mut call_tasks = Vec::new();
        replicas.last_restart = t0;
        for (at, step) in timeline {
            while Instant::now() < t0 + at {
                replicas.supervise(self)?;
                tokio::time::sleep(POLL.min((t0 + at).saturating_duration_since(Instant::now())))
                    .await;
            }
            match step {
                Step::Ask(i) => {
                    let port = replicas.port_for(i);
                    let call = self
                        .ask(
                            namespace,
                            i,
                            &script.asks[i],
                            &archived.old_uid,
                            port,
                            &calls,
                        )
                        .await?;
                    call_tasks.extend(call);
                }
                Step::Fault(i) => {
                    if let Disturbance::Fault { kind, .. } = &script.disturbances[i] {
                        let healed = CancellationToken::new();
                        let ids = kind
                            .rules(namespace, &plan_pod, &before, &healed)
                            .into_iter()
                            .map(|r| proxy.add(r))
                            .collect();
                        rules.insert(i, (ids, healed));
                    }
                }
                Step::Heal(i) => {
                    if let Some((ids, healed)) = rules.remove(&i) {
                        for id in ids {
                            proxy.remove(id);
                        }
                        healed.cancel();
                    }
                }
                Step::Kill => replicas.kill_leader(&admin).await?,
                Step::Restart => replicas.start(self, "")?,
            }
        }

        // Every request's end, by the bound.
        let requests = loop {
            replicas.supervise(self)?;
            let calm = (t0 + script.calm_from()).max(replicas.last_restart);
            let deadline = calm + END_BOUND;
            let requests = self.requests(namespace, &statuses, &script).await?;
            let open = requests.iter().any(|(_, phase, _)| phase.is_none());
            if !open || Instant::now() > deadline {
                break requests;
            }
            tokio::time::sleep(POLL).await;
        };
        let calm = (t0 + script.calm_from()).max(replicas.last_restart);
        let settled_after = requests
            .iter()
            .all(|(_, p, _)| p.is_some())
            .then(|| Instant::now().saturating_duration_since(calm));
        for task in call_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        // The API server logs a write once answered: a moment for the last ones.
        tokio::time::sleep(Duration::from_secs(1)).await;
        replicas.stop().await;
        let to = Timestamp::now() + SignedDuration::from_secs(1);
        drop(proxy);

        let mut failures = Vec::new();
        if settled_after.is_none() {
            failures.push(self.state(namespace).await?);
        }
        for (name, phase, message) in &requests {
            match phase {
                None => failures.push(format!(
                    "request {name} did not end within {END_BOUND:?} of the last disturbance: {message}"
                )),
                Some(RetryPhase::Failed) if message.trim().is_empty() => {
                    failures.push(format!("request {name} failed without a message"))
                }
                _ => {}
            }
        }
        let outside = ledger.removed_outside(&planned).await?;
        if !outside.is_empty() {
            failures.push(format!(
                "pods removed that were in no plan (name, uid): {outside:?}"
            ));
        }
        let mut resets = (0, 0);
        for (prepared, count) in [(&live, &mut resets.0), (&archived, &mut resets.1)] {
            let succeeded = requests.iter().any(|(name, phase, _)| {
                *phase == Some(RetryPhase::Succeeded) && on(name, prepared.target)
            });
            let (_, n) = self.bench.resets(&audit_from, namespace, prepared).await?;
            *count = n;
            failures.extend(
                self.check_end(namespace, prepared, n, succeeded, from, to)
                    .await?,
            );
        }
        failures.extend(self.answers_agree(namespace, &requests).await?);
        let now = workflows
            .get_metadata_opt(LIVE)
            .await
            .map_err(kube("reading the live workflow"))?;
        if now
            .as_ref()
            .and_then(|w| w.annotations().get(USER_ANNOTATION.0))
            .map(String::as_str)
            != Some(USER_ANNOTATION.1)
        {
            failures.push(format!(
                "the user's annotation {}={} on {LIVE} was lost",
                USER_ANNOTATION.0, USER_ANNOTATION.1
            ));
        }
        let calls = calls.lock().expect("not poisoned").clone();
        Ok(MixedOutcome {
            script,
            requests,
            calls,
            resets,
            settled_after,
            failures,
        })
    }

    /// Asks request `i` of the script as `ask` says (`uid`: the archived workflow's); an Argo
    /// API call goes to `port` and runs on while the trial goes on, its answer put in `calls`.
    async fn ask(
        &self,
        namespace: &str,
        i: usize,
        ask: &Ask,
        uid: &str,
        port: Option<u16>,
        calls: &Arc<Mutex<Vec<u16>>>,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, TrialError> {
        let admin = self.bench.cluster.admin_client();
        match ask.via {
            Via::Annotation => {
                let patch = json!({"metadata": {"annotations": {annotations::RETRY: USER_TOKEN}}});
                Api::<Workflow>::namespaced(admin, namespace)
                    .patch_metadata(LIVE, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube("asking through the annotation"))?;
                Ok(None)
            }
            Via::WorkflowRetry => {
                let spec = match ask.target {
                    Target::Live => WorkflowRetrySpec {
                        workflow_name: Some(LIVE.into()),
                        ..Default::default()
                    },
                    Target::Archived => WorkflowRetrySpec {
                        archived_workflow_uid: Some(uid.to_owned()),
                        ..Default::default()
                    },
                };
                Api::<WorkflowRetry>::namespaced(admin, namespace)
                    .create(
                        &PostParams::default(),
                        &WorkflowRetry::new(&format!("ask-{i}"), spec),
                    )
                    .await
                    .map_err(kube("creating a WorkflowRetry"))?;
                Ok(None)
            }
            Via::ArgoApi => {
                let Some(port) = port else {
                    // Every replica is down: the call is refused.
                    calls.lock().expect("not poisoned").push(0);
                    return Ok(None);
                };
                let (path, body) = match ask.target {
                    Target::Live => (
                        format!("/api/v1/workflows/{namespace}/{LIVE}/retry"),
                        json!({"name": LIVE, "namespace": namespace}),
                    ),
                    Target::Archived => (
                        format!("/api/v1/archived-workflows/{uid}/retry"),
                        json!({"uid": uid, "namespace": namespace}),
                    ),
                };
                let url = format!("http://127.0.0.1:{port}{path}");
                let calls = calls.clone();
                Ok(Some(tokio::spawn(async move {
                    let code = put(&url, &body).await;
                    calls.lock().expect("not poisoned").push(code);
                })))
            }
        }
    }

    /// One workflow's end: written at most once; once exactly, and as planned with its
    /// plan pods gone, if a request on it succeeded.
    async fn check_end(
        &self,
        namespace: &str,
        prepared: &Prepared,
        resets: usize,
        succeeded: bool,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<String>, TrialError> {
        let name = &prepared.name;
        let mut failures = Vec::new();
        if resets > 1 {
            failures.push(format!(
                "{name} was written {resets} times by the controller"
            ));
        }
        if succeeded != (resets == 1) {
            failures.push(format!(
                "{name}: a request on it succeeded: {succeeded}, yet the controller wrote it {resets} times"
            ));
        }
        if succeeded {
            failures.extend(
                self.bench
                    .check_workflow(namespace, prepared, from, to)
                    .await?
                    .into_iter()
                    .map(|f| format!("{name}: {f}")),
            );
            let after = self.bench.present(namespace, name).await?;
            let left = prepared
                .plan
                .pods_to_delete
                .iter()
                .filter(|p| after.contains_key(*p))
                .count();
            if left > 0 {
                failures.push(format!("{name}: {left} plan pods were left"));
            }
        }
        Ok(failures)
    }

    /// Each request's last written status agrees with what landed (issue 47): the
    /// WorkflowRetry that created the archived workflow (named in its
    /// `rewind.dev/created-by`) ended Succeeded, whether or not the answers to its create,
    /// its status writes and its finalizer's release came back. (That a reset live workflow
    /// has a request that succeeded, [`Mixed::check_end`] checks; which one reset it the
    /// workflow does not keep: a later request's answer marks its own token observed.)
    async fn answers_agree(
        &self,
        namespace: &str,
        requests: &[(String, Option<RetryPhase>, String)],
    ) -> Result<Vec<String>, TrialError> {
        let admin = self.bench.cluster.admin_client();
        let created = Api::<Workflow>::namespaced(admin.clone(), namespace)
            .get_metadata_opt(ARCHIVED)
            .await
            .map_err(kube("reading the archived workflow"))?;
        let Some(creator) = created
            .as_ref()
            .and_then(|w| w.annotations().get(crate::protocol::crd::CREATED_BY))
        else {
            return Ok(Vec::new());
        };
        let objects = Api::<WorkflowRetry>::namespaced(admin, namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube("listing the WorkflowRetries"))?;
        let Some(object) = objects.iter().find(|o| o.uid().as_ref() == Some(creator)) else {
            return Ok(Vec::new());
        };
        let name = format!("WorkflowRetry {} on ", object.name_any());
        Ok(requests
            .iter()
            .filter(|(n, phase, _)| n.starts_with(&name) && *phase != Some(RetryPhase::Succeeded))
            .map(|(n, phase, message)| {
                format!("request {n} created {ARCHIVED}, yet ended {phase:?}: {message}")
            })
            .collect())
    }

    /// What the requests left on the objects, said when one did not end: the live workflow's
    /// rewind annotations and each WorkflowRetry's status.
    async fn state(&self, namespace: &str) -> Result<String, TrialError> {
        let admin = self.bench.cluster.admin_client();
        let live = Api::<Workflow>::namespaced(admin.clone(), namespace)
            .get_metadata_opt(LIVE)
            .await
            .map_err(kube("reading the live workflow"))?;
        let ours: BTreeMap<&String, &String> = live
            .as_ref()
            .map(|w| {
                w.annotations()
                    .iter()
                    .filter(|(k, _)| k.starts_with("rewind.dev/"))
                    .collect()
            })
            .unwrap_or_default();
        let objects = Api::<WorkflowRetry>::namespaced(admin, namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube("listing the WorkflowRetries"))?;
        let statuses: Vec<String> = objects
            .iter()
            .map(|o| {
                format!(
                    "{} (uid {}): {}",
                    o.name_any(),
                    o.uid().unwrap_or_default(),
                    serde_json::to_string(&o.status).unwrap_or_default()
                )
            })
            .collect();
        Ok(format!(
            "state at the end: {LIVE} annotations {ours:?}; WorkflowRetries {statuses:?}"
        ))
    }

    /// Every request of the trial: the user's annotation (if asked) and each WorkflowRetry
    /// (asked directly or by an Argo API call), with its phase once it ended.
    async fn requests(
        &self,
        namespace: &str,
        statuses: &StatusLedger,
        script: &Script,
    ) -> Result<Vec<(String, Option<RetryPhase>, String)>, TrialError> {
        let mut out = Vec::new();
        if script.asks.iter().any(|a| a.via == Via::Annotation) {
            let (phase, message) = match statuses.ended() {
                Some((phase, message)) => (Some(phase), message),
                None => (None, String::new()),
            };
            out.push((format!("annotation {USER_TOKEN} on {LIVE}"), phase, message));
        }
        let objects =
            Api::<WorkflowRetry>::namespaced(self.bench.cluster.admin_client(), namespace)
                .list(&ListParams::default())
                .await
                .map_err(kube("listing the WorkflowRetries"))?;
        for object in objects {
            let status = object.status.clone().unwrap_or_default();
            let target = match object.spec.archived_workflow_uid {
                Some(_) => ARCHIVED,
                None => LIVE,
            };
            let phase = status.phase.filter(|p| p.is_finished());
            out.push((
                format!("WorkflowRetry {} on {target}", object.name_any()),
                phase,
                status.message,
            ));
        }
        Ok(out)
    }

    /// The controller's kubeconfig, pointed at the fault proxy.
    fn proxy_kubeconfig(&self, namespace: &str, url: &str) -> Result<PathBuf, TrialError> {
        let cluster = self.bench.cluster;
        let source = cluster.kubeconfig_path(Role::Controller);
        let text = std::fs::read_to_string(&source).map_err(io_error("reading", &source))?;
        if !text.contains(cluster.server_url()) {
            return Err(TrialError::Run(format!(
                "{} does not name the API server {}",
                source.display(),
                cluster.server_url()
            )));
        }
        let path = self.bench.logs.join(format!("{namespace}.kubeconfig"));
        std::fs::write(&path, text.replace(cluster.server_url(), url))
            .map_err(io_error("writing", &path))?;
        Ok(path)
    }

    /// A replica `name` serving `namespace` through `kubeconfig`, electing a leader on the
    /// trial's Lease and serving Argo's retry calls on a port of its own.
    fn spawn(&self, namespace: &str, name: &str, kubeconfig: &Path) -> Result<Replica, TrialError> {
        let log = self.bench.logs.join(format!("{namespace}-{name}.log"));
        let api_port =
            free_port().map_err(|e| TrialError::Run(format!("a port for the Argo API: {e}")))?;
        let child = self
            .bench
            .controller(namespace, kubeconfig, &log)?
            .arg("--leader-elect")
            .args(["--lease-namespace", namespace, "--lease-name", LEASE])
            .arg(format!("--lease-duration={}s", self.lease.as_secs()))
            .arg(format!("--argo-configmap={namespace}/{CONFIGMAP}"))
            .arg(format!("--argo-api-addr=127.0.0.1:{api_port}"))
            .args(["--argo-api-plaintext=true", "--argo-api-auth-mode=server"])
            .arg(format!(
                "--argo-server-service-account={namespace}/{ARGO_SERVER}"
            ))
            .args(&self.bench.controller_args)
            .env("POD_NAME", name)
            .spawn()
            .map_err(io_error("starting", &self.bench.binary))?;
        Ok(Replica {
            name: name.to_owned(),
            child,
            api_port,
            exited: None,
        })
    }
}

/// Whether the request named `name` (as [`Mixed::requests`] names them) is on `target`'s
/// workflow.
fn on(name: &str, target: Target) -> bool {
    match target {
        Target::Live => name.ends_with(LIVE),
        Target::Archived => name.ends_with(ARCHIVED),
    }
}

enum Step {
    Ask(usize),
    Fault(usize),
    Heal(usize),
    Kill,
    Restart,
}

/// The Argo Server's ServiceAccount, allowed everything in `namespace` (the calls act as
/// it; what it may do is not what these trials test).
async fn grant_argo_server(admin: &kube::Client, namespace: &str) -> Result<(), TrialError> {
    let meta = ObjectMeta {
        name: Some(ARGO_SERVER.into()),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta.clone(),
                ..Default::default()
            },
        )
        .await
        .map_err(kube("creating the Argo Server's ServiceAccount"))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": ARGO_SERVER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": ARGO_SERVER, "namespace": namespace}],
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .map_err(kube("binding the Argo Server's ServiceAccount"))?;
    Ok(())
}

async fn lease_holder(admin: &kube::Client, namespace: &str) -> Result<Option<String>, TrialError> {
    Ok(Api::<Lease>::namespaced(admin.clone(), namespace)
        .get_opt(LEASE)
        .await
        .map_err(kube("reading the Lease"))?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// `PUT url` with `body` as Argo's clients send it (curl, the Debian package); the HTTP
/// status, 0 when the call got no answer (its replica killed, or curl missing).
async fn put(url: &str, body: &serde_json::Value) -> u16 {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
        .args(["-H", "Content-Type: application/json", "--max-time", "180"])
        .args(["--data-binary", &body.to_string(), url])
        .output()
        .await;
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A request's end: its phase and message.
type Ended = (RetryPhase, String);

/// The last ended status of request `token` on the namespace's workflows, from a watch begun
/// before it was asked: a WorkflowRetry asked after it overwrites its report on the workflow.
struct StatusLedger {
    ended: Arc<Mutex<Option<Ended>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl StatusLedger {
    async fn start(workflows: Api<Workflow>, token: &str) -> Result<Self, TrialError> {
        let version = current_version(&workflows).await?;
        let mut events = workflows
            .watch_metadata(&WatchParams::default(), &version)
            .await
            .map_err(kube("watching workflows"))?
            .boxed();
        let ended = Arc::<Mutex<Option<Ended>>>::default();
        let sink = ended.clone();
        let token = token.to_owned();
        let watch = tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                let (WatchEvent::Added(meta) | WatchEvent::Modified(meta)) = event else {
                    continue;
                };
                if let Ok(Some(status)) = request::status_of(meta.annotations(), &token)
                    && status.phase.is_finished()
                {
                    *sink.lock().expect("not poisoned") = Some((status.phase, status.message));
                }
            }
        });
        Ok(Self { ended, watch })
    }

    fn ended(&self) -> Option<Ended> {
        self.ended.lock().expect("not poisoned").clone()
    }
}

impl Drop for StatusLedger {
    fn drop(&mut self) {
        self.watch.abort();
    }
}
