//! Differential test: the retry planner against Argo's own retry code (the
//! oracles in tools/oracle), for both Argo lines, on every fixture of Argo's
//! unit tests (tests/data/argo-retry/cases.json), on generated workflows, and
//! on generated workflows given a size limit within ±5% of the size Argo's
//! own encoder compresses their retry to (small limits under twelve
//! compression settings, and a few padded to Argo's default 1 MiB limit).
//!
//! Equal means: the same error, or the same workflow and the same pods to
//! delete, and the planner's estimate of Go's marshalled size equal to the
//! length Go marshals Argo's result to. `status.nodes` and
//! `status.compressedNodes` are compared each as returned, the blob by its
//! algorithm and decoded nodes: Argo's bytes come from Go encoders rewind
//! does not reproduce. Ignored: the timestamps Argo sets to "now", the order
//! of pod names, and the difference between an absent field and a null,
//! empty object or empty list (Go's `omitempty` and zero `metav1.Time`).
//! Where Argo refuses a retry as too large and the planner's stronger encoder
//! fits, the case is counted, not failed; the reverse (Argo writes, the
//! planner refuses) fails. Where Argo itself is nondeterministic (v3.7's
//! random choice of parent, which faulty node an error names), Argo's answer
//! must be one the planner gives for some such choice. A mismatch writes the
//! smallest failing case, its options and both outputs to
//! target/plan-mismatch-*.json.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::path::PathBuf;

use base64::Engine;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rewind::argo::plan::compress::Compression;
use rewind::argo::plan::{
    ArgoVersion, ChooseParent, PlanError, RetryOptions, compress, last_listed,
    plan_retry_with_parents,
};
use rewind::argo::workflow::Workflow;
use serde_json::{Value, json};
use support::r#gen::{GenCase, case_from_seed, generate};
use support::oracle::{ArgoLine, OracleCase, OracleResult, run_oracle};

const SEED: u64 = 0x7e71_2026;
const GENERATED: usize = 2_000;
const FIXTURES: &str = "tests/data/argo-retry/cases.json";

#[derive(Clone, Debug)]
struct Case {
    oracle: OracleCase,
    /// `case_from_seed(seed, budget)` of a generated case, to shrink it.
    seed_budget: Option<(u64, usize)>,
}

impl Case {
    fn options(&self, version: ArgoVersion) -> RetryOptions {
        let c = &self.oracle;
        let mut opts = RetryOptions {
            restart_successful: c.restart_successful,
            node_field_selector: c.node_field_selector.clone(),
            parameters: c.parameters.clone(),
            argo_version: version,
            ..Default::default()
        };
        if let Some(size) = c.max_workflow_size {
            opts.max_workflow_size = size;
        }
        opts.compression = Compression {
            algorithm: c
                .compression_algorithm
                .as_deref()
                .unwrap_or_default()
                .parse()
                .unwrap_or_default(),
            level: c.compression_level.clone(),
            gzip_implementation: c
                .gzip_implementation
                .as_deref()
                .unwrap_or_default()
                .parse()
                .unwrap_or_default(),
        };
        opts
    }
}

fn fixture_cases() -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(FIXTURES);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let json: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let list = match json {
        Value::Array(list) => list,
        Value::Object(mut o) => match o.remove("cases") {
            Some(Value::Array(list)) => list,
            _ => panic!("{} has no \"cases\" list", path.display()),
        },
        _ => panic!(
            "{} is neither a list nor an object with \"cases\"",
            path.display()
        ),
    };
    assert!(!list.is_empty(), "{} holds no cases", path.display());

    list.into_iter()
        .map(|c| {
            let str_of = |k: &str| {
                c.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let oracle = OracleCase {
                id: str_of("id"),
                workflow: fixture_workflow(&c, &path),
                restart_successful: c
                    .get("restartSuccessful")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                node_field_selector: str_of("nodeFieldSelector"),
                parameters: c
                    .get("parameters")
                    .and_then(|p| serde_json::from_value(p.clone()).ok()),
                max_workflow_size: c
                    .get("maxWorkflowSize")
                    .and_then(Value::as_u64)
                    .map(|s| s as usize),
                ..Default::default()
            };
            Case {
                oracle,
                seed_budget: None,
            }
        })
        .collect()
}

