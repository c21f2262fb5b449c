//! One retry request, from the annotation to the reset workflow.
//!
//! Pending -> DeletingPods -> Committing -> Succeeded (or Failed). The reset
//! workflow is written only once every planned pod is confirmed gone (rule 2),
//! with optimistic concurrency; the observed token is recorded in that same
//! write, so the reset happens exactly once even across crashes (rule 4): a
//! restarted controller sees the token still pending, re-plans from the
//! unchanged workflow, finds the pods already gone, and commits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::delete::{DeleteWork, Progress, Recreated, Tracker, split_bulk};
use crate::plan::{self, ArgoVersion, Plan, PlanError, RetryOptions};
use crate::queue::Class;
use crate::request::{self, RetryPhase, RetryStatus, annotations};
use crate::workers::{
    Done, Outcome, Outcomes, Queue, RequestKey, WorkItem, api_code, list_workflow_pods,
};
use crate::workflow::{Workflow, labels};

/// DeleteCollections per bulk delete by default (see README, "Beyond the serial floor").
pub const DEFAULT_BULK_PARALLELISM: usize = 1;

/// Settings shared by every retry.
#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Use DeleteCollection where it is provably exact.
    pub allow_bulk: bool,
    /// Split a bulk delete into this many DeleteCollections by node, sent
    /// side by side (see [`crate::delete::split_by_node`]).
    pub bulk_parallelism: usize,
    pub argo_version: ArgoVersion,
    pub max_workflow_size: usize,
    /// How the cluster's Argo compresses nodes (its WORKFLOW_COMPRESSION_* settings).
    pub compression: plan::compress::Compression,
    /// Least time between two progress writes of `rewind.dev/retry-status`
    /// (the final one is never held back).
    pub status_interval: Duration,
    /// Argo's `ALWAYS_OFFLOAD_NODE_STATUS`: with a database, nodes are always offloaded.
    pub always_offload_node_status: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            allow_bulk: true,
            bulk_parallelism: DEFAULT_BULK_PARALLELISM,
            argo_version: ArgoVersion::default(),
            max_workflow_size: plan::compress::DEFAULT_MAX_WORKFLOW_SIZE,
            compression: Default::default(),
            status_interval: Duration::from_secs(2),
            always_offload_node_status: false,
        }
    }
}

/// What a retry needs from the controller.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub queue: Queue,
    pub outcomes: Outcomes,
    pub recorder: Recorder,
    pub config: RetryConfig,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Argo's database, when its persistence is configured: archived
    /// workflows and offloaded node status.
    pub database: Option<Arc<dyn crate::archived::ArgoDatabase>>,
}

/// The workflow and request a retry works on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub token: String,
}

impl Target {
    fn key(&self) -> RequestKey {
        format!(
            "{}/{}/{}/{}",
            self.namespace, self.name, self.uid, self.token
        )
        .into()
    }
}

/// Why a request ended without a reset. The message goes to the user in
/// `rewind.dev/retry-status` and an Event.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error(transparent)]
    BadRequest(#[from] request::RequestError),
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Recreated(#[from] Recreated),
    #[error("{0}")]
    Delete(#[from] crate::workers::WorkError),
    #[error(
        "the workflow was deleted or replaced (UID changed) during the retry; nothing more was deleted"
    )]
    WorkflowGone,
    #[error(
        "the workflow started running again (phase label {phase}, completed label {completed}) during the retry, perhaps retried by someone else; rewind stopped and deleted nothing more"
    )]
    WorkflowChanged { phase: String, completed: String },
    #[error("Kubernetes API request failed: {0}")]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Offload(#[from] crate::offload::OffloadError),
    #[error("the controller is shutting down; the request stays pending and resumes on restart")]
    ShuttingDown,
    #[error("a newer retry request replaced this one")]
    Superseded,
}

