//! The requests the engine makes about a workflow's pods besides single
//! deletes: listing them for an assessment, deleting them in bulk, and
//! watching a bulk delete remove them.
//!
//! All ask the API server for metadata only, and lists come in pages, so
//! what rewind holds grows with the pods' names and labels, not with the
//! pods.

use std::collections::BTreeSet;

use futures::stream::{BoxStream, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::{Client, Resource as _};
use tokio_util::compat::FuturesAsyncReadCompatExt as _;

use crate::argo::workflow::labels;
use crate::engine::assess::{Listed, SUCCEEDED};

/// The media type that asks the API server for a list of object metadata only.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// Pods per page of a list, as client-go's pager: a page is one read of the
/// budget and a bounded answer to hold.
const PAGE: u32 = 500;

/// A list's pods, and the revision it was read at.
pub struct Snapshot {
    pub pods: Vec<Listed>,
    pub revision: Option<String>,
}

/// Lists the pods labelled with `workflow` for an assessment of the plan
/// `plan` (see [`crate::engine::assess`]).
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
) -> Result<Snapshot, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let by_workflow = ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    let unsucceeded = by_workflow
        .clone()
        .fields(&format!("status.phase!={SUCCEEDED}"));
    let (mut listed, revision) = list_pages(&pods, unsucceeded, false).await?;
    let seen: BTreeSet<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    if plan.iter().all(|name| seen.contains(name.as_str())) {
        return Ok(Snapshot {
            pods: listed,
            revision,
        });
    }
    let mut succeeded = by_workflow.fields(&format!("status.phase={SUCCEEDED}"));
    if let Some(rv) = revision.as_deref() {
        succeeded = succeeded.at(rv).matching(VersionMatch::NotOlderThan);
    }
    listed.extend(list_pages(&pods, succeeded, true).await?.0);
    Ok(Snapshot {
        pods: listed,
        revision,
    })
}

/// The name and UID of each pod labelled with `workflow` that the API server
/// removes from `revision` on, as it removes them: how a bulk delete, one
/// request the server carries out pod by pod, shows its progress. A metadata
/// watch, each event decoded for the name and UID alone (the rest of the
/// metadata skipped unread: 20,000 events of full metadata cost seconds of
/// CPU). The stream ends where the watch does (its timeout, an error, a
/// revision compacted away).
pub async fn watch_deletions(
    client: &Client,
    namespace: &str,
    workflow: &str,
    revision: &str,
) -> Result<BoxStream<'static, (String, String)>, kube::Error> {
    let url = Pod::url_path(&(), Some(namespace));
    let params = WatchParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    let request = kube::core::Request::new(url)
        .watch_metadata(&params, revision)
        .map_err(kube::Error::BuildRequest)?;
    let events = client.request_events::<Removed>(request).await?;
    Ok(events
        .take_while(|e| {
            std::future::ready(matches!(e, Ok(e) if !matches!(e, WatchEvent::Error(_))))
        })
        .filter_map(|e| {
            std::future::ready(match e {
                Ok(WatchEvent::Deleted(Removed { metadata })) => metadata.name.zip(metadata.uid),
                _ => None,
            })
        })
        .boxed())
}

/// What [`watch_deletions`] reads of a watch event's object.
#[derive(Clone, serde::Deserialize)]
struct Removed {
    #[serde(default)]
    metadata: RemovedMeta,
}

#[derive(Clone, Default, serde::Deserialize)]
struct RemovedMeta {
    name: Option<String>,
    uid: Option<String>,
}

/// Every page of a metadata list (one consistent snapshot: a continue token
/// pins the first page's revision), each pod kept as [`Listed`]; also that
/// revision.
async fn list_pages(
    pods: &Api<Pod>,
    params: ListParams,
    succeeded: bool,
) -> Result<(Vec<Listed>, Option<String>), kube::Error> {
    let mut listed = Vec::new();
    let mut revision = None;
    let mut page = params.clone().limit(PAGE);
    loop {
        let answer = pods.list_metadata(&page).await?;
        revision.get_or_insert(answer.metadata.resource_version);
        listed.extend(
            answer
                .items
                .into_iter()
                .filter_map(|p| Listed::new(p.metadata, succeeded)),
        );
        match answer.metadata.continue_.filter(|c| !c.is_empty()) {
            // A continued list may not name a revision: its token carries one.
            Some(token) => {
                page = ListParams {
                    resource_version: None,
                    version_match: None,
                    ..params.clone()
                }
                .limit(PAGE)
                .continue_token(&token)
            }
            None => return Ok((listed, revision.flatten())),
        }
    }
}

/// The part of a DeleteCollection response rewind reads: how many pods it
/// removed. The items are skipped as they are read, not kept (a vector of a
/// zero-sized type allocates nothing).
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
    // Read as it arrives rather than held whole: the answer for 20,000 pods is
    // tens of megabytes of metadata, of which rewind needs only the count.
    let answer = client.request_stream(request).await?.compat();
    let answer = tokio_util::io::SyncIoBridge::new(answer);
    let counted = tokio::task::spawn_blocking(move || {
        serde_json::from_reader::<_, DeletedPods>(std::io::BufReader::new(answer))
    })
    .await
    .map_err(|e| kube::Error::Service(Box::new(e)))?;
    match counted {
        Ok(deleted) => Ok(deleted.items.len()),
        // The connection broke while the answer came: the request was cut short.
        Err(e) if e.is_io() => Err(kube::Error::Service(Box::new(e))),
        Err(e) => Err(kube::Error::SerdeError(e)),
    }
}
