//! The real `rewind` binary's controller, run as a process: started, waited for, and
//! measured from outside.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rewind::testenv::localcluster::{LocalCluster, Role};
use tokio::process::{Child, Command};

/// The real binary serving `namespaces` (comma-separated) signed in with `kubeconfig`,
/// logging JSON, its HTTP server on a free port: what every test that runs the controller
/// as a process starts from.
pub fn controller_command(kubeconfig: &Path, namespaces: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
    command
        .args([
            "--log-format",
            "json",
            "controller",
            "--namespace",
            namespaces,
        ])
        .args(["--http-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn");
    command
}

/// The real binary serving `namespaces` with the controller's credentials, logging JSON to
/// `log`, with `args` (budget flags, Argo's ConfigMap...); killed when dropped.
pub fn spawn_controller(
    cluster: &LocalCluster,
    namespaces: &[&str],
    log: &Path,
    args: &[&str],
) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    controller_command(
        &cluster.kubeconfig_path(Role::Controller),
        &namespaces.join(","),
    )
    .args(args)
    .stdin(Stdio::null())
    .stdout(out.try_clone()?)
    .stderr(out)
    .kill_on_drop(true)
    .spawn()
    .context("starting the rewind binary")
}

/// The log so far, for a failure message (or why it cannot be read).
pub fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_else(|e| format!("(cannot read {}: {e})", log.display()))
}

/// Waits until the controller logged that its cache synced.
pub async fn wait_ready(log: &Path) -> anyhow::Result<()> {
    for _ in 0..600 {
        if std::fs::read_to_string(log)?.contains("workflow metadata cache synced") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "the controller did not sync within 30s:\n{}",
        std::fs::read_to_string(log)?
    )
}

/// The process's peak resident memory (VmHWM), in KiB.
pub fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/PID/status")
}
