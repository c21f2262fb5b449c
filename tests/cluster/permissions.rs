//! A controller whose ServiceAccount lacks a permission it needs (here:
//! deleting pods) ends each request Failed at once, with a message naming
//! what it may not do, instead of retrying forever; and deletes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::localcluster::{LocalCluster, Role, controller_cluster_role};
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;
use crate::support::workflowretry::{phase_and_message, wait_finished};

/// The identity the controller runs as here, impersonated by the admin.
const RESTRICTED: &str = "rewind-without-pod-delete";

/// How soon a refused request must end: well before any back-off would.
const WITHIN: Duration = Duration::from_secs(20);

/// The controller's ClusterRole (deploy/rbac/controller.yaml) without
/// `delete` and `deletecollection` on pods, bound to [`RESTRICTED`].
async fn restricted_role(admin: &kube::Client) -> anyhow::Result<()> {
    let mut role = controller_cluster_role()?;
    role.metadata.name = Some(RESTRICTED.into());
    for rule in role.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "pods") {
            rule.verbs
                .retain(|v| v != "delete" && v != "deletecollection");
        }
    }
    let apply = PatchParams::apply("rewind-test").force();
    Api::<ClusterRole>::all(admin.clone())
        .patch(RESTRICTED, &apply, &Patch::Apply(&role))
        .await?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(RESTRICTED.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: RESTRICTED.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: RESTRICTED.into(),
            namespace: None,
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(RESTRICTED, &apply, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// The message names the verb, the resource and what to do.
fn ensure_names_the_permission(message: &str) -> anyhow::Result<()> {
    ensure!(
        message.contains(&format!("User \"{RESTRICTED}\" cannot delete"))
            && message.contains("resource \"pods\"")
            && message.contains("grant it in the controller's ClusterRole"),
        "the message does not name the missing permission: {message}"
    );
    Ok(())
}

pub async fn a_controller_without_pod_delete_fails_each_request_at_once_and_deletes_nothing(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    restricted_role(&admin).await?;
    let dags = ["wf-annotated", "wf-object"].map(|name| FailedDag {
        name: name.into(),
        failed: 20,
        succeeded: 2,
    });
    for dag in &dags {
        dag.create(&admin, &namespace, 8, || ()).await?;
    }
    let mut before = Vec::new();
    for dag in &dags {
        before.push(
            ctl::pod_names(
                &cluster,
                &namespace,
                &format!("{}={}", labels::WORKFLOW, dag.name),
            )
            .await?,
        );
    }

    let mut config = cluster.config(Role::Admin).await?;
    config.auth_info.impersonate = Some(RESTRICTED.into());
    let (controller, _) =
        ctl::start_as(config, &namespace, ctl::options(20, 30, true), None).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);

    // Through the annotation.
    let asked = Instant::now();
    ctl::request_retry(&cluster, &namespace, &dags[0].name, "1").await?;
    let (_, status) = ctl::wait_finished(&workflows, &dags[0].name, "1", WITHIN).await?;
    tracing::info!(
        seconds = asked.elapsed().as_secs_f64(),
        message = status.message,
        "refused by RBAC (annotation)"
    );
    ensure!(
        status.phase == RetryPhase::Failed,
        "expected Failed, got {status:?}"
    );
    ensure_names_the_permission(&status.message)?;

    // Through a WorkflowRetry naming the live workflow.
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let object = WorkflowRetry::new(
        "retry-object",
        WorkflowRetrySpec {
            workflow_name: Some(dags[1].name.clone()),
            ..Default::default()
        },
    );
    let asked = Instant::now();
    retries.create(&PostParams::default(), &object).await?;
    let finished = tokio::time::timeout(WITHIN, wait_finished(&retries, &object.name_any()))
        .await
        .context("the WorkflowRetry did not finish in time")??;
    let (phase, message) = phase_and_message(&finished);
    tracing::info!(
        seconds = asked.elapsed().as_secs_f64(),
        message,
        "refused by RBAC (WorkflowRetry)"
    );
    ensure!(
        phase == Some(RetryPhase::Failed),
        "expected Failed, got {phase:?}: {message}"
    );
    ensure_names_the_permission(&message)?;
    controller.stop().await?;

    for (dag, before) in dags.iter().zip(before) {
        let after = ctl::pod_names(
            &cluster,
            &namespace,
            &format!("{}={}", labels::WORKFLOW, dag.name),
        )
        .await?;
        ensure!(
            after == before,
            "pods of {} changed: {before:?} -> {after:?}",
            dag.name
        );
    }
    Ok(())
}
