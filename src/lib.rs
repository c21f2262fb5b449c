//! rewind: retries failed Argo Workflows, live and archived, fast and politely.
//!
//! The library holds the logic; the `rewind` binary is a thin layer over it.

pub mod plan;
pub mod workflow;
