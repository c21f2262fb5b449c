//! Rule 3's witness for the fault tests and randomized trials (issue 34): a watch of a
//! namespace's pods, begun before the request, records every pod removed by UID, so a pod
//! recreated under a planned name is told apart from the one the plan was made from.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::task::JoinHandle;

use crate::testenv::trials::TrialError;

/// Every pod removed from a namespace since [`PodLedger::start`], as (name, UID).
pub struct PodLedger {
    removed: Arc<Mutex<Vec<(String, String)>>>,
    watch: JoinHandle<Result<(), TrialError>>,
}

impl PodLedger {
    pub async fn start(pods: Api<Pod>) -> Result<Self, TrialError> {
        let version = current_version(&pods).await?;
        let mut events = pods
            .watch(&WatchParams::default(), &version)
            .await
            .map_err(|source| TrialError::Kube {
                action: "watching pods for the ledger".into(),
                source,
            })?
            .boxed();
        let removed = Arc::<Mutex<Vec<(String, String)>>>::default();
        let sink = removed.clone();
        let watch = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Deleted(pod)) => sink.lock().expect("not poisoned").push((
                        pod.metadata.name.unwrap_or_default(),
                        pod.metadata.uid.unwrap_or_default(),
                    )),
                    Ok(WatchEvent::Error(e)) => {
                        return Err(TrialError::Run(format!(
                            "the pod ledger's watch failed: {e:?}"
                        )));
                    }
                    Ok(_) => {}
                    Err(source) => {
                        return Err(TrialError::Kube {
                            action: "the pod ledger's watch".into(),
                            source,
                        });
                    }
                }
            }
            Err(TrialError::Run("the pod ledger's watch ended early".into()))
        });
        Ok(Self { removed, watch })
    }

    /// The pods removed so far whose UIDs are not in `planned` (the plan's pods as they were
    /// when the plan was made), by whoever removed them; the watch has seen up to now (give
    /// it a moment).
    pub async fn removed_outside(
        &self,
        planned: &BTreeSet<String>,
    ) -> Result<Vec<(String, String)>, TrialError> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if self.watch.is_finished() {
            return Err(TrialError::Run(
                "the pod ledger's watch stopped, so it cannot vouch for what was removed".into(),
            ));
        }
        let removed = self.removed.lock().expect("not poisoned").clone();
        Ok(removed
            .into_iter()
            .filter(|(_, uid)| !planned.contains(uid))
            .collect())
    }

    /// No pod was removed but those with the plan's UIDs.
    pub async fn ensure_only_planned_removed(
        &self,
        planned: &BTreeSet<String>,
    ) -> Result<(), TrialError> {
        let outside = self.removed_outside(planned).await?;
        match outside.is_empty() {
            true => Ok(()),
            false => Err(TrialError::Run(format!(
                "pods removed that were not in the plan (name, uid): {outside:?}"
            ))),
        }
    }
}

/// The resourceVersion of `api`'s objects now, from a list of one, to watch from.
pub async fn current_version<K>(api: &Api<K>) -> Result<String, TrialError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|source| TrialError::Kube {
            action: format!("listing {}", K::plural(&())),
            source,
        })?
        .metadata
        .resource_version
        .ok_or_else(|| TrialError::Run("a list without a resourceVersion".into()))
}

impl Drop for PodLedger {
    fn drop(&mut self) {
        self.watch.abort();
    }
}
