//! The retry planner: Argo's `FormulateRetryWorkflow` (workflow/util/util.go)
//! in Rust, pure, as the Argo server runs it: hydrate (decompress
//! `status.compressedNodes`), formulate, dehydrate (compress when over the
//! size limit). The plan is the reset workflow, the pods to delete before
//! writing it, and the node IDs deleted and reset.
//!
//! Both Argo lines are supported ([`ArgoVersion`]); they differ in:
//! - v3.7 sets `status.phase` and the phase label to `Running`, v4 clears the
//!   phase (and v3.7 panics on a workflow without labels);
//! - v4 follows a retried node to its `Retry` parent only, v3.7 to any node
//!   listing it as a child (and panics when there is none);
//! - v4 deletes the children of reset TaskGroup/StepGroup nodes when
//!   parameters are overridden (argo-workflows#15802), also those of succeeded
//!   siblings, which reruns them: that regression is reproduced;
//! - v4 takes a pod name's hash from the node ID ([`pod_name`]);
//! - v3.7 reads gzip `compressedNodes` only, v4 also zstd and brotli.
//!
//! Where Argo depends on Go's random map order the planner takes one fixed
//! choice, documented where it is made: the parent of a node listed by
//! several nodes (v4's rule: last in node-ID order; v3.7 is random, see
//! [`plan_retry_with_parents`]), the node v3.7 checks for a retried node
//! listed by several, the `Retry` parent in v4 when several list it (first in
//! node-ID order), the root when several nodes carry the workflow's name (the
//! one whose ID is the name, else the first in ID order), and which fault an
//! error names when there are several (the first in node-ID order). Where
//! Argo's code panics or never terminates the planner returns
//! [`PlanError::ArgoPanics`] or [`PlanError::ArgoLoops`].
//!
//! Other surprises of Argo's rules, reproduced as they are:
//! - every node whose name starts with `<workflow>.onExit` is dropped, and
//!   every node below the exact `<workflow>.onExit` node, Steps and DAG nodes
//!   included, adds a pod name to delete (names that never had a pod);
//! - the failed node of a Succeeded workflow (continueOn) is retried along
//!   with the selected nodes; selecting the root node deletes every node;
//! - a failed node with a succeeded descendant (a hook) is not retried;
//! - a Container node makes its whole Pod and every container in it rerun;
//!   without a Pod above it the retry fails ("was seeking node ...");
//! - only group and failed Retry nodes are ever reset, so `resetNode`'s
//!   Suspend rule (forget supplied outputs) never applies in a retry;
//! - a selector term with an empty field and value (`=`, `!=`) matches every
//!   node, and terms are sorted before parsing, which decides which error is
//!   reported; without restartSuccessful the selector is not even parsed;
//! - an input parameter without a value makes Argo's selector matching
//!   panic; a missing child below a failed node panics instead of the error
//!   a missing child elsewhere gives;
//! - the size limit compares the length of Go's JSON, which the planner
//!   estimates ([`compress::go_json_size`]).

pub mod compress;
mod dag;
pub mod pod_name;
pub mod selector;

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use thiserror::Error;

use crate::argo::workflow::{
    Condition, Lazy, NodeStatus, Parameter, Text, Workflow, WorkflowSpec, WorkflowStatus, labels,
};
use compress::{CompressError, Nodes};
use dag::{Graph, failed_or_error, is_execution, node_type};
use pod_name::HashTooLong;
use selector::{Selector, SelectorError};

/// The Argo release line whose retry rules to follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ArgoVersion {
    /// v4.x (v4.1.4's rules).
    #[default]
    V4,
    /// v3.7.x (v3.7.6's rules).
    V3_7,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("unknown Argo version {0:?}: use v4 (any 4.x) or v3.7")]
pub struct ParseArgoVersionError(String);

impl FromStr for ArgoVersion {
    type Err = ParseArgoVersionError;

    /// "v4", "4", "v4.1", "4.1.4", "v3.7", "3.7", "v3.7.6", ...
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v = s.trim();
        let v = v.strip_prefix(['v', 'V']).unwrap_or(v);
        let mut parts = v.split('.');
        match (parts.next(), parts.next()) {
            (Some("4"), _) => Ok(Self::V4),
            (Some("3"), Some("7")) => Ok(Self::V3_7),
            _ => Err(ParseArgoVersionError(s.to_owned())),
        }
    }
}

