//! A live retry: one request on a workflow, from the annotation to the reset
//! workflow.
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

use kube::api::{Api, PartialObjectMeta, Patch, PatchParams, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::argo::offload::{self, OffloadError};
use crate::argo::plan::{Plan, PlanError};
use crate::argo::workflow::{Workflow, labels};
use crate::engine::budget::on_behalf_of;
use crate::engine::drive::{Count, DeleteError, Deletion, Sink};
use crate::engine::fault::{self, api_code};
use crate::engine::workers::RequestKey;
use crate::protocol::hint::{self, Refusal};
use crate::protocol::request::{self, RequestError, RetryPhase, RetryStatus, annotations};
use crate::retry::Context;
use crate::retry::admission::{Admitted, Planning};
use crate::retry::pickup;
use crate::retry::progress::{End, Seen};
use crate::retry::report::{self, Ending, Events, Report};
use crate::telemetry::metrics::{RetryKind, Step};

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
        RequestKey::retry(&self.namespace, &self.uid, &self.token)
    }
}

/// Times the reset may meet a workflow changed by someone else (409) before
/// the request gives up: each time it reads, plans and lists again, so a
/// workflow rewritten without pause would keep it busy forever.
pub const MAX_CONFLICTS: u32 = 10;

/// The first wait after a conflict, doubling up to [`CONFLICT_BACKOFF_MAX`]:
/// a writer that rewrites the workflow in a loop is given room to finish.
const CONFLICT_BACKOFF: Duration = Duration::from_millis(100);
const CONFLICT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a request ended without a reset. The message goes to the user in
/// `rewind.dev/retry-status` and an Event.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error(transparent)]
    BadRequest(#[from] RequestError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Delete(#[from] DeleteError),
    #[error(
        "the workflow was deleted or replaced (UID changed) during the retry; nothing more was deleted"
    )]
    WorkflowGone,
    #[error(
        "the workflow started running again (phase label {phase}, completed label {completed}) during the retry, perhaps retried by someone else; rewind stopped and deleted nothing more"
    )]
    WorkflowChanged { phase: String, completed: String },
    #[error(
        "the workflow changed under the retry {attempts} times in a row (someone else keeps writing it); rewind stopped before resetting it and deletes nothing more: find the writer, then ask again"
    )]
    KeptChanging { attempts: u32 },
    #[error("{what} failed: {}", fault::explain(.source))]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Offload(#[from] OffloadError),
    #[error("a newer retry request replaced this one")]
    Superseded,
}

impl RetryError {
    /// Whether a later attempt may succeed: the request stays pending and is
    /// tried again, so no request is lost to a passing fault (rule 4).
    /// Everything else ends the request.
    pub fn is_transient(&self) -> bool {
        match self {
            RetryError::Api { source, .. } => fault::is_transient(source),
            RetryError::Delete(e) => e.is_transient(),
            RetryError::Offload(e) => e.is_transient(),
            _ => false,
        }
    }

    /// The refusal this is, if the request was refused before any deletion.
    pub fn refusal(&self) -> Option<Refusal<'_>> {
        match self {
            RetryError::Plan(e) => Some(Refusal::Plan(e)),
            RetryError::BadRequest(e) => Some(Refusal::Request(e)),
            _ => None,
        }
    }
}

/// `RetryError::Api` for `what`, as a `map_err` argument.
fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> RetryError {
    let what = what.into();
    move |source| RetryError::Api { what, source }
}

/// How a request ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Finished {
    /// The workflow was reset; `reset` is what to follow to check that Argo
    /// picks it up (see [`pickup`]).
    Retried {
        pods_deleted: usize,
        reset: Option<pickup::Reset>,
    },
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
    // Marked before the workflow is read: a WorkflowRetry that finds its
    // request replaced on the workflow waits for this end (see `progress`).
    let _serving = ctx.progress.serving(&target.token);
    // Its API requests take turns with other askers' in its namespace.
    let asker = target.key().asker().into();
    on_behalf_of(asker, async {
        let mut job = Job::new(ctx, target);
        let result = job.run(shutdown).await;
        if let Some(deletion) = job.deletion.take() {
            deletion.stop(shutdown).await;
        }
        drop(job.admitted.take());
        let grace = async {
            shutdown.cancelled().await;
            tokio::time::sleep(REPORT_GRACE).await;
        };
        tokio::select! {
            _ = job.report(&result, started) => {}
            _ = grace => warn!(workflow = target.name, namespace = target.namespace, "stopping before the end of the retry was reported"),
        }
        result
    })
    .await
}

