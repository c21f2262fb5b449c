//! Serving one `WorkflowRetry`: its status subresource and Events report the
//! request, from Pending to Succeeded or Failed; a finished one is deleted
//! after `spec.ttlSecondsAfterFinished`.
//!
//! A live target (`workflowName`) goes through the annotation contract: the
//! request is written to the workflow as `rewind.dev/retry` with a token
//! naming this object's UID, so it takes the same path (queue, budget,
//! delete rules, exactly-once commit) as a user's annotation, and its
//! progress in `rewind.dev/retry-status` is copied here.
//!
//! The ask is made once (rule 4): recorded in the status (`asked`) before it
//! is written, and written only on the version of the workflow it was
//! decided from (a user's request that came meanwhile is never overwritten:
//! the write fails, and the follower looks again). How the request ended is
//! told by its own token — its report on the workflow, or in process by the
//! task that served it — never by whichever request the workflow carries
//! last: a later request overwrites those annotations.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::argo::workflow::{Workflow, labels};
use crate::engine::budget::{Priority, with_priority};
use crate::engine::fault::{self, api_code};
use crate::protocol::crd::{
    AskedBy, AskedRequest, RetryTarget, WorkflowRetry, WorkflowRetryStatus,
};
use crate::protocol::request::{self, RetryPhase, annotations, workflowretry_token};
use crate::retry::Context;
use crate::retry::archived::{self, ArchivedError};
use crate::retry::object::ObjectStatus;
use crate::retry::progress::{End, Settled};
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
    #[error(
        "request {by} (someone else's) replaced this WorkflowRetry's request on workflow {name} before rewind served it, so this one retried nothing; {by}'s progress is in the workflow's rewind.dev/retry-status annotation; once it ended, create a new WorkflowRetry if the workflow still needs a retry"
    )]
    Replaced { name: String, by: String },
    #[error(
        "this WorkflowRetry's request is no longer on workflow {name}, which now carries {now}, and rewind cannot tell whether it reset the workflow first (the controller restarted, or another replica led, meanwhile); it never asks twice, as the workflow would be retried twice: check the workflow (`kubectl get workflow {name}`), and create a new WorkflowRetry if it still needs a retry"
    )]
    Overwritten { name: String, now: String },
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

/// How serving a WorkflowRetry went, for its dispatcher.
#[derive(Debug)]
pub enum Served {
    /// Its end is written in its status: done, with no read to confirm it.
    Ended,
    /// It stays pending (a passing fault, shutdown), or its end is not known
    /// here: read it again, and serve it again if unfinished.
    Reported,
    /// It ended, but its status could not say so: write this status, and
    /// never serve the request again (an archived retry would create its
    /// workflow twice).
    Unrecorded(Box<WorkflowRetryStatus>),
}

/// The first Event's note: who asked, when rewind's Argo API recorded it
/// (the API server's audit log names only rewind as the object's creator).
fn started_note(object: &WorkflowRetry) -> String {
    match AskedBy::of(object) {
        Some(asker) => format!("rewind started the retry asked by {asker} through Argo's API"),
        None => "rewind started the retry".into(),
    }
}

/// How soon a request must fail to count as refused at once: no Event, only its status.
const QUICK_REFUSAL: Duration = Duration::from_secs(1);

