//! Argo's database as Argo's own ConfigMap configures it: its
//! `persistence` block and the Secrets it names (in the ConfigMap's
//! namespace, where Argo's controller reads them).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::argo::db::{ArgoDatabase, DbError, Persistence, SecretKeySelector, Sql, parse_config};
use crate::engine::fault;

/// Waits between reads of Argo's ConfigMap after a transient failure,
/// doubling up to the second.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Argo's database as its ConfigMap `configmap` (NAMESPACE/NAME) configures
/// it, or `None` when it configures none or configures it wrongly (both
/// logged: archived retries and offloaded nodes are then not served). A
/// transient failure (the API server unreachable, throttling) is retried
/// with back-off until it passes or `shutdown`: one passing fault at start
/// must not turn archived retries off for the life of the process.
pub async fn database(
    client: &kube::Client,
    configmap: &str,
    max_row_size: usize,
    shutdown: &CancellationToken,
) -> Option<Arc<dyn ArgoDatabase>> {
    let mut delay = BACKOFF_START;
    let persistence = loop {
        match load_persistence(client, configmap).await {
            Ok(Some(p)) => break p,
            Ok(None) => {
                info!(%configmap, "Argo's ConfigMap has no persistence block: archived retries and offloaded nodes are not served");
                return None;
            }
            Err(e) if e.is_transient() => {
                warn!(%configmap, error = %e, retry_in = ?delay, "cannot read Argo's persistence configuration yet; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(BACKOFF_MAX);
            }
            Err(e) => {
                error!(%configmap, error = %e, "Argo's persistence configuration is wrong: archived retries and offloaded nodes are not served until it is fixed and the controller restarted");
                return None;
            }
        }
    };
    match Sql::connect(&persistence).await {
        Ok(database) => {
            info!(%configmap, database = persistence.target(), archive = persistence.archive, node_status_offload = persistence.node_status_offload, "using Argo's database");
            Some(Arc::new(database.with_max_row_size(max_row_size)))
        }
        Err(e) => {
            error!(%configmap, database = persistence.target(), error = %e, "Argo's database settings are wrong: archived retries and offloaded nodes are not served");
            None
        }
    }
}

/// Why Argo's persistence configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArgoConfigError {
    #[error("{what} failed: {}", fault::explain(.source))]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Config(#[from] DbError),
}

impl ArgoConfigError {
    /// Whether reading again later may succeed (see [`fault::is_transient`]).
    pub fn is_transient(&self) -> bool {
        match self {
            ArgoConfigError::Kube { source, .. } => fault::is_transient(source),
            ArgoConfigError::Config(e) => e.is_transient(),
        }
    }
}

/// Reads Argo's ConfigMap `namespace/name` and the Secrets its `persistence`
/// block names (in the ConfigMap's namespace, where Argo's controller reads
/// them); None when the ConfigMap has no `persistence` block.
pub async fn load_persistence(
    client: &kube::Client,
    configmap: &str,
) -> Result<Option<Persistence>, ArgoConfigError> {
    let (namespace, name) = configmap
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
        .ok_or_else(|| DbError::Config {
            configmap: configmap.to_owned(),
            problem: "expected NAMESPACE/NAME".into(),
        })?;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|source| ArgoConfigError::Kube {
            what: format!("reading Argo's ConfigMap {configmap}"),
            source,
        })?;
    let Some((persist, instance_id)) = parse_config(configmap, &cm.data.unwrap_or_default())?
    else {
        return Ok(None);
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let [user, password] = persist.credential_secrets(configmap)?;
    let user = secret_value(&secrets, namespace, configmap, user).await?;
    let password = secret_value(&secrets, namespace, configmap, password).await?;
    Ok(Some(persist.resolve(
        configmap,
        user,
        password,
        instance_id,
    )?))
}

async fn secret_value(
    secrets: &Api<Secret>,
    namespace: &str,
    configmap: &str,
    selector: &SecretKeySelector,
) -> Result<String, ArgoConfigError> {
    let missing = |problem: String| {
        ArgoConfigError::Config(DbError::Config {
            configmap: configmap.to_owned(),
            problem,
        })
    };
    if selector.name.is_empty() || selector.key.is_empty() {
        return Err(missing(
            "persistence names a credential Secret without name or key".into(),
        ));
    }
    let secret = secrets
        .get(&selector.name)
        .await
        .map_err(|source| ArgoConfigError::Kube {
            what: format!(
                "reading Secret {namespace}/{} named by {configmap}",
                selector.name
            ),
            source,
        })?;
    let bytes = secret
        .data
        .and_then(|mut d| d.remove(&selector.key))
        .ok_or_else(|| {
            missing(format!(
                "Secret {namespace}/{} has no key {:?}",
                selector.name, selector.key
            ))
        })?;
    String::from_utf8(bytes.0).map_err(|_| {
        missing(format!(
            "key {:?} of Secret {namespace}/{} is not UTF-8",
            selector.key, selector.name
        ))
    })
}
