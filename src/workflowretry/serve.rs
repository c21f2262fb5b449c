//! Serving one `WorkflowRetry`: its status subresource and Events report the
//! request, from Pending to Succeeded or Failed; a finished one is deleted
//! after `spec.ttlSecondsAfterFinished`.
//!
//! A live target (`workflowName`) goes through the annotation contract: the
//! request is written to the workflow as `rewind.dev/retry` with a token
//! naming this object's UID, so it takes the same path (queue, budget,
//! delete rules, exactly-once commit) as a user's annotation, and its
//! progress in `rewind.dev/retry-status` is copied here.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::{Condition, RetryTarget, WorkflowRetry, WorkflowRetryStatus};
use crate::request::{self, RetryPhase, RetryStatus, annotations};
use crate::retry;
use crate::watch::Scope;
use crate::workflow::{Workflow, labels};

/// Why a WorkflowRetry could not be served. The message goes to the user in
/// its status and an Event.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("set exactly one of spec.archivedWorkflowUID and spec.workflowName")]
    NoTarget,
    #[error(
        "workflow {name} not found in namespace {namespace}; to retry an archived workflow, set spec.archivedWorkflowUID instead"
    )]
    WorkflowNotFound { namespace: String, name: String },
    #[error(
        "workflow {name} is not served by this controller (its {label} label is {found:?}, this controller serves {serves:?})",
        label = labels::CONTROLLER_INSTANCE_ID
    )]
    OutOfScope {
        name: String,
        found: Option<String>,
        serves: Option<String>,
    },
    #[error(
        "workflow {name} was deleted or replaced (UID changed) before the retry finished; create a new WorkflowRetry"
    )]
    WorkflowReplaced { name: String },
    #[error("{0}")]
    Retry(String),
    #[error(transparent)]
    Archived(#[from] crate::archived::ArchivedError),
    #[error("Kubernetes API request failed: {0}")]
    Api(#[from] kube::Error),
}

impl ServeError {
    /// Errors a later attempt may not meet: the request stays pending.
    pub fn is_transient(&self) -> bool {
        match self {
            ServeError::Api(e) => crate::workers::is_transient(e),
            ServeError::Archived(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// The status subresource and Events of one WorkflowRetry.
pub(crate) struct Reporter<'a> {
    ctx: &'a retry::Context,
    api: Api<WorkflowRetry>,
    object: &'a WorkflowRetry,
    pub(crate) status: WorkflowRetryStatus,
    written: Option<WorkflowRetryStatus>,
}

impl<'a> Reporter<'a> {
    pub(crate) fn new(ctx: &'a retry::Context, object: &'a WorkflowRetry) -> Self {
        let namespace = object.namespace().unwrap_or_default();
        let written = object.status.clone();
        let mut status = written.clone().unwrap_or_default();
        status.phase.get_or_insert(RetryPhase::Pending);
        status.started_at.get_or_insert_with(now);
        status.observed_generation = object.metadata.generation;
        Reporter {
            ctx,
            api: Api::namespaced(ctx.client.clone(), &namespace),
            object,
            status,
            written,
        }
    }

    pub(crate) fn ctx(&self) -> &'a retry::Context {
        self.ctx
    }

    pub(crate) fn object(&self) -> &'a WorkflowRetry {
        self.object
    }

    pub(crate) fn namespace(&self) -> String {
        self.object.namespace().unwrap_or_default()
    }

    pub(crate) fn name(&self) -> String {
        self.object.name_any()
    }

    pub(crate) fn uid(&self) -> String {
        self.object.uid().unwrap_or_default()
    }

    /// Writes the status if it changed since the last write.
    pub(crate) async fn write(&mut self) -> Result<(), kube::Error> {
        if self.written.as_ref() == Some(&self.status) {
            return Ok(());
        }
        let patch = serde_json::json!({ "status": self.status });
        self.api
            .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Copies a live request's progress.
    fn mirror(&mut self, progress: &RetryStatus) {
        self.status.phase = Some(progress.phase);
        self.status.pods_total = progress.pods_total;
        self.status.pods_deleted = progress.pods_deleted;
        self.status.message = progress.message.clone();
        if progress.phase.is_finished() {
            self.status.finished_at = progress.finished_at.clone().or_else(|| Some(now()));
        }
    }

    /// Ends the request with `phase`, `message` and a Job-like condition.
    pub(crate) fn finish(&mut self, phase: RetryPhase, message: String) {
        let (type_, reason) = match phase {
            RetryPhase::Succeeded => ("Complete", "Retried"),
            _ => ("Failed", "RetryFailed"),
        };
        self.status.phase = Some(phase);
        self.status.message = message.clone();
        self.status.finished_at.get_or_insert_with(now);
        self.status.conditions = vec![Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.into(),
            message,
            last_transition_time: Some(now()),
        }];
    }

    pub(crate) async fn event(&self, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, 1024)),
            action: "Retry".into(),
            secondary: None,
        };
        let reference = self.object.object_ref(&());
        if let Err(e) = self.ctx.recorder.publish(&event, &reference).await {
            warn!(workflowretry = self.name(), error = %e, "could not publish event");
        }
    }
}

