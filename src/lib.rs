//! rewind: retries failed Argo Workflows, live and archived, fast and politely.
//!
//! The library holds the logic; the `rewind` binary is a thin layer over it.
//! Layers, each a folder, import only the layers above them in this list
//! (`tests/layers.rs` checks it, and that no module imports in a cycle):
//!
//! - [`argo`]: Argo's semantics: workflow types, the retry planner, node
//!   compression, the archive and offload tables. No controller knowledge.
//! - [`protocol`]: the user contract: request annotations, status, the
//!   WorkflowRetry resource, the hints refusals carry.
//! - [`engine`]: the deletion engine: queue, API budget, assessment, delete
//!   workers, and the one loop that deletes a plan's pods.
//! - [`telemetry`]: metrics (the process's own among them) and logging.
//! - [`retry`]: the request flows: a live retry, an archived retry, a
//!   WorkflowRetry object, and how each reports its end.
//! - [`client`]: what `rewind retry` and `rewind status` do: ask for a
//!   request and follow it (it uses `argo`, `protocol` and `engine` only).
//! - [`argoapi`]: the Argo Server's two retry calls, served: Argo's shapes,
//!   authentication and authorization as Argo's, each call asked and
//!   followed through `client`.
//! - [`controller`]: the wiring: watches, dispatch, pod GC, leader election,
//!   HTTP endpoints, Argo's retry API.
//! - `testenv` (feature `testenv`, off by default): the local control plane,
//!   databases, Argo fixtures, Prometheus on loopback and benchmark machinery
//!   for tests, benchmarks and the demo. The product never carries it.

pub mod argo;
pub mod argoapi;
pub mod client;
pub mod controller;
pub mod engine;
pub mod protocol;
pub mod retry;
pub mod telemetry;
#[cfg(feature = "testenv")]
pub mod testenv;
