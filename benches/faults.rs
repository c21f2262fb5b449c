//! Crash trials at scale, a benchmark rather than a test: the real `rewind controller` binary
//! retries a workflow of `--pods` failed pods (plus succeeded ones and an outsider that must
//! stay), is killed with SIGKILL at a moment drawn uniformly over the retry's expected
//! duration, is started again, and the end is checked (`rewind::testenv::trials`): exactly one
//! reset (or create), the planner's workflow, every plan pod gone, every other pod kept.
//!
//!     cargo bench --bench faults -- --trials 20 --pods 8000 [--archived]
//!
//! Options: --trials N (20), --pods N (8000), --succeeded N (200), --archived (Argo's
//! ArchiveWorkflow on PostgreSQL, the workflow deleted, retried through a WorkflowRetry),
//! --seed S (random; trial i uses S+i, and `--seed S+i --trials 1 --expected E` replays it),
//! --expected SECONDS (the span kills are drawn from; by default one retry without a kill
//! measures it first), and the controller's --qps, --burst and --no-bulk.
//! Every trial runs in a fresh namespace of one control plane; the controller's logs stay in
//! the directory printed first. Exits non-zero if any check of any trial failed.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rewind::testenv::db::DbServer;
use rewind::testenv::db::argodb::{ArgoDb, ArgoLine};
use rewind::testenv::localcluster::{LocalCluster, Options};
use rewind::testenv::trials::{Bench, Outcome, Target, kill_moment};

struct Args {
    trials: usize,
    pods: usize,
    succeeded: usize,
    archived: bool,
    seed: u64,
    expected: Option<Duration>,
    controller_args: Vec<String>,
}

fn parse() -> anyhow::Result<Option<Args>> {
    let mut args = Args {
        trials: 20,
        pods: 8000,
        succeeded: 200,
        archived: false,
        seed: fastrand::u64(..1_000_000_000),
        expected: None,
        controller_args: Vec::new(),
    };
    let mut benching = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            // cargo bench passes --bench; cargo test (--all-targets) does not: then only say how.
            "--bench" => benching = true,
            "--trials" => args.trials = value()?.parse()?,
            "--pods" => args.pods = value()?.parse()?,
            "--succeeded" => args.succeeded = value()?.parse()?,
            "--archived" => args.archived = true,
            "--seed" => args.seed = value()?.parse()?,
            "--expected" => args.expected = Some(Duration::from_secs_f64(value()?.parse()?)),
            "--qps" | "--burst" => {
                let v = value()?;
                args.controller_args.extend([flag.clone(), v]);
            }
            "--no-bulk" => args.controller_args.push(flag),
            other => anyhow::bail!("unknown option {other}"),
        }
    }
    Ok(benching.then_some(args))
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
    let result = trials(&cluster, &args).await;
    cluster.stop().await?;
    result
}

async fn trials(cluster: &LocalCluster, args: &Args) -> anyhow::Result<bool> {
    let db = match args.archived {
        true => {
            let db = DbServer::postgres().await?;
            let argo = tokio::task::spawn_blocking(|| ArgoDb::locate(ArgoLine::V4)).await??;
            let schema = db.argodb_request("migrate", serde_json::json!({}));
            let code = argo.clone();
            tokio::task::spawn_blocking(move || code.one(schema)).await??;
            Some((db, argo))
        }
        false => None,
    };
    let logs = std::env::temp_dir().join(format!("rewind-faults-{}", args.seed));
    std::fs::create_dir_all(&logs)?;
    let bench = Bench {
        cluster,
        binary: env!("CARGO_BIN_EXE_rewind").into(),
        controller_args: args.controller_args.clone(),
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
        args.controller_args,
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
    let Some(args) = parse()? else {
        println!("faults is a benchmark: cargo bench --bench faults -- --trials 20 --pods 8000");
        return Ok(std::process::ExitCode::SUCCESS);
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let passed = tokio::runtime::Runtime::new()?.block_on(bench(args))?;
    Ok(match passed {
        true => std::process::ExitCode::SUCCESS,
        false => std::process::ExitCode::FAILURE,
    })
}
