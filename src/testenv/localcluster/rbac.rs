//! The controller's RBAC (deploy/rbac/controller.yaml's ClusterRole, and argo-api.yaml's and
//! argo-archive.yaml's), bound to the local cluster's controller user, so tests and the demo
//! run the controller with the rights a real install grants cluster-wide, held, as there, to
//! changing a pod only by removing Argo's finalizer (deploy/rbac/controller-pod-policy.yaml).
//!
//! A real install grants Argo's ConfigMap and Secrets, and the Lease, by name in one
//! namespace each (deploy/rbac/argo-archive.yaml, deploy/rbac/leader-election.yaml), and,
//! with the archive, create on workflows everywhere (argo-archive.yaml's ClusterRole). Tests
//! put Argo's ConfigMap and Secrets, and their Leases, in a namespace of their own, so the
//! test cluster's controller user also gets [`TESTENV_ROLE`]: test setup only, never shipped.

use k8s_openapi::Resource;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;

use super::Error;
use super::kubeconfig::CONTROLLER_NAME;

const FILE: &str = "deploy/rbac/controller.yaml";
const CONTROLLER_RBAC: &str = include_str!("../../../deploy/rbac/controller.yaml");
const ARGO_API_FILE: &str = "deploy/rbac/argo-api.yaml";
const ARGO_API_RBAC: &str = include_str!("../../../deploy/rbac/argo-api.yaml");
const ARCHIVE_FILE: &str = "deploy/rbac/argo-archive.yaml";
const ARCHIVE_RBAC: &str = include_str!("../../../deploy/rbac/argo-archive.yaml");
const POD_POLICY_FILE: &str = "deploy/rbac/controller-pod-policy.yaml";
const POD_POLICY: &str = include_str!("../../../deploy/rbac/controller-pod-policy.yaml");
const ARGO_API_SSO_FILE: &str = "deploy/rbac/argo-api-sso.yaml";
const ARGO_API_SSO_RBAC: &str = include_str!("../../../deploy/rbac/argo-api-sso.yaml");

/// TEST SETUP ONLY: what deploy/rbac grants by name in Argo's and the controller's
/// namespaces, granted in every namespace to the test cluster's controller user.
const TESTENV_ROLE: &str = "rewind-controller-testenv";

/// An hour's token of ServiceAccount `name` of `accounts`, as a pod running under it holds.
pub async fn service_account_token(
    accounts: &Api<ServiceAccount>,
    name: &str,
) -> Result<String, Error> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|source| Error::Kube {
            action: format!("requesting a token of ServiceAccount {name}"),
            source,
        })?;
    // The API server answers every TokenRequest it grants with a status.
    Ok(answer.status.map(|s| s.token).unwrap_or_default())
}

/// The controller's ClusterRole as deploy/rbac/controller.yaml ships it.
pub fn controller_cluster_role() -> Result<ClusterRole, Error> {
    cluster_role(FILE, CONTROLLER_RBAC)
}

/// The ClusterRole of `text` (deploy/rbac/`file`).
fn cluster_role(file: &'static str, text: &str) -> Result<ClusterRole, Error> {
    object(file, text)
}

/// The first object of kind `K` in `text` (deploy/rbac/`file`).
fn object<K>(file: &'static str, text: &str) -> Result<K, Error>
where
    K: Resource + DeserializeOwned,
{
    let kind = K::KIND;
    let invalid = |source| Error::Rbac { file, kind, source };
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_yaml_ng::Value::deserialize(document).map_err(invalid)?;
        if value.get("kind").and_then(|k| k.as_str()) == Some(kind) {
            return serde_yaml_ng::from_value(value).map_err(invalid);
        }
    }
    Err(invalid(serde::de::Error::custom(format!(
        "it holds no {kind}"
    ))))
}