/// Ends `target`'s request Failed after it panicked: its status says so and
/// the token is answered, so it is not run again at every start.
pub async fn answer_panic(ctx: &Context, target: &Target, panic: &str) {
    let ending = Ending::Failed(format!(
        "rewind failed on this request (it panicked: {panic}); nothing more is deleted for it; this is a bug: report it with the controller's log, then ask again with a new rewind.dev/retry value"
    ));
    ctx.metrics
        .observe_retry(ending.metric_label(), Duration::ZERO);
    let mut status = WorkflowStatus::new(ctx, target);
    // Not written: the token stays pending and is answered again at the next start.
    let _ = report::end(&mut status, &ending).await;
    ctx.progress
        .end(&target.token, End::Answered(status.status.clone()));
}

struct Job<'a> {
    ctx: &'a Context,
    target: &'a Target,
    /// Created at the first plan; kept across re-plans.
    deletion: Option<Deletion>,
    /// Its share of the bound on pods in deletion at once, from its first plan on.
    admitted: Option<Admitted>,
    status: WorkflowStatus<'a>,
    /// The RetryStarted Event being sent.
    announcing: Option<tokio::task::JoinHandle<()>>,
}

impl<'a> Job<'a> {
    fn new(ctx: &'a Context, target: &'a Target) -> Self {
        Job {
            ctx,
            target,
            deletion: None,
            admitted: None,
            status: WorkflowStatus::new(ctx, target),
            announcing: None,
        }
    }

    /// Tells the user (log, metrics, status, Event) how the request ended.
    async fn report(&mut self, result: &Result<Finished, RetryError>, started: Instant) {
        let target = self.target;
        if let Some(announcing) = self.announcing.take() {
            let _ = announcing.await;
        }
        let ending = match result {
            Ok(Finished::Retried { pods_deleted, .. }) => {
                info!(
                    workflow = target.name,
                    namespace = target.namespace,
                    token = target.token,
                    pods_deleted,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "workflow retried"
                );
                Ending::Succeeded(self.status.status.message.clone())
            }
            Ok(Finished::AlreadyObserved) => Ending::AlreadyAnswered,
            Err(RetryError::Superseded) => Ending::Interrupted,
            Err(RetryError::Delete(DeleteError::Stopped)) => Ending::Interrupted,
            Err(RetryError::WorkflowGone) => Ending::Gone,
            Err(e) if e.is_transient() => {
                warn!(workflow = target.name, namespace = target.namespace, token = target.token, error = %e, "retry interrupted; it will be tried again");
                Ending::retrying(e)
            }
            Err(e) => {
                warn!(workflow = target.name, namespace = target.namespace, token = target.token, error = %e, "retry failed");
                Ending::Failed(self.failure(e).await)
            }
        };
        self.ctx
            .metrics
            .observe_retry(ending.metric_label(), started.elapsed());
        // Not written: the token stays pending, and the next attempt answers it.
        let _ = report::end(&mut self.status, &ending).await;
        // Handed to the WorkflowRetry that asked for it, if one did: a later
        // request may overwrite this report on the workflow before it looks.
        let end = match (&ending, result) {
            (Ending::Succeeded(_) | Ending::Failed(_), _) => {
                Some(End::Answered(self.status.status.clone()))
            }
            (_, Err(RetryError::Superseded)) => Some(End::Replaced),
            _ => None,
        };
        if let Some(end) = end {
            self.ctx.progress.end(&target.token, end);
        }
    }

