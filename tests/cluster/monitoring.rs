//! The chart's dashboard and alerts against a real controller: the `rewind controller`
//! binary, leader-elected and told its container limits as the chart tells it, serves three
//! requests (a bulk retry of 1,500 pods, a retry of 240 pods deleted one by one at the
//! budget's rate, a refused one) while Prometheus, on loopback, scrapes its /metrics every
//! second and evaluates the chart's alert rules. Then every dashboard query has data, no
//! query or alert expression names a metric the controller does not export, every rule
//! evaluates without error, and none is firing or pending after this healthy run.
//!
//! With REWIND_DASHBOARD_PNG=PATH it also draws the dashboard from those answers
//! (docs/dashboard.png is made so: see docs/monitoring.md, "Dashboard and alerts").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail, ensure};
use kube::api::Api;
use rewind::argo::workflow::Workflow;
use rewind::protocol::request::RetryPhase;
use rewind::testenv::bench::child::RewindController;
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::prometheus::{Config, Prometheus, Series};
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;
use crate::support::dashboard_png::{self, Answered};
use crate::support::monitoring_files::{ALERTS, alerts, dashboard, path, resolve};

/// Grafana's `$__rate_interval` for a scrape a second: four scrapes, and then some.
const RATE_INTERVAL: &str = "5s";
const JOB: &str = "rewind";
const MEMORY_LIMIT: u64 = 512 << 20;
/// The controller's write budget (its defaults).
const QPS: u32 = 20;
const BURST: u32 = 30;
const PNG: &str = "REWIND_DASHBOARD_PNG";

