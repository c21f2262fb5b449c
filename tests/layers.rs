//! The shape of the code, checked: the library's layers import only the
//! layers above them in `src/lib.rs`'s map, no two modules of a layer import
//! each other in a cycle, and the product's default build carries none of
//! the test machinery.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each layer and the layers it may import (itself included).
const LAYERS: &[(&str, &[&str])] = &[
    ("argo", &["argo"]),
    ("protocol", &["argo", "protocol"]),
    ("engine", &["argo", "engine"]),
    ("telemetry", &["engine", "telemetry"]),
    (
        "retry",
        &["argo", "protocol", "engine", "telemetry", "retry"],
    ),
    ("client", &["argo", "protocol", "engine", "client"]),
    (
        "argoapi",
        &[
            "argo",
            "protocol",
            "engine",
            "telemetry",
            "client",
            "argoapi",
        ],
    ),
    (
        "controller",
        &[
            "argo",
            "protocol",
            "engine",
            "telemetry",
            "retry",
            "argoapi",
            "controller",
        ],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is, as `layer::module` (a folder's own `mod.rs` is the
/// layer itself; deeper files belong to their second-level module).
fn module_of(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src()).expect("under src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.truncate(2);
    parts
}

/// The `crate::a::b` paths a file's code (not its comments) names, as
/// `[a, b]` (or `[a]`).
fn imports(text: &str) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let path: String = rest[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let parts: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .take(2)
                .map(str::to_owned)
                .collect();
            if !parts.is_empty() {
                found.insert(parts);
            }
            rest = &rest[at + "crate::".len()..];
        }
    }
    found
}

/// Module -> the modules it imports, over the library (the binary, tests
/// and `testenv` aside).
fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in all {
        let module = module_of(&file);
        if matches!(module[0].as_str(), "bin" | "testenv" | "lib") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("reading a source file");
        graph.entry(module).or_default().extend(imports(&text));
    }
    graph
}

#[test]
fn each_layer_imports_only_the_layers_above_it() {
    let allowed: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, imported) in graph() {
        let may = allowed
            .get(module[0].as_str())
            .unwrap_or_else(|| panic!("src/{} is in no layer of LAYERS", module[0]));
        for import in imported {
            if !may.contains(&import[0].as_str()) {
                wrong.push(format!(
                    "{} imports crate::{}",
                    module.join("::"),
                    import.join("::")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_modules_import_each_other_in_a_cycle() {
    // A folder's own mod.rs is its map: its children may use what it
    // declares, and it names them; those edges are not the cycles meant.
    let graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = graph()
        .into_iter()
        .map(|(module, imported)| {
            let edges = imported
                .into_iter()
                .filter(|i| *i != module && i[..1] != module[..] && module[..1] != i[..])
                .collect();
            (module, edges)
        })
        .collect();
    // Depth-first search for a back edge.
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if !done.insert(node.clone()) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!(
                "modules import each other in a cycle: {}",
                names.join(" -> ")
            );
        }
    }
}

#[test]
fn a_cycle_would_be_found() {
    // The scan itself: a file naming crate paths in code, not in comments.
    let found = imports(
        "use crate::retry::live::Target; // crate::client::x\n let x = crate::engine::fault::is_transient(e);",
    );
    let expected: BTreeSet<Vec<String>> = [["retry", "live"], ["engine", "fault"]]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(found, expected);
}

#[test]
fn the_default_build_carries_no_test_machinery() {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let package = &metadata["packages"][0];
    let features = &package["features"];
    assert_eq!(
        features["default"],
        serde_json::json!([]),
        "testenv must stay off by default"
    );
    let testenv: BTreeSet<&str> = features["testenv"]
        .as_array()
        .expect("a testenv feature")
        .iter()
        .filter_map(|f| f.as_str()?.strip_prefix("dep:"))
        .collect();
    for machinery in ["procfs", "rcgen", "tempfile", "prometheus-parse"] {
        let dependency = package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .find(|d| d["name"] == machinery && d["kind"].is_null())
            .unwrap_or_else(|| panic!("{machinery} is no dependency any more: update this test"));
        assert_eq!(dependency["optional"], true, "{machinery} must be optional");
        assert!(
            testenv.contains(machinery),
            "{machinery} must come only with testenv"
        );
    }
}
