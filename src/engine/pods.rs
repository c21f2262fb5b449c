//! The requests the engine makes about a workflow's pods besides single
//! deletes: listing them for an assessment, deleting them in bulk, and
//! watching a bulk delete remove them.
//!
//! All ask the API server for metadata only, and lists come in pages, so
//! what rewind holds grows with the pods' names and labels, not with the
//! pods.

use std::collections::BTreeSet;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt as _};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, VersionMatch, WatchParams};
use kube::{Client, Resource as _};
use prost::Message as _;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::compat::FuturesAsyncReadCompatExt as _;
use tokio_util::io::StreamReader;

use crate::argo::workflow::labels;
use crate::engine::assess::{Listed, SUCCEEDED};

/// The media type that asks the API server for a list of object metadata only.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// Pods per page of a list (see [`protobuf_pages`]).
const PAGE: u32 = 500;

/// A list's pods, and the revision it was read at.
pub struct Snapshot {
    pub pods: Vec<Listed>,
    pub revision: Option<String>,
}

/// Lists the pods labelled with `workflow` for an assessment of a plan
/// (see [`crate::engine::assess`]) whose pods `wanted` are still to be found:
/// all of them, or those not yet seen gone.
///
/// The assessment needs each pod's metadata and whether it succeeded; a
/// metadata list carries no phase, so metadata lists split by the bulk field
/// selector's own term give exactly that. First the pods not succeeded; a
/// succeeded pod matters only if it is planned (a bulk request never selects
/// one), so the succeeded ones are listed only when a pod of `wanted` is
/// missing from the first list: a list that confirms the plan gone always
/// reads them, one that finds pods still to delete (or held) need not page
/// through a large workflow's succeeded pods. That second list is read from
/// the API server's cache at the first's revision or later: succeeded is a
/// final phase, so a plan pod in neither list was gone at one of the two
/// revisions, which is all one list could say. Full pods would carry their spec and status too, several times
/// the bytes to send and decode.
///
/// With `at`, both lists show the pods exactly as they were at that revision
/// (which etcd keeps until its compaction, about 5 minutes; later the API
/// server answers 410 Gone).
pub async fn list_workflow_pods(
    client: &Client,
    namespace: &str,
    workflow: &str,
    wanted: &BTreeSet<String>,
    at: Option<&str>,
) -> Result<Snapshot, kube::Error> {
    let mut by_workflow = ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    if let Some(revision) = at {
        by_workflow = by_workflow.at(revision).matching(VersionMatch::Exact);
    }
    let unsucceeded = by_workflow
        .clone()
        .fields(&format!("status.phase!={SUCCEEDED}"));
    let (mut listed, revision) = list_pages(client, namespace, unsucceeded, false).await?;
    let seen: BTreeSet<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    if wanted.iter().all(|name| seen.contains(name.as_str())) {
        return Ok(Snapshot {
            pods: listed,
            revision,
        });
    }
    let mut succeeded = by_workflow.fields(&format!("status.phase={SUCCEEDED}"));
    if let (None, Some(rv)) = (at, revision.as_deref()) {
        succeeded = succeeded.at(rv).matching(VersionMatch::NotOlderThan);
    }
    listed.extend(list_pages(client, namespace, succeeded, true).await?.0);
    Ok(Snapshot {
        pods: listed,
        revision,
    })
}

/// What the watch of a workflow's pods reports of one pod: the API server
/// removed it, or Argo labelled it completed=true (it has finished with it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodEvent {
    Removed { name: String, uid: String },
    Settled { name: String, uid: String },
}

/// The pods labelled with `workflow` that the API server removes, or that
/// Argo labels completed=true, from `revision` on, as it happens: how a bulk
/// delete, one request the server carries out pod by pod, shows its
/// progress, and how a deletion learns that Argo has finished with a pod it
/// waits for (see [`crate::engine::assess::Assessment::settle`]). A metadata
/// watch in protobuf: the server encodes an event for each pod while it
/// deletes them, and its protobuf encoder costs it about a third less CPU
/// than its JSON one (bench/README.md, "Progress and its cost"). The stream ends
/// where the watch does (its timeout, an error, a revision compacted away).
pub async fn watch_pods(
    client: &Client,
    namespace: &str,
    workflow: &str,
    revision: &str,
) -> Result<BoxStream<'static, PodEvent>, kube::Error> {
    let url = Pod::url_path(&(), Some(namespace));
    let params = WatchParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW));
    let request = kube::core::Request::new(url)
        .watch_metadata(&params, revision)
        .map_err(kube::Error::BuildRequest)?;
    let answer = send_protobuf(client, request, PROTOBUF_METADATA, "the watch").await?;
    let body = StreamReader::new(
        answer
            .into_body()
            .into_data_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other)),
    );
    let frames = FramedRead::new(
        body,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_EVENT)
            .new_codec(),
    );
    Ok(frames
        .map(|frame| frame.ok().and_then(|f| pod_event(f.freeze())))
        .take_while(|event| std::future::ready(event.is_some()))
        .filter_map(|event| std::future::ready(event.flatten()))
        .boxed())
}