impl RetryError {
    /// Errors of the API (or of reaching it) that a later attempt may not
    /// meet: the request stays pending and is tried again, so no request is
    /// lost to a passing fault (rule 4). Everything else ends the request.
    pub fn is_transient(&self) -> bool {
        match self {
            RetryError::Api(_) | RetryError::Delete(_) => true,
            RetryError::Offload(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// How a request ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Finished {
    /// The workflow was reset.
    Retried { pods_deleted: usize },
    /// Someone (or an earlier run of ours) already finished this token.
    AlreadyObserved,
}

/// How long the report of a request's end (status, Event) may still take once
/// the controller is stopping.
const REPORT_GRACE: Duration = Duration::from_secs(5);

/// Runs one request to its end, or until a transient error (see
/// [`RetryError::is_transient`]), which the caller retries later, or until
/// `shutdown` (the request stays pending). Errors are reported to the user
/// (status annotation and Event) before this returns, and so is a reset: once
/// written, its Event is sent even when `shutdown` came meanwhile.
pub async fn run(
    ctx: &Context,
    target: &Target,
    shutdown: &CancellationToken,
) -> Result<Finished, RetryError> {
    let started = Instant::now();
    let key = target.key();
    let mut outcomes = ctx.outcomes.register(key.clone());
    let mut job = Job::new(ctx, target, key.clone());
    let result = job.run(&mut outcomes, shutdown).await;
    ctx.outcomes.unregister(&key);
    ctx.queue.cancel(&key);
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(REPORT_GRACE).await;
    };
    tokio::select! {
        _ = report(&mut job, &result, started) => {}
        _ = grace => warn!(workflow = target.name, namespace = target.namespace, "stopping before the end of the retry was reported"),
    }
    result
}

/// Tells the user (log, metrics, status, Event) how a request ended.
async fn report(job: &mut Job<'_>, result: &Result<Finished, RetryError>, started: Instant) {
    let (ctx, target) = (job.ctx, job.target);
    if let Some(announcing) = job.announcing.take() {
        let _ = announcing.await;
    }
    let label = match result {
        Ok(Finished::Retried { .. }) => "succeeded",
        Ok(Finished::AlreadyObserved) => "already_observed",
        Err(RetryError::ShuttingDown | RetryError::Superseded) => "interrupted",
        Err(e) if e.is_transient() => "transient_error",
        Err(_) => "failed",
    };
    ctx.metrics.observe_retry(label, started.elapsed());
    match result {
        Ok(Finished::Retried { pods_deleted }) => {
            info!(
                workflow = target.name,
                namespace = target.namespace,
                token = target.token,
                pods_deleted,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "workflow retried"
            );
            job.event(EventType::Normal, "Retried", format!(
                "rewind reset the workflow after deleting {pods_deleted} pods in {:.1}s (request {})",
                started.elapsed().as_secs_f64(), target.token)).await;
        }
        Ok(Finished::AlreadyObserved)
        | Err(RetryError::ShuttingDown | RetryError::Superseded | RetryError::WorkflowGone) => {}
        Err(e) if e.is_transient() => {
            warn!(workflow = target.name, namespace = target.namespace, token = target.token, error = %e, "retry interrupted; it will be tried again");
            job.report_transient(e).await;
        }
        Err(e) => {
            warn!(workflow = target.name, namespace = target.namespace, token = target.token, error = %e, "retry failed");
            job.fail(e).await;
        }
    }
}

/// How often to look again at plan pods that are terminating gracefully.
const TERMINATING_POLL: Duration = Duration::from_millis(500);

struct Job<'a> {
    ctx: &'a Context,
    target: &'a Target,
    key: RequestKey,
    status: RetryStatus,
    started: Instant,
    /// The status last written, and when.
    written: Option<(RetryStatus, Instant)>,
    /// The workflow's resourceVersion as last read, or as our own status
    /// write (made on that version) left it: the commit's precondition.
    resource_version: Option<String>,
    /// Someone else changed the workflow since it was read: read it again
    /// before committing.
    stale: bool,
    /// When the workflow was last checked for a change of phase under us.
    last_check: Instant,
    /// The workflow carried `workflows.argoproj.io/completed=true` when read.
    was_completed: bool,
    tracker: Option<Tracker>,
    /// The node each plan pod ran on, as the workflow records it.
    pod_nodes: BTreeMap<String, String>,
    /// Plan pods deleted, for the status.
    progress: Progress,
    /// Pods this run's requests removed, for the Event and metrics.
    pods_deleted: usize,
    /// Bulk requests may be used; off once one was cut short having removed nothing.
    allow_bulk: bool,
    /// The RetryStarted Event being sent.
    announcing: Option<tokio::task::JoinHandle<()>>,
}

impl<'a> Job<'a> {
    fn new(ctx: &'a Context, target: &'a Target, key: RequestKey) -> Self {
        Job {
            ctx,
            target,
            key,
            status: RetryStatus {
                token: target.token.clone(),
                phase: RetryPhase::Pending,
                pods_total: 0,
                pods_deleted: 0,
                message: String::new(),
                started_at: Some(now()),
                finished_at: None,
            },
            started: Instant::now(),
            written: None,
            resource_version: None,
            stale: false,
            last_check: Instant::now(),
            was_completed: false,
            tracker: None,
            pod_nodes: BTreeMap::new(),
            progress: Progress::default(),
            pods_deleted: 0,
            allow_bulk: ctx.config.allow_bulk,
            announcing: None,
        }
    }

