//! The rows of `rewind status`: every request on a workflow and every
//! WorkflowRetry, once each.

use std::collections::BTreeSet;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::core::PartialObjectMeta;
use kube::{Resource as _, ResourceExt as _};

use crate::argo::workflow::Workflow;
use crate::client::follow::{Observed, latest};
use crate::protocol::crd::WorkflowRetry;
use crate::protocol::request::workflowretry_token;

/// One row of `rewind status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub namespace: String,
    /// The workflow; for an archived retry, the created workflow's name, or
    /// the archived UID until the controller names it.
    pub workflow: String,
    /// `annotation/TOKEN` or `workflowretry/NAME`.
    pub request: String,
    /// The phase, or "Waiting" until a controller picks the request up.
    pub phase: String,
    /// Pods deleted/total, or "-" before a controller reported.
    pub pods: String,
    pub age: String,
    pub message: String,
}

const WAITING: &str = "Waiting";
const NOT_PICKED_UP: &str = "not picked up by a controller yet";

impl Row {
    /// True when `name` names the row's workflow or its WorkflowRetry.
    pub fn is_named(&self, name: &str) -> bool {
        self.workflow == name || self.request == format!("workflowretry/{name}")
    }
}

/// The rows of `rewind status`: the latest annotation request of each
/// workflow, then each WorkflowRetry; only those `name` names, if given.
/// A live WorkflowRetry's annotation request is its own row's, so it is not
/// shown twice.
pub fn rows(
    workflows: &[PartialObjectMeta<Workflow>],
    retries: &[WorkflowRetry],
    name: Option<&str>,
    now: Timestamp,
) -> Vec<Row> {
    let by_retries: BTreeSet<String> = retries
        .iter()
        .filter_map(|r| r.uid())
        .map(|uid| workflowretry_token(&uid))
        .collect();
    workflows
        .iter()
        .filter_map(|meta| annotation_row(meta, &by_retries, now))
        .chain(retries.iter().map(|r| workflowretry_row(r, now)))
        .filter(|row| name.is_none_or(|n| row.is_named(n)))
        .collect()
}

fn annotation_row(
    meta: &PartialObjectMeta<Workflow>,
    skipped: &BTreeSet<String>,
    now: Timestamp,
) -> Option<Row> {
    let annotations = meta.metadata.annotations.as_ref()?;
    let (token, observed) = latest(annotations)?;
    if skipped.contains(&token) {
        return None;
    }
    let mut row = Row {
        namespace: meta.metadata.namespace.clone().unwrap_or_default(),
        workflow: meta.metadata.name.clone().unwrap_or_default(),
        request: format!("annotation/{token}"),
        phase: WAITING.into(),
        pods: "-".into(),
        age: "-".into(),
        message: String::new(),
    };
    match observed {
        Ok(Observed::Status(s)) => {
            row.phase = format!("{:?}", s.phase);
            row.pods = format!("{}/{}", s.pods_deleted, s.pods_total);
            row.age = s
                .started_at
                .and_then(|t| t.parse::<Timestamp>().ok())
                .map_or_else(|| "-".into(), |t| age(now.duration_since(t)));
            row.message = s.message;
        }
        Ok(Observed::NotYet | Observed::Replaced { .. }) => row.message = NOT_PICKED_UP.into(),
        Err(e) => row.message = format!("unreadable status: {e}"),
    }
    Some(row)
}

fn workflowretry_row(object: &WorkflowRetry, now: Timestamp) -> Row {
    let status = object.status.clone().unwrap_or_default();
    let spec = &object.spec;
    let workflow = status
        .workflow_name
        .or_else(|| spec.workflow_name.clone())
        .or_else(|| spec.archived_workflow_uid.clone())
        .unwrap_or_default();
    let (phase, pods, message) = match status.phase {
        Some(phase) => (
            format!("{phase:?}"),
            format!("{}/{}", status.pods_deleted, status.pods_total),
            status.message,
        ),
        None => (WAITING.into(), "-".into(), NOT_PICKED_UP.into()),
    };
    Row {
        namespace: object.namespace().unwrap_or_default(),
        workflow,
        request: format!("workflowretry/{}", object.name_any()),
        phase,
        pods,
        age: object
            .meta()
            .creation_timestamp
            .as_ref()
            .map_or_else(|| "-".into(), |t| age(now.duration_since(t.0))),
        message,
    }
}

