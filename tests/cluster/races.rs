//! Rule 3 under races (issue 34), with the fault proxy between the controller and the API
//! server: a pod that is not the one the plan was made from (by UID) is never deleted.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::RetryStatus;
use rewind::testenv::faultproxy::{Fault, FaultProxy, Matcher, Rule};
use rewind::testenv::localcluster::{LocalCluster, Role};
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;
use crate::support::invariants;
use rewind::testenv::ledger::PodLedger;

const WORKFLOW: &str = "wf";
const TOKEN: &str = "retry-1";

/// A failed workflow, its first plan pod, a ledger of the pods removed and the
/// controller behind a fault proxy that already holds `rule` (given the first plan
/// pod's name).
struct Race {
    cluster: Arc<LocalCluster>,
    namespace: String,
    pods: Api<Pod>,
    planned: Pod,
    planned_uids: BTreeSet<String>,
    ledger: PodLedger,
    proxy: FaultProxy,
    controller: ctl::Running,
}

impl Race {
    async fn start(
        cluster: Arc<LocalCluster>,
        namespace: String,
        failed: usize,
        bulk: bool,
        rule: impl FnOnce(&str) -> Rule,
    ) -> anyhow::Result<Self> {
        let admin = cluster.admin_client();
        let dag = FailedDag {
            name: WORKFLOW.into(),
            failed,
            succeeded: 2,
        };
        let created = dag.create(&admin, &namespace, 16, || ()).await?;
        let plan = ctl::expected_plan(&created)?;
        let pods: Api<Pod> = Api::namespaced(admin, &namespace);
        let mut planned_uids = BTreeSet::new();
        for name in &plan.pods_to_delete {
            planned_uids.insert(pods.get(name).await?.uid().context("a pod without a UID")?);
        }
        let planned = pods.get(&plan.pods_to_delete[0]).await?;
        let ledger = PodLedger::start(pods.clone()).await?;
        let proxy = FaultProxy::start(&cluster).await?;
        proxy.add(rule(&planned.name_any()));
        let config = proxy.config(&cluster, Role::Controller).await?;
        let (controller, _) =
            ctl::start_as(config, &namespace, ctl::options(50, 50, bulk), None).await?;
        Ok(Self {
            cluster,
            namespace,
            pods,
            planned,
            planned_uids,
            ledger,
            proxy,
            controller,
        })
    }

    fn planned_name(&self) -> String {
        self.planned.name_any()
    }

    /// Asks for the retry and waits until `matcher`'s request reaches the proxy.
    async fn request_until(&self, matcher: &Matcher) -> anyhow::Result<Instant> {
        let since = Instant::now();
        ctl::request_retry(&self.cluster, &self.namespace, WORKFLOW, TOKEN).await?;
        self.proxy
            .wait_for(matcher, since, Duration::from_secs(30))
            .await
            .with_context(|| format!("the controller never sent {matcher:?}"))?;
        Ok(since)
    }

    /// Argo's re-run of the planned pod: the old one gone, a new one under its name,
    /// owned by the same workflow, as Argo labels it with `completed` and in `phase`.
    async fn rerun(&self, completed: bool, phase: &str) -> anyhow::Result<Pod> {
        let name = self.planned_name();
        self.pods
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .with_context(|| format!("deleting plan pod {name}"))?;
        let mut rerun = ctl::pod(&name, WORKFLOW);
        rerun
            .metadata
            .owner_references
            .clone_from(&self.planned.metadata.owner_references);
        rerun
            .labels_mut()
            .insert(labels::COMPLETED.into(), completed.to_string());
        self.pods.create(&Default::default(), &rerun).await?;
        let status = serde_json::json!({"status": {"phase": phase}});
        Ok(self
            .pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?)
    }

    /// Waits for the request's end, stops the controller and checks that `rerun` is
    /// still there and that no pod outside the plan was removed.
    async fn finish(self, rerun: &Pod, what: &str) -> anyhow::Result<RetryStatus> {
        let workflows: Api<Workflow> =
            Api::namespaced(self.cluster.admin_client(), &self.namespace);
        let (_, status) =
            ctl::wait_finished(&workflows, WORKFLOW, TOKEN, Duration::from_secs(60)).await?;
        let name = self.planned_name();
        self.controller.stop().await?;
        self.ledger
            .ensure_only_planned_removed(&self.planned_uids)
            .await?;
        invariants::ensure_written_at_most_once(&self.cluster, &self.namespace, WORKFLOW)?;
        let now = self.pods.get_opt(&name).await?;
        ensure!(
            now.as_ref().map(|p| p.uid()) == Some(rerun.uid()),
            "the re-run pod {name} (uid {:?}), {what}, was deleted; the request ended {status:?}",
            rerun.uid()
        );
        Ok(status)
    }
}

