//! kubectl's conventions for the user commands: `--kubeconfig`, `--context`,
//! `-n/--namespace`, KUBECONFIG, and the current context's namespace.

use std::path::PathBuf;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(clap::Args, Clone, Debug)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, else "default").
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
}

impl KubeArgs {
    /// A client, and the namespace to work in.
    pub async fn connect(&self) -> anyhow::Result<(kube::Client, String)> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .with_context(|| format!("using kubeconfig {}", path.display()))?
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .context("reading the kubeconfig ($KUBECONFIG or ~/.kube/config)")?,
            None => kube::Config::infer()
                .await
                .context("finding Kubernetes credentials (set KUBECONFIG or --kubeconfig)")?,
        };
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        Ok((client, namespace))
    }
}
