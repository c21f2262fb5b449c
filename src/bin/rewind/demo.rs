//! `rewind demo`: the whole job on a local control plane it starts itself.
//!
//! Starts etcd and kube-apiserver, creates a failed workflow with N failed
//! pods (and some succeeded ones that must survive), starts the controller,
//! retries it as `rewind retry` does (the same code, in-process), then checks
//! and reports the result. Then the same for an archived workflow (unless
//! `--no-archived`): Argo's own code archives it in a local PostgreSQL, the
//! workflow is deleted while its pods stay, and a WorkflowRetry brings it
//! back; the time of each step is printed beside the live retry's.
//!
//! `--compare-raw` measures instead: rewind's retry (asked as `rewind retry`
//! asks, a WorkflowRetry counting the pods) beside one raw DeleteCollection of
//! the same pods, each on a fresh control plane, timed by the API server's
//! audit log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use rewind::argo::workflow::{Workflow, labels};
use rewind::controller::{Controller, RunError};
use rewind::protocol::request::RequestOptions;
use rewind::retry::Scope;
use rewind::telemetry::metrics::Metrics;
use rewind::testenv::localcluster::{LocalCluster, Role};
use rewind::testenv::workload::FailedDag;

use crate::Tuning;

const NAMESPACE: &str = "demo";

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Failed pods the retry must delete.
    #[arg(long, default_value = "8000")]
    pods: usize,
    /// Succeeded pods that must survive the retry.
    #[arg(long, default_value = "200")]
    succeeded: usize,
    /// Keep the control plane running afterwards, until Ctrl-C.
    #[arg(long)]
    keep: bool,
    /// Skip the archived retry (the PostgreSQL part) after the live one.
    #[arg(long)]
    no_archived: bool,
    /// Benchmark: time rewind's retry (with its breakdown) and one raw
    /// DeleteCollection of the same pods, each on a fresh control plane,
    /// alternating which goes first, and print the medians.
    #[arg(long, conflicts_with = "keep")]
    compare_raw: bool,
    /// Repetitions of each side with --compare-raw.
    #[arg(long, default_value = "3", requires = "compare_raw")]
    repetitions: usize,
    /// Show the controller's logs between the progress lines instead of writing them to a file.
    #[arg(short, long)]
    pub verbose: bool,
    #[command(flatten)]
    tuning: Tuning,
}

/// Where the demo's logs go unless `--verbose`: what a person watches shows
/// progress and results, the controller's logs stay available in this file.
pub fn log_file() -> std::path::PathBuf {
    std::env::temp_dir().join("rewind-demo.log")
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.compare_raw {
        return bench::run(&args).await;
    }
    let started = Instant::now();
    if !args.verbose {
        println!("Logs: {} (or run with -v)", log_file().display());
    }
    println!("Starting a local control plane (etcd, kube-apiserver)...");
    let cluster = LocalCluster::start(Default::default())
        .await
        .context("starting the local control plane")?;
    println!(
        "  ready in {:.1}s at {}",
        started.elapsed().as_secs_f64(),
        cluster.server_url()
    );
    let result = match scenario(&cluster, &args).await {
        Ok(live) if !args.no_archived => archived::run(&cluster, &args, live).await,
        other => other.map(drop),
    };
    if args.keep && result.is_ok() {
        println!(
            "\nexport KUBECONFIG={}",
            cluster.kubeconfig_path(Role::Admin).display()
        );
        println!("The control plane keeps running; press Ctrl-C to stop it.");
        tokio::signal::ctrl_c().await?;
    }
    cluster
        .stop()
        .await
        .context("stopping the local control plane")?;
    result
}

/// The controller the demo runs: on its namespace, tuned as asked.
async fn controller(cluster: &LocalCluster, args: &DemoArgs) -> anyhow::Result<Controller> {
    let scope = Scope {
        namespaces: vec![NAMESPACE.into()],
        instance_id: None,
    };
    Ok(Controller::new(
        cluster.config(Role::Controller).await?,
        args.tuning.options(scope, None),
    )?)
}

/// A controller running in this process.
struct Running {
    metrics: Arc<Metrics>,
    /// Stops the controller when dropped, also when the demo ends on an error.
    stop: DropGuard,
    task: JoinHandle<Result<(), RunError>>,
}

