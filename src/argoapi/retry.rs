//! The two retry calls, each followed to its end before it answers, as Argo's
//! synchronous calls do: each is a WorkflowRetry (with a TTL), written only
//! once the caller is authorized; once written, it is the controller's to
//! finish, so a caller who hangs up stops following and the retry goes on.
//!
//! A live retry is a WorkflowRetry too, not the bare annotation: Argo's call
//! reports no progress on the way, so the object is where an operator sees
//! a retry a UI click asked for (`rewind status`, `kubectl get
//! workflowretries`), its pods counted each second during a bulk delete. It
//! costs one watch event and one write before the controller starts.

use std::time::Duration;

use std::net::{IpAddr, SocketAddr};

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kube::api::{Api, GetParams};
use tracing::info;

use crate::argo::workflow::Workflow;
use crate::argoapi::auth::{self, Authenticated, Identity, Permission, Resource};
use crate::argoapi::wire::{Code, RetryBody, Status};
use crate::argoapi::{ArgoApi, listener};
use crate::client::follow::{self, Follower, Observed, POLL_INTERVAL};
use crate::client::{FollowError, ask};
use crate::engine::fault;
use crate::protocol::crd::{AskedBy, WorkflowRetry};
use crate::protocol::names;
use crate::protocol::request::{DENIED, EXISTS, RetryPhase, RetryStatus};

/// How long a request may wait for a controller to report on it before the
/// call answers Unavailable (the request stays and runs later): a leader
/// that died is replaced within its Lease's 15 s and a few seconds.
pub const NO_CONTROLLER: Duration = Duration::from_secs(30);

/// `PUT /api/v1/workflows/{namespace}/{name}/retry`.
pub async fn live(
    State(api): State<ArgoApi>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let call = Call {
        api: &api,
        source: peer.ip(),
        headers: &parts.headers,
        body,
    };
    answer(retry_live(call, namespace, name).await)
}

/// `PUT /api/v1/archived-workflows/{uid}/retry`.
pub async fn archived(
    State(api): State<ArgoApi>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(uid): Path<String>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let call = Call {
        api: &api,
        source: peer.ip(),
        headers: &parts.headers,
        body,
    };
    answer(retry_archived(call, uid).await)
}

/// One call as it arrived: its body still unread.
struct Call<'a> {
    api: &'a ArgoApi,
    source: IpAddr,
    headers: &'a HeaderMap,
    body: Body,
}

impl Call<'_> {
    /// Who calls; only then is the body read, within the listener's limits,
    /// so an unauthenticated caller never costs its body's memory.
    async fn authenticate(self) -> Result<(Authenticated, RetryBody), Response> {
        let caller = self
            .api
            .auth
            .authenticate(&self.api.reviews, self.source, self.headers)
            .await
            .map_err(IntoResponse::into_response)?;
        let bytes = listener::read_body(&self.api.limits, self.headers, self.body).await?;
        let body = RetryBody::parse(&bytes).map_err(IntoResponse::into_response)?;
        Ok((caller, body))
    }
}

fn answer(result: Result<Workflow, Response>) -> Response {
    match result {
        Ok(workflow) => Json(workflow).into_response(),
        Err(response) => response,
    }
}

/// A path's name that is no Kubernetes name, refused before anything is asked.
fn not_a_name(what: &str, value: &str, syntax: &str) -> Response {
    Status::new(
        Code::InvalidArgument,
        format!("{what} {value:?} is not {syntax}"),
    )
    .into_response()
}

/// What Argo's server needs of the caller to retry: `verbs` on workflows
/// (`name` among them, when the call is about one), and delete on pods,
/// as it deletes the retried nodes' pods with the caller's own client.
fn permissions(verbs: [&'static str; 2], namespace: &str, name: Option<&str>) -> Vec<Permission> {
    let workflows = verbs.map(|verb| Permission {
        verb,
        resource: Resource::Workflows,
        namespace: namespace.to_owned(),
        name: name.map(str::to_owned),
    });
    let pods = Permission {
        verb: "delete",
        resource: Resource::Pods,
        namespace: namespace.to_owned(),
        name: None,
    };
    workflows.into_iter().chain([pods]).collect()
}

async fn retry_live(call: Call<'_>, namespace: String, name: String) -> Result<Workflow, Response> {
    if !names::is_namespace(&namespace) {
        return Err(not_a_name("namespace", &namespace, "a DNS-1123 label"));
    }
    if !names::is_name(&name) {
        return Err(not_a_name("workflow name", &name, "a DNS-1123 subdomain"));
    }
    let (api, source) = (call.api, call.source);
    let (who, body) = call.authenticate().await?;
    let asker = who.asker();
    let caller = api
        .auth
        .acting_as(&api.reviews, source, who, &namespace)
        .await?;
    let asker = acting(asker, &caller);
    let options = body.options();
    // Argo's server reads the workflow, updates it and deletes its pods as
    // the caller.
    auth::authorize(
        &api.reviews,
        source,
        &caller,
        &permissions(["get", "update"], &namespace, Some(&name)),
        "Argo's server needs of the caller to retry a workflow (`argo retry`)",
    )
    .await?;
    let workflows: Api<Workflow> = Api::namespaced(api.client.clone(), &namespace);
    // Argo's server reads the workflow first: a missing one is NotFound, in
    // its words, before anything is written. Read from the watch cache: a
    // read from etcd would decode the whole (large) workflow.
    match workflows.get_metadata_with(&name, &GetParams::any()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(not_asked(FollowError::NotFound {
                namespace: namespace.clone(),
                workflow: name,
            })
            .into());
        }
        Err(source) => {
            return Err(not_asked(FollowError::Read {
                namespace: namespace.clone(),
                workflow: name,
                source,
            })
            .into());
        }
    }
    // An object per call: Argo's clients make one call per workflow (`argo
    // retry -l` too, one after another), so each call is its own asker.
    let retries: Api<WorkflowRetry> = Api::namespaced(api.client.clone(), &namespace);
    let (asked, _) = ask::ask_object(
        &retries,
        &namespace,
        ask::Target::Live(&name),
        &options,
        api.ttl,
        Some(&asker),
        false,
    )
    .await
    .map_err(not_asked)?;
    log_asked(&caller, &asked);
    let (_, status) = follow_to_end(api, asked).await?;
    Ok(read_workflow(&workflows, &namespace, &name, &status).await?)
}

