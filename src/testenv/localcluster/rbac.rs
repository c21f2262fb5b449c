//! The controller's RBAC (deploy/rbac/controller.yaml), bound to the local
//! cluster's controller user, so tests and the demo run the controller with
//! exactly the rights a real install grants.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use super::Error;
use super::kubeconfig::CONTROLLER_NAME;

const CLUSTER_ROLE: &str = include_str!("../../../deploy/rbac/controller.yaml");

pub(super) async fn install_controller(client: &kube::Client) -> Result<(), Error> {
    let role: ClusterRole = serde_yaml_ng::from_str(CLUSTER_ROLE).map_err(|source| Error::Crd {
        file: "deploy/rbac/controller.yaml",
        source,
    })?;
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
