//! Generator of completed Argo workflows for the retry differential test.
//!
//! Each case is a `Workflow` as Argo's workflow-controller writes it (only
//! fields Argo's Go structs know, in the shape Go's `encoding/json` emits), plus
//! the retry options to apply. Node statuses come from a small simulation of
//! the controller (`operator.go`, `steps.go`, `dag.go`,
//! `container_set_template.go`, `exit_handler.go`, `hooks.go`): node names,
//! IDs, display names, boundaries, children and outbound nodes are linked the
//! way the controller links them, so the planner and Argo's own code are
//! compared on shapes that occur in real clusters. A few cases are corrupted on
//! purpose (see [`Defect`]).
//!
//! Everything is a pure function of a seed: [`generate`] for a fixed batch,
//! [`case_strategy`] for proptest, which shrinks the seed and the node budget.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use base64::Engine;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};
use serde_json::{Map, Value, json};

/// One retry to compare: the workflow and the options passed to Argo's
/// `FormulateRetryWorkflow`.
#[derive(Clone, Debug, PartialEq)]
pub struct GenCase {
    /// Reproduces the case: `case_from_seed(seed, budget)`.
    pub id: String,
    pub workflow: Value,
    pub restart_successful: bool,
    pub node_field_selector: String,
    pub parameters: Option<Vec<String>>,
    /// Argo's MAX_WORKFLOW_SIZE for the write-back, when the case sets one.
    pub max_workflow_size: Option<usize>,
}

/// The deliberate flaw of an invalid case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Defect {
    /// A node no other node lists as a child (and not the root or an onExit node).
    NoParent,
    /// A node lists a child ID that is not in `status.nodes`.
    MissingChild,
    /// `status.nodes` is empty or absent.
    EmptyNodes,
    /// No node is named like the workflow.
    NoRoot,
}

/// Nodes a default case may grow to; proptest shrinks towards fewer.
pub const DEFAULT_BUDGET: usize = 48;

/// `count` cases, the same for the same seed.
pub fn generate(seed: u64, count: usize) -> Vec<GenCase> {
    (0..count as u64)
        .map(|i| case_from_seed(splitmix64(seed ^ splitmix64(i)), DEFAULT_BUDGET))
        .collect()
}

/// The case for one seed and node budget (what a `GenCase::id` names).
pub fn case_from_seed(seed: u64, budget: usize) -> GenCase {
    generate_case(seed, budget).0
}

/// Cases for proptest: shrinking lowers the node budget and the seed.
pub fn case_strategy() -> impl Strategy<Value = GenCase> {
    (any::<u64>(), 1..=DEFAULT_BUDGET).prop_map(|(seed, budget)| case_from_seed(seed, budget))
}

/// The case and the defect it was given, if any (for the generator's own checks).
pub fn generate_case(seed: u64, budget: usize) -> (GenCase, Option<Defect>) {
    let mut r = Rand::new(seed);
    let collision = if r.chance(0.006) {
        Some(*r.pick(&COLLISIONS))
    } else {
        None
    };
    let wf_name = collision.map_or_else(|| workflow_name(&mut r), |(wf, _)| wf.to_owned());
    let large = r.chance(0.01);
    let mut sim = Sim::new(wf_name.clone(), &mut r, if large { 600 } else { budget });
    sim.colliding_tasks = collision.map(|(_, tasks)| tasks);
    let run = sim.run(&mut r, large);
    let mut shape = sim.finish();

    let defect = if r.chance(0.06) {
        Some(corrupt(&mut r, &mut shape, &wf_name))
    } else {
        None
    };
    let phase = workflow_phase(&mut r, &run);
    let nodes_json = shape.nodes_json();
    let options = options(&mut r, &shape, &phase);
    let mut workflow = assemble(
        &mut r,
        &wf_name,
        &phase,
        &run,
        &shape,
        nodes_json,
        &options.params_declared,
    );

    let max_workflow_size = if large || r.chance(0.04) {
        Some(size_limit(&mut r, &workflow))
    } else {
        None
    };
    match r.below(100) {
        0..=11 => compress_nodes(&mut r, &mut workflow),
        12 => offload_nodes(&mut workflow),
        _ => {}
    }
    let mut case = GenCase {
        id: format!("case_from_seed({seed:#x}, {budget})"),
        workflow,
        restart_successful: options.restart_successful,
        node_field_selector: options.selector,
        parameters: options.parameters,
        max_workflow_size,
    };
    // Drawn last, so the draws above (and the cases they make) stay as they were.
    if r.chance(0.04) {
        // Selecting the root deletes every node: the result has none.
        case.restart_successful = true;
        case.node_field_selector = format!("name={}", escape_value(&wf_name));
    }
    if r.chance(0.04) {
        add_stale_blob(&mut case.workflow);
    }
    (case, defect)
}

// ---------------------------------------------------------------- randomness

/// SplitMix64: derives independent per-case seeds from one seed.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Rand(TestRng);

impl Rand {
    fn new(seed: u64) -> Self {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&splitmix64(seed).to_le_bytes());
        bytes[8..].copy_from_slice(&splitmix64(!seed).to_le_bytes());
        Rand(TestRng::from_seed(RngAlgorithm::XorShift, &bytes))
    }

    fn chance(&mut self, p: f64) -> bool {
        self.0.random_bool(p)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }

    fn between(&mut self, lo: usize, hi: usize) -> usize {
        self.0.random_range(lo..=hi)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn hex(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| char::from_digit(self.below(16) as u32, 16).unwrap_or('0'))
            .collect()
    }

    fn alnum(&mut self, len: usize) -> String {
        const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..len).map(|_| char::from(*self.pick(CHARS))).collect()
    }
}

// ---------------------------------------------------------------- names and IDs

/// FNV-1a, as Go's `hash/fnv` computes it for node IDs; a few lines, so no crate.
fn fnv1a32(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const WORDS: &[&str] = &[
    "build",
    "test",
    "deploy",
    "fetch",
    "train",
    "validate",
    "notify",
    "lint",
    "package",
    "publish",
    "extract",
    "transform",
    "load",
    "report",
    "scan",
    "migrate",
    "backup",
    "render",
    "index",
    "sync",
];

const TEMPLATES: &[&str] = &[
    "main",
    "whalesay",
    "echo",
    "run-tests",
    "build-image",
    "process",
    "print-message",
    "flip-coin",
    "heads",
    "tails",
    "gen-data",
    "consume",
    "sleep",
    "fail",
    "succeed",
];

/// Long enough that "<workflow>-<template>" hits the pod name prefix limit
/// with most workflow names (the last one only with long ones).
const LONG_TEMPLATES: &[&str] = &[
    "a-very-long-template-name-that-pushes-the-pod-name-over-the-limit",
    "extract-transform-load-the-quarterly-financial-reporting-dataset",
    "template-name-of-exactly-forty-two-chars-x",
];

/// Workflows with two root DAG tasks whose node names collide in FNV-1a 32
/// (found by a birthday search): the second node gets Argo's widened 64-bit ID.
const COLLISIONS: [(&str, [&str; 2]); 2] = [
    ("collide-q7x2k", ["shard-71939", "shard-1580010"]),
    (
        "a-workflow-with-an-exceptionally-long-generated-name-c0ll1",
        ["shard-139599", "shard-322382"],
    ),
];

const WORKFLOW_TEMPLATES: &[&str] = &["shared-steps", "ci-templates", "data-pipeline-library"];

fn workflow_name(r: &mut Rand) -> String {
    let stem = match r.below(10) {
        0 => "a-workflow-with-an-exceptionally-long-generated-name-".to_owned(),
        1 => "x-".to_owned(),
        2 => format!("{}-{}-{}-", r.pick(WORDS), r.pick(WORDS), r.pick(WORDS)),
        _ => format!("{}-", r.pick(WORDS)),
    };
    format!("{stem}{}", r.alnum(5))
}

/// How a workflow's node IDs were made.
#[derive(Clone, Copy, PartialEq)]
enum IdStyle {
    /// `wf.NodeID(name)`: "<workflow>-<fnv32a(name)>".
    Current,
    /// IDs minted under another workflow name, as in old or copied workflows;
    /// pod names then hash the node name instead of reusing the ID.
    Foreign,
}

// ---------------------------------------------------------------- node model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pod,
    Container,
    Steps,
    StepGroup,
    Dag,
    TaskGroup,
    Retry,
    Skipped,
    Suspend,
    Http,
    Plugin,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Container => "Container",
            Kind::Steps => "Steps",
            Kind::StepGroup => "StepGroup",
            Kind::Dag => "DAG",
            Kind::TaskGroup => "TaskGroup",
            Kind::Retry => "Retry",
            Kind::Skipped => "Skipped",
            Kind::Suspend => "Suspend",
            Kind::Http => "HTTP",
            Kind::Plugin => "Plugin",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending,
    Running,
    Succeeded,
    Skipped,
    Failed,
    Error,
    Omitted,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Skipped => "Skipped",
            Phase::Failed => "Failed",
            Phase::Error => "Error",
            Phase::Omitted => "Omitted",
        }
    }

    fn failed(self) -> bool {
        matches!(self, Phase::Failed | Phase::Error)
    }

    fn fulfilled(self) -> bool {
        !matches!(self, Phase::Pending | Phase::Running)
    }
}