async fn retry_archived(call: Call<'_>, uid: String) -> Result<Workflow, Response> {
    if !names::is_uid(&uid) {
        return Err(not_a_name(
            "archived workflow UID",
            &uid,
            "a Kubernetes UID",
        ));
    }
    let (api, source) = (call.api, call.source);
    let (who, body) = call.authenticate().await?;
    let namespace = body.namespace.trim().to_owned();
    if namespace.is_empty() {
        // Argo's server creates the workflow in the request's namespace too,
        // and fails without one; its clients always send it.
        return Err(Status::new(
            Code::InvalidArgument,
            "the request names no namespace: an archived retry creates the workflow in the namespace the request names (`argo archive retry UID -n NAMESPACE`)",
        )
        .into_response());
    }
    if !names::is_namespace(&namespace) {
        return Err(not_a_name("namespace", &namespace, "a DNS-1123 label"));
    }
    let asker = who.asker();
    let caller = api
        .auth
        .acting_as(&api.reviews, source, who, &namespace)
        .await?;
    let asker = acting(asker, &caller);
    // Argo's server reads the archived workflow as the caller (get),
    // deletes its leftover pods and creates it again as the caller.
    auth::authorize(
        &api.reviews,
        source,
        &caller,
        &permissions(["get", "create"], &namespace, None),
        "Argo's server needs of the caller to retry an archived workflow (`argo archive retry`)",
    )
    .await?;
    let retries: Api<WorkflowRetry> = Api::namespaced(api.client.clone(), &namespace);
    let (asked, _) = ask::ask_object(
        &retries,
        &namespace,
        ask::Target::Archived(&uid),
        &body.options(),
        api.ttl,
        Some(&asker),
        false,
    )
    .await
    .map_err(not_asked)?;
    log_asked(&caller, &asked);
    let (asked, status) = follow_to_end(api, asked).await?;
    let workflows: Api<Workflow> = Api::namespaced(api.client.clone(), &namespace);
    Ok(read_workflow(&workflows, &namespace, &asked.workflow, &status).await?)
}

/// Who asked, and the account Argo's server acts as for them when it is
/// another (an SSO user's).
fn acting(mut asker: AskedBy, caller: &Identity) -> AskedBy {
    if caller.user != asker.user {
        asker.acting_as = Some(caller.user.clone());
    }
    asker
}

fn log_asked(caller: &Identity, asked: &ask::Asked) {
    info!(
        user = caller.user,
        how = caller.how,
        namespace = asked.namespace,
        workflow = asked.workflow,
        request = asked.token,
        "retry asked through Argo's API"
    );
}

/// The answer to a request that could not be asked.
fn not_asked(e: FollowError) -> Status {
    match &e {
        // Argo's words for a workflow it cannot find (the API server's).
        FollowError::NotFound {
            namespace: _,
            workflow,
        } => Status::new(
            Code::NotFound,
            format!("workflows.argoproj.io \"{workflow}\" not found"),
        ),
        FollowError::Ask { source, .. }
        | FollowError::Create { source, .. }
        | FollowError::Read { source, .. } => Status::new(code_of(source), e.to_string()),
        _ => Status::new(Code::Internal, e.to_string()),
    }
}

fn code_of(e: &kube::Error) -> Code {
    match fault::api_code(e) {
        Some(http) => Code::from_http(http),
        None if fault::is_transient(e) => Code::Unavailable,
        None => Code::Internal,
    }
}

