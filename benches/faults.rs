//! Crash trials at scale, a benchmark rather than a test: the real `rewind controller` binary
//! retries a workflow of `--pods` failed pods (plus succeeded ones and an outsider that must
//! stay), is killed with SIGKILL at a moment drawn uniformly over the retry's expected
//! duration, is started again, and the end is checked (`rewind::testenv::trials`): exactly one
//! reset (or create), the planner's workflow, every plan pod gone, every other pod kept.
//!
//!     cargo bench --features testenv --bench faults -- --trials 20 --pods 8000 [--archived]
//!
//! Options: --trials N (20), --pods N (8000), --succeeded N (200), --archived (Argo's
//! ArchiveWorkflow on PostgreSQL, the workflow deleted, retried through a WorkflowRetry),
//! --seed S (random; trial i uses S+i, and `--seed S+i --trials 1 --expected E` replays it),
//! --expected SECONDS (the span kills are drawn from; by default one retry without a kill
//! measures it first), and the controller's --qps, --burst and --no-bulk.
//! Every trial runs in a fresh namespace of one control plane; the controller's logs stay in
//! the directory printed first. Exits non-zero if any check of any trial failed.
//!
//! With --mixed, randomized trials instead (`rewind::testenv::mixed`): in each, a live and an
//! archived workflow of `--pods` failed pods, asked for at random through the annotation,
//! WorkflowRetries and Argo's retry API (some twice), two replicas electing a leader behind
//! the fault proxy, random faults of every kind and SIGKILLs of the leader, over --span
//! SECONDS (8); --lease SECONDS (6) is the replicas' Lease duration.
//!
//!     cargo bench --features testenv --bench faults -- --mixed --trials 50 --pods 1000

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rewind::testenv::bench::cli;
use rewind::testenv::db::DbServer;
use rewind::testenv::db::argodb::{ArgoDbTool, ArgoLine};
use rewind::testenv::localcluster::{LocalCluster, Options};
use rewind::testenv::mixed::{Disturbance, FaultKind, Mixed};
use rewind::testenv::trials::{Bench, Outcome, Target, kill_moment};

/// Crash trials: the controller killed at a random moment of a large retry, restarted,
/// the end checked.
#[derive(clap::Parser)]
struct Args {
    /// Trials, each in a fresh namespace.
    #[arg(long, default_value = "20")]
    trials: usize,
    /// Failed pods of the workflow retried.
    #[arg(long, default_value = "8000")]
    pods: usize,
    /// Succeeded pods beside them, which must stay.
    #[arg(long, default_value = "200")]
    succeeded: usize,
    /// Retry an archived workflow (Argo's archive on PostgreSQL) through a WorkflowRetry.
    #[arg(long)]
    archived: bool,
    /// Trial i uses SEED+i (random by default); `--seed S+i --trials 1 --expected E` replays it.
    #[arg(long, default_value_t = fastrand::u64(..1_000_000_000), hide_default_value = true)]
    seed: u64,
    /// The span kills are drawn from; by default one retry without a kill measures it first.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    expected: Option<Duration>,
    /// The controller's --qps.
    #[arg(long)]
    qps: Option<String>,
    /// The controller's --burst.
    #[arg(long)]
    burst: Option<String>,
    /// The controller's --no-bulk.
    #[arg(long)]
    no_bulk: bool,
    /// Randomized trials: overlapping requests of every kind, random faults and kills.
    #[arg(long)]
    mixed: bool,
    /// The span a randomized trial's requests, faults and kills are drawn over.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "8")]
    span: Duration,
    /// The Lease duration of a randomized trial's two replicas.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "6")]
    lease: Duration,
}

impl Args {
    /// The flags passed on to the controller.
    fn controller_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (flag, value) in [("--qps", &self.qps), ("--burst", &self.burst)] {
            if let Some(v) = value {
                args.extend([flag.to_owned(), v.clone()]);
            }
        }
        if self.no_bulk {
            args.push("--no-bulk".into());
        }
        args
    }
}

/// `--expected`: seconds, fractions allowed.
fn seconds(s: &str) -> Result<Duration, String> {
    let seconds: f64 = s.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{e}"))
}

