//! Priority between kinds of work: which waiting request takes a bucket's next token.
//!
//! The flows (see `flows`) let at most one request per flow wait for a token; this line
//! orders those waiters by [`Priority`], and inside a priority by fair turns between
//! namespaces, and lets one waiter at a time into the token bucket. The turns are start-time
//! fair queueing's (Goyal, Vin and Cheng): a namespace's request is tagged with the round it
//! may go in, the round being served or, for a namespace that just had a token, the next
//! one; the lowest tag goes first, the first come among equals. A namespace that comes with
//! its first request in a while so goes in the round under way, not behind every busy
//! namespace's next request too (as a plain first-come line had it: with 100 namespaces
//! busy, a quiet one's each step waited a whole round). The choice is made when a token is about to be
//! taken, not when a request began to wait: a retry's write that arrives while a thousand
//! reports wait goes next. A lower priority is never starved: while it waits, it takes at
//! least one token in [`FLOOR`] + 1.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// What a request is for, most urgent first; set for a task with [`with_priority`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Work a person waits for: a retry's reads, deletes, reset and status (the default).
    Retry,
    /// The answer to a request that failed, most often at once (its workflow missing, a bad
    /// spec): after every retry's work, so a burst of refusals never delays a retry.
    Answer,
    /// Work nobody waits for: pod garbage collection.
    Background,
    /// Words about work, best effort: Events, notes that a request waits. A caller bounds its
    /// wait and drops the write past it (see [`crate::retry::report`]).
    Report,
}

impl Priority {
    pub const ALL: [Priority; 4] = [
        Priority::Retry,
        Priority::Answer,
        Priority::Background,
        Priority::Report,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Retry => "retry",
            Priority::Answer => "answer",
            Priority::Background => "background",
            Priority::Report => "report",
        }
    }
}

tokio::task_local! {
    static PRIORITY: Priority;
}

/// Runs `work` with its API requests at `priority`.
pub async fn with_priority<F: Future>(priority: Priority, work: F) -> F::Output {
    PRIORITY.scope(priority, work).await
}

/// The priority of the current task's requests ([`Priority::Retry`] unless it set one).
pub(super) fn priority() -> Priority {
    PRIORITY.try_with(|p| *p).unwrap_or(Priority::Retry)
}

/// Tokens a more urgent priority may take in a row while a less urgent one waits.
pub(super) const FLOOR: u32 = 10;

/// The line in front of one bucket; see the module's comment.
#[derive(Default)]
pub(super) struct Line {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// A waiter is in the bucket (or on its way to it).
    busy: bool,
    /// Waiters that hold a scarce slot (see [`Line::enter_ahead`]), served before any
    /// priority.
    ahead: VecDeque<Waiter>,
    waiting: [Rounds<oneshot::Sender<()>>; 4],
    /// Tokens given to a more urgent priority while this one waited, since its last.
    passed_over: [u32; 4],
    next_id: u64,
}

struct Waiter {
    id: u64,
    go: oneshot::Sender<()>,
}

/// One priority's waiters (`W`: each one's signal), by the round each may go in (see the
/// module's comment).
struct Rounds<W> {
    /// (round, arrival) -> the waiter.
    waiters: BTreeMap<(u64, u64), W>,
    /// The round being served.
    current: u64,
    /// Each namespace's next round, kept while it is ahead of the current one.
    next_of: HashMap<Box<str>, u64>,
}

impl<W> Default for Rounds<W> {
    fn default() -> Self {
        Rounds {
            waiters: BTreeMap::new(),
            current: 0,
            next_of: HashMap::new(),
        }
    }
}

impl<W> Rounds<W> {
    /// Queues waiter `id` of namespace `flow`; the round it goes in.
    fn push(&mut self, flow: &str, id: u64, go: W) -> u64 {
        let round = self
            .next_of
            .get(flow)
            .map_or(self.current, |r| (*r).max(self.current));
        self.next_of.insert(flow.into(), round + 1);
        self.waiters.insert((round, id), go);
        round
    }