    /// What a failed request tells its user: Argo's words, then what rewind
    /// knows of the workflow as it is now (e.g. reset by which request).
    async fn failure(&self, error: &RetryError) -> String {
        let Some(refusal) = error.refusal() else {
            return error.to_string();
        };
        let meta = self
            .status
            .workflows()
            .get_metadata_opt(&self.target.name)
            .await;
        let annotations = meta.ok().flatten().and_then(|m| m.metadata.annotations);
        hint::message(refusal, &self.target.name, &annotations.unwrap_or_default())
    }

    /// Reads, plans, deletes and commits, again after each conflict (up to
    /// [`MAX_CONFLICTS`]).
    async fn run(&mut self, shutdown: &CancellationToken) -> Result<Finished, RetryError> {
        let metrics = &self.ctx.metrics;
        let mut conflicts = 0;
        let mut backoff = CONFLICT_BACKOFF;
        loop {
            // Everything up to the commit may stop at shutdown: the request
            // stays pending and the next start resumes it (rule 4).
            let prepared = tokio::select! {
                _ = shutdown.cancelled() => return Err(DeleteError::Stopped.into()),
                p = self.prepare(shutdown) => p?,
            };
            let Some(plan) = prepared else {
                return Ok(Finished::AlreadyObserved);
            };
            if !self.status.stale {
                let commit = metrics.step(RetryKind::Live, Step::Commit);
                match self.status.commit(plan).await {
                    Ok(()) => {
                        commit.done();
                        let removed = self.deletion.as_ref().map_or(0, Deletion::removed);
                        return Ok(Finished::Retried {
                            pods_deleted: removed,
                            reset: self.reset(),
                        });
                    }
                    // Someone changed the workflow: re-read, re-plan, re-check the pods.
                    Err(RetryError::Api { source, .. }) if api_code(&source) == Some(409) => {}
                    Err(e) => return Err(e),
                }
            }
            conflicts += 1;
            if conflicts >= MAX_CONFLICTS {
                return Err(RetryError::KeptChanging {
                    attempts: conflicts,
                });
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Err(DeleteError::Stopped.into()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(CONFLICT_BACKOFF_MAX);
            // Confirm the pods gone with a fresh list now, before the workflow
            // is read again: if the re-plan adds no pod, the commit follows
            // the read at once, leaving a writer the least time to come
            // between them.
            if let Some(deletion) = self.deletion.as_mut() {
                let delete = metrics.step(RetryKind::Live, Step::Delete);
                deletion.run(&mut self.status, shutdown).await?;
                delete.done_confirmed(deletion.confirm_took());
            }
        }
    }

    /// What to follow of the reset just written: the pods it deleted, from
    /// the revision it was written at.
    fn reset(&self) -> Option<pickup::Reset> {
        let pods = self.deletion.as_ref()?.planned().clone();
        Some(pickup::Reset {
            namespace: self.target.namespace.clone(),
            workflow: self.target.name.clone(),
            uid: self.target.uid.clone(),
            token: self.target.token.clone(),
            revision: self.status.reset_at.clone()?,
            pods,
        })
        .filter(|r| !r.pods.is_empty())
    }

    /// Reads and plans the workflow and deletes the plan's pods; `None` if the
    /// request is already answered.
    async fn prepare(&mut self, shutdown: &CancellationToken) -> Result<Option<Plan>, RetryError> {
        let metrics = &self.ctx.metrics;
        let read = if self.admitted.is_some() {
            self.read_and_plan().await?
        } else {
            let ctx = self.ctx;
            let (read, admitted) = ctx.admission.plan_admitted(self, shutdown).await?;
            self.admitted = Some(admitted);
            read
        };
        let Some(Read { plan, read_at }) = read else {
            return Ok(None);
        };
        let deletion = self.deletion.get_or_insert_with(|| {
            Deletion::new(
                &self.ctx.engine,
                self.target.key(),
                &self.target.namespace,
                &self.target.name,
                self.ctx.config.drive(),
            )
            .plan_owned_by(&self.target.uid)
        });
        deletion.plan(plan.pods_to_delete.iter().cloned(), &plan.pod_nodes);
        // The plan pods are those the workflow's pods were as it was read:
        // one created under a planned name since is a re-run's, not ours.
        deletion.read_at(read_at);
        self.status.status.pods_total = deletion.count().total as u64;
        if !deletion.confirmed() {
            let delete = metrics.step(RetryKind::Live, Step::Delete);
            deletion.run(&mut self.status, shutdown).await?;
            delete.done_confirmed(deletion.confirm_took());
        }
        self.status.counted(&deletion.count());
        Ok(Some(plan))
    }

    /// Plans the retry the annotations ask for, off the async workers (a
    /// large workflow takes a while to decompress and plan).
    async fn plan(&mut self, wf: Workflow) -> Result<Plan, RetryError> {
        let empty = BTreeMap::new();
        let annotations = wf.metadata.annotations.as_ref().unwrap_or(&empty);
        let request = match request::pending(annotations) {
            Some(Ok(r)) if r.token == self.target.token => r,
            Some(Err(e)) if request::token(annotations).as_ref() == Some(&self.target.token) => {
                return Err(e.into());
            }
            // A newer token replaced ours; the watch starts that one.
            _ => return Err(RetryError::Superseded),
        };
        self.status.observed(&wf);
        let options = self
            .ctx
            .config
            .plan_options(request.options, self.ctx.offloading().is_some());
        Ok(crate::retry::plan_off_thread(wf, options).await?)
    }
}

/// A workflow as planned, and the resourceVersion it was read at.
struct Read {
    plan: Plan,
    read_at: Option<String>,
}

impl Planning for Job<'_> {
    /// `None` when the request is answered already: nothing to admit.
    type Planned = Option<Read>;
    type Error = RetryError;

    async fn read_and_plan(&mut self) -> Result<Option<Read>, RetryError> {
        let metrics = &self.ctx.metrics;
        let read = metrics.step(RetryKind::Live, Step::Read);
        let Some(mut wf) = self.status.read().await? else {
            return Ok(None);
        };
        offload::hydrate(self.ctx.database.as_deref(), &mut wf).await?;
        read.done();
        let read_at = wf.metadata.resource_version.clone();
        // Announced once the workflow confirms the request is pending: a
        // late watch event about a finished request says nothing.
        if self.announcing.is_none() {
            info!(
                workflow = self.target.name,
                namespace = self.target.namespace,
                token = self.target.token,
                "retry started"
            );
            // Off the retry's path; the request's last Event waits for it.
            // Its write is the asker's too: a task of its own would lose
            // the asker and wait in the namespace's line once per Event,
            // ahead of other askers (200 of a batch's did, before a
            // second user's retry).
            self.announcing = Some(tokio::spawn(on_behalf_of(
                self.target.key().asker().into(),
                self.status.events.publish(
                    kube::runtime::events::EventType::Normal,
                    report::reasons::STARTED,
                    format!("rewind started retry request {}", self.target.token),
                ),
            )));
        }
        // The workflow as read is not kept: the plan holds the one copy of its nodes.
        let planning = metrics.step(RetryKind::Live, Step::Plan);
        let plan = self.plan(wf).await?;
        planning.done();
        Ok(Some(Read { plan, read_at }))
    }

    fn pods(read: &Option<Read>) -> usize {
        read.as_ref().map_or(0, |r| r.plan.pods_to_delete.len())
    }

    async fn waiting(&mut self, message: &str) -> Result<(), RetryError> {
        self.status.waiting(message).await
    }
}

/// The request's status in the workflow's `rewind.dev/retry-status`
/// annotation, and its Events: the live retry's [`Sink`] and [`Report`].
struct WorkflowStatus<'a> {
    ctx: &'a Context,
    target: &'a Target,
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
    events: Events,
    /// The revision the reset was written at.
    reset_at: Option<String>,
}

