//! Argo's database (PostgreSQL, and MariaDB once) restarted under an archived retry: stopped while the retry
//! deletes its leftover pods, which need no database, and started again on the same port and
//! data a few seconds later. The reset nodes are offloaded (ALWAYS_OFFLOAD_NODE_STATUS), so the
//! retry needs the database again after the deletes: it reports that it waits for the
//! database (Pending, never Failed), then finishes, creating the workflow exactly once, with
//! the offloaded rows Argo's own code reads back. And a database down before the request is
//! read: the request waits the same way and finishes once the database is back.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use rewind::argo::db::{ArgoDatabase, Sql};
use rewind::argo::workflow::Workflow;
use rewind::protocol::crd::WorkflowRetry;
use rewind::protocol::request::RetryPhase;
use rewind::testenv::db::{DbServer, Kind};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use rewind::testenv::workload::FailedDag;
use serde_json::json;

use crate::support::archived::{Archive, Archived};
use crate::support::argodb::{self, argo, argo_db};
use crate::support::argos_retry::ensure_what_argo_creates;
use crate::support::controller as ctl;
use crate::support::workflowretry::{archived, phase_and_message, wait_finished};

const REQUEST: &str = "retry-archived";
const WAIT: Duration = Duration::from_secs(60);
/// How long the database stays down once the request says it waits for it.
const DOWN: Duration = Duration::from_secs(3);

pub async fn an_archived_retry_survives_a_database_restart_during_its_deletes(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    restart_during_deletes(Kind::Postgres, cluster, namespace).await
}

pub async fn an_archived_retry_survives_a_mariadb_restart_during_its_deletes(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    restart_during_deletes(Kind::MariaDb, cluster, namespace).await
}

/// The database stopped while the retry deletes its leftovers (slowed to 10 writes/s), started
/// again once the request reports that it waits for the database.
async fn restart_during_deletes(
    kind: Kind,
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let mut db = argo_db(kind).await?;
    let wf = prepare(&cluster, &namespace, &db, 40).await?;
    let retries: Api<WorkflowRetry> = Api::namespaced(cluster.admin_client(), &namespace);
    let controller = start(&cluster, &namespace, &db).await?;
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    retries
        .create(&PostParams::default(), &archived(REQUEST, &wf.uid))
        .await?;

    // Stop the database once the deletes have begun.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let status = retries.get(REQUEST).await?.status.unwrap_or_default();
        if status.pods_deleted > 0 {
            ensure!(
                status.pods_deleted < status.pods_total,
                "the deletes ended before the database could be stopped: {status:?}"
            );
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no pod deleted within {WAIT:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let down = halt(&mut db);
    let waiting = wait_for_database_message(&retries).await?;
    tokio::time::sleep(DOWN).await;
    let during = retries.get(REQUEST).await?;
    db.start_again().await?;
    let down_for = down.elapsed();

    let finished = wait_finished(&retries, REQUEST).await?;
    controller.stop().await?;
    let pods_deleted_when_down = during.status.clone().unwrap_or_default().pods_deleted;
    tracing::info!(
        down_seconds = down_for.as_secs_f64(),
        message = waiting,
        pods_deleted_when_down,
        "database restarted"
    );
    ensure!(
        phase_and_message(&during).0 == Some(RetryPhase::Pending),
        "while the database was down the request should be Pending: {:?}",
        phase_and_message(&during)
    );
    ensure_created_once(&wf, &cluster, &namespace, &db, &finished, from).await?;
    db.stop();
    Ok(())
}

/// PostgreSQL down before the request arrives: the request waits, saying so, and finishes
/// once the database is back.
pub async fn an_archived_retry_waits_for_a_database_down_at_its_start(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let mut db = argo_db(Kind::Postgres).await?;
    let wf = prepare(&cluster, &namespace, &db, 10).await?;
    let retries: Api<WorkflowRetry> = Api::namespaced(cluster.admin_client(), &namespace);
    let controller = start(&cluster, &namespace, &db).await?;
    let down = halt(&mut db);
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    retries
        .create(&PostParams::default(), &archived(REQUEST, &wf.uid))
        .await?;
    let waiting = wait_for_database_message(&retries).await?;
    tokio::time::sleep(DOWN).await;
    let during = retries.get(REQUEST).await?;
    db.start_again().await?;
    let down_for = down.elapsed();
    let finished = wait_finished(&retries, REQUEST).await?;
    controller.stop().await?;
    tracing::info!(
        down_seconds = down_for.as_secs_f64(),
        message = waiting,
        "database was down at the start"
    );
    let status = during.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Pending) && status.pods_deleted == 0,
        "while the database was down the request should be Pending with nothing deleted: {status:?}"
    );
    ensure_created_once(&wf, &cluster, &namespace, &db, &finished, from).await?;
    db.stop();
    Ok(())
}