fn line(label: &str, o: &Outcome) -> String {
    let kill = match o.kill_at {
        Some(at) => format!(
            "kill at {:6.2}s, phase {:12}, plan pods gone {:>5}/{}",
            at.as_secs_f64(),
            o.phase_at_kill
                .map_or_else(|| "(none)".to_owned(), |p| format!("{p:?}")),
            o.gone_at_kill,
            o.planned
        ),
        None => format!("no kill{:>48}", format!("{} plan pods", o.planned)),
    };
    let checks = if o.passed() {
        "ok".to_owned()
    } else {
        format!("FAILED: {}", o.failures.join("; "))
    };
    format!(
        "{label}: {kill}; total {:6.2}s; resets {}; {checks}",
        o.total.as_secs_f64(),
        o.resets
    )
}

async fn bench(args: Args) -> anyhow::Result<bool> {
    let cluster = LocalCluster::start(Options {
        audit: true,
        ..Options::default()
    })
    .await
    .context("starting a local control plane")?;
    let result = match args.mixed {
        true => mixed(&cluster, &args).await,
        false => trials(&cluster, &args).await,
    };
    cluster.stop().await?;
    result
}

/// PostgreSQL with Argo's tables, migrated by Argo's code.
async fn archive() -> anyhow::Result<(DbServer, ArgoDbTool)> {
    let db = DbServer::postgres().await?;
    let argo = tokio::task::spawn_blocking(|| ArgoDbTool::locate(ArgoLine::V4)).await??;
    let schema = db.argodb_request("migrate", serde_json::json!({}));
    let code = argo.clone();
    tokio::task::spawn_blocking(move || code.one(schema)).await??;
    Ok((db, argo))
}

async fn mixed(cluster: &LocalCluster, args: &Args) -> anyhow::Result<bool> {
    let (db, argo) = archive().await?;
    let logs = std::env::temp_dir().join(format!("rewind-mixed-{}", args.seed));
    std::fs::create_dir_all(&logs)?;
    let mixed = Mixed {
        bench: Bench {
            cluster,
            binary: env!("CARGO_BIN_EXE_rewind").into(),
            controller_args: args.controller_args(),
            failed: args.pods,
            succeeded: args.succeeded,
            target: Target::Live,
            archive: Some((&db, argo)),
            garbage_collected: false,
            logs: logs.clone(),
        },
        span: args.span,
        lease: args.lease,
    };
    println!(
        "{} randomized trials, a live and an archived workflow of {} failed pods (+{} succeeded, 1 outsider) each, two replicas (Lease {:.0}s), span {:.1}s, controller flags {:?}; seed {}; logs in {}",
        args.trials,
        args.pods,
        args.succeeded,
        args.lease.as_secs_f64(),
        args.span.as_secs_f64(),
        args.controller_args(),
        args.seed,
        logs.display()
    );
    let (mut passed, mut errors, mut kills) = (0, 0, 0);
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    let mut phases = std::collections::BTreeMap::<String, usize>::new();
    let mut settled = Vec::new();
    for i in 0..args.trials {
        let seed = args.seed.wrapping_add(i as u64);
        let label = format!("trial {:2} (seed {seed})", i + 1);
        match mixed.trial(&format!("mixed-{i}"), seed).await {
            Ok(o) => {
                for d in &o.script.disturbances {
                    if let Disturbance::Fault { kind, .. } = d {
                        *kinds.entry(kind.name()).or_default() += 1;
                    }
                }
                kills += o.script.kills();
                for (_, phase, _) in &o.requests {
                    *phases.entry(format!("{phase:?}")).or_default() += 1;
                }
                if let Some(s) = o.settled_after {
                    settled.push(s.as_secs_f64());
                }
                let verdict = match o.passed() {
                    true => "ok".to_owned(),
                    false => format!("FAILED: {}", o.failures.join("; ")),
                };
                passed += usize::from(o.passed());
                println!(
                    "{label}: {}\n    {} requests, calls answered {:?}, resets {}/{}, all ended {} after the last disturbance; {verdict}",
                    o.script.describe(),
                    o.requests.len(),
                    o.calls,
                    o.resets.0,
                    o.resets.1,
                    o.settled_after.map_or_else(
                        || "never".to_owned(),
                        |s| format!("{:.2}s", s.as_secs_f64())
                    )
                );
            }
            Err(e) => {
                println!("{label}: ERROR: {e}");
                errors += 1;
            }
        }
    }
    db.stop();
    settled.sort_by(f64::total_cmp);
    let missing: Vec<&str> = FaultKind::NAMES
        .iter()
        .copied()
        .filter(|k| !kinds.contains_key(k))
        .collect();
    println!(
        "\nsummary: {passed}/{} trials passed every check ({errors} could not run); faults {kinds:?} (kinds never drawn: {missing:?}); {kills} SIGKILLs of the leader; request ends {phases:?}; all ended after the last disturbance: median {:.2}s, max {:.2}s",
        args.trials,
        settled.get(settled.len() / 2).copied().unwrap_or(f64::NAN),
        settled.last().copied().unwrap_or(f64::NAN),
    );
    Ok(passed == args.trials)
}

