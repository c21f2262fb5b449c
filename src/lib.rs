//! rewind: retries failed Argo Workflows, live and archived, fast and politely.
//!
//! The library holds the logic; the `rewind` binary is a thin layer over it.

pub mod budget;
pub mod controller;
pub mod delete;
pub mod queue;
pub mod request;
pub mod server;
pub mod telemetry;
pub mod workflow;