/// What a node was created from: `templateName`, or a `templateRef`.
#[derive(Clone, Debug)]
enum Tmpl {
    None,
    Name(String),
    Ref { name: String, template: String },
}

#[derive(Clone, Debug)]
struct Node {
    id: String,
    name: String,
    display_name: String,
    kind: Kind,
    tmpl: Tmpl,
    scope: String,
    phase: Phase,
    boundary_id: String,
    message: String,
    started: u64,
    finished: Option<u64>,
    /// `nodeFlag`: None, or (hooked, retried).
    flag: Option<(bool, bool)>,
    inputs: Vec<(String, String)>,
    /// Suspend outputs: (name, value) supplied by a user.
    supplied: Vec<(String, String)>,
    exit_code: Option<&'static str>,
    children: Vec<String>,
    outbound: Vec<String>,
    /// A Pod from a containerSet template (its outbound nodes are its containers').
    container_set: bool,
}

/// The node statuses of one workflow.
struct Shape {
    nodes: Vec<Node>,
    base_time: u64,
}

impl Shape {
    fn nodes_json(&self) -> Map<String, Value> {
        self.nodes
            .iter()
            .map(|n| (n.id.clone(), node_json(n, self.base_time)))
            .collect()
    }
}

/// RFC 3339 in whole seconds, as `metav1.Time` writes it, within May 2024.
fn timestamp(secs: u64) -> String {
    let secs = secs % (28 * 86_400);
    let (day, rest) = (secs / 86_400 + 1, secs % 86_400);
    format!(
        "2024-05-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

fn text(s: &str) -> Value {
    Value::String(s.to_owned())
}

fn texts(items: &[String]) -> Value {
    Value::Array(items.iter().map(|s| text(s)).collect())
}

/// A node as Go marshals `wfv1.NodeStatus` (omitempty fields left out).
/// Built with plain inserts: `json!` goes through `Serialize`, which is slow
/// in unoptimised test builds.
fn node_json(n: &Node, base: u64) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), text(&n.id));
    m.insert("name".into(), text(&n.name));
    m.insert("displayName".into(), text(&n.display_name));
    m.insert("type".into(), text(n.kind.as_str()));
    match &n.tmpl {
        Tmpl::None => {}
        Tmpl::Name(t) => {
            m.insert("templateName".into(), text(t));
        }
        Tmpl::Ref { name, template } => {
            let mut r = Map::new();
            r.insert("name".into(), text(name));
            r.insert("template".into(), text(template));
            m.insert("templateRef".into(), Value::Object(r));
        }
    }
    if !n.scope.is_empty() {
        m.insert("templateScope".into(), text(&n.scope));
    }
    m.insert("phase".into(), text(n.phase.as_str()));
    if !n.boundary_id.is_empty() {
        m.insert("boundaryID".into(), text(&n.boundary_id));
    }
    if !n.message.is_empty() {
        m.insert("message".into(), text(&n.message));
    }
    m.insert(
        "startedAt".into(),
        Value::String(timestamp(base + n.started)),
    );
    m.insert(
        "finishedAt".into(),
        n.finished
            .map_or(Value::Null, |f| Value::String(timestamp(base + f))),
    );
    if matches!(n.kind, Kind::Pod | Kind::Http | Kind::Plugin) && n.phase.fulfilled() {
        let done = u64::from(n.phase == Phase::Succeeded);
        m.insert("progress".into(), Value::String(format!("{done}/1")));
        let secs = n.finished.unwrap_or(n.started) - n.started;
        m.insert(
            "resourcesDuration".into(),
            json!({"cpu": secs, "memory": secs * 2}),
        );
    }
    if let Some((hooked, retried)) = n.flag {
        let mut flag = Map::new();
        if hooked {
            flag.insert("hooked".into(), Value::Bool(true));
        }
        if retried {
            flag.insert("retried".into(), Value::Bool(true));
        }
        m.insert("nodeFlag".into(), Value::Object(flag));
    }
    if !n.inputs.is_empty() {
        let params: Vec<Value> = n
            .inputs
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        m.insert("inputs".into(), json!({"parameters": params}));
    }
    let mut outputs = Map::new();
    if !n.supplied.is_empty() {
        let params: Vec<Value> = n
            .supplied
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v, "valueFrom": {"supplied": {}}}))
            .collect();
        outputs.insert("parameters".into(), Value::Array(params));
    }
    if let Some(code) = n.exit_code {
        outputs.insert("exitCode".into(), text(code));
    }
    if !outputs.is_empty() {
        m.insert("outputs".into(), Value::Object(outputs));
    }
    if !n.children.is_empty() {
        m.insert("children".into(), texts(&n.children));
    }
    if !n.outbound.is_empty() {
        m.insert("outboundNodes".into(), texts(&n.outbound));
    }
    if n.kind == Kind::Pod && n.phase.fulfilled() {
        m.insert("hostNodeName".into(), text("kind-worker"));
        m.insert("taskResultSynced".into(), Value::Bool(true));
    }
    Value::Object(m)
}

// ---------------------------------------------------------------- controller simulation

/// What a template invocation runs.
#[derive(Clone, Copy, PartialEq)]
enum Body {
    Pod,
    ContainerSet,
    Http,
    Plugin,
    Suspend,
    Steps,
    Dag,
}

/// The outcome of the whole run, for the workflow's status.
struct Run {
    root_phase: Phase,
    root_message: String,
    on_exit: Option<OnExit>,
    /// Template names the nodes used, for `spec.templates`.
    templates: BTreeMap<String, Body>,
}

/// How the workflow's exit handler ended.
struct OnExit {
    template: &'static str,
    phase: Phase,
    message: String,
}

