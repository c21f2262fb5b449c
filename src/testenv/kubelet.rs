//! A stand-in for the kubelet: a Deployment's first container run here, as a process of the
//! `rewind` binary. The local control plane's kwok nodes run no containers, so the chart's
//! cluster tests and the try-out ([`crate::testenv::tryout`]) run rewind's own Deployment
//! this way: its arguments and environment as the kubelet would give them, its Secret
//! volumes written to a directory the arguments then point at, signed in as its
//! ServiceAccount, and listening on loopback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::config::{AuthInfo, Kubeconfig};

use crate::testenv::localcluster::{LocalCluster, Role, service_account_token};
use crate::testenv::{IoError, io_error};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("Deployment {namespace}/{name}: {what}")]
    Unsupported {
        namespace: String,
        name: String,
        what: String,
    },

    #[error(transparent)]
    Io(#[from] IoError),

    #[error(transparent)]
    Cluster(#[from] crate::testenv::localcluster::Error),

    #[error("writing a kubeconfig: {0}")]
    Kubeconfig(#[from] serde_yaml_ng::Error),
}

/// How a Deployment runs its first container, for the `rewind` binary run here.
pub struct Deployed {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    pub service_account: String,
    /// The container's arguments, as the Deployment has them.
    pub deployed_args: Vec<String>,
    /// Those run here: listening on loopback, reading its Secrets where they were written.
    pub args: Vec<String>,
    env: Vec<EnvVar>,
    limits: BTreeMap<String, Quantity>,
}

impl Deployed {
    /// Reads Deployment `namespace`/`name`; writes each Secret its container mounts into
    /// `dir`, where the arguments then point. Every `--*-addr=` argument listens on a free
    /// loopback port (see [`Deployed::listen`]).
    pub async fn read(
        cluster: &LocalCluster,
        namespace: &str,
        name: &str,
        dir: &Path,
    ) -> Result<Self, Error> {
        let admin = cluster.admin_client();
        let unsupported = |what: String| Error::Unsupported {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            what,
        };
        let deployment = Api::<Deployment>::namespaced(admin.clone(), namespace)
            .get(name)
            .await
            .map_err(|source| Error::Kube {
                action: format!("reading Deployment {namespace}/{name}"),
                source,
            })?;
        let labels = deployment.labels().clone();
        let pod = (deployment.spec.and_then(|s| s.template.spec))
            .ok_or_else(|| unsupported("it has no pod spec".into()))?;
        let service_account = (pod.service_account_name.clone())
            .ok_or_else(|| unsupported("it names no ServiceAccount".into()))?;
        let container = (pod.containers.into_iter().next())
            .ok_or_else(|| unsupported("it has no container".into()))?;

        // Each mounted Secret volume, written where the arguments will find it.
        let volumes = pod.volumes.unwrap_or_default();
        let mut mounts = Vec::new();
        for mount in container.volume_mounts.unwrap_or_default() {
            let secret = (volumes.iter())
                .find(|v| v.name == mount.name)
                .and_then(|v| v.secret.as_ref())
                .and_then(|s| s.secret_name.clone())
                .ok_or_else(|| {
                    unsupported(format!(
                        "volume {} is not a Secret, which this stand-in cannot mount",
                        mount.name
                    ))
                })?;
            let data = Api::<Secret>::namespaced(admin.clone(), namespace)
                .get(&secret)
                .await
                .map_err(|source| Error::Kube {
                    action: format!("reading Secret {namespace}/{secret}"),
                    source,
                })?
                .data
                .unwrap_or_default();
            let local = dir.join(&mount.name);
            std::fs::create_dir_all(&local).map_err(io_error("creating", &local))?;
            for (key, value) in data {
                let path = local.join(&key);
                std::fs::write(&path, &value.0).map_err(io_error("writing", &path))?;
            }
            mounts.push((mount.mount_path, local));
        }

        let deployed_args = container.args.unwrap_or_default();
        let args = (deployed_args.iter())
            .map(|arg| match arg.split_once('=') {
                Some((flag, _)) if flag.starts_with("--") && flag.ends_with("-addr") => {
                    format!("{flag}=127.0.0.1:0")
                }
                Some((flag, value)) => {
                    let local = mounts.iter().find_map(|(at, local)| {
                        let rest = value.strip_prefix(at.as_str())?.strip_prefix('/')?;
                        Some(local.join(rest))
                    });
                    match local {
                        Some(path) => format!("{flag}={}", path.display()),
                        None => arg.clone(),
                    }
                }
                None => arg.clone(),
            })
            .collect();
        Ok(Deployed {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            labels,
            service_account,
            deployed_args,
            args,
            limits: (container.resources.and_then(|r| r.limits)).unwrap_or_default(),
            env: container.env.unwrap_or_default(),
        })
    }

    /// The Deployment's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Listens with `flag` (e.g. `--argo-api-addr`) on `addr` instead of a free port.
    pub fn listen(&mut self, flag: &str, addr: &str) {
        let prefix = format!("{flag}=");
        for arg in &mut self.args {
            if arg.starts_with(&prefix) {
                *arg = format!("{prefix}{addr}");
            }
        }
    }

    /// The value of argument `--flag=VALUE`, if the container has it.
    pub fn arg(&self, flag: &str) -> Option<&str> {
        let prefix = format!("{flag}=");
        (self.args.iter()).find_map(|a| a.strip_prefix(prefix.as_str()))
    }

    /// `program` run as the Deployment's pod `pod` would run its container, signed in with
    /// `kubeconfig`: its arguments, and only its environment.
    pub fn command(
        &self,
        program: &Path,
        pod: &str,
        kubeconfig: &Path,
    ) -> Result<std::process::Command, Error> {
        let mut command = std::process::Command::new(program);
        command
            .args(&self.args)
            .env_clear()
            .envs(self.env(pod)?)
            .env("KUBECONFIG", kubeconfig);
        Ok(command)
    }

    /// The environment of the container in pod `pod`, as the kubelet resolves it.
    fn env(&self, pod: &str) -> Result<Vec<(String, String)>, Error> {
        let unsupported = |what: String| Error::Unsupported {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            what,
        };
        let mut env = Vec::new();
        for var in &self.env {
            let from = var.value_from.clone().unwrap_or_default();
            let value = match (&var.value, from.field_ref, from.resource_field_ref) {
                (Some(value), _, _) => value.clone(),
                (None, Some(field), _) => match field.field_path.as_str() {
                    "metadata.name" => pod.to_owned(),
                    "metadata.namespace" => self.namespace.clone(),
                    other => {
                        return Err(unsupported(format!(
                            "env {} refers to {other}, which this stand-in does not give",
                            var.name
                        )));
                    }
                },
                // As the kubelet gives it: the limit in bytes, or in millicores.
                (None, None, Some(field)) => {
                    let limit = |resource: &str| {
                        (self.limits.get(resource).map(|q| q.0.clone())).ok_or_else(|| {
                            unsupported(format!("env {} needs a {resource} limit", var.name))
                        })
                    };
                    let value = match field.resource.as_str() {
                        "limits.memory" => bytes(&limit("memory")?),
                        "limits.cpu" => millicores(&limit("cpu")?),
                        other => {
                            return Err(unsupported(format!(
                                "env {} refers to {other}, which this stand-in does not give",
                                var.name
                            )));
                        }
                    };
                    value
                        .ok_or_else(|| unsupported(format!("env {}: limit not read", var.name)))?
                        .to_string()
                }
                (None, None, None) => String::new(),
            };
            env.push((var.name.clone(), value));
        }
        Ok(env)
    }
}

/// A kubeconfig for the cluster signed in as ServiceAccount `namespace`/`name`, written into
/// `dir`. Its token comes from a TokenRequest and sits in a file beside it, which the client
/// reads again when it changes; [`refresh_token`] renews it, as the kubelet renews a
/// projected token.
pub async fn service_account_kubeconfig(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> Result<PathBuf, Error> {
    let token = refresh_token(cluster, namespace, name, dir).await?;
    let template = cluster.kubeconfig_path(Role::Controller);
    let mut config = Kubeconfig::read_from(&template).map_err(|source| {
        crate::testenv::localcluster::Error::Kubeconfig {
            path: template.clone(),
            source,
        }
    })?;
    for auth in &mut config.auth_infos {
        auth.auth_info = Some(AuthInfo {
            token_file: Some(token.display().to_string()),
            ..Default::default()
        });
    }
    let path = dir.join(format!("{namespace}-{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&config)?)
        .map_err(io_error("writing", &path))?;
    Ok(path)
}

/// Writes a fresh token of ServiceAccount `namespace`/`name` to its file in `dir`; returns
/// the file.
pub async fn refresh_token(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> Result<PathBuf, Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.admin_client(), namespace);
    let token = service_account_token(&accounts, name).await?;
    let path = dir.join(format!("{namespace}-{name}.token"));
    std::fs::write(&path, token).map_err(io_error("writing", &path))?;
    Ok(path)
}

/// A memory quantity in bytes (the forms the chart uses: plain, Ki, Mi, Gi).
fn bytes(quantity: &str) -> Option<u64> {
    let at = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (number, unit) = quantity.split_at(at);
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    Some(number.parse::<u64>().ok()? * scale)
}

/// A CPU quantity in millicores ("1", "500m").
fn millicores(quantity: &str) -> Option<u64> {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse().ok(),
        None => Some(quantity.parse::<u64>().ok()? * 1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_the_kubelet_gives_them() {
        assert_eq!(bytes("320Mi"), Some(320 << 20));
        assert_eq!(bytes("1Gi"), Some(1 << 30));
        assert_eq!(bytes("1000"), Some(1000));
        assert_eq!(bytes("1M"), None);
        assert_eq!(millicores("500m"), Some(500));
        assert_eq!(millicores("2"), Some(2000));
        assert_eq!(millicores("x"), None);
    }
}
