//! The batch rows (`--rows rewind-batch,peer-batch`): `--batch WxP`, W failed workflows of P
//! failed pods each (and `--succeeded` succeeded ones each, which must stay), all labelled
//! team=ml in one namespace, retried by one command:
//!
//! - `rewind-batch`: `rewind retry -l team=ml`, the product's CLI (one request per workflow,
//!   all with one token: one asker), the controller at 20/30; timed from the command's start
//!   until every workflow's reset is seen on a watch. `--small-after` seconds after the
//!   command started, a second user (another identity, another token: another asker) asks
//!   for the retry of a workflow of `--small-pods` failed pods in the same namespace, timed
//!   from its request to its reset;
//! - `peer-batch`: Argo's `argo retry -l team=ml` through an Argo Server: the peer lists
//!   with the server's ListWorkflows and calls its RetryWorkflow once per workflow, one
//!   after another, each call with clients of its own at the Argo Server's 20/30, as its
//!   default auth mode (client) serves every call (tools/peer).
//!
//! Every workflow is checked as a single row's is: its failed pods gone, its succeeded ones
//! kept, and (rewind) its reset equal to the planner's retry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::rbac::v1::{Role as RbacRole, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use rewind::argo::workflow::Workflow;
use rewind::protocol::request::{self, RetryPhase, annotations};
use rewind::testenv::bench::audit::{self, Audited};
use rewind::testenv::bench::batch::{Batch, SmallRetry};
use rewind::testenv::bench::child::{Finished, run_measured};
use rewind::testenv::bench::usage::Usage;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role, USER_NAME};
use rewind::testenv::workload::{FailedDag, hydrated};

use super::{Context, FINISH, NAMESPACE, Row, check_reset, run_peer};

/// The label every workflow of the batch carries, and the command selects.
const TEAM: (&str, &str) = ("team", "ml");
/// The second user's workflow: not the team's.
const SMALL: &str = "small-retry";
/// Workflows created at once (each creating its pods 64 at a time).
const CREATING: usize = 4;

/// `--batch`: how many workflows, of how many failed pods each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub workflows: usize,
    pub pods: usize,
}

impl Shape {
    /// Failed pods in all: the batch rows' N.
    pub fn total(self) -> usize {
        self.workflows * self.pods
    }
}

impl std::str::FromStr for Shape {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Shape> {
        let (workflows, pods) = super::by(s, "--batch", "WORKFLOWSxPODS, e.g. 200x100")?;
        Ok(Shape { workflows, pods })
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.workflows, self.pods)
    }
}

/// The batch rows' flags.
pub struct Options {
    pub shape: Shape,
    /// Failed pods of the second user's workflow; 0 for no second user.
    pub small_pods: usize,
    /// When the second user asks, from the batch command's start.
    pub small_after: Duration,
}

/// The workflows as created, before any retry.
pub struct Prepared {
    batch: Vec<Workflow>,
    small: Option<Workflow>,
}

/// Creates the team's workflows and the second user's (its rights to ask for a retry
/// there: patch workflows, as `rewind retry` needs), in [`NAMESPACE`].
pub async fn prepare(cluster: &LocalCluster, context: &Context) -> anyhow::Result<Prepared> {
    let admin = cluster.admin_client();
    let options = &context.batch;
    let team: BTreeMap<String, String> = [(TEAM.0.to_owned(), TEAM.1.to_owned())].into();
    let width = options.shape.workflows.to_string().len();
    let dags: Vec<FailedDag> = (0..options.shape.workflows)
        .map(|i| FailedDag {
            name: format!("batch-{i:0width$}"),
            failed: options.shape.pods,
            succeeded: context.succeeded,
        })
        .collect();
    let started = std::time::Instant::now();
    let batch: Vec<Workflow> = stream::iter(&dags)
        .map(|dag| async {
            let created = dag.create_labelled(&admin, NAMESPACE, &team, 64).await?;
            anyhow::Ok(hydrated(created)?)
        })
        .buffered(CREATING)
        .try_collect()
        .await
        .context("creating the team's workflows and their pods")?;
    let small = match options.small_pods {
        0 => None,
        pods => {
            let dag = FailedDag {
                name: SMALL.into(),
                failed: pods,
                succeeded: context.succeeded,
            };
            Some(hydrated(dag.create(&admin, NAMESPACE, 64, || ()).await?)?)
        }
    };
    println!(
        "  created {} workflows of {} failed + {} succeeded pods{} in {:.1}s",
        batch.len(),
        options.shape.pods,
        context.succeeded,
        small
            .as_ref()
            .map_or_else(String::new, |_| format!(", and {SMALL}")),
        started.elapsed().as_secs_f64()
    );
    let role: RbacRole = serde_json::from_value(json!({
        "metadata": {"name": "retry-workflows"},
        "rules": [{"apiGroups": ["argoproj.io"], "resources": ["workflows"],
                   "verbs": ["get", "list", "watch", "patch"]}],
    }))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "retry-workflows"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "retry-workflows"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER_NAME}],
    }))?;
    let pp = PostParams::default();
    Api::<RbacRole>::namespaced(admin.clone(), NAMESPACE)
        .create(&pp, &role)
        .await?;
    Api::<RoleBinding>::namespaced(admin, NAMESPACE)
        .create(&pp, &binding)
        .await?;
    Ok(Prepared { batch, small })
}

