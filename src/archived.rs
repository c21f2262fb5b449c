//! The retry of an archived workflow (one no longer in the cluster), in the
//! order of Argo's server (v4.1.4 `RetryArchivedWorkflow`): read the archived
//! row, refuse if a workflow of that name exists live, plan, delete the
//! leftover pods, create the workflow. rewind's rules on top:
//!
//! - Deletions go through the shared queue (interactive class) and budget,
//!   and only pods whose owner reference is the archived workflow's UID are
//!   leftovers: a pod of another workflow of the same name is never touched.
//! - The workflow is created only once every plan pod is gone (rule 2:
//!   Argo's controller would adopt a stale pod of the same name).
//! - Exactly once (rule 4): the created workflow carries
//!   [`CREATED_BY`](crate::workflowretry::CREATED_BY) naming the
//!   WorkflowRetry's UID; a restarted controller that finds it is done.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::delete::{Listed, Progress, SUCCEEDED, Tracker, split_bulk};
use crate::plan::{self, PlanError, RetryOptions};
use crate::queue::Class;
use crate::workers::{Done, WorkItem};
use crate::workflow::{Workflow, labels};
use crate::workflowretry::CREATED_BY;
use crate::workflowretry::serve::Reporter;

/// Argo's database (its `persistence`): the workflow archive and the
/// offloaded node status of large workflows. The archive module implements it
/// on Argo's own tables.
pub trait ArgoDatabase: Send + Sync {
    /// Argo archives workflows here (`persistence.archive`).
    fn archives(&self) -> bool;

    /// Argo offloads node status here (`persistence.nodeStatusOffLoad`).
    fn offloads(&self) -> bool;

    /// The archived workflow with this UID, fully hydrated as Argo stored it;
    /// `None` if the archive has no such row.
    fn archived_workflow<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<Workflow>, DatabaseError>>;

    /// The nodes (a JSON object by node ID) offloaded for workflow `uid` at `version`.
    fn offloaded_nodes<'a>(
        &'a self,
        uid: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<serde_json::Value, DatabaseError>>;

    /// Offloads `nodes` for workflow `uid` as Argo does; returns the version
    /// Argo would (`fnv:` and the FNV-32 hash of Go's JSON of the nodes).
    fn offload_nodes<'a>(
        &'a self,
        uid: &'a str,
        namespace: &'a str,
        nodes: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<String, DatabaseError>>;
}

/// Argo's database as its `persistence` block configures it.
pub struct ArgoDb {
    archive: crate::archive::Archive,
    archives: bool,
    offloads: bool,
}

impl ArgoDb {
    /// A (lazy) connection pool on the database `persistence` names.
    pub async fn connect(
        persistence: &crate::archive::Persistence,
    ) -> Result<ArgoDb, crate::archive::ArchiveError> {
        Ok(ArgoDb {
            archive: crate::archive::Archive::connect(persistence).await?,
            archives: persistence.archive,
            offloads: persistence.node_status_offload,
        })
    }
}

impl From<crate::archive::ArchiveError> for DatabaseError {
    fn from(e: crate::archive::ArchiveError) -> Self {
        DatabaseError {
            transient: e.is_transient(),
            message: e.to_string(),
        }
    }
}

impl ArgoDatabase for ArgoDb {
    fn archives(&self) -> bool {
        self.archives
    }

    fn offloads(&self) -> bool {
        self.offloads
    }

    fn archived_workflow<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<Workflow>, DatabaseError>> {
        Box::pin(async move { Ok(self.archive.archived_workflow(uid).await?) })
    }

    fn offloaded_nodes<'a>(
        &'a self,
        uid: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<serde_json::Value, DatabaseError>> {
        Box::pin(async move { Ok(self.archive.offloaded_nodes(uid, version).await?) })
    }

    fn offload_nodes<'a>(
        &'a self,
        uid: &'a str,
        namespace: &'a str,
        nodes: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<String, DatabaseError>> {
        Box::pin(async move { Ok(self.archive.offload_nodes(uid, namespace, nodes).await?) })
    }
}

/// Argo's database could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct DatabaseError {
    pub message: String,
    /// The fault may pass (e.g. the database is unreachable).
    pub transient: bool,
}