/// Builds node statuses the way the controller would have written them.
struct Sim {
    wf: String,
    id_style: IdStyle,
    foreign_prefix: String,
    nodes: Vec<Node>,
    by_id: HashMap<String, usize>,
    clock: u64,
    budget: usize,
    base_time: u64,
    templates: BTreeMap<String, Body>,
    /// Whether the workflow is still running (some nodes unfinished).
    running: bool,
    /// Names for the first two root DAG tasks, which collide in FNV-1a 32.
    colliding_tasks: Option<[&'static str; 2]>,
}

/// Per-invocation context passed down the template tree.
#[derive(Clone)]
struct Call {
    name: String,
    boundary: String,
    flag: Option<(bool, bool)>,
    depth: usize,
    tmpl: Tmpl,
    scope: String,
}

impl Sim {
    fn new(wf: String, r: &mut Rand, budget: usize) -> Self {
        let id_style = if r.chance(0.06) {
            IdStyle::Foreign
        } else {
            IdStyle::Current
        };
        Sim {
            foreign_prefix: workflow_name(r),
            wf,
            id_style,
            nodes: Vec::new(),
            by_id: HashMap::new(),
            clock: 0,
            budget,
            base_time: r.below(20 * 86_400) as u64,
            templates: BTreeMap::new(),
            running: r.chance(0.05),
            colliding_tasks: None,
        }
    }

    fn finish(self) -> Shape {
        Shape {
            nodes: self.nodes,
            base_time: self.base_time,
        }
    }

    fn tick(&mut self, r: &mut Rand) -> u64 {
        self.clock += 1 + r.below(20) as u64;
        self.clock
    }

    /// The node ID Argo gives `name`: 32-bit FNV, widened to 64 bits when the
    /// 32-bit slot is taken (`Workflow.ResolveNode`).
    fn node_id(&self, name: &str) -> String {
        if name == self.wf {
            return self.wf.clone();
        }
        let prefix = if self.id_style == IdStyle::Foreign {
            &self.foreign_prefix
        } else {
            &self.wf
        };
        let id = format!("{prefix}-{}", fnv1a32(name));
        if self.by_id.contains_key(&id) {
            format!("{prefix}-{}", fnv1a64(name))
        } else {
            id
        }
    }

    /// `initializeNode`: display name relative to the boundary node.
    fn add_node(&mut self, r: &mut Rand, call: &Call, kind: Kind, phase: Phase) -> usize {
        let id = self.node_id(&call.name);
        let display_name = match self.by_id.get(&call.boundary) {
            Some(&b) => {
                let rest = call
                    .name
                    .strip_prefix(&self.nodes[b].name)
                    .unwrap_or(&call.name);
                strip_separator(rest).to_owned()
            }
            None => call.name.clone(),
        };
        let started = self.tick(r);
        let node = Node {
            id: id.clone(),
            name: call.name.clone(),
            display_name,
            kind,
            tmpl: call.tmpl.clone(),
            scope: call.scope.clone(),
            phase,
            boundary_id: call.boundary.clone(),
            message: String::new(),
            started,
            finished: None,
            flag: call.flag,
            inputs: Vec::new(),
            supplied: Vec::new(),
            exit_code: None,
            children: Vec::new(),
            outbound: Vec::new(),
            container_set: false,
        };
        let idx = self.nodes.len();
        self.by_id.insert(id, idx);
        self.nodes.push(node);
        self.budget = self.budget.saturating_sub(1);
        idx
    }

    /// `addChildNode`: no duplicates.
    fn add_child(&mut self, parent: usize, child: usize) {
        let child_id = self.nodes[child].id.clone();
        if !self.nodes[parent].children.contains(&child_id) {
            self.nodes[parent].children.push(child_id);
        }
    }

    fn complete(&mut self, r: &mut Rand, idx: usize, phase: Phase, message: &str) {
        let finished = if phase.fulfilled() {
            Some(self.tick(r))
        } else {
            None
        };
        let n = &mut self.nodes[idx];
        n.phase = phase;
        n.message = message.to_owned();
        n.finished = finished;
    }

    /// `getOutboundNodes`.
    fn outbound_of(&self, idx: usize) -> Vec<String> {
        let n = &self.nodes[idx];
        match n.kind {
            Kind::Skipped | Kind::Suspend | Kind::Http | Kind::Plugin => vec![n.id.clone()],
            Kind::Pod if !n.container_set => vec![n.id.clone()],
            Kind::Pod | Kind::Container | Kind::TaskGroup => {
                if n.children.is_empty() {
                    return vec![n.id.clone()];
                }
                let mut out = Vec::new();
                for c in &n.children {
                    let ci = self.by_id[c];
                    if n.kind == Kind::Container && self.nodes[ci].boundary_id != n.boundary_id {
                        out.push(n.id.clone());
                    } else {
                        out.extend(self.outbound_of(ci));
                    }
                }
                out
            }
            Kind::Retry if !n.children.is_empty() => vec![n.children[n.children.len() - 1].clone()],
            _ => n
                .outbound
                .iter()
                .flat_map(|o| self.outbound_of(self.by_id[o]))
                .collect(),
        }
    }

    fn leaf_phase(&self, r: &mut Rand) -> (Phase, &'static str) {
        if self.running && r.chance(0.15) {
            return (*r.pick(&[Phase::Running, Phase::Pending]), "");
        }
        match r.below(100) {
            0..=62 => (Phase::Succeeded, ""),
            63..=88 => (
                Phase::Failed,
                *r.pick(&[
                    "Error (exit code 1)",
                    "Error (exit code 2)",
                    "OOMKilled (exit code 137)",
                ]),
            ),
            _ => (
                Phase::Error,
                *r.pick(&[
                    "pod deleted",
                    "failed to create pod",
                    "Pod was active on the node longer than the specified deadline",
                ]),
            ),
        }
    }

    fn choose_body(&mut self, r: &mut Rand, depth: usize) -> Body {
        let nested = depth < 4 && self.budget > 6;
        match r.below(100) {
            0..=49 => Body::Pod,
            50..=57 => Body::ContainerSet,
            58..=61 => Body::Http,
            62..=64 => Body::Plugin,
            65..=71 => Body::Suspend,
            72..=85 if nested => Body::Dag,
            86..=99 if nested => Body::Steps,
            _ => Body::Pod,
        }
    }

    fn template_for(&mut self, r: &mut Rand, body: Body) -> (Tmpl, String) {
        let name = match body {
            Body::Pod if r.chance(0.12) => (*r.pick(LONG_TEMPLATES)).to_owned(),
            Body::Pod => (*r.pick(TEMPLATES)).to_owned(),
            Body::ContainerSet => "container-set".to_owned(),
            Body::Http => "http-check".to_owned(),
            Body::Plugin => "hello-plugin".to_owned(),
            Body::Suspend => "approve".to_owned(),
            Body::Steps => format!("{}-steps", r.pick(WORDS)),
            Body::Dag => format!("{}-dag", r.pick(WORDS)),
        };
        if r.chance(0.12) {
            let wft = (*r.pick(WORKFLOW_TEMPLATES)).to_owned();
            let scope = format!("namespaced/{wft}");
            return (
                Tmpl::Ref {
                    name: wft,
                    template: name,
                },
                scope,
            );
        }
        self.templates.insert(name.clone(), body);
        let scope = format!("local/{}", self.wf);
        (Tmpl::Name(name), scope)
    }

