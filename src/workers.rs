//! Delete workers: take items from the queue, send one API request each, and
//! report the outcome to the request that queued the item.
//!
//! Every request goes through the budgeted client, so the number of workers
//! bounds concurrency while the token bucket bounds the rate.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions, VersionMatch};
use kube::client::retry::RetryPolicy;
use kube::{Client, Resource as _};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::budget::Budget;
use crate::delete::{DeleteWork, Listed, SUCCEEDED};
use crate::queue::{Lease, WorkQueue};
use crate::workflow::labels;

/// A queued unit of work: one API request in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkItem {
    pub namespace: String,
    pub work: DeleteWork,
}

/// Identifies the request (a retry, or a GC sweep) that queued an item.
pub type RequestKey = Arc<str>;

pub type Queue = WorkQueue<WorkItem, RequestKey>;

/// What happened to one item.
#[derive(Debug)]
pub struct Outcome {
    pub item: WorkItem,
    pub result: Result<Done, WorkError>,
}

/// An item that needs no more work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// The request removed this many pods (or released their finalizers).
    Deleted(usize),
    /// The pod was already gone.
    AlreadyGone,
    /// The pod under that name has another UID now: the planned pod is gone
    /// and the new one must not be touched.
    Replaced,
    /// A bulk request ended without an answer naming what it removed: the API
    /// server cut it at its request timeout (504), failed part way (500), or
    /// the connection broke. Some of its pods may be gone. It is not sent
    /// again as it was: the request lists the pods again and decides anew.
    Unfinished,
}

/// An item that failed for good (after retries, or at once for errors that
/// retrying cannot fix, such as missing RBAC).
#[derive(Debug, thiserror::Error)]
#[error("{action} in namespace {namespace} failed: {source}")]
pub struct WorkError {
    pub action: String,
    pub namespace: String,
    #[source]
    pub source: kube::Error,
}

/// Where workers send outcomes: one channel per request.
#[derive(Clone, Default)]
pub struct Outcomes {
    senders: Arc<Mutex<HashMap<RequestKey, mpsc::UnboundedSender<Outcome>>>>,
}

impl Outcomes {
    /// Registers a request; its outcomes arrive on the returned receiver
    /// until [`Outcomes::unregister`].
    pub fn register(&self, key: RequestKey) -> mpsc::UnboundedReceiver<Outcome> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().insert(key, tx);
        rx
    }

    pub fn unregister(&self, key: &RequestKey) {
        self.lock().remove(key);
    }

    fn send(&self, key: &RequestKey, outcome: Outcome) {
        if let Some(tx) = self.lock().get(key) {
            // A request that stopped listening has nothing left to learn.
            let _ = tx.send(outcome);
        }
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<RequestKey, mpsc::UnboundedSender<Outcome>>> {
        self.senders.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The media type that asks the API server for a list of object metadata only.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// Attempts per item before a transient error is reported as a failure.
const MAX_ATTEMPTS: u32 = 8;

/// Whose turn it is to take an item: one worker at a time leases an item and then waits for
/// its write token, so an interactive item queued meanwhile waits behind at most that one
/// item, not one per worker, and other writes (events, status, commits) queue behind at
/// most one worker in the budget's line.
pub type Turn = Arc<tokio::sync::Mutex<()>>;

/// Queued items per buffer in front of kube's HTTP service, as in [`crate::budget::client`].
const BUFFER: usize = 1024;

/// The client for DeleteCollection: the budget's ([`crate::budget::client`]),
/// whose retry of 429, 503 and 504 leaves out 504. A bulk request cut by the
/// API server's request timeout may have removed part of its pods and was
/// proven exact against a list that is now old, so it is never resent as is
/// (see [`Done::Unfinished`]).
pub fn bulk_client(mut config: kube::Config, budget: &Budget) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::buffer::BufferLayer::new(BUFFER))
        .with_layer(&budget.layer())
        .with_layer(&tower::retry::RetryLayer::new(NotOnTimeout(
            RetryPolicy::server_retry(),
        )))
        .build())
}

/// kube's retry policy, except for a 504 (Gateway Timeout).
#[derive(Clone)]
struct NotOnTimeout(RetryPolicy);

