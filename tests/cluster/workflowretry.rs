//! WorkflowRetry objects on the real control plane: the API server validates them (CEL), the
//! controller serves a live one through the annotation path and an archived one in Argo's
//! order (leftovers by owner UID, create once), reports in the status subresource and Events,
//! and deletes finished ones after their TTL.
//!
//! The archived row here is the workflow exactly as the API server returned it before its
//! deletion (what Argo archives), served by an in-test [`ArgoDatabase`]: these tests are
//! about the Kubernetes half; reading Argo's tables is the archive module's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource as _, ResourceExt as _};
use rewind::argo::db::ArgoDatabase;
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::{CREATED_BY, WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::workflowretry_token;
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::FailedDag;

use crate::support::archived::{Archive, Archived, Rows, create_held_pods};
use crate::support::argos_retry::ensure_what_argo_creates;
use crate::support::controller as ctl;
use crate::support::workflowretry::{archived, live, phase_and_message, wait_finished};

const CONCURRENCY: usize = 16;
const FINISH: Duration = Duration::from_secs(60);

/// Both targets, or none, are refused at create; a spec cannot change once created.
pub async fn the_api_server_refuses_both_or_neither_target_and_a_changed_spec(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let api: Api<WorkflowRetry> = Api::namespaced(cluster.admin_client(), &namespace);
    let mut both = live("both", "wf", None);
    both.spec.archived_workflow_uid = Some("4f1c".into());
    let neither = WorkflowRetry::new("neither", WorkflowRetrySpec::default());
    for (object, what) in [(both, "both targets"), (neither, "no target")] {
        match api.create(&PostParams::default(), &object).await {
            Err(kube::Error::Api(s))
                if s.code == 422
                    && s.message
                        .contains("set exactly one of archivedWorkflowUID and workflowName") => {}
            other => bail!(
                "the API server should refuse a WorkflowRetry with {what} (422, exactly one), got {other:?}"
            ),
        }
    }
    api.create(&PostParams::default(), &live("good", "wf", None))
        .await
        .context("a WorkflowRetry with one target is valid")?;
    let change = serde_json::json!({"spec": {"workflowName": "other"}});
    match api
        .patch("good", &PatchParams::default(), &Patch::Merge(&change))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("spec is immutable") => {}
        other => {
            bail!("the API server should refuse a change of spec (422, immutable), got {other:?}")
        }
    }
    Ok(())
}

/// A WorkflowRetry naming a live workflow: the workflow is reset exactly as the planner says
/// (through the annotation path), the status and an Event report it, and the object is
/// deleted after its TTL.
pub async fn a_live_workflowretry_resets_the_workflow_reports_and_expires(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 5,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);

    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let object = retries
        .create(
            &PostParams::default(),
            &live("retry-wf", &dag.name, Some(5)),
        )
        .await?;
    let finished = wait_finished(&retries, "retry-wf").await?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    let status = finished.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded),
        "expected the WorkflowRetry to succeed: {status:?}"
    );
    let planned = plan.pods_to_delete.len() as u64;
    ensure!(
        status.pods_total == planned && status.pods_deleted == planned,
        "expected podsTotal = podsDeleted = {planned}: {status:?}"
    );
    ensure!(
        status.workflow_name.as_deref() == Some("wf")
            && status.workflow_uid == created.metadata.uid
            && status.observed_generation == finished.metadata.generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True"),
        "expected the workflow's name and UID, the generation and a Complete condition: {status:?}"
    );
    let after = workflows.get(&dag.name).await?;
    let token = workflowretry_token(&object.uid().unwrap_or_default());
    ensure!(
        after.annotation(annotations::OBSERVED) == Some(token.as_str()),
        "expected the workflow's {} to be {token}, found {:?}",
        annotations::OBSERVED,
        after.annotation(annotations::OBSERVED)
    );
    ctl::ensure_reset_as_planned(&after, &plan.workflow, from, to)?;
    let left = ctl::pod_names(&cluster, &namespace, labels::WORKFLOW).await?;
    ensure!(
        plan.pods_to_delete.iter().all(|p| !left.contains(p)),
        "plan pods remain after the retry"
    );
    ctl::wait_event(&cluster, &namespace, "retry-wf", "Retried").await?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while retries.get_opt("retry-wf").await?.is_some() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the finished WorkflowRetry was not deleted within 20s of its 5s TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    controller.stop().await
}