pub async fn a_scraped_retry_gives_every_panel_data_and_raises_no_alert(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let bulk = FailedDag {
        name: "bulk".into(),
        failed: 1500,
        succeeded: 20,
    };
    bulk.create(&admin, &namespace, 16, || ()).await?;
    let single = FailedDag {
        name: "single".into(),
        failed: 240,
        succeeded: 0,
    };
    single.create(&admin, &namespace, 16, || ()).await?;
    // A failed pod outside the plan that a DeleteCollection would select sends that retry
    // pod by pod: one DELETE each, so the write budget is spent at its rate for a while.
    ctl::create_pod(
        &cluster,
        &namespace,
        "single-outsider",
        &single.name,
        Some("Failed"),
    )
    .await?;

    let logs = tempfile::tempdir()?;
    let args: Vec<String> = [
        "--namespace",
        &namespace,
        "--argo-configmap=",
        "--leader-elect",
        "--lease-namespace",
        &namespace,
        "--lease-duration=6s",
        &format!("--memory-limit={MEMORY_LIMIT}"),
        "--cpu-limit=1000",
        &format!("--qps={QPS}"),
        &format!("--burst={BURST}"),
    ]
    .map(str::to_owned)
    .into();
    let controller = RewindController::start(
        Path::new(env!("CARGO_BIN_EXE_rewind")),
        &cluster,
        &args,
        logs.path().join("rewind.log"),
        Duration::from_secs(30),
    )
    .await?;
    let log = || std::fs::read_to_string(controller.log()).unwrap_or_default();
    let prometheus = Prometheus::start(&Config {
        job: JOB.into(),
        targets: vec![controller.http_addr()],
        rule_files: vec![path(ALERTS)],
        interval: Duration::from_secs(1),
    })
    .await?;
    let start = SystemTime::now();
    wait_leading(&prometheus).await.with_context(log)?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    for (workflow, token, expected) in [
        (&bulk.name, "1", RetryPhase::Succeeded),
        (&single.name, "1", RetryPhase::Succeeded),
        // The bulk workflow was reset and runs again: Argo's rules refuse.
        (&bulk.name, "2", RetryPhase::Failed),
    ] {
        ctl::request_retry(&cluster, &namespace, workflow, token).await?;
        let (_, status) =
            ctl::wait_finished(&workflows, workflow, token, Duration::from_secs(120)).await?;
        ensure!(
            status.phase == expected,
            "retry {token} of {workflow}: {status:?}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // Every series scraped at least twice more after the last request ended.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end = SystemTime::now();
    let range = format!("{}s", end.duration_since(start)?.as_secs() + 1);

    let exported = prometheus.metric_names().await?;
    let mut problems = Vec::new();
    let panels = dashboard();
    let mut answered = Vec::new();
    for panel in &panels {
        let mut answers = Vec::new();
        for query in &panel.queries {
            let expr = resolve(&query.expr, JOB, RATE_INTERVAL, &range);
            problems.extend(unknown_metrics(&prometheus, &expr, &exported).await?);
            let series = match query.instant {
                true => prometheus.query(&expr, end).await,
                false => {
                    prometheus
                        .query_range(&expr, start, end, Duration::from_secs(1))
                        .await
                }
            }
            .with_context(|| format!("panel {:?}: {expr}", panel.title))?;
            if !has_data(&series) {
                problems.push(format!(
                    "panel {:?} query {} has no data: {expr}",
                    panel.title, query.ref_id
                ));
            }
            answers.push((query, series));
        }
        answered.push(Answered { panel, answers });
    }
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap_or_default();
        let expr = alert["expr"].as_str().unwrap_or_default();
        problems.extend(unknown_metrics(&prometheus, expr, &exported).await?);
        prometheus
            .query_range(expr, start, end, Duration::from_secs(1))
            .await
            .with_context(|| format!("alert {name}: {expr}"))?;
    }
    problems.extend(rule_problems(&prometheus).await?);
    // The one-by-one retry spent the write budget at its rate, and never beyond it (rule 5).
    let busiest = prometheus
        .query(
            &format!("max_over_time(rewind_api_tokens_busiest_second{{job=\"{JOB}\",bucket=\"write\"}}[{range}])"),
            end,
        )
        .await?;
    let busiest = busiest
        .first()
        .and_then(|s| s.samples.first())
        .map_or(0.0, |(_, v)| *v);
    if !(f64::from(QPS)..=f64::from(QPS + BURST)).contains(&busiest) {
        problems.push(format!(
            "the busiest second took {busiest} write tokens, not between qps {QPS} and qps + burst {}",
            QPS + BURST
        ));
    }
    if let Ok(png) = std::env::var(PNG) {
        let seconds = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        dashboard_png::draw(
            &PathBuf::from(png),
            "rewind (live retries: 1,500 pods in one DeleteCollection, 240 pods one by one at qps 20, one refused)",
            &answered,
            (seconds(start), seconds(end)),
        )?;
    }
    controller.stop()?;
    if !problems.is_empty() {
        bail!(
            "{}\nexported: {exported:?}\nPrometheus' log:\n{}",
            problems.join("\n"),
            prometheus.log()
        );
    }
    Ok(())
}

/// Waits until Prometheus has scraped `rewind_leader 1`: the controller holds its Lease.
async fn wait_leading(prometheus: &Prometheus) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let leading = prometheus
            .query(
                &format!("rewind_leader{{job=\"{JOB}\"}} == 1"),
                SystemTime::now(),
            )
            .await?;
        if !leading.is_empty() {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "Prometheus scraped no leading controller within 30 s:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether any series has a sample that is a number.
fn has_data(series: &[Series]) -> bool {
    series
        .iter()
        .any(|s| s.samples.iter().any(|(_, v)| v.is_finite()))
}

/// The metrics `expr` names that the controller never exported.
async fn unknown_metrics(
    prometheus: &Prometheus,
    expr: &str,
    exported: &BTreeSet<String>,
) -> anyhow::Result<Vec<String>> {
    let named = prometheus.selected_metrics(expr).await?;
    Ok(named
        .difference(exported)
        .map(|m| format!("{m} (in {expr}) is not a metric the controller exports"))
        .collect())
}

/// Rules Prometheus could not evaluate, or that never ran, and alerts not inactive.
async fn rule_problems(prometheus: &Prometheus) -> anyhow::Result<Vec<String>> {
    let groups = prometheus.rules().await?;
    let mut problems = Vec::new();
    let mut seen = 0;
    for rule in groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
    {
        seen += 1;
        let name = rule["name"].as_str().unwrap_or_default();
        if rule["health"] != "ok" {
            problems.push(format!(
                "rule {name} is {}: {}",
                rule["health"], rule["lastError"]
            ));
        }
        if rule["state"] != "inactive" {
            problems.push(format!(
                "alert {name} is {} after a healthy run: {}",
                rule["state"], rule["alerts"]
            ));
        }
    }
    if seen != alerts().len() {
        problems.push(format!(
            "Prometheus loaded {seen} rules, the file has {}",
            alerts().len()
        ));
    }
    Ok(problems)
}
