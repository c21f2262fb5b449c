//! Checks of the differential test's workflow generator: its output decodes,
//! its node graphs are the controller's, it is deterministic and fast, and it
//! covers every feature the retry rules depend on.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::time::Duration;

use base64::Engine;
use proptest::prelude::*;
use rewind::argo::workflow::{NodeStatus, Nodes, Text, Workflow};
use serde_json::Value;
use support::r#gen::{Defect, GenCase, case_strategy, generate, generate_case};
use support::oracle::{ArgoLine, OracleCase, run_oracle};

const SEED: u64 = 0x5eed_2026;
const CASES: usize = 2_000;

/// The case's nodes, decompressed when they come as `compressedNodes`
/// (gzip, zstd or brotli, told apart by their magic bytes as Argo does).
fn nodes_of(wf: &Workflow) -> (Nodes, Option<&'static str>) {
    if let Some(nodes) = &wf.status.nodes {
        return (nodes.clone(), None);
    }
    let Some(packed) = &wf.status.compressed_nodes else {
        return (Nodes::new(), None);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed)
        .expect("compressedNodes is base64");
    let mut plain = Vec::new();
    let algorithm = match bytes.as_slice() {
        [0x1f, 0x8b, ..] => {
            flate2::read::GzDecoder::new(bytes.as_slice())
                .read_to_end(&mut plain)
                .expect("gzip");
            "gzip"
        }
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            plain = zstd::decode_all(bytes.as_slice()).expect("zstd");
            "zstd"
        }
        _ => {
            brotli::Decompressor::new(bytes.as_slice(), 4096)
                .read_to_end(&mut plain)
                .expect("brotli");
            "brotli"
        }
    };
    (
        serde_json::from_slice(&plain).expect("compressed nodes are a node map"),
        Some(algorithm),
    )
}

fn decode(case: &GenCase) -> (Workflow, Nodes, Option<&'static str>) {
    let wf: Workflow = serde_json::from_value(case.workflow.clone())
        .unwrap_or_else(|e| panic!("{}: not a Workflow: {e}", case.id));
    let (nodes, algorithm) = nodes_of(&wf);
    (wf, nodes, algorithm)
}

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

/// What Argo's controller guarantees about a node graph it wrote.
fn check_graph(case: &GenCase, wf: &Workflow, nodes: &Nodes) {
    let name = wf.name();
    let id = &case.id;
    let roots: Vec<&NodeStatus> = nodes
        .values()
        .filter(|n| n.name == name)
        .map(|n| &**n)
        .collect();
    assert_eq!(roots.len(), 1, "{id}: one root named {name}");
    assert_eq!(
        roots[0].id, name,
        "{id}: the root's ID is the workflow name"
    );

    let mut has_parent = HashSet::new();
    for (key, n) in nodes {
        assert_eq!(key, &n.id, "{id}: nodes are keyed by ID");
        for c in n.children().iter().chain(n.outbound_nodes.iter().flatten()) {
            assert!(
                nodes.contains_key(c.as_str()),
                "{id}: {} lists {c}, which does not exist",
                n.id
            );
        }
        has_parent.extend(n.children().iter().cloned());
        if n.name != name {
            let hash = n.id.rsplit('-').next().unwrap_or_default();
            assert!(
                hash == fnv1a32(&n.name).to_string() || hash == fnv1a64(&n.name).to_string(),
                "{id}: {} is not an FNV-1a ID of {}",
                n.id,
                n.name
            );
        }
        let boundary = n.boundary_id.as_deref().unwrap_or_default();
        let display = n.display_name.as_deref().unwrap_or_default();
        if boundary.is_empty() {
            assert_eq!(display, n.name, "{id}: unbounded nodes display their name");
            continue;
        }
        let b = nodes
            .get(boundary)
            .unwrap_or_else(|| panic!("{id}: boundary {boundary} of {} missing", n.id));
        let allowed: &[&str] = if n.type_ == "Container" {
            &["Pod"]
        } else {
            &["DAG", "Steps"]
        };
        assert!(
            allowed.contains(&b.type_.as_str()),
            "{id}: {} bound to a {}",
            n.id,
            b.type_
        );
        let rest = n
            .name
            .strip_prefix(b.name.as_str())
            .unwrap_or_else(|| panic!("{id}: {} not under {}", n.name, b.name));
        assert!(
            rest.ends_with(display),
            "{id}: display name {display} of {}",
            n.name
        );
    }
    let exit_prefix = format!("{name}.onExit");
    for n in nodes.values() {
        if n.name != name && !n.name.starts_with(&exit_prefix) {
            assert!(
                has_parent.contains(&n.id),
                "{id}: {} ({}) has no parent",
                n.id,
                n.name
            );
        }
        if n.type_ == "Retry" {
            // Hooks of the retried task hang off the Retry node too, and so can
            // what follows it, when a hook is its last child (outbound node).
            let attempts = n
                .children()
                .iter()
                .map(|c| &nodes[c.as_str()])
                .filter(|c| c.name.starts_with(&format!("{}(", n.name)));
            for (i, child) in attempts.enumerate() {
                assert_eq!(
                    child.name,
                    format!("{}({i})", n.name),
                    "{id}: retry attempt name"
                );
                assert!(
                    child.node_flag.as_ref().is_some_and(|f| f.retried),
                    "{id}: attempt {} flagged retried",
                    child.id
                );
            }
        }
    }
}