    /// Runs the whole workflow: the entrypoint, hooks and the exit handler.
    fn run(&mut self, r: &mut Rand, large: bool) -> Run {
        let body = if large || self.colliding_tasks.is_some() {
            Body::Dag
        } else {
            *r.pick(&[
                Body::Dag,
                Body::Dag,
                Body::Dag,
                Body::Dag,
                Body::Steps,
                Body::Steps,
                Body::Steps,
                Body::Steps,
                Body::Pod,
                Body::ContainerSet,
            ])
        };
        // The entrypoint is a template of the workflow itself, never a reference.
        let tmpl = match self.template_for(r, body).0 {
            Tmpl::Ref { template, .. } => {
                self.templates.insert(template.clone(), body);
                Tmpl::Name(template)
            }
            t => t,
        };
        let scope = format!("local/{}", self.wf);
        let root_call = Call {
            name: self.wf.clone(),
            boundary: String::new(),
            flag: None,
            depth: 0,
            tmpl,
            scope,
        };
        let root = if large {
            self.exec_large_dag(r, &root_call)
        } else {
            self.exec(r, &root_call, Some(body))
        };

        if r.chance(0.05) {
            let hook = self.hook_call(r, &root_call, "hooks.running", String::new());
            let h = self.exec(r, &hook, Some(Body::Pod));
            self.add_child(root, h);
        }
        let on_exit = if r.chance(0.2) {
            let body = *r.pick(&[Body::Pod, Body::Pod, Body::Pod, Body::Steps, Body::Dag]);
            // `spec.onExit` names a template of the workflow.
            let template = match body {
                Body::Steps => "exit-steps",
                Body::Dag => "exit-dag",
                _ => "exit-handler",
            };
            self.templates.insert(template.to_owned(), body);
            let call = Call {
                name: format!("{}.onExit", self.wf),
                boundary: String::new(),
                flag: Some((true, false)),
                depth: 1,
                tmpl: Tmpl::Name(template.to_owned()),
                scope: format!("local/{}", self.wf),
            };
            let e = self.exec(r, &call, Some(body));
            Some(OnExit {
                template,
                phase: self.nodes[e].phase,
                message: self.nodes[e].message.clone(),
            })
        } else {
            None
        };
        Run {
            root_phase: self.nodes[root].phase,
            root_message: self.nodes[root].message.clone(),
            on_exit,
            templates: std::mem::take(&mut self.templates),
        }
    }

    fn hook_call(&mut self, r: &mut Rand, owner: &Call, suffix: &str, boundary: String) -> Call {
        let (tmpl, scope) = self.template_for(r, Body::Pod);
        Call {
            name: format!("{}.{suffix}", owner.name),
            boundary,
            flag: Some((true, false)),
            depth: owner.depth + 1,
            tmpl,
            scope,
        }
    }

    /// One template invocation, wrapped in a Retry node when the template has a
    /// retryStrategy. Returns the invocation's node.
    fn exec(&mut self, r: &mut Rand, call: &Call, body: Option<Body>) -> usize {
        let body = body.unwrap_or_else(|| self.choose_body(r, call.depth));
        if body == Body::Suspend || !r.chance(0.2) {
            return self.exec_body(r, call, body);
        }
        let retry = self.add_node(r, call, Kind::Retry, Phase::Running);
        let attempts = r.between(1, 4);
        let mut last = None;
        for i in 0..attempts {
            let (hooked, _) = call.flag.unwrap_or_default();
            let attempt = Call {
                name: format!("{}({i})", call.name),
                flag: Some((hooked, true)),
                ..call.clone()
            };
            let a = self.exec_body(r, &attempt, body);
            self.add_child(retry, a);
            last = Some(a);
            if !self.nodes[a].phase.failed() || self.budget == 0 {
                break;
            }
        }
        let last = last.unwrap_or(retry);
        let (phase, message) = (self.nodes[last].phase, self.nodes[last].message.clone());
        let message = if phase.failed() && r.chance(0.3) {
            "No more retries left".to_owned()
        } else {
            message
        };
        if call.flag.is_some_and(|(hooked, _)| hooked) {
            self.nodes[retry].flag = Some((true, true));
        }
        self.complete(r, retry, phase, &message);
        retry
    }

    fn exec_body(&mut self, r: &mut Rand, call: &Call, body: Body) -> usize {
        match body {
            Body::Pod | Body::Http | Body::Plugin => {
                let kind = match body {
                    Body::Http => Kind::Http,
                    Body::Plugin => Kind::Plugin,
                    _ => Kind::Pod,
                };
                let idx = self.add_node(r, call, kind, Phase::Pending);
                if r.chance(0.3) {
                    let value = (*r.pick(WORDS)).to_owned();
                    self.nodes[idx]
                        .inputs
                        .push(((*r.pick(&["message", "count", "target"])).to_owned(), value));
                }
                // Argo's "Orphaned Retried Node Flag" test: a retried flag
                // inherited from a retryStrategy further up, with no Retry parent.
                if kind == Kind::Pod && call.flag.is_none() && r.chance(0.01) {
                    self.nodes[idx].flag = Some((false, true));
                }
                let (phase, message) = self.leaf_phase(r);
                if kind == Kind::Pod && phase.fulfilled() {
                    self.nodes[idx].exit_code =
                        Some(if phase == Phase::Succeeded { "0" } else { "1" });
                }
                self.complete(r, idx, phase, message);
                idx
            }
            Body::Suspend => {
                let idx = self.add_node(r, call, Kind::Suspend, Phase::Pending);
                let (phase, message) = match r.below(10) {
                    0..=6 => (Phase::Succeeded, ""),
                    7 => (Phase::Running, ""),
                    _ => (Phase::Failed, "Stopped with strategy 'Stop'"),
                };
                let phase = if phase == Phase::Running && !self.running {
                    Phase::Succeeded
                } else {
                    phase
                };
                if phase == Phase::Succeeded && r.chance(0.6) {
                    self.nodes[idx].supplied.push((
                        "approve".to_owned(),
                        (*r.pick(&["yes", "no", "42"])).to_owned(),
                    ));
                }
                self.complete(r, idx, phase, message);
                idx
            }
            Body::ContainerSet => self.exec_container_set(r, call),
            Body::Steps => self.exec_steps(r, call),
            Body::Dag => self.exec_dag(r, call),
        }
    }

    /// `executeContainerSet`: a Pod whose containers are Container nodes bound
    /// to the pod, linked along the container graph.
    fn exec_container_set(&mut self, r: &mut Rand, call: &Call) -> usize {
        let pod = self.add_node(r, call, Kind::Pod, Phase::Pending);
        self.nodes[pod].container_set = true;
        let pod_id = self.nodes[pod].id.clone();
        let names: &[&str] = match r.below(3) {
            0 => &["main"],
            1 => &["a", "b"],
            _ => &["init-db", "main", "sidecar"],
        };
        let chained = r.chance(0.5);
        let mut phase = Phase::Succeeded;
        let mut message = "";
        let mut prev = None;
        for c in names {
            let ccall = Call {
                name: format!("{}.{c}", call.name),
                boundary: pod_id.clone(),
                ..call.clone()
            };
            let ci = self.add_node(r, &ccall, Kind::Container, Phase::Pending);
            match prev {
                Some(p) if chained => self.add_child(p, ci),
                _ => self.add_child(pod, ci),
            }
            let (cphase, cmsg) = self.leaf_phase(r);
            if cphase.failed() && !phase.failed() {
                (phase, message) = (cphase, cmsg);
            }
            if !cphase.fulfilled() && phase.fulfilled() {
                phase = cphase;
            }
            self.complete(r, ci, cphase, cmsg);
            prev = Some(ci);
        }
        if phase.fulfilled() {
            self.nodes[pod].exit_code = Some(if phase == Phase::Succeeded { "0" } else { "1" });
        }
        self.complete(r, pod, phase, message);
        pod
    }

