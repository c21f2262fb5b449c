//! What runs at once. The bound on planned pods in deletion (--max-pods-in-flight): with it
//! set below two retries' pods, the second waits, Pending and saying why, until the first is
//! done; both then end as planned. The bound on DeleteCollections in flight
//! (--max-bulk-in-flight): the API server never holds more of the controller's at once.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use rewind::argo::workflow::Workflow;
use rewind::protocol::request::RetryPhase;
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;

pub async fn a_retry_past_the_bound_waits_pending_then_both_end_as_planned(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dags = ["first", "second"].map(|name| FailedDag {
        name: name.into(),
        failed: 60,
        succeeded: 2,
    });
    let mut plans = Vec::new();
    for dag in &dags {
        let before = dag.create(&admin, &namespace, 8, || ()).await?;
        plans.push(ctl::expected_plan(&before)?);
    }
    // One DELETE per pod at 10 a second: each retry deletes for about six seconds.
    let mut options = ctl::options(10, 1, false);
    options.retry.max_pods_in_flight = 100;
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let from = Timestamp::now() - SignedDuration::from_secs(1);

    ctl::request_retry(&cluster, &namespace, "first", "1").await?;
    wait_phase(&workflows, "first", RetryPhase::DeletingPods).await?;
    ctl::request_retry(&cluster, &namespace, "second", "1").await?;
    let waiting = wait_phase(&workflows, "second", RetryPhase::Pending).await?;
    let first_now = status(&workflows, "first").await?;
    tracing::info!(message = waiting.message, first = ?first_now.phase, "the second retry waits");
    ensure!(
        waiting.message.contains("waiting for room")
            && waiting.message.contains("--max-pods-in-flight")
            && waiting.message.contains("60 pods"),
        "the second retry's status does not say why it waits: {waiting:?}"
    );
    ensure!(
        first_now.phase != RetryPhase::Succeeded,
        "the first retry had already ended when the second was seen waiting"
    );

    for (dag, plan) in dags.iter().zip(&plans) {
        let (after, status) =
            ctl::wait_finished(&workflows, &dag.name, "1", Duration::from_secs(60)).await?;
        ensure!(
            status.phase == RetryPhase::Succeeded && status.pods_deleted == 60,
            "{}: {status:?}",
            dag.name
        );
        ctl::ensure_reset_as_planned(
            &after,
            &plan.workflow,
            from,
            Timestamp::now() + SignedDuration::from_secs(1),
        )
        .with_context(|| dag.name.clone())?;
    }
    // The second started deleting only once the first was done.
    let log = ctl::audit_log(&cluster, &namespace)?;
    let deletes = |wf: &str| -> Vec<_> {
        log.iter()
            .filter(|a| a.verb == "delete" && a.resource == "pods" && a.name.starts_with(wf))
            .map(|a| a.received)
            .collect()
    };
    let (first_last, second_first) = (
        deletes("first-").into_iter().max(),
        deletes("second-").into_iter().min(),
    );
    match (first_last, second_first) {
        (Some(a), Some(b)) if b > a => {}
        other => bail!("the second retry's deletes did not follow the first's: {other:?}"),
    }
    controller.stop().await
}

async fn status(
    workflows: &Api<Workflow>,
    name: &str,
) -> anyhow::Result<rewind::protocol::request::RetryStatus> {
    let wf = workflows.get(name).await?;
    ctl::status_of(&wf, "1")?.with_context(|| format!("{name} has no status yet"))
}

/// Waits until request 1 on `name` reports `phase`; its status.
async fn wait_phase(
    workflows: &Api<Workflow>,
    name: &str,
    phase: RetryPhase,
) -> anyhow::Result<rewind::protocol::request::RetryStatus> {
    for _ in 0..400 {
        if let Ok(status) = status(workflows, name).await
            && status.phase == phase
        {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("{name} never reported {phase:?}")
}

/// Six bulk retries asked together, with at most one DeleteCollection in flight: the API
/// server's audit log shows them one after another, never two at once, and each retry ends
/// as planned.
pub async fn bulk_deletes_past_the_bound_wait_their_turn_in_the_controller(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const WORKFLOWS: usize = 6;
    let admin = cluster.admin_client();
    let mut dags = Vec::new();
    for i in 0..WORKFLOWS {
        let dag = FailedDag {
            name: format!("bulk{i}"),
            failed: 40,
            succeeded: 2,
        };
        dag.create(&admin, &namespace, 8, || ()).await?;
        dags.push(dag);
    }
    let mut options = ctl::options(50, 50, true);
    options.max_bulk_in_flight = 1;
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    for dag in &dags {
        ctl::request_retry(&cluster, &namespace, &dag.name, "1").await?;
    }
    for dag in &dags {
        let (_, status) =
            ctl::wait_finished(&workflows, &dag.name, "1", Duration::from_secs(60)).await?;
        ensure!(
            status.phase == RetryPhase::Succeeded && status.pods_deleted == 40,
            "{}: {status:?}",
            dag.name
        );
    }
    controller.stop().await?;
    let log = cluster.audit_log_path().context("the cluster audits")?;
    let mut bulk: Vec<_> = rewind::testenv::bench::audit::read(&log)?
        .into_iter()
        .filter(|a| {
            a.namespace == namespace && a.verb == "deletecollection" && a.resource == "pods"
        })
        .map(|a| (a.received, a.completed))
        .collect();
    bulk.sort();
    ensure!(
        bulk.len() >= WORKFLOWS,
        "expected a DeleteCollection per workflow: {bulk:?}"
    );
    let overlapping: Vec<_> = bulk.windows(2).filter(|w| w[1].0 < w[0].1).collect();
    ensure!(
        overlapping.is_empty(),
        "two DeleteCollections were in flight at once: {overlapping:?}"
    );
    Ok(())
}
