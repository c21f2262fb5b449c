//! Every request ends (rule 7), with an answer that names what held it: two requests that
//! queue the same deletions both end, and a plan pod that is deleted but never goes is named
//! while the request waits, then ends it Failed, without a reset, giving back its share of the
//! bound on pods in deletion. Each wait here is bounded, so "never ends" is a failure.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::{CREATED_BY, WorkflowRetry};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::faultproxy::Matcher;
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::FailedDag;

use crate::support::archived::{Archive, Archived};
use crate::support::controller as ctl;
use crate::support::workflowretry::{archived, live, phase_and_message};

const CONCURRENCY: usize = 16;

/// The finalizer someone else set and never removes.
const HOLD: &str = "example.com/hold";

/// Waits until every WorkflowRetry of `names` is finished, at most `bound`.
async fn all_finished(
    api: &Api<WorkflowRetry>,
    names: &[&str],
    bound: Duration,
) -> anyhow::Result<Vec<WorkflowRetry>> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let mut objects = Vec::new();
        for name in names {
            objects.push(api.get(name).await?);
        }
        if objects.iter().all(WorkflowRetry::is_finished) {
            return Ok(objects);
        }
        if tokio::time::Instant::now() >= deadline {
            let states: Vec<(String, Option<RetryPhase>, String)> = objects
                .iter()
                .map(|o| {
                    let (phase, message) = phase_and_message(o);
                    (o.name_any(), phase, message)
                })
                .collect();
            bail!("not every WorkflowRetry finished within {bound:?}: {states:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two WorkflowRetries for one archived workflow, created together (a double click in Argo's
/// UI, a client that retries its call): they queue the same deletions, which the queue sends
/// once. Both end: one creates the workflow, the other fails with Argo's "already exists";
/// exactly the plan's pods are gone.
pub async fn two_workflowretries_of_one_archived_workflow_both_end(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 4,
    };
    let old = Archived::create(&cluster, &namespace, dag, Archive::InTest).await?;

    // Single deletes at 10 a second: the plan's 40 writes (a delete and a finalizer release
    // per pod) take seconds, so both requests' items meet in the queue.
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(10, 1, false),
        Some(old.rows()),
    )
    .await?;
    let params = PostParams::default();
    let (first, second) = (archived("first", &old.uid), archived("second", &old.uid));
    let (first, second) = tokio::join!(
        retries.create(&params, &first),
        retries.create(&params, &second),
    );
    let uids = [first?.uid(), second?.uid()];
    let finished = all_finished(&retries, &["first", "second"], Duration::from_secs(30)).await;
    controller.stop().await?;
    let finished = finished?;

    let ends: Vec<(Option<RetryPhase>, String)> = finished.iter().map(phase_and_message).collect();
    let succeeded: Vec<usize> = (0..2)
        .filter(|&i| ends[i].0 == Some(RetryPhase::Succeeded))
        .collect();
    let [winner] = succeeded[..] else {
        bail!("expected exactly one of the two requests to succeed: {ends:?}");
    };
    let loser = 1 - winner;
    ensure!(
        ends[loser].0 == Some(RetryPhase::Failed) && ends[loser].1.contains("already exists"),
        "expected the other request to fail saying the workflow already exists: {ends:?}"
    );
    let after = workflows.get(&old.name).await?;
    ensure!(
        after.annotation(CREATED_BY) == uids[winner].as_deref(),
        "the workflow should be the succeeded request's ({:?}), found {CREATED_BY}={:?}",
        uids[winner],
        after.annotation(CREATED_BY)
    );
    old.ensure_only_leftovers_deleted(&pods).await
}

