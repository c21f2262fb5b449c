//! Fairness between flows: each namespace's requests of one priority (the
//! delete workers' tokens among them, taken in the namespace of the item they
//! leased) wait for a token one at a time, so the bucket's line (see
//! `classes`) holds at most one request per flow and priority and serves the
//! flows of a priority in turn. A tenant with
//! thousands of requests queued delays another's by one token, not by
//! thousands. Inside a namespace, the askers (see [`on_behalf_of`]) take turns the
//! same way: one request per asker waits in the namespace's line. A flow can
//! also be paused alone (API Priority and Fairness rejected one of its
//! requests) while the others go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Bucket;
use super::classes::Priority;

tokio::task_local! {
    /// Who the current task's requests are for (see [`on_behalf_of`]).
    static ASKER: Arc<str>;
}

/// Runs `work` with its API requests counted as `asker`'s: inside their
/// namespace they take turns with other askers' requests, not behind them.
pub async fn on_behalf_of<F: std::future::Future>(asker: Arc<str>, work: F) -> F::Output {
    ASKER.scope(asker, work).await
}

/// The asker of the current task's requests, if it set one.
pub(super) fn asker() -> Option<Arc<str>> {
    ASKER.try_with(Arc::clone).ok()
}

/// The flow of one asker's requests inside namespace `flow`.
pub(super) fn of_asker(flow: &str, asker: &str) -> String {
    format!("{flow}\u{0}{asker}")
}

/// The flow of namespace `flow`'s requests at `priority`: a namespace waits in one line per
/// priority, so its reports never hold back its own retries.
pub(super) fn of_priority(flow: &str, priority: Priority) -> String {
    format!("{flow}\u{1}{}", priority.as_str())
}

/// The flow of a request to `path`: its namespace, or "" for requests about
/// no namespace (cluster-scoped objects, lists across namespaces).
pub(super) fn of(path: &str) -> &str {
    let mut parts = path.split('/');
    while let Some(part) = parts.next() {
        if part == "namespaces" {
            // `/api/v1/namespaces/NAME` is the namespace object itself.
            return match (parts.next(), parts.next()) {
                (Some(namespace), Some(_)) => namespace,
                _ => "",
            };
        }
    }
    ""
}

/// One flow's line for each bucket, and its pause.
#[derive(Default)]
struct Flow {
    lines: [Arc<tokio::sync::Mutex<()>>; 2],
    paused_until: Option<Instant>,
}

/// Every flow with a request waiting or a pause running; the others are
/// forgotten, so the map holds only what is active.
#[derive(Default)]
pub(super) struct Flows {
    flows: Mutex<HashMap<Arc<str>, Flow>>,
}

/// A flow's turn to wait for a token; dropping it lets its next request in.
pub(super) struct Turn<'a> {
    flows: &'a Flows,
    name: Arc<str>,
    line: usize,
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl Flow {
    /// Whether nobody waits in its lines (but `holding`, the line whose
    /// guard the caller still holds) and no pause runs.
    fn idle(&self, holding: Option<usize>) -> bool {
        let waiting = self.lines.iter().enumerate().any(|(i, line)| {
            // The map holds one reference, a held guard another.
            Arc::strong_count(line) > 1 + usize::from(holding == Some(i))
        });
        !waiting && self.paused_until.is_none_or(|u| u <= Instant::now())
    }
}

impl Flows {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Flow>> {
        self.flows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for `flow`'s turn to take a token of `bucket`.
    pub(super) async fn turn(&self, flow: &str, bucket: Bucket) -> Turn<'_> {
        let (name, line) = {
            let mut flows = self.lock();
            let name: Arc<str> = flow.into();
            let entry = flows.entry(name.clone()).or_default();
            (name, entry.lines[bucket.index()].clone())
        };
        Turn {
            flows: self,
            name,
            line: bucket.index(),
            _held: line.lock_owned().await,
        }
    }

    /// When `flow`'s pause ends, if it is paused.
    pub(super) fn paused_until(&self, flow: &str) -> Option<Instant> {
        let mut flows = self.lock();
        let entry = flows.get(flow)?;
        let until = entry.paused_until.filter(|until| *until > Instant::now());
        // A namespace's pause is kept apart from its lines (one per priority): the first
        // look after it ended forgets it.
        if until.is_none() && entry.idle(None) {
            flows.remove(flow);
        }
        until
    }

    /// Pauses `flow` for `pause` (a longer pause already ordered stays).
    pub(super) fn pause(&self, flow: &str, pause: Duration) {
        let until = Instant::now() + pause;
        let mut flows = self.lock();
        // Forget the flows whose pauses ended with nobody waiting.
        flows.retain(|_, f| !f.idle(None));
        let entry = flows.entry(flow.into()).or_default();
        entry.paused_until = Some(entry.paused_until.map_or(until, |u| u.max(until)));
    }

    /// Flows held in memory (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut flows = self.flows.lock();
        if flows
            .get(&self.name)
            .is_some_and(|f| f.idle(Some(self.line)))
        {
            flows.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_s_flow_is_its_namespace() {
        assert_eq!(of("/api/v1/namespaces/argo/pods"), "argo");
        assert_eq!(
            of("/apis/argoproj.io/v1alpha1/namespaces/team-a/workflows/wf"),
            "team-a"
        );
        assert_eq!(of("/api/v1/namespaces/argo"), "");
        assert_eq!(of("/api/v1/pods"), "");
        assert_eq!(of("/apis/rewind.dev/v1alpha1/workflowretries"), "");
    }
}
