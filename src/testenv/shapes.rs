//! A wide failed DAG's Workflow as the API server sends it, its nodes in one
//! of two shapes, for the memory sweep (benches/memory.rs): `lean`, the
//! fields a finished pod node always has; `rich`, what a data pipeline's
//! node carries besides (input and output parameters, artifacts with their
//! S3 keys, resource durations, pod IP, progress). Nodes are compressed into
//! `compressedNodes` with gzip, as Argo writes a workflow over its size limit.

use base64::Engine as _;
use serde_json::{Value, json};

use crate::argo::plan::compress::{Encoder, compress_with};

const WORKFLOW: &str = "wide";
const STARTED: &str = "2026-01-01T00:00:00Z";
const FINISHED: &str = "2026-01-01T00:01:00Z";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    Lean,
    Rich,
}

/// The workflow's JSON and its nodes' JSON size: `nodes` pod nodes under one
/// DAG node, every tenth failed.
pub fn workflow_json(nodes: usize, shape: Shape) -> (Vec<u8>, usize) {
    let mut map = serde_json::Map::new();
    let mut children = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let (id, node) = pod_node(i, shape);
        children.push(Value::from(id.clone()));
        map.insert(id, node);
    }
    map.insert(
        WORKFLOW.into(),
        json!({"id": WORKFLOW, "name": WORKFLOW, "displayName": WORKFLOW, "type": "DAG",
            "templateName": "main", "phase": "Failed", "startedAt": STARTED, "finishedAt": FINISHED,
            "children": children, "outboundNodes": children}),
    );
    let json = serde_json::to_vec(&Value::Object(map)).expect("JSON serializes");
    let blob =
        base64::engine::general_purpose::STANDARD.encode(compress_with(Encoder::Gzip(6), &json));
    let workflow = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": WORKFLOW, "namespace": "bench", "uid": "7c1a0d4e-0000-4000-8000-000000000001",
            "resourceVersion": "1", "labels": {"workflows.argoproj.io/completed": "true"}},
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "dag": {"tasks": []}},
            {"name": "work", "container": {"image": "busybox"}}]},
        "status": {"phase": "Failed", "startedAt": STARTED, "finishedAt": FINISHED,
            "compressedNodes": blob},
    });
    (
        serde_json::to_vec(&workflow).expect("JSON serializes"),
        json.len(),
    )
}

fn pod_node(i: usize, shape: Shape) -> (String, Value) {
    let hash = 1_000_000_000 + i * 7919;
    let id = format!("{WORKFLOW}-{hash}");
    let failed = i.is_multiple_of(10);
    let mut node = json!({
        "id": id, "name": format!("{WORKFLOW}.task-{i:05}"), "displayName": format!("task-{i:05}"),
        "type": "Pod", "templateName": "work", "templateScope": format!("local/{WORKFLOW}"),
        "phase": if failed { "Failed" } else { "Succeeded" }, "boundaryID": WORKFLOW,
        "startedAt": STARTED, "finishedAt": FINISHED, "hostNodeName": format!("node-{}", i % 32),
    });
    if failed {
        node["message"] = "Error (exit code 1)".into();
    }
    if shape == Shape::Rich {
        let exit = if failed { "1" } else { "0" };
        let fields = [
            ("progress", json!("1/1")),
            ("estimatedDuration", json!(61)),
            ("resourcesDuration", json!({"cpu": 12, "memory": 345})),
            (
                "podIP",
                json!(format!("10.244.{}.{}", i / 250 % 250, i % 250)),
            ),
            ("taskResultSynced", json!(true)),
            (
                "inputs",
                json!({
                "parameters": [{"name": "shard", "value": i.to_string()},
                    {"name": "bucket", "value": "s3://data-lake/raw/2026/01/01"}],
                "artifacts": [{"name": "input", "path": "/tmp/input.parquet",
                    "s3": {"key": format!("{WORKFLOW}/inputs/{i}/input.parquet")}}]}),
            ),
            (
                "outputs",
                json!({
                "parameters": [{"name": "rows", "value": (i * 31).to_string(), "valueFrom": {"path": "/tmp/rows"}}],
                "artifacts": [{"name": "main-logs", "s3": {"key": format!("{WORKFLOW}/{WORKFLOW}-work-{hash}/main.log")}},
                    {"name": "result", "path": "/tmp/out.parquet", "s3": {"key": format!("{WORKFLOW}/outputs/{i}/out.parquet")}}],
                "exitCode": exit}),
            ),
        ];
        for (key, value) in fields {
            node[key] = value;
        }
    }
    (id, node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::plan::{RetryOptions, plan_retry_owned};
    use crate::argo::workflow::Workflow;

    #[test]
    fn both_shapes_plan_and_keep_every_field() {
        for shape in [Shape::Lean, Shape::Rich] {
            let (body, nodes_json) = workflow_json(30, shape);
            let wf: Workflow = serde_json::from_slice(&body).unwrap();
            let plan = plan_retry_owned(wf, &RetryOptions::default()).unwrap();
            assert_eq!(plan.pods_to_delete.len(), 3, "{shape:?}");
            let kept = &plan.workflow.status.nodes.as_ref().unwrap()["wide-1000007919"];
            let text = serde_json::to_value(kept).unwrap();
            assert_eq!(text["phase"], "Succeeded");
            if shape == Shape::Rich {
                assert_eq!(
                    text["outputs"]["artifacts"][0]["s3"]["key"],
                    "wide/wide-work-1000007919/main.log"
                );
                assert_eq!(text["resourcesDuration"]["memory"], 345);
            }
            assert!(nodes_json > 30 * 250, "{shape:?}: {nodes_json}");
        }
    }
}