impl std::fmt::Display for ArgoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::V4 => "v4",
            Self::V3_7 => "v3.7",
        })
    }
}

/// The options of `argo retry`, plus the Argo line and size limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryOptions {
    pub restart_successful: bool,
    pub node_field_selector: String,
    /// `NAME=VALUE` overrides of the workflow's arguments.
    pub parameters: Option<Vec<String>>,
    pub argo_version: ArgoVersion,
    /// Argo's `MAX_WORKFLOW_SIZE`: above it the nodes are stored compressed.
    pub max_workflow_size: usize,
    /// How the cluster's Argo compresses nodes, which rewind writes too.
    pub compression: compress::Compression,
    /// The most bytes `status.compressedNodes` may inflate to.
    pub max_nodes_size: usize,
}

impl Default for RetryOptions {
    fn default() -> Self {
        Self {
            restart_successful: false,
            node_field_selector: String::new(),
            parameters: None,
            argo_version: ArgoVersion::default(),
            max_workflow_size: compress::DEFAULT_MAX_WORKFLOW_SIZE,
            compression: compress::Compression::default(),
            max_nodes_size: compress::DEFAULT_MAX_NODES_SIZE,
        }
    }
}

/// What a retry does: write `workflow` once every pod in `pods_to_delete` is
/// gone.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub workflow: Workflow,
    /// Sorted.
    pub pods_to_delete: Vec<String>,
    /// IDs of the nodes the reset workflow no longer has, sorted.
    pub nodes_deleted: Vec<String>,
    /// IDs of the nodes reset to run again, sorted.
    pub nodes_reset: Vec<String>,
    /// The Kubernetes node each pod to delete ran on, where Argo recorded it
    /// (`hostNodeName`): a hint for splitting a bulk delete by node.
    #[serde(skip)]
    pub pod_nodes: BTreeMap<String, String>,
}

/// Why a workflow cannot be retried. Each message is the one `argo retry`
/// prints in that case.
#[derive(Debug, Error)]
pub enum PlanError {
    #[error("Cannot retry a workflow in phase {phase}")]
    PhaseNotRetryable { phase: String },
    #[error(
        "To retry a succeeded workflow, set the options restartSuccessful and nodeFieldSelector"
    )]
    SucceededNeedsSelector,
    #[error("expected parameter of the form: NAME=VALUE. Received: {parameter}")]
    BadParameter { parameter: String },
    #[error(transparent)]
    BadSelector(#[from] SelectorError),
    #[error("couldn't find parent node for {node}")]
    MissingParent { node: String },
    /// Argo's message has this typo.
    #[error("coudln't obtain child {child}")]
    MissingChild { child: String },
    /// A Container node without a Pod above it, or a boundaryID that is not
    /// an ancestor.
    #[error("was seeking node but ran out of nodes to explore")]
    NoAncestor { node: String },
    #[error(
        "workflow is longer than maximum allowed size. compressed size {compressed_size} > maxSize {max_size}Tried to offload but encountered error: offload node status is not supported"
    )]
    TooLarge {
        compressed_size: usize,
        max_size: usize,
    },
    /// The nodes are in Argo's offload database, which rewind does not read.
    #[error("offload node status is not supported")]
    OffloadedNodes,
    #[error("{0}")]
    CorruptCompressedNodes(#[from] CompressError),
    /// Argo's own code panics on this workflow: `argo retry` fails with an
    /// internal error.
    #[error("argo retry panics on this workflow: {reason}")]
    ArgoPanics { reason: String },
    /// Argo's own code never finishes on this workflow.
    #[error("argo retry never finishes on this workflow: {reason}")]
    ArgoLoops { reason: String },
}

impl From<HashTooLong> for PlanError {
    fn from(e: HashTooLong) -> Self {
        Self::ArgoPanics {
            reason: format!("runtime error: slice bounds out of range ({e})"),
        }
    }
}

/// Plans the retry of `wf` as Argo would at this moment.
pub fn plan_retry(wf: &Workflow, opts: &RetryOptions) -> Result<Plan, PlanError> {
    plan_retry_at(wf, opts, Timestamp::now())
}

