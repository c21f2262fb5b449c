//! Typed view of the parts of Argo's `Workflow` (argoproj.io/v1alpha1) that a
//! retry reads and writes.
//!
//! Every struct keeps the fields it does not name in `other`, so reading a
//! workflow and writing it back never drops a field: a retry must not lose
//! anything Argo (or a newer Argo) put there. Field names follow Argo's JSON
//! tags; optional fields are skipped when absent, as Go's `omitempty` does.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A node's short strings (IDs, names, phases, timestamps): up to 24 bytes
/// held inline, so most take no allocation of their own; a node has a dozen.
pub type Text = compact_str::CompactString;

/// Fields a struct does not name, kept verbatim as the text of one JSON
/// object: one allocation per struct, where a map of values costs a tree of
/// them. Held as values, with inputs and outputs parsed, 20,000 nodes of a
/// data pipeline (resource durations, pod IPs, artifacts with their keys)
/// took 152 MiB, 8 times their JSON (bench/README.md, "Memory by the nodes'
/// size and shape"). Equality is the fields' as values, in any order, as a
/// map of values compares (a database's JSON type gives keys back in its own
/// order).
#[derive(Clone, Debug, Default)]
pub struct Other(Option<Box<str>>);

impl PartialEq for Other {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0 || self.to_value() == other.to_value()
    }
}

impl Other {
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The fields as a JSON object, for the rare reader.
    pub fn to_value(&self) -> Map<String, Value> {
        self.0.as_deref().map_or_else(Map::new, |text| {
            serde_json::from_str(text).expect("kept fields are JSON this type wrote")
        })
    }
}

/// Where [`deserialize_streamed`] and [`Other`]'s own reader keep a field
/// the struct does not name.
trait Unnamed {
    fn keep<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        key: Cow<'de, str>,
        map: &mut A,
    ) -> Result<(), A::Error>;
}

impl Unnamed for Passed {
    fn keep<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        key: Cow<'de, str>,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let value = map.next_value()?;
        self.insert(key.into_owned(), value);
        Ok(())
    }
}

impl Unnamed for Other {
    /// Appends `"key":value` to the text, the value transcoded straight
    /// from the input; the text is kept at its exact size.
    fn keep<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        key: Cow<'de, str>,
        map: &mut A,
    ) -> Result<(), A::Error> {
        struct Transcode<'b>(&'b mut Vec<u8>);
        impl<'de> serde::de::DeserializeSeed<'de> for Transcode<'_> {
            type Value = ();
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                serde_transcode::transcode(d, &mut serde_json::Serializer::new(self.0))
                    .map_err(serde::de::Error::custom)
            }
        }
        let mut text = match self.0.take() {
            Some(text) => {
                let mut text = String::from(text).into_bytes();
                text.pop(); // the closing brace
                text.push(b',');
                text
            }
            None => vec![b'{'],
        };
        serde_json::to_writer(&mut text, &*key).map_err(serde::de::Error::custom)?;
        text.push(b':');
        map.next_value_seed(Transcode(&mut text))?;
        text.push(b'}');
        let text = String::from_utf8(text).map_err(serde::de::Error::custom)?;
        self.0 = Some(text.into_boxed_str());
        Ok(())
    }
}

impl<'de> Deserialize<'de> for Other {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Other;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Other, A::Error> {
                let mut other = Other::default();
                while let Some(Key(key)) = map.next_key()? {
                    other.keep(key, &mut map)?;
                }
                Ok(other)
            }
        }
        d.deserialize_map(Fields)
    }
}

impl Serialize for Other {
    /// The fields as entries of a map (the owner flattens them into its own),
    /// each value written as its kept text. A key written twice keeps its
    /// first place and its last value, as a map of values would.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let entries: indexmap::IndexMap<Cow<'_, str>, &RawValue> = match self.0.as_deref() {
            Some(text) => serde_json::from_str(text).map_err(serde::ser::Error::custom)?,
            None => indexmap::IndexMap::new(),
        };
        let mut map = s.serialize_map(Some(entries.len()))?;
        for (key, value) in &entries {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// Fields of the spec and status that rewind passes through unread, each
/// value kept as its JSON text ([`Opaque`]).
pub type Passed = indexmap::IndexMap<String, Opaque>;

/// A JSON value rewind passes through without reading it, held as its text.
/// A spec's templates list every task of a DAG: for 20,000 tasks, 12 MiB as a
/// value tree, 1 MiB as text. Transcoded as it is read, from any deserializer
/// (a value tree too), so the text is written anew as a value tree would
/// write it: same keys in the same order, numbers and escapes as serde_json
/// writes them.
#[derive(Clone, Debug)]
pub struct Opaque(Box<RawValue>);

impl Opaque {
    /// The value's JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The value as a tree, for the rare reader.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.get()).expect("an opaque value holds JSON it wrote")
    }
}

