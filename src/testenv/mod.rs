//! Machinery for tests, the demo and benchmarks only: a real local control
//! plane built from Go modules ([`localcluster`]), real PostgreSQL and MariaDB
//! servers ([`db`]), a fault-injecting proxy in front of the API server
//! ([`faultproxy`]), Argo's own workflow-controller ([`argo`]), generators
//! of failed Argo workloads ([`workload`]), the retry benchmark's
//! measuring ([`bench`]), crash trials ([`trials`]), randomized trials of
//! overlapping requests under faults ([`mixed`]) with the pod ledger that
//! witnesses rule 3 ([`ledger`]) and Prometheus on
//! loopback for the dashboard and alerts ([`prometheus`]). Behind the
//! `testenv` feature, so a reader (or a build) of the controller never
//! wades through it.

pub mod argo;
pub mod bench;
pub mod clients;
pub mod db;
pub mod faultproxy;
pub mod ledger;
pub mod localcluster;
pub mod mixed;
pub mod prometheus;
pub mod trials;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

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
