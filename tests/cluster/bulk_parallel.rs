//! `--bulk-parallelism`: the exact bulk delete split by node into several DeleteCollections,
//! each narrower than the exact one, so together they still delete only plan pods.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;

/// Nodes of this test alone, so the controller manager does not collect their pods as
/// orphans; tainted so the scheduler puts no other test's pod there.
async fn create_nodes(
    cluster: &LocalCluster,
    namespace: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(cluster.admin_client());
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("{namespace}-node-{i}");
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: "rewind.dev/test".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        };
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {name}"))?;
        names.push(name);
    }
    Ok(names)
}

/// A retry of 40 failed pods on 5 nodes with --bulk-parallelism 4 sends 4 DeleteCollections
/// (a part of two nodes, parts of one, and the catch-all) and nothing else, deletes every plan
/// pod, and keeps the workflow's succeeded pods, another workflow's failed pods on the same
/// nodes and another, and an unfinished outsider with the workflow's label.
pub async fn a_split_bulk_delete_sends_one_request_per_part_and_keeps_every_outsider(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let nodes = create_nodes(&cluster, &namespace, 6).await?;
    let dag = FailedDag {
        name: "wf".into(),
        failed: 40,
        succeeded: 4,
    };
    let created = dag
        .create_on(&admin, &namespace, &nodes[..5], 32, || ())
        .await?;
    let plan = ctl::expected_plan(&created)?;
    ensure!(
        plan.pod_nodes.len() == 40,
        "the plan knows the node of {} pods, expected 40",
        plan.pod_nodes.len()
    );
    // Another workflow's failed pods, on this workflow's nodes and one more.
    let other = FailedDag {
        name: "other".into(),
        failed: 10,
        succeeded: 0,
    };
    other
        .create_on(&admin, &namespace, &nodes, 32, || ())
        .await?;
    // Someone else's failed pod with the workflow's label, on one of its nodes, not
    // relabelled completed=true: no part may select it.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let mut outsider = ctl::pod("outsider", &dag.name);
    outsider
        .labels_mut()
        .insert(labels::COMPLETED.into(), "false".into());
    if let Some(spec) = outsider.spec.as_mut() {
        spec.node_name = Some(nodes[1].clone());
    }
    pods.create(&PostParams::default(), &outsider).await?;
    let failed = serde_json::json!({"status": {"phase": "Failed"}});
    let outsider = pods
        .patch_status("outsider", &PatchParams::default(), &Patch::Merge(&failed))
        .await?;
    let before: BTreeSet<String> = pods
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| p.name_any())
        .collect();

    let mut options = ctl::options(100, 100, true);
    options.retry.bulk_parallelism = 4;
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    controller.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded && status.pods_deleted == 40,
        "expected the retry to succeed with 40 pods deleted, its status is {status:?}"
    );

    let after: BTreeSet<String> = pods
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| p.name_any())
        .collect();
    let planned: BTreeSet<String> = plan.pods_to_delete.iter().cloned().collect();
    let expected: BTreeSet<String> = before.difference(&planned).cloned().collect();
    ensure!(
        after == expected,
        "pods left differ from the pods before minus the plan: missing {:?}, still there {:?}",
        expected.difference(&after).collect::<Vec<_>>(),
        after.difference(&expected).collect::<Vec<_>>()
    );
    ensure!(
        pods.get("outsider").await?.uid() == outsider.uid(),
        "the outsider was replaced during the retry"
    );

    let requests: Vec<ctl::Audited> = ctl::audit_log(&cluster, &namespace)?
        .into_iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.resource == "pods" && a.is_mutating())
        .collect();
    let verbs: Vec<&str> = requests.iter().map(|a| a.verb.as_str()).collect();
    ensure!(
        verbs == ["deletecollection"; 4],
        "expected 4 deletecollections and no other pod write, the controller sent {verbs:?}"
    );

    let node_api: Api<Node> = Api::all(admin);
    for node in &nodes {
        node_api.delete(node, &DeleteParams::default()).await?;
    }
    Ok(())
}
