//! The randomized trials of the `faults` benchmark (`rewind::testenv::mixed`), one small one
//! on every test run: a live and an archived workflow asked for at random through the
//! annotation, WorkflowRetries and Argo's retry API, two replicas behind the fault proxy,
//! random faults and SIGKILLs of the leader, then every invariant checked. The seed is
//! logged; REWIND_MIXED_SEED replays it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use rewind::testenv::db::Kind;
use rewind::testenv::db::argodb::{ArgoDbTool, ArgoLine};
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::mixed::Mixed;
use rewind::testenv::trials::{Bench, Target};

use crate::support::argodb::argo_db;

pub async fn randomized_requests_faults_and_kills_keep_every_invariant(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let db = argo_db(Kind::Postgres).await?;
    let argo = tokio::task::spawn_blocking(|| ArgoDbTool::locate(ArgoLine::V4)).await??;
    let mixed = Mixed {
        bench: Bench {
            cluster: &cluster,
            binary: env!("CARGO_BIN_EXE_rewind").into(),
            controller_args: Vec::new(),
            failed: 60,
            succeeded: 6,
            target: Target::Live,
            archive: Some((&db, argo)),
            // The shared control plane collects garbage: the archived workflow's pods are
            // held by Argo's finalizer when it is deleted.
            garbage_collected: true,
            logs: tempfile::tempdir()?.keep(),
        },
        span: Duration::from_secs(8),
        lease: Duration::from_secs(6),
    };
    let seed = match std::env::var("REWIND_MIXED_SEED") {
        Ok(s) => s.parse()?,
        Err(_) => fastrand::u64(..1_000_000_000),
    };
    let prefix = namespace[..namespace.len().min(56)].trim_end_matches('-');
    let result = mixed.trial(&format!("{prefix}-1"), seed).await;
    let logs = mixed.bench.logs.clone();
    db.stop();
    let o = result?;
    tracing::info!(
        seed,
        script = o.script.describe(),
        requests = ?o.requests,
        calls = ?o.calls,
        resets = ?o.resets,
        settled_after = ?o.settled_after,
        "randomized trial done (REWIND_MIXED_SEED={seed} replays it)"
    );
    ensure!(
        o.passed(),
        "the randomized trial (REWIND_MIXED_SEED={seed}: {}) failed: {:?}; logs in {}",
        o.script.describe(),
        o.failures,
        logs.display()
    );
    Ok(())
}
