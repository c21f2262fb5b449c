//! After a live reset is written: a check, for a bounded time, that Argo's
//! controller picked the reset nodes up (rule 8).
//!
//! The strand it looks for: a reset node's new pod labelled
//! `workflows.argoproj.io/completed=true` while the node is not finished.
//! Argo v4.1.4 labels a pod from a clean-up queue keyed by the pod's name; a
//! label queued for the old pod lands on the new one, which then leaves
//! Argo's pod informer (completed=false only), and the node stays Pending
//! for good. The settle wait (see `engine::drive`) keeps rewind from making
//! one; this is the tripwire, for a strand made otherwise (someone deleting
//! pods by hand, `--on-settle-timeout=delete`).
//!
//! Each strand is reported, not repaired (docs/DESIGN.md, rule 8): a Warning
//! Event on the workflow and a line in the request's status message, each
//! naming the pod and the fix, and `rewind_stranded_nodes_total`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::argo::plan::compress::decode_nodes;
use crate::argo::workflow::{Workflow, labels};
use crate::engine::fault;
use crate::engine::pods::{PodEvent, watch_pods};
use crate::protocol::crd::WorkflowRetry;
use crate::protocol::request::{self, annotations};
use crate::retry::Context;
use crate::retry::report::Events;

/// The Event reason of a strand.
pub const STRANDED: &str = "RetryStranded";

/// How long the labels of a batch are gathered before the workflow is read
/// once for all of them: every reset pod that finishes is labelled, and a
/// large workflow is costly to read.
const GATHER: Duration = Duration::from_secs(1);

/// One reset to follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reset {
    pub namespace: String,
    pub workflow: String,
    pub uid: String,
    /// The request's token: its status is the one told.
    pub token: String,
    /// The names of the pods the reset deleted: their nodes' new pods have them.
    pub pods: BTreeSet<String>,
    /// The revision the reset was written at: the pods' changes from there on.
    pub revision: String,
}

/// A reset node whose new pod carries completed=true while the node is not
/// finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strand {
    pub pod: String,
    pub node: String,
    /// The node's phase, `None` while Argo has not made the node again.
    pub phase: Option<String>,
}

impl Strand {
    /// What the user is told: the pod, the node, why and the fix.
    pub fn message(&self, namespace: &str) -> String {
        format!(
            "node {} is {} but its new pod {} is labelled workflows.argoproj.io/completed=true (a label Argo queued for the pod the retry deleted, which landed on the new pod): Argo no longer follows the pod and the node stays so; to let Argo take it up, kubectl label pod -n {namespace} {} workflows.argoproj.io/completed=false --overwrite",
            self.node,
            self.phase.as_deref().unwrap_or("not made again yet"),
            self.pod,
            self.pod,
        )
    }
}

/// Whether a node in `phase` is finished: Argo labels a pod only after it
/// wrote its node so.
fn finished(phase: Option<&str>) -> bool {
    matches!(
        phase,
        Some("Succeeded" | "Failed" | "Error" | "Skipped" | "Omitted")
    )
}

/// The strands among `labelled` (pod name → its node's ID): the nodes
/// `nodes` does not show finished.
pub fn strands(
    labelled: &BTreeMap<String, String>,
    nodes: &crate::argo::workflow::Nodes,
) -> Vec<Strand> {
    labelled
        .iter()
        .filter_map(|(pod, id)| {
            let node = nodes.get(id);
            let phase = node.and_then(|n| n.phase.as_deref().map(str::to_owned));
            (!finished(phase.as_deref())).then(|| Strand {
                pod: pod.clone(),
                node: node.map_or_else(|| id.clone(), |n| n.name.to_string()),
                phase,
            })
        })
        .collect()
}