/// [`plan_retry`] of a workflow the caller gives up: its nodes and spec are
/// moved into the reset workflow rather than copied, so a large workflow
/// (tens of thousands of nodes, a DAG of as many tasks) is held once, not
/// twice, while it is planned. The borrowing planners copy it first.
pub fn plan_retry_owned(wf: Workflow, opts: &RetryOptions) -> Result<Plan, PlanError> {
    plan(wf, opts, Timestamp::now(), &last_listed)
}

/// [`plan_retry`] with "now" given, for the timestamps Argo sets.
pub fn plan_retry_at(
    wf: &Workflow,
    opts: &RetryOptions,
    now: Timestamp,
) -> Result<Plan, PlanError> {
    plan_retry_with_parents(wf, opts, now, &last_listed)
}

/// Picks, for a node listed as a child by several nodes, the one Argo
/// records as its parent: given the node's ID and the listing nodes' IDs in
/// ID order, the index of the chosen one.
pub type ChooseParent<'f> = &'f dyn Fn(&str, &[&str]) -> usize;

/// Argo v4's rule: the last listing node in ID order.
pub fn last_listed(_child: &str, listers: &[&str]) -> usize {
    listers.len().saturating_sub(1)
}

/// [`plan_retry_at`] with the parent choice given. Argo v3.7 takes a random
/// listing node (Go map order) as the parent, and as the node to check for a
/// retried node, so its retry of such a workflow can differ from run to run;
/// this shows each possible outcome. [`plan_retry`] uses v4's deterministic
/// rule ([`last_listed`]) for both lines.
pub fn plan_retry_with_parents(
    wf: &Workflow,
    opts: &RetryOptions,
    now: Timestamp,
    choose: ChooseParent<'_>,
) -> Result<Plan, PlanError> {
    plan(wf.clone(), opts, now, choose)
}

/// The planner, on a workflow of its own.
fn plan(
    mut wf: Workflow,
    opts: &RetryOptions,
    now: Timestamp,
    choose: ChooseParent<'_>,
) -> Result<Plan, PlanError> {
    let now = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let version = opts.argo_version;

    // Hydrate, as the Argo server does before it formulates the retry.
    let compressed = compress::blob_to_hydrate(&wf.status);
    let hydrated = compressed.is_some();
    let nodes: Nodes = match compressed {
        Some(c) => compress::decode_nodes(c, version, opts.max_nodes_size)?,
        None => wf.status.nodes.take().unwrap_or_default(),
    };
    if wf
        .status
        .offload_node_status_version
        .as_deref()
        .is_some_and(|v| !v.is_empty())
    {
        return Err(PlanError::OffloadedNodes);
    }

    let phase = wf.status.phase.as_deref().unwrap_or_default();
    match phase {
        "Failed" | "Error" => {}
        "Succeeded" if opts.restart_successful && !opts.node_field_selector.is_empty() => {}
        "Succeeded" => return Err(PlanError::SucceededNeedsSelector),
        _ => {
            return Err(PlanError::PhaseNotRetryable {
                phase: phase.to_owned(),
            });
        }
    }

    let mut new_wf = new_retry_workflow(&mut wf, hydrated, opts, &now)?;
    let wf = &wf;
    let selected = selected_nodes(&nodes, opts)?;
    let failed = failed_nodes(&nodes, &selected, version, choose)?;

    let graph = Graph::build(&nodes, wf.name(), choose)?;
    let mut seeds = vec![false; graph.nodes.len()];
    for id in selected.iter().copied().chain(failed) {
        if let Some(&i) = graph.index.get(id) {
            seeds[i] = true;
        }
    }
    let (reset, delete) = reset_and_delete(&graph, wf.name(), &seeds, opts)?;

    let mut pods = Vec::new();
    let mut pod_nodes = BTreeMap::new();
    let mut add_pod = |node: &NodeStatus| -> Result<(), PlanError> {
        let pod = pod_name::node_pod_name(wf, node, version)?;
        if let Some(host) = &node.host_node_name {
            pod_nodes.insert(pod.clone(), host.to_string());
        }
        pods.push(pod);
        Ok(())
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        if delete[i] && node.type_ == node_type::POD {
            add_pod(node)?;
        }
    }
    let outcome = node_outcomes(&graph, &reset, &delete, wf.name(), add_pod)?;
    drop(graph);
    let new_nodes = finish_nodes(nodes, outcome.fates, &now);
    new_wf.status.nodes = Some(new_nodes);

    compress::dehydrate(
        &mut new_wf,
        opts.max_workflow_size,
        &opts.compression,
        version,
    )
    .map_err(|e| PlanError::TooLarge {
        compressed_size: e.compressed_size,
        max_size: e.max_size,
    })?;

    pods.sort_unstable();
    pods.dedup();
    Ok(Plan {
        workflow: new_wf,
        pods_to_delete: pods,
        nodes_deleted: outcome.deleted,
        nodes_reset: outcome.reset,
        pod_nodes,
    })
}