/// Why an archived retry did not (yet) create its workflow.
#[derive(Debug, thiserror::Error)]
pub enum ArchivedError {
    #[error(
        "this controller has no workflow archive: configure Argo's persistence (archive: true) in the ConfigMap given by --argo-configmap"
    )]
    NoArchive,
    #[error("Argo's database, workflow {uid}: {source}")]
    Read { uid: String, source: DatabaseError },
    #[error(
        "no archived workflow with UID {uid} in Argo's workflow archive (check it with `argo archive list`); nothing was deleted"
    )]
    UnknownUid { uid: String },
    #[error(
        "archived workflow {uid} is in namespace {archived}, not {requested}; create the WorkflowRetry in {archived}"
    )]
    OtherNamespace {
        uid: String,
        archived: String,
        requested: String,
    },
    /// Argo's message (its server prints the placeholder literally; rewind names the workflow).
    #[error("Workflow already exists on cluster, use argo retry {name} instead")]
    ExistsLive { name: String },
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Offload(#[from] crate::offload::OffloadError),
    #[error(
        "{}; rewind deletes only the archived workflow's pods and Argo would adopt these: delete them (kubectl delete pod -n {namespace} {}), then create a new WorkflowRetry",
        strangers(pods, owners, uid), pods.join(" ")
    )]
    ForeignPlanPods {
        /// Every such pod, sorted, so one message says all there is to delete.
        pods: Vec<String>,
        namespace: String,
        uid: String,
        /// Their owners' UIDs, sorted and deduplicated; empty when orphaned.
        owners: Vec<String>,
    },
    #[error(transparent)]
    Recreated(#[from] crate::delete::Recreated),
    #[error("{0}")]
    Delete(#[from] crate::workers::WorkError),
    #[error("Kubernetes API request failed: {0}")]
    Api(#[from] kube::Error),
    #[error("the controller is shutting down; the request stays pending and resumes on restart")]
    ShuttingDown,
}

impl ArchivedError {
    pub fn is_transient(&self) -> bool {
        match self {
            ArchivedError::Read { source, .. } => source.transient,
            ArchivedError::Offload(e) => e.is_transient(),
            ArchivedError::Delete(_) | ArchivedError::ShuttingDown => true,
            ArchivedError::Api(e) => crate::workers::is_transient(e),
            _ => false,
        }
    }
}

/// Time spent in each step, for the status message and the demo.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub read: Duration,
    pub plan: Duration,
    pub delete: Duration,
    pub create: Duration,
}

/// The steps of an archived retry, as the status and the metric name them.
#[derive(Clone, Copy, Debug)]
enum Step {
    Read,
    Plan,
    Delete,
    Create,
}

impl Step {
    fn as_str(self) -> &'static str {
        match self {
            Step::Read => "read",
            Step::Plan => "plan",
            Step::Delete => "delete",
            Step::Create => "create",
        }
    }
}

impl Timings {
    /// Records that `step` took `elapsed`: here, in the request's status
    /// (visible at its next write) and in the step histogram.
    fn record(&mut self, reporter: &mut Reporter<'_>, step: Step, elapsed: Duration) {
        // Milliseconds are plenty, and keep the status readable.
        let seconds = Some(elapsed.as_millis() as f64 / 1000.0);
        let shown = reporter.status.timings.get_or_insert_default();
        match step {
            Step::Read => (self.read, shown.read_seconds) = (elapsed, seconds),
            Step::Plan => (self.plan, shown.plan_seconds) = (elapsed, seconds),
            Step::Delete => (self.delete, shown.delete_seconds) = (elapsed, seconds),
            Step::Create => (self.create, shown.create_seconds) = (elapsed, seconds),
        }
        reporter
            .ctx()
            .metrics
            .observe_archived_step(step.as_str(), elapsed);
    }
}

