//! Rule 4 with a real crash, for an archived retry: the `rewind controller` binary, which reads
//! Argo's database from Argo's ConfigMap (PostgreSQL, the row written by Argo's own code), is
//! SIGKILLed (a) while it deletes the leftover pods, before the create, and (b) after the
//! create, before the status says so. A ValidatingAdmissionPolicy that refuses any status
//! naming the created workflow's UID holds the binary at point (b) until it is killed; the
//! test then removes the policy. Restarted each time, the binary creates the workflow exactly
//! once and the request ends Succeeded.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rewind::argo::workflow::Workflow;
use rewind::protocol::crd::{CREATED_BY, WorkflowRetry};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::db::Kind;
use rewind::testenv::localcluster::{self, CONTROLLER_NAME, LocalCluster};
use rewind::testenv::trials::{CONFIGMAP, install_argo_config};
use rewind::testenv::workload::{FailedDag, delete_workflow};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::support::controller as ctl;
use crate::workflowretry::{archived, create_held_pods, phase_and_message};
use crate::workflowretry_db::{argo, argo_db};

const REQUEST: &str = "retry-archived";
const WAIT: Duration = Duration::from_secs(60);

pub async fn an_archived_retry_killed_before_and_after_the_create_creates_the_workflow_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let db = argo_db(Kind::Postgres).await?;
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    install_argo_config(&cluster, &namespace, &db).await?;

    // Argo archives a failed workflow, which is deleted; its pods stay, held by Argo's finalizer.
    let dag = FailedDag {
        name: "wf".into(),
        failed: 40,
        succeeded: 3,
    };
    let created = workflows
        .create(&PostParams::default(), &dag.workflow(&namespace))
        .await?;
    create_held_pods(&pods, dag.pods(&created)).await?;
    let live = workflows.get(&dag.name).await?;
    let old_uid = live.uid().context("a created workflow has a UID")?;
    argo(db.archive_request(&live)).await?;
    ensure!(
        delete_workflow(&workflows, &dag.name, Duration::from_secs(20)).await?,
        "workflow {} was not deleted",
        dag.name
    );
    let plan = ctl::expected_plan(&live)?;
    let kept: Vec<String> = dag
        .pods(&created)
        .into_iter()
        .filter_map(|(p, _)| p.metadata.name)
        .filter(|p| !plan.pods_to_delete.contains(p))
        .collect();

    let request = retries
        .create(&PostParams::default(), &archived(REQUEST, &old_uid))
        .await?;
    let request_uid = request.uid().unwrap_or_default();
    let policy = StatusRefusal::install(&cluster, &namespace, &retries, REQUEST).await?;
    let logs = tempfile::tempdir()?;

    // (a) Killed while it deletes the leftovers: five writes a second, one pod at a time.
    let log = logs.path().join("run-a.log");
    let mut child = spawn_controller(&cluster, &namespace, &log, 5)?;
    let total = plan.pods_to_delete.len();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(exit) = child.try_wait()? {
            bail!("the controller exited by itself ({exit}):\n{}", read(&log));
        }
        if present(&pods, &plan.pods_to_delete).await? + 3 <= total {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller deleted no leftovers within {WAIT:?}:\n{}",
            read(&log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.start_kill()?;
    child.wait().await?;
    let left = present(&pods, &plan.pods_to_delete).await?;
    ensure!(
        0 < left && left < total,
        "kill (a) should fall while leftovers are deleted; {left} of {total} remain"
    );
    ensure!(
        workflows.get_opt(&dag.name).await?.is_none(),
        "the workflow was created before every leftover was gone"
    );

    // (b) Killed after the create: the policy refuses the status that would say so.
    let log = logs.path().join("run-b.log");
    let mut child = spawn_controller(&cluster, &namespace, &log, 50)?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(exit) = child.try_wait()? {
            bail!("the controller exited by itself ({exit}):\n{}", read(&log));
        }
        let created_by_us = workflows
            .get_metadata_opt(&dag.name)
            .await?
            .is_some_and(|w| w.annotations().get(CREATED_BY) == Some(&request_uid));
        if created_by_us && refused_status_writes(&cluster, &namespace, REQUEST)? > 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no create followed by a refused status write within {WAIT:?}:\n{}",
            read(&log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.start_kill()?;
    child.wait().await?;
    let (phase, message) = phase_and_message(&retries.get(REQUEST).await?);
    ensure!(
        phase != Some(RetryPhase::Succeeded),
        "the status should not say Succeeded before the restart: {message}"
    );
    let first = workflows.get(&dag.name).await?;
    policy.remove(&retries).await?;

    // Restarted: it finds the workflow it created and finishes the request.
    let log = logs.path().join("run-last.log");
    let mut child = spawn_controller(&cluster, &namespace, &log, 50)?;
    let finished = wait_finished(&retries, &mut child, &log).await;
    child.start_kill()?;
    child.wait().await?;
    let finished = finished?;
    let status = finished.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded),
        "expected the request to succeed: {status:?}"
    );
    let after = workflows.get(&dag.name).await?;
    ensure!(
        after.uid() == first.uid()
            && after.uid() != Some(old_uid.clone())
            && status.workflow_uid == after.uid()
            && after.annotation(CREATED_BY) == Some(request_uid.as_str()),
        "expected the workflow created in run (b) (UID {:?}, {CREATED_BY}={request_uid}) named in the status, found UID {:?}, annotation {:?}, status {:?}",
        first.uid(),
        after.uid(),
        after.annotation(CREATED_BY),
        status.workflow_uid
    );
    let creates: Vec<u16> = ctl::audit_log(&cluster, &namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "create"
                && a.resource == "workflows"
                && a.name == dag.name
        })
        .map(|a| a.code)
        .collect();
    ensure!(
        creates == [201],
        "expected exactly one create of workflow {} by the controller, the audit log has codes {creates:?}",
        dag.name
    );
    ensure!(
        present(&pods, &plan.pods_to_delete).await? == 0,
        "plan pods were left behind"
    );
    ensure!(
        present(&pods, &kept).await? == kept.len(),
        "pods outside the plan were deleted"
    );
    db.stop();
    Ok(())
}