    /// `executeSteps`: step groups "<name>[i]" chained through the outbound
    /// nodes of the previous group; stops at the first failed group.
    fn exec_steps(&mut self, r: &mut Rand, call: &Call) -> usize {
        let steps = self.add_node(r, call, Kind::Steps, Phase::Running);
        let steps_id = self.nodes[steps].id.clone();
        let groups = r.between(1, 4);
        let mut phase = Phase::Succeeded;
        let mut message = String::new();
        let mut last_group: Option<usize> = None;
        for g in 0..groups {
            if self.budget == 0 {
                break;
            }
            // The previous group's outbound nodes become this group's parents.
            let parents: Vec<usize> = match last_group {
                None => vec![steps],
                Some(prev) if self.nodes[prev].children.is_empty() => vec![prev],
                Some(prev) => {
                    let outbound: Vec<String> = self.nodes[prev]
                        .children
                        .iter()
                        .flat_map(|c| self.outbound_of(self.by_id[c]))
                        .collect();
                    outbound.iter().map(|o| self.by_id[o]).collect()
                }
            };
            // A DAG ended by failFast can have no outbound nodes; Argo would then
            // leave the next group without a parent, which only defective cases show.
            if parents.is_empty() {
                break;
            }
            let sg_call = Call {
                name: format!("{}[{g}]", call.name),
                boundary: steps_id.clone(),
                flag: Some((false, false)),
                tmpl: Tmpl::None,
                ..call.clone()
            };
            let sg = self.add_node(r, &sg_call, Kind::StepGroup, Phase::Running);
            for p in parents {
                self.add_child(p, sg);
            }
            last_group = Some(sg);
            let (group_phase, group_msg) = self.exec_parallel_steps(r, call, sg, &steps_id);
            self.complete(r, sg, group_phase, &group_msg);
            if !group_phase.fulfilled() {
                phase = group_phase;
                break;
            }
            if group_phase.failed() {
                phase = Phase::Failed;
                message = group_msg;
                break;
            }
        }
        if let Some(sg) = last_group {
            let children = self.nodes[sg].children.clone();
            let outbound = children
                .iter()
                .flat_map(|c| self.outbound_of(self.by_id[c]))
                .collect();
            self.nodes[steps].outbound = outbound;
        }
        self.complete(r, steps, phase, &message);
        steps
    }

    /// The steps of one group (with `withItems` expansion and `when`).
    fn exec_parallel_steps(
        &mut self,
        r: &mut Rand,
        call: &Call,
        sg: usize,
        steps_id: &str,
    ) -> (Phase, String) {
        let count = r.between(1, 3);
        let sg_name = self.nodes[sg].name.clone();
        let mut phase = Phase::Succeeded;
        let mut message = String::new();
        for s in 0..count {
            let step = format!(
                "{}{}",
                step_name(r),
                if s > 0 {
                    format!("-{s}")
                } else {
                    String::new()
                }
            );
            let items = if r.chance(0.1) { r.between(2, 3) } else { 0 };
            let names: Vec<String> = if items == 0 {
                vec![format!("{sg_name}.{step}")]
            } else {
                (0..items)
                    .map(|i| format!("{sg_name}.{step}({i}:{})", WORDS[i]))
                    .collect()
            };
            let continue_on = r.chance(0.1);
            for name in names {
                if self.budget == 0 {
                    break;
                }
                let (tmpl, scope) = self.template_for(r, Body::Pod);
                let child_call = Call {
                    name,
                    boundary: steps_id.to_owned(),
                    flag: None,
                    depth: call.depth + 1,
                    tmpl,
                    scope,
                };
                let child = if r.chance(0.08) {
                    let skipped = Call {
                        flag: Some((false, false)),
                        ..child_call
                    };
                    let c = self.add_node(r, &skipped, Kind::Skipped, Phase::Skipped);
                    self.complete(r, c, Phase::Skipped, "when 'false == true' evaluated false");
                    c
                } else {
                    let c = self.exec(r, &child_call, None);
                    self.maybe_exit_hooks(r, &child_call, c, steps_id);
                    c
                };
                self.add_child(sg, child);
                let child_phase = self.nodes[child].phase;
                if !child_phase.fulfilled() {
                    phase = child_phase;
                } else if child_phase.failed()
                    && !continue_on
                    && phase.fulfilled()
                    && !phase.failed()
                {
                    phase = Phase::Failed;
                    message = format!("child '{}' failed", self.nodes[child].id);
                }
            }
        }
        (phase, message)
    }

    /// Template-level `onExit` and lifecycle hooks, children of the node they hook.
    fn maybe_exit_hooks(&mut self, r: &mut Rand, owner: &Call, node: usize, boundary: &str) {
        if !self.nodes[node].phase.fulfilled() || self.budget < 2 {
            return;
        }
        if r.chance(0.08) {
            let hook = self.hook_call(r, owner, "onExit", boundary.to_owned());
            let h = self.exec(r, &hook, Some(Body::Pod));
            self.add_child(node, h);
        }
        if r.chance(0.04) {
            let hook = self.hook_call(r, owner, "hooks.running", boundary.to_owned());
            let h = self.exec(r, &hook, Some(Body::Pod));
            self.add_child(node, h);
        }
    }

    /// `executeDAG`: tasks "<dag>.<task>" bound to the DAG; roots are children
    /// of the DAG node, dependents children of their dependencies' outbound nodes.
    fn exec_dag(&mut self, r: &mut Rand, call: &Call) -> usize {
        let dag = self.add_node(r, call, Kind::Dag, Phase::Running);
        let dag_id = self.nodes[dag].id.clone();
        let colliding = self.colliding_tasks.filter(|_| call.depth == 0);
        let count = r.between(if colliding.is_some() { 2 } else { 1 }, 5);
        let mut tasks: Vec<Task> = Vec::new();
        for t in 0..count {
            if self.budget == 0 {
                break;
            }
            let mut task = Task {
                name: match colliding {
                    Some(names) if t < 2 => names[t].to_owned(),
                    _ => dag_task_name(r, call.depth, t),
                },
                deps: (0..tasks.len()).filter(|_| r.chance(0.4)).collect(),
                node: None,
                phase: Phase::Succeeded,
                continue_on: r.chance(0.12),
            };
            // Dependencies become `depends` logic: a failed dependency omits
            // the task, unless failFast ended the DAG before it was assessed.
            let dep_failed = task.deps.iter().any(|&d| tasks[d].blocks());
            let dep_missing = task.deps.iter().any(|&d| tasks[d].node.is_none());
            let no_parent = !task.deps.is_empty()
                && task
                    .deps
                    .iter()
                    .filter_map(|&d| tasks[d].node)
                    .all(|n| self.outbound_of(n).is_empty());
            if dep_missing || no_parent || (dep_failed && r.chance(0.15)) {
                tasks.push(task);
                continue;
            }
            let (tmpl, scope) = self.template_for(r, Body::Pod);
            let tc = Call {
                name: format!("{}.{}", call.name, task.name),
                boundary: dag_id.clone(),
                flag: None,
                depth: call.depth + 1,
                tmpl,
                scope,
            };
            let n = if dep_failed || r.chance(0.07) {
                let (phase, message) = if dep_failed {
                    (Phase::Omitted, "omitted: depends condition not met")
                } else {
                    (Phase::Skipped, "when 'false' evaluated false")
                };
                let skipped = Call {
                    flag: Some((false, false)),
                    ..tc
                };
                let n = self.add_node(r, &skipped, Kind::Skipped, phase);
                self.complete(r, n, phase, message);
                self.connect(dag, &task.deps, &tasks, n);
                n
            } else if r.chance(0.1) {
                let items = r.between(2, 4);
                self.exec_task_group(r, dag, &task.deps, &tasks, tc, items)
            } else {
                let n = self.exec(r, &tc, None);
                self.connect(dag, &task.deps, &tasks, n);
                self.maybe_exit_hooks(r, &tc, n, &dag_id);
                n
            };
            task.node = Some(n);
            task.phase = self.nodes[n].phase;
            tasks.push(task);
        }
        self.finish_dag(r, dag, &tasks);
        dag
    }