/// A fixture's workflow: inline, or in the file it names next to cases.json.
fn fixture_workflow(case: &Value, cases_path: &std::path::Path) -> Value {
    if let Some(wf) = case.get("workflow") {
        return wf.clone();
    }
    let file = case
        .get("file")
        .and_then(Value::as_str)
        .expect("a fixture has a workflow or a file");
    let path = cases_path.with_file_name(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn from_gen(g: GenCase) -> Case {
    let seed_budget = parse_seed_budget(&g.id);
    let oracle = OracleCase {
        id: g.id,
        workflow: g.workflow,
        restart_successful: g.restart_successful,
        node_field_selector: g.node_field_selector,
        parameters: g.parameters,
        max_workflow_size: g.max_workflow_size,
        ..Default::default()
    };
    Case {
        oracle,
        seed_budget,
    }
}

/// "case_from_seed(0x1f, 48)" -> (0x1f, 48).
fn parse_seed_budget(id: &str) -> Option<(u64, usize)> {
    let inner = id.strip_prefix("case_from_seed(")?.strip_suffix(')')?;
    let (seed, budget) = inner.split_once(", ")?;
    Some((
        u64::from_str_radix(seed.strip_prefix("0x")?, 16).ok()?,
        budget.parse().ok()?,
    ))
}

/// The planner's answer in the oracle's terms.
enum Outcome {
    Done {
        workflow: Value,
        pods: Vec<String>,
        /// The planner's estimate of Go's marshalled size of `workflow`.
        size: usize,
    },
    Failed(PlanError),
    Undecodable(String),
}

fn plan(case: &Case, version: ArgoVersion, now: Timestamp, choose: ChooseParent<'_>) -> Outcome {
    let wf: Workflow = match serde_json::from_value(case.oracle.workflow.clone()) {
        Ok(wf) => wf,
        Err(e) => return Outcome::Undecodable(e.to_string()),
    };
    match plan_retry_with_parents(&wf, &case.options(version), now, choose) {
        Ok(plan) => {
            let mut workflow = serde_json::to_value(&plan.workflow).expect("a workflow serialises");
            let mut size = compress::go_json_size(&plan.workflow, version);
            // rewind's Workflow type fills in a missing apiVersion and kind
            // (some of Argo's fixtures lack them); that is decoding, not planning.
            for key in ["apiVersion", "kind"] {
                if case.oracle.workflow.get(key).is_none()
                    && let Some(Value::String(v)) =
                        workflow.as_object_mut().and_then(|o| o.remove(key))
                {
                    size -= format!(r#""{key}":"{v}","#).len();
                }
            }
            Outcome::Done {
                workflow,
                pods: plan.pods_to_delete,
                size,
            }
        }
        Err(e) => Outcome::Failed(e),
    }
}

/// Why the outcomes differ, or `None` when they are equal.
fn difference(
    oracle: &OracleResult,
    planner: &Outcome,
    workflow: &Value,
    now: &NowWindow,
) -> Option<String> {
    match (&oracle.error, planner) {
        (Some(o), Outcome::Failed(p)) => (!same_error(o, p) && !same_graph_fault(o, p, workflow))
            .then(|| format!("errors differ: argo {o:?}, planner {:?}", p.to_string())),
        (Some(o), Outcome::Undecodable(p)) => (!o.starts_with("decode workflow"))
            .then(|| format!("argo {o:?}, planner cannot decode: {p}")),
        (Some(o), Outcome::Done { .. }) => {
            Some(format!("argo fails with {o:?}, the planner does not"))
        }
        (None, Outcome::Failed(p)) => Some(format!(
            "the planner fails with {:?}, argo does not",
            p.to_string()
        )),
        (None, Outcome::Undecodable(p)) => {
            Some(format!("the planner cannot decode the workflow: {p}"))
        }
        (
            None,
            Outcome::Done {
                workflow,
                pods,
                size,
            },
        ) => {
            let mut theirs = oracle.pods_to_delete.clone();
            let mut ours = pods.clone();
            theirs.sort();
            ours.sort();
            if theirs != ours {
                return Some(format!("pods differ: argo {theirs:?}, planner {ours:?}"));
            }
            let argo_wf = oracle.workflow.clone().unwrap_or(Value::Null);
            // Go's size of the planner's workflow had it carried Argo's blob.
            let blob_len = |wf: &Value| {
                wf.pointer("/status/compressedNodes")
                    .and_then(Value::as_str)
                    .map_or(0, str::len)
            };
            let estimate = size + blob_len(&argo_wf) - blob_len(workflow);
            if estimate != oracle.size {
                return Some(format!(
                    "size differs: Go marshals Argo's result to {} bytes, the planner estimates {estimate}",
                    oracle.size
                ));
            }
            let theirs = normalise(argo_wf, now);
            let ours = normalise(workflow.clone(), now);
            first_difference("", &theirs, &ours)
        }
    }
}

/// Argo's message, compared exactly except where the text cannot match: a Go
/// panic (the planner names the panic and says why), and the compressed size
/// in "too large" (Go's gzip output differs in length from ours).
fn same_error(oracle: &str, planner: &PlanError) -> bool {
    match planner {
        PlanError::ArgoPanics { reason } => {
            let go_value = reason.split(" (").next().unwrap_or_default();
            oracle.strip_prefix("panic: ").is_some_and(|o| o.contains(go_value))
        }
        PlanError::TooLarge { max_size, .. } => {
            oracle.starts_with("workflow is longer than maximum allowed size. compressed size ")
                && oracle.ends_with(&format!(
                    " > maxSize {max_size}Tried to offload but encountered error: offload node status is not supported"
                ))
        }
        _ => oracle == planner.to_string(),
    }
}

/// With several orphans or missing children, Argo names whichever its random
/// map order meets first; the planner the first in ID order. Both must name
/// a real fault of the input, checked here independently.
fn same_graph_fault(oracle: &str, planner: &PlanError, wf: &Value) -> bool {
    if !matches!(
        planner,
        PlanError::MissingParent { .. } | PlanError::MissingChild { .. }
    ) {
        return false;
    }
    let name = wf
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let on_exit = format!("{name}.onExit");
    let nodes = input_nodes(wf);
    let children = |n: &Value| -> Vec<String> {
        n.get("children")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect()
    };
    let listed: BTreeSet<String> = nodes.values().flat_map(children).collect();
    let is_fault = |message: &str| {
        if let Some(id) = message.strip_prefix("couldn't find parent node for ") {
            nodes.values().any(|n| {
                let node_name = n.get("name").and_then(Value::as_str).unwrap_or_default();
                n.get("id").and_then(Value::as_str) == Some(id)
                    && !listed.contains(id)
                    && node_name != name
                    && !node_name.starts_with(&on_exit)
            })
        } else if let Some(id) = message.strip_prefix("coudln't obtain child ") {
            listed.contains(id)
                && !nodes
                    .values()
                    .any(|n| n.get("id").and_then(Value::as_str) == Some(id))
        } else {
            false
        }
    };
    is_fault(oracle) && is_fault(&planner.to_string())
}

/// The input's nodes, decoded from `compressedNodes` when given that way.
fn input_nodes(wf: &Value) -> serde_json::Map<String, Value> {
    if let Some(nodes) = wf.pointer("/status/nodes").and_then(Value::as_object) {
        return nodes.clone();
    }
    let packed = wf
        .pointer("/status/compressedNodes")
        .and_then(Value::as_str)
        .unwrap_or_default();
    compress::decode_nodes(packed, ArgoVersion::V4, compress::DEFAULT_MAX_NODES_SIZE)
        .ok()
        .and_then(|nodes| serde_json::to_value(nodes).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

/// The span in which either side may have taken "now".
struct NowWindow {
    from: Timestamp,
    to: Timestamp,
}

impl NowWindow {
    fn covers(&self, s: &str) -> bool {
        s.parse::<Timestamp>()
            .is_ok_and(|t| t >= self.from && t <= self.to)
    }
}

/// Comparable form: `compressedNodes` decoded in place (its algorithm and
/// nodes; `nodes` is left as it is), "now" timestamps replaced, null/empty
/// values removed.
fn normalise(mut wf: Value, now: &NowWindow) -> Value {
    if let Some(status) = wf.get_mut("status").and_then(Value::as_object_mut) {
        if let Some(Value::String(packed)) = status.get("compressedNodes") {
            let decoded = decode_blob(packed);
            status.insert("compressedNodes".into(), decoded);
        }
        let stamp = |v: Option<&mut Value>| {
            if let Some(v) = v
                && v.as_str().is_some_and(|s| now.covers(s))
            {
                *v = Value::String("(now)".into());
            }
        };
        stamp(status.get_mut("startedAt"));
        if let Some(nodes) = status.get_mut("nodes").and_then(Value::as_object_mut) {
            for node in nodes.values_mut() {
                stamp(node.get_mut("startedAt"));
            }
        }
        if let Some(nodes) = status
            .get_mut("compressedNodes")
            .and_then(|c| c.get_mut("nodes"))
            .and_then(Value::as_object_mut)
        {
            for node in nodes.values_mut() {
                stamp(node.get_mut("startedAt"));
            }
        }
    }
    prune(&mut wf);
    wf
}

/// `compressedNodes` as its algorithm (told by magic bytes, as Argo v4
/// does) and its nodes, decoded here with the decoders directly rather than
/// the planner's own reader. Argo's bytes come from Go encoders the planner
/// does not reproduce, so the bytes themselves are not compared.
fn decode_blob(packed: &str) -> Value {
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(packed) else {
        return json!({"(undecodable base64)": packed});
    };
    let mut text = Vec::new();
    let (algorithm, ok) = match raw.as_slice() {
        [0x1f, 0x8b, ..] => (
            "gzip",
            flate2::read::MultiGzDecoder::new(&raw[..])
                .read_to_end(&mut text)
                .is_ok(),
        ),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            ("zstd", zstd::decode_all(&raw[..]).map(|t| text = t).is_ok())
        }
        _ => (
            "brotli",
            brotli::Decompressor::new(&raw[..], 4096)
                .read_to_end(&mut text)
                .is_ok(),
        ),
    };
    if !ok {
        return json!({"(corrupt)": algorithm, "blob": packed});
    }
    let nodes = serde_json::from_slice(&text)
        .unwrap_or_else(|_| json!({"(not JSON)": String::from_utf8_lossy(&text)}));
    json!({"algorithm": algorithm, "nodes": nodes})
}

/// Removes nulls and empty objects and lists, bottom up. Returns whether the
/// value itself is now "absent".
fn prune(v: &mut Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(o) => {
            o.retain(|_, v| !prune(v));
            o.is_empty()
        }
        Value::Array(a) => {
            for item in a.iter_mut() {
                prune(item);
            }
            a.is_empty()
        }
        _ => false,
    }
}

fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(a), Some(b)) => first_difference(&format!("{path}/{k}"), a, b),
                (a, b) => Some(format!("{path}/{k}: argo {a:?}, planner {b:?}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (a, b))| first_difference(&format!("{path}/{i}"), a, b)),
        _ => (a != b).then(|| format!("{path}: argo {a}, planner {b}")),
    }
}

struct Mismatch {
    case: Case,
    oracle: OracleResult,
    planner: Value,
    why: String,
}

fn planner_json(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Done {
            workflow,
            pods,
            size,
        } => json!({"workflow": workflow, "podsToDelete": pods, "size": size}),
        Outcome::Failed(e) => json!({"error": e.to_string(), "variant": format!("{e:?}")}),
        Outcome::Undecodable(e) => json!({"error": format!("decode workflow: {e}")}),
    }
}

fn compare_all(cases: &[Case], line: ArgoLine, version: ArgoVersion) -> (Tally, Vec<Mismatch>) {
    let from = Timestamp::now() - SignedDuration::from_secs(2);
    let oracle_cases: Vec<OracleCase> = cases.iter().map(|c| c.oracle.clone()).collect();
    let results = run_oracle(line, &oracle_cases);
    assert_eq!(results.len(), cases.len(), "the oracle answers every case");
    let planned: Vec<Outcome> = cases
        .iter()
        .map(|c| plan(c, version, Timestamp::now(), &last_listed))
        .collect();
    let window = NowWindow {
        from,
        to: Timestamp::now() + SignedDuration::from_secs(2),
    };
    let mut tally = Tally::default();
    let mut mismatches = Vec::new();
    for ((case, oracle), planner) in cases.iter().zip(results).zip(&planned) {
        assert_eq!(oracle.id, case.oracle.id, "oracle answers in order");
        let refused = oracle.error.is_some();
        let argo_too_large = oracle
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("workflow is longer than maximum allowed size."));
        let argo_compressed = oracle.compressed_size > 0 && oracle.size == oracle.compressed_size;
        let limit = case
            .oracle
            .max_workflow_size
            .unwrap_or(compress::DEFAULT_MAX_WORKFLOW_SIZE);
        if (argo_too_large || argo_compressed)
            && oracle.compressed_size.abs_diff(limit) * 20 <= limit
        {
            tally.near_limit += 1;
            tally.near_default_limit += usize::from(limit == compress::DEFAULT_MAX_WORKFLOW_SIZE);
        }
        if let (Some(theirs), Outcome::Done { workflow, .. }) = (&oracle.workflow, planner)
            && case
                .oracle
                .workflow
                .pointer("/status/compressedNodes")
                .is_none()
            && let (Some(Value::String(a)), Some(Value::String(b))) = (
                theirs.pointer("/status/compressedNodes"),
                workflow.pointer("/status/compressedNodes"),
            )
        {
            let algorithm = decode_blob(a)["algorithm"]
                .as_str()
                .unwrap_or("?")
                .to_owned();
            let ratio = b.len() as f64 / a.len() as f64 - 1.0;
            let (lo, hi) = tally.blob_ratio.entry(algorithm).or_insert((ratio, ratio));
            *lo = lo.min(ratio);
            *hi = hi.max(ratio);
        }
        if argo_too_large && let Outcome::Done { workflow, .. } = planner {
            // rewind's stronger encoder fit where Argo's did not: allowed, counted.
            if workflow.pointer("/status/compressedNodes").is_some() {
                tally.rewind_writes_argo_refuses += 1;
                continue;
            }
        }
        if !refused && let Outcome::Failed(e @ PlanError::TooLarge { .. }) = planner {
            tally.argo_writes_rewind_refuses += 1;
            let _ = writeln!(
                std::io::stderr(),
                "{version}: Argo writes {} ({} bytes), the planner refuses: {e}",
                case.oracle.id,
                oracle.size
            );
        }
        match difference(&oracle, planner, &case.oracle.workflow, &window) {
            None => {
                tally.equal += 1;
                tally.refused += usize::from(refused);
            }
            Some(_)
                if version == ArgoVersion::V3_7
                    && equal_under_another_parent(case, &oracle, &window) =>
            {
                tally.equal += 1;
                tally.refused += usize::from(refused);
                tally.other_parent += 1;
            }
            Some(why) => mismatches.push(Mismatch {
                case: case.clone(),
                oracle,
                planner: planner_json(planner),
                why,
            }),
        }
    }
    (tally, mismatches)
}

