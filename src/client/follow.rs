//! Following a request: what the controller reported on it, and how fast
//! it goes.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, GetParams};

use tokio::time::Instant;

use crate::argo::workflow::Workflow;
use crate::client::{Asked, FollowError, Source};
use crate::protocol::crd::{WorkflowRetry, WorkflowRetryStatus};
use crate::protocol::request::{self, RetryPhase, RetryStatus};

/// How often a followed request is read again. The controller writes a
/// WorkflowRetry's progress every half second at most (a workflow's
/// annotation every 2 s), so reading faster shows nothing new.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

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
    match request::token(annotations) {
        Some(current) if current != token => Ok(Observed::Replaced { by: current }),
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
    let token = request::token(annotations)?;
    let observed = observe(annotations, &token);
    Some((token, observed))
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

    /// True once a controller has reported on the request.
    pub fn answered(&self) -> bool {
        !matches!(self.last, None | Some(Observed::NotYet))
    }

    /// True when no controller has reported on the request for `timeout`
    /// since it was asked.
    pub fn unanswered_for(&self, timeout: Duration) -> bool {
        !self.answered() && self.asked_at.elapsed() >= timeout
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
        Source::WorkflowRetry {
            archived_uid: Some(archived_uid),
        } => format!(
            "no rewind controller answered WorkflowRetry {ns}/{name} (archived workflow {archived_uid}) within {secs}s. \
             The WorkflowRetry stays and runs once a controller serves it. {common} \
             (any --instance-id serves WorkflowRetry objects), \
             and that it reads Argo's archive (its --argo-configmap names Argo's ConfigMap, whose persistence block archives); \
             then follow it with `rewind status {name} -n {ns} -w`",
            name = asked.token,
        ),
        Source::WorkflowRetry { archived_uid: None } => format!(
            "no rewind controller answered WorkflowRetry {ns}/{name} (workflow {wf}) within {secs}s. \
             The WorkflowRetry stays and runs once a controller serves it. {common}, \
             and that its --instance-id matches the workflow's workflows.argoproj.io/controller-instanceid label; \
             then follow it with `rewind status {name} -n {ns} -w`",
            name = asked.token,
            wf = asked.workflow,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::request::annotations;

    use crate::protocol::annotations_of as ann;

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
                archived_uid: Some("u-1".into()),
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
        let live = Asked {
            workflow: "wf".into(),
            source: Source::WorkflowRetry { archived_uid: None },
            ..archived
        };
        let text = no_controller_message(&live, Duration::from_secs(15));
        for needle in [
            "no rewind controller answered WorkflowRetry ns/retry-x7k2p (workflow wf) within 15s",
            "controller-instanceid",
            "rewind status retry-x7k2p -n ns -w",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
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
}