impl From<Value> for Opaque {
    fn from(value: Value) -> Self {
        Opaque(serde_json::value::to_raw_value(&value).expect("a JSON value serializes"))
    }
}

impl PartialEq for Opaque {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for Opaque {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Opaque {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut text = Vec::new();
        serde_transcode::transcode(d, &mut serde_json::Serializer::new(&mut text))
            .map_err(serde::de::Error::custom)?;
        let text = String::from_utf8(text).map_err(serde::de::Error::custom)?;
        RawValue::from_string(text)
            .map(Opaque)
            .map_err(serde::de::Error::custom)
    }
}

/// A value held as its JSON text ([`Opaque`]) and parsed as a `T` only
/// where a rule reads it: a node's inputs and outputs (parameters, artifacts
/// with their keys) are most of a rich node's size and almost never read.
/// Reading checks that the text parses as a `T`, so input a typed read would
/// refuse is refused as before. Equality is the values', keys in any order.
#[derive(Clone, Debug)]
pub struct Lazy<T> {
    text: Opaque,
    parsed: std::marker::PhantomData<fn() -> T>,
}

impl<T> PartialEq for Lazy<T> {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text || self.text.to_value() == other.text.to_value()
    }
}

impl<T: serde::de::DeserializeOwned + Serialize> Lazy<T> {
    pub fn new(value: &T) -> Self {
        let text = serde_json::value::to_raw_value(value).expect("the value serializes");
        Lazy {
            text: Opaque(text),
            parsed: std::marker::PhantomData,
        }
    }

    /// The value, parsed anew from its text.
    pub fn get(&self) -> T {
        serde_json::from_str(self.text.get()).expect("the text was checked to parse when read")
    }
}

impl<T> Serialize for Lazy<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.text.serialize(s)
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Lazy<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Opaque::deserialize(d)?;
        serde_json::from_str::<T>(text.get()).map_err(serde::de::Error::custom)?;
        Ok(Lazy {
            text,
            parsed: std::marker::PhantomData,
        })
    }
}

/// A workflow's node statuses by node ID. A `BTreeMap` so output is ordered
/// like Go's `encoding/json` orders map keys. Each node boxed: a map filled in
/// key order leaves its leaves about half empty, which costs a slot's size per
/// unused slot (over 300 bytes inline, 8 boxed; at 20,000 nodes, 7 MiB).
pub type Nodes = BTreeMap<String, Box<NodeStatus>>;

/// `Deserialize` for a struct that keeps the fields it does not name in
/// `other`, reading the object as it comes. Serde's `flatten` would first
/// buffer the whole object as a tree of its own (a workflow's status with
/// 20,000 nodes inline: some 20 MiB) and only then read the fields from it.
/// A missing field reads as in `Default` (what the fields' `default`
/// attributes say). `Serialize` stays derived: it writes `flatten` without a
/// buffer.
macro_rules! deserialize_streamed {
    ($ty:ident { $($key:literal => $field:ident),* $(,)? }) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Compiles only while every field of the struct is named
                // above: a field added there must get its key here too.
                let _ = |value: &$ty| {
                    let $ty { $($field: _,)* other: _ } = value;
                };
                struct Fields;
                impl<'de> serde::de::Visitor<'de> for Fields {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($ty), " object"))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<$ty, A::Error> {
                        let mut value = $ty::default();
                        while let Some(Key(key)) = map.next_key()? {
                            match &*key {
                                $($key => value.$field = map.next_value()?,)*
                                _ => value.other.keep(key, &mut map)?,
                            }
                        }
                        Ok(value)
                    }
                }
                d.deserialize_map(Fields)
            }
        }
    };
}