/// What becomes of a node, with the children and outbound nodes it keeps.
struct Fate {
    kind: FateKind,
    children: Option<Vec<Text>>,
    outbound_nodes: Option<Vec<Text>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FateKind {
    Reset,
    Keep,
    Drop,
}

/// Every node's fate (in the node map's order), and the keys reset and
/// dropped.
struct Outcome {
    fates: Vec<Fate>,
    reset: Vec<String>,
    deleted: Vec<String>,
}

/// The fates of the nodes after `resetPath`: reset, kept (pruned of deleted
/// children and outbound nodes) or dropped, which also drops every node named
/// like the exit handler. `exit_pod` is called for every node of the exit
/// handler, whatever its type, whose pod Argo deletes.
fn node_outcomes(
    graph: &Graph<'_>,
    reset: &[bool],
    delete: &[bool],
    workflow_name: &str,
    mut exit_pod: impl FnMut(&NodeStatus) -> Result<(), PlanError>,
) -> Result<Outcome, PlanError> {
    let on_exit = format!("{workflow_name}.onExit");
    let mut outcome = Outcome {
        fates: Vec::with_capacity(graph.nodes.len()),
        reset: Vec::new(),
        deleted: Vec::new(),
    };
    let is_deleted = |id: &&Text| graph.index.get(id.as_str()).is_some_and(|&j| delete[j]);
    for (i, node) in graph.nodes.iter().enumerate() {
        let kind = if reset[i] && !delete[i] {
            outcome.reset.push(node.id.to_string());
            FateKind::Reset
        } else if !delete[i] && !node.name.starts_with(&on_exit) {
            FateKind::Keep
        } else {
            outcome.deleted.push(node.id.to_string());
            FateKind::Drop
        };
        let fate = if kind == FateKind::Drop {
            Fate {
                kind,
                children: None,
                outbound_nodes: None,
            }
        } else {
            let children = node.children().iter().zip(&graph.children[i]);
            let outbound = node.outbound_nodes.iter().flatten();
            Fate {
                kind,
                children: non_empty(
                    children
                        .filter(|&(_, &c)| !delete[c])
                        .map(|(id, _)| id.clone())
                        .collect(),
                ),
                outbound_nodes: non_empty(outbound.filter(|id| !is_deleted(id)).cloned().collect()),
            }
        };
        outcome.fates.push(fate);
        if node.name == on_exit {
            exit_pod(node)?;
            let mut result = Ok(());
            graph.descendants(i, |d| {
                if result.is_ok() {
                    result = exit_pod(graph.nodes[d]);
                }
            })?;
            result?;
        }
    }
    Ok(outcome)
}

/// The reset workflow's nodes, moved from the workflow's.
fn finish_nodes(nodes: Nodes, fates: Vec<Fate>, now: &str) -> Nodes {
    nodes
        .into_iter()
        .zip(fates)
        .filter(|(_, fate)| fate.kind != FateKind::Drop)
        .map(|((key, mut node), fate)| {
            if fate.kind == FateKind::Reset {
                reset_node(&mut node, now);
            }
            node.children = fate.children;
            node.outbound_nodes = fate.outbound_nodes;
            (key, node)
        })
        .collect()
}

fn non_empty(v: Vec<Text>) -> Option<Vec<Text>> {
    (!v.is_empty()).then_some(v)
}

/// `createNewRetryWorkflow`: the workflow without nodes, marked as running
/// again. `hydrated` says the input's nodes came from `compressedNodes`,
/// which Argo clears when it reads them. Moves the spec and status out of
/// `wf`, leaving its metadata (what the pod names read).
fn new_retry_workflow(
    wf: &mut Workflow,
    hydrated: bool,
    opts: &RetryOptions,
    now: &str,
) -> Result<Workflow, PlanError> {
    // Destructured so that a field added to the status is not silently dropped.
    let WorkflowStatus {
        phase: _,
        started_at: _,
        finished_at: _,
        message: _,
        nodes: _,
        compressed_nodes,
        offload_node_status_version,
        persistent_volume_claims: _,
        conditions,
        stored_workflow_spec,
        other,
    } = std::mem::take(&mut wf.status);
    let mut new_wf = Workflow {
        api_version: wf.api_version.clone(),
        kind: wf.kind.clone(),
        metadata: wf.metadata.clone(),
        spec: std::mem::take(&mut wf.spec),
        status: WorkflowStatus {
            phase: None,
            started_at: Some(now.to_owned()),
            finished_at: None,
            message: None,
            nodes: None,
            compressed_nodes: compressed_nodes.filter(|c| !hydrated && !c.is_empty()),
            offload_node_status_version: offload_node_status_version.filter(|v| !v.is_empty()),
            persistent_volume_claims: None,
            conditions,
            stored_workflow_spec,
            other,
        },
        other: std::mem::take(&mut wf.other),
    };

    if let Some(l) = new_wf.metadata.labels.as_mut() {
        l.remove(labels::COMPLETED);
        l.remove(labels::WORKFLOW_ARCHIVING_STATUS);
    }
    upsert_condition(
        new_wf.status.conditions.get_or_insert_default(),
        Condition {
            type_: Some("Completed".into()),
            status: Some("False".into()),
            ..Default::default()
        },
    );
    if opts.argo_version == ArgoVersion::V3_7 {
        let Some(l) = new_wf.metadata.labels.as_mut() else {
            return Err(PlanError::ArgoPanics {
                reason: "assignment to entry in nil map (the workflow has no labels)".into(),
            });
        };
        l.insert(labels::PHASE.into(), "Running".into());
        new_wf.status.phase = Some("Running".into());
    }
    if let Some(stored) = new_wf.status.stored_workflow_spec.as_mut() {
        stored.shutdown = None;
    }
    new_wf.spec.shutdown = None;
    if new_wf.spec.active_deadline_seconds == Some(0) {
        // A terminated workflow got deadline 0; the retry must not inherit it.
        new_wf.spec.active_deadline_seconds = None;
    }
    if let Some(params) = opts.parameters.as_deref().filter(|p| !p.is_empty()) {
        if wf.label(labels::PREVIOUS_WORKFLOW_NAME).is_some() {
            tracing::warn!(
                workflow = wf.name(),
                "Overriding parameters on resubmitted workflows may have unexpected results"
            );
        }
        override_parameters(&mut new_wf, params)?;
    }
    Ok(new_wf)
}

/// `Conditions.UpsertCondition`: replaces the condition of the same type.
fn upsert_condition(conditions: &mut Vec<Condition>, condition: Condition) {
    let type_ = condition.type_.as_deref().unwrap_or_default();
    match conditions
        .iter_mut()
        .find(|c| c.type_.as_deref().unwrap_or_default() == type_)
    {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

/// `overrideParameters`: the given parameters first, in order (duplicates
/// kept), then the workflow's others; the stored spec gets the same list.
fn override_parameters(wf: &mut Workflow, params: &[String]) -> Result<(), PlanError> {
    let mut new_params = Vec::with_capacity(params.len());
    let mut passed = HashSet::new();
    for p in params {
        let Some((name, value)) = p.split_once('=') else {
            return Err(PlanError::BadParameter {
                parameter: p.clone(),
            });
        };
        new_params.push(Parameter {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        });
        passed.insert(name);
    }
    let old = wf
        .spec
        .arguments
        .as_ref()
        .and_then(|a| a.parameters.as_ref());
    new_params.extend(
        old.into_iter()
            .flatten()
            .filter(|p| !passed.contains(p.name.as_str()))
            .cloned(),
    );
    let set = |spec: &mut WorkflowSpec| {
        spec.arguments.get_or_insert_default().parameters = Some(new_params.clone())
    };
    if let Some(stored) = wf.status.stored_workflow_spec.as_deref_mut() {
        set(stored);
    }
    set(&mut wf.spec);
    Ok(())
}

/// `getNodeIDsToReset`: the node IDs the selector picks, when restarting
/// successful nodes.
fn selected_nodes<'a>(
    nodes: &'a Nodes,
    opts: &RetryOptions,
) -> Result<HashSet<&'a str>, PlanError> {
    let mut selected = HashSet::new();
    if !opts.restart_successful || opts.node_field_selector.is_empty() {
        return Ok(selected);
    }
    let selector = Selector::parse(&opts.node_field_selector)?;
    for node in nodes.values() {
        let matched = selector.matches_node(node).map_err(|e| PlanError::ArgoPanics {
            reason: format!(
                "invalid memory address or nil pointer dereference (input parameter {:?} of node {} has no value)",
                e.parameter, e.node_id
            ),
        })?;
        if matched {
            selected.insert(node.id.as_str());
        }
    }
    Ok(selected)
}

/// The failed execution nodes (by map key) that no succeeded node below them,
/// or below their Retry parent for a retried node, makes unnecessary to rerun.
fn failed_nodes<'a>(
    nodes: &'a Nodes,
    selected: &HashSet<&str>,
    version: ArgoVersion,
    choose: ChooseParent<'_>,
) -> Result<Vec<&'a str>, PlanError> {
    let mut parents_of: Option<HashMap<&str, Vec<&NodeStatus>>> = None;
    let mut memo = HashMap::new();
    let mut failed = Vec::new();
    for (key, node) in nodes {
        if !failed_or_error(node) || !is_execution(&node.type_) {
            continue;
        }
        let mut check: &NodeStatus = node;
        if node.node_flag.as_ref().is_some_and(|f| f.retried) {
            let parents = parents_of.get_or_insert_with(|| index_parents(nodes));
            let candidates = parents
                .get(key.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            // Go's `Find` takes the first match in random map order.
            match version {
                // Several Retry nodes with one child do not occur: the first in ID order.
                ArgoVersion::V4 => {
                    if let Some(retry) = candidates.iter().find(|p| p.type_ == node_type::RETRY) {
                        check = retry;
                    }
                }
                ArgoVersion::V3_7 => match candidates {
                    [] => {
                        return Err(PlanError::ArgoPanics {
                            reason: format!(
                                "runtime error: invalid memory address or nil pointer dereference (retried node {key} has no parent)"
                            ),
                        });
                    }
                    [only] => check = only,
                    several => {
                        let ids: Vec<&str> = several.iter().map(|p| p.id.as_str()).collect();
                        check = several[choose(key, &ids).min(several.len() - 1)];
                    }
                },
            }
        }
        if !descendant_succeeded(nodes, check, selected, &mut memo, version)? {
            failed.push(key.as_str());
        }
    }
    Ok(failed)
}

