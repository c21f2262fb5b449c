//! The work queue between requests (retries, garbage collection) and the workers that spend the
//! API budget on their items (pod deletions).
//!
//! - Two classes: [`Class::Interactive`] is served before [`Class::Background`], with a floor
//!   against starving background work (see [`QueueConfig::background_max_wait`]).
//! - Within a class, requests take turns item by item (round-robin).
//! - An item key is queued at most once and leased to at most one worker at a time (client-go
//!   workqueue's dirty and processing sets); adding an item that is being processed queues it
//!   once more after its lease ends.
//! - Transient failures come back after a per-item exponential [`Backoff`] with jitter.

mod backoff;
mod fair;

pub use backoff::Backoff;

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use fair::Fair;

/// The key of a request that queues items: whom its outcomes go to, and the
/// lane its items take turns in (requests of one lane share their turns).
pub trait Request: Clone + Eq + Hash {
    type Lane: Clone + Eq + Hash;

    fn lane(&self) -> Self::Lane;
}

/// A string key is its own lane.
impl<'a> Request for &'a str {
    type Lane = &'a str;

    fn lane(&self) -> &'a str {
        self
    }
}

/// Priority class of a request's items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Work a user is waiting for (retries); always served first.
    Interactive,
    /// Work nobody waits for (garbage collection); served when no interactive item is ready, and
    /// at the floor rate otherwise.
    Background,
}

/// Tuning of a [`WorkQueue`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueConfig {
    /// The floor against starvation: when background items are ready but none has been leased
    /// for this long (because interactive items kept coming), the next lease goes to background.
    ///
    /// Under a steady interactive load background work therefore still advances by one item per
    /// `background_max_wait`. The clock restarts at every background lease, so the default
    /// (10 s) leaves a 100-pod retry (about 4 s at 20 QPS) untouched even when it arrives in the
    /// middle of a garbage-collection backlog, and costs a long retry at most one slot every 10 s.
    pub background_max_wait: Duration,
    /// Delays for [`WorkQueue::requeue`].
    pub backoff: Backoff,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            background_max_wait: Duration::from_secs(10),
            backoff: Backoff::default(),
        }
    }
}

/// What [`WorkQueue::add`] did with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// The item was not known; it is now queued.
    Queued,
    /// The item was already queued or waiting out a backoff; it stays queued once. An
    /// interactive add takes a background item over (its class and request change).
    Merged,
    /// The item is leased to a worker; it will be queued once more when that lease ends.
    AfterLease,
    /// The queue is shut down; nothing was queued.
    ShutDown,
}

/// One item handed to one worker. Exactly one of [`WorkQueue::done`], [`WorkQueue::requeue`] or
/// [`WorkQueue::requeue_after`] ends it; until then no other worker gets the same item.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease<K, R> {
    pub item: K,
    pub request: R,
    pub class: Class,
    /// Failures of this item in a row before this attempt.
    pub failures: u32,
}

/// Queue depths, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Items ready to be leased now, interactive class.
    pub interactive: usize,
    /// Items ready to be leased now, background class.
    pub background: usize,
    /// Items waiting out a backoff or a requested delay.
    pub waiting: usize,
    /// Items leased to workers.
    pub leased: usize,
}

/// Items of each class by state, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepths {
    pub interactive: ClassDepths,
    pub background: ClassDepths,
}

/// Items of one class: ready to lease, waiting out a backoff or delay, leased.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassDepths {
    pub ready: usize,
    pub waiting: usize,
    pub leased: usize,
}

/// The queue; clones share it.
pub struct WorkQueue<K, R: Request> {
    shared: Arc<Shared<K, R>>,
}

impl<K, R: Request> Clone for WorkQueue<K, R> {
    fn clone(&self) -> Self {
        WorkQueue {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<K, R: Request> {
    state: Mutex<State<K, R>>,
    changed: Notify,
}

impl<K, R> WorkQueue<K, R>
where
    K: Clone + Eq + Hash,
    R: Request,
{
    pub fn new(config: QueueConfig) -> Self {
        WorkQueue {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(config)),
                changed: Notify::new(),
            }),
        }
    }

