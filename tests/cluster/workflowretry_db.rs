//! Retries against Argo's real database (PostgreSQL and MariaDB from the system's packages,
//! schema and rows written by Argo's own persist/sqldb code through tools/argodb): an
//! archived retry reads the row Argo archived, a database that is down keeps the request
//! pending with a clear message and nothing deleted, a corrupt archived row fails the request
//! clearly with nothing deleted, and a live workflow whose nodes Argo
//! offloaded is hydrated, reset and offloaded again so that Argo reads back its own result
//! (after a retry refused for a row over --max-nodes-size, with nothing deleted).

use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use rewind::argo::db::{ArgoDatabase, Sql};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::WorkflowRetry;
use rewind::protocol::request::RetryPhase;
use rewind::testenv::db::{DbServer, Kind};
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::FailedDag;
use serde_json::json;

use crate::support::archived::{Archive, Archived};
use crate::support::argodb::{self, argo, argo_db};
use crate::support::argos_retry::ensure_what_argo_creates;
use crate::support::controller as ctl;
use crate::support::workflowretry::{archived, phase_and_message, wait_finished};

const FINISH: Duration = Duration::from_secs(60);

pub async fn an_archived_retry_on_postgresql(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    archived_retry_on(Kind::Postgres, cluster, namespace).await
}

pub async fn an_archived_retry_on_mariadb(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    archived_retry_on(Kind::MariaDb, cluster, namespace).await
}

pub async fn an_offloaded_live_retry_on_postgresql(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    offloaded_live_retry_on(Kind::Postgres, cluster, namespace).await
}

pub async fn an_offloaded_live_retry_on_mariadb(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    offloaded_live_retry_on(Kind::MariaDb, cluster, namespace).await
}

/// Argo archives a failed workflow, which is then deleted while its pods (held by Argo's
/// finalizer) remain. With the database down the request waits, says why, and deletes
/// nothing; with the database up it deletes the plan's leftovers and creates what Argo's own
/// archived retry creates from the row Argo reads back. A row that is valid JSON (the
/// column's type insists) but no workflow fails its request, naming the row, and deletes
/// nothing.
async fn archived_retry_on(
    kind: Kind,
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let db = argo_db(kind).await?;
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 5,
    };
    let Archived {
        name,
        uid,
        row,
        plan,
        ..
    } = Archived::create(&cluster, &namespace, dag, Archive::Argo(&db)).await?;

    // The database is down: a port nobody listens on.
    let mut down = db.persistence();
    down.port = Some(
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port(),
    );
    down.connect_timeout = Duration::from_secs(1);
    let unreachable: Arc<dyn ArgoDatabase> = Arc::new(Sql::connect(&down).await?);
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(unreachable),
    )
    .await?;
    retries
        .create(&PostParams::default(), &archived("retry-archived", &uid))
        .await?;
    let deadline = tokio::time::Instant::now() + FINISH;
    let waiting = loop {
        let object = retries.get("retry-archived").await?;
        let (phase, message) = phase_and_message(&object);
        if message.contains("will try again") {
            break (phase, message);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the request should report the database as down; it says {phase:?} {message:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        waiting.0 == Some(RetryPhase::Pending) && waiting.1.contains(&uid),
        "expected Pending with a message naming the archived workflow: {waiting:?}"
    );
    ctl::wait_event(&cluster, &namespace, "retry-archived", "RetryError").await?;
    controller.stop().await?;
    for pod in &plan.pods_to_delete {
        ensure!(
            pods.get_opt(pod).await?.is_some_and(|p| p
                .finalizers()
                .contains(&labels::POD_STATUS_FINALIZER.to_string())),
            "pod {pod} was touched while the database was down"
        );
    }

    // The database is up: the next controller finishes the request.
    let database: Arc<dyn ArgoDatabase> = Arc::new(Sql::connect(&db.persistence()).await?);
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(database),
    )
    .await?;
    let finished = wait_finished(&retries, "retry-archived").await?;
    let (phase, message) = phase_and_message(&finished);
    ensure!(
        phase == Some(RetryPhase::Succeeded),
        "the archived retry should succeed: {message}"
    );
    let timings = finished
        .status
        .as_ref()
        .and_then(|s| s.timings)
        .unwrap_or_default();
    ensure!(
        [
            timings.read_seconds,
            timings.plan_seconds,
            timings.delete_seconds,
            timings.create_seconds
        ]
        .iter()
        .all(|t| t.is_some_and(|t| t >= 0.0)),
        "every step's time should be in the status: {timings:?}"
    );
    let corrupt =
        a_corrupt_row_fails_clearly(&cluster, &db, &workflows, &pods, &retries, &namespace).await;
    controller.stop().await?;
    corrupt?;
    for pod in &plan.pods_to_delete {
        ensure!(
            pods.get_opt(pod).await?.is_none(),
            "plan pod {pod} was left behind"
        );
    }
    let after = workflows.get(&name).await?;
    ensure!(
        after.uid().as_deref() != Some(uid.as_str()),
        "a new workflow was expected"
    );
    ensure_what_argo_creates(&after, &row, from).await?;
    db.stop();
    Ok(())
}

