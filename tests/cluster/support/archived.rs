//! Archived workflows: the fixture of the archived retry tests (a failed workflow archived,
//! then deleted while its pods, held by Argo's finalizer, stay as the retry's leftovers), and
//! an archive kept in the test for the tests about the Kubernetes half.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rewind::argo::db::{ArgoDatabase, DbError};
use rewind::argo::plan::Plan;
use rewind::argo::plan::compress::Nodes;
use rewind::argo::workflow::{Workflow, labels};
use rewind::testenv::db::DbServer;
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::{FailedDag, delete_workflow};

use super::argodb;
use super::controller as ctl;

/// Archived rows by UID.
pub struct Rows(pub BTreeMap<String, Workflow>);

impl ArgoDatabase for Rows {
    fn archives(&self) -> bool {
        true
    }

    fn offloads(&self) -> bool {
        false
    }

    fn archived_workflow<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<Workflow>, DbError>> {
        Box::pin(async move { Ok(self.0.get(uid).cloned()) })
    }

    fn offloaded_nodes<'a>(
        &'a self,
        _uid: &'a str,
        _version: &'a str,
    ) -> BoxFuture<'a, Result<Nodes, DbError>> {
        Box::pin(async { Err(no_offload_table()) })
    }

    fn offload_nodes<'a>(
        &'a self,
        _uid: &'a str,
        _namespace: &'a str,
        _nodes: &'a Nodes,
    ) -> BoxFuture<'a, Result<String, DbError>> {
        Box::pin(async { Err(no_offload_table()) })
    }
}

/// These tests' workflows are small: nothing is offloaded.
fn no_offload_table() -> DbError {
    DbError::Config {
        configmap: "none".into(),
        problem: "the test's archive has no offload table".into(),
    }
}

/// Creates `pods` with Argo's pod finalizer and sets each pod's phase.
pub async fn create_held_pods(
    pods: &Api<Pod>,
    items: Vec<(Pod, &'static str)>,
) -> anyhow::Result<()> {
    for (mut pod, phase) in items {
        pod.metadata.finalizers = Some(vec![labels::POD_STATUS_FINALIZER.into()]);
        let name = pod.name_any();
        pods.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod {name}"))?;
        let status = serde_json::json!({"status": {"phase": phase}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
    }
    Ok(())
}

/// Where [`Archived::create`] archives the workflow, and so the row its retry reads.
pub enum Archive<'a> {
    /// Nowhere but the test: the row is the workflow exactly as the API server returned it
    /// before its deletion (what Argo archives), served by [`Archived::rows`].
    InTest,
    /// Argo's database, written by Argo's own code: the row is Argo's read of it back.
    Argo(&'a DbServer),
}

/// A failed workflow archived, then deleted while its pods (held by Argo's finalizer) stay.
pub struct Archived {
    /// The workflow's name, which the workflow an archived retry creates takes again.
    pub name: String,
    /// The deleted workflow's UID, which a WorkflowRetry names.
    pub uid: String,
    /// The archived row, as the retry reads it.
    pub row: Workflow,
    /// The planner's retry of the row: its pods are the leftovers the retry deletes.
    pub plan: Plan,
    /// The workflow's pods outside the plan, which the retry must leave.
    pub kept: Vec<String>,
}

impl Archived {
    /// Creates `dag`'s workflow and its pods, held by Argo's finalizer, archives the workflow
    /// in `archive`, deletes it (waiting up to 20 s for it to go) and plans its retry, which
    /// must leave some pods (`dag` has succeeded ones).
    pub async fn create(
        cluster: &LocalCluster,
        namespace: &str,
        dag: FailedDag,
        archive: Archive<'_>,
    ) -> anyhow::Result<Archived> {
        let admin = cluster.admin_client();
        let workflows: Api<Workflow> = Api::namespaced(admin.clone(), namespace);
        let created = workflows
            .create(&PostParams::default(), &dag.workflow(namespace))
            .await?;
        create_held_pods(&Api::namespaced(admin, namespace), dag.pods(&created)).await?;
        let live = workflows.get(&dag.name).await?;
        let uid = live.uid().context("a created workflow has a UID")?;
        let row = match archive {
            Archive::InTest => live,
            Archive::Argo(db) => argodb::archive(db, &live).await?,
        };
        ensure!(
            delete_workflow(&workflows, &dag.name, Duration::from_secs(20)).await?,
            "workflow {} was not deleted",
            dag.name
        );
        let plan = ctl::expected_plan(&row)?;
        let kept: Vec<String> = dag
            .pods(&created)
            .into_iter()
            .filter_map(|(p, _)| p.metadata.name)
            .filter(|p| !plan.pods_to_delete.contains(p))
            .collect();
        ensure!(
            !kept.is_empty(),
            "the fixture keeps some pods out of the plan"
        );
        Ok(Archived {
            name: dag.name,
            uid,
            row,
            plan,
            kept,
        })
    }

    /// Checks that every plan pod is gone and every other pod of the workflow stays.
    pub async fn ensure_only_leftovers_deleted(&self, pods: &Api<Pod>) -> anyhow::Result<()> {
        for pod in &self.plan.pods_to_delete {
            ensure!(
                pods.get_opt(pod).await?.is_none(),
                "plan pod {pod} was left behind"
            );
        }
        for pod in &self.kept {
            ensure!(
                pods.get_opt(pod).await?.is_some(),
                "pod {pod} is outside the plan but was deleted"
            );
        }
        Ok(())
    }

    /// An archive in the test holding the row, for a controller to serve the retry from.
    pub fn rows(&self) -> Arc<dyn ArgoDatabase> {
        Arc::new(Rows(BTreeMap::from([(self.uid.clone(), self.row.clone())])))
    }
}
