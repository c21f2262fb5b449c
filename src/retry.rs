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

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::delete::{Recreated, Tracker};
use crate::plan::{self, ArgoVersion, Plan, PlanError, RetryOptions};
use crate::queue::Class;
use crate::request::{self, RetryPhase, RetryStatus, annotations};
use crate::workers::{Done, Outcome, Outcomes, Queue, RequestKey, WorkItem, api_code};
use crate::workflow::{Workflow, labels};

/// Settings shared by every retry.
#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Use DeleteCollection where it is provably exact.
    pub allow_bulk: bool,
    pub argo_version: ArgoVersion,
    pub max_workflow_size: usize,
    /// Least time between two `rewind.dev/retry-status` writes of one request.
    pub status_interval: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            allow_bulk: true,
            argo_version: ArgoVersion::default(),
            max_workflow_size: plan::compress::DEFAULT_MAX_WORKFLOW_SIZE,
            status_interval: Duration::from_secs(2),
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
        matches!(self, RetryError::Api(_) | RetryError::Delete(_))
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

/// Runs one request to its end, or until a transient error (see
/// [`RetryError::is_transient`]), which the caller retries later. Errors are
/// reported to the user (status annotation and Event) before this returns.
pub async fn run(ctx: &Context, target: &Target) -> Result<Finished, RetryError> {
    let started = Instant::now();
    let key = target.key();
    let mut outcomes = ctx.outcomes.register(key.clone());
    let mut job = Job::new(ctx, target, key.clone());
    let result = job.run(&mut outcomes).await;
    ctx.outcomes.unregister(&key);
    ctx.queue.cancel(&key);
    let label = match &result {
        Ok(Finished::Retried { .. }) => "succeeded",
        Ok(Finished::AlreadyObserved) => "already_observed",
        Err(RetryError::ShuttingDown | RetryError::Superseded) => "interrupted",
        Err(e) if e.is_transient() => "transient_error",
        Err(_) => "failed",
    };
    ctx.metrics.observe_retry(label, started.elapsed());
    match &result {
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
    result
}

struct Job<'a> {
    ctx: &'a Context,
    target: &'a Target,
    key: RequestKey,
    status: RetryStatus,
    started: Instant,
    last_status_write: Option<Instant>,
    /// A status write changed the workflow since it was last read.
    wrote_since_read: bool,
    /// When the workflow was last checked for a change of phase under us.
    last_check: Instant,
    /// The workflow carried `workflows.argoproj.io/completed=true` when read.
    was_completed: bool,
    tracker: Option<Tracker>,
    pods_deleted: usize,
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
            last_status_write: None,
            wrote_since_read: false,
            last_check: Instant::now(),
            was_completed: false,
            tracker: None,
            pods_deleted: 0,
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
    ) -> Result<Finished, RetryError> {
        let mut announced = false;
        loop {
            let Some(wf) = self.read().await? else {
                return Ok(Finished::AlreadyObserved);
            };
            // Announced once the workflow confirms the request is pending: a
            // late watch event about a finished request says nothing.
            if !announced {
                announced = true;
                info!(
                    workflow = self.target.name,
                    namespace = self.target.namespace,
                    token = self.target.token,
                    "retry started"
                );
                self.event(
                    EventType::Normal,
                    "RetryStarted",
                    format!("rewind started retry request {}", self.target.token),
                )
                .await;
            }
            self.wrote_since_read = false;
            self.was_completed = wf.label(labels::COMPLETED) == Some("true");
            let plan = self.plan(&wf)?;
            self.delete_pods(outcomes).await?;
            self.status.phase = RetryPhase::Committing;
            self.write_status().await?;
            if self.wrote_since_read {
                // Our own status write changed the workflow: read it again
                // (the next pass re-checks the pods with a fresh list).
                continue;
            }
            match self.commit(wf, plan).await {
                Ok(()) => {
                    return Ok(Finished::Retried {
                        pods_deleted: self.pods_deleted,
                    });
                }
                // Someone changed the workflow (perhaps only our own status
                // annotation): re-read, re-plan, re-check the pods.
                Err(RetryError::Api(e)) if api_code(&e) == Some(409) => continue,
                Err(e) => return Err(e),
            }
        }
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
            max_workflow_size: self.ctx.config.max_workflow_size,
        };
        let plan = plan::plan_retry(wf, &options)?;
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
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.target.namespace);
        let lp =
            ListParams::default().labels(&format!("{}={}", labels::WORKFLOW, self.target.name));
        let tracker = self.tracker.as_mut().expect("planned before deleting");
        let total = tracker.plan().len();
        self.status.pods_total = total as u64;
        loop {
            let listed = pods.list(&lp).await?.items;
            let tracker = self.tracker.as_mut().expect("planned before deleting");
            let assessment =
                tracker.assess(&self.target.name, &listed, self.ctx.config.allow_bulk)?;
            self.status.pods_deleted = assessment.gone.len() as u64;
            if assessment.all_gone(total) {
                return Ok(());
            }
            self.status.phase = RetryPhase::DeletingPods;
            let mut pending = 0usize;
            for work in assessment.work {
                let item = WorkItem {
                    namespace: self.target.namespace.clone(),
                    work,
                };
                self.ctx
                    .queue
                    .add(self.key.clone(), Class::Interactive, item);
                pending += 1;
            }
            while pending > 0 {
                let outcome = tokio::select! {
                    o = outcomes.recv() => o.ok_or(RetryError::ShuttingDown)?,
                    _ = tokio::time::sleep(self.ctx.config.status_interval) => {
                        self.write_status().await?;
                        self.check_still_completed().await?;
                        continue;
                    }
                };
                pending -= 1;
                match outcome.result? {
                    Done::Deleted(n) => {
                        self.pods_deleted += n;
                        self.ctx.metrics.pods_deleted(n);
                        self.status.pods_deleted =
                            (self.status.pods_deleted + n as u64).min(total as u64);
                    }
                    Done::AlreadyGone | Done::Replaced => {}
                }
                self.write_status().await?;
                self.check_still_completed().await?;
            }
            if !assessment.terminating.is_empty() {
                // Pods on a node shut down gracefully; look again shortly.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }

    /// Stops the deletions (once per status interval at most, from workflow
    /// metadata) if the workflow is gone or runs again: Argo's controller
    /// would then own its pods, and deleting more of them would harm the run.
    async fn check_still_completed(&mut self) -> Result<(), RetryError> {
        if self.last_check.elapsed() < self.ctx.config.status_interval {
            return Ok(());
        }
        self.last_check = Instant::now();
        let meta = self.workflows().get_metadata_opt(&self.target.name).await?;
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
        reset.metadata.resource_version = wf.metadata.resource_version.clone();
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
        self.wait_status_slot().await;
        self.workflows()
            .replace(&self.target.name, &PostParams::default(), &reset)
            .await?;
        self.last_status_write = Some(Instant::now());
        Ok(())
    }

    /// Patches `rewind.dev/retry-status` with progress, at most once per
    /// status interval and not before the request has run that long: a retry
    /// that ends sooner costs no write but the final one.
    async fn write_status(&mut self) -> Result<(), RetryError> {
        let interval = self.ctx.config.status_interval;
        if self.started.elapsed() < interval
            || self
                .last_status_write
                .is_some_and(|t| t.elapsed() < interval)
        {
            return Ok(());
        }
        self.patch_status(false).await?;
        self.wrote_since_read = true;
        Ok(())
    }

    /// Writes the status annotation, and the observed token with it when
    /// `observe` (the request is answered).
    async fn patch_status(&mut self, observe: bool) -> Result<(), kube::Error> {
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
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        self.workflows()
            .patch_metadata(
                &self.target.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.last_status_write = Some(Instant::now());
        Ok(())
    }

    async fn wait_status_slot(&self) {
        if let Some(t) = self.last_status_write {
            tokio::time::sleep_until(t + self.ctx.config.status_interval).await;
        }
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
        self.wait_status_slot().await;
        if let Err(e) = self.patch_status(true).await {
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
        self.wait_status_slot().await;
        if let Err(e) = self.patch_status(false).await {
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
        if let Err(e) = self.ctx.recorder.publish(&event, &reference).await {
            warn!(workflow = self.target.name, error = %e, "could not publish event");
        }
    }
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
