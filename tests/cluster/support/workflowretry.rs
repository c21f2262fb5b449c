//! WorkflowRetry objects: making them and waiting for their end.

use std::time::Duration;

use anyhow::bail;
use kube::api::Api;
use rewind::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::RetryPhase;

const FINISH: Duration = Duration::from_secs(60);

pub fn live(name: &str, workflow: &str, ttl: Option<i64>) -> WorkflowRetry {
    WorkflowRetry::new(
        name,
        WorkflowRetrySpec {
            workflow_name: Some(workflow.into()),
            ttl_seconds_after_finished: ttl,
            ..Default::default()
        },
    )
}

pub fn archived(name: &str, uid: &str) -> WorkflowRetry {
    WorkflowRetry::new(
        name,
        WorkflowRetrySpec {
            archived_workflow_uid: Some(uid.into()),
            ..Default::default()
        },
    )
}

/// Waits until WorkflowRetry `name` reports a final phase.
pub async fn wait_finished(api: &Api<WorkflowRetry>, name: &str) -> anyhow::Result<WorkflowRetry> {
    let deadline = tokio::time::Instant::now() + FINISH;
    loop {
        let object = api.get(name).await?;
        if object.is_finished() {
            return Ok(object);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "WorkflowRetry {name} did not finish within {FINISH:?}; its status: {:?}",
                object.status
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn phase_and_message(object: &WorkflowRetry) -> (Option<RetryPhase>, String) {
    let status = object.status.clone().unwrap_or_default();
    (status.phase, status.message)
}
