//! The Helm chart installed for real: `helm install` on the local control plane, then the
//! `rewind` binary run with the installed Deployment's arguments and environment, signed in as
//! the chart's ServiceAccount (a TokenRequest token), serves a retry that a user bound only to
//! `rewind-retry` asked for. That user may create and delete a WorkflowRetry (the chart's
//! admission policy admits it) but not list or delete pods; the ServiceAccount may not
//! delete a ConfigMap, create workflows (unless the archive is on) or change a pod but by
//! releasing it from Argo's finalizer (the chart's pod policy), as it does in the retry.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::{LocalCluster, Role};
use rewind::testenv::workload::FailedDag;
use tokio::process::Command;

use crate::support::controller as ctl;
use crate::support::helm::{CHART, helm};
use crate::support::pod_policy;

const RELEASE: &str = "rewind";

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

    let deployment = Api::<Deployment>::namespaced(admin.clone(), &namespace)
        .get(RELEASE)
        .await
        .context("the chart's Deployment")?;
    let pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .context("the Deployment has no pod spec")?;
    let sa_name = pod
        .service_account_name
        .clone()
        .context("the Deployment names no ServiceAccount")?;
    let container = pod.containers.into_iter().next().context("no container")?;
    let pod_name = "rewind-0";
    // The certificate the chart generated for Argo's retry API, where the
    // mounted Secret would put it.
    let tls = Api::<Secret>::namespaced(admin.clone(), &namespace)
        .get(&format!("{RELEASE}-argo-api-tls"))
        .await
        .context("the chart's Secret for Argo's retry API")?;
    let mut written = Vec::new();
    for key in ["tls.crt", "tls.key"] {
        let data = tls
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .with_context(|| format!("the Secret has no {key}"))?;
        let path = work.path().join(key);
        std::fs::write(&path, &data.0)?;
        written.push(path.display().to_string());
    }
    let (cert_file, key_file) = (&written[0], &written[1]);
    // The installed arguments, except that tests listen on loopback only and
    // read the certificate from where this test wrote it.
    let args: Vec<String> = container
        .args
        .unwrap_or_default()
        .into_iter()
        .map(|a| match a.split_once('=') {
            Some(("--http-addr", _)) => "--http-addr=127.0.0.1:0".to_owned(),
            Some(("--argo-api-addr", _)) => "--argo-api-addr=127.0.0.1:0".to_owned(),
            Some(("--argo-api-tls-cert", _)) => format!("--argo-api-tls-cert={cert_file}"),
            Some(("--argo-api-tls-key", _)) => format!("--argo-api-tls-key={key_file}"),
            _ => a,
        })
        .collect();
    ensure!(
        args.contains(&format!("--namespace={namespace}")),
        "the Deployment does not scope the controller to {namespace}: {args:?}"
    );
    let mut env = Vec::new();
    let limits = container
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    for var in container.env.unwrap_or_default() {
        let from = var.value_from.unwrap_or_default();
        let value = match (var.value, from.field_ref, from.resource_field_ref) {
            (Some(value), _, _) => value,
            (None, Some(field), _) => match field.field_path.as_str() {
                "metadata.name" => pod_name.to_owned(),
                "metadata.namespace" => namespace.clone(),
                other => bail!(
                    "env {} refers to {other}, which this test cannot stand in for",
                    var.name
                ),
            },
            // As the kubelet gives it: the limit in bytes, or in millicores.
            (None, None, Some(field)) => {
                let limit = |name: &str| {
                    limits
                        .get(name)
                        .map(|q| q.0.clone())
                        .with_context(|| format!("env {} needs a {name} limit", var.name))
                };
                match field.resource.as_str() {
                    "limits.memory" => bytes(&limit("memory")?)?.to_string(),
                    "limits.cpu" => millicores(&limit("cpu")?)?.to_string(),
                    other => bail!(
                        "env {} refers to {other}, which this test cannot stand in for",
                        var.name
                    ),
                }
            }
            (None, None, None) => String::new(),
        };
        env.push((var.name, value));
    }

    let sa_kubeconfig = kubeconfig_for(&cluster, &namespace, &sa_name, work.path()).await?;
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
        kubeconfig_for(&cluster, &namespace, "alice", work.path()).await?
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

    let log = work.path().join("controller.log");
    let out = std::fs::File::create(&log)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("KUBECONFIG", &sa_kubeconfig)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .context("starting the rewind binary")?;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

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
    if let Some(exit) = child.try_wait()? {
        bail!("the controller exited ({exit}):\n{}", read_log());
    }
    child.start_kill()?;
    child.wait().await?;
    let (after, status) =
        finished.with_context(|| format!("the controller's log:\n{}", read_log()))?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "the retry ended {status:?}:\n{}",
        read_log()
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
    let log_text = read_log();
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

/// A kubeconfig for the cluster signed in as ServiceAccount `name` with a TokenRequest token.
async fn kubeconfig_for(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let sas: Api<ServiceAccount> = Api::namespaced(cluster.admin_client(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a TokenRequest for ServiceAccount {namespace}/{name}"))?
        .status
        .context("the TokenRequest has no status")?
        .token;
    let mut config = Kubeconfig::read_from(cluster.kubeconfig_path(Role::Controller))?;
    for auth in &mut config.auth_infos {
        auth.auth_info = Some(AuthInfo {
            token: Some(token.clone().into()),
            ..Default::default()
        });
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&config)?)?;
    Ok(path)
}

async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let config = Kubeconfig::read_from(kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A memory quantity in bytes (the forms the chart uses: plain, Ki, Mi, Gi).
fn bytes(quantity: &str) -> anyhow::Result<u64> {
    let (number, unit) = match quantity.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => quantity.split_at(at),
        None => (quantity, ""),
    };
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => bail!("memory quantity {quantity}: unit {other} not handled here"),
    };
    Ok(number.parse::<u64>()? * scale)
}

/// A CPU quantity in millicores ("1", "500m").
fn millicores(quantity: &str) -> anyhow::Result<u64> {
    Ok(match quantity.strip_suffix('m') {
        Some(milli) => milli.parse()?,
        None => quantity.parse::<u64>()? * 1000,
    })
}
