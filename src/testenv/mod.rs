//! Machinery for tests, the demo and benchmarks only: a real local control
//! plane built from Go modules ([`localcluster`]), real PostgreSQL and MariaDB
//! servers ([`db`]), a fault-injecting proxy in front of the API server
//! ([`faultproxy`]), Argo's own workflow-controller ([`argo`]), generators
//! of failed Argo workloads ([`workload`]), the retry benchmark's
//! measuring ([`bench`]), crash trials ([`trials`]), randomized trials of
//! overlapping requests under faults ([`mixed`]) with the pod ledger that
//! witnesses rule 3 ([`ledger`]) and Prometheus on
//! loopback for the dashboard and alerts ([`prometheus`]), a stand-in for the
//! kubelet that runs the chart's Deployment as a process ([`kubelet`]) and
//! the try-out a new user follows README.md on ([`tryout`]). Behind the
//! `testenv` feature, so a reader (or a build) of the controller never
//! wades through it.

pub mod argo;
pub mod bench;
pub mod clients;
pub mod db;
pub mod faultproxy;
pub mod kubelet;
pub mod ledger;
pub mod localcluster;
pub mod mixed;
pub mod prometheus;
pub mod shapes;
pub mod trials;
pub mod tryout;
pub mod workload;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;

/// A file, directory or process of the machinery that could not be used: what was done, on
/// which path, and the system's reason. Every machinery error carries it the same way.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}: {source}", path.display())]
pub struct IoError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// For `map_err`: the [`IoError`] of `action` on `path`.
pub fn io_error(
    action: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> IoError {
    let path = path.into();
    move |source| IoError {
        action,
        path,
        source,
    }
}

/// A loopback port free now, for a process the machinery starts, taken below
/// the kernel's ephemeral range. A port from that range (a bind to port 0)
/// can be taken, between the probe and the process's own bind, as the local
/// port of any outgoing connection on the machine: an argo server in CI
/// failed to listen so. Each port is handed out once per process.
pub fn free_port() -> Result<u16, IoError> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    // Above the ports services commonly default to (PostgreSQL 5432, MariaDB 3306, ...).
    let below = 15000..ephemeral_start().max(15001);
    for _ in 0..200 {
        let port = fastrand::u16(below.clone());
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            given.insert(port);
            return Ok(port);
        }
    }
    // The range is crowded: one the kernel picks.
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|probe| probe.local_addr())
        .map(|addr| addr.port())
        .map_err(io_error("binding a port on", "127.0.0.1"))
}

/// The first port of Linux's ephemeral range (its default where unreadable).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Why one of tools/*/build.sh did not give its tools.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("running {script}: {source}")]
    Run {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building with `bash {script} {args}` failed ({status}); its output is above")]
    Failed {
        script: PathBuf,
        args: String,
        status: ExitStatus,
    },
}

/// Runs `bash SCRIPT ARGS...`, one of tools/*/build.sh, which builds its tools from their
/// modules once and caches them (later runs only check the cache), and returns the last line
/// it printed: the path of what it built. The script is found beside this crate's manifest,
/// else under the working directory.
pub fn build_tool(script: &str, args: &[&str]) -> Result<PathBuf, BuildError> {
    let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let script = if compiled_in.is_file() {
        compiled_in
    } else {
        PathBuf::from(script)
    };
    // stderr is inherited so a cold build's progress is visible.
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| BuildError::Run {
            script: script.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(BuildError::Failed {
            script,
            args: args.join(" "),
            status: output.status,
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ephemeral = super::ephemeral_start();
        let mut ports: Vec<u16> = (0..50).map(|_| super::free_port().unwrap()).collect();
        assert!(ports.iter().all(|&p| p < ephemeral), "{ports:?}");
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), 50);
    }
}
