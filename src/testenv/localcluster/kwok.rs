//! Fake nodes simulated by kwok, so pods get scheduled and "run" without a kubelet.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::ObjectMeta;

/// kwok's stages (how nodes and pods change state), written to kwok's config file.
pub(super) const STAGES: &str = include_str!("kwok-stages.yaml");

const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// The annotation selector telling kwok which nodes are its own.
pub(super) const NODE_SELECTOR: &str = "kwok.x-k8s.io/node=fake";
/// A label on every fake node, to find them.
pub const NODE_LABEL_SELECTOR: &str = "type=kwok";
/// How many fake nodes a cluster with scheduling has.
pub const NODE_COUNT: usize = 2;

/// Fake nodes as kwok's docs describe them, without the usual NoSchedule taint: every node
/// here is fake, so pods (Argo's too) should land on them without tolerations. kwok fills in
/// their status (Ready, large capacity) itself.
pub(super) fn fake_nodes() -> Vec<Node> {
    (0..NODE_COUNT)
        .map(|i| {
            let name = format!("kwok-node-{i}");
            let labels = BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), name.clone()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
                ("type".to_owned(), "kwok".to_owned()),
            ]);
            let annotations = BTreeMap::from([
                (NODE_ANNOTATION.to_owned(), "fake".to_owned()),
                ("node.alpha.kubernetes.io/ttl".to_owned(), "0".to_owned()),
            ]);
            Node {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_nodes_carry_the_annotation_kwok_selects() {
        let (key, value) = NODE_SELECTOR.split_once('=').unwrap();
        let (label_key, label_value) = NODE_LABEL_SELECTOR.split_once('=').unwrap();
        let nodes = fake_nodes();
        assert_eq!(nodes.len(), NODE_COUNT);
        for node in nodes {
            assert_eq!(node.metadata.annotations.unwrap()[key], value);
            assert_eq!(node.metadata.labels.unwrap()[label_key], label_value);
        }
    }

    #[test]
    fn stages_cover_nodes_and_pods() {
        for stage in [
            "node-initialize",
            "node-heartbeat-with-lease",
            "pod-ready",
            "pod-complete",
            "pod-delete",
            "pod-outcome-succeeded",
            "pod-outcome-failed",
        ] {
            assert!(
                STAGES.contains(&format!("name: {stage}\n")),
                "{stage} missing"
            );
        }
    }
}
