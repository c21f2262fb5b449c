//! Failed Argo workflows with real pods, as Argo's controller leaves them,
//! for the demo, the cluster tests and the benchmarks.
//!
//! A workflow here is a DAG whose tasks each ran one pod; the pods carry
//! Argo's names (pod-name format v2), labels, annotations and owner reference,
//! and their phases match their nodes. No Argo controller is needed: the pods
//! are created unscheduled and their phase is set through the status
//! subresource, which is what a retry looks at.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, future, stream};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};

use crate::argo::plan::ArgoVersion;
use crate::argo::plan::compress::{
    CompressError, DEFAULT_MAX_WORKFLOW_SIZE, blob_to_hydrate, decode_nodes, dehydrate,
};
use crate::argo::plan::pod_name::{PodNameFormat, node_id, pod_name};
use crate::argo::workflow::{NodeStatus, Text, Workflow, WorkflowSpec, WorkflowStatus, labels};
use crate::engine::fault::{api_code, is_transient};

const TEMPLATE: &str = "work";
const TIME: &str = "2026-01-01T00:00:00Z";
/// A scheduler name no scheduler serves.
const UNSCHEDULED: &str = "rewind-workload-unscheduled";

/// A failed DAG workflow: `failed` tasks whose pods failed and `succeeded`
/// tasks whose pods succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedDag {
    pub name: String,
    pub failed: usize,
    pub succeeded: usize,
}

