//! The chart's admission policy on a real API server: a user may create a WorkflowRetry only
//! if Argo would let the same user do that retry. The policy, its binding and the
//! `rewind-retry` role are applied as `helm template` renders them (the binding limited to
//! this test's namespace with the chart's `admission.namespaceSelector`, so other tests'
//! users are not held to it; the role renamed, as the chart install test installs its own).
//! No controller runs: this is about what the API server admits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, RoleBinding};
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rewind::protocol::crd::{ASKED_BY, WorkflowRetry};
use rewind::testenv::localcluster::{LocalCluster, USER_NAME};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;

use crate::support::grants::{bind_user, grant_user, rule};
use crate::support::helm::{CHART, helm};
use crate::support::workflowretry::{archived, live};

/// The release name the chart is rendered under: its policy's name differs from the chart
/// install test's.
const RELEASE: &str = "admission";
const POLICY: &str = "admission-rewind-workflowretry-permissions";
/// How long a new policy, or a new grant, may take to be in force.
const TAKES_EFFECT: Duration = Duration::from_secs(30);

const ARCHIVED_REFUSAL: &str = "creating a WorkflowRetry for an archived workflow needs permission to create workflows in namespace";
const LIVE_REFUSAL: &str = "needs permission to patch that workflow";

pub async fn a_workflowretry_needs_what_argo_would_need_of_the_same_user(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let work = tempfile::tempdir()?;
    let rendered = helm(
        &cluster,
        work.path(),
        &[
            "template",
            RELEASE,
            CHART,
            "--namespace",
            &namespace,
            "--set",
            &format!(
                "admission.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={namespace}"
            ),
            "--show-only",
            "templates/admission.yaml",
            "--show-only",
            "templates/user-roles.yaml",
        ],
    )
    .await?;
    let policy: ValidatingAdmissionPolicy = rendered_object(&rendered, POLICY)?;
    let binding: ValidatingAdmissionPolicyBinding = rendered_object(&rendered, POLICY)?;
    let mut retry_role: ClusterRole = rendered_object(&rendered, "rewind-retry")?;
    let retry_role_name = format!("rewind-retry-{namespace}");
    retry_role.metadata.name = Some(retry_role_name.clone());
    apply(&Api::all(admin.clone()), &policy).await?;
    apply(&Api::all(admin.clone()), &binding).await?;
    apply(&Api::all(admin.clone()), &retry_role).await?;
    bind_user(&admin, &namespace, "ClusterRole", &retry_role_name).await?;

    let retries: Api<WorkflowRetry> = Api::namespaced(cluster.user_client(), &namespace);
    // Bound to rewind-retry only: the user may create WorkflowRetry objects (RBAC) but not
    // workflows, so an archived retry is refused by the policy, once it is in force.
    ensure_refused(
        &retries,
        &archived("archived", "4f1c0000-0000-4000-8000-000000000001"),
        &[
            ARCHIVED_REFUSAL,
            &namespace,
            "argo archive retry",
            "ask for it",
            USER_NAME,
        ],
    )
    .await
    .context("an archived retry by a user who may not create workflows")?;
    // Only rewind's ServiceAccount records who asked: a user naming anyone is refused.
    let mut forged = live("forged", "wf-any", None);
    forged.metadata.annotations =
        Some([(ASKED_BY.to_owned(), r#"{"user":"admin"}"#.to_owned())].into());
    ensure_refused(
        &retries,
        &forged,
        &[ASKED_BY, "only rewind sets it", USER_NAME, "may not set it"],
    )
    .await
    .context("a WorkflowRetry naming someone as who asked for it")?;
    // rewind-retry may patch every workflow of the namespace: a live retry is admitted.
    retries
        .create(&PostParams::default(), &live("live", "wf-any", None))
        .await
        .context("a live WorkflowRetry by a user who may patch the workflow")?;
    // Nor may anyone else add it later, an administrator included.
    let tamper = serde_json::json!({"metadata": {"annotations": {ASKED_BY: r#"{"user":"x"}"#}}});
    let refused = admission_refusal(
        Api::<WorkflowRetry>::namespaced(admin.clone(), &namespace)
            .patch("live", &PatchParams::default(), &Patch::Merge(&tamper))
            .await,
    )?;
    ensure!(
        refused.contains("may not change it"),
        "the refusal does not say so: {refused}"
    );

    // Granted create on workflows, as Argo's own edit role would, the archived retry is admitted.
    let create = rule("argoproj.io", "workflows", &["create"]);
    grant_user(&admin, &namespace, "create-workflows", vec![create]).await?;
    wait_admitted(
        &retries,
        &archived("archived", "4f1c0000-0000-4000-8000-000000000001"),
    )
    .await
    .context("an archived retry once the user may create workflows")?;

    // Now without rewind-retry: WorkflowRetry objects, and patch on one workflow by name.
    Api::<RoleBinding>::namespaced(admin.clone(), &namespace)
        .delete(&retry_role_name, &DeleteParams::default())
        .await?;
    let rules = vec![
        rule("rewind.dev", "workflowretries", &["create"]),
        patch_workflow("wf-mine"),
    ];
    grant_user(&admin, &namespace, "retry-one-workflow", rules).await?;
    ensure_refused(
        &retries,
        &live("theirs", "wf-theirs", None),
        &[
            LIVE_REFUSAL,
            &format!("{namespace}/wf-theirs"),
            "ask for it",
            USER_NAME,
        ],
    )
    .await
    .context("a live retry of a workflow the user may not patch")?;
    wait_admitted(&retries, &live("mine", "wf-mine", None))
        .await
        .context("a live retry of the one workflow the user may patch")?;
    // Granted patch on that workflow too, its retry is admitted.
    let rules = vec![patch_workflow("wf-theirs")];
    grant_user(&admin, &namespace, "patch-theirs", rules).await?;
    wait_admitted(&retries, &live("theirs", "wf-theirs", None))
        .await
        .context("a live retry once the user may patch the workflow")?;

    let delete = DeleteParams::default();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .delete(POLICY, &delete)
        .await?;
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .delete(POLICY, &delete)
        .await?;
    Api::<ClusterRole>::all(admin)
        .delete(&retry_role_name, &delete)
        .await?;
    Ok(())
}

/// The object named `name` of type `K` among `helm template`'s output.
fn rendered_object<K>(yaml: &str, name: &str) -> anyhow::Result<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    for document in serde_yaml_ng::Deserializer::from_str(yaml) {
        let value = serde_yaml_ng::Value::deserialize(document)?;
        if value.get("kind").and_then(|k| k.as_str()) == Some(&*K::kind(&()))
            && value["metadata"]["name"].as_str() == Some(name)
        {
            return Ok(serde_yaml_ng::from_value(value)?);
        }
    }
    bail!("the chart rendered no {} {name}:\n{yaml}", K::kind(&()))
}

async fn apply<K>(api: &Api<K>, object: &K) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply("rewind-test"),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("applying {name}"))?;
    Ok(())
}

/// `patch` on workflow `name` only.
fn patch_workflow(name: &str) -> PolicyRule {
    PolicyRule {
        resource_names: Some(vec![name.to_owned()]),
        ..rule("argoproj.io", "workflows", &["patch"])
    }
}

/// The message of a create the policy refused; an error for anything else.
fn admission_refusal(result: Result<WorkflowRetry, kube::Error>) -> anyhow::Result<String> {
    match result {
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("ValidatingAdmissionPolicy") =>
        {
            Ok(status.message)
        }
        Err(other) => bail!("expected the admission policy's 403, got {other}"),
        Ok(created) => bail!("the create was admitted: {:?}", created.spec),
    }
}

/// Creates `object` in server-side dry runs (nothing is stored) until the policy refuses it
/// (it may take a moment to be in force, and a revoked grant to be gone), then for real:
/// refused too, saying each of `says`.
async fn ensure_refused(
    retries: &Api<WorkflowRetry>,
    object: &WorkflowRetry,
    says: &[&str],
) -> anyhow::Result<()> {
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + TAKES_EFFECT;
    while let Err(error) = admission_refusal(retries.create(&dry_run, object).await) {
        if Instant::now() >= deadline {
            return Err(error.context(format!("still not refused after {TAKES_EFFECT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let message = admission_refusal(retries.create(&PostParams::default(), object).await)?;
    for part in says {
        ensure!(
            message.contains(part),
            "the refusal does not say {part:?}: {message}"
        );
    }
    Ok(())
}

/// Creates `object` until it is admitted (a grant reaches the authorizer within moments).
async fn wait_admitted(retries: &Api<WorkflowRetry>, object: &WorkflowRetry) -> anyhow::Result<()> {
    let deadline = Instant::now() + TAKES_EFFECT;
    loop {
        match retries.create(&PostParams::default(), object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 403 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(error) => {
                return Err(error).context(format!(
                    "creating WorkflowRetry {}",
                    object.meta().name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
}