/// Serves `object` to its end. Transient errors are reported and returned
/// (the caller tries again later); others end the request as Failed.
pub(crate) async fn serve(
    ctx: &retry::Context,
    scope: &Scope,
    object: &WorkflowRetry,
) -> Result<(), ServeError> {
    let mut reporter = Reporter::new(ctx, object);
    let fresh = object.status.as_ref().and_then(|s| s.phase).is_none();
    if fresh {
        reporter.write().await?;
        reporter
            .event(
                EventType::Normal,
                "RetryStarted",
                "rewind started the retry".into(),
            )
            .await;
    }
    let result = match object.spec.target() {
        None => Err(ServeError::NoTarget),
        Some(RetryTarget::Live { name }) => serve_live(&mut reporter, scope, &name).await,
        Some(RetryTarget::Archived { uid }) => {
            crate::archived::run(&mut reporter, ctx.database.as_deref(), &uid)
                .await
                .map_err(ServeError::from)
        }
    };
    match &result {
        Ok(()) => {
            let message = reporter.status.message.clone();
            info!(workflowretry = reporter.name(), %message, "WorkflowRetry finished");
            if reporter.status.phase == Some(RetryPhase::Failed) {
                reporter.finish(RetryPhase::Failed, message.clone());
                reporter.write().await?;
                reporter
                    .event(EventType::Warning, "RetryFailed", message)
                    .await;
            } else {
                reporter.finish(RetryPhase::Succeeded, message.clone());
                reporter.write().await?;
                reporter.event(EventType::Normal, "Retried", message).await;
            }
        }
        Err(e) if e.is_transient() => {
            warn!(workflowretry = reporter.name(), error = %e, "WorkflowRetry interrupted; it will be tried again");
            reporter.status.phase = Some(RetryPhase::Pending);
            reporter.status.message = format!("{e}; rewind will try again");
            if let Err(e) = reporter.write().await {
                warn!(workflowretry = reporter.name(), error = %e, "could not record the error");
            }
            reporter
                .event(
                    EventType::Warning,
                    "RetryError",
                    reporter.status.message.clone(),
                )
                .await;
        }
        Err(e) => {
            warn!(workflowretry = reporter.name(), error = %e, "WorkflowRetry failed");
            reporter.finish(RetryPhase::Failed, e.to_string());
            reporter.write().await?;
            reporter
                .event(EventType::Warning, "RetryFailed", e.to_string())
                .await;
        }
    }
    result
}

