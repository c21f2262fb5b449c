use std::net::SocketAddr;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use rewind::controller::{self, Scope};
use rewind::telemetry::{self, LogFormat};

/// Retries failed Argo Workflows, live and archived, fast and politely.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t, env = "REWIND_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (kubeconfig rules as kubectl's, or in-cluster config).
    Controller(ControllerArgs),
}

#[derive(clap::Args)]
struct ControllerArgs {
    /// Namespace to watch (repeatable); all namespaces when omitted.
    #[arg(long = "namespace", short = 'n', env = "REWIND_NAMESPACES", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Serve only workflows with this workflows.argoproj.io/controller-instanceid label.
    #[arg(long, env = "REWIND_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Address for /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080", env = "REWIND_HTTP_ADDR")]
    http_addr: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format, "info,kube=warn");
    match cli.command {
        Command::Controller(args) => run_controller(args).await,
    }
}

async fn run_controller(args: ControllerArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (set KUBECONFIG, or run in a pod with a ServiceAccount)")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    let state = controller::State::default();
    let scope = Scope { namespaces: args.namespaces, instance_id: args.instance_id };
    let server = tokio::spawn(rewind::server::serve(args.http_addr, state.clone(), shutdown.clone()));
    controller::run(client, scope, state, shutdown.clone()).await;
    shutdown.cancel();
    server
        .await?
        .with_context(|| format!("serving HTTP on {}", args.http_addr))?;
    tracing::info!("stopped");
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM, so Kubernetes' pod termination stops us cleanly.
async fn cancel_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("signal received, shutting down");
    token.cancel();
}