/// Follows `asked` until the controller reports its end; the request as
/// last known (an archived retry's workflow is named by then) and its end.
async fn follow_to_end(
    api: &ArgoApi,
    asked: ask::Asked,
) -> Result<(ask::Asked, RetryStatus), Status> {
    let mut follower = Follower::new(api.client.clone(), asked);
    loop {
        match follower.poll().await {
            Ok(observed) if observed.is_finished() => {
                return ended(observed).map(|s| (follower.asked().clone(), s));
            }
            Ok(_) => {}
            // A read that may pass is read again at the next turn.
            Err(FollowError::Read { source, .. } | FollowError::ReadRetry { source, .. })
                if fault::is_transient(&source) => {}
            Err(e) => return Err(Status::new(Code::Aborted, e.to_string())),
        }
        if follower.unanswered_for(NO_CONTROLLER) {
            return Err(Status::new(
                Code::Unavailable,
                follow::no_controller_message(follower.asked(), NO_CONTROLLER),
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A finished request as the call answers it: its status when it succeeded,
/// else the error Argo's server would give.
fn ended(observed: Observed) -> Result<RetryStatus, Status> {
    match observed {
        Observed::Status(status) if status.phase == RetryPhase::Succeeded => Ok(status),
        Observed::Status(status) => Err(failed(&status)),
        Observed::Replaced { by } => Err(Status::new(
            Code::Aborted,
            format!(
                "a newer retry request ({by}) replaced this one before it ran; the workflow is retried by that one"
            ),
        )),
        Observed::NotYet => unreachable!("a finished request has a status"),
    }
}

/// A failed request's error. Its message is Argo's words then rewind's hint,
/// as the controller wrote it. A request that failed before any pod was
/// planned was refused: Argo's server refuses those (a phase that cannot be
/// retried, a bad selector or parameter) as bad requests, InvalidArgument;
/// one that failed on the way is Internal, as Argo's are. An archived
/// workflow live again is AlreadyExists, as Argo's server answers it whether
/// it was there before the call or created by another meanwhile.
fn failed(status: &RetryStatus) -> Status {
    let code = if status.message.starts_with(DENIED) {
        Code::PermissionDenied
    } else if status.message.starts_with(EXISTS) {
        Code::AlreadyExists
    } else if status.pods_total == 0 {
        Code::InvalidArgument
    } else {
        Code::Internal
    };
    Status::new(code, status.message.clone())
}

/// The workflow the retry reset or created, as Argo's call answers with it.
async fn read_workflow(
    workflows: &Api<Workflow>,
    namespace: &str,
    name: &str,
    status: &RetryStatus,
) -> Result<Workflow, Status> {
    workflows.get(name).await.map_err(|e| {
        Status::new(
            code_of(&e),
            format!(
                "the retry succeeded ({}), but reading workflow {namespace}/{name} afterwards failed: {}",
                status.message,
                fault::explain(&e)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: RetryPhase, total: u64, message: &str) -> RetryStatus {
        RetryStatus {
            token: "1".into(),
            phase,
            pods_total: total,
            pods_deleted: 0,
            message: message.into(),
            started_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn a_request_ends_as_argos_call_would() {
        let done = status(RetryPhase::Succeeded, 3, "deleted 3 pods");
        assert_eq!(ended(Observed::Status(done.clone())), Ok(done));
        let refused = ended(Observed::Status(status(
            RetryPhase::Failed,
            0,
            "Cannot retry a workflow in phase Running — the workflow is still running",
        )))
        .unwrap_err();
        assert_eq!(refused.code, Code::InvalidArgument);
        assert!(
            refused
                .message
                .starts_with("Cannot retry a workflow in phase Running")
        );
        let broke = ended(Observed::Status(status(
            RetryPhase::Failed,
            5,
            "deleting failed",
        )));
        assert_eq!(broke.unwrap_err().code, Code::Internal);
        // Created by another request while this one deleted: as before the call.
        for planned in [0, 5] {
            let exists = ended(Observed::Status(status(
                RetryPhase::Failed,
                planned,
                "Workflow already exists on cluster, use argo retry wf instead",
            )));
            assert_eq!(exists.unwrap_err().code, Code::AlreadyExists);
        }
        // An archived UID of another namespace: 403 as in Argo.
        let elsewhere = ended(Observed::Status(status(
            RetryPhase::Failed,
            0,
            "permission denied: archived workflow 0e6c-… is not in namespace team; ask in the namespace it ran in",
        )));
        assert_eq!(elsewhere.unwrap_err().code, Code::PermissionDenied);
        let replaced = ended(Observed::Replaced { by: "9".into() }).unwrap_err();
        assert_eq!(replaced.code, Code::Aborted);
        assert!(replaced.message.contains("(9)"));
    }

    #[test]
    fn a_request_that_cannot_be_asked_answers_with_argos_words() {
        let missing = not_asked(FollowError::NotFound {
            namespace: "ns".into(),
            workflow: "wf".into(),
        });
        assert_eq!(
            missing,
            Status::new(Code::NotFound, "workflows.argoproj.io \"wf\" not found")
        );
    }
}