/// Asks for the retry of live workflow `name` through its annotations and
/// follows it until it ends.
async fn serve_live(
    reporter: &mut Reporter<'_>,
    scope: &Scope,
    name: &str,
) -> Result<(), ServeError> {
    let namespace = reporter.object.namespace().unwrap_or_default();
    let workflows: Api<Workflow> = Api::namespaced(reporter.ctx.client.clone(), &namespace);
    let token = live_token(&reporter.uid());
    let options = reporter.object.spec.options();
    reporter.status.workflow_name = Some(name.to_owned());
    loop {
        let Some(meta) = workflows.get_metadata_opt(name).await? else {
            return Err(match reporter.status.workflow_uid {
                Some(_) => ServeError::WorkflowReplaced {
                    name: name.to_owned(),
                },
                None => ServeError::WorkflowNotFound {
                    namespace,
                    name: name.to_owned(),
                },
            });
        };
        let uid = meta.uid().unwrap_or_default();
        match &reporter.status.workflow_uid {
            Some(known) if *known != uid => {
                return Err(ServeError::WorkflowReplaced {
                    name: name.to_owned(),
                });
            }
            Some(_) => {}
            None => {
                let found = meta.labels().get(labels::CONTROLLER_INSTANCE_ID).cloned();
                if found != scope.instance_id {
                    return Err(ServeError::OutOfScope {
                        name: name.to_owned(),
                        found,
                        serves: scope.instance_id.clone(),
                    });
                }
                reporter.status.workflow_uid = Some(uid);
            }
        }
        let on_workflow = meta.annotations();
        if let Ok(Some(progress)) = request::status_of(on_workflow, &token) {
            reporter.mirror(&progress);
            if progress.phase.is_finished() {
                return Ok(());
            }
        }
        let is_ours = |key: &str| on_workflow.get(key).map(|t| t.trim()) == Some(token.as_str());
        if is_ours(annotations::OBSERVED) {
            // Committed, and a later request overwrote the progress report.
            reporter.status.phase = Some(RetryPhase::Succeeded);
            return Ok(());
        }
        if !is_ours(annotations::RETRY) {
            if request::pending(on_workflow).is_some() {
                // One request per workflow at a time: a user's annotation
                // request is served first, then this one.
                reporter.status.message =
                    "waiting for the workflow's current retry request to finish".into();
            } else {
                request_by_annotation(&workflows, name, &token, &options).await?;
                reporter.status.message.clear();
            }
        }
        reporter.write().await?;
        tokio::time::sleep(reporter.ctx.config.status_interval).await;
    }
}

/// Writes the request and its options to the workflow, as a user would.
async fn request_by_annotation(
    workflows: &Api<Workflow>,
    name: &str,
    token: &str,
    options: &request::RequestOptions,
) -> Result<(), kube::Error> {
    let selector = Some(options.node_field_selector.as_str()).filter(|s| !s.is_empty());
    let parameters = options
        .parameters
        .as_ref()
        .map(|p| serde_json::to_string(p).expect("strings serialize"));
    let patch = serde_json::json!({"metadata": {"annotations": {
        annotations::RETRY: token,
        annotations::RESTART_SUCCESSFUL: options.restart_successful.to_string(),
        annotations::NODE_FIELD_SELECTOR: selector,
        annotations::PARAMETERS: parameters,
    }}});
    workflows
        .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The `rewind.dev/retry` token of a WorkflowRetry's live request.
pub fn live_token(uid: &str) -> String {
    format!("workflowretry-{uid}")
}

/// When a finished WorkflowRetry is due for deletion, if it has a TTL.
pub fn expires_at(object: &WorkflowRetry) -> Option<Timestamp> {
    let ttl = object.spec.ttl_seconds_after_finished?;
    let finished: Timestamp = object
        .status
        .as_ref()
        .filter(|_| object.is_finished())?
        .finished_at
        .as_deref()?
        .parse()
        .ok()?;
    Some(finished + SignedDuration::from_secs(ttl.max(0)))
}

/// Deletes `object` once its TTL after finishing has passed (only that
/// object: the delete carries its UID as a precondition).
pub(crate) async fn delete_when_expired(client: kube::Client, object: &WorkflowRetry) {
    let Some(at) = expires_at(object) else {
        return;
    };
    let wait = at.duration_since(Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(Duration::try_from(wait).unwrap_or_default()).await;
    }
    let api: Api<WorkflowRetry> = Api::namespaced(client, &object.namespace().unwrap_or_default());
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: object.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&object.name_any(), &params).await {
        Ok(_) => info!(
            workflowretry = object.name_any(),
            "deleted after ttlSecondsAfterFinished"
        ),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => {
            warn!(workflowretry = object.name_any(), error = %e, "could not delete the finished WorkflowRetry; it is tried again at the next resync")
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

pub(crate) fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
