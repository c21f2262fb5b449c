//! `rewind demo`: the whole job on a local control plane it starts itself.
//!
//! Starts etcd and kube-apiserver, creates a failed workflow with N failed
//! pods (and some succeeded ones that must survive), starts the controller,
//! retries it as `rewind retry` does (the same code, in-process), then checks
//! and reports the result.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio_util::sync::CancellationToken;

use rewind::controller::Controller;
use rewind::follow;
use rewind::request::RequestOptions;
use rewind::testenv::localcluster::{LocalCluster, Role};
use rewind::testenv::workload::FailedDag;
use rewind::watch::Scope;
use rewind::workflow::{Workflow, labels};

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
    let result = scenario(&cluster, &args).await;
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

async fn scenario(cluster: &LocalCluster, args: &DemoArgs) -> anyhow::Result<()> {
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

    let scope = Scope {
        namespaces: vec![NAMESPACE.into()],
        instance_id: None,
    };
    let controller = Controller::new(
        cluster.config(Role::Controller).await?,
        args.tuning.options(scope, None),
    )?;
    let (metrics, state) = (controller.metrics(), controller.state());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(controller.run(shutdown.clone()));
    while !state.is_ready() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = metrics.api_requests();

    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
    // What a user types; the demo runs the same code in-process.
    println!("\nrewind retry {} -n {NAMESPACE}", dag.name);
    let asked = follow::ask(&workflows, NAMESPACE, &dag.name, &RequestOptions::default()).await?;
    let followed =
        crate::retry::follow_asked(&workflows, vec![asked], Duration::from_secs(15)).await;
    let used = metrics.api_requests() - before;
    shutdown.cancel();
    running.await??;
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
    Ok(())
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