/// deploy/rbac/controller-pod-policy.yaml's policy and binding, holding the test
/// cluster's controller user (instead of the ServiceAccount rewind/rewind) to changing a
/// pod only by removing Argo's finalizer, as a real install holds the controller.
async fn install_pod_policy(client: &kube::Client) -> Result<(), Error> {
    let mut policy: ValidatingAdmissionPolicy = object(POD_POLICY_FILE, POD_POLICY)?;
    let binding: ValidatingAdmissionPolicyBinding = object(POD_POLICY_FILE, POD_POLICY)?;
    let shipped = "'system:serviceaccount:rewind:rewind'";
    let conditions = policy
        .spec
        .as_mut()
        .and_then(|s| s.match_conditions.as_mut())
        .into_iter()
        .flatten()
        .filter(|c| c.expression.contains(shipped));
    let mut replaced = 0;
    for condition in conditions {
        condition.expression = condition
            .expression
            .replace(shipped, &format!("'{CONTROLLER_NAME}'"));
        replaced += 1;
    }
    if replaced == 0 {
        return Err(Error::Rbac {
            file: POD_POLICY_FILE,
            kind: ValidatingAdmissionPolicy::KIND,
            source: serde::de::Error::custom(format!("no matchCondition names {shipped}")),
        });
    }
    let apply = PatchParams::apply("rewind-localcluster");
    let name = policy.metadata.name.clone().unwrap_or_default();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(&name, &apply, &Patch::Apply(&policy))
        .await
        .map_err(Error::kube(format!(
            "installing ValidatingAdmissionPolicy {name}"
        )))?;
    let name = binding.metadata.name.clone().unwrap_or_default();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .patch(&name, &apply, &Patch::Apply(&binding))
        .await
        .map_err(Error::kube(format!(
            "installing ValidatingAdmissionPolicyBinding {name}"
        )))?;
    Ok(())
}

/// [`TESTENV_ROLE`]: Argo's ConfigMap and database Secrets, and Leases, anywhere.
fn testenv_role() -> ClusterRole {
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(TESTENV_ROLE.into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule("", &["configmaps", "secrets"], &["get"]),
            rule(
                "coordination.k8s.io",
                &["leases"],
                &["get", "create", "patch"],
            ),
        ]),
        ..Default::default()
    }
}

pub(super) async fn install_controller(client: &kube::Client) -> Result<(), Error> {
    // Argo's retry API too (deploy/rbac/argo-api.yaml, and argo-api-sso.yaml for SSO
    // RBAC delegated to namespaces): the tests serve it. And archived retries, which
    // create workflows (deploy/rbac/argo-archive.yaml's ClusterRole).
    let argo_api = cluster_role(ARGO_API_FILE, ARGO_API_RBAC)?;
    let argo_api_sso = cluster_role(ARGO_API_SSO_FILE, ARGO_API_SSO_RBAC)?;
    let archived = cluster_role(ARCHIVE_FILE, ARCHIVE_RBAC)?;
    for role in [
        controller_cluster_role()?,
        argo_api,
        argo_api_sso,
        archived,
        testenv_role(),
    ] {
        bind_to_controller(client, role).await?;
    }
    install_pod_policy(client).await
}

/// Applies `role` and a ClusterRoleBinding of the same name to [`CONTROLLER_NAME`].
async fn bind_to_controller(client: &kube::Client, role: ClusterRole) -> Result<(), Error> {
    let name = role.metadata.name.clone().unwrap_or_default();
    let apply = PatchParams::apply("rewind-localcluster");
    Api::<ClusterRole>::all(client.clone())
        .patch(&name, &apply, &Patch::Apply(&role))
        .await
        .map_err(Error::kube(format!("installing ClusterRole {name}")))?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: CONTROLLER_NAME.into(),
            namespace: None,
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(&name, &apply, &Patch::Apply(&binding))
        .await
        .map_err(Error::kube(format!(
            "binding ClusterRole {name} to {CONTROLLER_NAME}"
        )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_cluster_role_parses_and_names_no_namespaced_secret_or_lease() {
        let role = controller_cluster_role().unwrap();
        assert_eq!(role.metadata.name.as_deref(), Some("rewind-controller"));
        let resources: Vec<&str> = role
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.resources.iter().flatten())
            .map(String::as_str)
            .collect();
        for scoped in ["secrets", "configmaps", "leases"] {
            assert!(!resources.contains(&scoped), "{resources:?}");
        }
    }
}