    /// A DAG task with `withItems`: a TaskGroup whose children are the items.
    fn exec_task_group(
        &mut self,
        r: &mut Rand,
        dag: usize,
        deps: &[usize],
        tasks: &[Task],
        call: Call,
        items: usize,
    ) -> usize {
        let group_call = Call {
            flag: Some((false, false)),
            ..call.clone()
        };
        let group = self.add_node(r, &group_call, Kind::TaskGroup, Phase::Running);
        self.connect(dag, deps, tasks, group);
        let mut phase = Phase::Succeeded;
        let body = if r.chance(0.8) {
            Body::Pod
        } else {
            self.choose_body(r, call.depth)
        };
        for i in 0..items {
            if self.budget == 0 && i > 0 {
                break;
            }
            let item = Call {
                name: format!("{}({i}:{})", call.name, item_value(i)),
                ..call.clone()
            };
            let c = self.exec(r, &item, Some(body));
            self.add_child(group, c);
            let p = self.nodes[c].phase;
            if p.failed() || !p.fulfilled() {
                phase = p;
            }
        }
        self.complete(r, group, phase, "");
        group
    }

    /// `connectDependencies`.
    fn connect(&mut self, dag: usize, deps: &[usize], tasks: &[Task], node: usize) {
        if deps.is_empty() {
            self.add_child(dag, node);
            return;
        }
        for &d in deps {
            if let Some(dep) = tasks[d].node {
                for o in self.outbound_of(dep) {
                    let oi = self.by_id[&o];
                    self.add_child(oi, node);
                }
            }
        }
    }

    /// The DAG's outbound nodes come from its leaf tasks (those no task
    /// depends on, in name order, `findLeafTaskNames`); its phase from its tasks.
    fn finish_dag(&mut self, r: &mut Rand, dag: usize, tasks: &[Task]) {
        let mut leaves: Vec<&Task> = tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| !tasks.iter().any(|t| t.deps.contains(i)))
            .map(|(_, t)| t)
            .collect();
        leaves.sort_by(|a, b| a.name.cmp(&b.name));
        let outbound = leaves
            .iter()
            .filter_map(|t| t.node)
            .flat_map(|n| self.outbound_of(n))
            .collect();
        self.nodes[dag].outbound = outbound;
        let mut phase = Phase::Succeeded;
        let mut message = String::new();
        for t in tasks {
            if let Some(n) = t.node {
                if !t.phase.fulfilled() {
                    phase = t.phase;
                } else if t.blocks() && phase.fulfilled() {
                    phase = Phase::Failed;
                    message = format!("child '{}' failed", self.nodes[n].id);
                }
            }
        }
        if self.running && phase.fulfilled() && r.chance(0.1) {
            phase = Phase::Running;
        }
        self.complete(r, dag, phase, &message);
    }

    /// A big DAG fanning out over many items, as workflows that need
    /// compressed or offloaded nodes look.
    fn exec_large_dag(&mut self, r: &mut Rand, call: &Call) -> usize {
        let dag = self.add_node(r, call, Kind::Dag, Phase::Running);
        let dag_id = self.nodes[dag].id.clone();
        let (tmpl, scope) = self.template_for(r, Body::Pod);
        let prep = Call {
            name: format!("{}.prepare", call.name),
            boundary: dag_id.clone(),
            flag: None,
            depth: 1,
            tmpl: tmpl.clone(),
            scope: scope.clone(),
        };
        let p = self.exec_body(r, &prep, Body::Pod);
        self.complete(r, p, Phase::Succeeded, "");
        self.nodes[p].exit_code = Some("0");
        self.add_child(dag, p);
        let prepare = Task {
            name: "prepare".to_owned(),
            deps: Vec::new(),
            node: Some(p),
            phase: Phase::Succeeded,
            continue_on: false,
        };
        let fan = Call {
            name: format!("{}.process", call.name),
            boundary: dag_id,
            flag: None,
            depth: 1,
            tmpl,
            scope,
        };
        let items = r.between(120, 300);
        let group = self.exec_task_group(r, dag, &[0], std::slice::from_ref(&prepare), fan, items);
        let phase = self.nodes[group].phase;
        let process = Task {
            name: "process".to_owned(),
            deps: vec![0],
            node: Some(group),
            phase,
            continue_on: false,
        };
        let tasks = [prepare, process];
        self.finish_dag(r, dag, &tasks);
        dag
    }
}

struct Task {
    name: String,
    /// Indices of the tasks this one depends on.
    deps: Vec<usize>,
    node: Option<usize>,
    phase: Phase,
    continue_on: bool,
}

impl Task {
    /// Whether this task's failure fails the DAG and stops its dependents.
    fn blocks(&self) -> bool {
        self.node.is_some() && self.phase.failed() && !self.continue_on
    }
}

/// `stepsOrDagSeparator`: strips a leading "." or "[i]." from a display name.
fn strip_separator(rest: &str) -> &str {
    if let Some(stripped) = rest.strip_prefix('.') {
        return stripped;
    }
    if let Some(inner) = rest.strip_prefix('[')
        && let Some(close) = inner.find(']')
        && !inner[..close].is_empty()
        && inner[..close].bytes().all(|b| b.is_ascii_digit())
        && let Some(after) = inner[close + 1..].strip_prefix('.')
    {
        return after;
    }
    rest
}

fn step_name(r: &mut Rand) -> String {
    (*r.pick(WORDS)).to_owned()
}

fn dag_task_name(r: &mut Rand, depth: usize, index: usize) -> String {
    // A root-level task named like "onExit-…" gets a node name starting with
    // "<wf>.onExit", which Argo's retry treats as part of the exit handler.
    if depth == 0 && r.chance(0.03) {
        return format!("onExit-{}", r.pick(WORDS));
    }
    format!("{}-{index}", r.pick(WORDS))
}

fn item_value(i: usize) -> String {
    match i % 3 {
        0 => WORDS[i % WORDS.len()].to_owned(),
        1 => i.to_string(),
        _ => format!("item-{i}"),
    }
}

// ---------------------------------------------------------------- defects

/// Breaks the node graph in the way `defect` names.
fn corrupt(r: &mut Rand, shape: &mut Shape, wf: &str) -> Defect {
    let exit_prefix = format!("{wf}.onExit");
    let candidates: Vec<usize> = (0..shape.nodes.len())
        .filter(|&i| shape.nodes[i].name != wf && !shape.nodes[i].name.starts_with(&exit_prefix))
        .collect();
    let defect = match r.below(10) {
        0..=3 if !candidates.is_empty() => Defect::NoParent,
        4..=6 => Defect::MissingChild,
        7..=8 => Defect::EmptyNodes,
        _ => Defect::NoRoot,
    };
    match defect {
        Defect::NoParent => {
            let orphan = shape.nodes[*r.pick(&candidates)].id.clone();
            for n in &mut shape.nodes {
                n.children.retain(|c| *c != orphan);
            }
        }
        Defect::MissingChild => {
            let i = r.below(shape.nodes.len());
            let ghost = format!("{wf}-{}", fnv1a32(&format!("{wf}.ghost-{}", r.alnum(4))));
            shape.nodes[i].children.push(ghost);
        }
        Defect::EmptyNodes => shape.nodes.clear(),
        Defect::NoRoot => shape.nodes.retain(|n| n.name != wf),
    }
    defect
}

// ---------------------------------------------------------------- workflow object

fn workflow_phase(r: &mut Rand, run: &Run) -> String {
    let mut phase = match run.root_phase {
        Phase::Failed => "Failed",
        Phase::Error => "Error",
        Phase::Pending | Phase::Running => "Running",
        _ => "Succeeded",
    };
    if phase == "Succeeded" && run.on_exit.as_ref().is_some_and(|e| e.phase.failed()) {
        phase = "Failed";
    }
    match r.below(100) {
        0..=1 => "Running".to_owned(),
        2 => "Pending".to_owned(),
        3 => String::new(),
        4..=5 if phase == "Failed" => "Error".to_owned(),
        _ => phase.to_owned(),
    }
}