impl Running {
    /// Starts `controller` and waits until it is ready.
    async fn start(controller: Controller) -> Self {
        let (metrics, state) = (controller.metrics(), controller.state());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(controller.run(shutdown.clone()));
        while !state.is_ready() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Running {
            metrics,
            stop: shutdown.drop_guard(),
            task,
        }
    }

    /// Stops the controller; its error, if it failed.
    async fn stop(self) -> anyhow::Result<()> {
        let Running { stop, task, .. } = self;
        drop(stop);
        Ok(task.await??)
    }
}

/// The live retry; returns how long it took as the user saw it.
async fn scenario(cluster: &LocalCluster, args: &DemoArgs) -> anyhow::Result<Duration> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "big-retry".into(),
        failed: args.pods,
        succeeded: args.succeeded,
    };

    let total = (args.pods + args.succeeded) as u64;
    let bar = progress(total, "creating pods");
    let setup = Instant::now();
    cluster.create_namespace(NAMESPACE).await?;
    dag.create(&admin, NAMESPACE, 64, || bar.inc(1))
        .await
        .context("creating the demo workflow and its pods")?;
    bar.finish_with_message(format!(
        "created {total} pods in {:.1}s",
        setup.elapsed().as_secs_f64()
    ));

    let running = Running::start(controller(cluster, args).await?).await;
    let before = running.metrics.api_requests();

    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
    // What a user types; the demo runs the same code in-process.
    println!("\nrewind retry {} -n {NAMESPACE}", dag.name);
    let asked = crate::retry::ask_one(
        &workflows,
        NAMESPACE,
        &dag.name,
        &RequestOptions::default(),
        Duration::from_secs(3600),
    )
    .await?;
    let followed =
        crate::retry::follow_asked(&workflows, vec![asked], Duration::from_secs(15)).await;
    let used = running.metrics.api_requests() - before;
    running.stop().await?;
    let outcomes = followed?.context("interrupted (Ctrl-C)")?;
    crate::retry::finish(&outcomes, None)?;
    let outcome = &outcomes[0];
    let (status, elapsed) = (
        outcome.status.clone().context("no status")?,
        outcome.elapsed,
    );

    // Check the result as a user would: failed pods gone, succeeded pods kept, workflow reset.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let left = pods
        .list(&ListParams::default().labels(&format!("{}={}", labels::WORKFLOW, dag.name)))
        .await?
        .items;
    let kept = left
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
        .count();
    ensure!(
        left.len() == args.succeeded && kept == args.succeeded,
        "expected exactly the {} succeeded pods to remain, found {} pods ({kept} succeeded)",
        args.succeeded,
        left.len()
    );
    let wf = workflows.get(&dag.name).await?;
    ensure!(
        wf.label(labels::COMPLETED).is_none(),
        "the workflow was not reset"
    );

    let qps = args.tuning.qps.get() as f64;
    println!(
        "\nRetried {} failed pods in {:.2}s; {} succeeded pods kept.",
        status.pods_total,
        elapsed.as_secs_f64(),
        kept
    );
    println!(
        "API requests by rewind during the retry: {} ({} mutating), bulk delete {}",
        used.total,
        used.mutating,
        if args.tuning.no_bulk { "off" } else { "on" }
    );
    println!(
        "For comparison, one DELETE per pod within the budget needs {:.1}s (N/qps = {}/{qps}).",
        args.pods as f64 / qps,
        args.pods
    );
    Ok(elapsed)
}

