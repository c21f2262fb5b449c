//! The request flows: a live retry (annotations on a workflow), an archived
//! retry, and a WorkflowRetry object serving either; [`report`] tells the
//! user how each ends, in one way for all.

pub mod admission;
pub mod archived;
pub mod cache;
pub mod live;
pub mod object;
pub mod pickup;
pub mod progress;
pub mod recorder;
pub mod report;
pub mod workflowretry;

use std::sync::Arc;
use std::time::Duration;

use crate::argo::db::ArgoDatabase;
use crate::argo::plan::{self, ArgoVersion, RetryOptions};
use crate::argo::workflow::labels;
use crate::engine::Engine;
use crate::engine::drive::DriveConfig;
use crate::protocol::request::RequestOptions;
use crate::telemetry::metrics::Metrics;

/// DeleteCollections per bulk delete by default (docs/operating.md, "Beyond the serial floor").
pub const DEFAULT_BULK_PARALLELISM: usize = 1;

/// Settings shared by every retry.
#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Use DeleteCollection where it is provably exact.
    pub allow_bulk: bool,
    /// Split a bulk delete into this many DeleteCollections by node, sent
    /// side by side (see [`crate::engine::assess::split_by_node`]).
    pub bulk_parallelism: usize,
    pub argo_version: ArgoVersion,
    pub max_workflow_size: usize,
    /// How the cluster's Argo compresses nodes (its WORKFLOW_COMPRESSION_* settings).
    pub compression: plan::compress::Compression,
    /// Least time between two progress writes of a request's status (the
    /// final one is never held back).
    pub status_interval: Duration,
    /// How often to look again at plan pods terminating gracefully.
    pub terminating_poll: Duration,
    /// How long a plan pod may stay terminating before its request fails,
    /// naming it (see [`DriveConfig::terminating_timeout`]).
    pub terminating_timeout: Duration,
    /// How long a plan pod may wait for Argo to finish with it (see
    /// [`DriveConfig::settle_timeout`]), and what then.
    pub settle_timeout: Duration,
    pub on_settle_timeout: crate::engine::drive::OnSettleTimeout,
    /// Argo's `ALWAYS_OFFLOAD_NODE_STATUS`: with a database, nodes are always offloaded.
    pub always_offload_node_status: bool,
    /// The most bytes a workflow's `compressedNodes` may inflate to.
    pub max_nodes_size: usize,
    /// Planned pods in deletion at once, across retries.
    pub max_pods_in_flight: usize,
    /// WorkflowRetry objects served at once in one namespace; the others wait their turn.
    pub max_open_per_namespace: usize,
}

/// What the controller needs beside a retry's nodes (docs/operating.md, "Memory sizing": 3 ×
/// the largest workflow's nodes JSON plus this).
pub const MEMORY_BESIDE_NODES: u64 = 64 << 20;

/// The most a derived `--max-nodes-size` may be: past a gigabyte of nodes JSON (a million
/// nodes) a limit is a decompression bomb's bound, whatever memory the pod was given (without a
/// limit, the downward API gives the node's whole allocatable memory).
const MAX_DERIVED_NODES_SIZE: u64 = 1 << 30;

/// The most bytes of nodes JSON a retry may read under a memory limit of `limit` bytes, by the
/// sizing rule above (a retry peaks at about three times its nodes' JSON): at least 1 MiB, at
/// most [`MAX_DERIVED_NODES_SIZE`]. 320 MiB (the chart's limit) gives 85.3 MiB.
pub fn max_nodes_size_within(limit: u64) -> usize {
    let size =
        (limit.saturating_sub(MEMORY_BESIDE_NODES) / 3).clamp(1 << 20, MAX_DERIVED_NODES_SIZE);
    usize::try_from(size).unwrap_or(usize::MAX)
}

/// WorkflowRetry objects served at once per namespace by default: a namespace's burst waits
/// in the controller at a few dozen bytes each, not a task each (docs/operating.md, "Many
/// tenants").
pub const DEFAULT_MAX_OPEN_PER_NAMESPACE: usize = 20;

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            allow_bulk: true,
            bulk_parallelism: DEFAULT_BULK_PARALLELISM,
            argo_version: ArgoVersion::default(),
            max_workflow_size: plan::compress::DEFAULT_MAX_WORKFLOW_SIZE,
            compression: Default::default(),
            status_interval: Duration::from_secs(2),
            terminating_poll: Duration::from_millis(500),
            terminating_timeout: crate::engine::drive::DEFAULT_TERMINATING_TIMEOUT,
            settle_timeout: crate::engine::drive::DEFAULT_SETTLE_TIMEOUT,
            on_settle_timeout: Default::default(),
            always_offload_node_status: false,
            max_nodes_size: plan::compress::DEFAULT_MAX_NODES_SIZE,
            max_pods_in_flight: admission::DEFAULT_MAX_PODS,
            max_open_per_namespace: DEFAULT_MAX_OPEN_PER_NAMESPACE,
        }
    }
}