impl<'a> WorkflowStatus<'a> {
    fn new(ctx: &'a Context, target: &'a Target) -> Self {
        WorkflowStatus {
            ctx,
            target,
            status: RetryStatus {
                token: target.token.clone(),
                phase: RetryPhase::Pending,
                pods_total: 0,
                pods_deleted: 0,
                message: String::new(),
                started_at: Some(request::now()),
                finished_at: None,
            },
            started: Instant::now(),
            written: None,
            resource_version: None,
            stale: false,
            last_check: Instant::now(),
            was_completed: false,
            events: Events::of_workflow(ctx, &target.namespace, &target.name, &target.uid),
            reset_at: None,
        }
    }

    fn workflows(&self) -> Api<Workflow> {
        Api::namespaced(self.ctx.client(), &self.target.namespace)
    }

    /// Reads the workflow; `None` if it is already observed.
    async fn read(&self) -> Result<Option<Workflow>, RetryError> {
        let found = self
            .workflows()
            .get_opt(&self.target.name)
            .await
            .map_err(api(format!(
                "reading workflow {}/{}",
                self.target.namespace, self.target.name
            )))?;
        let wf = match found {
            Some(wf) if wf.metadata.uid.as_deref() == Some(self.target.uid.as_str()) => wf,
            _ => return Err(RetryError::WorkflowGone),
        };
        if wf.annotation(annotations::OBSERVED) == Some(self.target.token.as_str()) {
            return Ok(None);
        }
        Ok(Some(wf))
    }