#[derive(Default)]
struct Tally {
    equal: usize,
    /// Equal cases where Argo refused the retry (an error or a panic).
    refused: usize,
    /// Equal once the planner takes the parent v3.7's random map order took.
    other_parent: usize,
    /// Cases whose compressed result Argo measured within 5% of the limit.
    near_limit: usize,
    /// Of those, the cases at Argo's default limit.
    near_default_limit: usize,
    /// Argo writes the retried workflow and the planner refuses it as too
    /// large: must never happen.
    argo_writes_rewind_refuses: usize,
    /// Argo refuses as too large and the planner's stronger encoder fits.
    rewind_writes_argo_refuses: usize,
    /// Per algorithm, the least and greatest relative difference in length
    /// between the planner's compressedNodes and Argo's.
    blob_ratio: BTreeMap<String, (f64, f64)>,
}

/// Nodes listed as a child by several nodes: (ID, number of listing nodes).
fn multi_parent_nodes(wf: &Value) -> Vec<(String, usize)> {
    let nodes = input_nodes(wf);
    let mut listers: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (key, node) in &nodes {
        for child in node
            .get("children")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            listers.entry(child).or_default().insert(key);
        }
    }
    listers
        .into_iter()
        .filter(|(_, l)| l.len() > 1)
        .map(|(c, l)| (c.to_owned(), l.len()))
        .collect()
}