/// Asks for a watch's objects as metadata, in protobuf.
const PROTOBUF_METADATA: &str =
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// The largest watch event read: a pod's metadata is a few KiB, its
/// annotations at most 256 KiB; past this the watch ends (progress then
/// waits for the bulk request's answer).
const MAX_EVENT: usize = 1024 * 1024;

/// The prefix of a protobuf-encoded Kubernetes object, before its envelope.
const PROTOBUF_MAGIC: &[u8] = b"k8s\0";

/// What one frame of a protobuf metadata watch says: `None` ends the watch
/// (an ERROR event, or a frame that is not an event), `Some(None)` is an event
/// that reports nothing (another change, a removal without a name or UID),
/// `Some(Some(event))` a pod removed or labelled completed=true.
///
/// The frame is a `metav1.WatchEvent` (framed by its length, without the
/// magic prefix); its object is a `runtime.Unknown` envelope after the magic
/// prefix, holding a `PartialObjectMetadata`. A removal's is read for its name
/// and UID only (one arrives per pod a bulk delete removes); a change's for
/// its labels too.
fn pod_event(frame: Bytes) -> Option<Option<PodEvent>> {
    let event = proto::WatchEvent::decode(frame).ok()?;
    let object = || unwrapped(event.object.clone()?.raw);
    match event.r#type.as_str() {
        "DELETED" => {
            let metadata = proto::Removed::decode(object()?).ok()?.metadata?;
            Some(
                metadata
                    .name
                    .zip(metadata.uid)
                    .map(|(name, uid)| PodEvent::Removed { name, uid }),
            )
        }
        "MODIFIED" => {
            let metadata = proto::Changed::decode(object()?).ok()?.metadata?;
            let settled =
                metadata.labels.get(labels::COMPLETED).map(String::as_str) == Some("true");
            Some(
                metadata
                    .name
                    .zip(metadata.uid)
                    .filter(|_| settled)
                    .map(|(name, uid)| PodEvent::Settled { name, uid }),
            )
        }
        "ERROR" => None,
        _ => Some(None),
    }
}

/// What a protobuf-encoded object holds: after the magic prefix, a
/// `runtime.Unknown` envelope; `None` for anything else.
fn unwrapped(object: Bytes) -> Option<Bytes> {
    if !object.starts_with(PROTOBUF_MAGIC) {
        return None;
    }
    let envelope = proto::Unknown::decode(object.slice(PROTOBUF_MAGIC.len()..)).ok()?;
    Some(envelope.raw)
}