impl RetryConfig {
    /// How a request deletes its pods.
    pub fn drive(&self) -> DriveConfig {
        DriveConfig {
            allow_bulk: self.allow_bulk,
            bulk_parallelism: self.bulk_parallelism,
            terminating_poll: self.terminating_poll,
            // The sinks decide what is worth a write. A person watching a
            // count expects it to move each second; half a second leaves room
            // for a write's latency (a one-second tick left an 8,000-pod
            // count still for up to 1.26 s).
            tick: self.status_interval.min(Duration::from_millis(500)),
            terminating_timeout: self.terminating_timeout,
            settle_timeout: self.settle_timeout,
            on_settle_timeout: self.on_settle_timeout,
        }
    }

    /// The planner's options for a request's `options`. With a database
    /// that offloads, the flow dehydrates (compresses or offloads) the reset
    /// workflow itself, as Argo's server does, so the planner does not stop
    /// at the size limit.
    pub fn plan_options(&self, options: RequestOptions, offloads: bool) -> RetryOptions {
        RetryOptions {
            restart_successful: options.restart_successful,
            node_field_selector: options.node_field_selector,
            parameters: options.parameters,
            argo_version: self.argo_version,
            max_workflow_size: match offloads {
                true => usize::MAX,
                false => self.max_workflow_size,
            },
            compression: self.compression.clone(),
            max_nodes_size: self.max_nodes_size,
        }
    }
}

/// Which workflows this controller serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Namespaces to watch; empty means all namespaces.
    pub namespaces: Vec<String>,
    /// Serve only workflows labelled with this Argo controller instance ID;
    /// `None` serves only workflows without the label, as Argo does.
    pub instance_id: Option<String>,
}

impl Scope {
    /// The label selector that picks this instance's workflows.
    pub fn label_selector(&self) -> String {
        match &self.instance_id {
            Some(id) => format!("{}={id}", labels::CONTROLLER_INSTANCE_ID),
            None => format!("!{}", labels::CONTROLLER_INSTANCE_ID),
        }
    }
}

/// What every request needs from the controller.
#[derive(Clone)]
pub struct Context {
    /// The budgeted client, the queue and the delete workers' answers.
    pub engine: Engine,
    pub recorder: recorder::Recorder,
    pub config: RetryConfig,
    pub scope: Scope,
    /// The watched workflows' metadata.
    pub workflows: Arc<cache::WorkflowCache>,
    /// The bound on planned pods in deletion at once.
    pub admission: admission::Admission,
    /// Live requests' progress for the WorkflowRetry objects that asked them.
    pub progress: progress::Board,
    pub metrics: Arc<Metrics>,
    /// Argo's database, when its persistence is configured: archived
    /// workflows and offloaded node status.
    pub database: Option<Arc<dyn ArgoDatabase>>,
}

impl Context {
    /// The budgeted client.
    pub fn client(&self) -> kube::Client {
        self.engine.client.clone()
    }

    /// Argo's database, if it offloads node status.
    pub fn offloading(&self) -> Option<&dyn ArgoDatabase> {
        self.database.as_deref().filter(|db| db.offloads())
    }

    /// Writes the nodes of the reset `wf` as Argo's server does: compressed
    /// over the size limit, offloaded to `db` when still too large (or always).
    pub async fn dehydrate(
        &self,
        db: &dyn ArgoDatabase,
        wf: &mut crate::argo::workflow::Workflow,
    ) -> Result<(), crate::argo::offload::OffloadError> {
        let config = &self.config;
        crate::argo::offload::dehydrate(
            db,
            wf,
            config.max_workflow_size,
            &config.compression,
            config.argo_version,
            config.always_offload_node_status,
        )
        .await
    }
}

/// Plans the retry of `wf` on the blocking pool (see [`crate::argo::off_thread`]):
/// a large workflow takes a while to decompress and plan. The workflow is
/// given up to the planner, which moves its nodes into the plan instead of
/// copying them.
pub async fn plan_off_thread(
    wf: crate::argo::workflow::Workflow,
    options: RetryOptions,
) -> Result<plan::Plan, plan::PlanError> {
    crate::argo::off_thread(move || plan::plan_retry_owned(wf, &options)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_a_retry_may_read_follow_the_memory_limit() {
        const MIB: u64 = 1 << 20;
        // The chart's limit: (320 - 64) / 3 MiB.
        assert_eq!(max_nodes_size_within(320 * MIB), (256 * MIB / 3) as usize);
        // A retry of that size peaks at about three times it, beside the rest: within the limit.
        assert!(3 * max_nodes_size_within(320 * MIB) as u64 + MEMORY_BESIDE_NODES <= 320 * MIB);
        // A limit too small for the rule still reads a small workflow; a node's whole memory
        // (no limit set) still bounds a decompression bomb.
        assert_eq!(max_nodes_size_within(32 * MIB), MIB as usize);
        assert_eq!(max_nodes_size_within(256 << 30), 1 << 30);
    }
}