/// Serves `object` to its end, or until `stop` (it stays pending). The end
/// is reported here.
pub async fn serve(ctx: &Context, object: &WorkflowRetry, stop: &CancellationToken) -> Served {
    let mut status = ObjectStatus::new(ctx, object);
    let started = tokio::time::Instant::now();
    let first = object.status.as_ref().and_then(|s| s.phase).is_none();
    // A live target's first status is written with the record of its ask,
    // right before the ask: one write per object, not two.
    if first
        && !matches!(object.spec.target(), Some(RetryTarget::Live { .. }))
        && let Err(e) = status.write().await
    {
        warn!(workflowretry = status.name(), error = %e, "could not write the WorkflowRetry's first status; it will be tried again");
        return Served::Reported;
    }
    // The first Event is written beside the work, not before it: the retry need not wait for
    // it (tens of milliseconds on a busy API server). A request refused at once (its workflow
    // missing, a bad spec) ends with its status alone: under a burst of such requests every
    // write counts (docs/operating.md, "Many tenants").
    let announced = first.then(|| report::Report::events(&status).started(started_note(object)));
    let result = {
        let mut work = pin!(async {
            match object.spec.target() {
                None => Err(ServeError::NoTarget),
                Some(RetryTarget::Live { name }) => serve_live(&mut status, &name, stop).await,
                Some(RetryTarget::Archived { uid }) => archived::run(&mut status, &uid, stop)
                    .await
                    .map_err(ServeError::from),
            }
        });
        match announced {
            None => work.await,
            Some(announced) => {
                tokio::select! {
                    result = work.as_mut() => {
                        if result.as_ref().is_ok() || result.as_ref().is_err_and(|e| e.is_transient()) {
                            announced.await;
                        }
                        result
                    }
                    () = tokio::time::sleep(QUICK_REFUSAL) => tokio::join!(announced, work).1,
                }
            }
        }
    };
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
    // A request that failed, most often refused at once (its workflow missing, a bad spec),
    // is answered after every retry's work: a namespace's burst of refusals costs its own
    // turns at that priority, and never a retry's.
    let priority = match (&ending, &result) {
        (Ending::Failed(_), Err(_)) => Priority::Answer,
        _ => Priority::Retry,
    };
    // Refused at once, it ends with one write: its status, which says all an Event would.
    let refused = priority == Priority::Answer && started.elapsed() < QUICK_REFUSAL;
    with_priority(priority, end(&mut status, &ending, !refused)).await
}

/// Reports `ending`, with an Event if `announce`; the status to write still if it ended
/// unrecorded.
async fn end(status: &mut ObjectStatus<'_>, ending: &Ending, announce: bool) -> Served {
    let recorded = match announce {
        true => report::end(status, ending).await,
        false => report::end_unannounced(status, ending).await,
    };
    match ending.status() {
        Some((phase, _)) if phase.is_finished() => match recorded {
            Ok(()) => Served::Ended,
            Err(_) => Served::Unrecorded(Box::new(status.status.clone())),
        },
        _ => Served::Reported,
    }
}

/// Writes the end of `object` that serving it could not record.
pub async fn record_end(
    ctx: &Context,
    object: &WorkflowRetry,
    end: WorkflowRetryStatus,
) -> Result<(), kube::Error> {
    let mut status = ObjectStatus::new(ctx, object);
    status.status = end;
    status.write().await
}

/// Ends the request of `object` Failed after serving it panicked.
pub async fn answer_panic(ctx: &Context, object: &WorkflowRetry, panic: &str) -> Served {
    let ending = Ending::Failed(format!(
        "rewind failed on this request (it panicked: {panic}); this is a bug: report it with the controller's log, then create a new WorkflowRetry"
    ));
    ctx.metrics
        .observe_retry(ending.metric_label(), Duration::ZERO);
    end(&mut ObjectStatus::new(ctx, object), &ending, true).await
}

/// How long a live target's follower waits for word of a change before it
/// looks at the cache anyway (a safety net: the watch tells of every change).
const FOLLOW_RECHECK: Duration = Duration::from_secs(60);

/// What a WorkflowRetry says while another request on its workflow goes first.
const WAITING: &str = "waiting for the workflow's current retry request to finish";

/// Where a WorkflowRetry's ask of its live workflow stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ask {
    /// Not asked, or known not to have landed.
    No,
    /// Asked on the workflow at this resourceVersion, and landed.
    Landed(String),
    /// Asked on the workflow at this resourceVersion by an earlier attempt
    /// (before a restart or a fault): it may or may not have landed.
    Unsure(String),
}

impl Ask {
    /// The ask as the status records it, for the request `token`.
    fn recorded(status: &WorkflowRetryStatus, token: &str) -> Ask {
        match &status.asked {
            Some(asked) if asked.token == token => Ask::Unsure(asked.resource_version.clone()),
            _ => Ask::No,
        }
    }

    /// The ask, now known to have landed.
    fn landed(self) -> Ask {
        match self {
            Ask::Unsure(at) => Ask::Landed(at),
            other => other,
        }
    }
}

/// What the follower does next, from a view of the workflow.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Its request is pending, or the view predates its own ask: wait.
    Wait,
    /// The workflow answered its request; a later one overwrote the report.
    Answered,
    /// Wait for the workflow's current request to end first: one request
    /// per workflow at a time.
    Queue,
    /// Ask, on the workflow at this resourceVersion.
    Ask(String),
    /// It asked, and its request is no longer on the workflow, which now
    /// carries this request (if any).
    Gone(Option<String>),
}