impl<B> tower::retry::Policy<http::Request<kube::client::Body>, http::Response<B>, tower::BoxError>
    for NotOnTimeout
{
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut http::Request<kube::client::Body>,
        result: &mut Result<http::Response<B>, tower::BoxError>,
    ) -> Option<Self::Future> {
        match result {
            Ok(response) if response.status() == http::StatusCode::GATEWAY_TIMEOUT => None,
            _ => self.0.retry(request, result),
        }
    }

    fn clone_request(
        &mut self,
        request: &http::Request<kube::client::Body>,
    ) -> Option<http::Request<kube::client::Body>> {
        tower::retry::Policy::<_, http::Response<B>, _>::clone_request(&mut self.0, request)
    }
}

/// The clients a worker sends with: `client` for single pods, `bulk` (see
/// [`bulk_client`]) for DeleteCollection.
#[derive(Clone)]
pub struct Clients {
    pub client: Client,
    pub bulk: Client,
}

/// Runs one worker until the queue shuts down.
pub async fn run(clients: Clients, budget: Budget, turn: Turn, queue: Queue, outcomes: Outcomes) {
    loop {
        let (lease, token) = {
            let _turn = turn.lock().await;
            let Some(lease) = queue.next().await else {
                break;
            };
            (lease, budget.take_write_token().await)
        };
        let result = match token.spend_on(execute(&clients, &lease.item)).await {
            Err(e) if cut_short(&lease.item.work, &e) => {
                warn!(namespace = lease.item.namespace, work = %describe(&lease.item.work), error = %e, "bulk delete cut short; its pods will be listed again");
                Ok(Done::Unfinished)
            }
            result => result,
        };
        match result {
            Err(e) if is_transient(&e) && lease.failures + 1 < MAX_ATTEMPTS => {
                debug!(namespace = lease.item.namespace, work = ?lease.item.work, error = %e, "transient failure; requeued");
                queue.requeue(lease);
            }
            result => {
                queue.forget(&lease.item);
                let Lease { item, request, .. } = &lease;
                let result = result.map_err(|source| WorkError {
                    action: describe(&item.work),
                    namespace: item.namespace.clone(),
                    source,
                });
                if let Err(e) = &result {
                    warn!(error = %e, "delete work failed");
                }
                outcomes.send(
                    request,
                    Outcome {
                        item: item.clone(),
                        result,
                    },
                );
                queue.done(lease);
            }
        }
    }
}

/// Lists the pods labelled with `workflow` for [`crate::delete::assess`] of
/// the plan `plan`.
///
/// The assessment needs each pod's metadata and whether it succeeded; a
/// metadata list carries no phase, so metadata lists split by the bulk field
/// selector's own term give exactly that. First the pods not succeeded; a
/// succeeded pod matters only if it is planned (a bulk request never selects
/// one), so the succeeded ones are listed only when a plan pod is missing from
/// the first list. That second list is read from the API server's cache at
/// the first's revision or later: succeeded is a final phase, so a plan pod in
/// neither list was gone at one of the two revisions, which is all one list
/// could say. Full pods would carry their spec and status too, several times
/// the bytes to send and decode.
pub async fn list_workflow_pods(
    client: &Client,
    namespace: &str,
    workflow: &str,
    plan: &BTreeSet<String>,
) -> Result<Vec<Listed>, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let by_workflow = ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    let unsucceeded = pods
        .list_metadata(
            &by_workflow
                .clone()
                .fields(&format!("status.phase!={SUCCEEDED}")),
        )
        .await?;
    let revision = unsucceeded.metadata.resource_version;
    let mut listed: Vec<Listed> = unsucceeded
        .items
        .into_iter()
        .map(|p| Listed {
            meta: p.metadata,
            succeeded: false,
        })
        .collect();
    let seen: BTreeSet<&str> = listed
        .iter()
        .filter_map(|p| p.meta.name.as_deref())
        .collect();
    if plan.iter().all(|name| seen.contains(name.as_str())) {
        return Ok(listed);
    }
    let mut lp = by_workflow.fields(&format!("status.phase={SUCCEEDED}"));
    if let Some(rv) = revision.as_deref() {
        lp = lp.at(rv).matching(VersionMatch::NotOlderThan);
    }
    listed.extend(
        pods.list_metadata(&lp)
            .await?
            .items
            .into_iter()
            .map(|p| Listed {
                meta: p.metadata,
                succeeded: true,
            }),
    );
    Ok(listed)
}