/// The first DeleteCollection is throttled (429, Retry-After 2 s); meanwhile someone resets
/// the workflow and a re-run pod under a planned name fails fast. Sending the same
/// DeleteCollection again would take that pod: it must survive, and the request end.
pub async fn a_throttled_bulk_delete_never_takes_a_pod_created_after_its_proof(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let bulk = Matcher::new(Method::DELETE, format!("/namespaces/{namespace}/pods"));
    let throttled = Fault::TooManyRequests {
        retry_after_seconds: 2,
    };
    let race = Race::start(cluster, namespace, 20, true, |_| {
        Rule::new(bulk.clone(), throttled).times(1)
    })
    .await?;
    let since = race.request_until(&bulk).await?;
    let rerun = race.rerun(true, "Failed").await?;
    let what = format!(
        "created {:?} after the request, after the proof (DeleteCollections at {:?})",
        since.elapsed(),
        race.proxy
            .seen_matching(&bulk)
            .iter()
            .map(|s| s.at.duration_since(since))
            .collect::<Vec<_>>()
    );
    race.finish(&rerun, &what).await?;
    Ok(())
}

/// The first list of the workflow's pods is held; meanwhile a re-run pod of the same
/// workflow (owned by it, Running) replaces a planned pod. It was not there when the
/// workflow was read, so it is not the plan's pod: it must survive, and the request end
/// naming it.
pub async fn a_pod_created_under_a_planned_name_after_the_read_is_never_deleted(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let list = Matcher::new(Method::GET, format!("/namespaces/{namespace}/pods")).watch(false);
    let release = tokio_util::sync::CancellationToken::new();
    let held = Fault::HoldUntil(release.clone());
    let race = Race::start(cluster, namespace, 6, true, |_| {
        Rule::new(list.clone(), held).times(1)
    })
    .await?;
    race.request_until(&list).await?;
    let rerun = race.rerun(false, "Running").await?;
    release.cancel();
    let planned = race.planned_name();
    let status = race
        .finish(&rerun, "created after the workflow was read")
        .await?;
    ensure!(
        status.message.contains(planned.as_str()),
        "the request's end does not name the pod it left: {status:?}"
    );
    Ok(())
}

/// The delete of a plan pod is throttled (429, Retry-After 8 s); meanwhile the workflow
/// runs again and the request stops, saying it deleted nothing more. kube's resend of the
/// delete, once it waited out Retry-After, would come after that: it must not be sent.
pub async fn a_delete_waiting_out_a_429_is_not_sent_after_its_request_stopped(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const RETRY_AFTER: u32 = 8;
    let pods = format!("/namespaces/{namespace}/pods/");
    let throttled = Fault::TooManyRequests {
        retry_after_seconds: RETRY_AFTER,
    };
    let race = Race::start(cluster, namespace, 6, false, |planned| {
        Rule::new(
            Matcher::new(Method::DELETE, format!("{pods}{planned}")),
            throttled,
        )
        .times(1)
    })
    .await?;
    let planned = race.planned_name();
    let delete = Matcher::new(Method::DELETE, format!("{pods}{planned}"));
    let since = race.request_until(&delete).await?;
    let workflows: Api<Workflow> = Api::namespaced(race.cluster.admin_client(), &race.namespace);
    let reopen = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: null, labels::PHASE: "Running"}}});
    workflows
        .patch_metadata(WORKFLOW, &PatchParams::default(), &Patch::Merge(&reopen))
        .await?;
    let (_, status) =
        ctl::wait_finished(&workflows, WORKFLOW, TOKEN, Duration::from_secs(60)).await?;
    ensure!(
        status.message.contains("running again"),
        "expected the request to stop as the workflow ran again, got {status:?}"
    );
    // Past the Retry-After, so a resend would have reached the proxy by now.
    let resend_due = Duration::from_secs(u64::from(RETRY_AFTER) + 2);
    tokio::time::sleep(resend_due.saturating_sub(since.elapsed())).await;
    race.controller.stop().await?;
    race.ledger
        .ensure_only_planned_removed(&race.planned_uids)
        .await?;
    invariants::ensure_written_at_most_once(&race.cluster, &race.namespace, WORKFLOW)?;
    let sent: Vec<_> = race
        .proxy
        .seen_matching(&delete)
        .iter()
        .map(|s| s.at.duration_since(since))
        .collect();
    ensure!(
        sent.len() == 1,
        "the throttled delete of {planned} was sent again after its request stopped ({status:?}): sent at {sent:?}"
    );
    ensure!(
        race.pods.get_opt(&planned).await?.is_some(),
        "{planned} was deleted although its request stopped first"
    );
    Ok(())
}
