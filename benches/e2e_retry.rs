//! The large end-to-end run, a benchmark rather than a test: a DAG fanning out to `--pods`
//! pods (every other one failing on the first run) under Argo's own workflow-controller,
//! retried once by rewind and once by Argo's retry code (tools/peer, the Argo Server's
//! RetryWorkflow), one after the other on the same control plane. Prints, per side, the time
//! from the retry request to the reset workflow written and to the workflow Succeeded.
//!
//!     cargo bench --features testenv --bench e2e_retry -- --pods 2000
//!
//! Options: --pods N (2000), --rewind-qps/--rewind-burst (20/30, rewind's default write
//! budget), --argo-qps/--argo-burst (20/30 as the Argo Server; 5/10 as `argo retry` in kube
//! mode), --controller-qps/--controller-burst (Argo's workflow-controller, 20/30 as Argo
//! ships it; it recreates the reset pods on both sides alike), --archived (Argo's controller
//! archives to PostgreSQL; the failed workflow is deleted with its pods and retried from the
//! archive: a WorkflowRetry against the Argo Server's RetryArchivedWorkflow).

// The end-to-end tests' runner; its Argo-API client hook (ApiCall) is the tests' alone.
#[allow(dead_code)]
#[path = "../tests/e2e/run.rs"]
mod run;

use std::time::Duration;

use anyhow::ensure;
use rewind::argo::workflow::Workflow;
use rewind::testenv::argo::{self, ArgoController};
use rewind::testenv::bench::cli;
use rewind::testenv::db::DbServer;
use rewind::testenv::localcluster::{LocalCluster, Options};

use run::{Budgets, Retry, Scenario};

/// A large DAG under Argo's workflow-controller, retried by rewind and by Argo's retry code.
#[derive(clap::Parser)]
struct Args {
    /// Pods the DAG fans out to (every other one fails on the first run).
    #[arg(long, default_value = "2000")]
    pods: usize,
    /// rewind's write budget: qps.
    #[arg(long, value_name = "QPS", default_value_t = Budgets::default().rewind_qps)]
    rewind_qps: u32,
    /// rewind's write budget: burst.
    #[arg(long, value_name = "BURST", default_value_t = Budgets::default().rewind_burst)]
    rewind_burst: u32,
    /// Argo's retry client's qps (20 as the Argo Server, 5 as `argo retry` in kube mode).
    #[arg(long, value_name = "QPS", default_value_t = Budgets::default().argo_qps)]
    argo_qps: u32,
    /// Argo's retry client's burst (30 as the Argo Server, 10 as `argo retry` in kube mode).
    #[arg(long, value_name = "BURST", default_value_t = Budgets::default().argo_burst)]
    argo_burst: u32,
    /// Argo's workflow-controller's qps (as Argo ships it).
    #[arg(long, value_name = "QPS", default_value = "20")]
    controller_qps: u32,
    /// Argo's workflow-controller's burst (as Argo ships it).
    #[arg(long, value_name = "BURST", default_value = "30")]
    controller_burst: u32,
    /// Archive to PostgreSQL, delete the failed workflow and retry it from the archive.
    #[arg(long)]
    archived: bool,
}

impl Args {
    fn budgets(&self) -> Budgets {
        Budgets {
            rewind_qps: self.rewind_qps,
            rewind_burst: self.rewind_burst,
            argo_qps: self.argo_qps,
            argo_burst: self.argo_burst,
        }
    }
}

fn scenario(pods: usize, mode: run::Mode) -> Scenario {
    let yaml = format!(
        r#"apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: placeholder
spec:
  entrypoint: main
  templates:
  - name: main
    dag:
      tasks:
      - name: fan
        template: work
        withSequence: {{count: "{pods}"}}
  - name: work
    container:
      image: busybox
      command: ["true"]
"#
    );
    let workflow: Workflow = serde_yaml_ng::from_str(&yaml).expect("a valid workflow");
    Scenario {
        name: "large".into(),
        workflow,
        fails: (0..pods)
            .step_by(2)
            .map(|i| format!(".fan({i}:{i})"))
            .collect(),
        retry: Retry::default(),
        timeout: Duration::from_secs(3600),
        argo_version: rewind::argo::plan::ArgoVersion::V4,
        instance_id: None,
        mode,
        // Set from the running controller's ConfigMap.
        argo_configmap: None,
    }
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let peer = tokio::task::spawn_blocking(|| argo::binary("peer")).await??;
    let cluster = LocalCluster::start(Options {
        scheduling: true,
        ..Options::default()
    })
    .await?;
    let db = match args.archived {
        true => Some(DbServer::postgres().await?),
        false => None,
    };
    let controller = ArgoController::start(
        &cluster,
        &argo::Options {
            qps: args.controller_qps,
            burst: args.controller_burst,
            persistence: db.as_ref().map(|db| argo::Persistence {
                database: db.argo_db_config(),
                archive: true,
                offload: false,
            }),
            ..argo::Options::default()
        },
    )
    .await?;
    let mut scenario = scenario(
        args.pods,
        match args.archived {
            true => run::Mode::Archived,
            false => run::Mode::Live,
        },
    );
    if args.archived {
        scenario.argo_configmap = Some(controller.configmap());
    }
    let outcome = run::run(&cluster, &peer, &scenario, args.budgets(), true, None).await;
    controller.stop().await?;
    if let Some(db) = db {
        db.stop();
    }
    cluster.stop().await?;
    let outcome = outcome?;
    let b = args.budgets();
    println!(
        "{} pods ({} failed){}; Argo workflow-controller {}/{}",
        outcome.rewind.before.len(),
        outcome.rewind.before_in("Failed").len(),
        match args.archived {
            true => ", archived and deleted with its pods",
            false => "",
        },
        args.controller_qps,
        args.controller_burst
    );
    println!(
        "| retried by | budget (qps/burst) | pods replaced | request → reset written | request → Succeeded | nodes offloaded (failed, final) |"
    );
    println!("|---|---|---|---|---|---|");
    for (who, qps, burst, side) in [
        ("rewind", b.rewind_qps, b.rewind_burst, &outcome.rewind),
        (
            match args.archived {
                true => "Argo RetryArchivedWorkflow",
                false => "Argo RetryWorkflow",
            },
            b.argo_qps,
            b.argo_burst,
            &outcome.argo,
        ),
    ] {
        println!(
            "| {who} (namespace {}) | {qps}/{burst} | {} | {:.1} s | {:.1} s | {:?} |",
            side.namespace,
            side.fates().replaced.len(),
            side.reset_took.as_secs_f64(),
            side.retry_took.as_secs_f64(),
            side.offloaded
        );
        ensure!(
            side.refused.is_none(),
            "{who} refused a retry: {:?}",
            side.refused
        );
    }
    let (rewind, argo) = (outcome.rewind.fates(), outcome.argo.fates());
    ensure!(
        rewind == argo,
        "rewind and Argo's retry replaced different pods"
    );
    let differences = run::differences(&outcome.rewind.workflow, &outcome.argo.workflow)?;
    ensure!(
        differences.is_empty(),
        "the final workflows differ:\n{}",
        differences.join("\n")
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Some((args, _)) = cli::parse::<Args>("e2e_retry") else {
        println!(
            "e2e_retry is a benchmark: cargo bench --features testenv --bench e2e_retry -- --pods 2000"
        );
        return Ok(());
    };
    cli::init_logging();
    tokio::runtime::Runtime::new()?.block_on(bench(args))
}