    /// Notes the version and labels of the workflow as read.
    fn observed(&mut self, wf: &Workflow) {
        self.resource_version = wf.metadata.resource_version.clone();
        self.stale = false;
        self.was_completed = wf.label(labels::COMPLETED) == Some("true");
    }

    /// Says the request waits for room under the bound (a write of the
    /// status annotation alone).
    async fn waiting(&mut self, message: &str) -> Result<(), RetryError> {
        self.status.phase = RetryPhase::Pending;
        self.status.message = message.to_owned();
        self.patch_status(false, false).await.map_err(api(format!(
            "writing the status of the retry of workflow {}/{}",
            self.target.namespace, self.target.name
        )))
    }

    /// Hands progress to the WorkflowRetry following this request, if one
    /// does (see [`crate::retry::progress`]).
    fn publish(&self, count: &Count) -> bool {
        let seen = Seen {
            total: count.total as u64,
            deleted: count.shown() as u64,
        };
        self.ctx.progress.publish(&self.target.token, seen)
    }

    /// Takes the deletion's count into the status.
    fn counted(&mut self, count: &Count) {
        self.status.pods_total = count.total as u64;
        self.status.pods_deleted = count.deleted as u64;
        if let Some(note) = &count.note {
            self.status.message.clone_from(note);
        }
    }

    /// Writes the reset workflow, the observed token and the final status in
    /// one update that fails if the workflow changed since it was read.
    async fn commit(&mut self, plan: Plan) -> Result<(), RetryError> {
        self.status.phase = RetryPhase::Committing;
        let mut reset = plan.workflow;
        if let Some(db) = self.ctx.offloading() {
            self.ctx.dehydrate(db, &mut reset).await?;
        }
        reset.metadata.resource_version = self.resource_version.clone();
        // The final status goes with the reset; until it is written, the
        // request is Committing (what a progress write after a conflict says).
        let done = RetryStatus {
            phase: RetryPhase::Succeeded,
            finished_at: Some(request::now()),
            message: format!(
                "deleted {} pods; the workflow was reset",
                self.status.pods_total
            ),
            ..self.status.clone()
        };
        let annotations = reset
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(annotations::OBSERVED.into(), self.target.token.clone());
        annotations.insert(
            annotations::STATUS.into(),
            serde_json::to_string(&done).expect("status serializes"),
        );
        let what = || {
            format!(
                "writing the reset workflow {}/{}",
                self.target.namespace, self.target.name
            )
        };
        self.reset_at = match self
            .workflows()
            .replace(&self.target.name, &PostParams::default(), &reset)
            .await
        {
            Ok(written) => written.metadata.resource_version,
            // The answer may be lost with the reset done (a broken connection, an API server
            // restart): what landed says which (rule 7).
            Err(e) if fault::is_transient(&e) => match self.reset_landed().await {
                Some(version) => {
                    warn!(workflow = self.target.name, namespace = self.target.namespace, token = self.target.token, error = %e, "the reset's answer was lost; the workflow shows it landed");
                    Some(version)
                }
                None => return Err(api(what())(e)),
            },
            Err(e) => return Err(api(what())(e)),
        };
        self.status = done;
        self.written = Some((self.status.clone(), Instant::now()));
        Ok(())
    }

