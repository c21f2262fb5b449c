//! Rule 8: a plan pod Argo has not finished with (not labelled completed=true yet, as its
//! clean-up queue does seconds after the pod ends) is not deleted before Argo labels it, so
//! Argo's queued label cannot land on the pod it re-creates under that name. The wait is
//! bounded: at `--settle-timeout` the request ends Failed naming the pod and deleting none of
//! the waiting ones, or, with `--on-settle-timeout=delete`, deletes them and says so. The
//! pods here have no Argo controller, so the test decides when (never) they are labelled.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::engine::drive::OnSettleTimeout;
use rewind::protocol::crd::WorkflowRetry;
use rewind::protocol::request::{RetryPhase, workflowretry_token};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use rewind::testenv::workload::FailedDag;

use crate::endings::wait_message;
use crate::support::controller as ctl;
use crate::support::workflowretry as wr;

const BOUND: Duration = Duration::from_secs(6);

/// A failed workflow of 10 failed and 2 succeeded pods whose first plan pod Argo has not
/// labelled (completed=false, as Argo creates its pods). Returns that pod and its UID.
async fn workflow_with_an_unsettled_pod(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: name.into(),
        failed: 10,
        succeeded: 2,
    };
    let created = dag.create(&admin, namespace, 16, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let late = plan.pods_to_delete[0].clone();
    let unsettled = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: "false"}}});
    let pod = Api::<Pod>::namespaced(admin, namespace)
        .patch(&late, &PatchParams::default(), &Patch::Merge(&unsettled))
        .await
        .with_context(|| format!("marking plan pod {late} unfinished"))?;
    Ok((late, pod.uid().unwrap_or_default()))
}

/// The controller's deletes of `pod` in the audit log.
fn deletes_of(cluster: &LocalCluster, namespace: &str, pod: &str) -> anyhow::Result<usize> {
    Ok(ctl::audit_log(cluster, namespace)?
        .iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.verb == "delete" && a.name == pod)
        .count())
}

/// Argo's controller never labels a plan pod: the request says it waits for it, ends Failed
/// at the bound naming it, what is missing and what to do, without a reset and without a
/// delete of it; with `--on-settle-timeout=delete` another request deletes it at the bound,
/// says so, and succeeds.
pub async fn a_pod_argo_never_labels_ends_its_retry_at_the_settle_bound(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let (late_a, uid_a) = workflow_with_an_unsettled_pod(&cluster, &namespace, "wf-a").await?;
    let (late_b, _) = workflow_with_an_unsettled_pod(&cluster, &namespace, "wf-b").await?;

    let mut options = ctl::options(50, 50, true);
    options.retry.settle_timeout = BOUND;
    let controller = ctl::start(&cluster, &namespace, options.clone()).await?;
    let started = tokio::time::Instant::now();
    ctl::request_retry(&cluster, &namespace, "wf-a", "settle-1").await?;
    let workflows_ref = &workflows;
    let status = |name: &'static str, token: &'static str| {
        move || async move {
            let wf = workflows_ref.get(name).await?;
            Ok(ctl::status_of(&wf, token)?.map(|s| (s.phase, s.message)))
        }
    };
    let waiting = wait_message(
        "the request while Argo has not labelled a plan pod",
        status("wf-a", "settle-1"),
        RetryPhase::DeletingPods,
        &["waiting for Argo to finish with 1 pod", "fails"],
        BOUND,
    )
    .await?;
    let failed = wait_message(
        "the request at its settle bound",
        status("wf-a", "settle-1"),
        RetryPhase::Failed,
        &[
            late_a.as_str(),
            "not labelled workflows.argoproj.io/completed=true",
            "did not reset",
            "--on-settle-timeout=delete",
        ],
        BOUND * 3,
    )
    .await?;
    let failed_after = started.elapsed();
    ensure!(
        failed_after >= BOUND,
        "the request failed after {failed_after:?}, before its settle bound"
    );
    let kept = pods.get(&late_a).await?;
    ensure!(
        kept.uid().as_deref() == Some(uid_a.as_str()) && kept.metadata.deletion_timestamp.is_none(),
        "plan pod {late_a} was deleted although Argo never labelled it"
    );
    ensure!(
        deletes_of(&cluster, &namespace, &late_a)? == 0,
        "the controller sent a delete of {late_a}"
    );
    let wf = workflows.get("wf-a").await?;
    ensure!(
        wf.label(labels::COMPLETED) == Some("true") && wf.status.phase.as_deref() == Some("Failed"),
        "workflow wf-a was reset although plan pod {late_a} was never deleted"
    );
    controller.stop().await?;

    options.retry.on_settle_timeout = OnSettleTimeout::Delete;
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let started = tokio::time::Instant::now();
    ctl::request_retry(&cluster, &namespace, "wf-b", "settle-2").await?;
    wait_message(
        "the request told to delete at its bound, while it waits",
        status("wf-b", "settle-2"),
        RetryPhase::DeletingPods,
        &["waiting for Argo to finish with 1 pod", "anyway"],
        BOUND,
    )
    .await?;
    ensure!(
        deletes_of(&cluster, &namespace, &late_b)? == 0,
        "the controller deleted {late_b} before the bound"
    );
    let (_, end) = ctl::wait_finished(&workflows, "wf-b", "settle-2", BOUND * 4).await?;
    controller.stop().await?;
    ensure!(
        end.phase == RetryPhase::Succeeded && started.elapsed() >= BOUND,
        "expected the retry to succeed after its bound ({BOUND:?}), it ended {end:?} after {:?}",
        started.elapsed()
    );
    ensure!(
        deletes_of(&cluster, &namespace, &late_b)? == 1,
        "expected one delete of {late_b} at the bound"
    );
    tracing::info!(%waiting, %failed, "messages of the request waiting for Argo");
    Ok(())
}

