//! README.md's "Try it on your machine", run as a new user would: `rewind local-cluster
//! --try` (what `make try` runs), its printed exports, then README's own shell block,
//! verbatim, in bash: the chart installed with Helm, three flaky workflows, and one retry
//! each through Argo's CLI, an annotation and `rewind retry`. It passes only when all three
//! workflows end Succeeded, which only a retry of each can bring about.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

const SECTION: &str = "## Try it on your machine";
/// Starting the cluster and Argo's controller; their builds come first in `make test`.
const READY_WITHIN: Duration = Duration::from_secs(300);
/// The block's own waits bound it (`kubectl wait --timeout`), this only a hung command.
const BLOCK_WITHIN: Duration = Duration::from_secs(600);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The shell block of README's try-it section.
fn readme_block() -> anyhow::Result<String> {
    let readme = std::fs::read_to_string(root().join("README.md"))?;
    let section = readme
        .split_once(SECTION)
        .with_context(|| format!("README.md has no {SECTION:?}"))?
        .1;
    let section = section.split("\n## ").next().unwrap_or_default();
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .context("the try-it section has no ```sh block")?
        .0;
    Ok(block.to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn readme_try_it_retries_three_workflows_three_ways() -> anyhow::Result<()> {
    let block = readme_block()?;
    let home = tempfile::tempdir()?;
    let mut tryout = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["local-cluster", "--try"])
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting `rewind local-cluster --try`")?;
    let mut lines = BufReader::new(tryout.stdout.take().context("no stdout")?).lines();
    let mut exports = Vec::new();
    let mut printed = String::new();
    let ready = async {
        while let Some(line) = lines.next_line().await? {
            printed.push_str(&line);
            printed.push('\n');
            if line.starts_with("export ") {
                exports.push(line.clone());
            }
            if line.starts_with("Then follow README.md") {
                return Ok(());
            }
        }
        bail!("the try-out exited before it was ready:\n{printed}")
    };
    tokio::time::timeout(READY_WITHIN, ready)
        .await
        .context("the try-out was not ready in time")??;
    ensure!(
        exports.len() == 3,
        "expected the KUBECONFIG, PATH and ARGO_SERVER exports:\n{printed}"
    );
    // What the try-out prints from here (the chart's Deployment starting) is kept for a failure.
    let said = tokio::spawn(async move {
        let mut text = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });

    let script = format!("set -euo pipefail -x\n{}\n{block}", exports.join("\n"));
    let run = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(BLOCK_WITHIN, run)
        .await
        .context("README's block did not end in time")??;

    // SIGTERM, as Ctrl-C would: it stops the chart's process, Argo's and the cluster.
    if let Some(pid) = tryout.id() {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let stopped = tokio::time::timeout(Duration::from_secs(90), tryout.wait()).await;
    let said = tokio::time::timeout(Duration::from_secs(5), said)
        .await
        .map(|text| text.unwrap_or_default())
        .unwrap_or_default();
    ensure!(
        out.status.success(),
        "README's try-it block failed ({}):\n{}\n{}\nthe try-out said:\n{printed}{said}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let status = stopped.context("the try-out did not stop within 90 s of SIGTERM")??;
    ensure!(status.success(), "the try-out exited {status}:\n{said}");
    ensure!(
        said.contains("rewind/rewind runs here"),
        "the chart's Deployment was not run:\n{said}"
    );
    Ok(())
}
