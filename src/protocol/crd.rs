//! The `WorkflowRetry` custom resource (`rewind.dev/v1alpha1`): a retry
//! request as an object of its own, for an archived workflow (no longer in the
//! cluster) or a live one.
//!
//! The CRD YAML in `deploy/crds/` is generated from these types
//! (`rewind crd`); a unit test fails when the two drift apart.

use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::protocol::request::{
    MAX_PARAMETER, MAX_PARAMETERS, MAX_SELECTOR, RequestOptions, RetryPhase,
};

/// A Kubernetes UID, as Argo's archive keys workflows.
const UID_PATTERN: &str = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
/// A workflow's name: a DNS subdomain.
const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// `NAME=VALUE`, as Argo takes parameter overrides.
const PARAMETER_PATTERN: &str = "^[^=]+=";
/// The longest `ttlSecondsAfterFinished`: a year.
pub const MAX_TTL_SECONDS: i64 = 365 * 24 * 3600;

/// Annotation on a workflow created by an archived retry: the UID of the
/// `WorkflowRetry` that created it. A restarted controller that finds it
/// knows the create happened and marks the request done (exactly once).
pub const CREATED_BY: &str = "rewind.dev/workflowretry-uid";

/// Finalizer on a workflow created by an archived retry, removed once the
/// `WorkflowRetry`'s status names the created UID: until then the workflow
/// cannot vanish (deleted by its TTL, say), so a restarted controller that
/// finds neither the UID in the status nor the workflow knows it was never
/// created, and creates it (exactly once).
pub const CREATING: &str = "rewind.dev/creating";

/// Annotation on a `WorkflowRetry` that rewind's Argo API created for a
/// caller: who asked ([`AskedBy`], JSON). The API server's audit log names
/// rewind's ServiceAccount as the creator of such an object, so the caller is
/// recorded here and in the request's Events. Only rewind's ServiceAccount
/// may set or change it (the chart's admission policy); an object created
/// directly has none, and the audit log names its creator.
pub const ASKED_BY: &str = "rewind.dev/asked-by";

/// Who asked for a retry through rewind's Argo API, as authenticated there.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AskedBy {
    /// The user as the TokenReview names them, or an SSO user's email (else
    /// their subject).
    pub user: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The account Argo's server would act as for an SSO user (SSO RBAC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acting_as: Option<String>,
}

impl AskedBy {
    /// The most groups recorded: a member of hundreds would make the
    /// annotation larger than the object it is on.
    const MAX_GROUPS: usize = 32;

    /// The annotation's value: at most [`AskedBy::MAX_GROUPS`] groups, the
    /// rest counted.
    pub fn annotation(&self) -> String {
        let mut bounded = self.clone();
        if bounded.groups.len() > Self::MAX_GROUPS {
            let more = bounded.groups.len() - Self::MAX_GROUPS;
            bounded.groups.truncate(Self::MAX_GROUPS);
            bounded.groups.push(format!("(and {more} more)"));
        }
        serde_json::to_string(&bounded).expect("AskedBy serializes")
    }

    /// Who asked for `object`, if rewind's Argo API recorded it.
    pub fn of(object: &WorkflowRetry) -> Option<AskedBy> {
        let value = object.metadata.annotations.as_ref()?.get(ASKED_BY)?;
        serde_json::from_str(value).ok()
    }
}

impl std::fmt::Display for AskedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.user)?;
        if !self.groups.is_empty() {
            write!(f, " (groups {})", self.groups.join(", "))?;
        }
        if let Some(account) = &self.acting_as {
            write!(f, " acting as {account}")?;
        }
        Ok(())
    }
}

/// The generated CRD, as committed in `deploy/crds/`.
pub const CRD_FILE: &str = "rewind.dev_workflowretries.yaml";

