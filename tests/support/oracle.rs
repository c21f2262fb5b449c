//! Argo's own retry code as a test oracle.
//!
//! `tools/oracle/{v4,v3}` are small Go programs that run Argo's server-side
//! retry (hydrate, `FormulateRetryWorkflow`, dehydrate) on JSON lines. This
//! module builds them once per test process and streams batches of cases
//! through one oracle process per batch.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The Argo release line whose retry behaviour the oracle runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgoLine {
    /// github.com/argoproj/argo-workflows/v4 (pinned in tools/oracle/v4/go.mod).
    V4,
    /// github.com/argoproj/argo-workflows/v3, the v3.7 line (tools/oracle/v3/go.mod).
    V3,
}

impl ArgoLine {
    fn index(self) -> usize {
        match self {
            ArgoLine::V4 => 0,
            ArgoLine::V3 => 1,
        }
    }
}

/// One retry request: the inputs of Argo's `RetryWorkflow`.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OracleCase {
    pub id: String,
    pub workflow: serde_json::Value,
    pub restart_successful: bool,
    pub node_field_selector: String,
    /// `None` and `Some(vec![])` both reach Argo as a nil slice (see tools/oracle/NOTES.md).
    pub parameters: Option<Vec<String>>,
    /// Argo's MAX_WORKFLOW_SIZE for this case; `None` keeps Argo's default (1 MiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_workflow_size: Option<usize>,
    /// Argo's WORKFLOW_COMPRESSION_ALGORITHM and WORKFLOW_COMPRESSION_LEVEL
    /// for this case; `None` leaves them unset (gzip at its default level).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression_algorithm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression_level: Option<String>,
    /// Argo's GZIP_IMPLEMENTATION, read once per oracle process: [`run_oracle`]
    /// runs the cases that set it in a process of their own.
    #[serde(skip)]
    pub gzip_implementation: Option<String>,
}

/// What Argo produced for one case: the reset workflow (as Go marshals it)
/// and the sorted pods to delete, or Argo's error message (`panic: ...` when
/// Argo's code panicked).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OracleResult {
    pub id: String,
    pub workflow: Option<serde_json::Value>,
    pub pods_to_delete: Vec<String>,
    pub error: Option<String>,
    /// `len(json.Marshal(workflow))`, what Argo compares with the limit.
    #[serde(default)]
    pub size: usize,
    /// That size with the retried nodes compressed by Argo's encoder (also
    /// when Argo refused as too large; 0 before that point or without nodes).
    #[serde(default)]
    pub compressed_size: usize,
}

/// The oracle binary for `line`, built by tools/oracle/build.sh on first use
/// in this process. Panics when Go or the build fails: the differential tests
/// must fail loudly rather than be skipped.
pub fn oracle_binary(line: ArgoLine) -> PathBuf {
    static BINARIES: OnceLock<[PathBuf; 2]> = OnceLock::new();
    BINARIES.get_or_init(build_oracles)[line.index()].clone()
}