/// Retry options chosen for a case.
struct Options {
    restart_successful: bool,
    selector: String,
    parameters: Option<Vec<String>>,
    /// Parameters declared in `spec.arguments`.
    params_declared: Vec<(String, String)>,
}

fn options(r: &mut Rand, shape: &Shape, phase: &str) -> Options {
    let restart_successful = r.chance(if phase == "Succeeded" { 0.8 } else { 0.35 });
    let selector = if r.chance(0.45) {
        if r.chance(0.1) {
            invalid_selector(r)
        } else {
            valid_selector(r, shape)
        }
    } else {
        String::new()
    };
    let params_declared: Vec<(String, String)> = match r.below(3) {
        0 => Vec::new(),
        1 => vec![("message".to_owned(), "hello".to_owned())],
        _ => vec![
            ("message".to_owned(), "hello".to_owned()),
            ("count".to_owned(), "3".to_owned()),
        ],
    };
    let parameters = match r.below(20) {
        0..=13 => None,
        14 => Some(Vec::new()),
        _ => Some(
            (0..r.between(1, 3))
                .map(|_| match r.below(8) {
                    0..=2 => format!("message={}", r.pick(WORDS)),
                    3 => format!("count={}", r.below(10)),
                    4 => format!("undeclared-{}={}", r.pick(WORDS), r.pick(WORDS)),
                    5 => "message=".to_owned(),
                    6 => "message=a=b".to_owned(),
                    _ => (*r.pick(&["message", "count", ""])).to_owned(),
                })
                .collect(),
        ),
    };
    Options {
        restart_successful,
        selector,
        parameters,
        params_declared,
    }
}

/// Escapes a field selector value the way `fields.EscapeValue` does.
fn escape_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace(',', "\\,")
        .replace('=', "\\=")
}

fn valid_selector(r: &mut Rand, shape: &Shape) -> String {
    if shape.nodes.is_empty() || r.chance(0.04) {
        // Terms on no field or only empty terms still parse (and match every node).
        return (*r.pick(&[",,", "=", "templateRef.name=", "unknown!=x"])).to_owned();
    }
    let terms = r.between(1, 3);
    let mut out = Vec::new();
    for _ in 0..terms {
        let n = &shape.nodes[r.below(shape.nodes.len())];
        let (field, value) = match r.below(9) {
            0 => ("displayName".to_owned(), n.display_name.clone()),
            1 => ("templateName".to_owned(), template_of(n)),
            2 => ("phase".to_owned(), n.phase.as_str().to_owned()),
            3 | 4 => ("name".to_owned(), n.name.clone()),
            5 => ("id".to_owned(), n.id.clone()),
            6 | 7 => match shape
                .nodes
                .iter()
                .find(|m| matches!(m.tmpl, Tmpl::Ref { .. }))
                .map(|m| &m.tmpl)
            {
                Some(Tmpl::Ref { name, .. }) if r.chance(0.5) => {
                    ("templateRef.name".to_owned(), name.clone())
                }
                Some(Tmpl::Ref { template, .. }) => {
                    ("templateRef.template".to_owned(), template.clone())
                }
                _ => (
                    "phase".to_owned(),
                    (*r.pick(&["Failed", "Succeeded", "Error", "Skipped"])).to_owned(),
                ),
            },
            _ => match shape.nodes.iter().find_map(|m| m.inputs.first()) {
                Some((k, v)) => (format!("inputs.parameters.{k}.value"), v.clone()),
                None => (
                    "inputs.parameters.message.value".to_owned(),
                    "hello".to_owned(),
                ),
            },
        };
        let op = *r.pick(&["=", "=", "==", "!="]);
        out.push(format!("{field}{op}{}", escape_value(&value)));
    }
    out.join(",")
}

fn template_of(n: &Node) -> String {
    match &n.tmpl {
        Tmpl::None => String::new(),
        Tmpl::Name(t) => t.clone(),
        Tmpl::Ref { template, .. } => template.clone(),
    }
}

fn invalid_selector(r: &mut Rand) -> String {
    (*r.pick(&[
        "name",
        "phase=Failed=Error",
        "name=a\\x",
        "displayName=trailing\\",
        "phase",
        "id=a,b",
    ]))
    .to_owned()
}

/// The `Workflow` object around the nodes.
fn assemble(
    r: &mut Rand,
    wf: &str,
    phase: &str,
    run: &Run,
    shape: &Shape,
    nodes: Map<String, Value>,
    params: &[(String, String)],
) -> Value {
    let base = shape.base_time;
    let mut labels = Map::new();
    let finished = !matches!(phase, "Running" | "Pending" | "");
    if finished {
        labels.insert("workflows.argoproj.io/completed".into(), json!("true"));
    } else {
        labels.insert("workflows.argoproj.io/completed".into(), json!("false"));
    }
    if !phase.is_empty() {
        labels.insert("workflows.argoproj.io/phase".into(), json!(phase));
    }
    if r.chance(0.3) {
        labels.insert(
            "workflows.argoproj.io/workflow-archiving-status".into(),
            json!(*r.pick(&["Pending", "Archived", "Persisted"])),
        );
    }
    if r.chance(0.2) {
        labels.insert(
            "workflows.argoproj.io/creator".into(),
            json!("system-serviceaccount-argo-argo-server"),
        );
    }
    if r.chance(0.05) {
        labels.insert(
            "workflows.argoproj.io/resubmitted-from-workflow".into(),
            json!(workflow_name(r)),
        );
    }
    if r.chance(0.3) {
        labels.insert("team".into(), json!(*r.pick(WORDS)));
    }
    let mut metadata = json!({
        "name": wf,
        "namespace": "argo",
        "uid": format!("{}-{}-4{}-a{}-{}", r.hex(8), r.hex(4), r.hex(3), r.hex(3), r.hex(12)),
        "resourceVersion": (r.below(900_000) + 1_000).to_string(),
        "generation": r.between(2, 40),
        "creationTimestamp": timestamp(base),
        "labels": labels,
    });
    if r.chance(0.5) {
        metadata["generateName"] = json!(wf.get(..wf.len() - 5).unwrap_or(wf));
    }
    match r.below(10) {
        0..=3 => {}
        4..=6 => metadata["annotations"] = json!({"workflows.argoproj.io/pod-name-format": "v2"}),
        7..=8 => metadata["annotations"] = json!({"workflows.argoproj.io/pod-name-format": "v1"}),
        _ => {
            metadata["annotations"] = json!({"workflows.argoproj.io/pod-name-format": "v3", "note": "unknown formats mean the default"})
        }
    }

    let entry = match nodes.get(wf).and_then(|n| n.get("templateName")) {
        Some(Value::String(t)) => t.clone(),
        _ => "main".to_owned(),
    };
    let templates: Vec<Value> = run
        .templates
        .iter()
        .map(|(name, body)| template_json(name, *body))
        .collect();
    let arguments = if params.is_empty() {
        json!({})
    } else {
        json!({"parameters": params.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>()})
    };
    let mut full_spec = json!({"entrypoint": entry, "arguments": arguments});
    full_spec["templates"] = Value::Array(templates);
    if let Some(on_exit) = &run.on_exit {
        full_spec["onExit"] = json!(on_exit.template);
    }
    let shutdown = match r.below(20) {
        0 => Some("Terminate"),
        1 => Some("Stop"),
        _ => None,
    };
    let from_template = r.chance(0.2);
    let mut spec = if from_template {
        json!({"arguments": full_spec["arguments"].clone(), "workflowTemplateRef": {"name": r.pick(WORKFLOW_TEMPLATES)}})
    } else {
        full_spec.clone()
    };
    if let Some(s) = shutdown {
        spec["shutdown"] = json!(s);
    }
    match r.below(10) {
        0..=1 => spec["activeDeadlineSeconds"] = json!(0),
        2..=3 => spec["activeDeadlineSeconds"] = json!(*r.pick(&[300, 3600, 86_400])),
        _ => {}
    }
    if r.chance(0.2) {
        spec["serviceAccountName"] = json!("argo-workflow");
    }

    let last = shape
        .nodes
        .iter()
        .filter_map(|n| n.finished)
        .max()
        .unwrap_or(0);
    let mut status = Map::new();
    if !phase.is_empty() {
        status.insert("phase".into(), json!(phase));
    }
    status.insert("startedAt".into(), json!(timestamp(base)));
    status.insert(
        "finishedAt".into(),
        if finished {
            json!(timestamp(base + last + 1))
        } else {
            Value::Null
        },
    );
    let pods = shape.nodes.iter().filter(|n| n.kind == Kind::Pod);
    let (done, total) = pods.fold((0, 0), |(d, t), n| {
        (d + usize::from(n.phase == Phase::Succeeded), t + 1)
    });
    if total > 0 {
        status.insert("progress".into(), json!(format!("{done}/{total}")));
    }
    let message = match &run.on_exit {
        Some(e) if e.phase.failed() && !run.root_phase.failed() => e.message.clone(),
        _ => run.root_message.clone(),
    };
    if !message.is_empty() && phase != "Succeeded" {
        status.insert("message".into(), json!(message));
    }
    if !nodes.is_empty() || r.chance(0.5) {
        status.insert("nodes".into(), Value::Object(nodes));
    }
    if r.chance(0.15) {
        status.insert(
            "persistentVolumeClaims".into(),
            json!([{"name": "workdir", "persistentVolumeClaim": {"claimName": format!("{wf}-workdir")}}]),
        );
    }
    match r.below(10) {
        0 => {}
        1 => {
            status.insert("conditions".into(), json!([{"type": "SpecWarning", "status": "True", "message": "spec warning"}, {"type": "Completed", "status": "True"}]));
        }
        _ => {
            status.insert("conditions".into(), json!([{"type": "PodRunning", "status": "False"}, {"type": "Completed", "status": json!(if finished { "True" } else { "False" })}]));
        }
    }
    status.insert(
        "resourcesDuration".into(),
        json!({"cpu": last, "memory": last * 3}),
    );
    if from_template || r.chance(0.05) {
        let mut stored = full_spec;
        if let Some(s) = shutdown.filter(|_| r.chance(0.5)) {
            stored["shutdown"] = json!(s);
        }
        status.insert("storedWorkflowTemplateSpec".into(), stored);
    }
    let task_results: Map<String, Value> = shape
        .nodes
        .iter()
        .filter(|n| n.kind == Kind::Pod && n.phase.fulfilled())
        .map(|n| (n.id.clone(), Value::Bool(true)))
        .collect();
    if !task_results.is_empty() {
        status.insert(
            "taskResultsCompletionStatus".into(),
            Value::Object(task_results),
        );
    }

    // Built by hand: `json!` would re-serialise the whole node map.
    let mut workflow = Map::new();
    workflow.insert("apiVersion".into(), json!("argoproj.io/v1alpha1"));
    workflow.insert("kind".into(), json!("Workflow"));
    workflow.insert("metadata".into(), metadata);
    workflow.insert("spec".into(), spec);
    workflow.insert("status".into(), Value::Object(status));
    Value::Object(workflow)
}