/// Argo v3.7 records a random one of several listing nodes as a node's
/// parent. Whether the planner, given some choice of parents, gives Argo's
/// outcome (every combination is tried, up to a bound).
fn equal_under_another_parent(case: &Case, oracle: &OracleResult, window: &NowWindow) -> bool {
    const MAX_COMBINATIONS: usize = 4096;
    let multi = multi_parent_nodes(&case.oracle.workflow);
    let combinations = multi.iter().try_fold(1usize, |acc, (_, n)| {
        acc.checked_mul(*n).filter(|&c| c <= MAX_COMBINATIONS)
    });
    let Some(combinations) = combinations.filter(|&c| c > 1) else {
        return false;
    };
    (0..combinations).any(|combination| {
        let mut rest = combination;
        let choice: HashMap<&str, usize> = multi
            .iter()
            .map(|(child, n)| {
                let pick = rest % n;
                rest /= n;
                (child.as_str(), pick)
            })
            .collect();
        let choose = |child: &str, _: &[&str]| choice.get(child).copied().unwrap_or(0);
        // A "now" inside the window (this runs after it was measured) even
        // once cut to whole seconds.
        let now = window.from + SignedDuration::from_secs(1);
        let outcome = plan(case, ArgoVersion::V3_7, now, &choose);
        difference(oracle, &outcome, &case.oracle.workflow, window).is_none()
    })
}