/// kubectl's short ages: 42s, 5m, 3h, 2d.
fn age(d: SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crd::{WorkflowRetrySpec, WorkflowRetryStatus};
    use crate::protocol::request::{RetryPhase, annotations};

    use crate::protocol::annotations_of as ann;

    fn meta(name: &str, pairs: &[(&str, &str)]) -> PartialObjectMeta<Workflow> {
        let mut meta = PartialObjectMeta::<Workflow>::default();
        meta.metadata.name = Some(name.into());
        meta.metadata.namespace = Some("ns".into());
        meta.metadata.annotations = Some(ann(pairs));
        meta
    }

    fn retry_object(
        name: &str,
        uid: &str,
        spec: WorkflowRetrySpec,
        status: Option<WorkflowRetryStatus>,
        created: &str,
    ) -> WorkflowRetry {
        let mut object = WorkflowRetry::new(name, spec);
        object.metadata.namespace = Some("ns".into());
        object.metadata.uid = Some(uid.into());
        object.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created.parse().unwrap()),
        );
        object.status = status;
        object
    }

    #[test]
    fn status_rows_show_annotations_and_workflowretries_once_each() {
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let done = r#"{"token":"7","phase":"Succeeded","podsTotal":5,"podsDeleted":5,"message":"reset","startedAt":"2026-01-01T00:59:00Z"}"#;
        let workflows = [
            meta("plain", &[]),
            meta(
                "annotated",
                &[(annotations::RETRY, "7"), (annotations::STATUS, done)],
            ),
            meta("waiting", &[(annotations::RETRY, "8")]),
            // Asked by the live WorkflowRetry below: its row tells it.
            meta("live", &[(annotations::RETRY, "workflowretry-uid-live")]),
        ];
        let retries = [
            retry_object(
                "retry-live",
                "uid-live",
                WorkflowRetrySpec {
                    workflow_name: Some("live".into()),
                    ..Default::default()
                },
                None,
                "2026-01-01T00:59:58Z",
            ),
            retry_object(
                "retry-pending",
                "uid-p",
                WorkflowRetrySpec {
                    archived_workflow_uid: Some("arch-1".into()),
                    ..Default::default()
                },
                None,
                "2026-01-01T00:00:00Z",
            ),
            retry_object(
                "retry-done",
                "uid-d",
                WorkflowRetrySpec {
                    archived_workflow_uid: Some("arch-2".into()),
                    ..Default::default()
                },
                Some(WorkflowRetryStatus {
                    phase: Some(RetryPhase::Succeeded),
                    pods_total: 3,
                    pods_deleted: 2,
                    message: "created workflow big".into(),
                    workflow_name: Some("big".into()),
                    ..Default::default()
                }),
                "2025-12-30T00:00:00Z",
            ),
        ];
        let row =
            |workflow: &str, request: &str, phase: &str, pods: &str, age: &str, message: &str| {
                Row {
                    namespace: "ns".into(),
                    workflow: workflow.into(),
                    request: request.into(),
                    phase: phase.into(),
                    pods: pods.into(),
                    age: age.into(),
                    message: message.into(),
                }
            };
        let all = rows(&workflows, &retries, None, now);
        assert_eq!(
            all,
            [
                row(
                    "annotated",
                    "annotation/7",
                    "Succeeded",
                    "5/5",
                    "1m",
                    "reset"
                ),
                row(
                    "waiting",
                    "annotation/8",
                    "Waiting",
                    "-",
                    "-",
                    NOT_PICKED_UP
                ),
                row(
                    "live",
                    "workflowretry/retry-live",
                    "Waiting",
                    "-",
                    "2s",
                    NOT_PICKED_UP
                ),
                row(
                    "arch-1",
                    "workflowretry/retry-pending",
                    "Waiting",
                    "-",
                    "1h",
                    NOT_PICKED_UP
                ),
                row(
                    "big",
                    "workflowretry/retry-done",
                    "Succeeded",
                    "2/3",
                    "2d",
                    "created workflow big"
                ),
            ]
        );
        // A name picks a workflow, or a WorkflowRetry by its name.
        let named = |name| {
            rows(&workflows, &retries, Some(name), now)
                .into_iter()
                .map(|r| r.request)
                .collect::<Vec<_>>()
        };
        assert_eq!(named("big"), ["workflowretry/retry-done"]);
        assert_eq!(named("retry-pending"), ["workflowretry/retry-pending"]);
        assert_eq!(named("annotated"), ["annotation/7"]);
        assert!(named("plain").is_empty());
    }

    #[test]
    fn ages_are_kubectls() {
        let age_of = |s| age(SignedDuration::from_secs(s));
        assert_eq!(
            [
                age_of(-3),
                age_of(59),
                age_of(60),
                age_of(7199),
                age_of(86400 * 3)
            ],
            ["0s", "59s", "1m", "1h", "3d"]
        );
    }
}