/// Follows `reset` for `bound`: each reset pod Argo (or anyone) labels
/// completed=true is checked against its node; each strand is reported once.
pub async fn follow(ctx: &Context, reset: Reset, bound: Duration) {
    let deadline = Instant::now() + bound;
    let client = ctx.client();
    let mut watch = match watch_pods(&client, &reset.namespace, &reset.workflow, &reset.revision)
        .await
    {
        Ok(watch) => watch,
        Err(error) => {
            debug!(namespace = reset.namespace, workflow = reset.workflow, error = %fault::explain(&error), "watching the reset's pods failed; no check that Argo picked it up");
            return;
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &reset.namespace);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    // Labelled pods not yet checked, by name, with their node's ID.
    let mut labelled: BTreeMap<String, String> = BTreeMap::new();
    let mut check_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return,
            _ = async { tokio::time::sleep_until(check_at?).await; Some(()) }, if check_at.is_some() => {
                check_at = None;
                for strand in check(ctx, &reset, std::mem::take(&mut labelled)).await {
                    report(ctx, &reset, &strand).await;
                }
            }
            event = watch.next() => match event {
                Some(PodEvent::Settled { name, uid }) if reset.pods.contains(&name) && seen.insert(uid.clone()) => {
                    // Its node, from its own annotation: the pod is the new one (by UID).
                    match pods.get_metadata_opt(&name).await {
                        Ok(Some(meta)) if meta.metadata.uid.as_deref() == Some(uid.as_str()) => {
                            if let Some(id) = node_id(&meta) {
                                labelled.insert(name, id);
                                check_at.get_or_insert_with(|| Instant::now() + GATHER);
                            }
                        }
                        Ok(_) => {}
                        Err(error) => debug!(pod = name, error = %fault::explain(&error), "reading a labelled reset pod failed"),
                    }
                }
                Some(_) => {}
                None => return,
            },
        }
    }
}

fn node_id(meta: &PartialObjectMeta<Pod>) -> Option<String> {
    meta.metadata
        .annotations
        .as_ref()?
        .get(labels::NODE_ID)
        .cloned()
}

/// The strands among `labelled`, from one fresh read of the workflow.
async fn check(ctx: &Context, reset: &Reset, labelled: BTreeMap<String, String>) -> Vec<Strand> {
    let workflows: Api<Workflow> = Api::namespaced(ctx.client(), &reset.namespace);
    let wf = match workflows.get(&reset.workflow).await {
        Ok(wf) => wf,
        Err(error) => {
            debug!(workflow = reset.workflow, error = %fault::explain(&error), "reading the reset workflow failed");
            return Vec::new();
        }
    };
    let status = &wf.status;
    let nodes = match (&status.nodes, &status.compressed_nodes) {
        (Some(nodes), _) => nodes.clone(),
        (None, Some(compressed)) => {
            match decode_nodes(
                compressed,
                ctx.config.argo_version,
                ctx.config.max_nodes_size,
            ) {
                Ok(nodes) => nodes,
                Err(error) => {
                    debug!(workflow = reset.workflow, %error, "the reset workflow's nodes do not decode");
                    return Vec::new();
                }
            }
        }
        // Offloaded: the nodes are in Argo's database; not read for this.
        (None, None) if status.offload_node_status_version.is_some() => return Vec::new(),
        (None, None) => Default::default(),
    };
    strands(&labelled, &nodes)
}

/// Tells the user of `strand`: log, metric, Event, and the request's status
/// message, if the workflow still reports this request, and a
/// WorkflowRetry's, which `kubectl get wfretry` and `rewind status` show.
async fn report(ctx: &Context, reset: &Reset, strand: &Strand) {
    let message = strand.message(&reset.namespace);
    warn!(
        namespace = reset.namespace,
        workflow = reset.workflow,
        pod = strand.pod,
        node = strand.node,
        "a reset node's new pod carries Argo's completed label: the node is stranded"
    );
    ctx.metrics.node_stranded();
    Events::of_workflow(ctx, &reset.namespace, &reset.workflow, &reset.uid)
        .publish(EventType::Warning, STRANDED, message.clone())
        .await;
    let workflows: Api<Workflow> = Api::namespaced(ctx.client(), &reset.namespace);
    // Guarded by the version read, so a later request's status is never
    // overwritten; Argo writes the workflow often, so a few tries.
    for _ in 0..3 {
        // Unread, or reporting another request now: the WorkflowRetry is still told.
        let Ok(meta) = workflows.get_metadata(&reset.workflow).await else {
            break;
        };
        let annotations = meta.metadata.annotations.unwrap_or_default();
        let Ok(Some(mut status)) = request::status_of(&annotations, &reset.token) else {
            break;
        };
        status.message = request::bounded(&format!("{}; {message}", status.message));
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": meta.metadata.resource_version,
            "annotations": {annotations::STATUS: serde_json::to_string(&status).expect("status serializes")},
        }});
        match workflows
            .patch_metadata(
                &reset.workflow,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Err(error) if fault::api_code(&error) == Some(409) => continue,
            _ => break,
        }
    }
    if let Some(uid) = reset
        .token
        .strip_prefix(request::WORKFLOWRETRY_TOKEN_PREFIX)
    {
        tell_object(ctx, &reset.namespace, uid, &message).await;
    }
}

