//! Rule 3 on the bulk path: one DeleteCollection selects only pods Argo has finished with
//! (`workflows.argoproj.io/completed=true`), so a pod Argo has not relabelled, or anyone's pod
//! created as Argo creates them (completed=false), is never in it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use rewind::testenv::workload::FailedDag;

use crate::support::controller::{self as ctl, Audited};

const CONCURRENCY: usize = 32;

/// A pod labelled with `workflow` as Argo creates its pods (completed=false), made by someone
/// else, with phase `phase`.
pub async fn unfinished_pod(
    pods: &Api<Pod>,
    name: &str,
    workflow: &str,
    phase: &str,
) -> anyhow::Result<Pod> {
    let mut pod = ctl::pod(name, workflow);
    pod.labels_mut()
        .insert(labels::COMPLETED.into(), "false".into());
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {name}"))?;
    let status = serde_json::json!({"status": {"phase": phase}});
    Ok(pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?)
}

/// The controller's pod requests in the audit log, as (verb, pod name).
fn pod_requests(cluster: &LocalCluster, namespace: &str) -> anyhow::Result<Vec<Audited>> {
    Ok(ctl::audit_log(cluster, namespace)?
        .into_iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.resource == "pods" && a.is_mutating())
        .collect())
}

/// A plan pod Argo has not relabelled yet (completed=false) and an outsider failed pod with the
/// workflow's label and completed=false: the outsider survives, every other plan pod goes by
/// one DeleteCollection, and the plan pod waits, named in the status, until it is labelled
/// completed=true (as Argo's clean-up queue does it), then goes by a single delete (with its
/// UID precondition).
pub async fn an_unfinished_outsider_survives_and_an_unrelabelled_plan_pod_goes_singly(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 50,
        succeeded: 5,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let late = plan.pods_to_delete[7].clone();
    let relabel = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: "false"}}});
    pods.patch(&late, &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .with_context(|| format!("marking plan pod {late} unfinished"))?;
    let outsider = unfinished_pod(&pods, "outsider", &dag.name, "Failed").await?;

    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let (workflows_ref, name) = (&workflows, dag.name.as_str());
    let annotation = move || async move {
        let wf = workflows_ref.get(name).await?;
        Ok(ctl::status_of(&wf, token)?.map(|s| (s.phase, s.message)))
    };
    crate::endings::wait_message(
        "the request while Argo has not labelled a plan pod",
        annotation,
        RetryPhase::DeletingPods,
        &["waiting for Argo to finish with 1 pod"],
        Duration::from_secs(30),
    )
    .await?;
    let waiting = pods.get(&late).await?;
    ensure!(
        waiting.metadata.deletion_timestamp.is_none(),
        "plan pod {late} was deleted before Argo labelled it"
    );
    let settled = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: "true"}}});
    pods.patch(&late, &PatchParams::default(), &Patch::Merge(&settled))
        .await?;
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    controller.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );

    let kept = pods
        .get_opt("outsider")
        .await?
        .context("the unfinished outsider was deleted")?;
    ensure!(
        kept.uid() == outsider.uid(),
        "the outsider was replaced during the retry"
    );
    let left: BTreeSet<String> = ctl::pod_names(
        &cluster,
        &namespace,
        &format!("{}={}", labels::WORKFLOW, dag.name),
    )
    .await?
    .into_iter()
    .collect();
    let plan_left: Vec<&String> = plan
        .pods_to_delete
        .iter()
        .filter(|p| left.contains(*p))
        .collect();
    ensure!(plan_left.is_empty(), "plan pods left: {plan_left:?}");

    let requests = pod_requests(&cluster, &namespace)?;
    let bulk = requests
        .iter()
        .filter(|a| a.verb == "deletecollection")
        .count();
    let singles: Vec<&str> = requests
        .iter()
        .filter(|a| a.verb == "delete")
        .map(|a| a.name.as_str())
        .collect();
    ensure!(
        bulk == 1 && singles == [late.as_str()],
        "expected one deletecollection and a single delete of {late} only, the controller sent {bulk} deletecollection and single deletes of {singles:?}"
    );
    Ok(())
}

/// A pod created with the workflow's label while one DeleteCollection of thousands of pods runs
/// survives it, and the retry still succeeds.
pub async fn a_pod_created_during_a_long_bulk_delete_survives(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 2000,
        succeeded: 2,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let selector = format!("{}={}", labels::WORKFLOW, dag.name);

    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    // The server deletes in name order: once the first plan pod is gone the bulk request runs.
    ctl::wait_gone(&pods, &plan.pods_to_delete[0], "the bulk delete").await?;
    let newcomer = unfinished_pod(&pods, "newcomer", &dag.name, "Failed").await?;
    let plan_left_then = ctl::pod_names(&cluster, &namespace, &selector)
        .await?
        .iter()
        .filter(|p| plan.pods_to_delete.contains(p))
        .count();
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(120)).await?;
    controller.stop().await?;
    tracing::info!(
        plan_left_then,
        "plan pods left when the newcomer was created"
    );
    ensure!(
        plan_left_then > 0,
        "the bulk delete was over before the newcomer was created: the test proves nothing"
    );
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );
    let kept = pods
        .get_opt("newcomer")
        .await?
        .context("the pod created during the bulk delete was deleted")?;
    ensure!(
        kept.uid() == newcomer.uid(),
        "the newcomer was replaced during the retry"
    );
    let bulk = pod_requests(&cluster, &namespace)?
        .iter()
        .filter(|a| a.verb == "deletecollection")
        .count();
    ensure!(
        bulk == 1,
        "expected the plan to go in one deletecollection, the controller sent {bulk}"
    );
    // During the one bulk request progress cannot move: one status write (DeletingPods, once
    // the retry has run 2 s) and the reset, nothing else.
    let writes = workflow_writes(&cluster, &namespace, &dag.name)?;
    ensure!(
        (1..=2).contains(&writes.len()),
        "expected at most two writes of the workflow (progress, reset), the controller sent {writes:?}"
    );
    Ok(())
}

/// The controller's writes of `workflow`, as (verb, HTTP code).
fn workflow_writes(
    cluster: &LocalCluster,
    namespace: &str,
    workflow: &str,
) -> anyhow::Result<Vec<(String, u16)>> {
    Ok(ctl::audit_log(cluster, namespace)?
        .into_iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.resource == "workflows"
                && a.name == workflow
                && a.is_mutating()
        })
        .map(|a| (a.verb, a.code))
        .collect())
}

/// The controller stopped gracefully the moment the reset is visible still sends the retry's
/// Retried Event before its stop completes.
pub async fn a_graceful_stop_right_after_a_reset_still_sends_its_event(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 1,
    };
    dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    controller.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );
    let reasons = ctl::event_reasons(&cluster, &namespace, &dag.name).await?;
    ensure!(
        reasons.iter().any(|r| r == "Retried"),
        "the controller's stop completed without the Retried Event; Events: {reasons:?}"
    );
    Ok(())
}