/// Waits until `read` gives a status whose phase is `phase` and whose message has each of
/// `words`, at most `bound`; returns the message.
pub async fn wait_message<F, Fut>(
    what: &str,
    mut read: F,
    phase: RetryPhase,
    words: &[&str],
    bound: Duration,
) -> anyhow::Result<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<(RetryPhase, String)>>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let last = read().await?;
        if let Some((p, message)) = &last
            && *p == phase
            && words.iter().all(|w| message.contains(w))
        {
            return Ok(message.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{what}: expected {phase:?} with a message naming {words:?} within {bound:?}; last status: {last:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a failed workflow of 10 failed and 2 succeeded pods; its first plan pod gets a
/// finalizer nobody removes. Returns that pod's name and the plan's pods.
async fn workflow_with_a_held_pod(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
) -> anyhow::Result<(String, Vec<String>)> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: name.into(),
        failed: 10,
        succeeded: 2,
    };
    let created = dag.create(&admin, namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let held = plan.pods_to_delete[0].clone();
    let patch = serde_json::json!({"metadata": {"finalizers": [HOLD]}});
    Api::<Pod>::namespaced(admin, namespace)
        .patch(&held, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("adding {HOLD} to {held}"))?;
    Ok((held, plan.pods_to_delete))
}

/// A plan pod held by someone else's finalizer, once through the annotation and once through
/// a WorkflowRetry (what `rewind retry` and Argo's API create): after a short while the
/// request's message names the pod and its finalizer while it is still `DeletingPods`; at the
/// terminating timeout it ends Failed saying what to do, the workflow is not reset (rule 2),
/// and its share of the bound on pods in deletion (here the whole bound) goes back: the next
/// request, waiting for it, runs.
pub async fn a_pod_that_will_not_go_is_named_then_fails_its_retry_and_frees_its_share(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(6);
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let (held_a, plan_a) = workflow_with_a_held_pod(&cluster, &namespace, "wf-a").await?;
    let (held_b, _) = workflow_with_a_held_pod(&cluster, &namespace, "wf-b").await?;

    let mut options = ctl::options(50, 50, true);
    options.retry.terminating_timeout = TIMEOUT;
    // One retry at a time: each takes the whole bound, and the next waits for it.
    options.retry.max_pods_in_flight = 1;
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let started = tokio::time::Instant::now();
    ctl::request_retry(&cluster, &namespace, "wf-a", "held-1").await?;
    let workflows_ref = &workflows;
    let annotation = move || async move {
        let wf = workflows_ref.get("wf-a").await?;
        Ok(ctl::status_of(&wf, "held-1")?.map(|s| (s.phase, s.message)))
    };
    // Named while waiting (a tenth of the timeout, then the status interval's write).
    let waiting = wait_message(
        "the annotated request while its pod is held",
        annotation,
        RetryPhase::DeletingPods,
        &[held_a.as_str(), HOLD, "still there"],
        TIMEOUT,
    )
    .await?;
    retries
        .create(&PostParams::default(), &live("retry-b", "wf-b", None))
        .await?;
    let failed = wait_message(
        "the annotated request at its terminating timeout",
        annotation,
        RetryPhase::Failed,
        &[held_a.as_str(), HOLD, "kubectl edit pod", "not reset"],
        TIMEOUT * 3,
    )
    .await?;
    let failed_after = started.elapsed();
    ensure!(
        failed_after >= TIMEOUT,
        "the request failed after {failed_after:?}, before its terminating timeout"
    );
    let wf = workflows.get("wf-a").await?;
    ensure!(
        wf.label(labels::COMPLETED) == Some("true") && wf.status.phase.as_deref() == Some("Failed"),
        "workflow wf-a was reset although plan pod {held_a} is still there"
    );
    let left: Vec<String> =
        ctl::pod_names(&cluster, &namespace, &format!("{}=wf-a", labels::WORKFLOW))
            .await?
            .into_iter()
            .filter(|p| plan_a.contains(p))
            .collect();
    ensure!(
        left == [held_a.clone()],
        "expected only the held pod {held_a} left of the plan, found {left:?}"
    );

    // The WorkflowRetry's request ran once the first gave its share back, and says the same.
    let retries_ref = &retries;
    let object = move || async move {
        let o = retries_ref.get("retry-b").await?;
        Ok(o.status.and_then(|s| Some((s.phase?, s.message))))
    };
    wait_message(
        "the WorkflowRetry while its pod is held",
        object,
        RetryPhase::DeletingPods,
        &[held_b.as_str(), HOLD, "still there"],
        TIMEOUT * 2,
    )
    .await?;
    wait_message(
        "the WorkflowRetry at its terminating timeout",
        object,
        RetryPhase::Failed,
        &[held_b.as_str(), HOLD, "kubectl edit pod"],
        TIMEOUT * 3,
    )
    .await?;
    // And the bound is free again for anyone.
    ctl::serves_a_normal_retry(&cluster, &namespace).await?;
    controller.stop().await?;
    tracing::info!(%waiting, %failed, "messages of the held request");

    for pod in [&held_a, &held_b] {
        let release = serde_json::json!({"metadata": {"finalizers": null}});
        pods.patch(pod, &PatchParams::default(), &Patch::Merge(&release))
            .await?;
    }
    Ok(())
}

/// Issue 47, finding 7: a plan pod held by someone else's finalizer is followed on the
/// request's watch, not by listing the workflow's pods twice a second (on a large workflow
/// each list is tens of pages, above a tenant's read budget): while it waits the request
/// lists them at most once a second, here a handful of times in all, and once the finalizer
/// goes it goes on at once and ends Succeeded.
pub async fn a_held_pod_is_followed_on_the_watch_not_by_lists(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const HELD_FOR: Duration = Duration::from_secs(8);
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin, &namespace);
    let (held, _) = workflow_with_a_held_pod(&cluster, &namespace, "wf").await?;
    let lists = Matcher::new(http::Method::GET, format!("/namespaces/{namespace}/pods"))
        .watch(false)
        .query_contains(format!("{}=wf", labels::WORKFLOW));
    let mut options = ctl::options(50, 50, true);
    options.retry.terminating_timeout = Duration::from_secs(60);
    let (proxy, controller, _) =
        ctl::start_behind_proxy(&cluster, &namespace, [], options, None).await?;
    let token = "held-1";
    ctl::request_retry(&cluster, &namespace, "wf", token).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pods.get(&held).await?.metadata.deletion_timestamp.is_none() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the request did not delete {held}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let since = std::time::Instant::now();
    tokio::time::sleep(HELD_FOR).await;
    let listed = proxy
        .seen_matching(&lists)
        .iter()
        .filter(|s| s.at >= since)
        .count();
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    pods.patch(&held, &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    let released = std::time::Instant::now();
    let (_, status) = ctl::wait_finished(&workflows, "wf", token, Duration::from_secs(30)).await?;
    let went_on = released.elapsed();
    controller.stop().await?;
    tracing::info!(listed, ?HELD_FOR, ?went_on, "lists while one pod was held");
    ensure!(
        listed as u64 <= HELD_FOR.as_secs(),
        "the request listed the workflow's pods {listed} times in {HELD_FOR:?} while one pod was held"
    );
    ensure!(
        status.phase == RetryPhase::Succeeded && went_on < Duration::from_secs(5),
        "once the held pod went, the request ended {status:?} after {went_on:?}"
    );
    Ok(())
}
