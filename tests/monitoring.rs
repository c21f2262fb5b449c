//! The chart's alerts and dashboard, checked with Prometheus' own promtool (built from its Go
//! module by tools/prometheus/build.sh, cached under ~/.cache/rewind; `make test` builds it
//! first): the rules pass `promtool check rules` and their unit tests
//! (tests/monitoring/alerts_test.yaml), every alert is tested both firing and silent and has
//! its runbook section, and every dashboard query parses. tests/cluster/monitoring.rs
//! evaluates the same expressions against a real controller's metrics.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[allow(dead_code)]
#[path = "support/monitoring.rs"]
mod monitoring;

use monitoring::{ALERTS, alerts, dashboard, resolve};

const ALERT_TESTS: &str = "tests/monitoring/alerts_test.yaml";
const RUNBOOK: &str = "docs/runbook.md";
/// The runbook's address as the rules give it (the chart may put another in its place).
const RUNBOOK_URL: &str = "https://github.com/rewind-dev/rewind/blob/main/docs/runbook.md";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn promtool() -> PathBuf {
    let out = Command::new(root().join("tools/prometheus/build.sh"))
        .output()
        .expect("running tools/prometheus/build.sh");
    assert!(
        out.status.success(),
        "tools/prometheus/build.sh failed (it needs Go):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("promtool")
}

/// Runs promtool; panics with its output unless it succeeds.
fn run_promtool(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(root())
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_rules_pass_promtool_check() {
    let out = run_promtool(&["check", "rules", "--lint=all", "--lint-fatal", ALERTS]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_rules_pass_their_unit_tests() {
    run_promtool(&["test", "rules", ALERT_TESTS]);
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let tests = yaml(ALERT_TESTS);
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for group in tests["tests"].as_array().unwrap() {
        for case in group["alert_rule_test"].as_array().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            match case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                true => firing.insert(name),
                false => silent.insert(name),
            };
        }
    }
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        assert!(firing.contains(name), "{name} is never tested firing");
        assert!(silent.contains(name), "{name} is never tested silent");
    }
}

#[test]
fn every_alert_says_what_to_do_and_links_its_runbook_section() {
    let runbook = std::fs::read_to_string(root().join(RUNBOOK)).unwrap();
    let sections: BTreeSet<&str> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    let mut named = BTreeSet::new();
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        let annotations = &alert["annotations"];
        for key in ["summary", "description"] {
            assert!(
                annotations[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name} has no {key}"
            );
        }
        assert!(
            annotations["description"]
                .as_str()
                .unwrap()
                .contains("runbook"),
            "{name}'s description does not send the reader to the runbook"
        );
        // GitHub's anchor of a `## Name` heading is the name in lower case.
        assert_eq!(
            annotations["runbook_url"].as_str(),
            Some(format!("{RUNBOOK_URL}#{}", name.to_lowercase()).as_str()),
            "{name}"
        );
        assert!(sections.contains(name), "{RUNBOOK} has no section {name}");
        assert!(alert["labels"]["severity"].is_string(), "{name}: severity");
        named.insert(name.to_owned());
    }
    let extra: Vec<_> = sections.iter().filter(|s| !named.contains(**s)).collect();
    assert!(extra.is_empty(), "runbook sections of no alert: {extra:?}");
}

#[test]
fn every_dashboard_query_parses() {
    // promtool parses expressions offline only in rule files: one recording rule per query.
    let mut rules = Vec::new();
    for panel in dashboard() {
        for query in &panel.queries {
            let expr = resolve(&query.expr, ".+", "1m", "1h");
            assert!(!expr.contains('$'), "a variable left in {expr}");
            rules.push(serde_json::json!({
                "record": format!("dashboard:panel_{}:{}", panel.id, query.ref_id.to_lowercase()),
                "expr": expr,
            }));
        }
    }
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-queries.yaml");
    let groups = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, serde_yaml_ng::to_string(&groups).unwrap()).unwrap();
    run_promtool(&["check", "rules", file.to_str().unwrap()]);
}