async fn trials(cluster: &LocalCluster, args: &Args) -> anyhow::Result<bool> {
    let db = match args.archived {
        true => Some(archive().await?),
        false => None,
    };
    let logs = std::env::temp_dir().join(format!("rewind-faults-{}", args.seed));
    std::fs::create_dir_all(&logs)?;
    let bench = Bench {
        cluster,
        binary: env!("CARGO_BIN_EXE_rewind").into(),
        controller_args: args.controller_args(),
        failed: args.pods,
        succeeded: args.succeeded,
        target: match args.archived {
            true => Target::Archived,
            false => Target::Live,
        },
        archive: db.as_ref().map(|(db, argo)| (db, argo.clone())),
        garbage_collected: false,
        logs: logs.clone(),
    };
    println!(
        "{} trials, {} failed pods (+{} succeeded, 1 outsider), {} retry, controller flags {:?}; seed {}; logs in {}",
        args.trials,
        args.pods,
        args.succeeded,
        match args.archived {
            true => "archived",
            false => "live",
        },
        args.controller_args(),
        args.seed,
        logs.display()
    );
    let expected = match args.expected {
        Some(e) => e,
        None => {
            let o = bench.trial("calibrate", None).await?;
            println!("{}", line("calibration (no kill)", &o));
            ensure!(o.passed(), "the retry without a kill failed its checks");
            o.total
        }
    };
    println!(
        "kills drawn uniformly over [0, {:.2}s)",
        expected.as_secs_f64()
    );
    let mut outcomes = Vec::new();
    let mut errors = 0;
    for i in 0..args.trials {
        let seed = args.seed.wrapping_add(i as u64);
        let label = format!("trial {:2} (seed {seed})", i + 1);
        match bench
            .trial(&format!("trial-{i}"), Some(kill_moment(seed, expected)))
            .await
        {
            Ok(o) => {
                println!("{}", line(&label, &o));
                outcomes.push(o);
            }
            Err(e) => {
                println!("{label}: ERROR: {e}");
                errors += 1;
            }
        }
    }
    if let Some((db, _)) = db {
        db.stop();
    }

    let passed = outcomes.iter().filter(|o| o.passed()).count();
    let mut phases = std::collections::BTreeMap::new();
    for o in &outcomes {
        *phases
            .entry(
                o.phase_at_kill
                    .map_or_else(|| "(none)".to_owned(), |p| format!("{p:?}")),
            )
            .or_insert(0) += 1;
    }
    let mut totals: Vec<f64> = outcomes.iter().map(|o| o.total.as_secs_f64()).collect();
    totals.sort_by(f64::total_cmp);
    let mid_delete = outcomes
        .iter()
        .filter(|o| o.gone_at_kill > 0 && o.gone_at_kill < o.planned)
        .count();
    println!(
        "\nsummary: {passed}/{} trials passed every check ({errors} could not run); phase at kill {phases:?}; {mid_delete} kills with some but not all plan pods gone; total time min {:.2}s median {:.2}s max {:.2}s (without a kill {:.2}s)",
        args.trials,
        totals.first().copied().unwrap_or(f64::NAN),
        totals.get(totals.len() / 2).copied().unwrap_or(f64::NAN),
        totals.last().copied().unwrap_or(f64::NAN),
        expected.as_secs_f64()
    );
    Ok(passed == args.trials)
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let Some((args, _)) = cli::parse::<Args>("faults") else {
        println!(
            "faults is a benchmark: cargo bench --features testenv --bench faults -- --trials 20 --pods 8000"
        );
        return Ok(std::process::ExitCode::SUCCESS);
    };
    cli::init_logging();
    let passed = tokio::runtime::Runtime::new()?.block_on(bench(args))?;
    Ok(match passed {
        true => std::process::ExitCode::SUCCESS,
        false => std::process::ExitCode::FAILURE,
    })
}
