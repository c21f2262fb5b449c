//! Asking for a retry and following it, as `rewind retry` and `rewind status`
//! do. A live workflow's request is the annotation contract of
//! [`crate::request`], its progress what the controller writes in
//! `rewind.dev/retry-status`; an archived workflow's request is a
//! [`WorkflowRetry`] object, its progress that object's status.
//!
//! The pure part ([`request_patch`], [`archived_request`], [`observe`],
//! [`progress`], [`rows`]) is separate from the reads and writes ([`ask`],
//! [`ask_archived`], [`Follower`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, GetParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::{Resource as _, ResourceExt as _};
use tokio::time::Instant;

use crate::delete::{self, DeleteWork, Listed};
use crate::plan::Plan;
use crate::request::{self, RequestOptions, RetryPhase, RetryStatus, annotations};
use crate::workflow::Workflow;
use crate::workflowretry::serve::live_token;
use crate::workflowretry::{WorkflowRetry, WorkflowRetrySpec, WorkflowRetryStatus};

/// How often a followed request is read again. The controller writes its
/// progress every 2 s at most, so reading faster shows nothing new.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

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
    #[error(
        "creating a WorkflowRetry for archived workflow {uid} in namespace {namespace}: {source}"
    )]
    Create {
        namespace: String,
        uid: String,
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

/// A new request token: the time in milliseconds, so two requests asked in
/// one second still differ (any new value is a new request).
pub fn new_token() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .as_millisecond()
        .to_string()
}

/// The merge patch that asks for request `token` with `options`. Every option
/// annotation is written (or removed), so no option of an earlier request
/// leaks into this one.
pub fn request_patch(token: &str, options: &RequestOptions) -> serde_json::Value {
    let parameters = options
        .parameters
        .as_ref()
        .map(|p| serde_json::to_string(p).expect("a list of strings serializes"));
    let selector =
        (!options.node_field_selector.is_empty()).then_some(options.node_field_selector.as_str());
    serde_json::json!({"metadata": {"annotations": {
        annotations::RETRY: token,
        annotations::RESTART_SUCCESSFUL: options.restart_successful.then_some("true"),
        annotations::NODE_FIELD_SELECTOR: selector,
        annotations::PARAMETERS: parameters,
    }}})
}

