//! The parts beyond the API server: scheduling onto kwok's fake nodes, and the audit log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ObjectMeta, PostParams};
use rewind::testenv::localcluster::LocalCluster;
use serde_json::{Value, json};

pub async fn a_pod_is_scheduled_onto_a_fake_node_and_runs(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), &namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "runs"},
        "spec": {"containers": [{"name": "main", "image": "quay.io/argoproj/argosay:v2"}]},
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .context("creating the pod")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod = pods.get("runs").await?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        if phase.as_deref() == Some("Running") {
            let node = node.unwrap_or_default();
            ensure!(
                node.starts_with("kwok-node-"),
                "running on {node:?}, not a fake node"
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pod not running after 30s: node {node:?}, phase {phase:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn audit_log_has_one_line_per_request(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let log = cluster
        .audit_log_path()
        .context("the shared cluster has audit logging on")?;
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.admin_client(), &namespace);
    for i in 0..3 {
        let metadata = ObjectMeta {
            name: Some(format!("audited-{i}")),
            ..Default::default()
        };
        config_maps
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
    }
    // The log is written before each response is sent (blocking mode).
    let text =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let mut creates = Vec::new();
    for line in text.lines() {
        let event: Value = serde_json::from_str(line)
            .with_context(|| format!("an audit line is not JSON: {line}"))?;
        let object = &event["objectRef"];
        let ours = object["name"]
            .as_str()
            .is_some_and(|name| name.starts_with("audited-"));
        if ours
            && object["namespace"] == namespace.as_str()
            && object["resource"] == "configmaps"
            && event["verb"] == "create"
        {
            creates.push(event);
        }
    }
    ensure!(
        creates.len() == 3,
        "expected 3 audited creates in {namespace}, found {}",
        creates.len()
    );
    for event in &creates {
        ensure!(
            event["level"] == "Metadata" && event["stage"] == "ResponseComplete",
            "unexpected event: {event}"
        );
        ensure!(
            event["user"]["username"] == rewind::testenv::localcluster::ADMIN_NAME,
            "unexpected user: {}",
            event["user"]
        );
        ensure!(
            event.get("requestObject").is_none(),
            "Metadata level must not log bodies"
        );
    }
    Ok(())
}
