//! The deletion engine: a plan's pods deleted exactly, in priority order,
//! within the API budget.
//!
//! [`drive`] is the one loop every request deletes with (list, assess,
//! queue, await, count); [`assess`] decides the exact requests, [`queue`]
//! orders them, [`workers`] send them through the [`budget`].

pub mod assess;
pub mod budget;
pub mod drive;
pub mod fault;
pub mod pods;
pub mod queue;
pub mod workers;

use std::sync::Arc;

use workers::{Outcomes, Queue};

/// What the engine counts for metrics; every method defaults to nothing.
pub trait Observer: Send + Sync {
    /// Pods removed (deleted, or released from Argo's finalizer).
    fn pods_deleted(&self, _n: usize) {}
    /// Delete work not sent at its turn, and why.
    fn unsent(&self, _why: workers::Unsent) {}
}

/// Counts nothing.
pub struct Unobserved;

impl Observer for Unobserved {}

/// What a request deletes with: the budgeted client, the shared queue and
/// the workers' answers; clones share them.
#[derive(Clone)]
pub struct Engine {
    pub client: kube::Client,
    pub queue: Queue,
    pub outcomes: Outcomes,
    pub observer: Arc<dyn Observer>,
}