    fn workflows(&self) -> Api<Workflow> {
        Api::namespaced(self.ctx.client.clone(), &self.target.namespace)
    }

    /// Reads the workflow; `None` if it is gone, replaced, or already observed.
    async fn read(&self) -> Result<Option<Workflow>, RetryError> {
        let wf = match self.workflows().get_opt(&self.target.name).await? {
            Some(wf) if wf.metadata.uid.as_deref() == Some(self.target.uid.as_str()) => wf,
            _ => return Err(RetryError::WorkflowGone),
        };
        if wf.annotation(annotations::OBSERVED) == Some(self.target.token.as_str()) {
            return Ok(None);
        }
        Ok(Some(wf))
    }

    async fn run(
        &mut self,
        outcomes: &mut tokio::sync::mpsc::UnboundedReceiver<Outcome>,
        shutdown: &CancellationToken,
    ) -> Result<Finished, RetryError> {
        let mut announced = false;
        loop {
            // Everything up to the commit may stop at shutdown: the request
            // stays pending and the next start resumes it (rule 4).
            let prepared = tokio::select! {
                _ = shutdown.cancelled() => return Err(RetryError::ShuttingDown),
                p = self.prepare(&mut announced, outcomes) => p?,
            };
            let Some((wf, plan)) = prepared else {
                return Ok(Finished::AlreadyObserved);
            };
            if self.stale {
                continue;
            }
            match self.commit(wf, plan).await {
                Ok(()) => {
                    return Ok(Finished::Retried {
                        pods_deleted: self.pods_deleted,
                    });
                }
                // Someone changed the workflow: re-read, re-plan, re-check the pods.
                Err(RetryError::Api(e)) if api_code(&e) == Some(409) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads and plans the workflow and deletes the plan's pods; `None` if the
    /// request is already answered.
    async fn prepare(
        &mut self,
        announced: &mut bool,
        outcomes: &mut tokio::sync::mpsc::UnboundedReceiver<Outcome>,
    ) -> Result<Option<(Workflow, Plan)>, RetryError> {
        let Some(mut wf) = self.read().await? else {
            return Ok(None);
        };
        crate::offload::hydrate(self.ctx.database.as_deref(), &mut wf).await?;
        // Announced once the workflow confirms the request is pending: a
        // late watch event about a finished request says nothing.
        if !*announced {
            *announced = true;
            info!(
                workflow = self.target.name,
                namespace = self.target.namespace,
                token = self.target.token,
                "retry started"
            );
            // Off the retry's path; the request's last Event waits for it.
            self.announcing = Some(tokio::spawn(self.publish(
                EventType::Normal,
                "RetryStarted",
                format!("rewind started retry request {}", self.target.token),
            )));
        }
        self.resource_version = wf.metadata.resource_version.clone();
        self.stale = false;
        self.was_completed = wf.label(labels::COMPLETED) == Some("true");
        let plan = self.plan(&wf)?;
        self.delete_pods(outcomes).await?;
        Ok(Some((wf, plan)))
    }

    fn plan(&mut self, wf: &Workflow) -> Result<Plan, RetryError> {
        let empty = BTreeMap::new();
        let annotations = wf.metadata.annotations.as_ref().unwrap_or(&empty);
        let request = match request::pending(annotations) {
            Some(Ok(r)) if r.token == self.target.token => r,
            Some(Err(e))
                if annotations.get(annotations::RETRY).map(|t| t.trim())
                    == Some(self.target.token.as_str()) =>
            {
                return Err(e.into());
            }
            // A newer token replaced ours; the watch starts that one.
            _ => return Err(RetryError::Superseded),
        };
        let options = RetryOptions {
            restart_successful: request.options.restart_successful,
            node_field_selector: request.options.node_field_selector,
            parameters: request.options.parameters,
            argo_version: self.ctx.config.argo_version,
            // With a database, the commit dehydrates (compresses or offloads).
            max_workflow_size: match &self.ctx.database {
                Some(db) if db.offloads() => usize::MAX,
                _ => self.ctx.config.max_workflow_size,
            },
            compression: self.ctx.config.compression.clone(),
        };
        let plan = plan::plan_retry(wf, &options)?;
        self.pod_nodes
            .extend(plan.pod_nodes.iter().map(|(p, n)| (p.clone(), n.clone())));
        match &mut self.tracker {
            Some(t) => t.extend(plan.pods_to_delete.iter().cloned()),
            None => self.tracker = Some(Tracker::new(plan.pods_to_delete.iter().cloned())),
        }
        Ok(plan)
    }

    /// Deletes the plan's pods until a fresh list shows every one gone.
    async fn delete_pods(
        &mut self,
        outcomes: &mut tokio::sync::mpsc::UnboundedReceiver<Outcome>,
    ) -> Result<(), RetryError> {
        let tracker = self.tracker.as_mut().expect("planned before deleting");
        let total = tracker.plan().len();
        self.status.pods_total = total as u64;
        let interval = self.ctx.config.status_interval;
        // Progress is reported on a clock, not per outcome: one status write
        // per interval at most, and none for a batch that ends sooner.
        let mut next_report = self.started + interval;
        loop {
            let tracker = self.tracker.as_mut().expect("planned before deleting");
            let listed = list_workflow_pods(
                &self.ctx.client,
                &self.target.namespace,
                &self.target.name,
                tracker.plan(),
            )
            .await?;
            let mut assessment = tracker.assess(&self.target.name, &listed, self.allow_bulk)?;
            if let Some(removed) = self.progress.listed(&assessment.gone) {
                // A bulk request cut short removed what this list no longer shows.
                self.pods_deleted += removed;
                self.ctx.metrics.pods_deleted(removed);
                self.status.message = if removed > 0 {
                    format!(
                        "a bulk delete was cut short (by the API server's request timeout or an error) after it removed {removed} pods; rewind listed the pods again and deletes the rest"
                    )
                } else {
                    // Another bulk request would likely meet the same end.
                    self.allow_bulk = false;
                    assessment = tracker.assess(&self.target.name, &listed, false)?;
                    "a bulk delete was cut short (by the API server's request timeout or an error) before it removed any pod; rewind deletes the rest one by one".to_owned()
                };
                warn!(
                    workflow = self.target.name,
                    namespace = self.target.namespace,
                    removed,
                    bulk = self.allow_bulk,
                    left = total - assessment.gone.len(),
                    "bulk delete cut short; pods listed again"
                );
            }
            let work = split_bulk(
                std::mem::take(&mut assessment.work),
                self.ctx.config.bulk_parallelism,
                &self.pod_nodes,
            );
            self.status.pods_deleted = self.progress.deleted() as u64;
            if assessment.all_gone(total) {
                return Ok(());
            }
            self.status.phase = RetryPhase::DeletingPods;
            let mut pending = 0usize;
            for work in work {
                let item = WorkItem {
                    namespace: self.target.namespace.clone(),
                    work,
                };
                self.ctx
                    .queue
                    .add(self.key.clone(), Class::Interactive, item);
                pending += 1;
            }
            let mut wait_terminating = !assessment.terminating.is_empty();
            while pending > 0 || wait_terminating {
                let outcome = tokio::select! {
                    o = outcomes.recv(), if pending > 0 => o.ok_or(RetryError::ShuttingDown)?,
                    // Pods on a node shut down gracefully; look again shortly.
                    _ = tokio::time::sleep(TERMINATING_POLL), if pending == 0 => {
                        wait_terminating = false;
                        continue;
                    }
                    _ = tokio::time::sleep_until(next_report) => {
                        next_report = Instant::now() + interval;
                        self.report_progress().await?;
                        self.check_still_completed().await?;
                        continue;
                    }
                };
                pending -= 1;
                self.answered(&outcome.item.work, outcome.result?);
            }
        }
    }

    /// Counts what a work item's answer says.
    fn answered(&mut self, work: &DeleteWork, done: Done) {
        if done == Done::Unfinished {
            self.progress.cut_short(work);
            return;
        }
        if let Done::Deleted(n) = done {
            self.pods_deleted += n;
            self.ctx.metrics.pods_deleted(n);
        }
        let plan = self
            .tracker
            .as_ref()
            .expect("planned before deleting")
            .plan();
        self.progress.answered(plan, work);
        self.status.pods_deleted = self.progress.deleted() as u64;
    }

    /// Stops the deletions (once per status interval at most, from workflow
    /// metadata) if the workflow is gone or runs again: Argo's controller
    /// would then own its pods, and deleting more of them would harm the run.
    async fn check_still_completed(&mut self) -> Result<(), RetryError> {
        if self.last_check.elapsed() < self.ctx.config.status_interval {
            return Ok(());
        }
        self.last_check = Instant::now();
        // From the API server's watch cache (resourceVersion 0): a read from etcd would
        // decode the whole workflow, a megabyte at 20,000 pods, while the server deletes.
        let meta = self
            .workflows()
            .get_metadata_opt_with(&self.target.name, &GetParams::any())
            .await?;
        let Some(meta) =
            meta.filter(|m| m.metadata.uid.as_deref() == Some(self.target.uid.as_str()))
        else {
            return Err(RetryError::WorkflowGone);
        };
        let label = |key: &str| {
            meta.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .map(String::as_str)
        };
        let (phase, completed) = (label(labels::PHASE), label(labels::COMPLETED));
        let running = matches!(phase, Some("Pending" | "Running"));
        let reopened = self.was_completed && completed != Some("true");
        if running || reopened {
            return Err(RetryError::WorkflowChanged {
                phase: phase.unwrap_or("(none)").to_owned(),
                completed: completed.unwrap_or("(none)").to_owned(),
            });
        }
        Ok(())
    }

    /// Writes the reset workflow, the observed token and the final status in
    /// one update that fails if the workflow changed since it was read.
    async fn commit(&mut self, wf: Workflow, plan: Plan) -> Result<(), RetryError> {
        let mut reset = plan.workflow;
        if let Some(db) = self.ctx.database.as_ref().filter(|db| db.offloads()) {
            let config = &self.ctx.config;
            crate::offload::dehydrate(
                db.as_ref(),
                &mut reset,
                config.max_workflow_size,
                &config.compression,
                config.argo_version,
                config.always_offload_node_status,
            )
            .await?;
        }
        reset.metadata.resource_version = self
            .resource_version
            .clone()
            .or(wf.metadata.resource_version);
        self.status.phase = RetryPhase::Succeeded;
        self.status.finished_at = Some(now());
        self.status.message = format!(
            "deleted {} pods; the workflow was reset",
            self.status.pods_total
        );
        let annotations = reset
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(annotations::OBSERVED.into(), self.target.token.clone());
        annotations.insert(
            annotations::STATUS.into(),
            serde_json::to_string(&self.status).expect("status serializes"),
        );
        self.workflows()
            .replace(&self.target.name, &PostParams::default(), &reset)
            .await?;
        Ok(())
    }

    /// Writes progress to `rewind.dev/retry-status` if it says something new
    /// and the request has run for a status interval (a retry that ends
    /// sooner costs no write but the final one). The write is conditional on
    /// the workflow being as read, so that its new version is still one the
    /// commit may write over; once someone else changed the workflow (409),
    /// it is read again before the commit anyway, and progress goes on being
    /// written without the condition (a merge patch of our annotation alone).
    async fn report_progress(&mut self) -> Result<(), RetryError> {
        let written = self.written.as_ref().map(|(s, at)| (s, at.elapsed()));
        let due = progress_due(
            &self.status,
            self.started.elapsed(),
            written,
            self.ctx.config.status_interval,
        );
        if !due {
            return Ok(());
        }
        if !self.stale {
            match self.patch_status(false, true).await {
                Err(e) if api_code(&e) == Some(409) => self.stale = true,
                result => return Ok(result?),
            }
        }
        Ok(self.patch_status(false, false).await?)
    }

    /// Writes the status annotation, and the observed token with it when
    /// `observe` (the request is answered); only on the workflow's version as
    /// last read (or written by us) when `guarded`.
    async fn patch_status(&mut self, observe: bool, guarded: bool) -> Result<(), kube::Error> {
        let mut annotations = serde_json::Map::new();
        annotations.insert(
            annotations::STATUS.into(),
            serde_json::to_string(&self.status)
                .expect("status serializes")
                .into(),
        );
        if observe {
            annotations.insert(
                annotations::OBSERVED.into(),
                self.target.token.clone().into(),
            );
        }
        let mut metadata = serde_json::json!({"annotations": annotations});
        if guarded {
            // A merge patch naming a resourceVersion fails (409) on any other.
            metadata["resourceVersion"] = self.resource_version.clone().into();
        }
        let written = self
            .workflows()
            .patch_metadata(
                &self.target.name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "metadata": metadata })),
            )
            .await?;
        if guarded {
            self.resource_version = written.metadata.resource_version;
        }
        self.written = Some((self.status.clone(), Instant::now()));
        Ok(())
    }

