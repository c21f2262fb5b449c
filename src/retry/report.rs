//! How a request tells its user where it stands: its status (the workflow's
//! `rewind.dev/retry-status` annotation, or a WorkflowRetry's status) and
//! Events. Written once here for every flow: the same phases, Event reasons
//! and words whichever way the request was asked.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tracing::{debug, warn};

use crate::engine::budget::{Priority, with_priority};
use crate::engine::fault;
use crate::protocol::request::RetryPhase;
use crate::retry::Context;
use crate::retry::recorder::Recorder;
use crate::telemetry::metrics::Metrics;

/// Event reasons, as `kubectl describe` lists them.
pub mod reasons {
    pub const STARTED: &str = "RetryStarted";
    pub const SUCCEEDED: &str = "Retried";
    pub const FAILED: &str = "RetryFailed";
    /// A passing fault; the request is tried again.
    pub const ERROR: &str = "RetryError";
}

/// The longest Event note: the API server refuses notes over 1 kB.
const MAX_NOTE: usize = 1024;

/// How a request ended, as its user is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The workflow was reset or created; the message says what was done.
    Succeeded(String),
    /// It cannot be done as asked; the message says why and what to do.
    Failed(String),
    /// A fault that may pass (the API or the database unreachable, a
    /// throttled request): the request stays pending and is tried again.
    Retrying(String),
    /// Stopped before its end (the controller stopping, a newer request):
    /// nothing to tell.
    Interrupted,
    /// Answered before (by an earlier run, or someone else): nothing to tell.
    AlreadyAnswered,
    /// The object the request was asked on is gone or replaced: nothing to
    /// write on, and no one to tell.
    Gone,
}

impl Ending {
    /// A transient error's ending.
    pub fn retrying(error: &dyn std::fmt::Display) -> Self {
        Ending::Retrying(format!("{error}; rewind will try again"))
    }

    /// The `result` label of `rewind_retry_duration_seconds`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Ending::Succeeded(_) => "succeeded",
            Ending::Failed(_) => "failed",
            Ending::Retrying(_) => "transient_error",
            Ending::Interrupted => "interrupted",
            Ending::AlreadyAnswered => "already_observed",
            Ending::Gone => "failed",
        }
    }

    /// The status phase and message this ending writes, if any.
    pub fn status(&self) -> Option<(RetryPhase, &str)> {
        match self {
            Ending::Succeeded(m) => Some((RetryPhase::Succeeded, m)),
            Ending::Failed(m) => Some((RetryPhase::Failed, m)),
            Ending::Retrying(m) => Some((RetryPhase::Pending, m)),
            Ending::Interrupted | Ending::AlreadyAnswered | Ending::Gone => None,
        }
    }

    /// The Event this ending publishes, if any.
    fn event(&self) -> Option<(EventType, &'static str, &str)> {
        match self {
            Ending::Succeeded(m) => Some((EventType::Normal, reasons::SUCCEEDED, m)),
            Ending::Failed(m) => Some((EventType::Warning, reasons::FAILED, m)),
            Ending::Retrying(m) => Some((EventType::Warning, reasons::ERROR, m)),
            Ending::Interrupted | Ending::AlreadyAnswered | Ending::Gone => None,
        }
    }
}

/// Where a request reports.
pub trait Report: Send {
    /// Writes the request's status as `phase` with `message`; a finished
    /// phase also marks the request answered.
    fn write_status(
        &mut self,
        phase: RetryPhase,
        message: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// Where the request's Events go.
    fn events(&self) -> &Events;
}

/// Writes of a status tried on a passing fault, and the first wait between
/// two (doubling): about two seconds in all.
const STATUS_ATTEMPTS: u32 = 4;
const STATUS_BACKOFF: Duration = Duration::from_millis(250);

/// Writes the request's status as `phase` with `message`, again on a passing
/// fault (a few times, see [`STATUS_ATTEMPTS`]); the last error if it never
/// went through.
pub async fn record(
    report: &mut impl Report,
    phase: RetryPhase,
    message: &str,
) -> Result<(), kube::Error> {
    let mut wait = STATUS_BACKOFF;
    let mut attempt = 1;
    loop {
        match report.write_status(phase, message).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < STATUS_ATTEMPTS && fault::is_transient(&e) => {
                warn!(object = report.events().name(), attempt, error = %e, "could not record the retry's status; trying again");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
        attempt += 1;
    }
}

/// Tells the user how a request ended: its status (see [`record`]), then an
/// Event. A status that could not be written is logged and its error
/// returned: the caller keeps the end until it is written, rather than serve
/// the request again (an archived retry would create its workflow twice).
pub async fn end(report: &mut impl Report, ending: &Ending) -> Result<(), kube::Error> {
    let recorded = end_unannounced(report, ending).await;
    if let Some((type_, reason, note)) = ending.event() {
        report
            .events()
            .publish(type_, reason, note.to_owned())
            .await;
    }
    recorded
}

/// Tells the user how a request ended by its status alone, as [`end`] without the Event: for
/// a request refused at once, whose status says all the Event would (one write, not two,
/// under a burst of them).
pub async fn end_unannounced(report: &mut impl Report, ending: &Ending) -> Result<(), kube::Error> {
    let Some((phase, message)) = ending.status() else {
        return Ok(());
    };
    let recorded = record(report, phase, message).await;
    if let Err(e) = &recorded {
        warn!(object = report.events().name(), error = %e, "could not record how the retry ended");
    }
    recorded
}

/// How long a report (an Event, the note that a WorkflowRetry waits its turn) may wait for
/// the write budget before it is dropped: reports are best effort, and under load a queue of
/// them must not grow with the requests (each one's wait holds a task).
pub const REPORT_WAIT: Duration = Duration::from_secs(2);

/// Runs `write` as a report: at the budget's report priority, behind every retry's own
/// requests; `None` if it was not done within [`REPORT_WAIT`] (it is dropped).
pub async fn best_effort<F: Future>(write: F) -> Option<F::Output> {
    tokio::time::timeout(REPORT_WAIT, with_priority(Priority::Report, write))
        .await
        .ok()
}

/// Events about one object (the workflow, or the WorkflowRetry).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    reference: ObjectReference,
    metrics: Arc<Metrics>,
}

impl Events {
    pub fn new(ctx: &Context, reference: ObjectReference) -> Self {
        Events {
            recorder: ctx.recorder.clone(),
            reference,
            metrics: ctx.metrics.clone(),
        }
    }