impl FailedDag {
    fn tasks(&self) -> impl Iterator<Item = (String, &'static str)> + '_ {
        let width = (self.failed + self.succeeded).to_string().len();
        (0..self.failed + self.succeeded).map(move |i| {
            let phase = if i < self.failed {
                "Failed"
            } else {
                "Succeeded"
            };
            (format!("{}.task-{i:0width$}", self.name), phase)
        })
    }

    /// The workflow as Argo's controller leaves it when it fails: with its
    /// nodes compressed, as Argo stores them, when it is over Argo's default
    /// size limit.
    pub fn workflow(&self, namespace: &str) -> Workflow {
        self.workflow_on(namespace, &[])
    }

    /// [`FailedDag::workflow`] as if task `i` ran on node `hosts[i % hosts.len()]`
    /// (Argo records it as the node's `hostNodeName`); unscheduled without nodes.
    pub fn workflow_on(&self, namespace: &str, hosts: &[String]) -> Workflow {
        let phase = if self.failed > 0 {
            "Failed"
        } else {
            "Succeeded"
        };
        let mut nodes = BTreeMap::new();
        let mut children = Vec::new();
        for (i, (node_name, phase)) in self.tasks().enumerate() {
            let id = node_id(&self.name, &node_name);
            children.push(Text::from(id.as_str()));
            nodes.insert(
                id.clone(),
                Box::new(NodeStatus {
                    id: id.into(),
                    display_name: Some(node_name.rsplit('.').next().unwrap_or_default().into()),
                    name: node_name.into(),
                    type_: "Pod".into(),
                    template_name: Some(TEMPLATE.into()),
                    phase: Some(phase.into()),
                    boundary_id: Some(self.name.as_str().into()),
                    message: (phase == "Failed").then(|| "Error (exit code 1)".into()),
                    started_at: Some(TIME.into()),
                    finished_at: Some(TIME.into()),
                    host_node_name: host(hosts, i).map(Into::into),
                    ..Default::default()
                }),
            );
        }
        nodes.insert(
            self.name.clone(),
            Box::new(NodeStatus {
                id: self.name.as_str().into(),
                name: self.name.as_str().into(),
                display_name: Some(self.name.as_str().into()),
                type_: "DAG".into(),
                template_name: Some("main".into()),
                phase: Some(phase.into()),
                started_at: Some(TIME.into()),
                finished_at: Some(TIME.into()),
                outbound_nodes: Some(children.clone()),
                children: Some(children),
                ..Default::default()
            }),
        );
        let tasks: Vec<_> = self
            .tasks()
            .map(|(n, _)| serde_json::json!({"name": n.rsplit('.').next(), "template": TEMPLATE}))
            .collect();
        let mut spec_other = serde_json::Map::new();
        spec_other.insert("entrypoint".into(), "main".into());
        spec_other.insert("templates".into(), serde_json::json!([
            {"name": "main", "dag": {"tasks": tasks}},
            {"name": TEMPLATE, "container": {"image": "argoproj/argosay:v2", "args": ["exit", "1"]}},
        ]));
        let mut workflow = Workflow {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(namespace.into()),
                labels: Some(
                    [
                        (labels::COMPLETED.to_string(), "true".to_string()),
                        (labels::PHASE.to_string(), phase.to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: WorkflowSpec {
                other: spec_other.into_iter().map(|(k, v)| (k, v.into())).collect(),
                ..Default::default()
            },
            status: WorkflowStatus {
                phase: Some(phase.into()),
                started_at: Some(TIME.into()),
                finished_at: Some(TIME.into()),
                nodes: Some(nodes),
                conditions: Some(vec![crate::argo::workflow::Condition {
                    type_: Some("Completed".into()),
                    status: Some("True".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        // Past the limit even compressed the API server refuses it anyway.
        let _ = dehydrate(
            &mut workflow,
            DEFAULT_MAX_WORKFLOW_SIZE,
            &Default::default(),
            ArgoVersion::V4,
        );
        workflow
    }

    /// The pods the workflow's nodes ran, with the phase each ended in.
    pub fn pods(&self, workflow: &Workflow) -> Vec<(Pod, &'static str)> {
        self.pods_on(workflow, &[])
    }

    /// [`FailedDag::pods`], pod `i` bound to node `nodes[i % nodes.len()]`.
    pub fn pods_on(&self, workflow: &Workflow, nodes: &[String]) -> Vec<(Pod, &'static str)> {
        let owner = OwnerReference {
            api_version: Workflow::api_version(&()).into_owned(),
            kind: Workflow::kind(&()).into_owned(),
            name: self.name.clone(),
            uid: workflow.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        self.tasks()
            .enumerate()
            .map(|(i, (node_name, phase))| {
                let id = node_id(&self.name, &node_name);
                let name = pod_name(
                    &self.name,
                    &node_name,
                    TEMPLATE,
                    &id,
                    PodNameFormat::V2,
                    ArgoVersion::V4,
                )
                .expect("fixture names are short");
                let pod = Pod {
                    metadata: ObjectMeta {
                        name: Some(name),
                        namespace: workflow.metadata.namespace.clone(),
                        labels: Some(
                            [
                                (labels::WORKFLOW.to_string(), self.name.clone()),
                                (labels::COMPLETED.to_string(), "true".to_string()),
                            ]
                            .into(),
                        ),
                        annotations: Some(
                            [
                                (labels::NODE_ID.to_string(), id),
                                (labels::NODE_NAME.to_string(), node_name),
                            ]
                            .into(),
                        ),
                        owner_references: workflow
                            .metadata
                            .uid
                            .is_some()
                            .then(|| vec![owner.clone()]),
                        ..Default::default()
                    },
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "main".into(),
                            image: Some("argoproj/argosay:v2".into()),
                            ..Default::default()
                        }],
                        restart_policy: Some("Never".into()),
                        // Unscheduled even where a scheduler runs: on a (fake) node the
                        // pod would be set Running, overwriting the phase given here.
                        scheduler_name: Some(UNSCHEDULED.into()),
                        // Bound directly where nodes are given; no kubelet
                        // there changes the phase either.
                        node_name: host(nodes, i).map(str::to_owned),
                        ..Default::default()
                    }),
                    status: None,
                };
                (pod, phase)
            })
            .collect()
    }

    /// Creates the workflow and its pods in `namespace` (which must exist, with
    /// its default ServiceAccount), `concurrency` requests at a time, calling
    /// `progress` after each pod.
    pub async fn create(
        &self,
        client: &Client,
        namespace: &str,
        concurrency: usize,
        progress: impl Fn() + Sync,
    ) -> Result<Workflow, kube::Error> {
        self.create_on(client, namespace, &[], concurrency, progress)
            .await
    }

    /// [`FailedDag::create`], the pods spread over `nodes` (see
    /// [`FailedDag::workflow_on`]); the nodes need not exist.
    pub async fn create_on(
        &self,
        client: &Client,
        namespace: &str,
        nodes: &[String],
        concurrency: usize,
        progress: impl Fn() + Sync,
    ) -> Result<Workflow, kube::Error> {
        self.create_as(
            client,
            self.workflow_on(namespace, nodes),
            nodes,
            concurrency,
            progress,
        )
        .await
    }

    /// [`FailedDag::create`] with `labels` on the workflow besides Argo's (a team's, say:
    /// what `argo retry -l` and `rewind retry -l` select).
    pub async fn create_labelled(
        &self,
        client: &Client,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        concurrency: usize,
    ) -> Result<Workflow, kube::Error> {
        let mut workflow = self.workflow(namespace);
        workflow
            .metadata
            .labels
            .get_or_insert_default()
            .extend(labels.clone());
        self.create_as(client, workflow, &[], concurrency, || ())
            .await
    }

    /// Creates `workflow` (this DAG's, in its namespace) and then its pods.
    async fn create_as(
        &self,
        client: &Client,
        workflow: Workflow,
        nodes: &[String],
        concurrency: usize,
        progress: impl Fn() + Sync,
    ) -> Result<Workflow, kube::Error> {
        let namespace = workflow.metadata.namespace.as_deref().unwrap_or_default();
        let workflows: Api<Workflow> = Api::namespaced(client.clone(), namespace);
        let workflow = create_once(&workflows, &workflow).await?;
        self.create_pods_on(client, &workflow, nodes, concurrency, progress)
            .await?;
        Ok(workflow)
    }

    /// The pods of [`FailedDag::create_on`] for `workflow`, created already (by the caller:
    /// offloaded, say), in its namespace.
    pub async fn create_pods_on(
        &self,
        client: &Client,
        workflow: &Workflow,
        nodes: &[String],
        concurrency: usize,
        progress: impl Fn() + Sync,
    ) -> Result<(), kube::Error> {
        let namespace = workflow.metadata.namespace.as_deref().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        // Owned items, futures owning their client, and progress reported
        // through the stream: with borrowed ones this future is not Send (a
        // higher-ranked lifetime error), so callers could not spawn it.
        let owned: Vec<(Pod, String)> = self
            .pods_on(workflow, nodes)
            .into_iter()
            .map(|(p, phase)| (p, phase.to_owned()))
            .collect();
        stream::iter(owned)
            .map(|(pod, phase)| {
                let pods = pods.clone();
                async move {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    create_once(&pods, &pod).await?;
                    let status = serde_json::json!({"status": {"phase": phase}});
                    let (params, patch) = (PatchParams::default(), Patch::Merge(&status));
                    through_transient(|| pods.patch_status(&name, &params, &patch)).await?;
                    Ok::<_, kube::Error>(())
                }
            })
            .buffer_unordered(concurrency.max(1))
            .try_for_each(|()| {
                progress();
                future::ready(Ok(()))
            })
            .await
    }
}

/// Tries of a fixture request before it fails: a loaded control plane, or
/// one with a short `--request-timeout` as in the fault tests, may cut a
/// request (504, a broken connection) that the next try gets through.
const TRIES: u32 = 5;

/// `op`, tried again after a transient failure (see [`TRIES`]); only for
/// requests that may be repeated.
pub async fn through_transient<T, F, Fut>(mut op: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut tried = 1;
    loop {
        match op().await {
            Err(e) if tried < TRIES && is_transient(&e) => {
                tokio::time::sleep(Duration::from_millis(200) * tried).await;
                tried += 1;
            }
            result => return result,
        }
    }
}

/// Creates `object`, tried again after a transient failure; a create cut
/// short may have been done, so after one, AlreadyExists means created.
async fn create_once<K>(api: &Api<K>, object: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let mut first = true;
    through_transient(|| {
        let retried = !std::mem::replace(&mut first, false);
        let name = &name;
        async move {
            match api.create(&PostParams::default(), object).await {
                Err(e) if retried && api_code(&e) == Some(409) => api.get(name).await,
                result => result,
            }
        }
    })
    .await
}

/// The node task `i` ran on, round-robin over `nodes`.
fn host(nodes: &[String], i: usize) -> Option<&str> {
    (!nodes.is_empty()).then(|| nodes[i % nodes.len()].as_str())
}

/// `workflow` as Argo's controller archives it: hydrated (nodes decoded
/// from `compressedNodes`) first.
pub fn hydrated(mut workflow: Workflow) -> Result<Workflow, CompressError> {
    if let Some(blob) = blob_to_hydrate(&workflow.status) {
        workflow.status.nodes = Some(decode_nodes(blob, ArgoVersion::V4, usize::MAX)?);
        workflow.status.compressed_nodes = None;
    }
    Ok(workflow)
}

/// Deletes workflow `name` (its pods stay: they are orphaned, or held by a
/// finalizer where a garbage collector runs) and waits until it is gone;
/// `false` if it is still there after `within`.
pub async fn delete_workflow(
    workflows: &Api<Workflow>,
    name: &str,
    within: Duration,
) -> Result<bool, kube::Error> {
    workflows.delete(name, &DeleteParams::background()).await?;
    let deadline = tokio::time::Instant::now() + within;
    while workflows.get_opt(name).await?.is_some() {
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::plan::{RetryOptions, plan_retry};

    #[test]
    fn a_large_workflow_is_archived_with_its_nodes_decoded() {
        let dag = FailedDag {
            name: "wf".into(),
            failed: 5000,
            succeeded: 10,
        };
        let compressed = dag.workflow("ns");
        assert!(compressed.status.compressed_nodes.is_some());
        let row = hydrated(compressed).unwrap();
        assert_eq!(row.status.compressed_nodes, None);
        let nodes = row.status.nodes.as_ref().map_or(0, BTreeMap::len);
        assert!(nodes > 5010, "{nodes} nodes");
    }

    #[test]
    fn the_plan_knows_the_node_each_pod_ran_on() {
        let dag = FailedDag {
            name: "wf".into(),
            failed: 5,
            succeeded: 2,
        };
        let hosts = ["n0".to_string(), "n1".to_string()];
        let mut wf = dag.workflow_on("ns", &hosts);
        wf.metadata.uid = Some("u".into());
        let plan = plan_retry(&wf, &RetryOptions::default()).unwrap();
        let bound: BTreeMap<String, String> = dag
            .pods_on(&wf, &hosts)
            .into_iter()
            .filter(|(_, phase)| *phase == "Failed")
            .map(|(p, _)| (p.metadata.name.unwrap(), p.spec.unwrap().node_name.unwrap()))
            .collect();
        assert_eq!(bound.len(), 5);
        assert_eq!(plan.pod_nodes, bound);
        // Unscheduled pods: no hint.
        let mut wf = dag.workflow("ns");
        wf.metadata.uid = Some("u".into());
        assert!(
            plan_retry(&wf, &RetryOptions::default())
                .unwrap()
                .pod_nodes
                .is_empty()
        );
    }

    #[test]
    fn the_plan_deletes_exactly_the_failed_pods() {
        let dag = FailedDag {
            name: "wf".into(),
            failed: 7,
            succeeded: 3,
        };
        let mut wf = dag.workflow("ns");
        wf.metadata.uid = Some("u".into());
        let plan = plan_retry(&wf, &RetryOptions::default()).unwrap();
        let mut failed: Vec<String> = dag
            .pods(&wf)
            .into_iter()
            .filter(|(_, phase)| *phase == "Failed")
            .map(|(p, _)| p.metadata.name.unwrap())
            .collect();
        failed.sort();
        assert_eq!(plan.pods_to_delete, failed);
    }
}