    /// Ends the request as failed: the status says why and the token is
    /// observed, so the request is answered once and not retried in a loop.
    async fn fail(&mut self, error: &RetryError) {
        self.status.phase = RetryPhase::Failed;
        // The hint reads the workflow as it is now (e.g. reset by which request).
        let meta = self.workflows().get_metadata_opt(&self.target.name).await;
        let annotations = meta.ok().flatten().and_then(|m| m.metadata.annotations);
        self.status.message =
            crate::hint::message(error, &self.target.name, &annotations.unwrap_or_default());
        self.status.finished_at = Some(now());
        if let Err(e) = self.patch_status(true, false).await {
            warn!(workflow = self.target.name, namespace = self.target.namespace, error = %e, "could not record the failed retry");
        }
        self.event(
            EventType::Warning,
            "RetryFailed",
            self.status.message.clone(),
        )
        .await;
    }

    /// Says why the request is waiting, without observing its token: it is
    /// tried again from the start (pods already gone count as done).
    async fn report_transient(&mut self, error: &RetryError) {
        self.status.phase = RetryPhase::Pending;
        self.status.message = format!("{error}; rewind will try again");
        if let Err(e) = self.patch_status(false, false).await {
            warn!(workflow = self.target.name, namespace = self.target.namespace, error = %e, "could not record the retry's error");
        }
        self.event(
            EventType::Warning,
            "RetryError",
            self.status.message.clone(),
        )
        .await;
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        self.publish(type_, reason, note).await
    }