    /// Writes a passing fault's Pending note ("rewind will try again") only
    /// where the workflow still asks this request and carries no answer to
    /// it: a write whose answer was lost (the reset, the end) may have landed,
    /// and the note must not write over it, or the next attempt, finding the
    /// request answered, leaves it Pending for good (rule 7). Guarded by the
    /// version read, so nothing that lands between the read and the note is
    /// written over.
    async fn note_unanswered(&mut self) -> Result<(), kube::Error> {
        let Some(meta) = self.answer_on_server().await else {
            return Ok(());
        };
        let on_workflow = meta.metadata.annotations.clone().unwrap_or_default();
        let token = Some(self.target.token.as_str());
        let answered = on_workflow.get(annotations::OBSERVED).map(|t| t.trim()) == token;
        if answered || request::token(&on_workflow).as_deref() != token {
            return Ok(());
        }
        self.resource_version = meta.metadata.resource_version;
        match self.patch_status(false, true).await {
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
            result => result,
        }
    }

    /// The workflow's version if it carries this request's reset: answered by
    /// this token with its Succeeded status, which only the reset writes.
    /// `None` if it does not, or if the API server cannot say (a few reads,
    /// about two seconds).
    async fn reset_landed(&self) -> Option<String> {
        let meta = self.answer_on_server().await?;
        let annotations = meta.metadata.annotations.unwrap_or_default();
        let answered = annotations.get(annotations::OBSERVED).map(|t| t.trim())
            == Some(self.target.token.as_str());
        let succeeded = matches!(
            request::status_of(&annotations, &self.target.token),
            Ok(Some(s)) if s.phase == RetryPhase::Succeeded
        );
        (answered && succeeded)
            .then_some(meta.metadata.resource_version)
            .flatten()
    }

