//! A retry end to end on the real control plane: the reset workflow is the planner's, exactly
//! the plan's pods are deleted (never a decoy), and the reset is written after the last of them
//! is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use rewind::argo::plan::ArgoVersion;
use rewind::argo::plan::pod_name::{PodNameFormat, node_id, pod_name};
use rewind::argo::workflow::{NodeFlag, NodeStatus, Text, Workflow, labels};
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role};
use rewind::testenv::workload::FailedDag;

use crate::support::controller::{self as ctl, Audited};
use crate::support::pod_policy;

/// Requests sent at once while creating fixtures.
const CONCURRENCY: usize = 16;
const FINISH: Duration = Duration::from_secs(60);

fn second_before(t: Timestamp) -> Timestamp {
    t - SignedDuration::from_secs(1)
}

fn second_after(t: Timestamp) -> Timestamp {
    t + SignedDuration::from_secs(1)
}

/// A DAG of 60 failed and 20 succeeded tasks plus two tasks with retries (Retry nodes): one
/// succeeded on its second attempt (its failed first attempt stays, as in Argo), one failed
/// both attempts. Decoys: every pod outside the plan (succeeded pods, the kept failed
/// attempt), a workflow named "wf-2" beside "wf" with failed pods, and a failed pod labelled
/// with the workflow that the plan does not name, so a DeleteCollection by label and phase
/// would hit it: the controller must delete pod by pod.
pub async fn retry_resets_as_planned_and_deletes_exactly_the_plan_pods(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 60,
        succeeded: 20,
    };
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let mut workflow = dag.workflow(&namespace);
    let attempts = add_retry_task(&mut workflow, "flaky", &["Failed", "Succeeded"])
        .into_iter()
        .chain(add_retry_task(
            &mut workflow,
            "broken",
            &["Failed", "Failed"],
        ))
        .collect::<Vec<_>>();
    let created = workflows.create(&PostParams::default(), &workflow).await?;
    let mut pods: Vec<(Pod, String)> = dag
        .pods(&created)
        .into_iter()
        .map(|(p, phase)| (p, phase.to_owned()))
        .collect();
    pods.extend(attempts);
    pods.push((ctl::pod("wf-stray", "wf"), "Failed".into()));
    create_pods(&cluster, &namespace, pods).await?;
    let similar = FailedDag {
        name: "wf-2".into(),
        failed: 5,
        succeeded: 1,
    };
    similar
        .create(&admin, &namespace, CONCURRENCY, || ())
        .await
        .context("creating workflow wf-2 and its pods")?;

    let before = workflows.get(&dag.name).await?;
    let plan = ctl::expected_plan(&before)?;
    let failed: BTreeSet<String> = plan.pods_to_delete.iter().cloned().collect();
    let kept = ctl::pod_names(
        &cluster,
        &namespace,
        &format!("{}={}", labels::WORKFLOW, dag.name),
    )
    .await?
    .into_iter()
    .filter(|p| !failed.contains(p))
    .count();
    tracing::info!(plan = failed.len(), kept, "retry with decoys");
    ensure!(
        failed.len() >= dag.failed,
        "the plan should delete at least the {} failed task pods, it names {}",
        dag.failed,
        failed.len()
    );
    let pods_before = ctl::pod_names(&cluster, &namespace, labels::WORKFLOW).await?;

    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let from = second_before(Timestamp::now());
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let (after, status) = ctl::wait_finished(&workflows, &dag.name, token, FINISH).await?;
    let to = second_after(Timestamp::now());
    // A graceful stop sends the Event of a reset first.
    controller.stop().await?;

    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );
    let planned = plan.pods_to_delete.len() as u64;
    ensure!(
        status.pods_total == planned && status.pods_deleted == planned,
        "expected podsTotal = podsDeleted = {planned}, the status says {} and {}",
        status.pods_total,
        status.pods_deleted
    );
    ensure!(
        after.annotation(annotations::OBSERVED) == Some(token),
        "expected {}={token}, found {:?}",
        annotations::OBSERVED,
        after.annotation(annotations::OBSERVED)
    );
    ctl::ensure_reset_as_planned(&after, &plan.workflow, from, to)?;

    let pods_after: BTreeSet<String> = ctl::pod_names(&cluster, &namespace, labels::WORKFLOW)
        .await?
        .into_iter()
        .collect();
    let expected: BTreeSet<String> = pods_before
        .iter()
        .filter(|p| !failed.contains(*p))
        .cloned()
        .collect();
    ensure!(
        pods_after == expected,
        "expected exactly the {} plan pods gone and the {} others kept; missing: {:?}, still there: {:?}",
        failed.len(),
        expected.len(),
        expected.difference(&pods_after).collect::<Vec<_>>(),
        pods_after.difference(&expected).collect::<Vec<_>>()
    );

    let log = ctl::audit_log(&cluster, &namespace)?;
    let ours: Vec<&Audited> = log
        .iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.resource == "pods")
        .collect();
    let bulk = ours.iter().filter(|a| a.verb == "deletecollection").count();
    ensure!(
        bulk == 0,
        "a failed pod outside the plan matches the bulk selector, yet the controller sent {bulk} deletecollection"
    );
    let deleted: BTreeMap<&str, usize> =
        ours.iter()
            .filter(|a| a.verb == "delete")
            .fold(BTreeMap::new(), |mut m, a| {
                *m.entry(a.name.as_str()).or_default() += 1;
                m
            });
    let outside: Vec<&&str> = deleted.keys().filter(|n| !failed.contains(**n)).collect();
    ensure!(
        outside.is_empty(),
        "the controller sent deletes for pods outside the plan: {outside:?}"
    );
    ensure!(
        deleted.len() == failed.len() && deleted.values().all(|&n| n == 1),
        "expected one delete per plan pod ({}), the audit log has {} pods deleted, {} of them more than once",
        failed.len(),
        deleted.len(),
        deleted.values().filter(|&&n| n > 1).count()
    );

    let reasons = ctl::event_reasons(&cluster, &namespace, &dag.name).await?;
    for reason in ["RetryStarted", "Retried"] {
        ensure!(
            reasons.iter().any(|r| r == reason),
            "expected a {reason} Event on workflow wf, found {reasons:?}"
        );
    }
    Ok(())
}