fn build_oracles() -> [PathBuf; 2] {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/oracle/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .args(["v4", "v3"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed ({}); the oracles need Go on PATH and the Go module proxy or a warm module cache",
        script.display(),
        output.status
    );
    let stdout = String::from_utf8(output.stdout).expect("build.sh prints UTF-8 paths");
    let paths: Vec<PathBuf> = stdout.lines().map(PathBuf::from).collect();
    match <[PathBuf; 2]>::try_from(paths) {
        Ok(paths) => paths,
        Err(paths) => panic!(
            "{} printed {paths:?}, want two binary paths (v4, v3)",
            script.display()
        ),
    }
}

/// Environment variables Argo's retry code reads; removed so the oracle always
/// shows Argo's defaults (per-case sizes go through `max_workflow_size`).
const ARGO_BEHAVIOUR_VARS: [&str; 7] = [
    "POD_NAMES",
    "MAX_WORKFLOW_SIZE",
    "WORKFLOW_COMPRESSION_ALGORITHM",
    "WORKFLOW_COMPRESSION_LEVEL",
    "GZIP_IMPLEMENTATION",
    "ALWAYS_OFFLOAD_NODE_STATUS",
    "TRANSIENT_ERROR_PATTERN",
];

/// Runs `cases` through the oracle and returns one result per case, in
/// order: one process per GZIP_IMPLEMENTATION the cases ask for.
pub fn run_oracle(line: ArgoLine, cases: &[OracleCase]) -> Vec<OracleResult> {
    let mut groups: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let implementation = case.gzip_implementation.as_deref();
        match groups.iter_mut().find(|(g, _)| *g == implementation) {
            Some((_, members)) => members.push(i),
            None => groups.push((implementation, vec![i])),
        }
    }
    let mut results: Vec<Option<OracleResult>> = vec![None; cases.len()];
    for (implementation, members) in groups {
        let batch: Vec<OracleCase> = members.iter().map(|&i| cases[i].clone()).collect();
        for (i, result) in members
            .into_iter()
            .zip(run_process(line, &batch, implementation))
        {
            results[i] = Some(result);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every case is in one group"))
        .collect()
}

/// Runs `cases` through one oracle process. Cases are written while results
/// are read, so batches of any size stream without filling a pipe.
fn run_process(
    line: ArgoLine,
    cases: &[OracleCase],
    gzip_implementation: Option<&str>,
) -> Vec<OracleResult> {
    let binary = oracle_binary(line);
    let mut command = Command::new(&binary);
    for var in ARGO_BEHAVIOUR_VARS {
        command.env_remove(var);
    }
    if let Some(implementation) = gzip_implementation {
        command.env("GZIP_IMPLEMENTATION", implementation);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start oracle {}: {e}", binary.display()));
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");

    let (results, logs) = std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut stdin = BufWriter::new(stdin);
            for case in cases {
                serde_json::to_writer(&mut stdin, case).expect("an OracleCase serialises to JSON");
                // A closed pipe means the oracle died; its exit status says why.
                if stdin.write_all(b"\n").is_err() {
                    return;
                }
            }
            let _ = stdin.flush();
        });
        let logs = scope.spawn(move || {
            let mut logs = String::new();
            let _ = stderr.read_to_string(&mut logs);
            logs
        });
        let results: Vec<String> = BufReader::new(stdout)
            .lines()
            .map(|line| line.expect("oracle stdout is UTF-8 lines"))
            .collect();
        (results, logs.join().expect("stderr reader does not panic"))
    });
    let status = child.wait().expect("wait for the oracle");
    assert!(
        status.success() && results.len() == cases.len(),
        "oracle {} ({status}) answered {} of {} cases; its stderr:\n{logs}",
        binary.display(),
        results.len(),
        cases.len()
    );
    results
        .iter()
        .zip(cases)
        .map(|(line, case)| {
            let result: OracleResult = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("oracle answer for case {}: {e}: {line}", case.id));
            assert_eq!(result.id, case.id, "oracle answers out of order");
            result
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn case(id: &str, workflow: serde_json::Value) -> OracleCase {
        OracleCase {
            id: id.to_owned(),
            workflow,
            restart_successful: false,
            node_field_selector: String::new(),
            parameters: None,
            max_workflow_size: None,
            compression_algorithm: None,
            compression_level: None,
            gzip_implementation: None,
        }
    }

    /// wf (Steps, Failed) -> wf-1 (StepGroup, Failed) -> wf-2 (Pod `step`, Failed).
    fn failed_workflow(phase: &str) -> serde_json::Value {
        let node = |id: &str, name: &str, kind: &str, children: &[&str]| {
            json!({"id": id, "name": name, "displayName": name, "type": kind, "phase": "Failed",
                   "templateName": if kind == "Pod" { "step" } else { "main" },
                   "children": children, "boundaryID": if id == "wf" { "" } else { "wf" }})
        };
        json!({
            "metadata": {"name": "wf", "namespace": "argo", "labels": {"workflows.argoproj.io/completed": "true"}},
            "spec": {"entrypoint": "main", "arguments": {"parameters": [{"name": "p", "value": "old"}]}},
            "status": {"phase": phase, "message": "child failed", "nodes": {
                "wf": node("wf", "wf", "Steps", &["wf-1"]),
                "wf-1": node("wf-1", "wf[0]", "StepGroup", &["wf-2"]),
                "wf-2": node("wf-2", "wf[0].step", "Pod", &[]),
            }}
        })
    }

    #[test]
    fn failed_workflow_is_reset_and_its_failed_pod_deleted() {
        for line in [ArgoLine::V4, ArgoLine::V3] {
            let results = run_oracle(line, &[case("failed", failed_workflow("Failed"))]);
            let [result] = results.as_slice() else {
                panic!("one result per case")
            };
            assert_eq!(result.error, None, "{line:?}");
            // Pod name format v2: <workflow>-<template>-<FNV-1a 32 of the node name>.
            assert_eq!(result.pods_to_delete.len(), 1, "{line:?}");
            assert!(
                result.pods_to_delete[0].starts_with("wf-step-"),
                "{line:?}: {:?}",
                result.pods_to_delete
            );
            let wf = result.workflow.as_ref().expect("a reset workflow");
            let nodes = wf["status"]["nodes"]
                .as_object()
                .expect("nodes stay uncompressed");
            assert!(
                !nodes.contains_key("wf-2"),
                "{line:?}: the failed pod node is deleted"
            );
            assert_eq!(nodes["wf"]["phase"], "Running", "{line:?}");
            assert_eq!(
                wf["metadata"]["labels"].get("workflows.argoproj.io/completed"),
                None
            );
        }
        // The lines differ on the workflow phase: v4 sets Unknown (""), which
        // Go omits; v3.7 sets Running.
        let phase = |line| {
            let results = run_oracle(line, &[case("phase", failed_workflow("Failed"))]);
            results[0].workflow.as_ref().expect("a reset workflow")["status"]
                .get("phase")
                .cloned()
        };
        assert_eq!(phase(ArgoLine::V4), None);
        assert_eq!(phase(ArgoLine::V3), Some(json!("Running")));
    }

    #[test]
    fn errors_are_argo_messages_in_case_order() {
        let mut bad_selector = case("bad-selector", failed_workflow("Succeeded"));
        bad_selector.restart_successful = true;
        bad_selector.node_field_selector = "phase".to_owned();
        let mut bad_parameter = case("bad-parameter", failed_workflow("Failed"));
        bad_parameter.parameters = Some(vec!["no-equals-sign".to_owned()]);
        let mut offloaded = failed_workflow("Failed");
        offloaded["status"]["offloadNodeStatusVersion"] = json!("fnv:1");
        let mut no_root = failed_workflow("Failed");
        no_root["status"]["nodes"]
            .as_object_mut()
            .unwrap()
            .remove("wf");
        let cases = [
            case("running", failed_workflow("Running")),
            case("succeeded", failed_workflow("Succeeded")),
            bad_selector,
            bad_parameter,
            case("offloaded", offloaded),
            case("no-root", no_root),
            case("ok", failed_workflow("Error")),
        ];
        for line in [ArgoLine::V4, ArgoLine::V3] {
            let results = run_oracle(line, &cases);
            let ids: Vec<&str> = results.iter().map(|r| r.id.as_str()).collect();
            assert_eq!(
                ids,
                [
                    "running",
                    "succeeded",
                    "bad-selector",
                    "bad-parameter",
                    "offloaded",
                    "no-root",
                    "ok"
                ]
            );
            let error = |i: usize| {
                results[i]
                    .error
                    .as_deref()
                    .unwrap_or_else(|| panic!("{line:?}: case {} succeeded", ids[i]))
            };
            assert_eq!(error(0), "Cannot retry a workflow in phase Running");
            assert_eq!(
                error(1),
                "To retry a succeeded workflow, set the options restartSuccessful and nodeFieldSelector"
            );
            assert_eq!(
                error(2),
                "invalid selector: 'phase'; can't understand 'phase'"
            );
            assert_eq!(
                error(3),
                "expected parameter of the form: NAME=VALUE. Received: no-equals-sign"
            );
            assert_eq!(error(4), "offload node status is not supported");
            assert_eq!(error(5), "couldn't find parent node for wf-1");
            assert!(
                results[..6]
                    .iter()
                    .all(|r| r.workflow.is_none() && r.pods_to_delete.is_empty())
            );
            assert_eq!(results[6].error, None, "{line:?}");
        }
    }

    #[test]
    fn a_panic_in_argo_fails_only_its_case() {
        // v3.7 writes the phase label into metadata.labels without checking for nil.
        let mut unlabelled = failed_workflow("Failed");
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        // A failed pod listing a child that is not in the node map: v4 dereferences
        // nil, v3.7 panics through logrus (reported by its message only).
        let mut missing_child = failed_workflow("Failed");
        missing_child["status"]["nodes"]["wf-2"]["children"] = json!(["wf-3"]);
        let cases = [
            case("unlabelled", unlabelled),
            case("missing-child", missing_child),
            case("next", failed_workflow("Failed")),
        ];
        let v3 = run_oracle(ArgoLine::V3, &cases);
        assert_eq!(
            v3[0].error.as_deref(),
            Some("panic: assignment to entry in nil map")
        );
        assert_eq!(
            v3[1].error.as_deref(),
            Some("panic: Coudn't obtain child for wf-3, panicking")
        );
        assert_eq!(v3[2].error, None);
        let v4 = run_oracle(ArgoLine::V4, &cases);
        assert_eq!(v4[0].error, None, "v4 does not write the phase label");
        assert_eq!(
            v4[1].error.as_deref(),
            Some("panic: runtime error: invalid memory address or nil pointer dereference")
        );
        assert_eq!(v4[2].error, None);
    }

    #[test]
    fn large_workflows_come_back_compressed() {
        // 4 KB of outputs on the kept root node: about 5 KB as JSON, far less compressed.
        let mut workflow = failed_workflow("Failed");
        workflow["status"]["nodes"]["wf"]["outputs"] =
            json!({"parameters": [{"name": "big", "value": "x".repeat(4000)}]});
        let mut small_limit = case("small-limit", workflow.clone());
        small_limit.max_workflow_size = Some(3000);
        let mut too_small = case("too-small", workflow.clone());
        too_small.max_workflow_size = Some(100);
        let results = run_oracle(
            ArgoLine::V4,
            &[small_limit, too_small, case("default", workflow)],
        );
        let status = |i: usize| &results[i].workflow.as_ref().expect("a workflow")["status"];
        assert!(
            status(0)["compressedNodes"].is_string() && status(0).get("nodes").is_none(),
            "{:?}",
            status(0)
        );
        let too_small = results[1]
            .error
            .as_deref()
            .expect("too large even compressed");
        assert!(
            too_small.starts_with("workflow is longer than maximum allowed size."),
            "{too_small}"
        );
        assert!(too_small.ends_with(
            "Tried to offload but encountered error: offload node status is not supported"
        ));
        // The limit is per case: the next case is back at the 1 MiB default.
        assert!(status(2)["nodes"].is_object() && status(2).get("compressedNodes").is_none());
    }
}