/// An object's key as [`deserialize_streamed`] reads it: borrowed from the
/// input where the input allows (no escapes in it), so that a named field
/// costs no allocation, as with a derived `Deserialize`; 20,000 nodes have a
/// quarter of a million keys.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
            fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        d.deserialize_str(Visitor)
    }
}

pub const GROUP: &str = "argoproj.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "argoproj.io/v1alpha1";
pub const KIND: &str = "Workflow";

/// Labels and annotations Argo puts on workflows and pods.
pub mod labels {
    /// On a pod: the name of the workflow that owns it.
    pub const WORKFLOW: &str = "workflows.argoproj.io/workflow";
    /// On a workflow or pod: "true" once it has completed.
    pub const COMPLETED: &str = "workflows.argoproj.io/completed";
    /// On a workflow: the archiving state (Pending, Archived, Persisted).
    pub const WORKFLOW_ARCHIVING_STATUS: &str = "workflows.argoproj.io/workflow-archiving-status";
    /// On a workflow: the workflow's phase (v3.7 retries set it to Running).
    pub const PHASE: &str = "workflows.argoproj.io/phase";
    /// On a resubmitted workflow: the workflow it was resubmitted from.
    pub const PREVIOUS_WORKFLOW_NAME: &str = "workflows.argoproj.io/resubmitted-from-workflow";
    /// Serve only workflows of one Argo controller instance.
    pub const CONTROLLER_INSTANCE_ID: &str = "workflows.argoproj.io/controller-instanceid";
    /// On a workflow: the pod name format, "v1" or "v2" (the default).
    pub const POD_NAME_FORMAT: &str = "workflows.argoproj.io/pod-name-format";
    /// On a pod: the ID of the node it runs.
    pub const NODE_ID: &str = "workflows.argoproj.io/node-id";
    /// On a pod: the name of the node it runs.
    pub const NODE_NAME: &str = "workflows.argoproj.io/node-name";
    /// The finalizer Argo's controller holds on pods until it has read their result.
    pub const POD_STATUS_FINALIZER: &str = "workflows.argoproj.io/status";
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workflow {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkflowSpec,
    #[serde(default, skip_serializing_if = "WorkflowStatus::is_empty")]
    pub status: WorkflowStatus,
    #[serde(flatten)]
    pub other: Other,
}

deserialize_streamed!(Workflow {
    "apiVersion" => api_version,
    "kind" => kind,
    "metadata" => metadata,
    "spec" => spec,
    "status" => status,
});

impl Default for Workflow {
    fn default() -> Self {
        Workflow {
            api_version: default_api_version(),
            kind: default_kind(),
            metadata: ObjectMeta::default(),
            spec: WorkflowSpec::default(),
            status: WorkflowStatus::default(),
            other: Other::default(),
        }
    }
}

fn default_api_version() -> String {
    API_VERSION.to_owned()
}

fn default_kind() -> String {
    KIND.to_owned()
}

impl k8s_openapi::Resource for Workflow {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = "workflows";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Workflow {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Workflow {
    /// The workflow's name, or "" when it has none (only in malformed input).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Arguments>,
    /// "Terminate" or "Stop" once someone asked the workflow to stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    #[serde(flatten)]
    pub other: Passed,
}

deserialize_streamed!(WorkflowSpec {
    "arguments" => arguments,
    "shutdown" => shutdown,
    "activeDeadlineSeconds" => active_deadline_seconds,
});

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Arguments {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Vec<Parameter>>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parameter {
    pub name: String,
    /// Argo's `AnyString`: a number or boolean is read as its text.
    #[serde(
        default,
        deserialize_with = "any_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<Opaque>,
    #[serde(flatten)]
    pub other: Other,
}

/// Argo's `AnyString.UnmarshalJSON`: numbers as Go's `FormatFloat(v, 'f',
/// -1, 64)` writes them (Rust's shortest round-trip `f64` display is the
/// same digits without exponent), booleans as "true"/"false", and any other
/// JSON value as "".
fn any_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Number(n)) => Some(n.as_f64().map(|f| f.to_string()).unwrap_or_default()),
        Some(Value::Bool(b)) => Some(b.to_string()),
        Some(_) => Some(String::new()),
    })
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Nodes>,
    /// `nodes` as base64 of compressed JSON, used when the workflow is too
    /// large for etcd otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed_nodes: Option<String>,
    /// Set when nodes live in Argo's offload table instead of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_node_status_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claims: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(
        default,
        rename = "storedWorkflowTemplateSpec",
        skip_serializing_if = "Option::is_none"
    )]
    pub stored_workflow_spec: Option<Box<WorkflowSpec>>,
    #[serde(flatten)]
    pub other: Passed,
}

