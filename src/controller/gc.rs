//! Background garbage collection of orphan pods: pods labelled with a
//! workflow that no longer exists.
//!
//! It runs in the queue's background class, so user retries always go first;
//! its value is also that it puts real background load on the queue.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PartialObjectMeta};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::argo::workflow::{Workflow, labels};
use crate::engine::Engine;
use crate::engine::assess::DeleteWork;
use crate::engine::queue::Class;
use crate::engine::workers::{Queue, RequestKey, WorkItem};

/// Finds orphan pods in `namespaces` (all when empty) every `interval` and
/// queues their deletion as background work, until `shutdown`.
pub async fn run(
    engine: Engine,
    namespaces: Vec<String>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let Engine {
        client,
        queue,
        outcomes,
        ..
    } = engine;
    let key = RequestKey::gc();
    let mut results = outcomes.register(key.clone());
    let mut ticker = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(outcome) = results.recv() => {
                if let Err(e) = outcome.result {
                    warn!(error = %e, "orphan pod deletion failed");
                }
            }
            _ = ticker.tick() => {
                match sweep(&client, &namespaces, &queue, &key).await {
                    Ok(0) => {}
                    Ok(n) => info!(pods = n, "queued orphan pods for deletion"),
                    Err(e) => warn!(error = %e, "orphan pod sweep failed; trying again next interval"),
                }
            }
        }
    }
    outcomes.unregister(&key);
}

/// One sweep: returns how many pods it queued.
async fn sweep(
    client: &Client,
    namespaces: &[String],
    queue: &Queue,
    key: &RequestKey,
) -> Result<usize, kube::Error> {
    let lp = ListParams::default().labels(labels::WORKFLOW);
    let pods: Vec<PartialObjectMeta<Pod>> = if namespaces.is_empty() {
        Api::<Pod>::all(client.clone())
            .list_metadata(&lp)
            .await?
            .items
    } else {
        let mut all = Vec::new();
        for ns in namespaces {
            all.extend(
                Api::<Pod>::namespaced(client.clone(), ns)
                    .list_metadata(&lp)
                    .await?
                    .items,
            );
        }
        all
    };
    // Ask the API server, not a cache, whether each workflow exists: a cache
    // that lags behind a new workflow would make its pods look orphaned.
    let mut owners: BTreeSet<(String, String)> = BTreeSet::new();
    for pod in &pods {
        if let (Some(ns), Some(wf)) = (pod.namespace(), pod.labels().get(labels::WORKFLOW)) {
            owners.insert((ns, wf.clone()));
        }
    }
    let mut orphaned = BTreeSet::new();
    for (ns, wf) in owners {
        if Api::<Workflow>::namespaced(client.clone(), &ns)
            .get_metadata_opt(&wf)
            .await?
            .is_none()
        {
            orphaned.insert((ns, wf));
        }
    }
    let mut queued = 0;
    for pod in pods {
        let (Some(ns), Some(wf), Some(uid)) = (
            pod.namespace(),
            pod.labels().get(labels::WORKFLOW),
            pod.uid(),
        ) else {
            continue;
        };
        if pod.metadata.deletion_timestamp.is_some()
            || !orphaned.contains(&(ns.clone(), wf.clone()))
        {
            continue;
        }
        debug!(
            pod = pod.name_any(),
            namespace = ns,
            workflow = wf,
            "orphan pod"
        );
        queue.add(
            key.clone(),
            Class::Background,
            WorkItem {
                namespace: ns,
                work: DeleteWork::Pod {
                    name: pod.name_any(),
                    uid,
                },
            },
        );
        queued += 1;
    }
    Ok(queued)
}
