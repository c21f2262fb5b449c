//! Argo's offloaded node status: a workflow too large for etcd even
//! compressed keeps its nodes in Argo's database, and the workflow only names
//! the version (`status.offloadNodeStatusVersion`). A retry reads them first
//! and writes the reset nodes back as Argo's server does (`hydrator.Dehydrate`
//! in v4.1.4): compressed when over the size limit, offloaded when still too
//! large or when `ALWAYS_OFFLOAD_NODE_STATUS` is set.

use crate::argo::db::{ArgoDatabase, DbError};
use crate::argo::plan::compress;
use crate::argo::workflow::Workflow;

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
        source: DbError,
    },
    #[error("offloading the reset nodes of workflow {name}: {source}")]
    Write { name: String, source: DbError },
}

impl OffloadError {
    pub fn is_transient(&self) -> bool {
        match self {
            OffloadError::Read { source, .. } | OffloadError::Write { source, .. } => {
                source.is_transient()
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
    let nodes = db
        .offloaded_nodes(&uid, &version)
        .await
        .map_err(|source| OffloadError::Read {
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
    compression: &compress::Compression,
    version: crate::argo::plan::ArgoVersion,
    always_offload: bool,
) -> Result<(), OffloadError> {
    if !always_offload {
        // Compressing a large workflow's nodes takes a while: off the async workers.
        let (owned, compression) = (std::mem::take(wf), compression.clone());
        let (owned, fits) = crate::argo::off_thread(move || {
            let mut wf = owned;
            let fits = compress::dehydrate(&mut wf, max_size, &compression, version).is_ok();
            (wf, fits)
        })
        .await;
        *wf = owned;
        if fits {
            wf.status.offload_node_status_version = None;
            return Ok(());
        }
    }
    let nodes = wf.status.nodes.take().unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use futures::future::BoxFuture;
    use serde_json::{Value, json};

    use crate::argo::plan::compress::Nodes;

    use super::*;

    /// Offloaded nodes by (UID, version); versions are numbered, not hashed.
    #[derive(Default)]
    struct Table(Mutex<BTreeMap<(String, String), Value>>);

    impl ArgoDatabase for Table {
        fn archives(&self) -> bool {
            false
        }

        fn offloads(&self) -> bool {
            true
        }

        fn archived_workflow<'a>(
            &'a self,
            _uid: &'a str,
        ) -> BoxFuture<'a, Result<Option<Workflow>, DbError>> {
            Box::pin(async { Ok(None) })
        }

        fn offloaded_nodes<'a>(
            &'a self,
            uid: &'a str,
            version: &'a str,
        ) -> BoxFuture<'a, Result<Nodes, DbError>> {
            let row = self
                .0
                .lock()
                .unwrap()
                .get(&(uid.into(), version.into()))
                .cloned();
            // As the database's rows: JSON, read into node statuses.
            Box::pin(async move {
                let row = row.ok_or_else(|| DbError::OffloadedNodesMissing {
                    uid: uid.into(),
                    version: version.into(),
                    table: "t".into(),
                    target: "test".into(),
                })?;
                serde_json::from_value(row).map_err(|source| DbError::CorruptOffloadedNodes {
                    uid: uid.into(),
                    version: version.into(),
                    table: "t".into(),
                    target: "test".into(),
                    source,
                })
            })
        }

        fn offload_nodes<'a>(
            &'a self,
            uid: &'a str,
            _namespace: &'a str,
            nodes: &'a Nodes,
        ) -> BoxFuture<'a, Result<String, DbError>> {
            let mut rows = self.0.lock().unwrap();
            let version = format!("v{}", rows.len() + 1);
            let row = serde_json::to_value(nodes).expect("nodes serialize");
            rows.insert((uid.into(), version.clone()), row);
            Box::pin(async move { Ok(version) })
        }
    }

    fn workflow() -> Workflow {
        serde_json::from_value(json!({
            "metadata": {"name": "wf", "namespace": "ns", "uid": "u1"},
            "status": {"phase": "Failed", "nodes": {"wf": {"id": "wf", "name": "wf", "type": "Pod", "phase": "Failed"}}},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_workflow_without_offloaded_nodes_is_left_alone() {
        let mut wf = workflow();
        hydrate(None, &mut wf).await.unwrap();
        assert_eq!(wf, workflow());
    }

    #[tokio::test]
    async fn offloaded_nodes_need_a_database_and_come_back_from_it() {
        let mut offloaded = workflow();
        let nodes = serde_json::to_value(offloaded.status.nodes.take()).unwrap();
        offloaded.status.offload_node_status_version = Some("v1".into());
        let err = hydrate(None, &mut offloaded.clone()).await.unwrap_err();
        assert!(matches!(err, OffloadError::NoDatabase { .. }), "{err}");

        let table = Table::default();
        table
            .0
            .lock()
            .unwrap()
            .insert(("u1".into(), "v1".into()), nodes);
        let mut wf = offloaded.clone();
        hydrate(Some(&table), &mut wf).await.unwrap();
        assert_eq!(wf, workflow());

        table
            .0
            .lock()
            .unwrap()
            .insert(("u1".into(), "v1".into()), json!(["not nodes"]));
        let err = hydrate(Some(&table), &mut offloaded).await.unwrap_err();
        assert!(
            matches!(
                err,
                OffloadError::Read {
                    source: DbError::CorruptOffloadedNodes { .. },
                    ..
                }
            ) && !err.is_transient(),
            "{err}"
        );
    }

    #[tokio::test]
    async fn dehydrate_compresses_within_the_limit_and_offloads_beyond_it_or_always() {
        let table = Table::default();
        let mut small = workflow();
        dehydrate(
            &table,
            &mut small,
            1 << 20,
            &Default::default(),
            Default::default(),
            false,
        )
        .await
        .unwrap();
        assert_eq!(small, workflow());
        assert!(table.0.lock().unwrap().is_empty());

        for (max, always) in [(10, false), (1 << 20, true)] {
            let mut wf = workflow();
            dehydrate(
                &table,
                &mut wf,
                max,
                &Default::default(),
                Default::default(),
                always,
            )
            .await
            .unwrap();
            let version = wf.status.offload_node_status_version.clone().unwrap();
            assert!(wf.status.nodes.is_none() && wf.status.compressed_nodes.is_none());
            let stored = table.0.lock().unwrap()[&("u1".to_string(), version)].clone();
            assert_eq!(
                stored,
                serde_json::to_value(workflow().status.nodes).unwrap()
            );
        }
    }
}
