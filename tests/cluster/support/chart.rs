//! The chart as installed: its Deployment's controller run here as the `rewind` binary,
//! signed in as the chart's ServiceAccount (install.rs, upgrade.rs). The local control plane
//! runs no kubelet, so the tests stand in for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::config::{AuthInfo, Kubeconfig};
use rewind::testenv::localcluster::{LocalCluster, Role, service_account_token};
use tokio::process::Command;

use super::replica::Replica;

/// The release the tests install the chart as.
pub const RELEASE: &str = "rewind";

/// How the chart's Deployment runs the controller, for the `rewind` binary run here: the
/// container's arguments and environment as the kubelet would give them, and the
/// ServiceAccount it signs in as.
pub struct Deployed {
    labels: BTreeMap<String, String>,
    pub service_account: String,
    /// The container's arguments, as the Deployment has them.
    pub deployed_args: Vec<String>,
    /// Those run here: on loopback, with the certificate where it was written.
    pub args: Vec<String>,
    env: Vec<EnvVar>,
    limits: BTreeMap<String, Quantity>,
    namespace: String,
}

impl Deployed {
    /// Reads the release's Deployment; writes the certificate of Argo's retry API, from the
    /// chart's Secret, into `dir`, where the arguments then point.
    pub async fn read(cluster: &LocalCluster, namespace: &str, dir: &Path) -> anyhow::Result<Self> {
        let admin = cluster.admin_client();
        let deployment = Api::<Deployment>::namespaced(admin.clone(), namespace)
            .get(RELEASE)
            .await
            .context("the chart's Deployment")?;
        let labels = deployment.labels().clone();
        let pod = deployment
            .spec
            .and_then(|s| s.template.spec)
            .context("the Deployment has no pod spec")?;
        let service_account = pod
            .service_account_name
            .clone()
            .context("the Deployment names no ServiceAccount")?;
        let container = pod.containers.into_iter().next().context("no container")?;
        let tls = Api::<Secret>::namespaced(admin, namespace)
            .get(&format!("{RELEASE}-argo-api-tls"))
            .await
            .context("the chart's Secret for Argo's retry API")?;
        std::fs::create_dir_all(dir)?;
        let mut files = BTreeMap::new();
        for key in ["tls.crt", "tls.key"] {
            let data = tls
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .with_context(|| format!("the Secret has no {key}"))?;
            let path = dir.join(key);
            std::fs::write(&path, &data.0)?;
            files.insert(key, path.display().to_string());
        }
        // Tests listen on loopback only, and read the certificate from where it was written.
        let deployed_args = container.args.unwrap_or_default();
        let args = (deployed_args.iter().cloned())
            .map(|a| match a.split_once('=') {
                Some(("--http-addr", _)) => "--http-addr=127.0.0.1:0".to_owned(),
                Some(("--argo-api-addr", _)) => "--argo-api-addr=127.0.0.1:0".to_owned(),
                Some(("--argo-api-tls-cert", _)) => {
                    format!("--argo-api-tls-cert={}", files["tls.crt"])
                }
                Some(("--argo-api-tls-key", _)) => {
                    format!("--argo-api-tls-key={}", files["tls.key"])
                }
                _ => a,
            })
            .collect();
        Ok(Deployed {
            labels,
            service_account,
            deployed_args,
            args,
            limits: container
                .resources
                .and_then(|r| r.limits)
                .unwrap_or_default(),
            env: container.env.unwrap_or_default(),
            namespace: namespace.to_owned(),
        })
    }

    /// Checks that the Deployment is chart `version`'s.
    pub fn ensure_chart(&self, version: &str) -> anyhow::Result<()> {
        for (label, expected) in [
            ("helm.sh/chart", format!("rewind-{version}")),
            ("app.kubernetes.io/version", version.to_owned()),
        ] {
            let found = self.labels.get(label);
            ensure!(
                found == Some(&expected),
                "the Deployment's {label} is {found:?}, expected {expected}"
            );
        }
        Ok(())
    }

    /// The Lease the replicas share (`--lease-name`).
    pub fn lease(&self) -> anyhow::Result<String> {
        self.args
            .iter()
            .find_map(|a| a.strip_prefix("--lease-name="))
            .map(str::to_owned)
            .context("the Deployment does not turn leader election on")
    }

    /// The `rewind` binary run as the Deployment's pod `pod` would run it, signed in with
    /// `kubeconfig`, logging into `dir`.
    pub fn start(&self, pod: &str, kubeconfig: &Path, dir: &Path) -> anyhow::Result<Replica> {
        Replica::spawn(
            pod,
            Command::new(env!("CARGO_BIN_EXE_rewind"))
                .args(&self.args)
                .env_clear()
                .envs(self.env(pod)?)
                .env("KUBECONFIG", kubeconfig),
            dir,
        )
    }

    /// The environment of the container in pod `pod`.
    fn env(&self, pod: &str) -> anyhow::Result<Vec<(String, String)>> {
        let mut env = Vec::new();
        for var in &self.env {
            let from = var.value_from.clone().unwrap_or_default();
            let value = match (&var.value, from.field_ref, from.resource_field_ref) {
                (Some(value), _, _) => value.clone(),
                (None, Some(field), _) => match field.field_path.as_str() {
                    "metadata.name" => pod.to_owned(),
                    "metadata.namespace" => self.namespace.clone(),
                    other => bail!(
                        "env {} refers to {other}, which this test cannot stand in for",
                        var.name
                    ),
                },
                // As the kubelet gives it: the limit in bytes, or in millicores.
                (None, None, Some(field)) => {
                    let limit = |name: &str| {
                        self.limits
                            .get(name)
                            .map(|q| q.0.clone())
                            .with_context(|| format!("env {} needs a {name} limit", var.name))
                    };
                    match field.resource.as_str() {
                        "limits.memory" => bytes(&limit("memory")?)?.to_string(),
                        "limits.cpu" => millicores(&limit("cpu")?)?.to_string(),
                        other => bail!(
                            "env {} refers to {other}, which this test cannot stand in for",
                            var.name
                        ),
                    }
                }
                (None, None, None) => String::new(),
            };
            env.push((var.name.clone(), value));
        }
        Ok(env)
    }
}

/// A kubeconfig for the cluster signed in as ServiceAccount `name` with a TokenRequest token.
pub async fn kubeconfig_for(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let sas: Api<ServiceAccount> = Api::namespaced(cluster.admin_client(), namespace);
    let token = service_account_token(&sas, name).await?;
    let mut config = Kubeconfig::read_from(cluster.kubeconfig_path(Role::Controller))?;
    for auth in &mut config.auth_infos {
        auth.auth_info = Some(AuthInfo {
            token: Some(token.clone().into()),
            ..Default::default()
        });
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&config)?)?;
    Ok(path)
}

/// A memory quantity in bytes (the forms the chart uses: plain, Ki, Mi, Gi).
fn bytes(quantity: &str) -> anyhow::Result<u64> {
    let (number, unit) = match quantity.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => quantity.split_at(at),
        None => (quantity, ""),
    };
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => bail!("memory quantity {quantity}: unit {other} not handled here"),
    };
    Ok(number.parse::<u64>()? * scale)
}

/// A CPU quantity in millicores ("1", "500m").
fn millicores(quantity: &str) -> anyhow::Result<u64> {
    Ok(match quantity.strip_suffix('m') {
        Some(milli) => milli.parse()?,
        None => quantity.parse::<u64>()? * 1000,
    })
}
