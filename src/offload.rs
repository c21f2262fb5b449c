//! Argo's offloaded node status: a workflow too large for etcd even
//! compressed keeps its nodes in Argo's database, and the workflow only names
//! the version (`status.offloadNodeStatusVersion`). A retry reads them first
//! and writes the reset nodes back as Argo's server does (`hydrator.Dehydrate`
//! in v4.1.4): compressed when over the size limit, offloaded when still too
//! large or when `ALWAYS_OFFLOAD_NODE_STATUS` is set.

use crate::archived::{ArgoDatabase, DatabaseError};
use crate::plan::compress::{self, Nodes};
use crate::workflow::Workflow;

/// Why offloaded nodes could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error(
        "workflow {name}'s nodes are offloaded to Argo's database (version {version}) but this controller has no database: configure Argo's persistence with nodeStatusOffLoad in the ConfigMap given by --argo-configmap"
    )]
    NoDatabase { name: String, version: String },
    #[error("reading the offloaded nodes of workflow {name} (version {version}): {source}")]
    Read {
        name: String,
        version: String,
        source: DatabaseError,
    },
    #[error(
        "the offloaded nodes of workflow {name} (version {version}) are not Argo's node status: {source}"
    )]
    Corrupt {
        name: String,
        version: String,
        source: serde_json::Error,
    },
    #[error("offloading the reset nodes of workflow {name}: {source}")]
    Write { name: String, source: DatabaseError },
}

impl OffloadError {
    pub fn is_transient(&self) -> bool {
        match self {
            OffloadError::Read { source, .. } | OffloadError::Write { source, .. } => {
                source.transient
            }
            _ => false,
        }
    }
}

/// The offload version `wf` names, if its nodes are offloaded.
pub fn offloaded_version(wf: &Workflow) -> Option<&str> {
    wf.status
        .offload_node_status_version
        .as_deref()
        .filter(|v| !v.is_empty())
}

/// Puts the offloaded nodes back into `wf`, as Argo's hydrator does; a
/// workflow whose nodes are not offloaded is left as it is.
pub async fn hydrate(db: Option<&dyn ArgoDatabase>, wf: &mut Workflow) -> Result<(), OffloadError> {
    let Some(version) = offloaded_version(wf).map(str::to_owned) else {
        return Ok(());
    };
    let name = wf.name().to_owned();
    let Some(db) = db else {
        return Err(OffloadError::NoDatabase { name, version });
    };
    let uid = wf.metadata.uid.clone().unwrap_or_default();
    let value = db
        .offloaded_nodes(&uid, &version)
        .await
        .map_err(|source| OffloadError::Read {
            name: name.clone(),
            version: version.clone(),
            source,
        })?;
    let nodes: Nodes = serde_json::from_value(value).map_err(|source| OffloadError::Corrupt {
        name,
        version,
        source,
    })?;
    wf.status.nodes = Some(nodes);
    wf.status.offload_node_status_version = None;
    Ok(())
}

/// Writes the nodes of the hydrated `wf` as Argo's `Dehydrate` does:
/// compressed if the workflow is over `max_size`, offloaded under the
/// workflow's UID if still too large or if `always_offload`.
pub async fn dehydrate(
    db: &dyn ArgoDatabase,
    wf: &mut Workflow,
    max_size: usize,
    always_offload: bool,
) -> Result<(), OffloadError> {
    if !always_offload && compress::dehydrate(wf, max_size).is_ok() {
        wf.status.offload_node_status_version = None;
        return Ok(());
    }
    let nodes =
        serde_json::to_value(wf.status.nodes.take().unwrap_or_default()).expect("nodes serialize");
    let uid = wf.metadata.uid.clone().unwrap_or_default();
    let namespace = wf.metadata.namespace.clone().unwrap_or_default();
    let version = db
        .offload_nodes(&uid, &namespace, &nodes)
        .await
        .map_err(|source| OffloadError::Write {
            name: wf.name().to_owned(),
            source,
        })?;
    wf.status.compressed_nodes = None;
    wf.status.offload_node_status_version = Some(version);
    Ok(())
}