/// Adds a DAG task `task` with retries to `wf`: a Retry node with one Pod node per attempt
/// ending in `phases`, the Retry node ending like its last attempt. Returns the attempts'
/// pods, named and labelled as Argo names them, with their phases.
fn add_retry_task(wf: &mut Workflow, task: &str, phases: &[&str]) -> Vec<(Pod, String)> {
    let name = wf.name_any();
    let time = Some("2026-01-01T00:00:00Z".to_owned());
    let retry_name = format!("{name}.{task}");
    let retry_id = node_id(&name, &retry_name);
    let nodes = wf.status.nodes.get_or_insert_with(Default::default);
    let mut pods = Vec::new();
    let mut children = Vec::new();
    for (attempt, phase) in phases.iter().enumerate() {
        let node_name = format!("{retry_name}({attempt})");
        let id = node_id(&name, &node_name);
        children.push(Text::from(id.as_str()));
        nodes.insert(
            id.clone(),
            Box::new(NodeStatus {
                id: id.as_str().into(),
                name: node_name.as_str().into(),
                display_name: Some(format!("{task}({attempt})").into()),
                type_: "Pod".into(),
                template_name: Some("work".into()),
                phase: Some((*phase).into()),
                boundary_id: Some(name.as_str().into()),
                message: (*phase == "Failed").then(|| "Error (exit code 1)".into()),
                started_at: time.clone().map(Into::into),
                finished_at: time.clone().map(Into::into),
                node_flag: Some(Box::new(NodeFlag {
                    retried: true,
                    ..Default::default()
                })),
                ..Default::default()
            }),
        );
        let pod_name = pod_name(
            &name,
            &node_name,
            "work",
            &id,
            PodNameFormat::V2,
            ArgoVersion::V4,
        )
        .expect("short names");
        let mut pod = ctl::pod(&pod_name, &name);
        pod.metadata.annotations = Some(
            [
                (labels::NODE_ID.to_owned(), id),
                (labels::NODE_NAME.to_owned(), node_name),
            ]
            .into(),
        );
        pods.push((pod, (*phase).to_owned()));
    }
    let last = children.last().cloned();
    nodes.insert(
        retry_id.clone(),
        Box::new(NodeStatus {
            id: retry_id.as_str().into(),
            name: retry_name.into(),
            display_name: Some(task.into()),
            type_: "Retry".into(),
            template_name: Some("work".into()),
            phase: phases.last().map(|p| (*p).into()),
            boundary_id: Some(name.as_str().into()),
            started_at: time.clone().map(Into::into),
            finished_at: time.map(Into::into),
            children: Some(children),
            outbound_nodes: last.clone().map(|l| vec![l]),
            ..Default::default()
        }),
    );
    let root = nodes.get_mut(&name).expect("the DAG node");
    root.children
        .get_or_insert_with(Vec::new)
        .push(retry_id.into());
    root.outbound_nodes
        .get_or_insert_with(Vec::new)
        .extend(last);
    if let Some(opaque) = wf.spec.other.get_mut("templates") {
        let mut templates = opaque.to_value();
        templates[0]["dag"]["tasks"]
            .as_array_mut()
            .expect("the DAG's tasks")
            .push(serde_json::json!({"name": task, "template": "work"}));
        templates[1]["retryStrategy"] = serde_json::json!({"limit": phases.len() - 1});
        *opaque = templates.into();
    }
    pods
}