/// The smallest failing variant of a mismatch: generated cases are
/// regenerated with every smaller node budget; otherwise the case itself.
fn shrink(m: Mismatch, line: ArgoLine, version: ArgoVersion) -> Mismatch {
    let Some((seed, budget)) = m.case.seed_budget else {
        return m;
    };
    let smaller: Vec<Case> = (1..budget)
        .map(|b| from_gen(case_from_seed(seed, b)))
        .collect();
    if smaller.is_empty() {
        return m;
    }
    let (_, mut failing) = compare_all(&smaller, line, version);
    if failing.is_empty() {
        m
    } else {
        failing.swap_remove(0)
    }
}

fn size_of(m: &Mismatch) -> usize {
    m.case.oracle.workflow.to_string().len()
}

fn write_reproducer(m: &Mismatch, version: ArgoVersion) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&dir).expect("target/ can be created");
    let path = dir.join(format!("plan-mismatch-{version}.json"));
    let c = &m.case.oracle;
    let doc = json!({
        "argoVersion": version.to_string(),
        "difference": m.why,
        "case": {
            "id": c.id,
            "restartSuccessful": c.restart_successful,
            "nodeFieldSelector": c.node_field_selector,
            "parameters": c.parameters,
            "maxWorkflowSize": c.max_workflow_size,
            "workflow": c.workflow,
        },
        "argo": {"workflow": m.oracle.workflow, "podsToDelete": m.oracle.pods_to_delete, "error": m.oracle.error},
        "planner": m.planner,
    });
    let mut file = std::fs::File::create(&path).expect("the reproducer file can be written");
    serde_json::to_writer_pretty(&mut file, &doc).expect("the reproducer serialises");
    path
}

