//! Argo's database as Argo's own ConfigMap configures it: its
//! `persistence` block and the Secrets it names (in the ConfigMap's
//! namespace, where Argo's controller reads them).

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use crate::argo::db::{DbError, Persistence, SecretKeySelector, parse_config};
use crate::engine::fault;

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