/// Child ID -> the nodes listing it, in node-ID order.
fn index_parents(nodes: &Nodes) -> HashMap<&str, Vec<&NodeStatus>> {
    let mut parents: HashMap<&str, Vec<&NodeStatus>> = HashMap::new();
    for node in nodes.values().map(|n| &**n) {
        for child in node.children() {
            let listers = parents.entry(child.as_str()).or_default();
            if !listers.last().is_some_and(|&last| std::ptr::eq(last, node)) {
                listers.push(node);
            }
        }
    }
    parents
}

/// `isDescendantNodeSucceeded`, iteratively: whether a node below `node`
/// succeeded and is not selected. Argo recurses without a guard, so a missing
/// child panics and a cycle recurses until the stack overflows.
fn descendant_succeeded<'a>(
    nodes: &'a Nodes,
    node: &'a NodeStatus,
    selected: &HashSet<&str>,
    memo: &mut HashMap<&'a str, bool>,
    version: ArgoVersion,
) -> Result<bool, PlanError> {
    // Frames of (node, index of the next child); `on_stack` finds recursion into itself.
    let mut stack: Vec<(&NodeStatus, usize)> = vec![(node, 0)];
    let mut on_stack: HashSet<&str> = HashSet::new();
    on_stack.insert(node.id.as_str());
    let mut returned: Option<bool> = None;
    while let Some((curr, next)) = stack.last_mut() {
        if returned.take() == Some(true) {
            // A child's subtree has a success: every frame returns true.
            for (n, _) in stack.drain(..) {
                memo.insert(&n.id, true);
            }
            return Ok(true);
        }
        let Some(child_id) = curr.children().get(*next) else {
            let (done, _) = stack.pop().unwrap_or((node, 0));
            on_stack.remove(done.id.as_str());
            memo.insert(&done.id, false);
            returned = Some(false);
            continue;
        };
        *next += 1;
        let Some(child) = nodes.get(child_id.as_str()) else {
            let reason = match version {
                ArgoVersion::V4 => format!(
                    "runtime error: invalid memory address or nil pointer dereference (child {child_id} is missing)"
                ),
                ArgoVersion::V3_7 => format!("Coudn't obtain child for {child_id}, panicking"),
            };
            return Err(PlanError::ArgoPanics { reason });
        };
        if !selected.contains(child_id.as_str()) && child.phase() == "Succeeded" {
            returned = Some(true);
            continue;
        }
        if let Some(&known) = memo.get(child.id.as_str()) {
            returned = Some(known);
            continue;
        }
        if !on_stack.insert(child.id.as_str()) {
            return Err(PlanError::ArgoPanics {
                reason: format!(
                    "stack overflow (the children below node {} form a cycle)",
                    child.id
                ),
            });
        }
        stack.push((child, 0));
    }
    Ok(returned.unwrap_or(false))
}