/// Argo's compression settings the near-limit cases take in turn:
/// (WORKFLOW_COMPRESSION_ALGORITHM, WORKFLOW_COMPRESSION_LEVEL, GZIP_IMPLEMENTATION).
const SETTINGS: [(Option<&str>, Option<&str>, Option<&str>); 12] = [
    (None, None, None),
    (None, None, Some("GZip")),
    (Some("gzip"), Some("1"), None),
    (Some("gzip"), Some("9"), Some("GZip")),
    (Some("gzip"), Some("junk"), None),
    (Some("zstd"), None, None),
    (Some("zstd"), Some("1"), None),
    (Some("zstd"), Some("4"), None),
    (Some("brotli"), None, None),
    (Some("brotli"), Some("1"), None),
    (Some("brotli"), Some("9"), None),
    (Some("brotli"), Some("10"), None),
];

/// Generated cases turned into near-limit ones.
const NEAR_LIMIT: usize = 240;

/// The `base` cases with Argo's compression settings in turn and a size
/// limit within ±5% of the size Argo's own encoder gives their retried
/// workflow compressed (asked of the oracle first), below its plain size so
/// that Argo must compress. Cases Argo refuses, or whose compressed form is
/// not smaller than 95% of the plain one, are left out.
fn near_limit_cases(line: ArgoLine, base: &[Case]) -> Vec<Case> {
    let with_settings: Vec<Case> = base
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (algorithm, level, implementation) = SETTINGS[i % SETTINGS.len()];
            let mut c = c.clone();
            c.oracle.max_workflow_size = None;
            c.oracle.compression_algorithm = algorithm.map(String::from);
            c.oracle.compression_level = level.map(String::from);
            c.oracle.gzip_implementation = implementation.map(String::from);
            c
        })
        .collect();
    let oracle_cases: Vec<OracleCase> = with_settings.iter().map(|c| c.oracle.clone()).collect();
    let measured = run_oracle(line, &oracle_cases);
    with_settings
        .into_iter()
        .zip(measured)
        .enumerate()
        .filter(|(_, (_, m))| {
            m.error.is_none() && m.compressed_size > 0 && m.compressed_size * 20 < m.size * 19
        })
        .map(|(i, (mut c, m))| {
            // -5% .. +5% in steps of 0.1%, spread by the case's index.
            let permille = (i * 37 % 101) as i64 - 50;
            let limit = (m.compressed_size as i64 * (1000 + permille) / 1000) as usize;
            c.oracle.max_workflow_size = Some(limit.min(m.size - 1));
            c.oracle.id = format!(
                "{} at {:+.1}% of Argo's compressed size",
                c.oracle.id,
                permille as f64 / 10.0
            );
            c.seed_budget = None;
            c
        })
        .collect()
}

/// (WORKFLOW_COMPRESSION_ALGORITHM, GZIP_IMPLEMENTATION, target in ‰ off the limit).
type DefaultLimitSetting = (Option<&'static str>, Option<&'static str>, i64);

/// Settings and targets (‰ off the 1 MiB default limit) of the cases at the
/// default limit. Brotli is left out here: the brotli crate's qualities 10
/// and 11, which rewind climbs to near the limit, take tens of seconds on
/// the megabytes such a case holds.
const AT_DEFAULT_LIMIT: [DefaultLimitSetting; 3] = [
    (None, None, -30),
    (Some("zstd"), None, 4),
    (None, Some("GZip"), 30),
];