/// A ValidatingAdmissionPolicy (and its binding) refusing, in one namespace, any
/// WorkflowRetry status that names a workflow UID: what an archived retry writes right after
/// its create.
pub struct StatusRefusal {
    name: String,
    admin: kube::Client,
    /// The WorkflowRetry whose dry-run status writes probe the policy.
    request: String,
}

impl StatusRefusal {
    /// Installs the policy and waits until the API server enforces it on WorkflowRetry
    /// `request`, which must exist.
    pub async fn install(
        cluster: &LocalCluster,
        namespace: &str,
        retries: &Api<WorkflowRetry>,
        request: &str,
    ) -> anyhow::Result<StatusRefusal> {
        let admin = cluster.admin_client();
        let name = format!("{namespace}-refuse-created-status");
        let rule = json!({
            "apiGroups": ["rewind.dev"], "apiVersions": ["v1alpha1"],
            "operations": ["UPDATE"], "resources": ["workflowretries/status"],
        });
        let refuse = "!has(object.status) || !has(object.status.workflowUID)";
        install_refusal(
            &admin,
            &name,
            namespace,
            rule,
            refuse,
            "a status naming the created workflow",
        )
        .await?;
        let this = StatusRefusal {
            name,
            admin,
            request: request.to_owned(),
        };
        this.wait_until(retries, true).await?;
        Ok(this)
    }

    pub async fn remove(self, retries: &Api<WorkflowRetry>) -> anyhow::Result<()> {
        remove_refusal(&self.admin, &self.name).await?;
        self.wait_until(retries, false).await
    }

