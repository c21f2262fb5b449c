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

use futures::future::OptionFuture;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::argo::workflow::{Workflow, labels};
use crate::engine::fault;
use crate::protocol::crd::{RetryTarget, WorkflowRetry};
use crate::protocol::request::{self, RetryPhase, annotations, workflowretry_token};
use crate::retry::Context;
use crate::retry::archived::{self, ArchivedError};
use crate::retry::object::ObjectStatus;
use crate::retry::report::{self, Ending};

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
    #[error(transparent)]
    Archived(#[from] ArchivedError),
    #[error("the controller is shutting down; the request stays pending and resumes on restart")]
    Stopped,
    #[error("{what} failed: {}", fault::explain(.source))]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl ServeError {
    /// Whether a later attempt may succeed: the request stays pending.
    pub fn is_transient(&self) -> bool {
        match self {
            ServeError::Api { source, .. } => fault::is_transient(source),
            ServeError::Archived(e) => e.is_transient(),
            ServeError::Stopped => true,
            _ => false,
        }
    }
}

/// `ServeError::Api` for `what`, as a `map_err` argument.
fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Api { what, source }
}

/// Serves `object` to its end, or until `stop` (it stays pending). The end
/// is reported here; transient errors are also returned, for the caller to
/// try again later.
pub async fn serve(
    ctx: &Context,
    object: &WorkflowRetry,
    stop: &CancellationToken,
) -> Result<(), ServeError> {
    let mut status = ObjectStatus::new(ctx, object);
    let started = tokio::time::Instant::now();
    let first = object.status.as_ref().and_then(|s| s.phase).is_none();
    // A live target's first status is written once its request is asked, a few
    // milliseconds later: one write per object, not two.
    if first && !matches!(object.spec.target(), Some(RetryTarget::Live { .. })) {
        let what = format!(
            "writing the status of WorkflowRetry {}/{}",
            status.namespace(),
            status.name()
        );
        status.write().await.map_err(api(what))?;
    }
    // The first Event is written beside the work, not before it: the retry
    // need not wait for it (tens of milliseconds on a busy API server).
    let announced: OptionFuture<_> = first
        .then(|| report::Report::events(&status).started("rewind started the retry".into()))
        .into();
    let work = async {
        match object.spec.target() {
            None => Err(ServeError::NoTarget),
            Some(RetryTarget::Live { name }) => serve_live(&mut status, &name, stop).await,
            Some(RetryTarget::Archived { uid }) => archived::run(&mut status, &uid, stop)
                .await
                .map_err(ServeError::from),
        }
    };
    let (_, result) = tokio::join!(announced, work);
    let ending = match &result {
        Ok(()) => {
            let message = status.status.message.clone();
            info!(workflowretry = status.name(), %message, "WorkflowRetry finished");
            // A live target's request may have failed: its status says so.
            match status.status.phase {
                Some(RetryPhase::Failed) => Ending::Failed(message),
                _ => Ending::Succeeded(message),
            }
        }
        Err(
            ServeError::Stopped
            | ServeError::Archived(ArchivedError::Delete(crate::engine::drive::DeleteError::Stopped)),
        ) => Ending::Interrupted,
        Err(e) if e.is_transient() => {
            warn!(workflowretry = status.name(), error = %e, "WorkflowRetry interrupted; it will be tried again");
            Ending::retrying(e)
        }
        Err(e) => {
            warn!(workflowretry = status.name(), error = %e, "WorkflowRetry failed");
            Ending::Failed(e.to_string())
        }
    };
    ctx.metrics
        .observe_retry(ending.metric_label(), started.elapsed());
    report::end(&mut status, &ending).await;
    result
}

/// Ends the request of `object` Failed after serving it panicked.
pub async fn answer_panic(ctx: &Context, object: &WorkflowRetry, panic: &str) {
    let ending = Ending::Failed(format!(
        "rewind failed on this request (it panicked: {panic}); this is a bug: report it with the controller's log, then create a new WorkflowRetry"
    ));
    ctx.metrics
        .observe_retry(ending.metric_label(), Duration::ZERO);
    report::end(&mut ObjectStatus::new(ctx, object), &ending).await;
}

/// How long a live target's follower waits for word of a change before it
/// looks at the cache anyway (a safety net: the watch tells of every change).
const FOLLOW_RECHECK: Duration = Duration::from_secs(60);

