//! The Helm chart installed for real: `helm install` on the local control plane, then the
//! `rewind` binary run with the installed Deployment's arguments and environment, signed in as
//! the chart's ServiceAccount (a TokenRequest token), serves a retry that a user bound only to
//! `rewind-retry` asked for. That user may create and delete a WorkflowRetry (the chart's
//! admission policy admits it) but not list or delete pods; the ServiceAccount may not
//! delete a ConfigMap, create workflows (unless the archive is on) or change a pod but by
//! releasing it from Argo's finalizer (the chart's pod policy), as it does in the retry.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::kubelet::{Deployed, service_account_kubeconfig};
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::FailedDag;

use crate::support::chart::{ChartDeployment as _, RELEASE};
use crate::support::controller as ctl;
use crate::support::helm::{CHART, helm};
use crate::support::pod_policy;

pub async fn the_chart_installs_and_its_service_account_serves_a_users_retry(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let work = tempfile::tempdir()?;
    // Scoped to the test's namespace: the cluster is shared with the other tests.
    helm(
        &cluster,
        work.path(),
        &[
            "install",
            RELEASE,
            CHART,
            "--namespace",
            &namespace,
            "--set",
            &format!("controller.namespaces={{{namespace}}}"),
            // The admission policy is cluster-wide; here it holds in this namespace only,
            // so other tests' users are not held to it.
            "--set",
            &format!(
                "admission.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={namespace}"
            ),
        ],
    )
    .await?;

    // How the Deployment runs the controller: the test runs it so, below, as pod rewind-0.
    let deployed = Deployed::read(&cluster, &namespace, RELEASE, work.path()).await?;
    let args = &deployed.args;
    ensure!(
        args.contains(&format!("--namespace={namespace}")),
        "the Deployment does not scope the controller to {namespace}: {args:?}"
    );

    let sa_kubeconfig =
        service_account_kubeconfig(&cluster, &namespace, &deployed.service_account, work.path())
            .await?;
    let user_kubeconfig = {
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &namespace);
        let alice = ServiceAccount {
            metadata: ObjectMeta {
                name: Some("alice".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        sas.create(&PostParams::default(), &alice).await?;
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some("alice-rewind-retry".into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "rewind-retry".into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: "alice".into(),
                namespace: Some(namespace.clone()),
                api_group: None,
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &binding)
            .await?;
        service_account_kubeconfig(&cluster, &namespace, "alice", work.path()).await?
    };
    let alice = client(&user_kubeconfig).await?;
    let controller = client(&sa_kubeconfig).await?;

    // What the ServiceAccount holds, asked as `kubectl auth can-i` asks (a
    // SelfSubjectAccessReview, with its own token): patch on pods, to release them from
    // Argo's finalizer, and none of their subresources; with the archive off (the
    // default), no create on workflows, which only archived retries need.
    for (verb, group, resource, expected) in [
        ("patch", "", "pods", true),
        ("patch", "", "pods/status", false),
        ("update", "", "pods/ephemeralcontainers", false),
        ("create", "", "pods/eviction", false),
        ("create", "argoproj.io", "workflows", false),
    ] {
        let allowed = can_i(&controller, &namespace, verb, group, resource).await?;
        ensure!(
            allowed == expected,
            "can the ServiceAccount {verb} {resource}? {allowed}, expected {expected}"
        );
    }
    // `patch pods` is for Argo's finalizer only: the chart's admission policy refuses a
    // stolen token every other change to a pod (here one also held by another finalizer).
    let probe = held_pod(&admin, &namespace).await?;
    let sa_pods: Api<Pod> = Api::namespaced(controller.clone(), &namespace);
    let image = Patch::Strategic(serde_json::json!({
        "spec": {"containers": [{"name": "main", "image": "example.com/attacker"}]}
    }));
    pod_policy::ensure_refused(&sa_pods, &probe.name_any(), &image, "changes its spec")
        .await
        .context("the ServiceAccount replacing a pod's image")?;
    pod_policy::ensure_refused(
        &sa_pods,
        &probe.name_any(),
        &pod_policy::add_label(),
        "changes its labels",
    )
    .await
    .context("the ServiceAccount labelling a pod")?;
    let uid = probe.uid().context("the pod has no UID")?;
    let foreign = Patch::Json(serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": FOREIGN},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))?);
    pod_policy::ensure_refused(
        &sa_pods,
        &probe.name_any(),
        &foreign,
        "changes its finalizers",
    )
    .await
    .context("the ServiceAccount removing another finalizer")?;
    let released = sa_pods
        .patch(
            &probe.name_any(),
            &PatchParams::default(),
            &pod_policy::release(&uid, 1),
        )
        .await
        .context("the ServiceAccount removing Argo's finalizer, as the controller does")?;
    ensure!(
        released.finalizers() == [FOREIGN],
        "after removing Argo's finalizer: {:?}",
        released.finalizers()
    );
    let unchanged = released
        .spec
        .as_ref()
        .map(|s| s.containers[0].image.clone());
    ensure!(
        unchanged == Some(Some("busybox".into())),
        "the image became {unchanged:?}"
    );
    Api::<Pod>::namespaced(admin.clone(), &namespace)
        .patch(
            &probe.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await?;

    let dag = FailedDag {
        name: "wf".into(),
        failed: 12,
        succeeded: 3,
    };
    let created = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    // The controller releases a plan pod held by Argo's finalizer with the policy in force.
    let held = &plan.pods_to_delete[0];
    let finalizer = serde_json::json!({"metadata": {"finalizers": [labels::POD_STATUS_FINALIZER]}});
    Api::<Pod>::namespaced(admin.clone(), &namespace)
        .patch(held, &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .with_context(|| format!("adding Argo's finalizer to {held}"))?;
    let selector = format!("{}={}", labels::WORKFLOW, dag.name);
    let pods_before: BTreeSet<String> = ctl::pod_names(&cluster, &namespace, &selector)
        .await?
        .into_iter()
        .collect();

    let mut rewind = deployed.start("rewind-0", &sa_kubeconfig, work.path())?;

    // alice starts the retry with the annotation, the only thing she may do to a workflow.
    let from =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(1);
    let token = "retry-by-alice";
    let patch = serde_json::json!({"metadata": {"annotations": {annotations::RETRY: token}}});
    Api::<Workflow>::namespaced(alice.clone(), &namespace)
        .patch_metadata(&dag.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("alice (rewind-retry) annotating a workflow")?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let finished = ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await;
    let to = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(1);
    if let Some(exit) = rewind.child.try_wait()? {
        bail!("the controller exited ({exit}):\n{}", rewind.log());
    }
    rewind.child.start_kill()?;
    rewind.child.wait().await?;
    let (after, status) =
        finished.with_context(|| format!("the controller's log:\n{}", rewind.log()))?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "the retry ended {status:?}:\n{}",
        rewind.log()
    );
    ctl::ensure_reset_as_planned(&after, &plan.workflow, from, to)?;
    let pods_after: BTreeSet<String> = ctl::pod_names(&cluster, &namespace, &selector)
        .await?
        .into_iter()
        .collect();
    let planned: BTreeSet<String> = plan.pods_to_delete.iter().cloned().collect();
    let expected: BTreeSet<String> = pods_before.difference(&planned).cloned().collect();
    ensure!(
        pods_after == expected,
        "pods left {pods_after:?}, expected {expected:?}"
    );
    let log_text = rewind.log();
    ensure!(
        log_text.contains("acquired the lease"),
        "the controller never led (the chart turns leader election on):\n{log_text}"
    );

    // alice may also ask with a WorkflowRetry (the chart installed its CRD).
    let retries: Api<DynamicObject> = Api::namespaced_with(
        alice.clone(),
        &namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "rewind.dev",
            "v1alpha1",
            "WorkflowRetry",
        )),
    );
    let request: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "rewind.dev/v1alpha1",
        "kind": "WorkflowRetry",
        "metadata": {"name": "by-alice"},
        "spec": {"workflowName": dag.name},
    }))?;
    retries
        .create(&PostParams::default(), &request)
        .await
        .context("alice (rewind-retry) creating a WorkflowRetry")?;
    retries
        .get("by-alice")
        .await
        .context("alice reading her WorkflowRetry")?;
    retries
        .delete("by-alice", &DeleteParams::default())
        .await
        .context("alice (rewind-retry) cleaning up her WorkflowRetry")?;

    // alice may not touch pods.
    let alice_pods: Api<Pod> = Api::namespaced(alice, &namespace);
    forbidden(
        alice_pods.list(&ListParams::default()).await.map(drop),
        "alice listing pods",
    )?;
    let some_pod = pods_after
        .iter()
        .next()
        .context("no pod left to try deleting")?;
    forbidden(
        alice_pods
            .delete(some_pod, &DeleteParams::default())
            .await
            .map(drop),
        "alice deleting a pod",
    )?;
    // The controller may not touch what its rules do not name.
    let configmaps: Api<ConfigMap> = Api::namespaced(admin, &namespace);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("precious".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    configmaps.create(&PostParams::default(), &cm).await?;
    forbidden(
        Api::<ConfigMap>::namespaced(controller.clone(), &namespace)
            .delete("precious", &DeleteParams::default())
            .await
            .map(drop),
        "the controller's ServiceAccount deleting a ConfigMap",
    )?;
    configmaps
        .get("precious")
        .await
        .context("the ConfigMap is gone")?;

    // With the archive on, archived retries create workflows: the chart grants it.
    helm(
        &cluster,
        work.path(),
        &[
            "upgrade",
            RELEASE,
            CHART,
            "--namespace",
            &namespace,
            "--reuse-values",
            "--set",
            "archive.enabled=true",
            "--set",
            &format!("archive.argoNamespace={namespace}"),
        ],
    )
    .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !can_i(
        &controller,
        &namespace,
        "create",
        "argoproj.io",
        "workflows",
    )
    .await?
    {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "with archive.enabled=true the ServiceAccount may still not create workflows"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    helm(
        &cluster,
        work.path(),
        &["uninstall", RELEASE, "--namespace", &namespace],
    )
    .await?;
    Ok(())
}

/// A finalizer of someone else's, which the controller must leave.
const FOREIGN: &str = "example.com/keep";

/// A pod (never scheduled) held by [`FOREIGN`] and Argo's finalizer, in that order.
async fn held_pod(admin: &kube::Client, namespace: &str) -> anyhow::Result<Pod> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "held",
            "finalizers": [FOREIGN, labels::POD_STATUS_FINALIZER],
        },
        "spec": {
            "schedulerName": "rewind-test-unscheduled",
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }))?;
    Api::<Pod>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .context("creating pod held")
}

/// Whether `client` may `verb` `resource` (`RESOURCE/SUBRESOURCE` for a subresource) of API
/// `group` in `namespace`, as `kubectl auth can-i` asks it.
async fn can_i(
    client: &kube::Client,
    namespace: &str,
    verb: &str,
    group: &str,
    resource: &str,
) -> anyhow::Result<bool> {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, subresource)) => (resource, Some(subresource.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("asking whether the ServiceAccount may {verb} {resource}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

fn forbidden(result: Result<(), kube::Error>, what: &str) -> anyhow::Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
        Err(other) => bail!("{what}: expected 403 Forbidden, got {other}"),
        Ok(()) => bail!("{what} was allowed; it must be forbidden"),
    }
}

async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let config = Kubeconfig::read_from(kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}