/// Workflows whose retried form Argo compresses to within a few percent of
/// its default 1 MiB limit: a failed generated workflow whose root node gets
/// an output of random hex (which compresses linearly, so two measurements
/// by the oracle give the length that lands on the target).
fn default_limit_cases(line: ArgoLine, base: &[Case]) -> Vec<Case> {
    let candidates = base.iter().filter(|c| {
        let wf = &c.oracle.workflow;
        let name = wf
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        wf.pointer("/status/phase") == Some(&json!("Failed"))
            && !c.oracle.restart_successful
            && c.oracle.parameters.is_none()
            && wf.pointer("/status/compressedNodes").is_none()
            && wf
                .pointer("/status/nodes")
                .and_then(|n| n.get(name))
                .is_some()
    });
    let padded = |c: &Case,
                  (algorithm, implementation, _): (Option<&str>, Option<&str>, i64),
                  len: usize| {
        let mut c = c.clone();
        c.seed_budget = None;
        c.oracle.max_workflow_size = None;
        c.oracle.compression_algorithm = algorithm.map(String::from);
        c.oracle.gzip_implementation = implementation.map(String::from);
        let name = c.oracle.workflow["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ len as u64;
        let pad: String = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                char::from(b"0123456789abcdef"[(state >> 60) as usize])
            })
            .collect();
        c.oracle.workflow["status"]["nodes"][name.as_str()]["outputs"] =
            json!({"parameters": [{"name": "pad", "value": pad}]});
        c
    };
    const SHORT: usize = 600_000;
    const LONG: usize = 1_200_000;
    let chosen: Vec<(&Case, DefaultLimitSetting)> = candidates.zip(AT_DEFAULT_LIMIT).collect();
    let probes: Vec<Case> = chosen
        .iter()
        .flat_map(|&(c, setting)| [padded(c, setting, SHORT), padded(c, setting, LONG)])
        .collect();
    let oracle_cases: Vec<OracleCase> = probes.iter().map(|c| c.oracle.clone()).collect();
    let measured = run_oracle(line, &oracle_cases);
    chosen
        .into_iter()
        .zip(measured.chunks(2))
        .filter_map(|((c, setting), m)| {
            let (short, long) = (m[0].compressed_size as f64, m[1].compressed_size as f64);
            let per_byte = (long - short) / (LONG - SHORT) as f64;
            let target =
                compress::DEFAULT_MAX_WORKFLOW_SIZE as f64 * (1000 + setting.2) as f64 / 1000.0;
            let len = LONG as f64 + (target - long) / per_byte;
            (per_byte > 0.0 && len > 0.0).then(|| {
                let mut case = padded(c, setting, len as usize);
                case.oracle.id = format!(
                    "{} padded to {:+}‰ of the default limit",
                    c.oracle.id, setting.2
                );
                case
            })
        })
        .collect()
}

#[test]
fn planner_matches_argo_for_both_lines() {
    let mut cases = fixture_cases();
    let fixtures = cases.len();
    cases.extend(generate(SEED, GENERATED).into_iter().map(from_gen));

    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (line, version) in [
        (ArgoLine::V4, ArgoVersion::V4),
        (ArgoLine::V3, ArgoVersion::V3_7),
    ] {
        let mut cases = cases.clone();
        cases.extend(near_limit_cases(
            line,
            &cases[fixtures..fixtures + NEAR_LIMIT],
        ));
        cases.extend(default_limit_cases(
            line,
            &cases[fixtures..fixtures + GENERATED],
        ));
        let (tally, mismatches) = compare_all(&cases, line, version);
        let equal = tally.equal;
        let refused = tally.refused;
        let decisions = format!(
            "{} within 5% of the limit ({} at the default limit), {} written by Argo and refused by rewind, {} refused by Argo and written by rewind",
            tally.near_limit,
            tally.near_default_limit,
            tally.argo_writes_rewind_refuses,
            tally.rewind_writes_argo_refuses
        );
        let ratios: Vec<String> = tally
            .blob_ratio
            .iter()
            .map(|(a, (lo, hi))| format!("{a} {:+.1}%..{:+.1}%", lo * 100.0, hi * 100.0))
            .collect();
        let decisions = format!(
            "{decisions}; compressedNodes length against Argo's: {}",
            ratios.join(", ")
        );
        report.push(match tally.other_parent {
            0 => format!("{version} {equal} cases equal ({refused} refused by Argo; {decisions})"),
            n => format!(
                "{version} {equal} cases equal ({refused} refused by Argo, {n} equal with another of Argo's random parent choices; {decisions})"
            ),
        });

        let examples: Vec<String> = mismatches
            .iter()
            .take(8)
            .map(|m| format!("  {}: {}", m.case.oracle.id, m.why))
            .collect();
        if let Some(smallest) = mismatches.into_iter().min_by_key(size_of) {
            let first = examples.join("\n");
            let count = cases.len() - equal - tally.rewind_writes_argo_refuses;
            let shrunk = shrink(smallest, line, version);
            let path = write_reproducer(&shrunk, version);
            failures.push(format!(
                "{version}: {count} of {} cases differ, e.g.\n{first}\nsmallest reproducer ({}: {}) in {}",
                cases.len(),
                shrunk.case.oracle.id,
                shrunk.why,
                path.display()
            ));
        }
    }
    // Written to the stderr handle directly so it shows without --nocapture.
    let _ = writeln!(
        std::io::stderr(),
        "differential: {} ({fixtures} Argo fixtures + {GENERATED} generated + up to {NEAR_LIMIT} near the limit per line)",
        report.join(", ")
    );
    assert!(
        failures.is_empty(),
        "planner and Argo differ:\n{}",
        failures.join("\n")
    );
}