/// The defect a case was given is really in it.
fn check_defect(case: &GenCase, defect: Defect, wf: &Workflow, nodes: &Nodes) {
    let name = wf.name();
    let children: HashSet<&Text> = nodes.values().flat_map(|n| n.children()).collect();
    let present = match defect {
        Defect::NoParent => nodes.values().any(|n| {
            n.name != name
                && !n.name.starts_with(&format!("{name}.onExit"))
                && !children.contains(&n.id)
        }),
        Defect::MissingChild => children.iter().any(|c| !nodes.contains_key(c.as_str())),
        Defect::EmptyNodes => nodes.is_empty(),
        Defect::NoRoot => !nodes.values().any(|n| n.name == name),
    };
    assert!(present, "{}: {defect:?} not present", case.id);
}

#[test]
fn every_case_decodes_and_valid_graphs_are_consistent() {
    let mut defects = 0;
    for i in 0..CASES as u64 {
        let (case, defect) = generate_case(SEED.wrapping_add(i), support::r#gen::DEFAULT_BUDGET);
        let (wf, nodes, _) = decode(&case);
        match defect {
            // Offloaded nodes live in Argo's database, not in the object.
            None if wf.status.offload_node_status_version.is_some() => {
                assert!(nodes.is_empty(), "{}", case.id)
            }
            None => check_graph(&case, &wf, &nodes),
            Some(d) => {
                defects += 1;
                check_defect(&case, d, &wf, &nodes);
            }
        }
    }
    assert!(
        defects > 0 && defects < CASES / 10,
        "{defects} defective cases"
    );
}

#[test]
fn generation_is_deterministic() {
    let a = generate(SEED, 100);
    let b = generate(SEED, 100);
    let c = generate(SEED + 1, 100);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// CPU time this thread has used (Linux): wall time on a shared CI machine
/// says more about the neighbours than about the generator.
fn thread_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("Linux /proc/thread-self/schedstat");
    let nanos = stat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("schedstat starts with CPU ns");
    Duration::from_nanos(nanos)
}

#[test]
fn generating_two_thousand_cases_is_fast() {
    let start = thread_cpu_time();
    let cases = generate(SEED, CASES);
    let used = thread_cpu_time() - start;
    eprintln!("generated {} cases in {used:?} of CPU time", cases.len());
    // Unoptimised builds run serde_json and the compressors about ten times
    // slower (about 2.3 s measured on the 2-core CI machine).
    let limit = if cfg!(debug_assertions) {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(1)
    };
    assert!(
        used < limit,
        "generating {CASES} cases took {used:?} of CPU time, limit {limit:?}"
    );
}

/// Whether `fields.ParseSelector` accepts a selector (k8s.io/apimachinery
/// `parseSelector`: terms split on unescaped commas, each needs an operator,
/// values may hold `=`, `,` and `\` only escaped).
fn selector_parses(selector: &str) -> bool {
    let mut terms = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in selector.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms.into_iter().filter(|t| !t.is_empty()).all(|term| {
        let Some(at) =
            (0..term.len()).find(|&i| ["!=", "==", "="].iter().any(|op| term[i..].starts_with(op)))
        else {
            return false;
        };
        let op_len = if term[at..].starts_with('=') && !term[at..].starts_with("==") {
            1
        } else {
            2
        };
        let mut escaped = false;
        for c in term[at + op_len..].chars() {
            match c {
                '\\' | ',' | '=' if escaped => escaped = false,
                _ if escaped => return false,
                '\\' => escaped = true,
                ',' | '=' => return false,
                _ => {}
            }
        }
        !escaped
    })
}

/// The features of one case, read from its output.
fn features(case: &GenCase) -> Vec<String> {
    let (wf, nodes, algorithm) = decode(case);
    let name = wf.name().to_owned();
    let mut f: Vec<String> = Vec::new();
    let mut add = |s: &str| f.push(s.to_owned());

    add(&format!(
        "workflow phase {}",
        wf.status.phase.as_deref().unwrap_or("none")
    ));
    add(
        match wf.annotation("workflows.argoproj.io/pod-name-format") {
            Some("v1") => "pod names v1",
            Some("v2") => "pod names v2",
            Some(_) => "pod names unknown format",
            None => "pod names default",
        },
    );
    if let Some(a) = algorithm {
        add(&format!("compressed {a}"));
    }
    if wf.status.offload_node_status_version.is_some() {
        add("offloaded nodes");
    }
    if wf.status.nodes.is_some() && wf.status.compressed_nodes.is_some() {
        add("both nodes and compressedNodes");
    }
    if case.restart_successful && case.node_field_selector == format!("name={name}") {
        add("selector picks the root");
    }
    if let Some(max) = case.max_workflow_size {
        let size = serde_json::to_vec(&case.workflow).map_or(0, |b| b.len());
        add(match max {
            m if m < size_without_nodes(case) => "max size too small even compressed",
            m if m < size => "max size needs compression",
            _ => "max size not reached",
        });
    }
    if nodes.len() > 150 {
        add("large workflow");
    }
    if wf
        .label("workflows.argoproj.io/workflow-archiving-status")
        .is_some()
    {
        add("archiving label");
    }
    if wf.label("workflows.argoproj.io/completed") == Some("true") {
        add("completed label");
    }
    if wf.status.conditions.as_ref().is_some_and(|c| !c.is_empty()) {
        add("conditions");
    }
    if wf
        .spec
        .arguments
        .as_ref()
        .and_then(|a| a.parameters.as_ref())
        .is_some()
    {
        add("spec parameters");
    }
    if let Some(s) = &wf.spec.shutdown {
        add(&format!("shutdown {s}"));
    }
    match wf.spec.active_deadline_seconds {
        Some(0) => add("activeDeadlineSeconds 0"),
        Some(_) => add("activeDeadlineSeconds set"),
        None => {}
    }
    if wf.status.persistent_volume_claims.is_some() {
        add("persistentVolumeClaims");
    }
    if let Some(stored) = &wf.status.stored_workflow_spec {
        add("storedWorkflowTemplateSpec");
        if stored.shutdown.is_some() {
            add("stored shutdown");
        }
    }

    if case.restart_successful {
        add("restartSuccessful");
    }
    let sel = &case.node_field_selector;
    if !sel.is_empty() {
        add(if selector_parses(sel) {
            "selector valid"
        } else {
            "selector invalid"
        });
        if sel.contains(',') {
            add("selector several terms");
        }
        for op in ["!=", "=="] {
            if sel.contains(op) {
                add(&format!("selector {op}"));
            }
        }
        for field in [
            "displayName",
            "templateName",
            "phase",
            "name",
            "id",
            "templateRef.name",
            "templateRef.template",
        ] {
            if sel.split(',').any(|t| {
                t.starts_with(&format!("{field}=")) || t.starts_with(&format!("{field}!="))
            }) {
                add(&format!("selector on {field}"));
            }
        }
        if sel.contains("inputs.parameters.") {
            add("selector on inputs.parameters");
        }
    }
    match &case.parameters {
        None => {}
        Some(p) if p.is_empty() => add("parameters empty"),
        Some(p) => {
            if p.iter().any(|s| !s.contains('=')) {
                add("parameter without =");
            }
            if p.iter()
                .any(|s| s.starts_with("message=") || s.starts_with("count="))
            {
                add("parameter override");
            }
            if p.iter().any(|s| s.starts_with("undeclared-")) {
                add("parameter undeclared");
            }
        }
    }

    let children: HashSet<&Text> = nodes.values().flat_map(|n| n.children()).collect();
    if nodes.is_empty() && wf.status.offload_node_status_version.is_none() {
        add("no nodes");
    }
    if !nodes.is_empty() && !nodes.values().any(|n| n.name == name) {
        add("no root");
    }
    if children.iter().any(|c| !nodes.contains_key(c.as_str())) {
        add("missing child");
    }
    let exit = format!("{name}.onExit");
    if nodes
        .values()
        .any(|n| n.name != name && !n.name.starts_with(&exit) && !children.contains(&n.id))
    {
        add("node without parent");
    }
    for n in nodes.values() {
        add(&format!("node type {}", n.type_));
        add(&format!("node phase {}", n.phase()));
        let failed = matches!(n.phase(), "Failed" | "Error");
        if n.type_ == "Retry" && n.children().len() >= 2 {
            add("retry with several attempts");
            let last = &nodes.get(n.children()[n.children().len() - 1].as_str());
            match (n.phase(), last.map(|l| l.phase())) {
                ("Succeeded", _) => add("retry recovered"),
                ("Failed" | "Error", Some("Failed" | "Error")) => add("retry all failed"),
                _ => {}
            }
        }
        if failed
            && n.boundary_id
                .as_ref()
                .and_then(|b| nodes.get(b.as_str()))
                .is_some_and(|b| b.phase() == "Succeeded")
        {
            add("failed node under a succeeded boundary (continueOn)");
        }
        if n.name == exit {
            add("onExit handler");
        } else if n.name.starts_with(&format!("{exit}-")) {
            add("task named onExit-…");
        } else if n.name.ends_with(".onExit") {
            add("template onExit");
        }
        if n.name.contains(".hooks.") {
            add("lifecycle hook");
        }
        if n.type_ == "Suspend"
            && n.outputs
                .as_ref()
                .and_then(|o| o.get().parameters)
                .is_some()
        {
            add("suspend with supplied outputs");
        }
        if n.template_ref.is_some() {
            add("templateRef");
        }
        if n.inputs.is_some() {
            add("input parameters");
        }
        if n.finished_at.is_none() {
            add("unfinished node");
        }
        if n.node_flag.as_ref().is_some_and(|f| f.hooked) {
            add("hooked flag");
        }
        let retried = n.node_flag.as_ref().is_some_and(|f| f.retried);
        if retried
            && n.type_ == "Pod"
            && !nodes
                .values()
                .any(|p| p.type_ == "Retry" && p.children().contains(&n.id))
        {
            add("orphan retried flag");
        }
        if format!("{name}-{}", n.template()).len() > 62 && n.type_ == "Pod" {
            add("pod name truncated");
        }
        if n.id != name && !n.id.starts_with(&format!("{name}-")) {
            add("foreign node ID");
        }
        if n.id
            .rsplit('-')
            .next()
            .and_then(|h| h.parse::<u64>().ok())
            .is_some_and(|h| h > u64::from(u32::MAX))
        {
            add("64-bit node ID");
        }
        let mut depth = 0;
        let mut b = n.boundary_id.as_deref();
        while let Some(next) = b.filter(|b| !b.is_empty()).and_then(|b| nodes.get(b)) {
            depth += 1;
            b = next.boundary_id.as_deref();
        }
        if depth >= 3 {
            add("nested 3 deep");
        }
    }
    f.sort();
    f.dedup();
    f
}

#[test]
fn features_are_all_covered() {
    let cases = generate(SEED, CASES);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for case in &cases {
        for f in features(case) {
            *counts.entry(f).or_default() += 1;
        }
    }
    let required = [
        "workflow phase Failed",
        "workflow phase Error",
        "workflow phase Succeeded",
        "workflow phase Running",
        "workflow phase Pending",
        "workflow phase none",
        "pod names v1",
        "pod names v2",
        "pod names default",
        "pod names unknown format",
        "compressed gzip",
        "compressed zstd",
        "compressed brotli",
        "offloaded nodes",
        "both nodes and compressedNodes",
        "selector picks the root",
        "max size too small even compressed",
        "max size needs compression",
        "max size not reached",
        "large workflow",
        "archiving label",
        "completed label",
        "conditions",
        "spec parameters",
        "shutdown Terminate",
        "shutdown Stop",
        "activeDeadlineSeconds 0",
        "activeDeadlineSeconds set",
        "persistentVolumeClaims",
        "storedWorkflowTemplateSpec",
        "stored shutdown",
        "restartSuccessful",
        "selector valid",
        "selector invalid",
        "selector several terms",
        "selector !=",
        "selector ==",
        "selector on displayName",
        "selector on templateName",
        "selector on phase",
        "selector on name",
        "selector on id",
        "selector on templateRef.name",
        "selector on templateRef.template",
        "selector on inputs.parameters",
        "parameters empty",
        "parameter without =",
        "parameter override",
        "parameter undeclared",
        "no nodes",
        "no root",
        "missing child",
        "node without parent",
        "node type Pod",
        "node type Container",
        "node type Steps",
        "node type StepGroup",
        "node type DAG",
        "node type TaskGroup",
        "node type Retry",
        "node type Skipped",
        "node type Suspend",
        "node type HTTP",
        "node type Plugin",
        "node phase Succeeded",
        "node phase Failed",
        "node phase Error",
        "node phase Skipped",
        "node phase Omitted",
        "node phase Running",
        "node phase Pending",
        "retry with several attempts",
        "retry recovered",
        "retry all failed",
        "failed node under a succeeded boundary (continueOn)",
        "onExit handler",
        "task named onExit-…",
        "template onExit",
        "lifecycle hook",
        "suspend with supplied outputs",
        "templateRef",
        "input parameters",
        "unfinished node",
        "hooked flag",
        "pod name truncated",
        "foreign node ID",
        "64-bit node ID",
        "orphan retried flag",
        "nested 3 deep",
    ];
    let missing: Vec<String> = required
        .iter()
        .filter(|f| counts.get(**f).copied().unwrap_or(0) < 3)
        .map(|f| format!("{f}: {:?}", counts.get(*f)))
        .collect();
    for (f, n) in &counts {
        eprintln!("{n:5} {f}");
    }
    assert!(
        missing.is_empty(),
        "features seen fewer than 3 times in {CASES} cases: {missing:?}"
    );
}

proptest! {
    // No regression file: an integration test has no src/ next to it.
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn strategy_cases_decode(case in case_strategy()) {
        let (wf, _, _) = decode(&case);
        prop_assert!(!wf.name().is_empty());
    }
}

/// Bytes of the case's workflow JSON outside `status.nodes`.
fn size_without_nodes(case: &GenCase) -> usize {
    let mut workflow = case.workflow.clone();
    workflow["status"]
        .as_object_mut()
        .map(|s| s.remove("nodes"));
    serde_json::to_vec(&workflow).map_or(0, |b| b.len())
}

/// Argo fails a retry of this case, by its own rules, whatever the nodes say.
fn argo_refuses(
    case: &GenCase,
    defect: Option<Defect>,
    compression: Option<&str>,
    line: ArgoLine,
) -> bool {
    let phase = case.workflow["status"]["phase"]
        .as_str()
        .unwrap_or_default();
    let selected = case.restart_successful && !case.node_field_selector.is_empty();
    !matches!(phase, "Failed" | "Error" | "Succeeded")
        || (phase == "Succeeded" && !selected)
        || case.parameters.iter().flatten().any(|p| !p.contains('='))
        || (selected && !selector_parses(&case.node_field_selector))
        || defect.is_some_and(|d| d != Defect::EmptyNodes)
        || case.workflow["status"].get("offloadNodeStatusVersion").is_some()
        // Too large even compressed (the oracle cannot offload).
        || case.max_workflow_size.is_some_and(|m| m < size_without_nodes(case))
        || (line == ArgoLine::V3 && matches!(compression, Some("zstd" | "brotli")))
}

fn decompressed_nodes(status: &Value) -> Value {
    if let Some(nodes) = status.get("nodes") {
        return nodes.clone();
    }
    let Some(packed) = status.get("compressedNodes").and_then(Value::as_str) else {
        return Value::Null;
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed)
        .expect("base64");
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .read_to_end(&mut plain)
        .expect("Argo writes gzip");
    serde_json::from_slice(&plain).expect("JSON nodes")
}

fn without(value: &Value, keys: &[&str]) -> Value {
    let mut value = value.clone();
    if let Some(map) = value.as_object_mut() {
        for k in keys {
            map.remove(*k);
        }
    }
    value
}

/// Argo's Go structs keep every field the generator writes: parts a retry
/// leaves alone come back from the oracle as they went in.
fn check_round_trip(case: &GenCase, input_nodes: &Value, output: &Value) {
    let id = &case.id;
    let input = &case.workflow;
    let reset_fields = ["shutdown", "activeDeadlineSeconds", "arguments"];
    assert_eq!(
        without(&output["spec"], &reset_fields),
        without(&input["spec"], &reset_fields),
        "{id}: spec"
    );
    assert_eq!(
        without(&output["metadata"], &["labels"]),
        without(&input["metadata"], &["labels"]),
        "{id}: metadata"
    );
    let status_reset = [
        "phase",
        "startedAt",
        "finishedAt",
        "message",
        "nodes",
        "compressedNodes",
        "conditions",
        "persistentVolumeClaims",
        "storedWorkflowTemplateSpec",
    ];
    assert_eq!(
        without(&output["status"], &status_reset),
        without(&input["status"], &status_reset),
        "{id}: status"
    );
    let stored = "storedWorkflowTemplateSpec";
    assert_eq!(
        without(&output["status"][stored], &reset_fields),
        without(&input["status"][stored], &reset_fields),
        "{id}: {stored}"
    );
    let out_nodes = decompressed_nodes(&output["status"]);
    let pruned = ["children", "outboundNodes"];
    for (node_id, out) in out_nodes.as_object().into_iter().flatten() {
        let inp = &input_nodes[node_id];
        if inp["startedAt"] == out["startedAt"] && inp["phase"] == out["phase"] {
            assert_eq!(
                without(out, &pruned),
                without(inp, &pruned),
                "{id}: node {node_id} changed in Go"
            );
        }
    }
}

#[test]
fn argo_reads_generated_workflows_as_intended() {
    const SAMPLE: u64 = 400;
    let generated: Vec<(GenCase, Option<Defect>)> = (0..SAMPLE)
        .map(|i| generate_case(SEED.wrapping_add(i), support::r#gen::DEFAULT_BUDGET))
        .collect();
    let oracle_cases: Vec<OracleCase> = generated
        .iter()
        .map(|(c, _)| OracleCase {
            id: c.id.clone(),
            workflow: c.workflow.clone(),
            restart_successful: c.restart_successful,
            node_field_selector: c.node_field_selector.clone(),
            parameters: c.parameters.clone(),
            max_workflow_size: c.max_workflow_size,
            ..Default::default()
        })
        .collect();
    for line in [ArgoLine::V4, ArgoLine::V3] {
        let results = run_oracle(line, &oracle_cases);
        let mut succeeded = 0;
        for ((case, defect), result) in generated.iter().zip(&results) {
            let (_, _, compression) = decode(case);
            let error = result.error.as_deref().unwrap_or_default();
            assert!(
                !error.starts_with("decode"),
                "{line:?} {}: Argo cannot decode it: {error}",
                case.id
            );
            if argo_refuses(case, *defect, compression, line) {
                continue;
            }
            assert!(
                result.error.is_none(),
                "{line:?} {}: Argo refused a valid case: {error}",
                case.id
            );
            let input_nodes = decompressed_input_nodes(case);
            check_round_trip(
                case,
                &input_nodes,
                result.workflow.as_ref().expect("a workflow"),
            );
            succeeded += 1;
        }
        eprintln!("{line:?}: {succeeded} of {SAMPLE} generated cases retried by Argo");
        assert!(
            succeeded > SAMPLE as usize / 3,
            "{line:?}: only {succeeded} of {SAMPLE} cases were retryable"
        );
    }
}

fn decompressed_input_nodes(case: &GenCase) -> Value {
    serde_json::to_value(decode(case).1).expect("nodes serialise")
}
