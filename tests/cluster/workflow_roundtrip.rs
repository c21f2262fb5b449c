//! A large Workflow survives a read into rewind's typed structs and a replace: nothing lost.

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use kube::api::{Api, PostParams};
use rewind::argo::workflow::Workflow;
use rewind::testenv::localcluster::LocalCluster;
use serde_json::{Map, Value, json};

/// Retry nodes in the fan-out; with their pods and retries the status has about 2,200 nodes.
const TASKS: usize = 1000;
/// etcd refuses requests above 1.5 MiB; Argo compresses or offloads nodes before that.
const MAX_BYTES: usize = 1_400_000;

const ANNOTATION: &str = "rewind.dev/retry-status";

/// Metadata the API server sets or changes on every write.
const SERVER_SET: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
];

pub async fn typed_replace_loses_nothing_of_a_large_workflow(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let client = cluster.admin_client();
    let original = large_workflow(&namespace, "wf-large");
    let size = serde_json::to_vec(&original)?.len();
    ensure!(
        size < MAX_BYTES,
        "fixture is {size} bytes, too large for etcd"
    );
    let node_count = original["status"]["nodes"].as_object().map_or(0, Map::len);
    tracing::info!(size, node_count, "large workflow");

    let path = format!("/apis/argoproj.io/v1alpha1/namespaces/{namespace}/workflows");
    let create = http::Request::post(&path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&original)?)?;
    let created: Value = client
        .request(create)
        .await
        .context("creating the workflow (raw JSON)")?;

    let workflows: Api<Workflow> = Api::namespaced(client.clone(), &namespace);
    let mut typed = workflows
        .get("wf-large")
        .await
        .context("reading the workflow typed")?;
    let nodes = typed.status.nodes.as_ref().map_or(0, |n| n.len());
    ensure!(
        nodes == node_count,
        "typed read has {nodes} nodes, expected {node_count}"
    );
    // One change, as a retry's progress report would make, so the replace is a real write
    // (the API server skips writing an unchanged object).
    typed
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(ANNOTATION.to_owned(), "{}".to_owned());
    workflows
        .replace("wf-large", &PostParams::default(), &typed)
        .await
        .context("replacing the workflow typed")?;

    let get = http::Request::get(format!("{path}/wf-large")).body(Vec::new())?;
    let reread: Value = client
        .request(get)
        .await
        .context("reading the workflow (raw JSON)")?;
    ensure!(
        reread["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"],
        "the replace did not reach the server"
    );
    let mut expected = original;
    expected["metadata"]["annotations"][ANNOTATION] = json!("{}");
    let differences = differences(
        &without_server_fields(expected),
        &without_server_fields(reread),
    );
    ensure!(
        differences.is_empty(),
        "fields changed by the typed round trip:\n{}",
        differences.join("\n")
    );
    Ok(())
}

fn without_server_fields(mut workflow: Value) -> Value {
    if let Some(metadata) = workflow["metadata"].as_object_mut() {
        for field in SERVER_SET {
            metadata.remove(*field);
        }
    }
    workflow
}

/// JSON paths where `a` and `b` differ (the first few).
fn differences(a: &Value, b: &Value) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        if out.len() >= 10 || a == b {
            return;
        }
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                    walk(
                        &format!("{path}.{key}"),
                        a.get(key).unwrap_or(&Value::Null),
                        b.get(key).unwrap_or(&Value::Null),
                        out,
                    );
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (x, y)) in x.iter().zip(y).enumerate() {
                    walk(&format!("{path}[{i}]"), x, y, out);
                }
            }
            _ => out.push(format!("{path}: {a} became {b}")),
        }
    }
    let mut out = Vec::new();
    walk("", a, b, &mut out);
    out
}