/// A template as Go marshals `wfv1.Template` (the non-omitempty structs
/// `inputs`, `outputs` and `metadata` always present).
fn template_json(name: &str, body: Body) -> Value {
    let container = json!({"name": "", "image": "alpine:3.23", "command": ["sh", "-c"], "args": ["echo hello"], "resources": {}});
    let mut t = json!({"name": name, "inputs": {}, "outputs": {}, "metadata": {}});
    match body {
        Body::Pod => t["container"] = container,
        Body::ContainerSet => {
            t["containerSet"] = json!({"containers": [{"name": "main", "image": "alpine:3.23", "command": ["sh", "-c"], "args": ["echo main"], "resources": {}}]})
        }
        Body::Http => t["http"] = json!({"url": "http://127.0.0.1:8080/health"}),
        Body::Plugin => t["plugin"] = json!({"hello": {}}),
        Body::Suspend => t["suspend"] = json!({}),
        Body::Steps => {
            t["steps"] = json!([[{"name": "main", "template": "main", "arguments": {}}]])
        }
        Body::Dag => {
            t["dag"] = json!({"tasks": [{"name": "main", "template": "main", "arguments": {}}]})
        }
    }
    t
}

// ---------------------------------------------------------------- compression

/// A MAX_WORKFLOW_SIZE for the retried workflow, never close to the size of
/// its compressed form: gzip implementations differ by a few bytes, so only
/// clear cases compare Argo with the planner. The limit either needs no
/// compression, needs it and fits (compressed nodes take well under 60% of
/// their JSON once there is enough of it), or cannot fit even with no nodes.
fn size_limit(r: &mut Rand, workflow: &Value) -> usize {
    let json_len = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
    let size = json_len(workflow);
    let nodes = json_len(&workflow["status"]["nodes"]);
    let rest = size - nodes;
    match r.below(3) {
        1 if nodes >= 8_000 => rest + nodes * 3 / 5,
        0 | 1 => size * 2,
        _ => rest / 2,
    }
}

/// Replaces `status.nodes` by a version in Argo's offload table, as the
/// controller does with ALWAYS_OFFLOAD_NODE_STATUS or when compressing is not enough.
fn offload_nodes(workflow: &mut Value) {
    let Some(status) = workflow.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(nodes) = status.remove("nodes") {
        let version = fnv1a32(&nodes.to_string());
        status.insert(
            "offloadNodeStatusVersion".into(),
            Value::String(format!("fnv:{version}")),
        );
    }
}

/// Adds a `compressedNodes` beside `status.nodes` holding an older node map
/// (one node fewer): Argo retries from `nodes` and returns the blob untouched.
fn add_stale_blob(workflow: &mut Value) {
    let Some(status) = workflow.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(Value::Object(nodes)) = status.get("nodes") else {
        return;
    };
    if nodes.is_empty() || status.contains_key("compressedNodes") {
        return;
    }
    let older: Map<String, Value> = nodes.clone().into_iter().skip(1).collect();
    let plain = serde_json::to_vec(&older).unwrap_or_default();
    let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    w.write_all(&plain).expect("compressing into memory");
    let packed = w.finish().expect("compressing into memory");
    status.insert(
        "compressedNodes".into(),
        Value::String(base64::engine::general_purpose::STANDARD.encode(packed)),
    );
}

/// Moves `status.nodes` into `status.compressedNodes` as the controller does
/// (base64 of gzip by default; zstd or brotli when configured).
fn compress_nodes(r: &mut Rand, workflow: &mut Value) {
    let Some(status) = workflow.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(nodes) = status.remove("nodes") else {
        return;
    };
    if nodes.as_object().is_none_or(Map::is_empty) {
        status.insert("nodes".into(), nodes);
        return;
    }
    let plain = serde_json::to_vec(&nodes).unwrap_or_default();
    let packed = match r.below(10) {
        0 => zstd::encode_all(plain.as_slice(), 1).unwrap_or_default(),
        1 => {
            let mut out = Vec::new();
            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 1, 18);
            w.write_all(&plain).expect("compressing into memory");
            drop(w);
            out
        }
        _ => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(&plain).expect("compressing into memory");
            w.finish().expect("compressing into memory")
        }
    };
    status.insert(
        "compressedNodes".into(),
        Value::String(base64::engine::general_purpose::STANDARD.encode(packed)),
    );
}