/// The fields a removal and a list are read from, as numbered in
/// Kubernetes' protobuf messages (`k8s.io/apimachinery`'s `generated.proto`);
/// protobuf skips the others unread. Kubernetes publishes no Rust types for
/// its protobuf messages short of a generated crate for the whole API, so the
/// few read here are declared here.
mod proto {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
    use k8s_openapi::jiff::Timestamp;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchEvent {
        #[prost(string, tag = "1")]
        pub r#type: String,
        #[prost(message, optional, tag = "2")]
        pub object: Option<RawExtension>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawExtension {
        #[prost(bytes = "bytes", tag = "1")]
        pub raw: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unknown {
        #[prost(bytes = "bytes", tag = "2")]
        pub raw: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(string, optional, tag = "3")]
        pub message: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub reason: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PartialObjectMetadataList {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ListMeta>,
        #[prost(message, repeated, tag = "2")]
        pub items: Vec<PartialObjectMetadata>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListMeta {
        #[prost(string, optional, tag = "2")]
        pub resource_version: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub r#continue: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PartialObjectMetadata {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
    }

    /// A watch event's `PartialObjectMetadata` as a removal reads it: the
    /// name and UID only, as one arrives per pod a bulk delete removes (the
    /// other fields are skipped unread, not decoded into maps).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Removed {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<Named>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Named {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub uid: Option<String>,
    }

    /// A watch event's `PartialObjectMetadata` as a change reads it: the
    /// name, UID and labels (whether Argo labelled it completed).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Changed {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<Labelled>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Labelled {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub uid: Option<String>,
        #[prost(btree_map = "string, string", tag = "11")]
        pub labels: BTreeMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ObjectMeta {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub uid: Option<String>,
        #[prost(message, optional, tag = "9")]
        pub deletion_timestamp: Option<Time>,
        #[prost(btree_map = "string, string", tag = "11")]
        pub labels: BTreeMap<String, String>,
        #[prost(btree_map = "string, string", tag = "12")]
        pub annotations: BTreeMap<String, String>,
        #[prost(message, repeated, tag = "13")]
        pub owner_references: Vec<OwnerReference>,
        #[prost(string, repeated, tag = "14")]
        pub finalizers: Vec<String>,
    }

    /// To the second: JSON carries no more (its nanoseconds, tag 2, are
    /// skipped), and what the assessment reads must not depend on the format.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Time {
        #[prost(int64, optional, tag = "1")]
        pub seconds: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OwnerReference {
        #[prost(string, optional, tag = "4")]
        pub uid: Option<String>,
    }

    /// The fields read, as kube's own type holds them: what
    /// [`Listed::new`](crate::engine::assess::Listed::new) takes, from a
    /// JSON answer or this one.
    impl From<ObjectMeta> for meta::ObjectMeta {
        fn from(m: ObjectMeta) -> Self {
            let some_map = |map: BTreeMap<String, String>| (!map.is_empty()).then_some(map);
            meta::ObjectMeta {
                name: m.name,
                uid: m.uid,
                deletion_timestamp: m.deletion_timestamp.map(|t| {
                    meta::Time(
                        Timestamp::from_second(t.seconds.unwrap_or_default()).unwrap_or_default(),
                    )
                }),
                labels: some_map(m.labels),
                annotations: some_map(m.annotations),
                owner_references: (!m.owner_references.is_empty()).then(|| {
                    m.owner_references
                        .into_iter()
                        .map(|o| meta::OwnerReference {
                            uid: o.uid.unwrap_or_default(),
                            ..Default::default()
                        })
                        .collect()
                }),
                finalizers: (!m.finalizers.is_empty()).then_some(m.finalizers),
                ..Default::default()
            }
        }
    }
}

/// Every page of a metadata list (one consistent snapshot: a continue token
/// pins the first page's revision), each pod kept as [`Listed`]; also that
/// revision.
async fn list_pages(
    client: &Client,
    namespace: &str,
    params: ListParams,
    succeeded: bool,
) -> Result<(Vec<Listed>, Option<String>), kube::Error> {
    let mut listed = Vec::new();
    let revision = protobuf_pages(client, namespace, params, Some(PAGE), |meta| {
        listed.extend(Listed::new(meta.into(), succeeded));
    })
    .await?;
    Ok((listed, revision))
}

/// The part of a DeleteCollection response rewind reads: how many pods it
/// removed. The items are skipped as they are read, not kept (a vector of a
/// zero-sized type allocates nothing). The API server writes `"items": null`
/// when the selectors took no pod.
#[derive(serde::Deserialize)]
struct DeletedPods {
    #[serde(default)]
    items: Option<Vec<serde::de::IgnoredAny>>,
}

impl DeletedPods {
    fn count(&self) -> usize {
        self.items.as_ref().map_or(0, Vec::len)
    }
}

/// The (name, UID) of every pod a DeleteCollection with these selectors
/// would take now: what a bulk request is re-proved against right before it
/// is sent. One unpaged list, so the snapshot is taken once, at its one read
/// of the budget: pages would each wait for a read token of their own while
/// the first page's revision, which pins them all, grows old (at 8,000 pods,
/// 16 pages). Only names and UIDs are kept of it.
pub async fn selected(
    client: &Client,
    namespace: &str,
    label_selector: &str,
    field_selector: &str,
) -> Result<Vec<(String, String)>, kube::Error> {
    let params = ListParams::default()
        .labels(label_selector)
        .fields(field_selector);
    let mut found = Vec::new();
    protobuf_pages(client, namespace, params, None, |meta| {
        // A pod without a UID (none is) would match no planned UID, so the
        // send would be refused: the proof errs on the side of not sending.
        found.extend(meta.name.map(|name| (name, meta.uid.unwrap_or_default())));
    })
    .await?;
    Ok(found)
}

/// Every page of a list of the pods in `namespace` that `params` picks, each
/// pod's metadata handed to `each`; returns the revision of the first page,
/// which its continue tokens pin. Pages of `page` pods as client-go's pager
/// makes them (a page is one read of the budget and a bounded answer to
/// hold), or one answer if `None`; in
/// protobuf: every list of a workflow's pods lies between a request and its
/// deletes, and the API server encodes a pod's metadata (its managed fields
/// included) with less CPU than in JSON (see [`watch_pods`]), of which
/// only the fields in `proto::ObjectMeta` are read.
async fn protobuf_pages(
    client: &Client,
    namespace: &str,
    params: ListParams,
    page_size: Option<u32>,
    mut each: impl FnMut(proto::ObjectMeta),
) -> Result<Option<String>, kube::Error> {
    let url = Pod::url_path(&(), Some(namespace));
    let limited = |params: ListParams| match page_size {
        Some(size) => params.limit(size),
        None => params,
    };
    let mut page = limited(params.clone());
    let mut revision = None;
    loop {
        let request = kube::core::Request::new(&url)
            .list(&page)
            .map_err(kube::Error::BuildRequest)?;
        let answer = send_protobuf(client, request, PROTOBUF_METADATA_LIST, "the list").await?;
        let body = answer.into_body().collect().await?.to_bytes();
        let list = metadata_list(body).ok_or_else(|| {
            let unread =
                kube::core::Status::failure("the API server's protobuf list could not be read", "");
            kube::Error::Api(unread.boxed())
        })?;
        let meta = list.metadata.unwrap_or_default();
        revision.get_or_insert(meta.resource_version);
        list.items
            .into_iter()
            .filter_map(|p| p.metadata)
            .for_each(&mut each);
        match meta.r#continue.filter(|c| !c.is_empty()) {
            // A continued list may not name a revision: its token carries one.
            Some(token) => {
                page = limited(ListParams {
                    resource_version: None,
                    version_match: None,
                    ..params.clone()
                })
                .continue_token(&token)
            }
            None => return Ok(revision.flatten()),
        }
    }
}

/// Sends `request` asking for its answer as `accept` (a protobuf media type);
/// an answer other than success is the API server's Status as an error, as
/// a JSON answer's would be: its message says what was refused and why (an
/// RBAC rule missing, say), its code is what callers decide on.
async fn send_protobuf(
    client: &Client,
    mut request: http::Request<Vec<u8>>,
    accept: &'static str,
    what: &str,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    request
        .headers_mut()
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
    let answer = client.send(request.map(Into::into)).await?;
    let code = answer.status();
    if code.is_success() {
        return Ok(answer);
    }
    let body = answer.into_body().collect().await?.to_bytes();
    Err(kube::Error::Api(
        refusal(&body, code.as_u16(), what).boxed(),
    ))
}

/// The Status an unsuccessful answer carries, in protobuf or (where the
/// server would not encode it as asked) JSON; one naming `what` and the
/// code when it carries none.
fn refusal(body: &Bytes, code: u16, what: &str) -> kube::core::Status {
    let from_protobuf = || {
        let status = proto::Status::decode(unwrapped(body.clone())?).ok()?;
        let message = status.message.filter(|m| !m.is_empty())?;
        Some(kube::core::Status::failure(
            &message,
            &status.reason.unwrap_or_default(),
        ))
    };
    let from_json = || serde_json::from_slice::<kube::core::Status>(body).ok();
    from_protobuf()
        .or_else(from_json)
        .unwrap_or_else(|| kube::core::Status::failure(&format!("{what} was refused"), ""))
        .with_code(code)
}

/// Asks for a list of object metadata in protobuf.
const PROTOBUF_METADATA_LIST: &str =
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// A protobuf list answer: the magic prefix, then a `runtime.Unknown`
/// envelope holding a `PartialObjectMetadataList`.
fn metadata_list(body: Bytes) -> Option<proto::PartialObjectMetadataList> {
    proto::PartialObjectMetadataList::decode(unwrapped(body)?).ok()
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
        Ok(deleted) => Ok(deleted.count()),
        // The connection broke while the answer came: the request was cut short.
        Err(e) if e.is_io() => Err(kube::Error::Service(Box::new(e))),
        Err(e) => Err(kube::Error::SerdeError(e)),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message as _;

    use super::{PROTOBUF_MAGIC, PodEvent, metadata_list, pod_event, proto, refusal};
    use crate::engine::assess::Listed;

    #[test]
    fn a_delete_collection_answer_counts_its_items_and_none_when_null() {
        let count = |answer: &str| {
            serde_json::from_str::<super::DeletedPods>(answer)
                .unwrap()
                .count()
        };
        let list = r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"7"}"#;
        assert_eq!(
            count(&format!(
                r#"{list},"items":[{{"metadata":{{"name":"a"}}}},{{}}]}}"#
            )),
            2
        );
        assert_eq!(count(&format!(r#"{list},"items":null}}"#)), 0);
        assert_eq!(count(&format!("{list}}}")), 0);
    }

    /// A watch frame as the API server writes it: the event, its object in
    /// the envelope after the magic prefix.
    fn frame(kind: &str, name: Option<&str>, uid: Option<&str>) -> Bytes {
        labelled(kind, name, uid, &[])
    }

    /// [`frame`], the pod carrying `labels`.
    fn labelled(
        kind: &str,
        name: Option<&str>,
        uid: Option<&str>,
        labels: &[(&str, &str)],
    ) -> Bytes {
        let metadata = proto::PartialObjectMetadata {
            metadata: Some(proto::ObjectMeta {
                name: name.map(str::to_owned),
                uid: uid.map(str::to_owned),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
        };
        let envelope = proto::Unknown {
            raw: metadata.encode_to_vec().into(),
        };
        let mut object = PROTOBUF_MAGIC.to_vec();
        object.extend(envelope.encode_to_vec());
        let event = proto::WatchEvent {
            r#type: kind.to_owned(),
            object: Some(proto::RawExtension { raw: object.into() }),
        };
        event.encode_to_vec().into()
    }

    #[test]
    fn reads_a_removal_and_ends_at_an_error() {
        assert_eq!(
            pod_event(frame("DELETED", Some("wf-1"), Some("u-1"))),
            Some(Some(PodEvent::Removed {
                name: "wf-1".to_owned(),
                uid: "u-1".to_owned()
            }))
        );
        // Other events are passed over; a removal without a name or UID counts nothing.
        assert_eq!(
            pod_event(frame("MODIFIED", Some("wf-1"), Some("u-1"))),
            Some(None)
        );
        assert_eq!(pod_event(frame("BOOKMARK", None, None)), Some(None));
        assert_eq!(pod_event(frame("DELETED", Some("wf-1"), None)), Some(None));
        // An error, or bytes that are no event, end the watch.
        assert_eq!(pod_event(frame("ERROR", None, None)), None);
        assert_eq!(pod_event(Bytes::from_static(b"\xff\xff\xff")), None);
        let mut unwrapped = frame("DELETED", Some("wf-1"), Some("u-1")).to_vec();
        unwrapped.truncate(unwrapped.len() - 3);
        assert_eq!(pod_event(unwrapped.into()), None);
    }

    #[test]
    fn reads_argos_completed_label_from_a_change() {
        let completed = |value| [(crate::argo::workflow::labels::COMPLETED, value)];
        assert_eq!(
            pod_event(labelled(
                "MODIFIED",
                Some("wf-1"),
                Some("u-1"),
                &completed("true")
            )),
            Some(Some(PodEvent::Settled {
                name: "wf-1".to_owned(),
                uid: "u-1".to_owned()
            }))
        );
        assert_eq!(
            pod_event(labelled(
                "MODIFIED",
                Some("wf-1"),
                Some("u-1"),
                &completed("false")
            )),
            Some(None)
        );
        // A pod added labelled already is one a list shows; a removal is a removal.
        assert_eq!(
            pod_event(labelled(
                "ADDED",
                Some("wf-1"),
                Some("u-1"),
                &completed("true")
            )),
            Some(None)
        );
        assert!(matches!(
            pod_event(labelled(
                "DELETED",
                Some("wf-1"),
                Some("u-1"),
                &completed("true")
            )),
            Some(Some(PodEvent::Removed { .. }))
        ));
    }

    #[test]
    fn reads_a_protobuf_list_page_its_names_uids_and_continue_token() {
        let pod = |name: &str, uid: &str| proto::PartialObjectMetadata {
            metadata: Some(proto::ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                ..Default::default()
            }),
        };
        let list = proto::PartialObjectMetadataList {
            metadata: Some(proto::ListMeta {
                resource_version: Some("7".to_owned()),
                r#continue: Some("next".to_owned()),
            }),
            items: vec![pod("wf-1", "u-1"), pod("wf-2", "u-2")],
        };
        let envelope = proto::Unknown {
            raw: list.encode_to_vec().into(),
        };
        let mut body = PROTOBUF_MAGIC.to_vec();
        body.extend(envelope.encode_to_vec());
        assert_eq!(metadata_list(body.into()), Some(list));
        // Without the prefix (a JSON answer, say) it is not read as a list.
        let json = Bytes::from_static(b"{\"kind\":\"PartialObjectMetadataList\"}");
        assert_eq!(metadata_list(json), None);
    }

    /// A pod's metadata read from a protobuf list is what the assessment
    /// would have read from a JSON one: the same `Listed`, terminating,
    /// owned and held by Argo's finalizer, or plain.
    #[test]
    fn a_protobuf_pod_is_listed_as_its_json_is() {
        let terminating = serde_json::json!({
            "name": "wf-1", "uid": "u-1", "resourceVersion": "9",
            "deletionTimestamp": "2026-12-06T22:00:05Z",
            "labels": {"workflows.argoproj.io/workflow": "wf", "workflows.argoproj.io/completed": "true"},
            "annotations": {"workflows.argoproj.io/node-id": "wf-1", "other": "x"},
            "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf", "uid": "w-1"}],
            "finalizers": ["example.com/hold", "workflows.argoproj.io/status"],
            "managedFields": [{"manager": "argo", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]
        });
        let encoded = proto::ObjectMeta {
            name: Some("wf-1".into()),
            uid: Some("u-1".into()),
            deletion_timestamp: Some(proto::Time {
                seconds: Some(1_796_594_405),
            }),
            labels: [
                ("workflows.argoproj.io/workflow", "wf"),
                ("workflows.argoproj.io/completed", "true"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
            annotations: [("workflows.argoproj.io/node-id", "wf-1"), ("other", "x")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            owner_references: vec![proto::OwnerReference {
                uid: Some("w-1".into()),
            }],
            finalizers: vec![
                "example.com/hold".into(),
                "workflows.argoproj.io/status".into(),
            ],
        };
        let plain = serde_json::json!({"name": "wf-2", "uid": "u-2"});
        let bare = proto::ObjectMeta {
            name: Some("wf-2".into()),
            uid: Some("u-2".into()),
            ..Default::default()
        };
        for (json, encoded) in [(terminating, encoded), (plain, bare)] {
            let from_json = Listed::new(serde_json::from_value(json).unwrap(), false);
            // Through the bytes, as the API server sends them.
            let decoded = proto::ObjectMeta::decode(Bytes::from(encoded.encode_to_vec())).unwrap();
            assert_eq!(Listed::new(decoded.into(), false), from_json);
        }
    }

    #[test]
    fn a_refusal_says_what_the_server_said_in_either_format() {
        let forbidden = "pods is forbidden: User \"u\" cannot list resource \"pods\"";
        let status = proto::Status {
            message: Some(forbidden.into()),
            reason: Some("Forbidden".into()),
        };
        let envelope = proto::Unknown {
            raw: status.encode_to_vec().into(),
        };
        let mut protobuf = PROTOBUF_MAGIC.to_vec();
        protobuf.extend(envelope.encode_to_vec());
        let json = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": forbidden, "reason": "Forbidden", "code": 403
        });
        for body in [protobuf, serde_json::to_vec(&json).unwrap()] {
            let said = refusal(&body.into(), 403, "the list");
            assert_eq!(
                (said.message.as_str(), said.reason.as_str(), said.code),
                (forbidden, "Forbidden", 403)
            );
        }
        // Nothing readable: what was refused, and the code.
        let said = refusal(&Bytes::from_static(b"<html>"), 503, "the list");
        assert_eq!(
            (said.message.as_str(), said.code),
            ("the list was refused", 503)
        );
    }

    #[test]
    fn an_object_without_the_magic_prefix_ends_the_watch() {
        let event = proto::WatchEvent {
            r#type: "DELETED".to_owned(),
            object: Some(proto::RawExtension {
                raw: Bytes::from_static(b"{\"metadata\":{}}"),
            }),
        };
        assert_eq!(pod_event(event.encode_to_vec().into()), None);
    }
}