/// Retry a failed Argo workflow: an archived one (by UID) or a live one (by name).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "rewind.dev",
    version = "v1alpha1",
    kind = "WorkflowRetry",
    namespaced,
    doc = "A request to retry a failed Argo workflow, archived or live; rewind's controller serves it.",
    status = "WorkflowRetryStatus",
    shortname = "wfretry",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Workflow", "type":"string", "jsonPath":".spec.workflowName"}"#,
    printcolumn = r#"{"name":"Archived UID", "type":"string", "jsonPath":".spec.archivedWorkflowUID"}"#,
    printcolumn = r#"{"name":"Phase", "type":"string", "jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Deleted", "type":"integer", "jsonPath":".status.podsDeleted"}"#,
    printcolumn = r#"{"name":"Total", "type":"integer", "jsonPath":".status.podsTotal"}"#,
    printcolumn = r#"{"name":"Age", "type":"date", "jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("has(self.archivedWorkflowUID) != has(self.workflowName)")
        .message("set exactly one of archivedWorkflowUID and workflowName"),
    validation = Rule::new("self == oldSelf")
        .message("spec is immutable: create a new WorkflowRetry to retry again")
)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowRetrySpec {
    /// UID of an archived workflow to retry (Argo's workflow archive).
    #[serde(
        default,
        rename = "archivedWorkflowUID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 36, max = 36), pattern(UID_PATTERN))]
    pub archived_workflow_uid: Option<String>,
    /// Name of a live workflow in this namespace to retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(NAME_PATTERN))]
    pub workflow_name: Option<String>,
    /// Also restart succeeded nodes the selector matches (`argo retry --restart-successful`).
    #[serde(default)]
    pub restart_successful: bool,
    /// Argo's node field selector, e.g. `templateName=train`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SELECTOR))]
    pub node_field_selector: Option<String>,
    /// Parameter overrides, each "name=value".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PARAMETERS), inner(length(min = 2, max = MAX_PARAMETER), pattern(PARAMETER_PATTERN)))]
    pub parameters: Option<Vec<String>>,
    /// Delete this object this many seconds after it finished, as a Job's
    /// TTL (at most a year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_TTL_SECONDS))]
    pub ttl_seconds_after_finished: Option<i64>,
}

/// Where a WorkflowRetry stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowRetryStatus {
    /// Pending, DeletingPods, Committing, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RetryPhase>,
    #[serde(default)]
    pub pods_total: u64,
    #[serde(default)]
    pub pods_deleted: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The workflow retried (live) or created (archived).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_name: Option<String>,
    #[serde(
        default,
        rename = "workflowUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub workflow_uid: Option<String>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Seconds each step of an archived retry took, as each step ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<StepTimings>,
    /// The request a live target was asked for, recorded before it is asked:
    /// a WorkflowRetry asks once, and is answered by its own token, never by
    /// whichever request the workflow carries last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<AskedRequest>,
}

/// A request asked on a live workflow's annotations, on one version of it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AskedRequest {
    /// The `rewind.dev/retry` token asked.
    pub token: String,
    /// The workflow's resourceVersion the ask was written on: it lands only
    /// on that version, so a workflow still at it has not received the ask.
    pub resource_version: String,
}

/// Seconds spent in each step of an archived retry (read the archived row,
/// plan, delete the leftover pods, create the workflow); a step's field is
/// absent until the step has ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepTimings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_seconds: Option<f64>,
}

/// A Kubernetes-style condition (`type` "Complete" or "Failed", as a Job's).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// What a WorkflowRetry asks to retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryTarget {
    Live { name: String },
    Archived { uid: String },
}

impl WorkflowRetrySpec {
    /// The target; `None` when the spec names both or neither (the API
    /// server's validation refuses such objects, older objects aside).
    pub fn target(&self) -> Option<RetryTarget> {
        match (&self.workflow_name, &self.archived_workflow_uid) {
            (Some(name), None) => Some(RetryTarget::Live { name: name.clone() }),
            (None, Some(uid)) => Some(RetryTarget::Archived { uid: uid.clone() }),
            _ => None,
        }
    }

