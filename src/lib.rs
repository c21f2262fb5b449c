//! rewind: retries failed Argo Workflows, live and archived, fast and politely.
//!
//! The library holds the logic; the `rewind` binary is a thin layer over it.

pub mod archive;
pub mod archived;
pub mod budget;
pub mod controller;
pub mod delete;
pub mod follow;
pub mod gc;
pub mod hint;
pub mod leader;
pub mod metrics;
pub mod offload;
pub mod plan;
pub mod queue;
pub mod request;
pub mod retry;
pub mod server;
pub mod telemetry;
#[cfg(feature = "testenv")]
pub mod testenv;
pub mod watch;
pub mod workers;
pub mod workflow;
pub mod workflowretry;
