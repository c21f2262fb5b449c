//! Asking for a retry and following it, as `rewind retry` and `rewind status`
//! do. A live workflow's request is the annotation contract of
//! [`crate::protocol::request`], its progress what the controller writes in
//! `rewind.dev/retry-status`; an archived workflow's request is a
//! [`WorkflowRetry`](crate::protocol::crd::WorkflowRetry) object, its
//! progress that object's status.
//!
//! The pure parts ([`ask::request_object`], [`follow::observe`],
//! [`follow::progress`], [`rows::rows`], [`preview::preview`]) are separate
//! from the reads and writes ([`ask::ask`], [`ask::ask_object`],
//! [`follow::Follower`]).

pub mod ask;
pub mod follow;
pub mod preview;
pub mod rows;

pub use ask::{Asked, Source};

use crate::protocol::request::annotations;

/// Why asking for or following a request failed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("workflow {namespace}/{workflow} not found; check the name and the namespace (-n)")]
    NotFound { namespace: String, workflow: String },
    #[error("asking for a retry of workflow {namespace}/{workflow}: {source}")]
    Ask {
        namespace: String,
        workflow: String,
        source: kube::Error,
    },
    #[error("reading workflow {namespace}/{workflow}: {source}")]
    Read {
        namespace: String,
        workflow: String,
        source: kube::Error,
    },
    #[error(
        "workflow {namespace}/{workflow} carries an unreadable {key} annotation: {source}",
        key = annotations::STATUS
    )]
    BadStatus {
        namespace: String,
        workflow: String,
        source: serde_json::Error,
    },
    #[error(
        "workflow {namespace}/{workflow} was deleted while its retry request {token} was followed"
    )]
    Gone {
        namespace: String,
        workflow: String,
        token: String,
    },
    #[error("creating a WorkflowRetry for {target} in namespace {namespace}: {source}")]
    Create {
        namespace: String,
        /// "workflow NAME" or "archived workflow UID".
        target: String,
        source: kube::Error,
    },
    #[error("reading WorkflowRetry {namespace}/{name}: {source}")]
    ReadRetry {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("WorkflowRetry {namespace}/{name} was deleted while it was followed")]
    RetryGone { namespace: String, name: String },
}
