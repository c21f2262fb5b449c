//! `rewind local-cluster`: run a local control plane until Ctrl-C or SIGTERM.

use std::path::PathBuf;

use tokio::signal::unix::{SignalKind, signal};

use super::{Error, LocalCluster, Options, Role};

/// Starts a cluster (in `dir` if given, else in a temporary directory), prints how to use
/// it, waits for SIGINT or SIGTERM and stops it cleanly.
pub async fn run_until_signal(options: Options, dir: Option<PathBuf>) -> Result<(), Error> {
    // Listening before starting, so a signal during startup is not lost.
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let started = std::time::Instant::now();
    let start = async {
        match dir {
            Some(dir) => LocalCluster::start_in(options, dir).await,
            None => LocalCluster::start(options).await,
        }
    };
    let cluster = tokio::select! {
        cluster = start => cluster?,
        _ = interrupt.recv() => return Ok(()),
        _ = terminate.recv() => return Ok(()),
    };
    let admin = cluster.kubeconfig_path(Role::Admin);
    let user = cluster.kubeconfig_path(Role::User);
    println!(
        "Local control plane ready in {:.1?} at {}",
        started.elapsed(),
        cluster.server_url()
    );
    println!("Files and logs: {}", cluster.dir().display());
    println!("Admin kubeconfig: {}", admin.display());
    println!("User kubeconfig ({}): {}", super::USER_NAME, user.display());
    println!();
    println!("export KUBECONFIG={}", admin.display());
    println!("# or, as the unprivileged user:");
    println!("# export KUBECONFIG={}", user.display());
    println!();
    println!("Press Ctrl-C to stop.");
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    println!("Stopping the local control plane...");
    cluster.stop().await
}