/// The workflow was archived and deleted while its pods, held by Argo's finalizer, remain.
/// The retry deletes exactly the plan's leftovers, never a pod of another workflow labelled
/// with the same name, creates the workflow the planner formulates (new UID, annotated with
/// the request's UID), and a restarted controller that finds it does not create it again.
pub async fn an_archived_workflowretry_deletes_only_leftovers_and_creates_the_workflow_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 5,
    };
    let old = Archived::create(&cluster, &namespace, dag, Archive::InTest).await?;
    // A pod labelled with the same workflow name but owned by another workflow.
    let other = FailedDag {
        name: "wf-other".into(),
        failed: 1,
        succeeded: 0,
    };
    let other = workflows
        .create(&PostParams::default(), &other.workflow(&namespace))
        .await?;
    let mut decoy = ctl::pod("wf-decoy", "wf");
    decoy.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Workflow::api_version(&()).into_owned(),
        kind: Workflow::kind(&()).into_owned(),
        name: other.name_any(),
        uid: other.uid().unwrap_or_default(),
        ..Default::default()
    }]);
    create_held_pods(&pods, vec![(decoy, "Failed")]).await?;

    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(old.rows()),
    )
    .await?;
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let request = retries
        .create(
            &PostParams::default(),
            &archived("retry-archived", &old.uid),
        )
        .await?;
    let finished = wait_finished(&retries, "retry-archived").await?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    controller.stop().await?;
    let status = finished.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded),
        "expected the archived retry to succeed: {status:?}"
    );
    let after = workflows.get(&old.name).await?;
    let new_uid = after.uid().unwrap_or_default();
    let request_uid = request.uid().unwrap_or_default();
    ensure!(
        new_uid != old.uid && status.workflow_uid.as_deref() == Some(new_uid.as_str()),
        "expected a new workflow (UID other than {}) named in the status: {status:?}",
        old.uid
    );
    ensure!(
        after.annotation(CREATED_BY) == Some(request_uid.as_str()),
        "expected {CREATED_BY}={request_uid} on the created workflow, found {:?}",
        after.annotation(CREATED_BY)
    );
    // Argo clears the UID and resourceVersion; the API server sets a new creation time.
    let mut expected = old.plan.workflow.clone();
    let mut actual = after.clone();
    for wf in [&mut expected, &mut actual] {
        wf.metadata.uid = None;
        wf.metadata.resource_version = None;
        wf.metadata.creation_timestamp = None;
    }
    ctl::ensure_reset_as_planned(&actual, &expected, from, to)?;
    ensure_what_argo_creates(&after, &old.row, from).await?;
    old.ensure_only_leftovers_deleted(&pods).await?;
    ensure!(
        pods.get_opt("wf-decoy")
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "the decoy of another workflow was deleted"
    );

    // A crash after the create, before the final status: the next controller finds the
    // workflow it created and finishes the request without a second create.
    let reopened = serde_json::json!({"status": {"phase": "Committing", "conditions": []}});
    retries
        .patch_status(
            "retry-archived",
            &PatchParams::default(),
            &Patch::Merge(&reopened),
        )
        .await?;
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(old.rows()),
    )
    .await?;
    let again = wait_finished(&retries, "retry-archived").await?;
    controller.stop().await?;
    let (phase, message) = phase_and_message(&again);
    ensure!(
        phase == Some(RetryPhase::Succeeded),
        "the resumed request should succeed: {message}"
    );
    let now = workflows.get(&old.name).await?;
    ensure!(
        now.uid().as_deref() == Some(new_uid.as_str()),
        "the resumed request created the workflow again"
    );
    Ok(())
}