/// Asks for the retry of live workflow `name` through its annotations and
/// follows it until it ends, from the controller's cache of workflow
/// metadata: waiting costs no API request.
async fn serve_live(
    status: &mut ObjectStatus<'_>,
    name: &str,
    stop: &CancellationToken,
) -> Result<(), ServeError> {
    let ctx = status.ctx;
    let namespace = status.namespace();
    let workflows: Api<Workflow> = Api::namespaced(ctx.client(), &namespace);
    let token = workflowretry_token(&status.uid());
    let options = status.object.spec.options();
    let following = ctx.workflows.follow(&namespace, name);
    let mut progress = ctx.progress.follow(&token);
    status.status.workflow_name = Some(name.to_owned());
    loop {
        let changed = following.notified();
        let Some(meta) = ctx.workflows.get(&namespace, name) else {
            // Not cached: out of this controller's scope, not there, or
            // created a moment ago; one read tells which.
            let found = workflows
                .get_metadata_opt(name)
                .await
                .map_err(api(format!("reading workflow {namespace}/{name}")))?;
            match found {
                Some(meta) if in_scope(&meta, ctx) => wait(changed, stop).await?,
                Some(meta) => {
                    return Err(ServeError::OutOfScope {
                        name: name.to_owned(),
                        found: meta.labels().get(labels::CONTROLLER_INSTANCE_ID).cloned(),
                        serves: ctx.scope.instance_id.clone(),
                    });
                }
                None if status.status.workflow_uid.is_some() => {
                    return Err(ServeError::WorkflowReplaced {
                        name: name.to_owned(),
                    });
                }
                None => {
                    return Err(ServeError::WorkflowNotFound {
                        namespace,
                        name: name.to_owned(),
                    });
                }
            }
            continue;
        };
        let uid = meta.uid().unwrap_or_default();
        match &status.status.workflow_uid {
            Some(known) if *known != uid => {
                return Err(ServeError::WorkflowReplaced {
                    name: name.to_owned(),
                });
            }
            Some(_) => {}
            None => status.status.workflow_uid = Some(uid),
        }
        let on_workflow = meta.annotations();
        if let Ok(Some(reported)) = request::status_of(on_workflow, &token) {
            status.mirror(&reported);
            if reported.phase.is_finished() {
                return Ok(());
            }
        }
        // Progress the request handed over live (its report on the workflow
        // waits for the end), never behind what the workflow says.
        if let Some(seen) = progress.latest()
            && status.status.phase != Some(RetryPhase::Committing)
        {
            status.status.phase = Some(RetryPhase::DeletingPods);
            status.status.pods_total = seen.total;
            status.status.pods_deleted = status.status.pods_deleted.max(seen.deleted);
        }
        let is_ours = |key: &str| on_workflow.get(key).map(|t| t.trim()) == Some(token.as_str());
        if is_ours(annotations::OBSERVED) {
            // Committed, and a later request overwrote the progress report.
            status.status.phase = Some(RetryPhase::Succeeded);
            return Ok(());
        }
        if !is_ours(annotations::RETRY) {
            if request::pending(on_workflow).is_some() {
                // One request per workflow at a time: a user's annotation
                // request is served first, then this one.
                status.status.message =
                    "waiting for the workflow's current retry request to finish".into();
            } else {
                let patch = request::patch(&token, &options);
                workflows
                    .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(api(format!(
                        "asking for a retry of workflow {namespace}/{name}"
                    )))?;
                status.status.message.clear();
            }
        }
        let what = format!(
            "writing the status of WorkflowRetry {namespace}/{}",
            status.name()
        );
        status.write().await.map_err(api(what))?;
        let heard = async {
            tokio::select! {
                _ = changed => {}
                _ = progress.changed() => {}
            }
        };
        wait(heard, stop).await?;
    }
}

/// Whether this controller serves `meta` (its instance ID label).
fn in_scope(meta: &kube::api::PartialObjectMeta<Workflow>, ctx: &Context) -> bool {
    meta.labels().get(labels::CONTROLLER_INSTANCE_ID) == ctx.scope.instance_id.as_ref()
}

/// Waits for `changed`, at most [`FOLLOW_RECHECK`]; an error at `stop`.
async fn wait(
    changed: impl std::future::Future<Output = ()>,
    stop: &CancellationToken,
) -> Result<(), ServeError> {
    tokio::select! {
        _ = stop.cancelled() => Err(ServeError::Stopped),
        _ = changed => Ok(()),
        _ = tokio::time::sleep(FOLLOW_RECHECK) => Ok(()),
    }
}

/// When a finished WorkflowRetry is due for deletion, if it has a TTL. A TTL
/// past what a timestamp can hold never expires.
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
    finished
        .checked_add(SignedDuration::from_secs(ttl.max(0)))
        .ok()
}

/// Deletes `object` once its TTL after finishing has passed (only that
/// object: the delete carries its UID as a precondition).
pub async fn delete_when_expired(client: kube::Client, object: &WorkflowRetry) {
    let Some(at) = expires_at(object) else {
        return;
    };
    let wait = at.duration_since(Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(Duration::try_from(wait).unwrap_or(Duration::MAX)).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crd::{WorkflowRetrySpec, WorkflowRetryStatus};

    fn finished(ttl: i64) -> WorkflowRetry {
        let mut object = WorkflowRetry::new(
            "r",
            WorkflowRetrySpec {
                workflow_name: Some("wf".into()),
                ttl_seconds_after_finished: Some(ttl),
                ..Default::default()
            },
        );
        object.status = Some(WorkflowRetryStatus {
            phase: Some(RetryPhase::Failed),
            finished_at: Some("2026-12-03T00:00:00Z".into()),
            ..Default::default()
        });
        object
    }

    #[test]
    fn a_ttl_past_what_a_timestamp_holds_never_expires_and_never_panics() {
        // The API server refuses such values now; objects stored before it did may carry them.
        for ttl in [300_000_000_000, i64::MAX] {
            assert_eq!(expires_at(&finished(ttl)), None, "{ttl}");
        }
        assert_eq!(
            expires_at(&finished(60)).map(|t| t.to_string()),
            Some("2026-12-03T00:01:00Z".into())
        );
        // A negative TTL (refused too) expires at once.
        assert_eq!(
            expires_at(&finished(-5)).map(|t| t.to_string()),
            Some("2026-12-03T00:00:00Z".into())
        );
    }
}
