//! The controller's politeness, counted by the API server: user retries overtake background
//! work, and every mutating request goes through the budget and keeps its rate.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Api, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::localcluster::{ADMIN_NAME, CONTROLLER_NAME, LocalCluster};
use rewind::testenv::workload::FailedDag;

use crate::support::controller::{self as ctl, Audited};

const CONCURRENCY: usize = 32;
const ORPHANS: usize = 2000;
/// The label value of the orphans: no workflow has this name.
const GHOST: &str = "ghost";

/// Thousands of orphan pods queued for background deletion at 20 writes/s, then a user retry
/// of 100 single deletes: it finishes long before the backlog (100 s of budget) drains, and its
/// first delete goes out within a second of the request.
pub async fn a_user_retry_overtakes_a_background_backlog(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 100,
        succeeded: 0,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let orphans: Vec<Pod> = (0..ORPHANS)
        .map(|i| ctl::pod(&format!("{GHOST}-{i:04}"), GHOST))
        .collect();
    let started = tokio::time::Instant::now();
    stream::iter(orphans)
        .map(|pod| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("creating orphan pods")?;
    tracing::info!(orphans = ORPHANS, elapsed = ?started.elapsed(), "created the backlog");

    let mut options = ctl::options(20, 30, false);
    options.pod_gc = Some(Duration::from_secs(1));
    let controller = ctl::start(&cluster, &namespace, options).await?;
    // The first sweep queues every orphan in name order: once the first is gone, the backlog
    // is queued and the workers are busy with it.
    let first_orphan = format!("{GHOST}-0000");
    ctl::wait_gone(&pods, &first_orphan, "garbage collection").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    let orphans_left = ctl::pod_names(
        &cluster,
        &namespace,
        &format!("{}={GHOST}", labels::WORKFLOW),
    )
    .await?
    .len();
    controller.stop().await?;

    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );
    ensure!(
        orphans_left > 0,
        "the background backlog of {ORPHANS} orphans drained before the user's retry finished"
    );
    let log = ctl::audit_log(&cluster, &namespace)?;
    let asked = log
        .iter()
        .find(|a| {
            a.user == ADMIN_NAME
                && a.verb == "patch"
                && a.resource == "workflows"
                && a.name == dag.name
        })
        .context("the audit log has no patch of workflow wf (the retry request)")?
        .received;
    let planned: std::collections::BTreeSet<&str> =
        plan.pods_to_delete.iter().map(String::as_str).collect();
    let first_delete = log
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME && a.verb == "delete" && planned.contains(a.name.as_str())
        })
        .map(|a| a.received)
        .min()
        .context("the audit log has no delete of a plan pod by the controller")?;
    let orphans_deleted_during = log
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "delete"
                && a.name.starts_with(GHOST)
                && a.received > asked
        })
        .count();
    let delay = first_delete.duration_since(asked);
    tracing::info!(?delay, orphans_left, orphans_deleted_during, "priority");
    ensure!(
        delay <= SignedDuration::from_secs(1),
        "expected the retry's first delete within 1s of the request, it came after {delay:#}"
    );
    Ok(())
}

/// With a budget that binds (10 writes/s, burst 15, 150 single deletes), every mutating request
/// the API server saw from the controller was one the budget admitted (the server's count
/// equals the controller's), and no window of the server's log holds more than the budget
/// allows, the window sliding over every request's arrival.
///
/// The budget's exact bound (burst + qps in any one-second window of its own clock) is proven
/// by its unit tests on a paused clock. The server stamps a request when it reads it: a lone
/// request a millisecond or two after its token, but the burst's 16 requests, sent at once,
/// reached it over the next 55 ms (measured against the grant times), while the next refill's
/// request came at once. So a window opening on the burst's first arrival reaches one refill
/// further than the budget's own, and more when the shared control plane is busy: the server's
/// windows are allowed [`DELIVERY`] more of refills. A request that bypassed the budget still
/// shows in the counts, which are exact.
pub async fn every_mutating_request_goes_through_the_budget_and_keeps_its_rate(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const QPS: usize = 10;
    const BURST: usize = 15;
    /// How much later than its grant the server may stamp a request, against the next ones.
    const DELIVERY: SignedDuration = SignedDuration::from_millis(500);
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 150,
        succeeded: 10,
    };
    dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let (controller, metrics) = ctl::start_observed(
        &cluster,
        &namespace,
        ctl::options(QPS as u32, BURST as u32, false),
        None,
    )
    .await?;
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    controller.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );

    let log = ctl::audit_log(&cluster, &namespace)?;
    let mut writes: Vec<&Audited> = log
        .iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.is_mutating())
        .collect();
    writes.sort_by_key(|a| a.received);
    ensure!(
        writes.len() > dag.failed,
        "expected at least {} mutating requests (one delete per pod), the audit log has {}: {:?}",
        dag.failed + 1,
        writes.len(),
        ctl::summary(&log, CONTROLLER_NAME)
    );
    let budgeted = metrics.api_requests().mutating;
    ensure!(
        budgeted == writes.len() as u64,
        "the budget admitted {budgeted} mutating requests, the API server saw {} from the controller: {:?}",
        writes.len(),
        ctl::summary(&log, CONTROLLER_NAME)
    );
    let second = SignedDuration::from_secs(1);
    let allowed = BURST + (QPS as f64 * (second + DELIVERY).as_secs_f64()).ceil() as usize;
    let (busiest, start) = writes
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let n = writes[i..]
                .iter()
                .take_while(|b| b.received < a.received + second)
                .count();
            (n, i)
        })
        .max_by_key(|(n, _)| *n)
        .context("requests")?;
    let span = writes
        .last()
        .context("requests")?
        .received
        .duration_since(writes[0].received);
    tracing::info!(writes = writes.len(), budgeted, busiest, ?span, "budget");
    ensure!(
        busiest <= allowed,
        "{busiest} mutating requests in the second from {}, more than burst + qps × {:#} = {allowed}: {:?}",
        writes[start].received,
        second + DELIVERY,
        writes[start..start + busiest]
            .iter()
            .map(|a| format!("{} {} {}/{}", a.received, a.verb, a.resource, a.name))
            .collect::<Vec<_>>()
    );
    ensure!(
        busiest >= QPS,
        "the busiest second had only {busiest} mutating requests: the budget of {QPS}/s never bound, so this run proves nothing"
    );
    Ok(())
}