/// The part of a DeleteCollection response rewind reads: how many pods it removed.
#[derive(serde::Deserialize)]
struct DeletedPods {
    #[serde(default)]
    items: Vec<serde::de::IgnoredAny>,
}

/// Sends one DeleteCollection of the pods in `namespace` that the selectors
/// pick; returns how many the server deleted. The benchmark's and the demo's
/// floor send it too, so they measure the very request rewind sends.
pub async fn delete_collection(
    client: &Client,
    namespace: &str,
    label_selector: &str,
    field_selector: &str,
) -> Result<usize, kube::Error> {
    let lp = ListParams::default()
        .labels(label_selector)
        .fields(field_selector);
    let mut request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)))
        .delete_collection(&DeleteParams::default(), &lp)
        .map_err(kube::Error::BuildRequest)?;
    // The server answers with every deleted pod; their metadata is plenty (a
    // count), a fraction of full pods to encode and decode.
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_LIST),
    );
    let deleted: DeletedPods = client.request(request).await?;
    Ok(deleted.items.len())
}

async fn execute(clients: &Clients, item: &WorkItem) -> Result<Done, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(clients.client.clone(), &item.namespace);
    match &item.work {
        DeleteWork::Bulk {
            label_selector,
            field_selector,
            ..
        } => {
            let deleted = delete_collection(
                &clients.bulk,
                &item.namespace,
                label_selector,
                field_selector,
            )
            .await?;
            Ok(Done::Deleted(deleted))
        }
        DeleteWork::Pod { name, uid } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match pods.delete(name, &dp).await {
                Ok(_) => Ok(Done::Deleted(1)),
                Err(e) => gone_or(e),
            }
        }
        DeleteWork::Finalizer { name, uid, index } => {
            // JSON patch `test` ops make this exact: only this pod, and only
            // Argo's finalizer, even if others were added or removed meanwhile.
            let path = format!("/metadata/finalizers/{index}");
            let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": path, "value": labels::POD_STATUS_FINALIZER},
                {"op": "remove", "path": path},
            ]))
            .expect("a well-formed JSON patch");
            match pods
                .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
            {
                Ok(_) => Ok(Done::Deleted(1)),
                Err(e) => gone_or(e),
            }
        }
    }
}

/// NotFound means done; a failed UID precondition (409) or `test` op (422)
/// means the pod under that name is not the one planned.
fn gone_or(e: kube::Error) -> Result<Done, kube::Error> {
    match api_code(&e) {
        Some(404) => Ok(Done::AlreadyGone),
        Some(409 | 422) => Ok(Done::Replaced),
        _ => Err(e),
    }
}

/// The HTTP status of an error the API server answered with.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Whether `e` ended bulk `work` in a way that may have removed part of its
/// pods: the request timeout (504), a server error (500), a broken
/// connection. Throttling (429, 503) refuses a request before it runs.
fn cut_short(work: &DeleteWork, e: &kube::Error) -> bool {
    let cut = match e {
        kube::Error::Api(status) => matches!(status.code, 500 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    };
    cut && matches!(work, DeleteWork::Bulk { .. })
}

/// Errors worth another try: throttling, server trouble, the network.
pub fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

fn describe(work: &DeleteWork) -> String {
    match work {
        DeleteWork::Bulk {
            workflow,
            label_selector,
            field_selector,
            pods,
        } => format!(
            "deleting the {} pods of workflow {workflow} with labels {label_selector} and fields {field_selector}",
            pods.len()
        ),
        DeleteWork::Pod { name, .. } => format!("deleting pod {name}"),
        DeleteWork::Finalizer { name, .. } => format!(
            "removing finalizer {} from pod {name}",
            labels::POD_STATUS_FINALIZER
        ),
    }
}