    /// The next waiter, its round now the current one.
    fn pop(&mut self) -> Option<W> {
        let ((round, _), go) = self.waiters.pop_first()?;
        self.current = round;
        // A namespace whose next round has come is the same as one never seen: forget it,
        // so the map holds the namespaces with recent turns, not every one ever seen.
        if self.next_of.len() > 2 * self.waiters.len() + 64 {
            self.next_of.retain(|_, next| *next > round);
        }
        Some(go)
    }

    fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }
}

/// The right to take the bucket's next token; dropping it lets the next waiter in.
pub(super) struct Pass {
    state: Arc<Mutex<State>>,
}

impl Line {
    /// Waits until it is this request's turn, at `priority` and among namespaces (`flow`
    /// is the request's), to take a token.
    pub(super) async fn enter(&self, priority: Priority, flow: &str) -> Pass {
        self.wait(Some((priority, flow))).await
    }

    /// Waits for the next token before any priority: for a request that holds a slot few
    /// others can have (a DeleteCollection's), so the slot is not held while the line moves.
    /// Their number is bounded by those slots.
    pub(super) async fn enter_ahead(&self) -> Pass {
        self.wait(None).await
    }

    /// Waits in `priority`'s line as namespace `flow`, or ahead of them all.
    async fn wait(&self, priority: Option<(Priority, &str)>) -> Pass {
        let (id, round, go) = {
            let mut state = lock(&self.state);
            if !state.busy {
                state.busy = true;
                return Pass {
                    state: self.state.clone(),
                };
            }
            let id = state.next_id;
            state.next_id += 1;
            let (go, gone) = oneshot::channel();
            let round = match priority {
                Some((priority, flow)) => state.waiting[priority.index()].push(flow, id, go),
                None => {
                    state.ahead.push_back(Waiter { id, go });
                    0
                }
            };
            (id, round, gone)
        };
        let mut waiting = Waiting {
            state: &self.state,
            id,
            round,
            priority: priority.map(|(p, _)| p),
            armed: true,
        };
        // The sender is dropped only after it sent: a waiter is removed from the line
        // either by `next` (which sends) or by `Waiting`'s drop.
        let _ = go.await;
        waiting.armed = false;
        Pass {
            state: self.state.clone(),
        }
    }

    /// Waiters in the line, for tests.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        lock(&self.state)
            .waiting
            .iter()
            .map(|r| r.waiters.len())
            .sum()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Hands the bucket to the next waiter, or marks it free.
    fn next(&mut self) {
        if let Some(waiter) = self.ahead.pop_front() {
            // See the send below.
            let _ = waiter.go.send(());
            self.busy = true;
            return;
        }
        let chosen = Priority::ALL
            .iter()
            .rev()
            .find(|p| self.passed_over[p.index()] >= FLOOR && !self.waiting[p.index()].is_empty())
            .or_else(|| {
                Priority::ALL
                    .iter()
                    .find(|p| !self.waiting[p.index()].is_empty())
            })
            .copied();
        let Some(chosen) = chosen else {
            self.busy = false;
            return;
        };
        for p in Priority::ALL {
            if p == chosen || self.waiting[p.index()].is_empty() {
                continue;
            }
            if p > chosen {
                self.passed_over[p.index()] += 1;
            }
        }
        self.passed_over[chosen.index()] = 0;
        let go = self.waiting[chosen.index()]
            .pop()
            .expect("the chosen priority has a waiter");
        // A waiter whose future was dropped after this removal holds the bucket until its
        // `Waiting` drop passes it on, so the send's result does not matter here.
        let _ = go.send(());
        self.busy = true;
    }
}

