//! Argo's semantics, as Argo's own Go code defines them, with no knowledge of
//! the controller: what a workflow is, how Argo retries one, how it
//! compresses, archives and offloads it.

pub mod db;
pub mod offload;
pub mod plan;
pub mod workflow;
