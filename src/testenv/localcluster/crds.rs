//! Argo's Workflow CRDs, in the minimal form Argo ships (deploy/crds/argo/),
//! and rewind's WorkflowRetry CRD (deploy/crds/), so a test can create both.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use super::Error;

const FILES: &[(&str, &str)] = &[
    (
        "argoproj.io_workflows.yaml",
        include_str!("../../../deploy/crds/argo/argoproj.io_workflows.yaml"),
    ),
    (
        "argoproj.io_workflowtemplates.yaml",
        include_str!("../../../deploy/crds/argo/argoproj.io_workflowtemplates.yaml"),
    ),
    (
        "argoproj.io_clusterworkflowtemplates.yaml",
        include_str!("../../../deploy/crds/argo/argoproj.io_clusterworkflowtemplates.yaml"),
    ),
    (
        "rewind.dev_workflowretries.yaml",
        include_str!("../../../deploy/crds/rewind.dev_workflowretries.yaml"),
    ),
];

pub(super) fn argo() -> Result<Vec<CustomResourceDefinition>, Error> {
    FILES
        .iter()
        .map(|(file, yaml)| {
            serde_yaml_ng::from_str(yaml).map_err(|source| Error::Crd { file, source })
        })
        .collect()
}

/// Creates or updates each CRD (server-side apply, so a rerun is harmless).
pub(super) async fn install(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::apply("rewind-localcluster"),
            &Patch::Apply(crd),
        )
        .await
        .map_err(Error::kube(format!("installing CRD {name}")))?;
    }
    Ok(())
}

/// Whether every named CRD is Established (its API is served).
pub(super) async fn established(client: &kube::Client, names: &[String]) -> bool {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in names {
        let Ok(crd) = api.get(name).await else {
            return false;
        };
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if !conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argo_crds_are_the_minimal_form() {
        let crds = argo().unwrap();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "workflows.argoproj.io",
                "workflowtemplates.argoproj.io",
                "clusterworkflowtemplates.argoproj.io",
                "workflowretries.rewind.dev"
            ]
        );
        for crd in crds.iter().filter(|c| c.spec.group == "argoproj.io") {
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, "v1alpha1");
            // No status subresource: Argo writes status with plain updates.
            assert!(
                version
                    .subresources
                    .as_ref()
                    .is_none_or(|s| s.status.is_none()),
                "{:?}",
                crd.metadata.name
            );
        }
    }
}