/// Retries archived workflow `uid` for the WorkflowRetry `reporter` reports on.
pub(crate) async fn run(
    reporter: &mut Reporter<'_>,
    database: Option<&dyn ArgoDatabase>,
    uid: &str,
) -> Result<(), ArchivedError> {
    let database = database
        .filter(|db| db.archives())
        .ok_or(ArchivedError::NoArchive)?;
    let ctx = reporter.ctx();
    let namespace = reporter.namespace();
    let mut timings = Timings::default();

    let step = Instant::now();
    let archived = database
        .archived_workflow(uid)
        .await
        .map_err(|source| ArchivedError::Read {
            uid: uid.to_owned(),
            source,
        })?
        .ok_or_else(|| ArchivedError::UnknownUid {
            uid: uid.to_owned(),
        })?;
    timings.record(reporter, Step::Read, step.elapsed());
    let archived_namespace = archived.metadata.namespace.clone().unwrap_or_default();
    if archived_namespace != namespace {
        return Err(ArchivedError::OtherNamespace {
            uid: uid.to_owned(),
            archived: archived_namespace,
            requested: namespace,
        });
    }
    let name = archived.name().to_owned();
    reporter.status.workflow_name = Some(name.clone());

    let workflows: Api<Workflow> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(done) = created_by_us(&workflows, &name, &reporter.uid()).await? {
        // The create happened; the copy of offloaded nodes after it may not have.
        let created = workflows.get(&name).await?;
        if let Some(version) = crate::offload::offloaded_version(&created) {
            copy_offloaded(database, uid, &done, &namespace, version).await?;
        }
        reporter.status.workflow_uid = Some(done);
        reporter.status.message = format!("created workflow {name}");
        return Ok(());
    }

    let step = Instant::now();
    let spec = &reporter.object().spec;
    let options = RetryOptions {
        restart_successful: spec.restart_successful,
        node_field_selector: spec.node_field_selector.clone().unwrap_or_default(),
        parameters: spec.parameters.clone(),
        argo_version: ctx.config.argo_version,
        // With offloading, dehydrated below as Argo does, else by the planner.
        max_workflow_size: match database.offloads() {
            true => usize::MAX,
            false => ctx.config.max_workflow_size,
        },
        compression: ctx.config.compression.clone(),
    };
    let planned = plan::plan_retry(&archived, &options)?;
    timings.record(reporter, Step::Plan, step.elapsed());

    let step = Instant::now();
    delete_leftovers(reporter, &name, uid, &planned.pods_to_delete).await?;
    timings.record(reporter, Step::Delete, step.elapsed());

    let step = Instant::now();
    let mut workflow = planned.workflow;
    // Argo dehydrates before it clears the UID: nodes offloaded now are
    // written under the archived workflow's UID, then copied to the new one.
    if database.offloads() {
        crate::offload::dehydrate(
            database,
            &mut workflow,
            ctx.config.max_workflow_size,
            &ctx.config.compression,
            ctx.config.argo_version,
            ctx.config.always_offload_node_status,
        )
        .await?;
    }
    workflow.metadata.uid = None;
    workflow.metadata.resource_version = None;
    workflow
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CREATED_BY.into(), reporter.uid());
    let created = match workflows.create(&PostParams::default(), &workflow).await {
        Ok(created) => created.metadata.uid.unwrap_or_default(),
        // Created by an earlier attempt whose answer was lost, or by someone else.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            created_by_us(&workflows, &name, &reporter.uid())
                .await?
                .ok_or(ArchivedError::ExistsLive { name: name.clone() })?
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(version) = crate::offload::offloaded_version(&workflow) {
        copy_offloaded(database, uid, &created, &namespace, version).await?;
    }
    timings.record(reporter, Step::Create, step.elapsed());
    info!(
        workflowretry = reporter.name(),
        workflow = name,
        archived_uid = uid,
        read_ms = timings.read.as_millis() as u64,
        plan_ms = timings.plan.as_millis() as u64,
        delete_ms = timings.delete.as_millis() as u64,
        create_ms = timings.create.as_millis() as u64,
        "archived workflow retried"
    );
    reporter.status.workflow_uid = Some(created);
    reporter.status.message = format!(
        "created workflow {name} after deleting {} leftover pods (read {:.1}s, plan {:.1}s, delete {:.1}s, create {:.1}s)",
        reporter.status.pods_deleted,
        timings.read.as_secs_f64(),
        timings.plan.as_secs_f64(),
        timings.delete.as_secs_f64(),
        timings.create.as_secs_f64()
    );
    Ok(())
}