/// The seeds' `resetPath`s in breadth-first order, then the #15802 rule:
/// which graph nodes to reset and which to delete.
fn reset_and_delete(
    graph: &Graph<'_>,
    workflow_name: &str,
    seeds: &[bool],
    opts: &RetryOptions,
) -> Result<(Vec<bool>, Vec<bool>), PlanError> {
    let n = graph.nodes.len();
    let mut reset = vec![false; n];
    let mut delete = vec![false; n];
    if n == 0 {
        return Ok((reset, delete));
    }
    // Several nodes named like the workflow: Go takes the first in random
    // order; here the one whose ID is the name, else the first in ID order.
    let named: Vec<usize> = (0..n)
        .filter(|&i| graph.nodes[i].name == workflow_name)
        .collect();
    let Some(&root) = named
        .iter()
        .find(|&&i| graph.nodes[i].id == workflow_name)
        .or(named.first())
    else {
        return Err(PlanError::ArgoPanics {
            reason: "couldn't find root node".into(),
        });
    };
    let order = graph.bfs_order(root, opts.argo_version == ArgoVersion::V3_7)?;
    // singularPath's root: the last parentless node in that order.
    let path_root = order
        .iter()
        .rev()
        .copied()
        .find(|&i| graph.parent[i].is_none());
    for &i in &order {
        if !seeds[i] || delete[i] {
            continue;
        }
        let Some(path_root) = path_root else {
            return Err(PlanError::ArgoPanics {
                reason:
                    "runtime error: index out of range [-1] (no parentless node below the root)"
                        .into(),
            });
        };
        graph.reset_path(path_root, i, &mut reset, &mut delete)?;
    }

    let overridden = opts.parameters.as_ref().is_some_and(|p| !p.is_empty());
    if opts.argo_version == ArgoVersion::V4 && overridden {
        // #15802: rerun the children of reset groups with the new values. This
        // includes succeeded siblings of the failed node (the upstream
        // regression), and the result is the same in any order.
        for i in 0..n {
            let t = graph.nodes[i].type_.as_str();
            if reset[i] && !delete[i] && matches!(t, node_type::TASK_GROUP | node_type::STEP_GROUP)
            {
                graph.descendants(i, |d| delete[d] = true)?;
            }
        }
    }
    Ok((reset, delete))
}

/// `resetNode`: the node runs again (a Skipped node stays Skipped, so the
/// workflow does not hang on it); a Suspend node forgets supplied outputs.
fn reset_node(node: &mut NodeStatus, now: &str) {
    if node.type_ == node_type::SUSPEND
        && let Some(outputs) = &mut node.outputs
    {
        let mut parsed = outputs.get();
        for p in parsed.parameters.iter_mut().flatten() {
            *p = Parameter {
                name: std::mem::take(&mut p.name),
                value_from: Some(serde_json::json!({"supplied": {}}).into()),
                ..Default::default()
            };
        }
        *outputs = Lazy::new(&parsed);
    }
    if node.phase() != "Skipped" {
        node.phase = Some("Running".into());
    }
    node.message = None;
    node.started_at = Some(now.into());
    node.finished_at = None;
}

#[cfg(test)]
mod tests;