/// A strand made by hand after a reset (what a pod deleted before Argo labelled it leads
/// to): a reset node's new pod, as Argo re-creates it (completed=false, the node's
/// annotations), is labelled completed=true while its node is not finished. Within the
/// bound (`--settle-timeout`) rewind reports it: a RetryStranded Event on the workflow and
/// the request's status message, each naming the pod and the fix.
pub async fn a_stranded_reset_node_is_reported_with_its_fix(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const PICKUP: Duration = Duration::from_secs(20);
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 10,
        succeeded: 2,
    };
    let created = dag.create(&admin, &namespace, 16, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let mut options = ctl::options(50, 50, true);
    options.retry.settle_timeout = PICKUP;
    let controller = ctl::start(&cluster, &namespace, options).await?;
    // Asked as an object, whose status is told as well as the workflow's.
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let object = retries
        .create(&PostParams::default(), &wr::live("strand", &dag.name, None))
        .await?;
    let ended = wr::wait_finished(&retries, "strand").await?;
    ensure!(
        wr::phase_and_message(&ended).0 == Some(RetryPhase::Succeeded),
        "expected the retry to succeed, its status is {:?}",
        ended.status
    );
    let reset_at = tokio::time::Instant::now();
    let token = workflowretry_token(&object.uid().unwrap_or_default());

    // Argo re-creates the reset node's pod under the same name; the label queued for the
    // old pod lands on it.
    let stranded = plan.pods_to_delete[3].clone();
    let (mut pod, _) = dag
        .pods(&created)
        .into_iter()
        .find(|(p, _)| p.metadata.name.as_deref() == Some(stranded.as_str()))
        .context("the plan pod's template")?;
    pod.metadata.uid = None;
    pod.metadata.resource_version = None;
    pod.labels_mut()
        .insert(labels::COMPLETED.into(), "false".into());
    pods.create(&Default::default(), &pod).await?;
    let completed = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: "true"}}});
    pods.patch(
        &stranded,
        &PatchParams::default(),
        &Patch::Merge(&completed),
    )
    .await?;

    let fix = format!(
        "kubectl label pod -n {namespace} {stranded} workflows.argoproj.io/completed=false --overwrite"
    );
    ctl::wait_event_note(&cluster, &namespace, &dag.name, "RetryStranded", &fix).await?;
    let (workflows_ref, token) = (&workflows, token.as_str());
    let annotation = move || async move {
        let wf = workflows_ref.get("wf").await?;
        Ok(ctl::status_of(&wf, token)?.map(|s| (s.phase, s.message)))
    };
    let words = [stranded.as_str(), "completed=true", fix.as_str()];
    let message = wait_message(
        "the request's status on the workflow after the strand",
        annotation,
        RetryPhase::Succeeded,
        &words,
        Duration::from_secs(10),
    )
    .await?;
    let retries = &retries;
    let on_object = move || async move {
        let (phase, message) = wr::phase_and_message(&retries.get("strand").await?);
        Ok(phase.map(|p| (p, message)))
    };
    wait_message(
        "the WorkflowRetry's status after the strand",
        on_object,
        RetryPhase::Succeeded,
        &words,
        Duration::from_secs(10),
    )
    .await?;
    ensure!(
        reset_at.elapsed() < PICKUP,
        "the strand was reported after the bound ({PICKUP:?})"
    );
    controller.stop().await?;
    tracing::info!(%message, "the strand, as the request reports it");
    Ok(())
}
