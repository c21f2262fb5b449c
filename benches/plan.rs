//! Planner speed on a large workflow: 10,001 nodes (a Steps root, 100 step
//! groups of 99 pods each), 8,000 failed pods to delete.
//!
//! Run with `cargo bench --bench plan`. Targets: under 50 ms for the plain
//! workflow, under 20 ms for the compressed one excluding decompression
//! (`plan_compressed` minus `decompress_nodes`).

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use rewind::argo::plan::compress::{self, Nodes};
use rewind::argo::plan::{ArgoVersion, RetryOptions, plan_retry_at};
use rewind::argo::workflow::{NodeStatus, Workflow};
use serde_json::json;

const GROUPS: usize = 100;
const PODS_PER_GROUP: usize = 99;
const FAILED_PER_GROUP: usize = 80;

fn main() {
    divan::main();
}

fn node(
    id: String,
    name: String,
    type_: &str,
    phase: &str,
    children: Vec<String>,
    boundary: &str,
) -> Box<NodeStatus> {
    serde_json::from_value(json!({
        "id": id, "name": name, "displayName": name, "type": type_, "phase": phase,
        "templateName": "work", "templateScope": "local/big", "boundaryID": boundary,
        "startedAt": "2024-05-01T00:00:00Z", "finishedAt": "2024-05-01T00:10:00Z",
        "children": children, "hostNodeName": "node-1", "progress": "1/1",
        "resourcesDuration": {"cpu": 10, "memory": 10},
        "outputs": {"exitCode": if phase == "Failed" { "1" } else { "0" }},
    }))
    .expect("a bench node decodes")
}

fn big_nodes() -> Nodes {
    let wf = "big";
    let id = |name: &str| rewind::argo::plan::pod_name::node_id(wf, name);
    let mut nodes = BTreeMap::new();
    let mut groups = Vec::with_capacity(GROUPS);
    for g in 0..GROUPS {
        let group_name = format!("{wf}[{g}]");
        let mut pods = Vec::with_capacity(PODS_PER_GROUP);
        for p in 0..PODS_PER_GROUP {
            let pod_name = format!("{group_name}.work({p})");
            let phase = if p < FAILED_PER_GROUP {
                "Failed"
            } else {
                "Succeeded"
            };
            let pod = node(id(&pod_name), pod_name, "Pod", phase, Vec::new(), wf);
            pods.push(pod.id.to_string());
            nodes.insert(pod.id.to_string(), pod);
        }
        let group = node(id(&group_name), group_name, "StepGroup", "Failed", pods, wf);
        groups.push(group.id.to_string());
        nodes.insert(group.id.to_string(), group);
    }
    let root = node(wf.into(), wf.into(), "Steps", "Failed", groups, "");
    nodes.insert(root.id.to_string(), root);
    nodes
}

fn big_workflow(compressed: bool) -> Workflow {
    let mut wf: Workflow = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "big", "namespace": "ns", "labels": {"workflows.argoproj.io/completed": "true"}},
        "spec": {"entrypoint": "main"},
        "status": {"phase": "Failed", "startedAt": "2024-05-01T00:00:00Z", "finishedAt": "2024-05-01T00:10:00Z"}
    }))
    .expect("the bench workflow decodes");
    let nodes = big_nodes();
    if compressed {
        wf.status.compressed_nodes =
            Some(compress::encode_nodes(&nodes, compress::Encoder::Gzip(6)));
    } else {
        wf.status.nodes = Some(nodes);
    }
    wf
}

fn check(wf: &Workflow, opts: &RetryOptions, written_back: bool) {
    let plan = plan_retry_at(wf, opts, Timestamp::UNIX_EPOCH).expect("the bench workflow plans");
    assert_eq!(plan.pods_to_delete.len(), GROUPS * FAILED_PER_GROUP);
    assert_eq!(
        plan.workflow.status.compressed_nodes.is_some(),
        written_back
    );
}

/// Plain nodes, and a size limit the result fits under (no write-back).
#[divan::bench]
fn plan_plain(bencher: divan::Bencher) {
    let wf = big_workflow(false);
    let opts = RetryOptions {
        max_workflow_size: usize::MAX,
        ..Default::default()
    };
    check(&wf, &opts, false);
    bencher.bench(|| plan_retry_at(divan::black_box(&wf), &opts, Timestamp::UNIX_EPOCH));
}

/// Plain nodes with a 256 KiB limit, which the result exceeds: its nodes are
/// written back compressed.
#[divan::bench]
fn plan_plain_write_back(bencher: divan::Bencher) {
    let wf = big_workflow(false);
    let opts = RetryOptions {
        max_workflow_size: 256 * 1024,
        ..Default::default()
    };
    check(&wf, &opts, true);
    bencher.bench(|| plan_retry_at(divan::black_box(&wf), &opts, Timestamp::UNIX_EPOCH));
}

/// Compressed nodes in; the result fits Argo's 1 MiB limit uncompressed.
#[divan::bench]
fn plan_compressed(bencher: divan::Bencher) {
    let wf = big_workflow(true);
    let opts = RetryOptions::default();
    check(&wf, &opts, false);
    bencher.bench(|| plan_retry_at(divan::black_box(&wf), &opts, Timestamp::UNIX_EPOCH));
}

/// Reading the compressed nodes and dropping them, to subtract from
/// `plan_compressed` (whose decoded input is dropped inside the timing, while
/// divan drops a bench's return value outside it).
#[divan::bench]
fn decompress_nodes(bencher: divan::Bencher) {
    let wf = big_workflow(true);
    let packed = wf.status.compressed_nodes.clone().expect("compressed");
    bencher.bench(|| {
        drop(compress::decode_nodes(
            divan::black_box(&packed),
            ArgoVersion::V4,
            compress::DEFAULT_MAX_NODES_SIZE,
        ))
    });
}