#[test]
fn normalising_keeps_real_differences() {
    // The comparison must not hide a change that matters.
    let window = NowWindow {
        from: Timestamp::UNIX_EPOCH,
        to: Timestamp::UNIX_EPOCH,
    };
    let a = normalise(
        json!({"status": {"nodes": {"n": {"phase": "Running", "children": []}}}}),
        &window,
    );
    let b = normalise(
        json!({"status": {"nodes": {"n": {"phase": "Failed"}}}}),
        &window,
    );
    assert!(
        first_difference("", &a, &b)
            .unwrap()
            .contains("/status/nodes/n/phase")
    );
    let c = normalise(
        json!({"status": {"nodes": {"n": {"phase": "Failed", "finishedAt": null}}}}),
        &window,
    );
    assert_eq!(first_difference("", &b, &c), None);
    let stamped = normalise(
        json!({"status": {"startedAt": "1970-01-01T00:00:00Z"}}),
        &window,
    );
    assert_eq!(stamped, json!({"status": {"startedAt": "(now)"}}));
    let old = normalise(
        json!({"status": {"startedAt": "2024-05-01T00:00:00Z"}}),
        &window,
    );
    assert_eq!(
        old,
        json!({"status": {"startedAt": "2024-05-01T00:00:00Z"}})
    );
}

#[test]
fn corrupt_compressed_nodes_fail_with_argos_messages() {
    let gzip = |data: &[u8]| {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        w.write_all(data).expect("compressing into memory");
        w.finish().expect("compressing into memory")
    };
    let good = gzip(br#"{"wf":{"id":"wf","name":"wf","type":"Pod","phase":"Failed"}}"#);
    let mut bad_crc = good.clone();
    let crc_at = bad_crc.len() - 8;
    bad_crc[crc_at] ^= 1;
    let blobs: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("no-trailer", good[..good.len() - 4].to_vec()),
        ("bad-checksum", bad_crc),
        ("not-gzip-header", vec![0x1f, 0x8b, 0, 0]),
        ("json-syntax", gzip(b"{x")),
        ("json-eof", gzip(br#"{"a":"#)),
        ("json-empty", gzip(b"")),
        ("json-array", gzip(b"[1]")),
        ("json-string", gzip(br#""s""#)),
        ("json-trailing", gzip(b"{} x")),
        ("json-trailing-comma", gzip(br#"{"a":{"id":"x",}}"#)),
        ("json-missing-colon", gzip(br#"{"a" 1}"#)),
        (
            "json-array-element",
            gzip(br#"{"a":{"children":["x" "y"]}}"#),
        ),
        ("json-pair", gzip(br#"{"a":{} "b":{}}"#)),
        ("json-value", gzip(br#"{"a":?}"#)),
        ("json-newline", gzip(b"{\n\"a\":\n\n  x}")),
    ];
    let cases: Vec<Case> = blobs
        .iter()
        .map(|(id, blob)| Case {
            oracle: OracleCase {
                id: (*id).to_owned(),
                workflow: json!({
                    "metadata": {"name": "wf", "labels": {"a": "b"}},
                    "spec": {},
                    "status": {"phase": "Failed", "compressedNodes": base64::engine::general_purpose::STANDARD.encode(blob)},
                }),
                ..Default::default()
            },
            seed_budget: None,
        })
        .collect();
    for (line, version) in [
        (ArgoLine::V4, ArgoVersion::V4),
        (ArgoLine::V3, ArgoVersion::V3_7),
    ] {
        let oracle_cases: Vec<OracleCase> = cases.iter().map(|c| c.oracle.clone()).collect();
        for (case, argo) in cases.iter().zip(run_oracle(line, &oracle_cases)) {
            let argo = argo
                .error
                .unwrap_or_else(|| panic!("{version} {}: Argo reads it", case.oracle.id));
            let Outcome::Failed(ours) = plan(case, version, Timestamp::now(), &last_listed) else {
                panic!("{version} {}: the planner reads it", case.oracle.id);
            };
            assert_eq!(ours.to_string(), argo, "{version} {}", case.oracle.id);
        }
    }
}