/// Asks for a retry of `workflow` (one metadata patch).
pub async fn ask(
    workflows: &Api<Workflow>,
    namespace: &str,
    workflow: &str,
    options: &RequestOptions,
) -> Result<Asked, FollowError> {
    let token = new_token();
    let patch = request_patch(&token, options);
    match workflows
        .patch_metadata(workflow, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Asked {
            namespace: namespace.to_owned(),
            workflow: workflow.to_owned(),
            token,
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
/// `options`, as `argo archive retry UID` takes them; the API server names it.
pub fn archived_request(uid: &str, options: &RequestOptions) -> WorkflowRetry {
    let spec = WorkflowRetrySpec {
        archived_workflow_uid: Some(uid.to_owned()),
        restart_successful: options.restart_successful,
        node_field_selector: (!options.node_field_selector.is_empty())
            .then(|| options.node_field_selector.clone()),
        parameters: options.parameters.clone(),
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
    dry_run: bool,
) -> Result<(Asked, WorkflowRetry), FollowError> {
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    let created = retries
        .create(&params, &archived_request(uid, options))
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

/// What a workflow's annotations say about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// No controller has reported on it yet.
    NotYet,
    /// The controller's latest report.
    Status(RetryStatus),
    /// A newer request (another `rewind.dev/retry` value) replaced it before
    /// it was answered.
    Replaced { by: String },
}

impl Observed {
    pub fn is_finished(&self) -> bool {
        match self {
            Observed::NotYet => false,
            Observed::Status(s) => s.phase.is_finished(),
            Observed::Replaced { .. } => true,
        }
    }
}

/// Reads request `token` from a workflow's annotations.
pub fn observe(
    annotations: &BTreeMap<String, String>,
    token: &str,
) -> Result<Observed, serde_json::Error> {
    if let Some(status) = request::status_of(annotations, token)? {
        return Ok(Observed::Status(status));
    }
    match annotations.get(annotations::RETRY).map(|t| t.trim()) {
        Some(current) if current != token => Ok(Observed::Replaced {
            by: current.to_owned(),
        }),
        _ => Ok(Observed::NotYet),
    }
}

/// What a WorkflowRetry's status says as a request's progress (its name as
/// the token): [`Observed::NotYet`] until a controller has written a phase.
pub fn progress(name: &str, status: Option<&WorkflowRetryStatus>) -> Observed {
    let Some((status, phase)) = status.and_then(|s| Some((s, s.phase?))) else {
        return Observed::NotYet;
    };
    Observed::Status(RetryStatus {
        token: name.to_owned(),
        phase,
        pods_total: status.pods_total,
        pods_deleted: status.pods_deleted,
        message: status.message.clone(),
        started_at: status.started_at.clone(),
        finished_at: status.finished_at.clone(),
    })
}

/// The latest request on a workflow and where it stands, for `rewind status`:
/// `None` when the workflow carries no request.
pub fn latest(
    annotations: &BTreeMap<String, String>,
) -> Option<(String, Result<Observed, serde_json::Error>)> {
    let token = annotations.get(annotations::RETRY)?.trim();
    if token.is_empty() {
        return None;
    }
    Some((token.to_owned(), observe(annotations, token)))
}

/// Follows one request by reading the workflow's metadata, or the
/// WorkflowRetry, every [`POLL_INTERVAL`].
pub struct Follower {
    client: kube::Client,
    asked: Asked,
    last: Option<Observed>,
    asked_at: Instant,
}

impl Follower {
    pub fn new(client: kube::Client, asked: Asked) -> Self {
        Follower {
            client,
            asked,
            last: None,
            asked_at: Instant::now(),
        }
    }

    /// The request; an archived retry's workflow is the created workflow's
    /// name once the controller reported it.
    pub fn asked(&self) -> &Asked {
        &self.asked
    }

    /// True when no controller has reported on the request for `timeout`
    /// since it was asked.
    pub fn unanswered_for(&self, timeout: Duration) -> bool {
        matches!(self.last, None | Some(Observed::NotYet)) && self.asked_at.elapsed() >= timeout
    }

    /// Reads the request once.
    pub async fn poll(&mut self) -> Result<Observed, FollowError> {
        let observed = match self.asked.source {
            Source::Annotation => self.poll_annotation().await?,
            Source::WorkflowRetry { .. } => self.poll_workflowretry().await?,
        };
        self.last = Some(observed.clone());
        Ok(observed)
    }

    async fn poll_annotation(&self) -> Result<Observed, FollowError> {
        let Asked {
            namespace,
            workflow,
            token,
            ..
        } = &self.asked;
        let workflows: Api<Workflow> = Api::namespaced(self.client.clone(), namespace);
        // From the API server's watch cache (resourceVersion 0): reading the workflow from
        // etcd every interval would make the server decode all of it, a megabyte at 20,000
        // pods, while it deletes them; the cache is normally milliseconds behind.
        let meta = workflows
            .get_metadata_opt_with(workflow, &GetParams::any())
            .await
            .map_err(|source| FollowError::Read {
                namespace: namespace.clone(),
                workflow: workflow.clone(),
                source,
            })?
            .ok_or_else(|| FollowError::Gone {
                namespace: namespace.clone(),
                workflow: workflow.clone(),
                token: token.clone(),
            })?;
        let empty = BTreeMap::new();
        let annotations = meta.metadata.annotations.as_ref().unwrap_or(&empty);
        observe(annotations, token).map_err(|source| FollowError::BadStatus {
            namespace: namespace.clone(),
            workflow: workflow.clone(),
            source,
        })
    }

    async fn poll_workflowretry(&mut self) -> Result<Observed, FollowError> {
        let (namespace, name) = (&self.asked.namespace, &self.asked.token);
        let retries: Api<WorkflowRetry> = Api::namespaced(self.client.clone(), namespace);
        let object = retries
            .get_opt(name)
            .await
            .map_err(|source| FollowError::ReadRetry {
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?
            .ok_or_else(|| FollowError::RetryGone {
                namespace: namespace.clone(),
                name: name.clone(),
            })?;
        let status = object.status.as_ref();
        let observed = progress(name, status);
        if let Some(workflow) = status.and_then(|s| s.workflow_name.clone()) {
            self.asked.workflow = workflow;
        }
        Ok(observed)
    }
}

/// What `rewind retry` says when no controller answers: the request stays
/// (on the workflow, or as a WorkflowRetry), and where to look.
pub fn no_controller_message(asked: &Asked, waited: Duration) -> String {
    let ns = &asked.namespace;
    let secs = waited.as_secs();
    let common = format!(
        "Check that the controller runs (`kubectl get deployments -A -l app.kubernetes.io/name=rewind`), \
         that one replica holds the leader Lease (`kubectl get lease rewind -n <controller namespace>`), \
         that it watches namespace {ns} (its --namespace)"
    );
    match &asked.source {
        Source::Annotation => format!(
            "no rewind controller answered retry request {token} on workflow {ns}/{wf} within {secs}s. \
             The request stays on the workflow and runs once a controller serves it. {common}, \
             and that its --instance-id matches the workflow's workflows.argoproj.io/controller-instanceid label; \
             then follow it with `rewind status {wf} -n {ns} -w`",
            token = asked.token,
            wf = asked.workflow,
        ),
        Source::WorkflowRetry { archived_uid } => format!(
            "no rewind controller answered WorkflowRetry {ns}/{name} (archived workflow {archived_uid}) within {secs}s. \
             The WorkflowRetry stays and runs once a controller serves it. {common} \
             (any --instance-id serves WorkflowRetry objects), \
             and that it reads Argo's archive (its --argo-configmap names Argo's ConfigMap, whose persistence block archives); \
             then follow it with `rewind status {name} -n {ns} -w`",
            name = asked.token,
        ),
    }
}

/// Pods deleted per second so far and the time left at that pace, from a
/// status report `elapsed` after the request started.
pub fn pace(status: &RetryStatus, elapsed: Duration) -> (f64, Option<Duration>) {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 || status.pods_deleted == 0 {
        return (0.0, None);
    }
    let rate = status.pods_deleted as f64 / secs;
    let left = status.pods_total.saturating_sub(status.pods_deleted) as f64;
    (rate, Some(Duration::from_secs_f64(left / rate)))
}

/// True when the request ended with the workflow reset.
pub fn succeeded(observed: &Observed) -> bool {
    matches!(observed, Observed::Status(s) if s.phase == RetryPhase::Succeeded)
}

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
        .map(|uid| live_token(&uid))
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

/// What a retry would do, for `rewind retry --dry-run`: the planner's plan
/// and the delete requests the controller would send for it now.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub workflow: String,
    pub nodes_reset: Vec<String>,
    pub nodes_deleted: Vec<String>,
    pub pods_to_delete: Vec<String>,
    /// Whether the workflow's pods could be listed. Without the list (a user
    /// may lack the right), the bulk path is unknown and the figures below
    /// assume one request per plan pod: an upper bound.
    pub pods_listed: bool,
    /// Plan pods one DeleteCollection would delete (0: no bulk path).
    pub bulk_pods: usize,
    /// Plan pods deleted (or released from Argo's finalizer) one request each.
    pub single_requests: usize,
    /// Mutating requests the retry costs: the deletes and the reset write.
    pub mutating_requests: usize,
    /// Time those requests take at the budget (after the burst), not counting
    /// the API server's own time for a bulk delete.
    pub estimated_seconds: f64,
}

/// The preview of `plan` for `workflow`, given its pods as listed now (if
/// they could be) and the controller's write budget.
pub fn preview(
    workflow: &str,
    plan: &Plan,
    pods: Option<&[Listed]>,
    allow_bulk: bool,
    qps: u32,
    burst: u32,
) -> Preview {
    let planned = plan.pods_to_delete.iter().cloned().collect();
    let assessment = match pods {
        Some(pods) => delete::assess(workflow, &planned, pods, allow_bulk),
        None => delete::Assessment {
            work: plan
                .pods_to_delete
                .iter()
                .map(|name| DeleteWork::Pod {
                    name: name.clone(),
                    uid: String::new(),
                })
                .collect(),
            ..Default::default()
        },
    };
    let bulk_pods = assessment
        .work
        .iter()
        .map(|w| match w {
            DeleteWork::Bulk { pods, .. } => pods.len(),
            _ => 0,
        })
        .sum();
    let single_requests = assessment
        .work
        .iter()
        .filter(|w| !matches!(w, DeleteWork::Bulk { .. }))
        .count();
    let mutating_requests = assessment.work.len() + 1;
    let estimated_seconds =
        mutating_requests.saturating_sub(burst as usize) as f64 / f64::from(qps.max(1));
    Preview {
        workflow: workflow.to_owned(),
        nodes_reset: plan.nodes_reset.clone(),
        nodes_deleted: plan.nodes_deleted.clone(),
        pods_to_delete: plan.pods_to_delete.clone(),
        pods_listed: pods.is_some(),
        bulk_pods,
        single_requests,
        mutating_requests,
        estimated_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_patch_sets_every_option_and_clears_the_unset_ones() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "templateName=a".into(),
            parameters: Some(vec!["x=1".into()]),
        };
        assert_eq!(
            request_patch("7", &options),
            serde_json::json!({"metadata": {"annotations": {
                "rewind.dev/retry": "7",
                "rewind.dev/restart-successful": "true",
                "rewind.dev/node-field-selector": "templateName=a",
                "rewind.dev/parameters": "[\"x=1\"]",
            }}})
        );
        assert_eq!(
            request_patch("8", &RequestOptions::default()),
            serde_json::json!({"metadata": {"annotations": {
                "rewind.dev/retry": "8",
                "rewind.dev/restart-successful": null,
                "rewind.dev/node-field-selector": null,
                "rewind.dev/parameters": null,
            }}})
        );
    }

    #[test]
    fn the_patch_reads_back_as_the_same_request() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "id=5".into(),
            parameters: Some(vec!["a=b=c".into()]),
        };
        let patch = request_patch("9", &options);
        let annotations: BTreeMap<String, String> = patch["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        let got = request::pending(&annotations).unwrap().unwrap();
        assert_eq!((got.token.as_str(), got.options), ("9", options));
    }

    #[test]
    fn observe_tells_not_yet_progress_and_replaced_apart() {
        let status = r#"{"token":"2","phase":"DeletingPods","podsTotal":10,"podsDeleted":4}"#;
        assert_eq!(
            observe(&ann(&[(annotations::RETRY, "2")]), "2").unwrap(),
            Observed::NotYet
        );
        let Observed::Status(s) = observe(
            &ann(&[(annotations::RETRY, "2"), (annotations::STATUS, status)]),
            "2",
        )
        .unwrap() else {
            panic!("expected a status")
        };
        assert_eq!((s.pods_deleted, s.pods_total), (4, 10));
        let replaced = observe(
            &ann(&[(annotations::RETRY, "3"), (annotations::STATUS, status)]),
            "1",
        );
        assert_eq!(replaced.unwrap(), Observed::Replaced { by: "3".into() });
        assert!(Observed::Replaced { by: "3".into() }.is_finished());
        assert!(!Observed::NotYet.is_finished());
    }

    #[test]
    fn latest_reads_the_current_token() {
        assert!(latest(&ann(&[])).is_none());
        let (token, observed) = latest(&ann(&[(annotations::RETRY, " 5 ")])).unwrap();
        assert_eq!((token.as_str(), observed.unwrap()), ("5", Observed::NotYet));
    }

    #[test]
    fn pace_is_deletes_per_second_and_the_time_left() {
        let mut status = RetryStatus {
            token: "1".into(),
            phase: RetryPhase::DeletingPods,
            pods_total: 100,
            pods_deleted: 0,
            message: String::new(),
            started_at: None,
            finished_at: None,
        };
        assert_eq!(pace(&status, Duration::from_secs(2)), (0.0, None));
        status.pods_deleted = 40;
        let (rate, left) = pace(&status, Duration::from_secs(2));
        assert_eq!(rate, 20.0);
        assert_eq!(left, Some(Duration::from_secs(3)));
    }

    fn pod(name: &str, phase: &str) -> Listed {
        Listed {
            meta: serde_json::from_value(serde_json::json!({
                "name": name, "uid": format!("uid-{name}"),
                "labels": {"workflows.argoproj.io/workflow": "wf",
                    "workflows.argoproj.io/completed": "true"},
            }))
            .unwrap(),
            succeeded: phase == delete::SUCCEEDED,
        }
    }

    fn plan_of(pods: &[&str]) -> Plan {
        Plan {
            workflow: Workflow::default(),
            pods_to_delete: pods.iter().map(|p| p.to_string()).collect(),
            nodes_deleted: vec!["n1".into()],
            nodes_reset: vec!["n0".into()],
            pod_nodes: Default::default(),
        }
    }

    #[test]
    fn preview_counts_the_bulk_path_and_the_time_at_the_budget() {
        let names: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut pods: Vec<Listed> = names.iter().map(|n| pod(n, "Failed")).collect();
        pods.push(pod("kept", "Succeeded"));
        let plan = plan_of(&names);
        let bulk = preview("wf", &plan, Some(&pods), true, 20, 30);
        assert_eq!((bulk.bulk_pods, bulk.single_requests), (100, 0));
        assert_eq!((bulk.mutating_requests, bulk.estimated_seconds), (2, 0.0));
        assert_eq!(bulk.pods_to_delete.len(), 100);
        let single = preview("wf", &plan, Some(&pods), false, 20, 30);
        assert_eq!((single.bulk_pods, single.single_requests), (0, 100));
        // 101 writes, 30 in the burst, 71 at 20/s.
        assert_eq!(single.mutating_requests, 101);
        assert_eq!(single.estimated_seconds, 3.55);
        // Unlisted pods: the upper bound of one request each.
        let unknown = preview("wf", &plan, None, true, 20, 30);
        assert!(!unknown.pods_listed);
        assert_eq!((unknown.bulk_pods, unknown.mutating_requests), (0, 101));
    }

    #[test]
    fn the_no_controller_message_says_where_to_look() {
        let asked = Asked {
            namespace: "ns".into(),
            workflow: "wf".into(),
            token: "1".into(),
            source: Source::Annotation,
        };
        let text = no_controller_message(&asked, Duration::from_secs(15));
        for needle in [
            "no rewind controller answered retry request 1 on workflow ns/wf within 15s",
            "kubectl get deployments -A -l app.kubernetes.io/name=rewind",
            "kubectl get lease rewind",
            "--instance-id",
            "rewind status wf -n ns -w",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        let archived = Asked {
            namespace: "ns".into(),
            workflow: "u-1".into(),
            token: "retry-x7k2p".into(),
            source: Source::WorkflowRetry {
                archived_uid: "u-1".into(),
            },
        };
        let text = no_controller_message(&archived, Duration::from_secs(15));
        for needle in [
            "no rewind controller answered WorkflowRetry ns/retry-x7k2p (archived workflow u-1) within 15s",
            "kubectl get deployments -A -l app.kubernetes.io/name=rewind",
            "kubectl get lease rewind",
            "--instance-id",
            "--argo-configmap",
            "rewind status retry-x7k2p -n ns -w",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    #[test]
    fn an_archived_request_is_a_generated_workflowretry_with_the_options() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "templateName=a".into(),
            parameters: Some(vec!["x=1".into()]),
        };
        let object = archived_request("u-1", &options);
        assert_eq!(object.metadata.name, None);
        assert_eq!(object.metadata.generate_name.as_deref(), Some("retry-"));
        assert_eq!(
            serde_json::to_value(&object.spec).unwrap(),
            serde_json::json!({
                "archivedWorkflowUID": "u-1",
                "restartSuccessful": true,
                "nodeFieldSelector": "templateName=a",
                "parameters": ["x=1"],
            })
        );
        // The spec reads back as the request asked.
        assert_eq!(object.spec.options(), options);
        let plain = archived_request("u-2", &RequestOptions::default());
        assert_eq!(
            serde_json::to_value(&plain.spec).unwrap(),
            serde_json::json!({"archivedWorkflowUID": "u-2", "restartSuccessful": false})
        );
    }

    #[test]
    fn a_workflowretry_status_is_progress_once_a_controller_wrote_a_phase() {
        assert_eq!(progress("r", None), Observed::NotYet);
        let mut status = WorkflowRetryStatus {
            pods_total: 9,
            ..Default::default()
        };
        assert_eq!(progress("r", Some(&status)), Observed::NotYet);
        status.phase = Some(RetryPhase::DeletingPods);
        status.pods_deleted = 4;
        status.message = "deleting".into();
        status.started_at = Some("2026-01-01T00:00:00Z".into());
        let Observed::Status(s) = progress("r", Some(&status)) else {
            panic!("expected a status")
        };
        assert_eq!(
            s,
            RetryStatus {
                token: "r".into(),
                phase: RetryPhase::DeletingPods,
                pods_total: 9,
                pods_deleted: 4,
                message: "deleting".into(),
                started_at: Some("2026-01-01T00:00:00Z".into()),
                finished_at: None,
            }
        );
        status.phase = Some(RetryPhase::Failed);
        let failed = progress("r", Some(&status));
        assert!(failed.is_finished() && !succeeded(&failed));
        status.phase = Some(RetryPhase::Succeeded);
        assert!(succeeded(&progress("r", Some(&status))));
    }

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