/// Copies the nodes offloaded under the archived workflow's UID to the
/// created one's, as Argo's server does after its create (idempotent).
async fn copy_offloaded(
    database: &dyn ArgoDatabase,
    from_uid: &str,
    to_uid: &str,
    namespace: &str,
    version: &str,
) -> Result<(), ArchivedError> {
    let nodes = database
        .offloaded_nodes(from_uid, version)
        .await
        .map_err(|source| ArchivedError::Read {
            uid: from_uid.to_owned(),
            source,
        })?;
    database
        .offload_nodes(to_uid, namespace, &nodes)
        .await
        .map_err(|source| ArchivedError::Read {
            uid: to_uid.to_owned(),
            source,
        })?;
    Ok(())
}

/// The UID of live workflow `name` if this WorkflowRetry created it; an
/// error if another workflow of that name exists; `None` if none does.
async fn created_by_us(
    workflows: &Api<Workflow>,
    name: &str,
    request_uid: &str,
) -> Result<Option<String>, ArchivedError> {
    match workflows.get_metadata_opt(name).await? {
        None => Ok(None),
        Some(live)
            if live.annotations().get(CREATED_BY).map(String::as_str) == Some(request_uid) =>
        {
            Ok(Some(live.uid().unwrap_or_default()))
        }
        Some(_) => Err(ArchivedError::ExistsLive {
            name: name.to_owned(),
        }),
    }
}

/// True if `pod` is owned by the workflow with UID `owner`.
fn owned_by(pod: &Pod, owner: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == owner)
}

