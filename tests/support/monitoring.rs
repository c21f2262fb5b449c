//! The chart's dashboard and alert rules as the tests read them: the files the chart's
//! templates put in its ConfigMap and PrometheusRule (deploy/helm/rewind/monitoring/), parsed,
//! and Grafana's variables given values so Prometheus can run each query.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub const ALERTS: &str = "deploy/helm/rewind/monitoring/alerts.yaml";
pub const DASHBOARD: &str = "deploy/helm/rewind/monitoring/dashboard.json";

/// `relative` under the crate's root.
pub fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A dashboard panel, where Grafana puts it and what it asks.
pub struct Panel {
    pub id: u64,
    pub title: String,
    /// timeseries, bargauge or stat.
    pub kind: String,
    /// Grafana's unit of its values (bytes, s, reqps, short).
    pub unit: String,
    /// x, y, width, height on Grafana's 24-column grid.
    pub grid: [u32; 4],
    pub queries: Vec<Query>,
}

/// One target of a panel.
pub struct Query {
    pub ref_id: String,
    /// As written in the dashboard, with Grafana's variables.
    pub expr: String,
    /// Grafana's legend format (`{{label}}` replaced by the series' label).
    pub legend: String,
    /// Asked at one instant (the end of the range) rather than over the range.
    pub instant: bool,
}

impl Query {
    /// The legend of a series with `labels`.
    pub fn legend_of(&self, labels: &BTreeMap<String, String>) -> String {
        let mut legend = self.legend.clone();
        for (name, value) in labels {
            legend = legend.replace(&format!("{{{{{name}}}}}"), value);
        }
        legend
    }
}

/// Every panel of the dashboard.
pub fn dashboard() -> Vec<Panel> {
    let text = std::fs::read_to_string(path(DASHBOARD)).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(|p| Panel {
            id: p["id"].as_u64().expect("a panel id"),
            title: str_of(&p["title"]),
            kind: str_of(&p["type"]),
            unit: str_of(&p["fieldConfig"]["defaults"]["unit"]),
            grid: ["x", "y", "w", "h"].map(|k| p["gridPos"][k].as_u64().unwrap_or(0) as u32),
            queries: p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|t| Query {
                    ref_id: str_of(&t["refId"]),
                    expr: str_of(&t["expr"]),
                    legend: str_of(&t["legendFormat"]),
                    instant: t["instant"] == true,
                })
                .collect(),
        })
        .collect()
}

/// Every alerting rule of the rule file.
pub fn alerts() -> Vec<Value> {
    let text = std::fs::read_to_string(path(ALERTS)).unwrap();
    let rules: Value = serde_yaml_ng::from_str(&text).expect("the rules are YAML");
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// A dashboard query as Prometheus runs it: Grafana's `$job`, `$__rate_interval` and
/// `$__range` given values.
pub fn resolve(expr: &str, job: &str, rate_interval: &str, range: &str) -> String {
    expr.replace("$__rate_interval", rate_interval)
        .replace("$__range", range)
        .replace("$job", job)
}