/// Stops the database; when it stopped.
fn halt(db: &mut DbServer) -> tokio::time::Instant {
    db.halt();
    tracing::info!(port = db.port(), "database stopped");
    tokio::time::Instant::now()
}

/// A controller serving archived retries from `db`, offloading the reset nodes, deleting
/// 10 pods a second (each held pod is two writes: release, delete).
async fn start(
    cluster: &LocalCluster,
    namespace: &str,
    db: &DbServer,
) -> anyhow::Result<ctl::Running> {
    let mut persistence = db.persistence();
    persistence.connect_timeout = Duration::from_secs(1);
    let database: Arc<dyn ArgoDatabase> = Arc::new(Sql::connect(&persistence).await?);
    let mut options = ctl::options(10, 10, false);
    options.retry.always_offload_node_status = true;
    ctl::start_with_archive(cluster, namespace, options, Some(database)).await
}

/// Waits until the request says it waits for Argo's database; its message.
async fn wait_for_database_message(retries: &Api<WorkflowRetry>) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let object = retries.get(REQUEST).await?;
        let (phase, message) = phase_and_message(&object);
        ensure!(
            phase != Some(RetryPhase::Failed) && phase != Some(RetryPhase::Succeeded),
            "the request ended while the database was down: {phase:?} {message:?}"
        );
        // Reading the archived row and offloading the reset nodes say so alike.
        if message.contains("the database may be down") && message.contains("will try again") {
            return Ok(message);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the request should say it waits for the database; it says {phase:?} {message:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A failed workflow `wf` of `failed` failed and 3 succeeded pods, archived in `db`.
async fn prepare(
    cluster: &LocalCluster,
    namespace: &str,
    db: &DbServer,
    failed: usize,
) -> anyhow::Result<Archived> {
    let dag = FailedDag {
        name: "wf".into(),
        failed,
        succeeded: 3,
    };
    Archived::create(cluster, namespace, dag, Archive::Argo(db)).await
}

/// The request Succeeded; every plan pod is gone and the others stay; the audit log has
/// exactly one create of the workflow; its nodes are offloaded under the new UID, and
/// with the nodes Argo's own code reads back it is what Argo's retry creates.
async fn ensure_created_once(
    wf: &Archived,
    cluster: &LocalCluster,
    namespace: &str,
    db: &DbServer,
    finished: &WorkflowRetry,
    from: Timestamp,
) -> anyhow::Result<()> {
    let (phase, message) = phase_and_message(finished);
    ensure!(
        phase == Some(RetryPhase::Succeeded),
        "the archived retry should succeed: {phase:?} {message}"
    );
    let admin = cluster.admin_client();
    wf.ensure_only_leftovers_deleted(&Api::namespaced(admin.clone(), namespace))
        .await?;
    let creates: Vec<u16> = ctl::audit_log(cluster, namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "create"
                && a.resource == "workflows"
                && !a.dry_run
        })
        .map(|a| a.code)
        .collect();
    ensure!(
        creates == [201],
        "expected exactly one create of workflow {} (201), the audit log has {creates:?}",
        wf.name
    );
    let workflows: Api<Workflow> = Api::namespaced(admin, namespace);
    let after = workflows.get(&wf.name).await?;
    let new_uid = after.uid().context("a workflow has a UID")?;
    ensure!(new_uid != wf.uid, "a new workflow was expected");
    let version = after
        .status
        .offload_node_status_version
        .clone()
        .context("the created workflow's nodes should be offloaded")?;
    ensure!(
        after.status.nodes.is_none() && after.status.compressed_nodes.is_none(),
        "offloaded nodes are not kept in the workflow too"
    );
    let argos_read = argo(argodb::request(
        db,
        "get",
        json!({"uid": new_uid, "version": version}),
    ))
    .await
    .context("Argo reading the offloaded nodes under the new UID")?;
    let mut hydrated = after.clone();
    hydrated.status.nodes = Some(serde_json::from_str(&argos_read.json)?);
    hydrated.status.offload_node_status_version = None;
    ensure_what_argo_creates(&hydrated, &wf.row, from).await
}