/// An archived retry that must not run ends Failed with a clear message and deletes nothing:
/// the workflow still exists live (Argo's message), an unknown UID, no archive configured,
/// and a live target that does not exist.
pub async fn workflowretries_that_cannot_be_served_fail_clearly_and_delete_nothing(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 5,
        succeeded: 1,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let uid = created.uid().unwrap_or_default();
    let pods_before = ctl::pod_names(&cluster, &namespace, labels::WORKFLOW).await?;
    let archive: Arc<dyn ArgoDatabase> =
        Arc::new(Rows(BTreeMap::from([(uid.clone(), created.clone())])));

    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(archive),
    )
    .await?;
    let cases = [
        (
            archived("exists-live", &uid),
            "Workflow already exists on cluster, use argo retry wf instead",
        ),
        (
            archived("unknown", "9d5c0f0e-0000-4000-8000-000000000000"),
            "no archived workflow with UID 9d5c0f0e-0000-4000-8000-000000000000",
        ),
        (
            live("missing", "no-such-wf", None),
            "workflow no-such-wf not found",
        ),
    ];
    for (object, _) in &cases {
        retries.create(&PostParams::default(), object).await?;
    }
    for (object, expected) in &cases {
        let finished = wait_finished(&retries, &object.name_any()).await?;
        let (phase, message) = phase_and_message(&finished);
        ensure!(
            phase == Some(RetryPhase::Failed) && message.contains(expected),
            "{}: expected Failed with {expected:?}, got {phase:?} {message:?}",
            object.name_any()
        );
        // No Event is awaited: a request refused within a second ends with its status alone.
    }
    controller.stop().await?;

    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    retries
        .create(&PostParams::default(), &archived("no-archive", &uid))
        .await?;
    let finished = wait_finished(&retries, "no-archive").await?;
    controller.stop().await?;
    let (phase, message) = phase_and_message(&finished);
    ensure!(
        phase == Some(RetryPhase::Failed) && message.contains("no workflow archive"),
        "expected Failed saying there is no workflow archive, got {phase:?} {message:?}"
    );
    let pods_after = ctl::pod_names(&cluster, &namespace, labels::WORKFLOW).await?;
    ensure!(
        pods_after == pods_before,
        "pods were deleted by refused requests"
    );
    Ok(())
}

/// A controller stopped while it deletes an archived workflow's leftovers (before the
/// create): nothing is created by the stopped one, and the next controller finishes the
/// request, deleting the rest and creating the workflow once.
pub async fn an_archived_retry_stopped_before_the_create_resumes_and_creates_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 2,
    };
    let old = Archived::create(&cluster, &namespace, dag, Archive::InTest).await?;
    let plan = &old.plan;

    // Five writes a second, pod by pod: the leftovers take seconds.
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(5, 1, false),
        Some(old.rows()),
    )
    .await?;
    retries
        .create(
            &PostParams::default(),
            &archived("retry-archived", &old.uid),
        )
        .await?;
    // Stopped once the first leftover is gone, however long the start took.
    let count_left = async || -> anyhow::Result<usize> {
        let mut left = 0;
        for pod in &plan.pods_to_delete {
            left += usize::from(pods.get_opt(pod).await?.is_some());
        }
        Ok(left)
    };
    let deadline = tokio::time::Instant::now() + FINISH;
    while count_left().await? == plan.pods_to_delete.len() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller deleted no leftover within {FINISH:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    controller.stop().await?;
    let left = count_left().await?;
    ensure!(
        0 < left && left < plan.pods_to_delete.len(),
        "the controller should stop mid-way through the leftovers; {left} of {} remain",
        plan.pods_to_delete.len()
    );
    ensure!(
        workflows.get_opt(&old.name).await?.is_none(),
        "the workflow was created before every leftover was gone"
    );

    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(old.rows()),
    )
    .await?;
    let finished = wait_finished(&retries, "retry-archived").await?;
    controller.stop().await?;
    let (phase, message) = phase_and_message(&finished);
    ensure!(
        phase == Some(RetryPhase::Succeeded),
        "the resumed archived retry should succeed: {message}"
    );
    for pod in &plan.pods_to_delete {
        ensure!(
            pods.get_opt(pod).await?.is_none(),
            "plan pod {pod} was left behind"
        );
    }
    let after = workflows.get(&old.name).await?;
    ensure!(
        after.annotation(CREATED_BY) == finished.uid().as_deref()
            && finished.status.and_then(|s| s.workflow_uid) == after.uid(),
        "the created workflow should carry the request's UID and be the one its status names"
    );
    Ok(())
}
