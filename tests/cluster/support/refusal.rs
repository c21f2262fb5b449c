//! ValidatingAdmissionPolicies that refuse chosen writes, to hold a controller at a point
//! of a retry (a write it cannot make) until the test lets it go on.

use std::time::Duration;

use anyhow::ensure;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rewind::protocol::crd::WorkflowRetry;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use serde_json::json;

use super::controller as ctl;

/// A ValidatingAdmissionPolicy (and its binding) refusing, in one namespace, any
/// WorkflowRetry status that names a workflow UID: what an archived retry writes right after
/// its create.
pub struct StatusRefusal {
    name: String,
    admin: kube::Client,
    /// The WorkflowRetry whose dry-run status writes probe the policy.
    request: String,
}

impl StatusRefusal {
    /// Installs the policy and waits until the API server enforces it on WorkflowRetry
    /// `request`, which must exist.
    pub async fn install(
        cluster: &LocalCluster,
        namespace: &str,
        retries: &Api<WorkflowRetry>,
        request: &str,
    ) -> anyhow::Result<StatusRefusal> {
        let admin = cluster.admin_client();
        let name = format!("{namespace}-refuse-created-status");
        let rule = json!({
            "apiGroups": ["rewind.dev"], "apiVersions": ["v1alpha1"],
            "operations": ["UPDATE"], "resources": ["workflowretries/status"],
        });
        let refuse = "!has(object.status) || !has(object.status.workflowUID)";
        install_refusal(
            &admin,
            &name,
            namespace,
            rule,
            refuse,
            "a status naming the created workflow",
        )
        .await?;
        let this = StatusRefusal {
            name,
            admin,
            request: request.to_owned(),
        };
        this.wait_until(retries, true).await?;
        Ok(this)
    }

    pub async fn remove(self, retries: &Api<WorkflowRetry>) -> anyhow::Result<()> {
        remove_refusal(&self.admin, &self.name).await?;
        self.wait_until(retries, false).await
    }

    /// Waits until the API server enforces the policy (`refused`) or no longer does, probing
    /// with a dry-run status write on the request (the policy applies to dry runs too).
    async fn wait_until(&self, retries: &Api<WorkflowRetry>, refused: bool) -> anyhow::Result<()> {
        let probe = json!({"status": {"workflowUID": "probe"}});
        let params = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let write = || async {
            retries
                .patch_status(&self.request, &params, &Patch::Merge(&probe))
                .await
                .map(|_| ())
        };
        wait_refusal(write, refused).await
    }
}

/// Installs ValidatingAdmissionPolicy `name` (and its binding) refusing, in `namespace`, the
/// writes `rule` matches whose object fails CEL `expression`; it says it refuses `what`.
pub async fn install_refusal(
    admin: &kube::Client,
    name: &str,
    namespace: &str,
    rule: serde_json::Value,
    expression: &str,
    what: &str,
) -> anyhow::Result<()> {
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [rule],
            },
            "validations": [{"expression": expression, "message": format!("{REFUSES} {what}")}],
        },
    }))?;
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await?;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Deletes the policy [`install_refusal`] installed.
pub async fn remove_refusal(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// What the test's policies say when they refuse.
const REFUSES: &str = "the test refuses";

/// Waits until a dry-run `write` (the policies apply to dry runs too) is refused by a test's
/// policy (`refused`) or goes through, at most 30 s.
pub async fn wait_refusal<F, W>(write: W, refused: bool) -> anyhow::Result<()>
where
    W: Fn() -> F,
    F: std::future::Future<Output = Result<(), kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let result = write().await;
        match (&result, refused) {
            (Err(kube::Error::Api(s)), true) if s.message.contains(REFUSES) => return Ok(()),
            (Ok(()), false) => return Ok(()),
            _ => {}
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the policy is not {} after 30s: {result:?}",
            if refused { "enforced" } else { "gone" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Status writes of the controller on WorkflowRetry `request` that the API server refused.
pub fn refused_status_writes(
    cluster: &LocalCluster,
    namespace: &str,
    request: &str,
) -> anyhow::Result<usize> {
    Ok(ctl::audit_log(cluster, namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "patch"
                && a.resource == "workflowretries"
                && a.name == request
                && a.code >= 400
        })
        .count())
}