/// Creates pods and sets their phases, a few at a time.
async fn create_pods(
    cluster: &LocalCluster,
    namespace: &str,
    pods: Vec<(Pod, String)>,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
    futures::stream::iter(pods)
        .map(|(pod, phase)| {
            let api = api.clone();
            async move {
                let name = pod.name_any();
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating pod {name}"))?;
                let status = Patch::Merge(serde_json::json!({"status": {"phase": phase}}));
                api.patch_status(&name, &PatchParams::default(), &status)
                    .await
                    .with_context(|| format!("setting pod {name} to {phase}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// A plan pod replaced (same name, new UID) after the controller listed it but before its
/// delete: the UID precondition makes the API server refuse that delete (409), the new pod is
/// kept, and the request stops with a message rather than reset the workflow over a live pod.
pub async fn a_plan_pod_replaced_before_its_delete_is_kept_and_stops_the_retry(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 2,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let (first, last) = (
        plan.pods_to_delete.first().context("a plan")?,
        plan.pods_to_delete.last().context("a plan")?,
    );
    let mut replacement = dag
        .pods(&created)
        .into_iter()
        .find(|(p, _)| p.metadata.name.as_ref() == Some(last))
        .map(|(p, _)| p)
        .context("the fixture has the last plan pod")?;

    // One delete every 200 ms: the last plan pod's turn comes seconds after the first delete.
    let controller = ctl::start(&cluster, &namespace, ctl::options(5, 1, false)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    ctl::wait_gone(&pods, first, "the controller (first plan pod)").await?;
    let old = pods.get(last).await?;
    let old_uid = old.uid().context("a pod has a UID")?;
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(old_uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(e) = pods.delete(last, &dp).await {
        bail!(
            "the test meant to replace plan pod {last} before the controller's delete, but could not delete it first: {e}"
        );
    }
    while pods.get_opt(last).await?.is_some() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replacement.metadata.owner_references = None;
    let new = pods.create(&PostParams::default(), &replacement).await?;
    let new_uid = new.uid().context("a pod has a UID")?;
    pods.patch_status(
        last,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Failed"}})),
    )
    .await?;

    let (after, status) = ctl::wait_finished(&workflows, &dag.name, token, FINISH).await?;
    ctl::wait_event(&cluster, &namespace, &dag.name, "RetryFailed").await?;
    controller.stop().await?;

    ensure!(
        status.phase == RetryPhase::Failed
            && status.message.contains(last.as_str())
            && status.message.contains("recreated"),
        "expected the retry to fail naming the recreated pod {last}, its status is {status:?}"
    );
    ensure!(
        after.annotation(annotations::OBSERVED) == Some(token),
        "the failed request is not marked observed"
    );
    ensure!(
        after.status.phase.as_deref() == Some("Failed"),
        "the workflow must not be reset over a live pod, its phase is {:?}",
        after.status.phase
    );
    let kept = pods.get_opt(last).await?;
    ensure!(
        kept.as_ref().and_then(|p| p.uid()).as_deref() == Some(new_uid.as_str()),
        "the replacement pod {last} (UID {new_uid}) must survive, found {:?}",
        kept.map(|p| p.uid())
    );
    let log = ctl::audit_log(&cluster, &namespace)?;
    let refused: Vec<u16> = log
        .iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.verb == "delete" && a.name == *last)
        .map(|a| a.code)
        .collect();
    ensure!(
        refused == [409],
        "expected the controller's one delete of {last} (for UID {old_uid}) refused with 409, the audit log has codes {refused:?}"
    );
    let remaining = ctl::pod_names(
        &cluster,
        &namespace,
        &format!("{}={}", labels::WORKFLOW, dag.name),
    )
    .await?;
    ensure!(
        remaining.len() == dag.succeeded + 1,
        "expected the {} succeeded pods and the replacement to remain, found {remaining:?}",
        dag.succeeded
    );
    let reasons = ctl::event_reasons(&cluster, &namespace, &dag.name).await?;
    ensure!(
        reasons.iter().any(|r| r == "RetryFailed"),
        "expected a RetryFailed Event, found {reasons:?}"
    );
    Ok(())
}

/// Rule 2 as a watcher sees it: every plan pod's DELETED event comes before (has a lower etcd
/// revision than) the workflow event that resets it. Uses the bulk path.
pub async fn the_reset_is_written_after_the_last_plan_pod_is_gone(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 300,
        succeeded: 20,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let planned: BTreeSet<String> = plan.pods_to_delete.iter().cloned().collect();

    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pod_events = watch_from_now(
        pods,
        ListParams::default().labels(&format!("{}={}", labels::WORKFLOW, dag.name)),
    )
    .await?;
    let workflow_events = watch_from_now(
        workflows.clone(),
        ListParams::default().fields(&format!("metadata.name={}", dag.name)),
    )
    .await?;

    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let (after, status) = ctl::wait_finished(&workflows, &dag.name, token, FINISH).await?;
    controller.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );
    let final_rv = revision(&after)?;

    // No pod event need follow the reset: a marker pod gives the pod watch a revision to reach.
    let marker = ctl::create_pod(&cluster, &namespace, "marker", &dag.name, None).await?;
    let pod_events = pod_events.collect_until(revision(&marker)?).await?;
    let workflow_events = workflow_events.collect_until(final_rv).await?;
    let deleted: BTreeMap<String, u64> = pod_events
        .iter()
        .filter(|(kind, _, _)| kind == "DELETED")
        .map(|(_, pod, rv)| (pod.name_any(), *rv))
        .collect();
    let unseen: Vec<&String> = planned
        .iter()
        .filter(|p| !deleted.contains_key(*p))
        .collect();
    ensure!(
        unseen.is_empty(),
        "the pod watch saw no DELETED event for {} plan pods, e.g. {:?}",
        unseen.len(),
        unseen.first()
    );
    let outside: Vec<&String> = deleted.keys().filter(|p| !planned.contains(*p)).collect();
    ensure!(
        outside.is_empty(),
        "pods outside the plan were deleted: {outside:?}"
    );
    ensure!(final_rv > 0, "the workflow has a revision");
    let (last_pod, last_delete) = deleted
        .iter()
        .max_by_key(|(_, rv)| **rv)
        .map(|(n, rv)| (n.clone(), *rv))
        .context("deletes")?;

    let reset = workflow_events
        .iter()
        .find(|(_, wf, _)| wf.status.phase.as_deref() != Some("Failed"))
        .context("the workflow watch never saw the workflow leave phase Failed")?;
    ensure!(
        reset.2 > last_delete,
        "the workflow was reset at revision {} (phase {:?}) before plan pod {last_pod} was deleted at revision {last_delete}",
        reset.2,
        reset.1.status.phase
    );
    let earlier: Vec<u64> = workflow_events
        .iter()
        .filter(|(_, _, rv)| *rv < reset.2)
        .map(|(_, _, rv)| *rv)
        .collect();
    tracing::info!(
        last_delete,
        reset = reset.2,
        status_writes_before = earlier.len(),
        "ordering"
    );

    let log = ctl::audit_log(&cluster, &namespace)?;
    let bulk = log
        .iter()
        .filter(|a| a.user == CONTROLLER_NAME && a.verb == "deletecollection")
        .count();
    ensure!(
        bulk >= 1,
        "this test means to cover the bulk path, but the controller sent no deletecollection; its requests: {:?}",
        ctl::summary(&log, CONTROLLER_NAME)
    );
    Ok(())
}

/// Events of one watch, collected in the background from the moment it was made.
struct Watched<K> {
    events: Arc<std::sync::Mutex<Vec<(String, K, u64)>>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    latest: tokio::sync::watch::Receiver<u64>,
}

impl<K> Watched<K> {
    /// Waits until the watch has delivered an event at or past revision `rv`, then returns
    /// the events as (type, object, resourceVersion).
    async fn collect_until(mut self, rv: u64) -> anyhow::Result<Vec<(String, K, u64)>> {
        let reached = tokio::time::timeout(
            Duration::from_secs(10),
            self.latest.wait_for(|seen| *seen >= rv),
        )
        .await
        .is_ok();
        if self.task.is_finished() {
            self.task.await.context("the watch task panicked")??;
            bail!("the watch ended before revision {rv}");
        }
        self.task.abort();
        ensure!(reached, "the watch did not reach revision {rv} within 10s");
        Ok(std::mem::take(
            &mut *self.events.lock().expect("not poisoned"),
        ))
    }
}

fn revision<K: kube::Resource>(object: &K) -> anyhow::Result<u64> {
    let rv = object
        .meta()
        .resource_version
        .as_deref()
        .unwrap_or_default();
    rv.parse()
        .with_context(|| format!("resourceVersion {rv:?} is not a number"))
}

/// Starts a watch from the current revision of what `lp` selects.
async fn watch_from_now<K>(api: Api<K>, lp: ListParams) -> anyhow::Result<Watched<K>>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let start = api
        .list_metadata(&lp.clone().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut wp = WatchParams::default();
    if let Some(labels) = &lp.label_selector {
        wp = wp.labels(labels);
    }
    if let Some(fields) = &lp.field_selector {
        wp = wp.fields(fields);
    }
    let mut stream = api.watch(&wp, &start).await?.boxed();
    let (tx, latest) = tokio::sync::watch::channel(0u64);
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    let task = tokio::spawn(async move {
        while let Some(event) = stream.try_next().await? {
            let (kind, object) = match event {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => bail!("watch error: {e}"),
            };
            let rv = revision(&object)?;
            sink.lock()
                .expect("not poisoned")
                .push((kind.to_owned(), object, rv));
            tx.send_replace(rv);
        }
        Ok(())
    });
    Ok(Watched {
        events,
        task,
        latest,
    })
}

/// Pods held by Argo's `workflows.argoproj.io/status` finalizer: rewind releases that
/// finalizer (and only it) after deleting the pod, and does not reset the workflow while a
/// plan pod is still held by anything else; the shipped pod policy, which lets it change a
/// pod only that way, in force.
pub async fn pods_held_by_argos_finalizer_are_released_and_other_finalizers_respected(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const FOREIGN: &str = "example.com/keep";
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 4,
        succeeded: 1,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let (held, doubly_held) = (&plan.pods_to_delete[0], &plan.pods_to_delete[1]);
    for (name, finalizers) in [
        (held, vec![labels::POD_STATUS_FINALIZER]),
        (doubly_held, vec![FOREIGN, labels::POD_STATUS_FINALIZER]),
    ] {
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("adding finalizers to {name}"))?;
    }
    // The controller's user is held to the shipped pod policy (the local cluster installs
    // deploy/rbac/controller-pod-policy.yaml for it), in force before the controller starts.
    let as_controller = kube::Client::try_from(cluster.config(Role::Controller).await?)?;
    let as_controller: Api<Pod> = Api::namespaced(as_controller, &namespace);
    pod_policy::ensure_refused(
        &as_controller,
        held,
        &pod_policy::add_label(),
        "changes its labels",
    )
    .await
    .context("the controller's user labelling a pod")?;

    let controller = ctl::start(&cluster, &namespace, ctl::options(20, 30, true)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;

    // The pod held only by Argo's finalizer goes; the other stays, without Argo's finalizer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = pods
            .get_opt(doubly_held)
            .await?
            .context("the doubly held pod is kept")?;
        let finalizers = left.finalizers().to_vec();
        if pods.get_opt(held).await?.is_none() && finalizers == [FOREIGN] {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "expected {held} gone and {doubly_held} held only by {FOREIGN}; {doubly_held} has {finalizers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let wf = workflows.get(&dag.name).await?;
    ensure!(
        wf.label(labels::COMPLETED).is_some(),
        "the workflow was reset while plan pod {doubly_held} still existed"
    );

    let release = serde_json::json!({"metadata": {"finalizers": null}});
    pods.patch(
        doubly_held,
        &PatchParams::default(),
        &Patch::Merge(&release),
    )
    .await?;
    let (_, status) = ctl::wait_finished(&workflows, &dag.name, token, FINISH).await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed once the pod was released, got {status:?}"
    );
    let left = ctl::pod_names(
        &cluster,
        &namespace,
        &format!("{}={}", labels::WORKFLOW, dag.name),
    )
    .await?;
    ensure!(
        left.iter().all(|p| !plan.pods_to_delete.contains(p)),
        "plan pods left after the retry: {left:?}"
    );
    controller.stop().await
}

/// Someone else retries the workflow (Argo reopens it: completed label removed, phase label
/// Running) while rewind is deleting its pods: rewind stops, says why, and deletes nothing more.
pub async fn a_workflow_that_runs_again_mid_retry_stops_the_deletions(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 40,
        succeeded: 1,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let selector = format!("{}={}", labels::WORKFLOW, dag.name);
    // Five deletes a second: the whole plan would take 8 s.
    let controller = ctl::start(&cluster, &namespace, ctl::options(5, 1, false)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &dag.name, token).await?;
    let first = &plan.pods_to_delete[0];
    ctl::wait_gone(&pods, first, "the controller (first plan pod)").await?;
    let reopen = serde_json::json!({"metadata": {"labels": {labels::COMPLETED: null, labels::PHASE: "Running"}}});
    workflows
        .patch_metadata(&dag.name, &PatchParams::default(), &Patch::Merge(&reopen))
        .await?;

    let (wf, status) = ctl::wait_finished(&workflows, &dag.name, token, FINISH).await?;
    ensure!(
        status.phase == RetryPhase::Failed && status.message.contains("running again"),
        "expected the retry to stop with a message, got {status:?}"
    );
    ensure!(
        wf.status.phase.as_deref() == Some("Failed"),
        "rewind reset a workflow it had stopped retrying"
    );
    let left = ctl::pod_names(&cluster, &namespace, &selector).await?;
    let plan_left = left
        .iter()
        .filter(|p| plan.pods_to_delete.contains(p))
        .count();
    ensure!(
        plan_left > 0,
        "every plan pod was deleted although the workflow ran again"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = ctl::pod_names(&cluster, &namespace, &selector).await?;
    ensure!(
        later == left,
        "pods were deleted after the request stopped: {left:?} then {later:?}"
    );
    controller.stop().await
}

/// A new `rewind.dev/retry` value while a retry runs: the running request ends as superseded
/// after its deletes, and the new one is served next and resets the workflow once.
pub async fn a_new_token_during_a_retry_is_served_after_it(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 30,
        succeeded: 1,
    };
    let created = dag.create(&admin, &namespace, CONCURRENCY, || ()).await?;
    let plan = ctl::expected_plan(&created)?;
    let controller = ctl::start(&cluster, &namespace, ctl::options(10, 1, false)).await?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    ctl::request_retry(&cluster, &namespace, &dag.name, "first").await?;
    let first_pod = &plan.pods_to_delete[0];
    ctl::wait_gone(&pods, first_pod, "the controller (first plan pod)").await?;
    ctl::request_retry(&cluster, &namespace, &dag.name, "second").await?;

    let (wf, status) = ctl::wait_finished(&workflows, &dag.name, "second", FINISH).await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the second request to succeed, got {status:?}"
    );
    ensure!(
        wf.annotation(annotations::OBSERVED) == Some("second"),
        "expected the second token observed, got {:?}",
        wf.annotation(annotations::OBSERVED)
    );
    let left = ctl::pod_names(
        &cluster,
        &namespace,
        &format!("{}={}", labels::WORKFLOW, dag.name),
    )
    .await?;
    ensure!(
        left.iter().all(|p| !plan.pods_to_delete.contains(p)),
        "plan pods left after the retry: {left:?}"
    );
    let resets = ctl::audit_log(&cluster, &namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "update"
                && a.code == 200
                && a.resource == "workflows"
        })
        .count();
    ensure!(
        resets == 1,
        "expected exactly one reset of the workflow, saw {resets}"
    );
    controller.stop().await
}