/// Adds `message` to the status message of the WorkflowRetry `uid`, which
/// has most often ended by now. A strand is rare, so the object is found by
/// one list of the namespace's WorkflowRetries, not kept from the start.
async fn tell_object(ctx: &Context, namespace: &str, uid: &str, message: &str) {
    let retries: Api<WorkflowRetry> = Api::namespaced(ctx.client(), namespace);
    for _ in 0..3 {
        let listed = match retries.list(&ListParams::default()).await {
            Ok(listed) => listed,
            Err(error) => {
                debug!(namespace, error = %fault::explain(&error), "listing WorkflowRetries to report a strand failed");
                return;
            }
        };
        let Some(object) = listed
            .items
            .into_iter()
            .find(|o| o.metadata.uid.as_deref() == Some(uid))
        else {
            return;
        };
        let current = object.status.map(|s| s.message).unwrap_or_default();
        if current.contains(message) {
            return;
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": object.metadata.resource_version},
            "status": {"message": request::bounded(&format!("{current}; {message}"))},
        });
        let name = object.metadata.name.unwrap_or_default();
        match retries
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(error) if fault::api_code(&error) == Some(409) => continue,
            Err(error) => {
                debug!(namespace, name, error = %fault::explain(&error), "reporting a strand on its WorkflowRetry failed");
                return;
            }
            Ok(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::workflow::NodeStatus;

    fn node(name: &str, phase: Option<&str>) -> Box<NodeStatus> {
        Box::new(NodeStatus {
            name: name.into(),
            phase: phase.map(Into::into),
            ..Default::default()
        })
    }

    #[test]
    fn a_labelled_pod_of_an_unfinished_or_missing_node_is_a_strand() {
        let nodes = [
            ("id-ok".to_string(), node("wf.ok", Some("Succeeded"))),
            ("id-failed".to_string(), node("wf.failed", Some("Failed"))),
            (
                "id-pending".to_string(),
                node("wf.pending", Some("Pending")),
            ),
            (
                "id-running".to_string(),
                node("wf.running", Some("Running")),
            ),
        ]
        .into_iter()
        .collect();
        let labelled: BTreeMap<String, String> = [
            ("p-ok", "id-ok"),
            ("p-failed", "id-failed"),
            ("p-pending", "id-pending"),
            ("p-running", "id-running"),
            ("p-missing", "id-missing"),
        ]
        .into_iter()
        .map(|(p, n)| (p.to_string(), n.to_string()))
        .collect();
        let got = strands(&labelled, &nodes);
        let names: Vec<(&str, Option<&str>)> = got
            .iter()
            .map(|s| (s.pod.as_str(), s.phase.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("p-missing", None),
                ("p-pending", Some("Pending")),
                ("p-running", Some("Running"))
            ]
        );
        let text = got[1].message("argo");
        assert!(
            text.starts_with("node wf.pending is Pending but its new pod p-pending is labelled workflows.argoproj.io/completed=true"),
            "{text}"
        );
        assert!(
            text.ends_with("kubectl label pod -n argo p-pending workflows.argoproj.io/completed=false --overwrite"),
            "{text}"
        );
        assert!(
            got[0]
                .message("argo")
                .contains("node id-missing is not made again yet")
        );
    }
}