/// What the follower of request `token`, whose ask stands at `ask`, does on
/// seeing a workflow at `version` with annotations `on_workflow`.
fn next(ask: &Ask, on_workflow: &BTreeMap<String, String>, version: &str, token: &str) -> Next {
    let is_ours = |key: &str| on_workflow.get(key).map(|t| t.trim()) == Some(token);
    if is_ours(annotations::OBSERVED) {
        return Next::Answered;
    }
    if is_ours(annotations::RETRY) {
        return Next::Wait;
    }
    match ask {
        Ask::No => match request::pending(on_workflow) {
            // A user's request is served first, then this one.
            Some(_) => Next::Queue,
            None => Next::Ask(version.to_owned()),
        },
        // The view is older than the ask, which landed.
        Ask::Landed(at) if at == version => Next::Wait,
        // The workflow is still where the earlier ask was written on: that
        // ask did not land. Asked again on the same version, at most one of
        // the two lands.
        Ask::Unsure(at) if at == version => Next::Ask(at.clone()),
        Ask::Landed(_) | Ask::Unsure(_) => Next::Gone(request::token(on_workflow)),
    }
}

/// Whether `on_workflow` names request `token` (asked, reported or answered).
fn mentions(on_workflow: &BTreeMap<String, String>, token: &str) -> bool {
    let is_ours = |key: &str| on_workflow.get(key).map(|t| t.trim()) == Some(token);
    is_ours(annotations::RETRY)
        || is_ours(annotations::OBSERVED)
        || matches!(request::status_of(on_workflow, token), Ok(Some(_)))
}

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
    let mut ask = Ask::recorded(&status.status, &token);
    status.status.workflow_name = Some(name.to_owned());
    let written = |status: &ObjectStatus<'_>| {
        format!(
            "writing the status of WorkflowRetry {namespace}/{}",
            status.name()
        )
    };
    loop {
        let changed = following.notified();
        // Its end, handed over by the task that served it here, is the word
        // even once later requests overwrote its report on the workflow.
        match progress.end() {
            Some(End::Answered(report)) => {
                status.mirror(&report);
                return Ok(());
            }
            Some(End::Replaced) => {
                return Err(ServeError::Replaced {
                    name: name.to_owned(),
                    by: current_request(status, name),
                });
            }
            None => {}
        }
        let meta = match ctx.workflows.get(&namespace, name) {
            Some(meta) => meta,
            // Not cached: not changed since this request began to follow it
            // (the cache keeps a workflow nobody asked for only once
            // followed), out of this controller's scope, or not there; one
            // read tells which. Read at answer priority: most such reads
            // under load are of workflows that do not exist (a stale name
            // in a script), and retries already under way, which a person
            // waits for, go first.
            None => match with_priority(Priority::Answer, workflows.get_metadata_opt(name))
                .await
                .map_err(api(format!("reading workflow {namespace}/{name}")))?
            {
                Some(meta) if in_scope(&meta, ctx) => Arc::new(meta),
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
            },
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
        if mentions(on_workflow, &token) {
            ask = ask.landed();
        }
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
        let version = meta.resource_version().unwrap_or_default();
        match next(&ask, on_workflow, &version, &token) {
            Next::Wait => {}
            Next::Answered => {
                // Committed, and a later request overwrote the progress report.
                status.status.phase = Some(RetryPhase::Succeeded);
                return Ok(());
            }
            Next::Queue => {
                // The same words whichever request it is: a thousand waiting
                // WorkflowRetries rewrite nothing as requests take turns.
                status.status.message = WAITING.into();
            }
            Next::Ask(at) => {
                // Recorded first: a restart after the ask knows it may have landed.
                status.status.asked = Some(AskedRequest {
                    token: token.clone(),
                    resource_version: at.clone(),
                });
                status.status.message.clear();
                status.write().await.map_err(api(written(status)))?;
                let mut patch = request::patch(&token, &options);
                // A merge patch naming a resourceVersion fails (409) on any
                // other: a request written meanwhile is never overwritten.
                patch["metadata"]["resourceVersion"] = at.clone().into();
                let asked = workflows
                    .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                match asked {
                    Ok(_) => ask = Ask::Landed(at),
                    // The workflow changed since the view: look again at a
                    // newer one. Unless an earlier ask on that version may
                    // have landed, this one certainly did not.
                    Err(e) if api_code(&e) == Some(409) => {
                        if ask == Ask::No {
                            status.status.asked = None;
                        }
                        // Most often another request got there first.
                        status.status.message = WAITING.into();
                    }
                    Err(e) => {
                        return Err(api(format!(
                            "asking for a retry of workflow {namespace}/{name}"
                        ))(e));
                    }
                }
            }
            Next::Gone(now) => match progress.settled() {
                // Served here now: its end will be heard.
                Settled::Serving => {}
                // Its end was handed over: taken at the top of the loop.
                Settled::Ended(_) => continue,
                Settled::Unheard => {
                    // Decided on the API server's own copy: the cache may be
                    // behind a request it has not shown yet.
                    let fresh = workflows
                        .get_metadata_opt(name)
                        .await
                        .map_err(api(format!("reading workflow {namespace}/{name}")))?;
                    let gone = fresh.as_ref().is_some_and(|f| {
                        let version = f.resource_version().unwrap_or_default();
                        matches!(next(&ask, f.annotations(), &version, &token), Next::Gone(_))
                    });
                    if gone {
                        let now = now.unwrap_or_default();
                        return Err(match ask {
                            Ask::Landed(_) => ServeError::Replaced {
                                name: name.to_owned(),
                                by: now,
                            },
                            _ => ServeError::Overwritten {
                                name: name.to_owned(),
                                now: match now.is_empty() {
                                    true => "no request".into(),
                                    false => format!("request {now}"),
                                },
                            },
                        });
                    }
                }
            },
        }
        status.write().await.map_err(api(written(status)))?;
        let heard = async {
            tokio::select! {
                _ = changed => {}
                _ = progress.changed() => {}
            }
        };
        wait(heard, stop).await?;
    }
}

