//! Background garbage collection of orphan pods: pods labelled with a
//! workflow that no longer exists and owned by nothing (a workflow deleted
//! with `--cascade=orphan`, say). A pod with an owner is left to its owner
//! and to Kubernetes' own garbage collector, which deletes the dependents
//! of a deleted workflow; a pod of another Argo instance is not this
//! controller's.
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
use crate::retry::Scope;

/// Finds orphan pods in `namespaces` (all when empty) every `interval` and
/// queues their deletion as background work, until `shutdown`.
pub async fn run(engine: Engine, scope: Scope, interval: Duration, shutdown: CancellationToken) {
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
                match sweep(&client, &scope, &queue, &key).await {
                    Ok(0) => {}
                    Ok(n) => info!(pods = n, "queued orphan pods for deletion"),
                    Err(e) => warn!(error = %e, "orphan pod sweep failed; trying again next interval"),
                }
            }
        }
    }
    outcomes.unregister(&key);
}

/// Pods per page of the sweep's list: a page is one read of the budget and
/// a bounded answer to hold, however many pods the cluster has.
const PAGE: u32 = 500;

/// One sweep: returns how many pods it queued.
async fn sweep(
    client: &Client,
    scope: &Scope,
    queue: &Queue,
    key: &RequestKey,
) -> Result<usize, kube::Error> {
    let apis: Vec<Api<Pod>> = super::watch::scoped_apis(client, scope);
    let selector = format!("{},{}", labels::WORKFLOW, scope.label_selector());
    let mut queued = 0;
    for api in apis {
        let mut page = ListParams::default().labels(&selector).limit(PAGE);
        loop {
            let answer = api.list_metadata(&page).await?;
            queued += queue_orphans(client, answer.items, queue, key).await?;
            match answer.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => page = page.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(queued)
}

/// Queues the deletion of the orphans among `pods`; returns how many.
async fn queue_orphans(
    client: &Client,
    pods: Vec<PartialObjectMeta<Pod>>,
    queue: &Queue,
    key: &RequestKey,
) -> Result<usize, kube::Error> {
    let candidates: Vec<PartialObjectMeta<Pod>> = pods
        .into_iter()
        .filter(|pod| {
            pod.owner_references().is_empty() && pod.metadata.deletion_timestamp.is_none()
        })
        .collect();
    // Ask the API server, not a cache, whether each workflow exists: a cache
    // that lags behind a new workflow would make its pods look orphaned.
    let mut owners: BTreeSet<(String, String)> = BTreeSet::new();
    for pod in &candidates {
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
    for pod in candidates {
        let (Some(ns), Some(wf), Some(uid)) = (
            pod.namespace(),
            pod.labels().get(labels::WORKFLOW),
            pod.uid(),
        ) else {
            continue;
        };
        if !orphaned.contains(&(ns.clone(), wf.clone())) {
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