    /// Publishes an Event about the workflow; the future borrows nothing, so
    /// it can run beside the request.
    fn publish(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
    ) -> impl Future<Output = ()> + Send + 'static {
        let reference = ObjectReference {
            api_version: Some(Workflow::api_version(&()).into_owned()),
            kind: Some(Workflow::kind(&()).into_owned()),
            name: Some(self.target.name.clone()),
            namespace: Some(self.target.namespace.clone()),
            uid: Some(self.target.uid.clone()),
            ..Default::default()
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, 1024)),
            action: "Retry".into(),
            secondary: None,
        };
        let (recorder, workflow) = (self.ctx.recorder.clone(), self.target.name.clone());
        async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                warn!(workflow, error = %e, "could not publish event");
            }
        }
    }
}

/// Whether progress `now`, of a request running for `running`, is worth a
/// write, given the status last `written` and how long ago: only once the
/// request has run an `interval`, at most once per `interval`, and only if it
/// says something the last write did not.
fn progress_due(
    now: &RetryStatus,
    running: Duration,
    written: Option<(&RetryStatus, Duration)>,
    interval: Duration,
) -> bool {
    let news = |s: &RetryStatus| {
        (s.phase, s.pods_total, s.pods_deleted) != (now.phase, now.pods_total, now.pods_deleted)
    };
    running >= interval && written.is_none_or(|(last, ago)| ago >= interval && news(last))
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: RetryPhase, deleted: u64) -> RetryStatus {
        RetryStatus {
            token: "t".into(),
            phase,
            pods_total: 10,
            pods_deleted: deleted,
            message: String::new(),
            started_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn progress_is_written_only_when_new_and_at_most_once_per_interval() {
        let s = Duration::from_secs;
        let interval = s(2);
        let deleting = status(RetryPhase::DeletingPods, 0);
        // Not before the request has run an interval: a quick retry writes only its end.
        assert!(!progress_due(
            &deleting,
            Duration::from_millis(1900),
            None,
            interval
        ));
        assert!(progress_due(&deleting, s(2), None, interval));
        // One bulk request in flight: nothing new, no write however long it runs.
        assert!(!progress_due(
            &deleting,
            s(30),
            Some((&deleting, s(28))),
            interval
        ));
        // Something new, but the last write was too recent.
        let moved = status(RetryPhase::DeletingPods, 4);
        assert!(!progress_due(
            &moved,
            s(5),
            Some((&deleting, s(1))),
            interval
        ));
        assert!(progress_due(
            &moved,
            s(5),
            Some((&deleting, s(2))),
            interval
        ));
    }
}