    /// Queues `item` for `request` in `class`, once (see [`Added`]).
    pub fn add(&self, request: R, class: Class, item: K) -> Added {
        let added = self.state().add(request, class, item, Instant::now());
        if added == Added::Queued {
            self.shared.changed.notify_waiters();
        }
        added
    }

    /// Waits for the next ready item and leases it; `None` once the queue is shut down.
    pub async fn next(&self) -> Option<Lease<K, R>> {
        loop {
            // Registered before looking at the state, so a change made in between still wakes us.
            let mut changed = pin!(self.shared.changed.notified());
            changed.as_mut().enable();
            let wake_at = {
                let mut state = self.state();
                if state.shut_down {
                    return None;
                }
                let now = Instant::now();
                if let Some(lease) = state.lease(now) {
                    return Some(lease);
                }
                state.next_timer()
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Ends a successful lease: the item leaves the queue (unless it was added again meanwhile)
    /// and its failure count is reset.
    pub fn done(&self, lease: Lease<K, R>) {
        self.end(lease, Outcome::Done);
    }

    /// Ends a lease that failed transiently: the item comes back after its backoff, which is
    /// returned and grows with each failure in a row.
    pub fn requeue(&self, lease: Lease<K, R>) -> Duration {
        self.end(lease, Outcome::Failed).unwrap_or_default()
    }

    /// Ends a lease and brings the item back after `delay`, without counting a failure (for a
    /// delay the server asked for, such as Retry-After).
    pub fn requeue_after(&self, lease: Lease<K, R>, delay: Duration) {
        self.end(lease, Outcome::After(delay));
    }

    /// Resets the failure count of a queued or leased item, so its next backoff starts small.
    pub fn forget(&self, item: &K) {
        if let Some(entry) = self.state().entries.get_mut(item) {
            entry.failures = 0;
        }
    }

    /// Drops every queued or waiting item of `request` and cancels the re-adds of its leased
    /// items (their leases still end normally). Returns how many queued or waiting items went.
    pub fn cancel(&self, request: &R) -> usize {
        let dropped = self.state().cancel(request);
        tracing::debug!(dropped, "cancelled a request's queued work");
        dropped
    }

    /// Stops the queue: `next` returns `None` to every worker, now and later, and `add` queues
    /// nothing. Leased items may still be ended; nothing queued is handed out any more (work
    /// left over is found again by whoever restarts the controller).
    pub fn shutdown(&self) {
        self.state().shut_down = true;
        self.shared.changed.notify_waiters();
    }

    pub fn stats(&self) -> QueueStats {
        let mut state = self.state();
        state.fire_timers(Instant::now());
        QueueStats {
            interactive: state.interactive.ready(),
            background: state.background.ready(),
            waiting: state.waiting,
            leased: state.leased,
        }
    }

    /// Items by class and state, for metrics (one pass over every item).
    pub fn depths(&self) -> QueueDepths {
        let mut state = self.state();
        state.fire_timers(Instant::now());
        let mut depths = QueueDepths::default();
        for entry in state.entries.values() {
            let class = match entry.class {
                Class::Interactive => &mut depths.interactive,
                Class::Background => &mut depths.background,
            };
            match entry.slot {
                Slot::Ready => class.ready += 1,
                Slot::Waiting => class.waiting += 1,
                Slot::Leased { .. } => class.leased += 1,
            }
        }
        depths
    }

    /// Queued and waiting (not leased) items per request.
    pub fn request_depths(&self) -> HashMap<R, usize> {
        let mut depths = HashMap::new();
        for entry in self.state().entries.values() {
            if !matches!(entry.slot, Slot::Leased { .. }) {
                *depths.entry(entry.request.clone()).or_default() += 1;
            }
        }
        depths
    }

    fn end(&self, lease: Lease<K, R>, outcome: Outcome) -> Option<Duration> {
        let delay = self.state().end(lease.item, outcome, Instant::now());
        // Also wakes workers sleeping without a timer, so they see a new backoff deadline.
        self.shared.changed.notify_waiters();
        delay
    }

    fn state(&self) -> MutexGuard<'_, State<K, R>> {
        // The state is never left half-updated by a panic (no user code runs under the lock).
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

enum Outcome {
    Done,
    Failed,
    After(Duration),
}

struct Entry<R> {
    request: R,
    class: Class,
    failures: u32,
    /// Identifies the current lane entry or timer of this item; older ones are stale.
    ticket: u64,
    slot: Slot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Ready,
    Waiting,
    /// `again`: when to queue the item once more after the lease ends.
    Leased {
        again: Option<Instant>,
    },
}

struct Timer<K> {
    at: Instant,
    ticket: u64,
    item: K,
}

// Reversed so that `BinaryHeap` (a max-heap) yields the earliest timer first.
impl<K> Ord for Timer<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.ticket).cmp(&(self.at, self.ticket))
    }
}

impl<K> PartialOrd for Timer<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> PartialEq for Timer<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K> Eq for Timer<K> {}

struct State<K, R: Request> {
    config: QueueConfig,
    entries: HashMap<K, Entry<R>>,
    interactive: Fair<K, R::Lane>,
    background: Fair<K, R::Lane>,
    timers: BinaryHeap<Timer<K>>,
    waiting: usize,
    leased: usize,
    next_ticket: u64,
    /// Since when background items have been ready without a background lease.
    background_since: Option<Instant>,
    shut_down: bool,
    rng: fastrand::Rng,
}

impl<K, R> State<K, R>
where
    K: Clone + Eq + Hash,
    R: Request,
{
    fn new(config: QueueConfig) -> Self {
        State {
            config,
            entries: HashMap::new(),
            interactive: Fair::new(),
            background: Fair::new(),
            timers: BinaryHeap::new(),
            waiting: 0,
            leased: 0,
            next_ticket: 0,
            background_since: None,
            shut_down: false,
            rng: fastrand::Rng::new(),
        }
    }

    fn add(&mut self, request: R, class: Class, item: K, now: Instant) -> Added {
        if self.shut_down {
            return Added::ShutDown;
        }
        let ticket = self.ticket();
        let Some(entry) = self.entries.get_mut(&item) else {
            self.entries.insert(
                item.clone(),
                Entry {
                    request: request.clone(),
                    class,
                    failures: 0,
                    ticket,
                    slot: Slot::Ready,
                },
            );
            self.push_ready(&request, class, item, ticket, now);
            return Added::Queued;
        };
        let promote = class < entry.class;
        match entry.slot {
            Slot::Leased { again } => {
                if promote {
                    entry.request = request;
                    entry.class = class;
                }
                entry.slot = Slot::Leased {
                    again: Some(again.map_or(now, |at| at.min(now))),
                };
                Added::AfterLease
            }
            Slot::Waiting => {
                // The timer finds the new owner when it fires.
                if promote {
                    entry.request = request;
                    entry.class = class;
                }
                Added::Merged
            }
            Slot::Ready => {
                if promote {
                    let old = std::mem::replace(&mut entry.request, request.clone());
                    entry.ticket = ticket;
                    entry.class = class;
                    self.lane(Class::Background).unready(&old.lane(), 1);
                    self.push_ready(&request, class, item, ticket, now);
                }
                Added::Merged
            }
        }
    }

    /// Leases the next item: interactive first, background when no interactive item is ready or
    /// when background has waited `background_max_wait`.
    fn lease(&mut self, now: Instant) -> Option<Lease<K, R>> {
        self.fire_timers(now);
        if self.background.ready() == 0 {
            self.background_since = None;
        }
        let starving = self
            .background_since
            .is_some_and(|since| now.duration_since(since) >= self.config.background_max_wait);
        let class = if self.background.ready() > 0 && (self.interactive.ready() == 0 || starving) {
            Class::Background
        } else {
            Class::Interactive
        };
        let entries = &self.entries;
        let (_, item) = match class {
            Class::Interactive => &mut self.interactive,
            Class::Background => &mut self.background,
        }
        .pop(|item, ticket| {
            entries
                .get(item)
                .is_some_and(|e| e.ticket == ticket && e.slot == Slot::Ready)
        })?;
        if class == Class::Background {
            self.background_since = (self.background.ready() > 0).then_some(now);
        }
        let entry = self.entries.get_mut(&item)?;
        entry.slot = Slot::Leased { again: None };
        self.leased += 1;
        Some(Lease {
            failures: entry.failures,
            request: entry.request.clone(),
            item,
            class,
        })
    }

    /// Ends the lease of `item`; returns the backoff of a failure.
    fn end(&mut self, item: K, outcome: Outcome, now: Instant) -> Option<Duration> {
        let entry = self.entries.get_mut(&item)?;
        let Slot::Leased { again } = entry.slot else {
            return None;
        };
        self.leased -= 1;
        let (at, backoff) = match outcome {
            Outcome::Done => {
                entry.failures = 0;
                match again {
                    Some(at) => (at, None),
                    None => {
                        self.entries.remove(&item);
                        return None;
                    }
                }
            }
            Outcome::Failed => {
                let delay = self.config.backoff.delay(entry.failures, &mut self.rng);
                entry.failures = entry.failures.saturating_add(1);
                (now + delay, Some(delay))
            }
            Outcome::After(delay) => (now + delay, None),
        };
        self.schedule(item, at, now);
        backoff
    }

    /// Puts a known item back as ready (when `at` has come) or waiting.
    fn schedule(&mut self, item: K, at: Instant, now: Instant) {
        let ticket = self.ticket();
        let Some(entry) = self.entries.get_mut(&item) else {
            return;
        };
        entry.ticket = ticket;
        if at <= now {
            entry.slot = Slot::Ready;
            let (request, class) = (entry.request.clone(), entry.class);
            self.push_ready(&request, class, item, ticket, now);
        } else {
            entry.slot = Slot::Waiting;
            self.waiting += 1;
            self.timers.push(Timer { at, ticket, item });
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while self.timers.peek().is_some_and(|t| t.at <= now) {
            let Some(timer) = self.timers.pop() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&timer.item) else {
                continue;
            };
            if entry.ticket != timer.ticket || entry.slot != Slot::Waiting {
                continue;
            }
            entry.slot = Slot::Ready;
            self.waiting -= 1;
            let (request, class) = (entry.request.clone(), entry.class);
            self.push_ready(&request, class, timer.item, timer.ticket, now);
        }
    }

    /// The earliest live timer, dropping stale ones on the way.
    fn next_timer(&mut self) -> Option<Instant> {
        while let Some(timer) = self.timers.peek() {
            let live = self
                .entries
                .get(&timer.item)
                .is_some_and(|e| e.ticket == timer.ticket && e.slot == Slot::Waiting);
            if live {
                return Some(timer.at);
            }
            self.timers.pop();
        }
        None
    }

    fn cancel(&mut self, request: &R) -> usize {
        let before = self.entries.len();
        let mut waiting = 0;
        // Ready items dropped, by class: their lanes skip them when met.
        let mut ready = [0, 0];
        self.entries.retain(|_, entry| {
            if entry.request != *request {
                return true;
            }
            match entry.slot {
                Slot::Leased { .. } => {
                    entry.slot = Slot::Leased { again: None };
                    true
                }
                Slot::Waiting => {
                    waiting += 1;
                    false
                }
                Slot::Ready => {
                    ready[entry.class as usize] += 1;
                    false
                }
            }
        });
        self.waiting -= waiting;
        let lane = request.lane();
        self.interactive
            .unready(&lane, ready[Class::Interactive as usize]);
        self.background
            .unready(&lane, ready[Class::Background as usize]);
        before - self.entries.len()
    }

    fn push_ready(&mut self, request: &R, class: Class, item: K, ticket: u64, now: Instant) {
        if class == Class::Background && self.background.ready() == 0 {
            self.background_since = Some(now);
        }
        self.lane(class).push(&request.lane(), item, ticket);
    }

    fn lane(&mut self, class: Class) -> &mut Fair<K, R::Lane> {
        match class {
            Class::Interactive => &mut self.interactive,
            Class::Background => &mut self.background,
        }
    }

    fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }
}

#[cfg(test)]
mod tests;