/// A failed fan-out workflow as Argo's controller leaves it: a DAG, a Retry node per task,
/// one pod per attempt (every tenth task failed once and was retried), with the node
/// fields Argo writes, plus fields rewind's structs do not model.
fn large_workflow(namespace: &str, name: &str) -> Value {
    let started = "2026-01-02T03:04:05Z";
    let finished = "2026-01-02T03:24:05Z";
    let mut nodes = Map::new();
    let mut task_results = Map::new();
    let mut retry_ids = Vec::new();
    for task in 0..TASKS {
        let retry_id = format!("{name}-{}", 1_000_000_000 + task * 7919);
        let task_name = format!("{name}.process(0:item-{task})");
        let attempts = if task % 10 == 0 { 2 } else { 1 };
        let failed = task % 7 == 0;
        let mut pod_ids = Vec::new();
        for attempt in 0..attempts {
            let pod_id = format!(
                "{name}-{}",
                3_000_000_000u64 + (task * 31 + attempt) as u64 * 104_729
            );
            let last = attempt + 1 == attempts;
            let phase = if !last || failed {
                "Failed"
            } else {
                "Succeeded"
            };
            let mut pod = json!({
                "id": pod_id,
                "name": format!("{task_name}({attempt})"),
                "displayName": format!("process(0:item-{task})({attempt})"),
                "type": "Pod",
                "templateName": "process",
                "templateScope": format!("local/{name}"),
                "phase": phase,
                "boundaryID": name,
                "startedAt": started,
                "finishedAt": finished,
                "progress": "1/1",
                "resourcesDuration": {"cpu": 3 + task % 5, "memory": 40 + task % 11},
                "hostNodeName": format!("kwok-node-{}", task % 2),
                "inputs": {"parameters": [{"name": "item", "value": format!("item-{task}")}]},
                "outputs": {
                    "exitCode": if phase == "Failed" { "1" } else { "0" },
                    "artifacts": [{"name": "main-logs", "s3": {"key": format!("{name}/{pod_id}/main.log")}}],
                },
                "taskResultSynced": true,
            });
            if phase == "Failed" {
                pod["message"] = json!("Error (exit code 1)");
            }
            if attempts > 1 {
                pod["nodeFlag"] = json!({"retried": true});
            }
            task_results.insert(pod_id.clone(), json!(true));
            nodes.insert(pod_id.clone(), pod);
            pod_ids.push(pod_id);
        }
        let retry_phase = if failed { "Failed" } else { "Succeeded" };
        let mut retry = json!({
            "id": retry_id,
            "name": task_name,
            "displayName": format!("process(0:item-{task})"),
            "type": "Retry",
            "templateName": "process",
            "templateScope": format!("local/{name}"),
            "phase": retry_phase,
            "boundaryID": name,
            "startedAt": started,
            "finishedAt": finished,
            "progress": "1/1",
            "children": pod_ids,
            "outboundNodes": [pod_ids.last()],
        });
        if failed {
            retry["message"] = json!("No more retries left");
        }
        nodes.insert(retry_id.clone(), retry);
        retry_ids.push(retry_id);
    }
    nodes.insert(
        name.to_owned(),
        json!({
            "id": name, "name": name, "displayName": name, "type": "DAG", "templateName": "main",
            "templateScope": format!("local/{name}"), "phase": "Failed", "startedAt": started, "finishedAt": finished,
            "progress": format!("{}/{}", TASKS - TASKS.div_ceil(7), TASKS), "estimatedDuration": 1200,
            "resourcesDuration": {"cpu": 5000, "memory": 90000},
            "children": retry_ids, "outboundNodes": retry_ids,
        }),
    );
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "workflows.argoproj.io/completed": "true",
                "workflows.argoproj.io/phase": "Failed",
                "team": "data",
            },
            "annotations": {
                "workflows.argoproj.io/pod-name-format": "v2",
                "example.com/owner": "someone",
            },
        },
        "spec": {
            "entrypoint": "main",
            "serviceAccountName": "argo-workflow",
            "arguments": {"parameters": [{"name": "count", "value": TASKS.to_string(), "enum": ["10", TASKS.to_string()]}]},
            "podGC": {"strategy": "OnPodSuccess"},
            "ttlStrategy": {"secondsAfterCompletion": 86400},
            "activeDeadlineSeconds": 7200,
            "templates": [
                {"name": "main", "dag": {"tasks": [{
                    "name": "process", "template": "process",
                    "arguments": {"parameters": [{"name": "item", "value": "{{item}}"}]},
                    "withSequence": {"count": "{{workflow.parameters.count}}", "format": "item-%d"},
                }]}},
                {"name": "process",
                 "retryStrategy": {"limit": "1", "retryPolicy": "OnFailure"},
                 "inputs": {"parameters": [{"name": "item"}]},
                 "container": {"image": "quay.io/argoproj/argosay:v2", "args": ["echo", "{{inputs.parameters.item}}"],
                               "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}},
            ],
            "aFutureSpecField": {"kept": true},
        },
        "status": {
            "phase": "Failed",
            "startedAt": started,
            "finishedAt": finished,
            "message": "child 'wf-large-1000000000' failed",
            "progress": format!("{}/{}", TASKS - TASKS.div_ceil(7), TASKS),
            "estimatedDuration": 1200,
            "resourcesDuration": {"cpu": 5000, "memory": 90000},
            "conditions": [{"type": "PodRunning", "status": "False"}, {"type": "Completed", "status": "True"}],
            "nodes": nodes,
            "storedTemplates": {"namespaced/process": {"name": "process", "container": {"image": "quay.io/argoproj/argosay:v2"}}},
            "artifactRepositoryRef": {"configMap": "artifact-repositories", "key": "default-v1", "namespace": namespace, "default": true,
                                      "artifactRepository": {"s3": {"bucket": "my-bucket", "endpoint": "minio:9000", "insecure": true}}},
            "artifactGCStatus": {"notSpecified": true},
            "taskResultsCompletionStatus": task_results,
            "aFutureStatusField": [1, 2, 3],
        },
    })
}
