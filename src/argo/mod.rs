//! Argo's semantics, as Argo's own Go code defines them, with no knowledge of
//! the controller: what a workflow is, how Argo retries one, how it
//! compresses, archives and offloads it.

pub mod db;
pub mod offload;
pub mod plan;
pub mod workflow;

/// Runs CPU-heavy Argo work (inflating, planning or compressing a large
/// workflow's nodes) on tokio's blocking pool and waits for it, so the async
/// workers (the watches, the Lease renewal, the probes) never wait behind it:
/// with the Lease client's timeout at a ninth of the Lease, a large workflow
/// compressed on a one-CPU pod's only worker could cost the Lease. Not
/// `block_in_place`: that panics on a current-thread runtime and still holds
/// the worker's other tasks. A panic in `work` goes on in the caller's task,
/// as if it ran there.
pub async fn off_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("work on the blocking pool was cancelled: {e}"),
        },
    }
}