/// With a controller running on `db`: a workflow Argo archived, whose row then holds valid
/// JSON that is no workflow, is deleted live; its retry fails saying the row is not a valid
/// workflow, and its leftover pods are untouched.
async fn a_corrupt_row_fails_clearly(
    cluster: &LocalCluster,
    db: &DbServer,
    workflows: &Api<Workflow>,
    pods: &Api<Pod>,
    retries: &Api<WorkflowRetry>,
    namespace: &str,
) -> anyhow::Result<()> {
    let dag = FailedDag {
        name: "wf-corrupt".into(),
        failed: 4,
        succeeded: 1,
    };
    let Archived { name, uid, .. } =
        Archived::create(cluster, namespace, dag, Archive::Argo(db)).await?;
    // A name must be a string: valid JSON, no workflow.
    let corrupted = db
        .execute(&format!(
            r#"UPDATE argo_archived_workflows SET workflow = '{{"metadata": {{"name": 7}}}}' WHERE uid = '{uid}'"#
        ))
        .await?;
    ensure!(
        corrupted == 1,
        "expected to corrupt one row, changed {corrupted}"
    );
    let selector = format!("{}={}", labels::WORKFLOW, name);
    let before = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;

    retries
        .create(&PostParams::default(), &archived("retry-corrupt", &uid))
        .await?;
    let finished = wait_finished(retries, "retry-corrupt").await?;
    let (phase, message) = phase_and_message(&finished);
    ensure!(
        phase == Some(RetryPhase::Failed)
            && message.contains(&uid)
            && message.contains("argo_archived_workflows")
            && message.contains("not a valid workflow"),
        "expected Failed naming the corrupt row of {uid}, got {phase:?} {message:?}"
    );
    // The garbage collector marks the orphans deleted; Argo's finalizer holds them until a
    // retry releases it, which this one must not.
    let after = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let held = |p: &Pod| {
        p.finalizers()
            .contains(&labels::POD_STATUS_FINALIZER.to_string())
    };
    ensure!(
        after.len() == before.len() && after.iter().all(held),
        "pods were released or deleted for a corrupt row: {} before, {} after, {} still held",
        before.len(),
        after.len(),
        after.iter().filter(|p| held(p)).count()
    );
    ensure!(
        workflows.get_opt(&name).await?.is_none(),
        "a workflow was created from a corrupt row"
    );
    Ok(())
}

/// A live workflow whose nodes Argo offloaded: the retry reads them from Argo's table, resets
/// the workflow, and (ALWAYS_OFFLOAD_NODE_STATUS) offloads the reset nodes; Argo's own code
/// reads them back, and the workflow with them is what Argo's own retry makes.
async fn offloaded_live_retry_on(
    kind: Kind,
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let db = argo_db(kind).await?;
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 10,
        succeeded: 3,
    };
    let created = dag.create(&admin, &namespace, 16, || ()).await?;
    let uid = created.uid().context("a created workflow has a UID")?;
    let nodes = serde_json::to_value(&created.status.nodes)?;
    let version = argo(argodb::request(
        &db,
        "save",
        json!({"uid": uid, "namespace": namespace, "nodes": nodes}),
    ))
    .await?
    .version;
    let mut offloaded = created.clone();
    offloaded.status.nodes = None;
    offloaded.status.offload_node_status_version = Some(version.clone());
    workflows
        .replace(&dag.name, &PostParams::default(), &offloaded)
        .await?;

    // A row over --max-nodes-size is neither read nor parsed: the retry fails naming its size,
    // and no pod is touched.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let selector = ListParams::default().labels(&format!("{}={}", labels::WORKFLOW, dag.name));
    let pods_before = pods.list(&selector).await?.items.len();
    let small: Arc<dyn ArgoDatabase> = Arc::new(
        Sql::connect(&db.persistence())
            .await?
            .with_max_row_size(100),
    );
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(small),
    )
    .await?;
    ctl::request_retry(&cluster, &namespace, &dag.name, "too-large").await?;
    let (_, refused) = ctl::wait_finished(&workflows, &dag.name, "too-large", FINISH).await?;
    controller.stop().await?;
    ensure!(
        refused.phase == RetryPhase::Failed
            && refused
                .message
                .contains(&format!("offloaded nodes of workflow {uid}"))
            && refused.message.contains("bytes of JSON")
            && refused.message.contains("--max-nodes-size"),
        "expected Failed naming the row's size and --max-nodes-size: {refused:?}"
    );
    let pods_after = pods.list(&selector).await?.items.len();
    ensure!(
        pods_after == pods_before,
        "a refused retry deleted pods: {pods_before} before, {pods_after} after"
    );

    let before = workflows.get(&dag.name).await?;
    let mut hydrated = before.clone();
    hydrated.status.nodes = created.status.nodes.clone();
    hydrated.status.offload_node_status_version = None;

    let database: Arc<dyn ArgoDatabase> = Arc::new(Sql::connect(&db.persistence()).await?);
    let mut options = ctl::options(50, 50, true);
    options.retry.always_offload_node_status = true;
    let controller = ctl::start_with_archive(&cluster, &namespace, options, Some(database)).await?;
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    ctl::request_retry(&cluster, &namespace, &dag.name, "offloaded").await?;
    let (after, status) = ctl::wait_finished(&workflows, &dag.name, "offloaded", FINISH).await?;
    controller.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "the retry should succeed: {status:?}"
    );
    let new_version = after
        .status
        .offload_node_status_version
        .clone()
        .filter(|v| *v != version)
        .context("the reset nodes should be offloaded under a new version")?;
    ensure!(
        after.status.nodes.is_none() && after.status.compressed_nodes.is_none(),
        "offloaded nodes are not kept in the workflow too"
    );
    let argos_read = argo(argodb::request(
        &db,
        "get",
        json!({"uid": uid, "version": new_version}),
    ))
    .await?;
    let mut reset = after.clone();
    reset.status.nodes = Some(serde_json::from_str(&argos_read.json)?);
    reset.status.offload_node_status_version = None;
    ensure_what_argo_creates(&reset, &hydrated, from).await?;
    db.stop();
    Ok(())
}
