//! The status subresource and Events of one WorkflowRetry: where a request
//! asked as an object reports, from Pending to Succeeded or Failed.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::protocol::crd::{Condition, WorkflowRetry, WorkflowRetryStatus};
use crate::protocol::request::{self, RetryPhase, RetryStatus};
use crate::retry::Context;
use crate::retry::report::{Events, Report};

/// One WorkflowRetry's status as the controller writes it.
pub struct ObjectStatus<'a> {
    pub ctx: &'a Context,
    pub object: &'a WorkflowRetry,
    /// What the next [`ObjectStatus::write`] writes.
    pub status: WorkflowRetryStatus,
    api: Api<WorkflowRetry>,
    written: Option<WorkflowRetryStatus>,
    events: Events,
}

impl<'a> ObjectStatus<'a> {
    pub fn new(ctx: &'a Context, object: &'a WorkflowRetry) -> Self {
        let written = object.status.clone();
        let mut status = written.clone().unwrap_or_default();
        status.phase.get_or_insert(RetryPhase::Pending);
        status.started_at.get_or_insert_with(request::now);
        status.observed_generation = object.metadata.generation;
        ObjectStatus {
            ctx,
            object,
            status,
            api: Api::namespaced(ctx.client(), &object.namespace().unwrap_or_default()),
            written,
            events: Events::new(ctx, object.object_ref(&())),
        }
    }

    pub fn namespace(&self) -> String {
        self.object.namespace().unwrap_or_default()
    }

    pub fn name(&self) -> String {
        self.object.name_any()
    }

    pub fn uid(&self) -> String {
        self.object.uid().unwrap_or_default()
    }

    /// Writes the status if it changed since the last write.
    pub async fn write(&mut self) -> Result<(), kube::Error> {
        if self.written.as_ref() == Some(&self.status) {
            return Ok(());
        }
        let mut patch = serde_json::json!({ "status": self.status });
        // A merge patch keeps what it leaves out: an ask known not to have
        // landed is removed with a null.
        if self.status.asked.is_none() && self.written.as_ref().is_some_and(|w| w.asked.is_some()) {
            patch["status"]["asked"] = serde_json::Value::Null;
        }
        self.api
            .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.written = Some(self.status.clone());
        Ok(())
    }

    /// Copies a live request's progress.
    pub fn mirror(&mut self, progress: &RetryStatus) {
        self.status.phase = Some(progress.phase);
        self.status.pods_total = progress.pods_total;
        self.status.pods_deleted = progress.pods_deleted;
        self.status.message = request::bounded(&progress.message);
        if progress.phase.is_finished() {
            self.status.finished_at = progress
                .finished_at
                .clone()
                .or_else(|| Some(request::now()));
        }
    }

    /// Sets `phase` and `message`, and for a finished phase, the finish time
    /// and a Job-like condition.
    fn set(&mut self, phase: RetryPhase, message: &str) {
        let phase = kept(self.status.phase, phase);
        self.status.phase = Some(phase);
        self.status.message = request::bounded(message);
        let (type_, reason) = match phase {
            RetryPhase::Succeeded => ("Complete", "Retried"),
            RetryPhase::Failed => ("Failed", "RetryFailed"),
            _ => return,
        };
        self.status.finished_at.get_or_insert_with(request::now);
        self.status.conditions = vec![Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.into(),
            message: self.status.message.clone(),
            last_transition_time: Some(request::now()),
        }];
    }
}

impl Report for ObjectStatus<'_> {
    async fn write_status(&mut self, phase: RetryPhase, message: &str) -> Result<(), kube::Error> {
        self.set(phase, message);
        self.write().await
    }

    fn events(&self) -> &Events {
        &self.events
    }
}

/// The phase written when `now` is asked of a status at `current`: a request
/// whose create may have been sent stays Committing through a passing fault
/// (Pending), as that phase is what keeps an archived retry from creating its
/// workflow again (see `archived`).
fn kept(current: Option<RetryPhase>, now: RetryPhase) -> RetryPhase {
    match (current, now) {
        (Some(RetryPhase::Committing), RetryPhase::Pending) => RetryPhase::Committing,
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passing_fault_never_takes_a_request_out_of_committing() {
        use RetryPhase::*;
        assert_eq!(kept(Some(Committing), Pending), Committing);
        assert_eq!(kept(Some(Committing), Failed), Failed);
        assert_eq!(kept(Some(Committing), Succeeded), Succeeded);
        assert_eq!(kept(Some(DeletingPods), Pending), Pending);
        assert_eq!(kept(None, Pending), Pending);
    }
}