fn progress(len: u64, message: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(len).with_message(message);
    bar.set_style(
        ProgressStyle::with_template("  {msg:16} [{bar:40}] {pos}/{len} {elapsed_precise}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

mod archived {
    //! The archived retry: Argo's own code archives a failed workflow in a
    //! local PostgreSQL, the workflow is deleted while its pods stay (owned by
    //! its old UID), and a WorkflowRetry naming that UID brings it back.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use anyhow::{Context as _, ensure};
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt as _;
    use kube::api::{Api, ListParams, PostParams};
    use serde_json::json;

    use rewind::argo::db::{ArgoDatabase, Sql};
    use rewind::argo::workflow::{Workflow, labels};
    use rewind::protocol::crd::{CREATED_BY, WorkflowRetry, WorkflowRetrySpec};
    use rewind::protocol::request::RetryPhase;
    use rewind::testenv::db::DbServer;
    use rewind::testenv::db::argodb::{ArgoDbTool as ArgosCode, ArgoLine};
    use rewind::testenv::localcluster::LocalCluster;
    use rewind::testenv::workload::{FailedDag, delete_workflow, hydrated};

    use super::{DemoArgs, NAMESPACE, Running, progress};

    const WORKFLOW: &str = "big-archived";
    const REQUEST: &str = "big-archived-retry";
    const FINISH: Duration = Duration::from_secs(900);

    pub async fn run(
        cluster: &LocalCluster,
        args: &DemoArgs,
        live: Duration,
    ) -> anyhow::Result<()> {
        println!("\nStarting PostgreSQL; Argo's own migration creates its tables...");
        let started = Instant::now();
        let db = DbServer::postgres()
            .await
            .context("starting PostgreSQL (`bash tools/db/install.sh` installs it)")?;
        let argos_code = tokio::task::spawn_blocking(|| ArgosCode::locate(ArgoLine::V4)).await??;
        let migrate = db.argodb_request("migrate", json!({}));
        let code = argos_code.clone();
        tokio::task::spawn_blocking(move || code.one(migrate)).await??;
        println!(
            "  ready in {:.1}s on 127.0.0.1:{}",
            started.elapsed().as_secs_f64(),
            db.port()
        );
        let result = scenario(cluster, args, live, &db, argos_code).await;
        db.stop();
        result
    }

    async fn scenario(
        cluster: &LocalCluster,
        args: &DemoArgs,
        live: Duration,
        db: &DbServer,
        argos_code: ArgosCode,
    ) -> anyhow::Result<()> {
        let admin = cluster.admin_client();
        let dag = FailedDag {
            name: WORKFLOW.into(),
            failed: args.pods,
            succeeded: args.succeeded,
        };
        let total = (args.pods + args.succeeded) as u64;
        let bar = progress(total, "creating pods");
        let setup = Instant::now();
        dag.create(&admin, NAMESPACE, 64, || bar.inc(1))
            .await
            .context("creating the workflow to archive and its pods")?;
        bar.finish_with_message(format!(
            "created {total} pods in {:.1}s",
            setup.elapsed().as_secs_f64()
        ));

        // What Argo's controller does when a workflow is archived: hydrate, then ArchiveWorkflow.
        let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
        let row = hydrated(workflows.get(WORKFLOW).await?)?;
        let uid = row.uid().context("a created workflow has a UID")?;
        let archive = db.archive_request(&row);
        tokio::task::spawn_blocking(move || argos_code.one(archive)).await??;
        println!("  Argo's ArchiveWorkflow stored {WORKFLOW} (UID {uid}) in PostgreSQL");
        ensure!(
            delete_workflow(&workflows, WORKFLOW, Duration::from_secs(60)).await?,
            "workflow {WORKFLOW} was not deleted within a minute"
        );
        let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
        let selector = ListParams::default().labels(&format!("{}={WORKFLOW}", labels::WORKFLOW));
        let left_behind = pods.list_metadata(&selector).await?.items.len();
        ensure!(
            left_behind as u64 == total,
            "expected the {total} pods of the deleted workflow to stay, found {left_behind}"
        );
        println!(
            "  deleted the live workflow; its {left_behind} pods stay behind, owned by UID {uid}"
        );

        // Argo's database as the workflowretry_db tests give it to the controller.
        let database: Arc<dyn ArgoDatabase> = Arc::new(Sql::connect(&db.persistence()).await?);
        let running = Running::start(
            super::controller(cluster, args)
                .await?
                .with_database(database),
        )
        .await;
        let before = running.metrics.api_requests();

        println!(
            "\nkubectl apply -f - <<EOF\napiVersion: rewind.dev/v1alpha1\nkind: WorkflowRetry\nmetadata: {{name: {REQUEST}, namespace: {NAMESPACE}}}\nspec: {{archivedWorkflowUID: {uid}}}\nEOF"
        );
        let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), NAMESPACE);
        let request = WorkflowRetry::new(
            REQUEST,
            WorkflowRetrySpec {
                archived_workflow_uid: Some(uid.clone()),
                ..Default::default()
            },
        );
        let asked = Instant::now();
        let request_uid = retries
            .create(&PostParams::default(), &request)
            .await?
            .uid()
            .unwrap_or_default();
        let bar = progress(0, "deleting leftovers");
        let finished = loop {
            let object = retries.get(REQUEST).await?;
            let status = object.status.clone().unwrap_or_default();
            if status.pods_total > 0 {
                bar.set_length(status.pods_total);
                bar.set_position(status.pods_deleted);
            }
            if object.is_finished() {
                break status;
            }
            if asked.elapsed() > FINISH {
                bar.abandon();
                anyhow::bail!(
                    "the archived retry did not finish within {FINISH:?}; its status: {status:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let elapsed = asked.elapsed();
        let used = running.metrics.api_requests() - before;
        running.stop().await?;
        ensure!(
            finished.phase == Some(RetryPhase::Succeeded),
            "the archived retry failed: {}",
            finished.message
        );
        bar.finish_with_message(format!("deleted {}", finished.pods_deleted));

        // Check as a user would: failed pods gone, succeeded kept, the workflow back under a new UID.
        let left = pods.list(&selector).await?.items;
        let kept = left
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
            .count();
        ensure!(
            left.len() == args.succeeded && kept == args.succeeded,
            "expected exactly the {} succeeded pods to remain, found {} pods ({kept} succeeded)",
            args.succeeded,
            left.len()
        );
        let created = workflows.get(WORKFLOW).await?;
        ensure!(
            created.annotation(CREATED_BY) == Some(request_uid.as_str())
                && created.uid().as_deref() != Some(uid.as_str()),
            "expected workflow {WORKFLOW} created anew by {REQUEST}"
        );

        let step = |s: Option<f64>| s.map_or_else(|| "?".to_owned(), |s| format!("{s:.2}s"));
        println!(
            "\nRetried archived workflow {WORKFLOW} in {:.2}s: {} leftover pods deleted, {kept} succeeded pods kept, created as UID {}.",
            elapsed.as_secs_f64(),
            finished.pods_deleted,
            created.uid().unwrap_or_default()
        );
        let t = finished.timings.unwrap_or_default();
        println!(
            "  read {} (Argo's row from PostgreSQL), plan {}, delete {}, create {} (status.timings)",
            step(t.read_seconds),
            step(t.plan_seconds),
            step(t.delete_seconds),
            step(t.create_seconds)
        );
        println!(
            "  the live retry of {} failed pods took {:.2}s in this run",
            args.pods,
            live.as_secs_f64()
        );
        println!(
            "API requests by rewind during the archived retry: {} ({} mutating)",
            used.total, used.mutating
        );
        Ok(())
    }
}

mod bench {
    //! rewind beside the floor: one DeleteCollection of the plan's pods.

    use std::path::Path;
    use std::time::{Duration, Instant};

    use anyhow::{Context as _, bail, ensure};
    use kube::api::Api;

    use rewind::client::{ask, follow};
    use rewind::engine::assess::bulk_selectors;
    use rewind::engine::pods::delete_collection;
    use rewind::protocol::crd::WorkflowRetry;
    use rewind::protocol::request::{RequestOptions, RetryPhase};
    use rewind::testenv::bench::audit::{self, Audited, seconds};
    use rewind::testenv::bench::stats::median;
    use rewind::testenv::localcluster::{ADMIN_NAME, CONTROLLER_NAME, LocalCluster, Options};
    use rewind::testenv::workload::FailedDag;

    use super::{DemoArgs, NAMESPACE, Running};

    const WORKFLOW: &str = "big-retry";

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Side {
        Rewind,
        Raw,
    }

    /// rewind's run, from the audit log: seconds of each step and the end-to-end time.
    #[derive(Default)]
    struct Breakdown {
        read_plan: f64,
        list: f64,
        delete: f64,
        confirm: f64,
        commit: f64,
        total: f64,
        workflow_writes: usize,
        requests: usize,
        /// The longest the WorkflowRetry's count stood still once it had risen (s); `None`
        /// when it rose at most once.
        slowest_rise: Option<f64>,
    }

    pub async fn run(args: &DemoArgs) -> anyhow::Result<()> {
        ensure!(args.repetitions > 0, "--repetitions must be at least 1");
        println!(
            "{} failed pods (+{} succeeded) per run; {} repetitions, each side on a fresh control plane",
            args.pods, args.succeeded, args.repetitions
        );
        let mut rewind = Vec::new();
        let mut raw = Vec::new();
        for rep in 0..args.repetitions {
            let order = if rep % 2 == 0 {
                [Side::Rewind, Side::Raw]
            } else {
                [Side::Raw, Side::Rewind]
            };
            for side in order {
                let cluster = LocalCluster::start(Options {
                    audit: true,
                    ..Options::default()
                })
                .await
                .context("starting a local control plane")?;
                let result = once(&cluster, args, side).await;
                cluster
                    .stop()
                    .await
                    .context("stopping the local control plane")?;
                match (side, result?) {
                    (Side::Rewind, Measured::Rewind(b)) => {
                        println!(
                            "  run {}: rewind {:6.2}s  (read+plan {:.2}, list {:.2}, delete {:.2}, confirm gone {:.2}, commit {:.2}; workflow writes {}, API requests {}; the count stood still at most {})",
                            rep + 1,
                            b.total,
                            b.read_plan,
                            b.list,
                            b.delete,
                            b.confirm,
                            b.commit,
                            b.workflow_writes,
                            b.requests,
                            still(b.slowest_rise)
                        );
                        rewind.push(b);
                    }
                    (Side::Raw, Measured::Raw(seconds)) => {
                        println!("  run {}: raw    {seconds:6.2}s", rep + 1);
                        raw.push(seconds);
                    }
                    _ => unreachable!("each side measures itself"),
                }
            }
        }
        let med = |f: &dyn Fn(&Breakdown) -> f64| median(rewind.iter().map(f).collect());
        let (rewind_total, raw_total) = (med(&|b| b.total), median(raw.clone()));
        println!(
            "\nmedians: rewind {rewind_total:.2}s = read+plan {:.2} + list {:.2} + delete {:.2} + confirm gone {:.2} + commit {:.2} (+ gaps); raw DeleteCollection {raw_total:.2}s; ratio {:.3}",
            med(&|b| b.read_plan),
            med(&|b| b.list),
            med(&|b| b.delete),
            med(&|b| b.confirm),
            med(&|b| b.commit),
            rewind_total / raw_total
        );
        println!(
            "rewind wrote the workflow object at most {} times in a retry; its WorkflowRetry's count stood still at most {} once it had started",
            rewind.iter().map(|b| b.workflow_writes).max().unwrap_or(0),
            still(
                rewind
                    .iter()
                    .filter_map(|b| b.slowest_rise)
                    .reduce(f64::max)
            )
        );
        Ok(())
    }

    fn still(slowest: Option<f64>) -> String {
        slowest.map_or_else(
            || "– (it rose at most once)".to_owned(),
            |s| format!("{s:.2}s"),
        )
    }

    enum Measured {
        Rewind(Breakdown),
        Raw(f64),
    }

    async fn once(cluster: &LocalCluster, args: &DemoArgs, side: Side) -> anyhow::Result<Measured> {
        let admin = cluster.admin_client();
        cluster.create_namespace(NAMESPACE).await?;
        // rewind runs before the workflow fails, as where it is deployed: started after the
        // pods, its first watch of a resource whose API server cache is still starting can
        // be told to wait (429, Retry-After 1 s), which would be timed as the retry's.
        let controller = match side {
            Side::Rewind => Some(Running::start(super::controller(cluster, args).await?).await),
            Side::Raw => None,
        };
        let dag = FailedDag {
            name: WORKFLOW.into(),
            failed: args.pods,
            succeeded: args.succeeded,
        };
        dag.create(&admin, NAMESPACE, 64, || ())
            .await
            .context("creating the workflow and its pods")?;
        let log = cluster
            .audit_log_path()
            .context("the control plane audits")?;
        match controller {
            None => {
                // The same request rewind sends: selectors and a metadata-only answer.
                let (labels, fields) = bulk_selectors(WORKFLOW);
                let n = delete_collection(&admin, NAMESPACE, &labels, &fields).await?;
                ensure!(
                    n == args.pods,
                    "the raw DeleteCollection deleted {n} pods, expected {}",
                    args.pods
                );
                let dc = audit(&log)?
                    .into_iter()
                    .find(|a| a.user == ADMIN_NAME && a.verb == "deletecollection")
                    .context("the audit log has no deletecollection")?;
                Ok(Measured::Raw(seconds(dc.received, dc.completed)))
            }
            Some(controller) => {
                let slowest_rise = retry(controller, cluster).await?;
                Ok(Measured::Rewind(Breakdown {
                    slowest_rise,
                    ..breakdown(&audit(&log)?)?
                }))
            }
        }
    }

    /// Asks the controller for one retry; returns once it is reported, with the longest
    /// the count its WorkflowRetry shows (read as often as `rewind retry` reads it) went
    /// without rising once it had started.
    async fn retry(controller: Running, cluster: &LocalCluster) -> anyhow::Result<Option<f64>> {
        // Asked as `rewind retry` asks for one workflow: a WorkflowRetry, whose
        // status counts the pods as the API server deletes them.
        let retries: Api<WorkflowRetry> = Api::namespaced(cluster.admin_client(), NAMESPACE);
        let (asked, _) = ask::ask_object(
            &retries,
            NAMESPACE,
            ask::Target::Live(WORKFLOW),
            &RequestOptions::default(),
            Duration::from_secs(3600),
            None,
            false,
        )
        .await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        // When the count last rose, and the longest it then stood still.
        let (mut count, mut rose, mut slowest) = (0, None::<Instant>, None::<f64>);
        let status = loop {
            let object = retries.get_status(&asked.token).await?;
            if let Some(status) = object.status {
                if status.pods_deleted > count {
                    let now = Instant::now();
                    if let Some(at) = rose {
                        let gap = (now - at).as_secs_f64();
                        slowest = Some(slowest.map_or(gap, |s| s.max(gap)));
                    }
                    (count, rose) = (status.pods_deleted, Some(now));
                }
                if status.phase.is_some_and(RetryPhase::is_finished) {
                    break status;
                }
            }
            ensure!(
                Instant::now() < deadline,
                "the retry did not finish within 10 minutes"
            );
            tokio::time::sleep(follow::POLL_INTERVAL).await;
        };
        controller.stop().await?;
        if status.phase != Some(RetryPhase::Succeeded) {
            bail!("the retry failed: {}", status.message);
        }
        Ok(slowest)
    }

    /// rewind's steps as the API server saw them: from the user's request to the first list of
    /// pods (read and plan), to the DeleteCollection (list), its answer (delete), the commit
    /// (confirm gone) and the commit's answer.
    fn breakdown(log: &[Audited]) -> anyhow::Result<Breakdown> {
        let asked = log
            .iter()
            .find(|a| a.user == ADMIN_NAME && a.verb == "create" && a.resource == "workflowretries")
            .context("the audit log has no retry request")?;
        let ours: Vec<&Audited> = log
            .iter()
            .filter(|a| a.user == CONTROLLER_NAME && a.received >= asked.received)
            .collect();
        let find = |verb: &str, resource: &str| {
            ours.iter()
                .find(|a| a.verb == verb && a.resource == resource)
                .copied()
                .with_context(|| format!("the controller sent no {verb} of {resource}"))
        };
        let list = find("list", "pods")?;
        let bulk = find("deletecollection", "pods")?;
        let commit = find("update", "workflows")?;
        Ok(Breakdown {
            read_plan: seconds(asked.received, list.received),
            list: seconds(list.received, bulk.received),
            delete: seconds(bulk.received, bulk.completed),
            confirm: seconds(bulk.completed, commit.received),
            commit: seconds(commit.received, commit.completed),
            total: seconds(asked.received, commit.completed),
            workflow_writes: ours
                .iter()
                .filter(|a| {
                    a.resource == "workflows" && matches!(a.verb.as_str(), "patch" | "update")
                })
                .count(),
            requests: ours
                .iter()
                .filter(|a| a.received <= commit.completed && a.verb != "watch")
                .count(),
            slowest_rise: None,
        })
    }

    /// The requests on the demo's namespace, in the order the server received them.
    fn audit(path: &Path) -> anyhow::Result<Vec<Audited>> {
        Ok(audit::read(path)?
            .into_iter()
            .filter(|a| a.namespace == super::NAMESPACE)
            .collect())
    }
}