/// What [`retry`] measured of a batch; the audit log adds the rest ([`Ran::measured`]).
pub struct Ran {
    command_seconds: f64,
    command_usage: Option<Usage>,
    command_failed: Option<String>,
    /// The second user's: pods, asked after (s), request → reset (s).
    small: Option<(usize, f64, f64)>,
}

/// Runs `row`'s command over the batch and waits until every workflow is reset; returns
/// the wall seconds, the peer's usage and what else it measured.
pub async fn retry(
    cluster: &LocalCluster,
    context: &Context,
    row: Row,
    prepared: &Prepared,
) -> anyhow::Result<(f64, Option<Usage>, Ran)> {
    let selector = format!("{}={}", TEAM.0, TEAM.1);
    match row {
        Row::PeerBatch => {
            let (seconds, usage) =
                run_peer(cluster, context, row, &["retry", "--selector", &selector]).await?;
            let ran = Ran {
                command_seconds: seconds,
                command_usage: None,
                command_failed: None,
                small: None,
            };
            Ok((seconds, Some(usage), ran))
        }
        Row::RewindBatch => rewind(cluster, context, prepared, &selector).await,
        _ => bail!("{row} is not a batch row"),
    }
}

/// `rewind retry -l SELECTOR`, and meanwhile the second user's retry.
async fn rewind(
    cluster: &LocalCluster,
    context: &Context,
    prepared: &Prepared,
    selector: &str,
) -> anyhow::Result<(f64, Option<Usage>, Ran)> {
    let mut ends = ends(cluster.admin_client()).await?;
    let mut command = Command::new(&context.rewind);
    command
        .args(["retry", "-l", selector, "-n", NAMESPACE, "--kubeconfig"])
        .arg(cluster.kubeconfig_path(Role::Admin));
    let started = Instant::now();
    let cli = tokio::task::spawn_blocking(move || run_measured(command));
    let small = prepared.small.as_ref().map(|small| {
        let user = Api::<Workflow>::namespaced(cluster.user_client(), NAMESPACE);
        let name = small.name_any();
        let at = started + context.batch.small_after;
        async move {
            tokio::time::sleep_until(at).await;
            // Its own token: another asker than the batch's.
            let patch = json!({"metadata": {"annotations": {annotations::RETRY: "second-user"}}});
            let asked = Instant::now();
            user.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("{USER_NAME} asking for the retry of {name}"))?;
            anyhow::Ok(asked)
        }
    });
    let small_asked = async {
        match small {
            Some(ask) => ask.await.map(Some),
            None => Ok(None),
        }
    };
    // Every workflow's end, as the watch sees it.
    let mut waiting: HashSet<String> = prepared
        .batch
        .iter()
        .chain(&prepared.small)
        .map(|w| w.name_any())
        .collect();
    let mut ended: HashMap<String, Instant> = HashMap::new();
    let all_ended = async {
        while !waiting.is_empty() {
            let (name, status, at) = ends
                .recv()
                .await
                .context("the watch of the workflows ended")?;
            if !waiting.remove(&name) {
                continue;
            }
            ensure!(
                status.phase == RetryPhase::Succeeded,
                "the retry of {name} failed: {}",
                status.message
            );
            ended.insert(name, at);
        }
        anyhow::Ok(())
    };
    let (small_asked, all_ended) =
        tokio::time::timeout(FINISH, async { tokio::join!(small_asked, all_ended) })
            .await
            .with_context(|| format!("the batch did not finish within {FINISH:?}"))?;
    all_ended?;
    let small_asked = small_asked?;
    let finished = cli.await??;
    // Kept, not fatal: every workflow is checked whatever the command said.
    let command_failed = (!finished.success).then(|| said(&finished));
    let wall = prepared
        .batch
        .iter()
        .map(|w| ended[&w.name_any()])
        .max()
        .context("a batch has workflows")?
        .duration_since(started)
        .as_secs_f64();
    let small = prepared.small.as_ref().zip(small_asked).map(|(w, asked)| {
        (
            context.batch.small_pods,
            asked.duration_since(started).as_secs_f64(),
            ended[&w.name_any()].duration_since(asked).as_secs_f64(),
        )
    });
    let ran = Ran {
        command_seconds: finished.wall.as_secs_f64(),
        command_usage: Some(finished.usage),
        command_failed,
        small,
    };
    Ok((wall, None, ran))
}

