//! Rule 4 with a real crash, for an archived retry: the `rewind controller` binary, which reads
//! Argo's database from Argo's ConfigMap (PostgreSQL, the row written by Argo's own code), is
//! SIGKILLed (a) while it deletes the leftover pods, before the create, and (b) after the
//! create, before the status says so. A ValidatingAdmissionPolicy that refuses any status
//! naming the created workflow's UID holds the binary at point (b) until it is killed; the
//! test then removes the policy. Restarted each time, the binary creates the workflow exactly
//! once and the request ends Succeeded.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use rewind::argo::workflow::Workflow;
use rewind::protocol::crd::{CREATED_BY, WorkflowRetry};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::db::Kind;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use rewind::testenv::trials::{CONFIGMAP, install_argo_config};
use rewind::testenv::workload::FailedDag;
use tokio::process::Child;

use crate::support::archived::{Archive, Archived};
use crate::support::argodb::argo_db;
use crate::support::controller as ctl;
use crate::support::process::{self, read};
use crate::support::refusal::{StatusRefusal, refused_status_writes};
use crate::support::workflowretry::{archived, phase_and_message};

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
    let old = Archived::create(&cluster, &namespace, dag, Archive::Argo(&db)).await?;
    let (name, plan) = (&old.name, &old.plan);

    let request = retries
        .create(&PostParams::default(), &archived(REQUEST, &old.uid))
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
        workflows.get_opt(name).await?.is_none(),
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
            .get_metadata_opt(name)
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
    let first = workflows.get(name).await?;
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
    let after = workflows.get(name).await?;
    ensure!(
        after.uid() == first.uid()
            && after.uid() != Some(old.uid.clone())
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
                && a.name == *name
        })
        .map(|a| a.code)
        .collect();
    ensure!(
        creates == [201],
        "expected exactly one create of workflow {} by the controller, the audit log has codes {creates:?}",
        name
    );
    ensure!(
        present(&pods, &plan.pods_to_delete).await? == 0,
        "plan pods were left behind"
    );
    ensure!(
        present(&pods, &old.kept).await? == old.kept.len(),
        "pods outside the plan were deleted"
    );
    db.stop();
    Ok(())
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
    let configmap = format!("{namespace}/{CONFIGMAP}");
    let qps = qps.to_string();
    let args = ["--argo-configmap", &configmap, "--no-bulk"];
    let tuning = ["--qps", &qps, "--burst", "1"];
    process::spawn_controller(cluster, &[namespace], log, &[&args[..], &tuning].concat())
}