    /// Events about workflow `name` (of UID `uid`) in `namespace`.
    pub fn of_workflow(ctx: &Context, namespace: &str, name: &str, uid: &str) -> Self {
        use kube::Resource as _;
        let workflow = crate::argo::workflow::Workflow::api_version(&());
        let reference = ObjectReference {
            api_version: Some(workflow.into_owned()),
            kind: Some(crate::argo::workflow::Workflow::kind(&()).into_owned()),
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: Some(uid.to_owned()),
            ..Default::default()
        };
        Events::new(ctx, reference)
    }

    fn name(&self) -> &str {
        self.reference.name.as_deref().unwrap_or_default()
    }

    /// The request started (a future that borrows nothing, as [`Events::publish`]).
    pub fn started(&self, note: String) -> impl Future<Output = ()> + Send + 'static {
        self.publish(EventType::Normal, reasons::STARTED, note)
    }

    /// Publishes one Event at the budget's report priority, behind every
    /// retry's own requests; the future borrows nothing, so it can run beside
    /// the request. Events are best effort: one the budget has no room for
    /// within [`REPORT_WAIT`] is dropped and counted, and a failure is logged.
    pub fn publish(
        &self,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) -> impl Future<Output = ()> + Send + 'static {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, MAX_NOTE)),
            action: "Retry".into(),
            secondary: None,
        };
        let (recorder, reference) = (self.recorder.clone(), self.reference.clone());
        let metrics = self.metrics.clone();
        async move {
            match best_effort(recorder.publish(&event, &reference)).await {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    warn!(object = reference.name, error = %e, "could not publish event")
                }
                None => {
                    debug!(
                        object = reference.name,
                        reason = event.reason,
                        "event dropped: the write budget is short"
                    );
                    metrics.event_dropped();
                }
            }
        }
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ending_has_its_phase_event_and_metric() {
        let e = Ending::retrying(&"the API server is unreachable");
        assert_eq!(
            e.status(),
            Some((
                RetryPhase::Pending,
                "the API server is unreachable; rewind will try again"
            ))
        );
        assert_eq!(e.event().map(|(_, r, _)| r), Some(reasons::ERROR));
        assert_eq!(e.metric_label(), "transient_error");
        let f = Ending::Failed("no".into());
        assert_eq!(f.status(), Some((RetryPhase::Failed, "no")));
        assert_eq!(
            f.event().map(|(t, r, _)| (t, r)),
            Some((EventType::Warning, reasons::FAILED))
        );
        assert_eq!(
            Ending::Succeeded("done".into())
                .event()
                .map(|(t, r, _)| (t, r)),
            Some((EventType::Normal, reasons::SUCCEEDED))
        );
        for quiet in [Ending::Interrupted, Ending::AlreadyAnswered, Ending::Gone] {
            assert_eq!(quiet.status(), None);
            assert_eq!(quiet.event(), None);
        }
    }

    #[test]
    fn every_result_label_is_one_the_metrics_create_up_front() {
        for ending in [
            Ending::Succeeded(String::new()),
            Ending::Failed(String::new()),
            Ending::Retrying(String::new()),
            Ending::Interrupted,
            Ending::AlreadyAnswered,
            Ending::Gone,
        ] {
            let label = ending.metric_label();
            assert!(
                crate::telemetry::metrics::RESULTS.contains(&label),
                "{label}"
            );
        }
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("abc".into(), 5), "abc");
        assert_eq!(truncate("aé".into(), 2), "a");
        assert_eq!(truncate("aé".into(), 3), "aé");
    }
}
