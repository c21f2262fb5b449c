//! The controller's RBAC (deploy/rbac/controller.yaml's ClusterRole), bound to the local
//! cluster's controller user, so tests and the demo run the controller with the rights a
//! real install grants cluster-wide.
//!
//! A real install grants Argo's ConfigMap and Secrets, and the Lease, by name in one
//! namespace each (deploy/rbac/argo-archive.yaml, deploy/rbac/leader-election.yaml). Tests
//! put Argo's ConfigMap and Secrets, and their Leases, in a namespace of their own, so the
//! test cluster's controller user also gets [`TESTENV_ROLE`]: test setup only, never shipped.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize as _;

use super::Error;
use super::kubeconfig::CONTROLLER_NAME;

const FILE: &str = "deploy/rbac/controller.yaml";
const CONTROLLER_RBAC: &str = include_str!("../../../deploy/rbac/controller.yaml");
const ARGO_API_FILE: &str = "deploy/rbac/argo-api.yaml";
const ARGO_API_RBAC: &str = include_str!("../../../deploy/rbac/argo-api.yaml");
const ARGO_API_SSO_FILE: &str = "deploy/rbac/argo-api-sso.yaml";
const ARGO_API_SSO_RBAC: &str = include_str!("../../../deploy/rbac/argo-api-sso.yaml");

/// TEST SETUP ONLY: what deploy/rbac grants by name in Argo's and the controller's
/// namespaces, granted in every namespace to the test cluster's controller user.
const TESTENV_ROLE: &str = "rewind-controller-testenv";

/// The controller's ClusterRole as deploy/rbac/controller.yaml ships it.
pub fn controller_cluster_role() -> Result<ClusterRole, Error> {
    cluster_role(FILE, CONTROLLER_RBAC)
}

/// The ClusterRole of `text` (deploy/rbac/`file`).
fn cluster_role(file: &'static str, text: &str) -> Result<ClusterRole, Error> {
    let invalid = |source| Error::Rbac { file, source };
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_yaml_ng::Value::deserialize(document).map_err(invalid)?;
        if value.get("kind").and_then(|k| k.as_str()) == Some("ClusterRole") {
            return serde_yaml_ng::from_value(value).map_err(invalid);
        }
    }
    Err(invalid(serde::de::Error::custom("it holds no ClusterRole")))
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
    // RBAC delegated to namespaces): the tests serve it.
    let argo_api = cluster_role(ARGO_API_FILE, ARGO_API_RBAC)?;
    let argo_api_sso = cluster_role(ARGO_API_SSO_FILE, ARGO_API_SSO_RBAC)?;
    for role in [
        controller_cluster_role()?,
        argo_api,
        argo_api_sso,
        testenv_role(),
    ] {
        bind_to_controller(client, role).await?;
    }
    Ok(())
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