/// A waiter in the line; dropped before its turn came, it leaves the line, and dropped
/// after, it passes the turn on.
struct Waiting<'a> {
    state: &'a Mutex<State>,
    id: u64,
    round: u64,
    /// `None` when waiting ahead of the priorities.
    priority: Option<Priority>,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(self.state);
        let left = match self.priority {
            Some(p) => state.waiting[p.index()]
                .waiters
                .remove(&(self.round, self.id))
                .is_some(),
            None => match state.ahead.iter().position(|w| w.id == self.id) {
                Some(at) => state.ahead.remove(at).is_some(),
                None => false,
            },
        };
        // Its turn came as it was dropped: the next waiter's, then.
        if !left {
            state.next();
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        lock(&self.state).next();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Grants in the order they happen, each waiter holding the bucket for `hold`.
    async fn order(arrivals: Vec<(Priority, &'static str)>, hold: Duration) -> Vec<&'static str> {
        let line = Arc::new(Line::default());
        let first = line.enter(Priority::Retry, "ns").await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (priority, name) in arrivals {
            let (line, log) = (line.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                let _pass = line.enter(priority, name).await;
                log.lock().unwrap().push(name);
                tokio::time::sleep(hold).await;
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        log.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_more_urgent_waiter_goes_first_then_first_come_first_served() {
        use Priority::*;
        let got = order(
            vec![
                (Report, "r1"),
                (Background, "b1"),
                (Retry, "u1"),
                (Retry, "u2"),
            ],
            Duration::from_millis(1),
        )
        .await;
        assert_eq!(got, ["u1", "u2", "b1", "r1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_less_urgent_waiter_gets_a_token_in_every_floor_plus_one() {
        use Priority::*;
        let mut arrivals = vec![(Report, "report")];
        arrivals.extend(std::iter::repeat_n((Retry, "retry"), 12));
        let got = order(arrivals, Duration::from_millis(1)).await;
        let at = got.iter().position(|n| *n == "report").unwrap();
        assert_eq!(at, FLOOR as usize, "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_dropped_before_or_at_its_turn_never_stalls_the_line() {
        let line = Arc::new(Line::default());
        let first = line.enter(Priority::Retry, "ns").await;
        let gone = {
            let line = line.clone();
            tokio::spawn(async move { line.enter(Priority::Retry, "ns").await })
        };
        tokio::task::yield_now().await;
        let next = {
            let line = line.clone();
            tokio::spawn(async move { drop(line.enter(Priority::Report, "ns").await) })
        };
        tokio::task::yield_now().await;
        assert_eq!(line.waiting(), 2);
        gone.abort();
        let _ = gone.await;
        assert_eq!(line.waiting(), 1, "an aborted waiter leaves the line");
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("the next waiter got its turn")
            .unwrap();
        // Free again: the next comer enters at once.
        tokio::time::timeout(Duration::from_millis(1), line.enter(Priority::Report, "ns"))
            .await
            .expect("the line is free");
    }
}

#[cfg(test)]
mod rounds {
    use super::*;

    #[test]
    fn a_namespace_back_after_a_while_goes_in_the_round_under_way() {
        let mut rounds = Rounds::default();
        let mut id = 0;
        let mut push = |rounds: &mut Rounds<&'static str>, flow: &'static str| {
            id += 1;
            rounds.push(flow, id, flow);
        };
        for flow in ["a", "b", "c"] {
            push(&mut rounds, flow);
        }
        let mut served = vec![rounds.pop().unwrap()];
        // Busy namespaces ask again as soon as they were served: their next round.
        push(&mut rounds, served[0]);
        served.push(rounds.pop().unwrap());
        push(&mut rounds, served[1]);
        push(&mut rounds, "quiet");
        while let Some(flow) = rounds.pop() {
            served.push(flow);
        }
        assert_eq!(served, ["a", "b", "c", "quiet", "a", "b"]);
    }

    #[test]
    fn namespaces_are_forgotten_once_the_rounds_passed_their_turns() {
        let mut rounds = Rounds::default();
        for id in 0..1000 {
            rounds.push(&format!("ns-{id}"), id, ());
            rounds.pop();
        }
        // Each went once in round 0, the round still under way: each waits for round 1.
        assert_eq!(rounds.next_of.len(), 1000);
        for id in 1000..1003 {
            rounds.push("busy", id, ());
            rounds.pop();
        }
        assert_eq!(rounds.next_of.len(), 1, "{:?}", rounds.next_of);
    }
}

#[cfg(test)]
mod ahead {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slot_holder_goes_before_every_priority() {
        let line = Arc::new(Line::default());
        let first = line.enter(Priority::Retry, "ns").await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (ahead, name) in [(false, "retry"), (true, "slot")] {
            let (line, log) = (line.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                let _pass = match ahead {
                    true => line.enter_ahead().await,
                    false => line.enter(Priority::Retry, "ns").await,
                };
                log.lock().unwrap().push(name);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*log.lock().unwrap(), ["slot", "retry"]);
    }
}