    /// The workflow's metadata as the API server has it now, read again on a
    /// passing fault (a few times, about two seconds); `None` if it is gone or
    /// could not be read.
    async fn answer_on_server(&self) -> Option<PartialObjectMeta<Workflow>> {
        let mut wait = ANSWER_READ_BACKOFF;
        for attempt in 1..=ANSWER_READ_ATTEMPTS {
            match self.workflows().get_metadata_opt(&self.target.name).await {
                Ok(meta) => return meta,
                Err(e) if fault::is_transient(&e) && attempt < ANSWER_READ_ATTEMPTS => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => {
                    warn!(workflow = self.target.name, namespace = self.target.namespace, error = %fault::explain(&e), "reading back what landed failed");
                    return None;
                }
            }
        }
        None
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
        let what = || {
            format!(
                "writing the progress of the retry of workflow {}/{}",
                self.target.namespace, self.target.name
            )
        };
        if !self.stale {
            match self.patch_status(false, true).await {
                Err(e) if api_code(&e) == Some(409) => self.stale = true,
                result => return result.map_err(api(what())),
            }
        }
        self.patch_status(false, false).await.map_err(api(what()))
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

    /// Stops the deletions (once per status interval at most, from workflow
    /// metadata) if the workflow is gone or runs again: Argo's controller
    /// would then own its pods, and deleting more of them would harm the run.
    async fn check_still_completed(&mut self) -> Result<(), RetryError> {
        if self.last_check.elapsed() < self.ctx.config.status_interval {
            return Ok(());
        }
        self.last_check = Instant::now();
        // From the controller's own watch cache: no request at all, however many retries
        // run (the watch is milliseconds behind; the commit's precondition is exact).
        let ours = |m: &PartialObjectMeta<Workflow>| {
            m.metadata.uid.as_deref() == Some(self.target.uid.as_str())
        };
        let cached = self
            .ctx
            .workflows
            .get(&self.target.namespace, &self.target.name)
            .filter(|m| ours(m));
        let meta = match cached {
            Some(meta) => meta,
            // Only the API server's own copy says the workflow is gone: a cache
            // behind the watch, or not filled yet, would end the request without
            // a word, and nothing would serve its token again.
            None => match self
                .workflows()
                .get_metadata_opt(&self.target.name)
                .await
                .map_err(api(format!(
                    "reading workflow {}/{}",
                    self.target.namespace, self.target.name
                )))? {
                Some(meta) if ours(&meta) => Arc::new(meta),
                _ => return Err(RetryError::WorkflowGone),
            },
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
}

impl Sink for WorkflowStatus<'_> {
    type Error = RetryError;

    /// The phase changes in memory only: each write rewrites the whole
    /// workflow, so progress waits for [`WorkflowStatus::report_progress`].
    async fn deleting(&mut self, count: &Count) -> Result<(), RetryError> {
        self.status.phase = RetryPhase::DeletingPods;
        self.counted(count);
        self.publish(count);
        Ok(())
    }

    async fn tick(&mut self, count: &Count) -> Result<(), RetryError> {
        self.counted(count);
        // Checked first: the progress write may wait seconds for the budget
        // (a pause a 429 ordered), and a request that should stop must stop
        // before its throttled deletes are sent again.
        self.check_still_completed().await?;
        // A WorkflowRetry that asked for this request shows its progress;
        // the workflow is then written no more than the request needs, and
        // when there is something to tell (pods that will not go): the
        // WorkflowRetry copies its message from there.
        if !self.publish(count) || count.note.is_some() {
            self.report_progress().await?;
        }
        Ok(())
    }

    /// Only a WorkflowRetry following the request shows them; the
    /// annotation reports what lists and answers confirm.
    fn shows_removals(&self) -> bool {
        self.ctx.progress.is_followed(&self.target.token)
    }
}

impl Report for WorkflowStatus<'_> {
    async fn write_status(&mut self, phase: RetryPhase, message: &str) -> Result<(), kube::Error> {
        self.status.phase = phase;
        self.status.message = request::bounded(message);
        if phase.is_finished() {
            self.status.finished_at.get_or_insert_with(request::now);
        }
        // The reset wrote its own status.
        if self
            .written
            .as_ref()
            .is_some_and(|(w, _)| *w == self.status)
        {
            return Ok(());
        }
        if !phase.is_finished() {
            return self.note_unanswered().await;
        }
        match self.patch_status(true, false).await {
            // The workflow is gone: nothing left to write on.
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            result => result,
        }
    }

    fn events(&self) -> &Events {
        &self.events
    }
}

/// Reads of what landed, after a write's answer was lost, and the first wait
/// between two (doubling): about two seconds in all.
const ANSWER_READ_ATTEMPTS: u32 = 4;
const ANSWER_READ_BACKOFF: Duration = Duration::from_millis(250);

/// Whether progress `now`, of a request running for `running`, is worth a
/// write, given the status last `written` and how long ago: only once the
/// request has run an `interval`, at most once per `interval`, and only if it
/// says something the last write did not (a count, or a message such as the
/// pods that will not go).
fn progress_due(
    now: &RetryStatus,
    running: Duration,
    written: Option<(&RetryStatus, Duration)>,
    interval: Duration,
) -> bool {
    let news = |s: &RetryStatus| {
        (s.phase, s.pods_total, s.pods_deleted, &s.message)
            != (now.phase, now.pods_total, now.pods_deleted, &now.message)
    };
    running >= interval && written.is_none_or(|(last, ago)| ago >= interval && news(last))
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
        // A message alone is news: the count stands still while a pod that
        // will not go is named.
        let told = RetryStatus {
            message: "plan pod wf-1 (…) is still there".into(),
            ..deleting.clone()
        };
        assert!(progress_due(
            &told,
            s(30),
            Some((&deleting, s(28))),
            interval
        ));
        assert!(!progress_due(&told, s(32), Some((&told, s(2))), interval));
    }
}
