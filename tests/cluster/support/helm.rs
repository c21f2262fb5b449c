//! The Helm chart and the Helm CLI (tools/helm/build.sh) run against the cluster.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, ensure};
use rewind::testenv::localcluster::{LocalCluster, Role};
use tokio::process::Command;

/// The chart's folder.
pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/rewind");

/// Runs the Helm CLI built by tools/helm/build.sh against the cluster as its admin.
pub async fn helm(cluster: &LocalCluster, dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let build = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/helm/build.sh");
    let out = Command::new(build)
        .output()
        .await
        .context("running tools/helm/build.sh")?;
    ensure!(
        out.status.success(),
        "tools/helm/build.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let helm = PathBuf::from(String::from_utf8(out.stdout)?.trim()).join("helm");
    let out = Command::new(&helm)
        .args(args)
        .env("KUBECONFIG", cluster.kubeconfig_path(Role::Admin))
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .output()
        .await
        .context("running helm")?;
    ensure!(
        out.status.success(),
        "helm {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