deserialize_streamed!(WorkflowStatus {
    "phase" => phase,
    "startedAt" => started_at,
    "finishedAt" => finished_at,
    "message" => message,
    "nodes" => nodes,
    "compressedNodes" => compressed_nodes,
    "offloadNodeStatusVersion" => offload_node_status_version,
    "persistentVolumeClaims" => persistent_volume_claims,
    "conditions" => conditions,
    "storedWorkflowTemplateSpec" => stored_workflow_spec,
});

impl WorkflowStatus {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub id: Text,
    #[serde(default)]
    pub name: Text,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<Text>,
    /// Pod, Container, Steps, StepGroup, DAG, TaskGroup, Retry, Skipped,
    /// Suspend, HTTP, Plugin.
    #[serde(default, rename = "type")]
    pub type_: Text,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_name: Option<Text>,
    // The parts most nodes lack are boxed, or held as text: a node is held
    // 20,000 times and more, and each would otherwise cost it a few hundred bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<Box<TemplateRef>>,
    // A field rewind does not change but Argo sets on most nodes is named all
    // the same: inline, a short one costs its slot and nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_scope: Option<Text>,
    /// Pending, Running, Succeeded, Skipped, Failed, Error, Omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Text>,
    #[serde(
        default,
        rename = "boundaryID",
        skip_serializing_if = "Option::is_none"
    )]
    pub boundary_id: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_flag: Option<Box<NodeFlag>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Lazy<IoParameters>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Lazy<IoParameters>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<Text>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_nodes: Option<Vec<Text>>,
    /// The Kubernetes node the pod ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_node_name: Option<Text>,
    #[serde(flatten)]
    pub other: Other,
}

deserialize_streamed!(NodeStatus {
    "id" => id,
    "name" => name,
    "displayName" => display_name,
    "type" => type_,
    "templateName" => template_name,
    "templateRef" => template_ref,
    "templateScope" => template_scope,
    "phase" => phase,
    "boundaryID" => boundary_id,
    "message" => message,
    "startedAt" => started_at,
    "finishedAt" => finished_at,
    "progress" => progress,
    "nodeFlag" => node_flag,
    "inputs" => inputs,
    "outputs" => outputs,
    "children" => children,
    "outboundNodes" => outbound_nodes,
    "hostNodeName" => host_node_name,
});

impl NodeStatus {
    pub fn phase(&self) -> &str {
        self.phase.as_deref().unwrap_or_default()
    }

    pub fn children(&self) -> &[Text] {
        self.children.as_deref().unwrap_or_default()
    }