/// The request workflow `name` carries now, as cached.
fn current_request(status: &ObjectStatus<'_>, name: &str) -> String {
    status
        .ctx
        .workflows
        .get(&status.namespace(), name)
        .and_then(|meta| request::token(meta.annotations()))
        .unwrap_or_else(|| "(unknown)".into())
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

    use crate::protocol::annotations_of as on;

    #[test]
    fn a_follower_asks_once_on_the_version_it_saw_and_never_again() {
        use annotations::{OBSERVED, RETRY};
        let t = "workflowretry-u";
        let landed = Ask::Landed("5".into());
        let unsure = Ask::Unsure("5".into());
        // Never asked, nothing pending: ask on the version seen.
        assert_eq!(next(&Ask::No, &on(&[]), "5", t), Next::Ask("5".into()));
        let answered = on(&[(RETRY, "u0"), (OBSERVED, "u0")]);
        assert_eq!(next(&Ask::No, &answered, "6", t), Next::Ask("6".into()));
        // A user's request pending: it goes first.
        assert_eq!(next(&Ask::No, &on(&[(RETRY, "u1")]), "5", t), Next::Queue);
        // Its own request pending, or answered.
        assert_eq!(next(&landed, &on(&[(RETRY, t)]), "6", t), Next::Wait);
        let overwritten = on(&[(RETRY, "u1"), (OBSERVED, t)]);
        assert_eq!(next(&landed, &overwritten, "9", t), Next::Answered);
        // A view older than its landed ask: wait for a newer one.
        assert_eq!(next(&landed, &answered, "5", t), Next::Wait);
        // Asked and landed, then replaced: gone; never asked again.
        let replaced = on(&[(RETRY, "u1")]);
        assert_eq!(
            next(&landed, &replaced, "7", t),
            Next::Gone(Some("u1".into()))
        );
        // Asked by an earlier attempt: the workflow still at that version did
        // not get it (asked again on that version); past it, maybe it did.
        assert_eq!(next(&unsure, &answered, "5", t), Next::Ask("5".into()));
        assert_eq!(
            next(&unsure, &on(&[(RETRY, "u1"), (OBSERVED, "u1")]), "8", t),
            Next::Gone(Some("u1".into()))
        );
        assert_eq!(next(&unsure, &on(&[]), "8", t), Next::Gone(None));
        // Seeing its own token settles an earlier ask as landed.
        assert_eq!(unsure.landed(), landed);
        assert!(mentions(&on(&[(RETRY, t)]), t) && !mentions(&replaced, t));
    }

    #[test]
    fn only_its_own_recorded_ask_counts() {
        let mut status = WorkflowRetryStatus::default();
        assert_eq!(Ask::recorded(&status, "t"), Ask::No);
        status.asked = Some(AskedRequest {
            token: "t".into(),
            resource_version: "5".into(),
        });
        assert_eq!(Ask::recorded(&status, "t"), Ask::Unsure("5".into()));
        assert_eq!(Ask::recorded(&status, "other"), Ask::No);
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