/// What a failed command said, short: its exit status, its error, and its first failed
/// workflow's outcome to the end of its first sentence.
fn said(finished: &Finished) -> String {
    let error = finished
        .stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("Error:"))
        .unwrap_or_default();
    let first = finished
        .stdout
        .lines()
        .find(|l| l.contains(": failed: "))
        .map(|l| l.split_inclusive(". ").next().unwrap_or(l).trim_end())
        .unwrap_or_default();
    format!("{}; {error} (the first: {first})", finished.status)
}

/// Watches [`NAMESPACE`]'s workflows (metadata only) and sends each request's end: the
/// workflow, its status, when it was seen. Returns once the watch has listed them. The watch
/// ends when the receiver is dropped: one left running past its run retried its watch of a
/// control plane gone, without pause, and slowed each later run on the machine more (three
/// runs' batches took 50.9, 65.5 and 76.7 s, the second user's retry 1.61, 4.48 and 6.30 s).
async fn ends(
    admin: kube::Client,
) -> anyhow::Result<mpsc::UnboundedReceiver<(String, request::RetryStatus, Instant)>> {
    let api: Api<PartialObjectMeta<Workflow>> = Api::namespaced(admin, NAMESPACE);
    let (send, receive) = mpsc::unbounded_channel();
    let (listed, on_list) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        loop {
            let event = tokio::select! {
                _ = send.closed() => return,
                event = events.next() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            let meta = match event {
                Ok(Event::InitDone) => {
                    listed.take().map(|l| l.send(()));
                    continue;
                }
                Ok(Event::Apply(meta) | Event::InitApply(meta)) => meta,
                _ => continue,
            };
            let annotations = meta.annotations();
            let status = request::token(annotations)
                .and_then(|token| request::status_of(annotations, &token).ok().flatten())
                .filter(|s| s.phase.is_finished());
            if let Some(status) = status
                && send
                    .send((meta.name_any(), status, Instant::now()))
                    .is_err()
            {
                return;
            }
        }
    });
    on_list
        .await
        .context("the watch of the workflows ended before it listed them")?;
    Ok(receive)
}

/// Whether the controller's request `a` is about the second user's workflow (it, or an Event
/// on it): left out of the batch's steps and request counts. Its pod list and DeleteCollection
/// name no object, and stay in.
pub fn second_users(a: &Audited) -> bool {
    a.name
        .strip_prefix(SMALL)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

impl Ran {
    /// With what the audit log says: the busiest second of the `retrier`'s requests (all of
    /// them since the batch was asked), and the second user's request to its reset.
    pub fn measured(self, retrier: &[&Audited], log: &[Audited], shape: Shape) -> Batch {
        let sent: Vec<&Audited> = retrier
            .iter()
            .copied()
            .filter(|a| a.verb != "watch")
            .collect();
        let small = self.small.map(|(pods, asked_after_seconds, wall_seconds)| {
            let asked = log.iter().find(|a| {
                a.user == USER_NAME
                    && a.verb == "patch"
                    && a.resource == "workflows"
                    && a.name == SMALL
            });
            let reset = log.iter().find(|a| {
                a.user == CONTROLLER_NAME
                    && a.verb == "update"
                    && a.resource == "workflows"
                    && a.name == SMALL
            });
            SmallRetry {
                pods,
                asked_after_seconds,
                wall_seconds,
                audit_seconds: asked
                    .zip(reset)
                    .map(|(a, r)| audit::seconds(a.received, r.completed)),
            }
        });
        Batch {
            workflows: shape.workflows,
            pods_each: shape.pods,
            command_seconds: self.command_seconds,
            command_usage: self.command_usage,
            command_failed: self.command_failed,
            busiest_writes: audit::busiest_second(sent.iter().copied().filter(|a| a.is_mutating())),
            busiest_requests: audit::busiest_second(sent),
            small,
        }
    }
}

/// Every workflow retried as a single row's is: its failed pods gone, its succeeded ones
/// kept, reset (and by rewind as its planner would); the second user's too, where rewind ran.
pub async fn check(
    cluster: &LocalCluster,
    context: &Context,
    row: Row,
    prepared: &Prepared,
    asked_at: Timestamp,
) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), NAMESPACE);
    let rewind = row == Row::RewindBatch;
    let small = prepared.small.iter().filter(|_| rewind);
    for original in prepared.batch.iter().chain(small) {
        let name = original.name_any();
        let failed = match name == SMALL {
            true => context.batch.small_pods,
            false => context.batch.shape.pods,
        };
        super::check(cluster, row, &name, failed, context.succeeded, None, None).await?;
        if rewind {
            check_reset(context, &workflows, original, asked_at)
                .await
                .with_context(|| format!("workflow {name}"))?;
        }
    }
    Ok(())
}
