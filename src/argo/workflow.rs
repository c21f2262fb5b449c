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
use serde_json::{Map, Value};

/// Fields a struct does not name, kept verbatim.
pub type Other = Map<String, Value>;

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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    pub other: Other,
}

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
    pub value_from: Option<Value>,
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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Node statuses by node ID. A `BTreeMap` so output is ordered like Go's
    /// `encoding/json` orders map keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<BTreeMap<String, NodeStatus>>,
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
    pub other: Other,
}

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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Pod, Container, Steps, StepGroup, DAG, TaskGroup, Retry, Skipped,
    /// Suspend, HTTP, Plugin.
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_name: Option<String>,
    // The four parts most nodes lack are boxed: a node is held 20,000 times
    // and more, and each would otherwise be a few hundred bytes inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<Box<TemplateRef>>,
    /// Pending, Running, Succeeded, Skipped, Failed, Error, Omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(
        default,
        rename = "boundaryID",
        skip_serializing_if = "Option::is_none"
    )]
    pub boundary_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_flag: Option<Box<NodeFlag>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Box<IoParameters>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Box<IoParameters>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_nodes: Option<Vec<String>>,
    #[serde(flatten)]
    pub other: Other,
}

impl NodeStatus {
    pub fn phase(&self) -> &str {
        self.phase.as_deref().unwrap_or_default()
    }

    pub fn children(&self) -> &[String] {
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
