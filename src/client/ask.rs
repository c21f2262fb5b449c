//! Asking for a retry: the annotations on a live workflow, or a
//! WorkflowRetry object for an archived one.

use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use crate::argo::workflow::Workflow;
use crate::client::FollowError;
use crate::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use crate::protocol::request::{self, RequestOptions};

/// The prefix of the names of the WorkflowRetry objects `rewind retry
/// --archived` creates (the API server appends a random suffix).
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
    /// A WorkflowRetry object for an archived workflow.
    WorkflowRetry { archived_uid: String },
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

/// The WorkflowRetry that asks for a retry of archived workflow `uid` with
/// `options`, as `argo archive retry UID` takes them, deleted `ttl` after it
/// finished; the API server names it.
pub fn archived_request(uid: &str, options: &RequestOptions, ttl: Duration) -> WorkflowRetry {
    let spec = WorkflowRetrySpec {
        archived_workflow_uid: Some(uid.to_owned()),
        restart_successful: options.restart_successful,
        node_field_selector: (!options.node_field_selector.is_empty())
            .then(|| options.node_field_selector.clone()),
        parameters: options.parameters.clone(),
        ttl_seconds_after_finished: Some(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
        ..Default::default()
    };
    let mut object = WorkflowRetry::new("", spec);
    object.metadata = ObjectMeta {
        generate_name: Some(GENERATE_NAME.to_owned()),
        ..Default::default()
    };
    object
}

/// Asks for a retry of archived workflow `uid` by creating a WorkflowRetry
/// in `namespace`. With `dry_run`, the API server validates and admits the
/// object (schema, CEL rules, RBAC) but stores nothing.
pub async fn ask_archived(
    retries: &Api<WorkflowRetry>,
    namespace: &str,
    uid: &str,
    options: &RequestOptions,
    ttl: Duration,
    dry_run: bool,
) -> Result<(Asked, WorkflowRetry), FollowError> {
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    let created = retries
        .create(&params, &archived_request(uid, options, ttl))
        .await
        .map_err(|source| FollowError::Create {
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
            source,
        })?;
    let asked = Asked {
        namespace: namespace.to_owned(),
        workflow: uid.to_owned(),
        token: created.name_any(),
        source: Source::WorkflowRetry {
            archived_uid: uid.to_owned(),
        },
    };
    Ok((asked, created))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archived_request_is_a_generated_workflowretry_with_the_options() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "templateName=a".into(),
            parameters: Some(vec!["x=1".into()]),
        };
        let object = archived_request("u-1", &options, Duration::from_secs(86400));
        assert_eq!(object.metadata.name, None);
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
        let plain = archived_request("u-2", &RequestOptions::default(), Duration::from_secs(60));
        assert_eq!(
            serde_json::to_value(&plain.spec).unwrap(),
            serde_json::json!({"archivedWorkflowUID": "u-2", "restartSuccessful": false, "ttlSecondsAfterFinished": 60})
        );
    }
}
