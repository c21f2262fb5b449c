//! The chart as installed: its Deployment's controller run here as the `rewind` binary,
//! signed in as the chart's ServiceAccount (install.rs, upgrade.rs). The local control plane
//! runs no kubelet, so the tests stand in for it (`rewind::testenv::kubelet`).

use std::path::Path;

use anyhow::{Context as _, ensure};
use rewind::testenv::kubelet::Deployed;

use super::replica::Replica;

/// The release the tests install the chart as.
pub const RELEASE: &str = "rewind";

/// What the tests ask of the chart's Deployment, read by [`Deployed::read`].
pub trait ChartDeployment {
    /// Checks that the Deployment is chart `version`'s.
    fn ensure_chart(&self, version: &str) -> anyhow::Result<()>;
    /// The Lease the replicas share (`--lease-name`).
    fn lease(&self) -> anyhow::Result<String>;
    /// The `rewind` binary run as the Deployment's pod `pod` would run it, signed in with
    /// `kubeconfig`, logging into `dir`.
    fn start(&self, pod: &str, kubeconfig: &Path, dir: &Path) -> anyhow::Result<Replica>;
}

impl ChartDeployment for Deployed {
    fn ensure_chart(&self, version: &str) -> anyhow::Result<()> {
        for (label, expected) in [
            ("helm.sh/chart", format!("rewind-{version}")),
            ("app.kubernetes.io/version", version.to_owned()),
        ] {
            let found = self.labels().get(label);
            ensure!(
                found == Some(&expected),
                "the Deployment's {label} is {found:?}, expected {expected}"
            );
        }
        Ok(())
    }

    fn lease(&self) -> anyhow::Result<String> {
        self.arg("--lease-name")
            .map(str::to_owned)
            .context("the Deployment does not turn leader election on")
    }

    fn start(&self, pod: &str, kubeconfig: &Path, dir: &Path) -> anyhow::Result<Replica> {
        let program = Path::new(env!("CARGO_BIN_EXE_rewind"));
        let mut command = tokio::process::Command::from(self.command(program, pod, kubeconfig)?);
        Replica::spawn(pod, &mut command, dir)
    }
}