    /// The retry options, as the annotation contract carries them.
    pub fn options(&self) -> RequestOptions {
        RequestOptions {
            restart_successful: self.restart_successful,
            node_field_selector: self.node_field_selector.clone().unwrap_or_default(),
            parameters: self.parameters.clone(),
        }
    }
}

impl WorkflowRetry {
    /// True once the request ended (Succeeded or Failed).
    pub fn is_finished(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(RetryPhase::is_finished)
    }
}

/// The CRD as YAML, exactly as committed under `deploy/crds/`.
pub fn crd_yaml() -> String {
    let yaml = serde_yaml_ng::to_string(&WorkflowRetry::crd()).expect("the CRD serializes");
    format!("# Generated by `rewind crd`; do not edit.\n{yaml}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_matches_the_types() {
        let committed = include_str!("../../deploy/crds/rewind.dev_workflowretries.yaml");
        assert!(
            committed == crd_yaml(),
            "deploy/crds/{CRD_FILE} is out of date: run `cargo run -q -- crd > deploy/crds/{CRD_FILE}`"
        );
    }

    #[test]
    fn who_asked_is_recorded_with_a_bounded_number_of_groups() {
        let asked = AskedBy {
            user: "alice@example.com".into(),
            groups: (0..40).map(|i| format!("g{i}")).collect(),
            acting_as: Some("system:serviceaccount:argo:dev".into()),
        };
        let mut object = WorkflowRetry::new("r", WorkflowRetrySpec::default());
        object.metadata.annotations = Some([(ASKED_BY.to_owned(), asked.annotation())].into());
        let read = AskedBy::of(&object).expect("recorded");
        assert_eq!(read.groups.len(), 33);
        assert_eq!(read.groups.last().map(String::as_str), Some("(and 8 more)"));
        assert!(
            read.to_string()
                .starts_with("alice@example.com (groups g0, g1,")
        );
        assert!(
            read.to_string()
                .ends_with("acting as system:serviceaccount:argo:dev")
        );
        let plain = AskedBy {
            user: "bob".into(),
            ..Default::default()
        };
        assert_eq!(plain.to_string(), "bob");
        assert_eq!(plain.annotation(), r#"{"user":"bob"}"#);
    }

    #[test]
    fn exactly_one_target() {
        let mut spec = WorkflowRetrySpec {
            workflow_name: Some("wf".into()),
            ..Default::default()
        };
        assert_eq!(spec.target(), Some(RetryTarget::Live { name: "wf".into() }));
        spec.archived_workflow_uid = Some("u".into());
        assert_eq!(spec.target(), None);
        spec.workflow_name = None;
        assert_eq!(
            spec.target(),
            Some(RetryTarget::Archived { uid: "u".into() })
        );
        spec.archived_workflow_uid = None;
        assert_eq!(spec.target(), None);
    }

    #[test]
    fn spec_uses_the_documented_field_names() {
        let spec = WorkflowRetrySpec {
            archived_workflow_uid: Some("u".into()),
            ttl_seconds_after_finished: Some(60),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"archivedWorkflowUID":"u","restartSuccessful":false,"ttlSecondsAfterFinished":60}"#
        );
    }

    #[test]
    fn timings_are_omitted_until_known_and_seconds_as_numbers() {
        let mut status = WorkflowRetryStatus::default();
        let json = serde_json::to_value(&status).unwrap();
        assert!(json.get("timings").is_none(), "{json}");
        status.timings = Some(StepTimings {
            read_seconds: Some(0.25),
            plan_seconds: Some(1.5),
            ..Default::default()
        });
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(
            json["timings"],
            serde_json::json!({"readSeconds": 0.25, "planSeconds": 1.5})
        );
        status.timings = Some(StepTimings {
            read_seconds: Some(0.25),
            plan_seconds: Some(1.5),
            delete_seconds: Some(12.0),
            create_seconds: Some(0.125),
        });
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(
            json["timings"],
            serde_json::json!({"readSeconds": 0.25, "planSeconds": 1.5, "deleteSeconds": 12.0, "createSeconds": 0.125})
        );
        let back: WorkflowRetryStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
    }
}