/// Deletes the plan's pods that the archived workflow (`owner`) left behind,
/// and returns once every one is gone.
async fn delete_leftovers(
    reporter: &mut Reporter<'_>,
    workflow: &str,
    owner: &str,
    plan_pods: &[String],
) -> Result<(), ArchivedError> {
    let ctx = reporter.ctx();
    let namespace = reporter.namespace();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let lp = ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    let key: crate::workers::RequestKey =
        format!("workflowretry/{namespace}/{}", reporter.uid()).into();
    let mut outcomes = ctx.outcomes.register(key.clone());
    let result = async {
        let mut tracker = Tracker::new(plan_pods.iter().cloned());
        let total = plan_pods.len() as u64;
        reporter.status.pods_total = total;
        // Counted by name, as for a live retry: no pod twice, never backwards.
        let mut progress = Progress::default();
        let mut allow_bulk = ctx.config.allow_bulk;
        let mut last_write = Instant::now();
        loop {
            let listed = pods.list(&lp).await?.items;
            // A pod of another workflow of this name is not a leftover. While
            // one exists, a bulk delete by label could select it: delete pod
            // by pod, each with its UID as a precondition.
            let foreign = listed.iter().any(|p| !owned_by(p, owner));
            let strangers: Vec<&Pod> = listed
                .iter()
                .filter(|p| {
                    !owned_by(p, owner)
                        && p.metadata
                            .name
                            .as_ref()
                            .is_some_and(|n| tracker.plan().contains(n))
                })
                .collect();
            if !strangers.is_empty() {
                let mut pods: Vec<String> = strangers.iter().map(|p| p.name_any()).collect();
                pods.sort();
                let owners: BTreeSet<String> = strangers
                    .iter()
                    .flat_map(|p| p.owner_references().iter().map(|r| r.uid.clone()))
                    .collect();
                return Err(ArchivedError::ForeignPlanPods {
                    pods,
                    namespace: namespace.clone(),
                    uid: owner.to_owned(),
                    owners: owners.into_iter().collect(),
                });
            }
            let nodes: BTreeMap<String, String> = listed
                .iter()
                .filter_map(|p| {
                    Some((
                        p.metadata.name.clone()?,
                        p.spec.as_ref()?.node_name.clone()?,
                    ))
                })
                .collect();
            let ours: Vec<Listed> = listed
                .into_iter()
                .filter(|p| owned_by(p, owner))
                .map(|p| Listed {
                    succeeded: p.status.as_ref().and_then(|s| s.phase.as_deref())
                        == Some(SUCCEEDED),
                    meta: p.metadata,
                })
                .collect();
            let mut assessment = tracker.assess(workflow, &ours, allow_bulk && !foreign)?;
            if let Some(removed) = progress.listed(&assessment.gone) {
                // A bulk request was cut short (see `Done::Unfinished`); this
                // list says what it removed. If nothing, another bulk would
                // likely meet the same end: go on pod by pod.
                ctx.metrics.pods_deleted(removed);
                if removed == 0 && allow_bulk {
                    allow_bulk = false;
                    assessment = tracker.assess(workflow, &ours, false)?;
                }
                warn!(
                    namespace,
                    workflow,
                    removed,
                    bulk = allow_bulk,
                    "bulk delete cut short; pods listed again"
                );
            }
            reporter.status.pods_deleted = progress.deleted() as u64;
            if assessment.all_gone(plan_pods.len()) {
                reporter.status.pods_deleted = total;
                return Ok(());
            }
            let deleting = Some(crate::request::RetryPhase::DeletingPods);
            if reporter.status.phase != deleting {
                // Say so before the first request: one bulk delete of thousands
                // of pods reports nothing else until it returns.
                reporter.status.phase = deleting;
                reporter.write().await?;
                last_write = Instant::now();
            }
            let mut pending = 0usize;
            for work in split_bulk(assessment.work, ctx.config.bulk_parallelism, &nodes) {
                let item = WorkItem {
                    namespace: namespace.clone(),
                    work,
                };
                ctx.queue.add(key.clone(), Class::Interactive, item);
                pending += 1;
            }
            while pending > 0 {
                let outcome = outcomes.recv().await.ok_or(ArchivedError::ShuttingDown)?;
                pending -= 1;
                match outcome.result? {
                    Done::Unfinished => progress.cut_short(&outcome.item.work),
                    done => {
                        if let Done::Deleted(n) = done {
                            ctx.metrics.pods_deleted(n);
                        }
                        progress.answered(tracker.plan(), &outcome.item.work);
                    }
                }
                reporter.status.pods_deleted = progress.deleted() as u64;
                if last_write.elapsed() >= ctx.config.status_interval {
                    reporter.write().await?;
                    last_write = Instant::now();
                }
            }
            if !assessment.terminating.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    .await;
    ctx.outcomes.unregister(&key);
    ctx.queue.cancel(&key);
    result
}

/// The first clause of [`ArchivedError::ForeignPlanPods`]' message.
fn strangers(pods: &[String], owners: &[String], uid: &str) -> String {
    let owners = if owners.is_empty() {
        "nothing (orphaned)".to_owned()
    } else {
        owners.join(", ")
    };
    match pods {
        [one] => format!(
            "pod {one} has the name of a pod the retry recreates, but is owned by {owners}, not by the archived workflow {uid}"
        ),
        many => format!(
            "pods {} have the names of pods the retry recreates, but are owned by {owners}, not by the archived workflow {uid}",
            many.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(name: &str, owner: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: Some(vec![OwnerReference {
                    uid: owner.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_pods_owned_by_the_archived_workflow_are_leftovers() {
        assert!(owned_by(&pod("a", "old"), "old"));
        assert!(!owned_by(&pod("a", "other"), "old"));
        assert!(!owned_by(&Pod::default(), "old"));
    }

    #[test]
    fn a_refusal_names_every_foreign_pod_and_how_to_delete_them() {
        let one = ArchivedError::ForeignPlanPods {
            pods: vec!["wf-a-1".into()],
            namespace: "argo".into(),
            uid: "old".into(),
            owners: vec![],
        }
        .to_string();
        assert!(
            one.starts_with("pod wf-a-1 has the name of a pod the retry recreates, but is owned by nothing (orphaned), not by the archived workflow old;"),
            "{one}"
        );
        assert!(one.contains("kubectl delete pod -n argo wf-a-1)"), "{one}");
        let two = ArchivedError::ForeignPlanPods {
            pods: vec!["wf-a-1".into(), "wf-b-2".into()],
            namespace: "argo".into(),
            uid: "old".into(),
            owners: vec!["new".into()],
        }
        .to_string();
        assert!(
            two.starts_with("pods wf-a-1, wf-b-2 have the names of pods the retry recreates, but are owned by new, not by the archived workflow old;"),
            "{two}"
        );
        assert!(
            two.contains("kubectl delete pod -n argo wf-a-1 wf-b-2)"),
            "{two}"
        );
    }
}
