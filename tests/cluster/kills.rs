//! Rule 4 under SIGKILL at random moments, small: the `faults` benchmark's trials
//! (`rewind::testenv::trials`) with a few hundred pods. A retry without a kill measures the
//! span; each trial kills the real binary at a moment drawn uniformly from it (the seed is
//! logged; REWIND_TRIALS_SEED replays it), restarts it and checks exactly one reset or create,
//! the planner's workflow, every plan pod gone and every other pod kept.

use std::sync::Arc;

use anyhow::ensure;
use rewind::testenv::db::Kind;
use rewind::testenv::db::argodb::{ArgoDbTool, ArgoLine};
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::trials::{Bench, Target, kill_moment};

use crate::support::argodb::argo_db;

pub async fn a_live_retry_killed_at_random_moments_resets_once_as_planned(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let bench = Bench {
        cluster: &cluster,
        binary: env!("CARGO_BIN_EXE_rewind").into(),
        controller_args: Vec::new(),
        failed: 300,
        succeeded: 20,
        target: Target::Live,
        archive: None,
        // The workflow is never deleted: its pods need no finalizer.
        garbage_collected: true,
        logs: tempfile::tempdir()?.keep(),
    };
    trials(&bench, &namespace, 3).await
}

pub async fn an_archived_retry_killed_at_random_moments_creates_once_as_planned(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let db = argo_db(Kind::Postgres).await?;
    let argo = tokio::task::spawn_blocking(|| ArgoDbTool::locate(ArgoLine::V4)).await??;
    let bench = Bench {
        cluster: &cluster,
        binary: env!("CARGO_BIN_EXE_rewind").into(),
        // Held by Argo's finalizer (the shared control plane collects garbage), every plan pod
        // costs a release as well as a delete.
        controller_args: ["--qps", "100", "--burst", "100"].map(String::from).into(),
        failed: 100,
        succeeded: 10,
        target: Target::Archived,
        archive: Some((&db, argo)),
        garbage_collected: true,
        logs: tempfile::tempdir()?.keep(),
    };
    let result = trials(&bench, &namespace, 2).await;
    db.stop();
    result
}

/// A retry without a kill, then `n` killed ones, each in a namespace of its own.
async fn trials(bench: &Bench<'_>, namespace: &str, n: u64) -> anyhow::Result<()> {
    let prefix = namespace[..namespace.len().min(56)].trim_end_matches('-');
    let calibration = bench.trial(&format!("{prefix}-0"), None).await?;
    ensure!(
        calibration.passed(),
        "the retry without a kill failed (logs in {}): {:?}",
        bench.logs.display(),
        calibration.failures
    );
    let seed = match std::env::var("REWIND_TRIALS_SEED") {
        Ok(s) => s.parse()?,
        Err(_) => fastrand::u64(..1_000_000_000),
    };
    tracing::info!(
        seed,
        span = ?calibration.total,
        logs = %bench.logs.display(),
        "kill trials (REWIND_TRIALS_SEED={seed} replays them)"
    );
    for i in 1..=n {
        let at = kill_moment(seed.wrapping_add(i), calibration.total);
        let o = bench.trial(&format!("{prefix}-{i}"), Some(at)).await?;
        tracing::info!(
            trial = i,
            kill_at = ?at,
            phase_at_kill = ?o.phase_at_kill,
            gone_at_kill = o.gone_at_kill,
            planned = o.planned,
            total = ?o.total,
            resets = o.resets,
            "trial done"
        );
        ensure!(
            o.passed(),
            "trial {i} (seed {seed}, killed at {at:?}, phase {:?}, {} of {} plan pods gone) failed: {:?}; logs in {}",
            o.phase_at_kill,
            o.gone_at_kill,
            o.planned,
            o.failures,
            bench.logs.display()
        );
    }
    Ok(())
}
