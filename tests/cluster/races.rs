//! Rule 3 under races (issue 34), with the fault proxy between the controller and the API
//! server: a pod that is not the one the plan was made from (by UID) is never deleted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams};
use rewind::argo::workflow::Workflow;
use rewind::testenv::faultproxy::{Fault, FaultProxy, Matcher, Rule};
use rewind::testenv::localcluster::{LocalCluster, Role};
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;
use crate::support::invariants::PodLedger;

/// The UIDs of `plan`'s pods as they are now.
async fn plan_uids(
    pods: &Api<Pod>,
    plan: &[String],
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let mut uids = std::collections::BTreeSet::new();
    for name in plan {
        uids.insert(pods.get(name).await?.uid().context("a pod without a UID")?);
    }
    Ok(uids)
}

/// Deletes `name` at once and creates a pod of the same name labelled as Argo labels a
/// re-run pod that failed fast (completed=true, Failed): what `argo retry` and Argo's
/// controller leave when they win a race with rewind.
async fn rerun_failed_fast(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    workflow: &str,
) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .with_context(|| format!("deleting plan pod {name}"))?;
    ctl::create_pod(cluster, namespace, name, workflow, Some("Failed")).await
}

/// The first DeleteCollection is throttled (429, Retry-After 2 s); meanwhile someone resets
/// the workflow and a re-run pod under a planned name fails fast. Sending the same
/// DeleteCollection again would take that pod: it must survive, and the request end.
pub async fn a_throttled_bulk_delete_never_takes_a_pod_created_after_its_proof(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 2,
    };
    let created = dag.create(&admin, &namespace, 16, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let planned_uids = plan_uids(&pods, &plan.pods_to_delete).await?;
    let mut ledger = PodLedger::start(pods.clone()).await?;
    let proxy = FaultProxy::start(&cluster).await?;
    let bulk = Matcher::new(Method::DELETE, format!("/namespaces/{namespace}/pods"));
    proxy.add(
        Rule::new(
            bulk.clone(),
            Fault::TooManyRequests {
                retry_after_seconds: 2,
            },
        )
        .times(1),
    );
    let config = proxy.config(&cluster, Role::Controller).await?;
    let (controller, _) =
        ctl::start_as(config, &namespace, ctl::options(50, 50, true), None).await?;

    let since = Instant::now();
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    proxy
        .wait_for(&bulk, since, Duration::from_secs(30))
        .await
        .context("the controller never sent its DeleteCollection")?;
    let planned = &plan.pods_to_delete[0];
    ledger.excuse(&pods.get(planned).await?.uid().unwrap_or_default());
    let rerun = rerun_failed_fast(&cluster, &namespace, planned, &dag.name).await?;
    let replaced_within = since.elapsed();

    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    controller.stop().await?;
    let now = pods.get_opt(planned).await?;
    ensure!(
        now.as_ref().map(|p| p.uid()) == Some(rerun.uid()),
        "the re-run pod {planned} (uid {:?}, created {replaced_within:?} after the request, \
         after the proof) was deleted; the request ended {status:?}; the proxy saw {:?}",
        rerun.uid(),
        proxy
            .seen_matching(&bulk)
            .iter()
            .map(|s| s.at.duration_since(since))
            .collect::<Vec<_>>()
    );
    ledger.ensure_only_planned_removed(&planned_uids).await
}

/// The first list of the workflow's pods is held; meanwhile a re-run pod of the same
/// workflow (owned by it, Running) replaces a planned pod. It was not there when the
/// workflow was read, so it is not the plan's pod: it must survive, and the request end
/// naming it.
pub async fn a_pod_created_under_a_planned_name_after_the_read_is_never_deleted(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 6,
        succeeded: 2,
    };
    let created = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let planned = plan.pods_to_delete[0].clone();
    let original = pods.get(&planned).await?;
    let planned_uids = plan_uids(&pods, &plan.pods_to_delete).await?;
    let mut ledger = PodLedger::start(pods.clone()).await?;
    ledger.excuse(&original.uid().unwrap_or_default());

    let proxy = FaultProxy::start(&cluster).await?;
    let list = Matcher::new(Method::GET, format!("/namespaces/{namespace}/pods")).watch(false);
    let release = tokio_util::sync::CancellationToken::new();
    proxy.add(Rule::new(list.clone(), Fault::HoldUntil(release.clone())).times(1));
    let config = proxy.config(&cluster, Role::Controller).await?;
    let (controller, _) =
        ctl::start_as(config, &namespace, ctl::options(50, 50, true), None).await?;

    let since = Instant::now();
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    proxy
        .wait_for(&list, since, Duration::from_secs(30))
        .await
        .context("the controller never listed the workflow's pods")?;
    // Argo's re-run: the old pod gone, a new one under its name, owned by the same
    // workflow, started and not finished (completed=false, Running).
    pods.delete(&planned, &DeleteParams::default().grace_period(0))
        .await?;
    let mut rerun = ctl::pod(&planned, &dag.name);
    rerun.metadata.owner_references = original.metadata.owner_references.clone();
    rerun.labels_mut().insert(
        rewind::argo::workflow::labels::COMPLETED.into(),
        "false".into(),
    );
    let rerun = pods.create(&Default::default(), &rerun).await?;
    let status = serde_json::json!({"status": {"phase": "Running"}});
    pods.patch_status(
        &planned,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await?;
    release.cancel();

    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let (_, status) =
        ctl::wait_finished(&workflows, &dag.name, token, Duration::from_secs(60)).await?;
    controller.stop().await?;
    let now = pods.get_opt(&planned).await?;
    ensure!(
        now.as_ref().map(|p| p.uid()) == Some(rerun.uid()),
        "the re-run pod {planned} (uid {:?}), created after the workflow was read, was \
         deleted; the request ended {status:?}",
        rerun.uid()
    );
    ensure!(
        status.message.contains(planned.as_str()),
        "the request's end does not name the pod it left: {status:?}"
    );
    ledger.ensure_only_planned_removed(&planned_uids).await
}
