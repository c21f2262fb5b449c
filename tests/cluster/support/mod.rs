//! What the tests share. A test module imports its helpers and fixtures from here, never
//! from another test module.

pub mod archived;
pub mod argo_api;
pub mod argodb;
pub mod argos_retry;
pub mod chart;
pub mod controller;
pub mod dashboard_png;
pub mod grants;
pub mod helm;
pub mod invariants;
// The chart's dashboard and alerts as files, shared with tests/monitoring.rs.
#[allow(dead_code)]
#[path = "../../support/monitoring.rs"]
pub mod monitoring_files;
pub mod pod_policy;
pub mod process;
pub mod refusal;
pub mod replica;
pub mod workflowretry;

use std::sync::Arc;

use futures::future::BoxFuture;
use rewind::testenv::localcluster::LocalCluster;

/// A test: gets the shared cluster and the name of its own fresh namespace.
pub type Test = fn(Arc<LocalCluster>, String) -> BoxFuture<'static, anyhow::Result<()>>;

/// A valid namespace name (DNS label) unique to the test.
pub fn namespace_for(test: &str) -> String {
    let name: String = test
        .rsplit("::")
        .next()
        .unwrap_or(test)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned()
}
