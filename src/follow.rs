//! Asking for a retry and following it, as `rewind retry` and `rewind status`
//! do: the request is the annotation contract of [`crate::request`], and its
//! progress is what the controller writes in `rewind.dev/retry-status`.
//!
//! The pure part ([`request_patch`], [`observe`], [`Observed`]) is separate
//! from the reads and writes ([`ask`], [`Follower`]).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;

use crate::delete::{self, DeleteWork, Listed};
use crate::plan::Plan;
use crate::request::{self, RequestOptions, RetryPhase, RetryStatus, annotations};
use crate::workflow::Workflow;

/// How often a followed request is read again. The controller writes its
/// progress every 2 s at most, so reading faster shows nothing new.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// A request asked on one workflow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    pub namespace: String,
    pub workflow: String,
    pub token: String,
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

/// Follows one request by reading the workflow's metadata every
/// [`POLL_INTERVAL`].
pub struct Follower {
    workflows: Api<Workflow>,
    asked: Asked,
    last: Option<Observed>,
    asked_at: Instant,
}

impl Follower {
    pub fn new(workflows: Api<Workflow>, asked: Asked) -> Self {
        Follower {
            workflows,
            asked,
            last: None,
            asked_at: Instant::now(),
        }
    }

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
        let Asked {
            namespace,
            workflow,
            token,
        } = &self.asked;
        let meta = self
            .workflows
            .get_metadata_opt(workflow)
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
        let observed = observe(annotations, token).map_err(|source| FollowError::BadStatus {
            namespace: namespace.clone(),
            workflow: workflow.clone(),
            source,
        })?;
        self.last = Some(observed.clone());
        Ok(observed)
    }
}

/// What `rewind retry` says when no controller answers: the request stays
/// on the workflow, and where to look.
pub fn no_controller_message(asked: &Asked, waited: Duration) -> String {
    format!(
        "no rewind controller answered retry request {token} on workflow {ns}/{wf} within {secs}s. \
         The request stays on the workflow and runs once a controller serves it. Check that the controller runs \
         (`kubectl get deployments -A -l app.kubernetes.io/name=rewind`), that one replica holds the leader Lease \
         (`kubectl get lease rewind -n <controller namespace>`), that it watches namespace {ns} (its --namespace), \
         and that its --instance-id matches the workflow's workflows.argoproj.io/controller-instanceid label; \
         then follow it with `rewind status {wf} -n {ns} -w`",
        token = asked.token,
        ns = asked.namespace,
        wf = asked.workflow,
        secs = waited.as_secs(),
    )
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
        };
        let text = no_controller_message(&asked, Duration::from_secs(15));
        for needle in [
            "no rewind controller answered retry request 1 on workflow ns/wf within 15s",
            "kubectl get lease rewind",
            "--instance-id",
            "rewind status wf -n ns -w",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }
}
