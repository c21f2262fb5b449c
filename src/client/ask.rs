//! Asking for a retry: a WorkflowRetry object (one live workflow, whose
//! progress it then shows each second, or an archived one), or the
//! annotations on live workflows (a batch: one request each, one asker).

use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use crate::argo::workflow::Workflow;
use crate::client::FollowError;
use crate::protocol::crd::{ASKED_BY, AskedBy, WorkflowRetry, WorkflowRetrySpec};
use crate::protocol::request::{self, RequestOptions};

/// The prefix of the names of the WorkflowRetry objects `rewind retry`
/// creates (the API server appends a random suffix).
pub const GENERATE_NAME: &str = "retry-";

/// A request asked on one workflow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    pub namespace: String,
    /// The workflow retried. For an archived retry, the archived UID until
    /// the controller names the workflow it creates.
    pub workflow: String,
    /// The annotation's token, or the WorkflowRetry's name.
    pub token: String,
    pub source: Source,
}

/// Where a request lives and reports its progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The `rewind.dev/retry` annotation on a live workflow.
    Annotation,
    /// A WorkflowRetry object, for an archived workflow (its UID) or for the
    /// live workflow [`Asked::workflow`] (`None`).
    WorkflowRetry { archived_uid: Option<String> },
}

/// A new request token: the time in milliseconds, so two requests asked in
/// one second still differ (any new value is a new request).
pub fn new_token() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .as_millisecond()
        .to_string()
}

/// Asks for a retry of `workflow` as request `token` (one metadata patch).
/// Workflows asked with one token (a [`new_token`] per batch) are one asker
/// to the controller: their retries take the turns one retry would beside
/// other users'.
pub async fn ask(
    workflows: &Api<Workflow>,
    namespace: &str,
    workflow: &str,
    options: &RequestOptions,
    token: &str,
) -> Result<Asked, FollowError> {
    let patch = request::patch(token, options);
    match workflows
        .patch_metadata(workflow, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Asked {
            namespace: namespace.to_owned(),
            workflow: workflow.to_owned(),
            token: token.to_owned(),
            source: Source::Annotation,
        }),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(FollowError::NotFound {
            namespace: namespace.to_owned(),
            workflow: workflow.to_owned(),
        }),
        Err(source) => Err(FollowError::Ask {
            namespace: namespace.to_owned(),
            workflow: workflow.to_owned(),
            source,
        }),
    }
}

/// What a WorkflowRetry asks to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A live workflow, by name.
    Live(&'a str),
    /// An archived workflow, by UID.
    Archived(&'a str),
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Live(name) => write!(f, "workflow {name}"),
            Target::Archived(uid) => write!(f, "archived workflow {uid}"),
        }
    }
}

/// The WorkflowRetry that asks for a retry of `target` with `options`, as
/// `argo retry` and `argo archive retry` take them, deleted `ttl` after it
/// finished; the API server names it. `asked_by` is the caller rewind's Argo
/// API asks for (see [`ASKED_BY`]).
pub fn request_object(
    target: Target<'_>,
    options: &RequestOptions,
    ttl: Duration,
    asked_by: Option<&AskedBy>,
) -> WorkflowRetry {
    let (workflow_name, archived_workflow_uid) = match target {
        Target::Live(name) => (Some(name.to_owned()), None),
        Target::Archived(uid) => (None, Some(uid.to_owned())),
    };
    let spec = WorkflowRetrySpec {
        workflow_name,
        archived_workflow_uid,
        restart_successful: options.restart_successful,
        node_field_selector: (!options.node_field_selector.is_empty())
            .then(|| options.node_field_selector.clone()),
        parameters: options.parameters.clone(),
        ttl_seconds_after_finished: Some(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
    };
    let mut object = WorkflowRetry::new("", spec);
    object.metadata = ObjectMeta {
        generate_name: Some(GENERATE_NAME.to_owned()),
        annotations: asked_by.map(|a| [(ASKED_BY.to_owned(), a.annotation())].into()),
        ..Default::default()
    };
    object
}

/// Asks for a retry of `target` by creating a WorkflowRetry in `namespace`.
/// With `dry_run`, the API server validates and admits the object (schema,
/// CEL rules, RBAC) but stores nothing.
pub async fn ask_object(
    retries: &Api<WorkflowRetry>,
    namespace: &str,
    target: Target<'_>,
    options: &RequestOptions,
    ttl: Duration,
    asked_by: Option<&AskedBy>,
    dry_run: bool,
) -> Result<(Asked, WorkflowRetry), FollowError> {
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    let created = retries
        .create(&params, &request_object(target, options, ttl, asked_by))
        .await
        .map_err(|source| FollowError::Create {
            namespace: namespace.to_owned(),
            target: target.to_string(),
            source,
        })?;
    let (workflow, archived_uid) = match target {
        Target::Live(name) => (name, None),
        Target::Archived(uid) => (uid, Some(uid.to_owned())),
    };
    let asked = Asked {
        namespace: namespace.to_owned(),
        workflow: workflow.to_owned(),
        token: created.name_any(),
        source: Source::WorkflowRetry { archived_uid },
    };
    Ok((asked, created))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_object_is_a_generated_workflowretry_with_the_options() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "templateName=a".into(),
            parameters: Some(vec!["x=1".into()]),
        };
        let object = request_object(
            Target::Archived("u-1"),
            &options,
            Duration::from_secs(86400),
            None,
        );
        assert_eq!(object.metadata.name, None);
        assert_eq!(object.metadata.annotations, None);
        assert_eq!(object.metadata.generate_name.as_deref(), Some("retry-"));
        assert_eq!(
            serde_json::to_value(&object.spec).unwrap(),
            serde_json::json!({
                "archivedWorkflowUID": "u-1",
                "restartSuccessful": true,
                "nodeFieldSelector": "templateName=a",
                "parameters": ["x=1"],
                "ttlSecondsAfterFinished": 86400,
            })
        );
        // The spec reads back as the request asked.
        assert_eq!(object.spec.options(), options);
        let plain = request_object(
            Target::Archived("u-2"),
            &RequestOptions::default(),
            Duration::from_secs(60),
            None,
        );
        assert_eq!(
            serde_json::to_value(&plain.spec).unwrap(),
            serde_json::json!({"archivedWorkflowUID": "u-2", "restartSuccessful": false, "ttlSecondsAfterFinished": 60})
        );
        let asker = AskedBy {
            user: "alice".into(),
            ..Default::default()
        };
        let live = request_object(
            Target::Live("wf"),
            &RequestOptions::default(),
            Duration::from_secs(60),
            Some(&asker),
        );
        assert_eq!(AskedBy::of(&live), Some(asker));
        assert_eq!(
            serde_json::to_value(&live.spec).unwrap(),
            serde_json::json!({"workflowName": "wf", "restartSuccessful": false, "ttlSecondsAfterFinished": 60})
        );
    }
}