    /// The template that runs the node: `templateRef.template` when the node
    /// comes from a template reference, else `templateName` (Argo's
    /// `GetTemplateFromNode`).
    pub fn template(&self) -> Cow<'_, str> {
        match &self.template_ref {
            Some(r) => Cow::Borrowed(r.template.as_deref().unwrap_or_default()),
            None => Cow::Borrowed(self.template_name.as_deref().unwrap_or_default()),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(flatten)]
    pub other: Other,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFlag {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hooked: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retried: bool,
    #[serde(flatten)]
    pub other: Other,
}

/// A node's `inputs` or `outputs`: parameters typed (the selector and the
/// suspend-node reset read them), the rest kept verbatim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IoParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Vec<Parameter>>,
    #[serde(flatten)]
    pub other: Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_unknown_fields() {
        let input = serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "wf", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "x"}}],
                     "arguments": {"parameters": [{"name": "p", "value": "1", "enum": ["1", "2"]}]},
                     "shutdown": "Terminate", "futureSpecField": {"x": 1}},
            "status": {
                "phase": "Failed", "startedAt": "2024-01-01T00:00:00Z", "finishedAt": "2024-01-01T00:01:00Z",
                "progress": "1/2", "estimatedDuration": 3, "resourcesDuration": {"cpu": 1},
                "conditions": [{"type": "Completed", "status": "True"}],
                "storedWorkflowTemplateSpec": {"entrypoint": "main", "shutdown": "Stop"},
                "nodes": {"wf": {"id": "wf", "name": "wf", "displayName": "wf", "type": "DAG",
                    "templateName": "main", "phase": "Failed", "children": ["wf-1"],
                    "outboundNodes": ["wf-1"], "progress": "0/1", "hostNodeName": "n1",
                    "inputs": {"parameters": [{"name": "x", "value": "y"}], "artifacts": [{"name": "a"}]},
                    "outputs": {"exitCode": "1"}, "nodeFlag": {"retried": true},
                    "templateRef": {"name": "t", "template": "u", "clusterScope": true},
                    "memoizationStatus": {"hit": false, "key": "k", "cacheName": "c"}}},
                "taskResultsCompletionStatus": {"wf-1": true}
            },
            "someTopLevelField": 1
        });
        let wf: Workflow = serde_json::from_value(input.clone()).unwrap();
        assert_eq!(wf.status.nodes.as_ref().unwrap()["wf"].template(), "u");
        assert_eq!(serde_json::to_value(&wf).unwrap(), input);
    }

    #[test]
    fn named_fields_are_read_as_named_and_the_rest_kept_from_text() {
        // Two keys escaped: a key read as a copy, not borrowed, is matched the same.
        let text = r#"{"kind": "Workflow", "apiVersion": "argoproj.io/v1alpha1",
            "status": {"phase": "Failed", "startedAt": "a", "finishedAt": "b", "mess\u0061ge": "m <&>",
                "nodes": {"wf": {"id": "wf", "name": "wf", "type": "DAG"}}, "compressedNodes": "H4s",
                "offloadNodeStatusVersion": "fnv:1", "persistentVolumeClaims": [{"name": "v"}],
                "conditions": [{"type": "Completed"}], "storedWorkflowTemplateSpec": {"shutdown": "Stop"},
                "taskResultsCompletionStatus": {"wf-1": true}, "estimated\u0044uration": 1.5e3},
            "spec": {"arguments": {"parameters": [{"name": "p", "value": 2}]}, "shutdown": "Stop",
                "activeDeadlineSeconds": 0, "templates": [{"name": "a\u0000\"b", "n": -7}]},
            "metadata": {"name": "wf"}, "someTopLevelField": null}"#;
        let wf: Workflow = serde_json::from_str(text).unwrap();
        let status = &wf.status;
        assert_eq!(
            (status.phase.as_deref(), status.message.as_deref()),
            (Some("Failed"), Some("m <&>"))
        );
        assert_eq!(status.nodes.as_ref().map(BTreeMap::len), Some(1));
        assert_eq!(status.compressed_nodes.as_deref(), Some("H4s"));
        assert_eq!(status.offload_node_status_version.as_deref(), Some("fnv:1"));
        assert_eq!(
            status.persistent_volume_claims.as_ref().map(Vec::len),
            Some(1)
        );
        assert_eq!(status.conditions.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            status
                .stored_workflow_spec
                .as_ref()
                .unwrap()
                .shutdown
                .as_deref(),
            Some("Stop")
        );
        assert_eq!(
            status.other.keys().collect::<Vec<_>>(),
            ["taskResultsCompletionStatus", "estimatedDuration"]
        );
        assert_eq!(wf.spec.active_deadline_seconds, Some(0));
        assert_eq!(wf.spec.shutdown.as_deref(), Some("Stop"));
        let arguments = wf.spec.arguments.as_ref().unwrap();
        assert_eq!(
            arguments.parameters.as_ref().unwrap()[0].value.as_deref(),
            Some("2")
        );
        assert_eq!(
            wf.spec.other["templates"].get(),
            r#"[{"name":"a\u0000\"b","n":-7}]"#
        );
        assert_eq!(
            wf.other.to_value().keys().collect::<Vec<_>>(),
            ["someTopLevelField"]
        );
        let mut expected: Value = serde_json::from_str(text).unwrap();
        // Argo's AnyString: the number is written back as its text.
        expected["spec"]["arguments"]["parameters"][0]["value"] = "2".into();
        assert_eq!(serde_json::to_value(&wf).unwrap(), expected);
    }

    #[test]
    fn unnamed_fields_are_kept_as_text_in_their_order() {
        // An escaped key, a nested value, a key given twice (its first place, its last value).
        let text = r#"{"id": "n", "podIP": "10.0.0.1", "k\"ey": [1, {"x": "<&>"}],
            "resourcesDuration": {"cpu": 1}, "podIP": "10.0.0.2"}"#;
        let node: NodeStatus = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_string(&node).unwrap(),
            r#"{"id":"n","name":"","type":"","podIP":"10.0.0.2","k\"ey":[1,{"x":"<&>"}],"resourcesDuration":{"cpu":1}}"#
        );
        assert_eq!(node.other.to_value()["resourcesDuration"]["cpu"], 1);
        let bare: NodeStatus = serde_json::from_str(r#"{"id": "n"}"#).unwrap();
        assert!(bare.other.is_empty());
    }

    #[test]
    fn kept_text_compares_as_values_in_any_order() {
        let read = |text: &str| serde_json::from_str::<NodeStatus>(text).unwrap();
        let a = read(
            r#"{"id": "n", "podIP": "1", "x": {"a": 1, "b": 2}, "outputs": {"exitCode": "1", "result": "r"}}"#,
        );
        let b = read(
            r#"{"id": "n", "x": {"b": 2, "a": 1}, "podIP": "1", "outputs": {"result": "r", "exitCode": "1"}}"#,
        );
        assert_eq!(a, b);
        let c = read(
            r#"{"id": "n", "x": {"b": 2, "a": 1}, "podIP": "2", "outputs": {"result": "r", "exitCode": "1"}}"#,
        );
        assert_ne!(a, c);
        let d = read(
            r#"{"id": "n", "x": {"b": 2, "a": 1}, "podIP": "1", "outputs": {"result": "s", "exitCode": "1"}}"#,
        );
        assert_ne!(a, d);
    }

    #[test]
    fn inputs_and_outputs_are_held_as_text_and_checked_when_read() {
        let node: NodeStatus = serde_json::from_str(
            r#"{"id": "n", "inputs": {"parameters": [{"name": "p", "value": 3}],
                "artifacts": [{"name": "a", "s3": {"key": "k"}}]}}"#,
        )
        .unwrap();
        let inputs = node.inputs.as_ref().unwrap().get();
        assert_eq!(inputs.parameters.unwrap()[0].value.as_deref(), Some("3"));
        assert_eq!(
            serde_json::to_value(&node).unwrap()["inputs"]["artifacts"][0]["s3"]["key"],
            "k"
        );
        // What a typed read refused before, it refuses still.
        let wrong = r#"{"id": "n", "outputs": {"parameters": 5}}"#;
        assert!(serde_json::from_str::<NodeStatus>(wrong).is_err());
    }

    #[test]
    fn a_node_stays_small() {
        // Held 50,000 times and more: a field added inline costs each node its size.
        assert!(
            std::mem::size_of::<NodeStatus>() <= 424,
            "{}",
            std::mem::size_of::<NodeStatus>()
        );
    }

    #[test]
    fn parameter_values_read_like_argos_any_string() {
        let p: Vec<Parameter> = serde_json::from_value(serde_json::json!([
            {"name": "a", "value": 1}, {"name": "b", "value": 2.5}, {"name": "c", "value": true},
            {"name": "d", "value": "x"}, {"name": "e"}, {"name": "f", "value": null},
            {"name": "g", "value": 1e21}, {"name": "h", "value": 12345678901234567890u64}
        ]))
        .unwrap();
        let values: Vec<_> = p.iter().map(|p| p.value.as_deref()).collect();
        assert_eq!(
            values,
            [
                Some("1"),
                Some("2.5"),
                Some("true"),
                Some("x"),
                None,
                None,
                Some("1000000000000000000000"),
                Some("12345678901234567000")
            ]
        );
    }

    #[test]
    fn missing_status_stays_missing() {
        let input = serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "wf"}, "spec": {"entrypoint": "main"}
        });
        let wf: Workflow = serde_json::from_value(input.clone()).unwrap();
        assert_eq!(serde_json::to_value(&wf).unwrap(), input);
    }
}
