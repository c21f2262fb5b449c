//! The unprivileged user, granted what the Helm chart will grant users, can ask for a
//! retry (patch a workflow) but cannot delete or even list pods.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rewind::argo::workflow::Workflow;
use rewind::testenv::localcluster::LocalCluster;
use serde_json::json;

use crate::support::grants::{grant_user, named, rule};

fn is_forbidden(result: &Result<impl Sized, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

pub async fn user_can_patch_workflows_but_not_touch_pods(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let user = cluster.user_client();
    let post = PostParams::default();

    grant_user(
        &admin,
        &namespace,
        "rewind-user",
        vec![
            rule(
                "argoproj.io",
                "workflows",
                &["get", "list", "watch", "patch", "update"],
            ),
            // The WorkflowRetry CRD does not exist yet; RBAC rules may name it anyway.
            rule("rewind.dev", "workflowretries", &["create"]),
        ],
    )
    .await?;

    let workflow: Workflow = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf-failed"},
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "busybox"}}]},
        "status": {"phase": "Failed"},
    }))?;
    Api::<Workflow>::namespaced(admin.clone(), &namespace)
        .create(&post, &workflow)
        .await
        .context("creating the workflow")?;
    let pod = Pod {
        metadata: named("wf-failed-1"),
        spec: Some(serde_json::from_value(
            json!({"schedulerName": "rewind-test-unscheduled", "containers": [{"name": "main", "image": "busybox"}]}),
        )?),
        status: None,
    };
    Api::<Pod>::namespaced(admin.clone(), &namespace)
        .create(&post, &pod)
        .await
        .context("creating the pod")?;

    // The grant reaches the authorizer's cache within moments; retry 403s briefly.
    let workflows: Api<Workflow> = Api::namespaced(user.clone(), &namespace);
    let patch =
        Patch::Merge(json!({"metadata": {"annotations": {"rewind.dev/retry": "1700000000"}}}));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let result = workflows
            .patch("wf-failed", &PatchParams::default(), &patch)
            .await;
        match result {
            Ok(_) => break,
            Err(_) if is_forbidden(&result) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(error) => bail!("the user could not patch the workflow's annotation: {error}"),
        }
    }
    let patched = Api::<Workflow>::namespaced(admin.clone(), &namespace)
        .get("wf-failed")
        .await?;
    ensure!(
        patched.annotation("rewind.dev/retry") == Some("1700000000"),
        "annotation not stored: {:?}",
        patched.metadata.annotations
    );

    let user_pods: Api<Pod> = Api::namespaced(user.clone(), &namespace);
    let delete = user_pods
        .delete("wf-failed-1", &DeleteParams::default())
        .await;
    ensure!(
        is_forbidden(&delete),
        "deleting a pod as the user: expected 403, got {:?}",
        delete.map(|_| ())
    );
    let list = user_pods.list(&ListParams::default()).await;
    ensure!(
        is_forbidden(&list),
        "listing pods as the user: expected 403, got {:?}",
        list.map(|_| ())
    );
    let elsewhere = Api::<Workflow>::namespaced(user.clone(), "default")
        .list(&ListParams::default())
        .await;
    ensure!(
        is_forbidden(&elsewhere),
        "listing workflows outside the granted namespace: expected 403, got {:?}",
        elsewhere.map(|_| ())
    );

    let still_there = Api::<Pod>::namespaced(admin, &namespace)
        .get_opt("wf-failed-1")
        .await?;
    ensure!(
        still_there.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "the pod was touched"
    );
    Ok(())
}
