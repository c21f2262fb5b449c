//! Rule 7 after a restart on a cold cache: a live WorkflowRetry's request resumed while the
//! controller's initial list of workflows is still coming in. Requests start from the list's
//! first events, but the workflow cache is filled only once the whole list is in; a request
//! that looked at the cache meanwhile took its workflow for gone, wrote nothing, and the
//! WorkflowRetry stayed in DeletingPods forever.
//!
//! The window: the workflow under retry sorts first among 3,000 others, so it comes in the
//! first of seven pages of 500, and the restarted binary reads at one request a second, so
//! the list takes about ten seconds while the request, taking turns with it, reads, plans,
//! lists its pods and deletes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _, stream};
use kube::api::{Api, Patch, PatchParams, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::WorkflowRetry;
use rewind::protocol::request::{RetryPhase, annotations, workflowretry_token};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use rewind::testenv::workload::FailedDag;
use serde_json::json;

use crate::support::controller as ctl;
use crate::support::process::{read, spawn_controller};
use crate::support::refusal::{install_refusal, remove_refusal, wait_refusal};
use crate::support::workflowretry::live;

/// Workflows besides the one retried: seven pages of the watch's initial list.
const OTHERS: usize = 3_000;
/// How long the resumed request may take to end: the slow list, then the deletes left.
const END_WITHIN: Duration = Duration::from_secs(90);

pub async fn a_live_workflowretry_resumed_during_a_slow_initial_list_ends(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "a-wf".into(),
        failed: 40,
        succeeded: 3,
    };
    let created = dag.create(&admin, &namespace, 16, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let selector = format!("{}={}", labels::WORKFLOW, dag.name);
    let pods_before = ctl::pod_names(&cluster, &namespace, &selector).await?.len();
    let other = FailedDag {
        name: String::new(),
        failed: 1,
        succeeded: 0,
    }
    .workflow(&namespace);
    stream::iter(0..OTHERS)
        .map(|i| {
            let mut wf = other.clone();
            wf.metadata.name = Some(format!("z-{i:04}"));
            let workflows = workflows.clone();
            async move { workflows.create(&PostParams::default(), &wf).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .context("creating the other workflows")?;

    let logs = tempfile::tempdir()?;

    // Asked once the cache is synced, and killed while it deletes, one pod at a time, five a
    // second.
    let deleting = ["--qps", "5", "--burst", "1", "--no-bulk"];
    let log = logs.path().join("run-1.log");
    let mut child = spawn_controller(&cluster, &[&namespace], &log, &deleting)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !read(&log).contains("workflow metadata cache synced") {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller's cache did not sync within 30s:\n{}",
            read(&log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let object = retries
        .create(&PostParams::default(), &live("retry-wf", &dag.name, None))
        .await?;
    let token = workflowretry_token(object.metadata.uid.as_deref().unwrap_or_default());
    let total = plan.pods_to_delete.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let left = loop {
        if let Some(exit) = child.try_wait()? {
            bail!("the controller exited by itself ({exit}):\n{}", read(&log));
        }
        let present = ctl::pod_names(&cluster, &namespace, &selector).await?;
        let left = present
            .iter()
            .filter(|p| plan.pods_to_delete.contains(*p))
            .count();
        if left + 5 <= total {
            break left;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller deleted no plan pod within 60s:\n{}",
            read(&log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    child.start_kill()?;
    child.wait().await?;
    ensure!(left > 0, "the kill should fall while plan pods are deleted");

    // Restarted reading at one request a second: the initial list is slow.
    let slow = [&deleting[..], &["--read-qps", "1", "--read-burst", "1"]].concat();
    let log = logs.path().join("run-2.log");
    let mut child = spawn_controller(&cluster, &[&namespace], &log, &slow)?;
    let deadline = tokio::time::Instant::now() + END_WITHIN;
    let finished = loop {
        if let Some(exit) = child.try_wait()? {
            bail!("the controller exited by itself ({exit}):\n{}", read(&log));
        }
        let object = retries.get("retry-wf").await?;
        if object.is_finished() {
            break object;
        }
        if tokio::time::Instant::now() >= deadline {
            let wf = workflows.get_metadata(&dag.name).await?;
            child.start_kill()?;
            child.wait().await?;
            bail!(
                "the resumed WorkflowRetry did not end within {END_WITHIN:?} of the restart; its status: {:?}; the workflow's {}: {:?}, {}: {:?}; the controller's log:\n{}",
                object.status,
                annotations::RETRY,
                wf.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(annotations::RETRY)),
                annotations::STATUS,
                wf.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(annotations::STATUS)),
                read(&log)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    child.start_kill()?;
    child.wait().await?;
    let status = finished.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded),
        "expected the resumed WorkflowRetry to succeed: {status:?}\n{}",
        read(&log)
    );
    let after = workflows.get(&dag.name).await?;
    ensure!(
        after.annotation(annotations::OBSERVED) == Some(token.as_str()),
        "expected {}={token}, found {:?}",
        annotations::OBSERVED,
        after.annotation(annotations::OBSERVED)
    );
    let present = ctl::pod_names(&cluster, &namespace, &selector).await?;
    ensure!(
        !present.iter().any(|p| plan.pods_to_delete.contains(p))
            && present.len() == pods_before - total,
        "expected exactly the pods outside the plan to remain, found {present:?}"
    );
    let resets = ctl::resets(&ctl::audit_log(&cluster, &namespace)?, &dag.name);
    ensure!(
        resets == 1,
        "expected one reset of {}, found {resets}",
        dag.name
    );
    Ok(())
}

/// Rule 7 when a request's answer cannot be written: a refused request (bad options) whose
/// Failed report the API server refuses (a ValidatingAdmissionPolicy refuses any workflow
/// write carrying `rewind.dev/retry-observed`) is still pending on the workflow, and no event
/// comes once the policy is gone. The controller must answer it anyway, within its resync.
pub async fn a_request_whose_answer_was_refused_is_answered_later(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 2,
        succeeded: 1,
    };
    dag.create(&admin, &namespace, 4, || ()).await?;
    let policy = refuse_answers(&admin, &namespace, &workflows, &dag.name).await?;
    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let token = "bad-options";
    let ask = json!({"metadata": {"annotations": {
        annotations::RETRY: token,
        annotations::PARAMETERS: "not a JSON list",
    }}});
    workflows
        .patch_metadata(&dag.name, &PatchParams::default(), &Patch::Merge(&ask))
        .await?;
    let refused = |log: &[ctl::Audited]| {
        log.iter().any(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "patch"
                && a.resource == "workflows"
                && a.name == dag.name
                && a.code >= 400
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !refused(&ctl::audit_log(&cluster, &namespace)?) {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller's answer was not refused within 30s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    remove_refusal(&admin, &policy).await?;
    wait_refusal(|| answer_dry_run(&workflows, &dag.name), false).await?;
    let answered = ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(100)).await;
    controller.stop().await?;
    let (_, status) = answered.context("the request whose answer was refused once")?;
    ensure!(
        status.phase == RetryPhase::Failed && status.message.contains("parameters"),
        "expected the request Failed for its parameters: {status:?}"
    );
    Ok(())
}

/// Installs a ValidatingAdmissionPolicy refusing, in `namespace`, any workflow write that
/// carries `rewind.dev/retry-observed` (what a request's answer writes), and waits until the
/// API server enforces it on `workflow`; its name.
async fn refuse_answers(
    admin: &kube::Client,
    namespace: &str,
    workflows: &Api<Workflow>,
    workflow: &str,
) -> anyhow::Result<String> {
    let name = format!("{namespace}-refuse-observed");
    let rule = json!({
        "apiGroups": ["argoproj.io"], "apiVersions": ["*"],
        "operations": ["UPDATE"], "resources": ["workflows"],
    });
    let refuse = format!(
        "!has(object.metadata.annotations) || !('{}' in object.metadata.annotations)",
        annotations::OBSERVED
    );
    install_refusal(
        admin,
        &name,
        namespace,
        rule,
        &refuse,
        "an answered request",
    )
    .await?;
    wait_refusal(|| answer_dry_run(workflows, workflow), true).await?;
    Ok(name)
}

/// A dry-run write of an answer (the observed annotation) on `workflow`.
async fn answer_dry_run(workflows: &Api<Workflow>, workflow: &str) -> Result<(), kube::Error> {
    let probe = json!({"metadata": {"annotations": {annotations::OBSERVED: "probe"}}});
    let params = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    workflows
        .patch_metadata(workflow, &params, &Patch::Merge(&probe))
        .await
        .map(|_| ())
}