    /// Waits until the API server enforces the policy (`refused`) or no longer does, probing
    /// with a dry-run status write on the request (the policy applies to dry runs too).
    async fn wait_until(&self, retries: &Api<WorkflowRetry>, refused: bool) -> anyhow::Result<()> {
        let probe = json!({"status": {"workflowUID": "probe"}});
        let params = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let write = || async {
            retries
                .patch_status(&self.request, &params, &Patch::Merge(&probe))
                .await
                .map(|_| ())
        };
        wait_refusal(write, refused).await
    }
}

/// Installs ValidatingAdmissionPolicy `name` (and its binding) refusing, in `namespace`, the
/// writes `rule` matches whose object fails CEL `expression`; it says it refuses `what`.
pub async fn install_refusal(
    admin: &kube::Client,
    name: &str,
    namespace: &str,
    rule: serde_json::Value,
    expression: &str,
    what: &str,
) -> anyhow::Result<()> {
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [rule],
            },
            "validations": [{"expression": expression, "message": format!("{REFUSES} {what}")}],
        },
    }))?;
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await?;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Deletes the policy [`install_refusal`] installed.
pub async fn remove_refusal(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// What the test's policies say when they refuse.
const REFUSES: &str = "the test refuses";

/// Waits until a dry-run `write` (the policies apply to dry runs too) is refused by a test's
/// policy (`refused`) or goes through, at most 30 s.
pub async fn wait_refusal<F, W>(write: W, refused: bool) -> anyhow::Result<()>
where
    W: Fn() -> F,
    F: std::future::Future<Output = Result<(), kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let result = write().await;
        match (&result, refused) {
            (Err(kube::Error::Api(s)), true) if s.message.contains(REFUSES) => return Ok(()),
            (Ok(()), false) => return Ok(()),
            _ => {}
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the policy is not {} after 30s: {result:?}",
            if refused { "enforced" } else { "gone" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Status writes of the controller on WorkflowRetry `request` that the API server refused.
pub fn refused_status_writes(
    cluster: &LocalCluster,
    namespace: &str,
    request: &str,
) -> anyhow::Result<usize> {
    Ok(ctl::audit_log(cluster, namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "patch"
                && a.resource == "workflowretries"
                && a.name == request
                && a.code >= 400
        })
        .count())
}

/// How many of `names` still exist.
async fn present(pods: &Api<Pod>, names: &[String]) -> anyhow::Result<usize> {
    let mut n = 0;
    for name in names {
        n += usize::from(pods.get_metadata_opt(name).await?.is_some());
    }
    Ok(n)
}

async fn wait_finished(
    retries: &Api<WorkflowRetry>,
    child: &mut Child,
    log: &Path,
) -> anyhow::Result<WorkflowRetry> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let object = retries.get(REQUEST).await?;
        if object.is_finished() {
            return Ok(object);
        }
        if let Some(exit) = child.try_wait()? {
            bail!("the controller exited by itself ({exit}):\n{}", read(log));
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the request did not finish within {WAIT:?}; its status: {:?}\n{}",
            object.status,
            read(log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The real binary, serving `namespace` with Argo's database from the ConfigMap there, at
/// `qps` single deletes a second.
fn spawn_controller(
    cluster: &LocalCluster,
    namespace: &str,
    log: &Path,
    qps: u32,
) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args([
            "--log-format",
            "json",
            "controller",
            "--namespace",
            namespace,
            "--http-addr",
            "127.0.0.1:0",
            "--argo-configmap",
            &format!("{namespace}/{CONFIGMAP}"),
            "--no-bulk",
        ])
        .args(["--qps", &qps.to_string(), "--burst", "1"])
        .env(
            "KUBECONFIG",
            cluster.kubeconfig_path(localcluster::Role::Controller),
        )
        .env("RUST_LOG", "info,kube=warn")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .context("starting the rewind binary")
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_else(|e| format!("(cannot read {}: {e})", log.display()))
}
