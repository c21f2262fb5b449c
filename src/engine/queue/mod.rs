//! The work queue between requests (retries, garbage collection) and the workers that spend the
//! API budget on their items (pod deletions).
//!
//! - Two classes: [`Class::Interactive`] is served before [`Class::Background`], with a floor
//!   against starving background work (see [`QueueConfig::background_max_wait`]).
//! - Within a class, requests take turns item by item (round-robin).
//! - An item key is queued at most once and leased to at most one worker at a time (client-go
//!   workqueue's dirty and processing sets); adding an item that is being processed queues it
//!   once more after its lease ends.
//! - Every add is answered: a lease answers every request that added its item before it began
//!   ([`Lease::owners`]), not only the one whose turn it took, so two requests that queue the
//!   same item (two retries of one archived workflow) both hear how it went. Cancelling one
//!   request leaves the item queued for the others.
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
    /// The item was already queued or waiting out a backoff; it stays queued once and its lease
    /// answers this request too. An interactive add moves a background item to its own lane.
    Merged,
    /// The item is leased to a worker; it will be queued once more when that lease ends, and
    /// that next lease answers this request.
    AfterLease,
    /// The queue is shut down; nothing was queued.
    ShutDown,
}

/// One item handed to one worker. Exactly one of [`WorkQueue::done`], [`WorkQueue::requeue`] or
/// [`WorkQueue::requeue_after`] ends it; until then no other worker gets the same item.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease<K, R> {
    pub item: K,
    /// The request whose turn the item took (its lane).
    pub request: R,
    /// Every request this lease answers, `request` first: those that added the item before the
    /// lease began and were not cancelled.
    pub owners: Vec<R>,
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

    /// Withdraws `request` from every item it added: an item no other request wants leaves the
    /// queue (a leased one is not queued again, whatever its lease's end); one that others want
    /// stays for them, in their lane. Returns how many queued or waiting items went.
    pub fn cancel(&self, request: &R) -> usize {
        let dropped = self.state().cancel(request, Instant::now());
        tracing::debug!(dropped, "cancelled a request's queued work");
        dropped
    }

    /// Cancels `request` (see [`WorkQueue::cancel`]) and returns the items leased for it then:
    /// sends that may still be under way, which [`WorkQueue::released`] waits for.
    pub fn withdraw(&self, request: &R) -> Vec<K> {
        let leased: Vec<K> = {
            let state = self.state();
            state
                .entries
                .iter()
                .filter(|(_, entry)| entry.leased_for.iter().any(|(r, _)| r == request))
                .map(|(item, _)| item.clone())
                .collect()
        };
        self.cancel(request);
        leased
    }

    /// Waits until none of `items` is leased any more: each lease has ended, its send answered
    /// or refused at the send as no longer [wanted](WorkQueue::wanted).
    pub async fn released(&self, items: &[K]) {
        loop {
            // Registered before looking at the state, so a lease ending in between still wakes us.
            let mut changed = pin!(self.shared.changed.notified());
            changed.as_mut().enable();
            {
                let state = self.state();
                let leased = |item: &K| {
                    state
                        .entries
                        .get(item)
                        .is_some_and(|entry| entry.slot == Slot::Leased)
                };
                if !items.iter().any(leased) {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Whether leased `item` is still wanted: the queue runs and a request that added it was
    /// not cancelled. After a lost Lease or a cancel nobody waits for the answer, and another
    /// leader may be acting on a world the item was not proven in: a send that is only safe
    /// for its requests (a bulk delete) checks this right before it goes.
    pub fn wanted(&self, item: &K) -> bool {
        let state = self.state();
        !state.shut_down
            && state
                .entries
                .get(item)
                .is_some_and(|entry| !entry.owners.is_empty() || !entry.leased_for.is_empty())
    }

    /// Stops the queue: `next` returns `None` to every worker, now and later, and `add` queues
    /// nothing. Leased items may still be ended; nothing queued is handed out any more (work
    /// left over is found again by whoever restarts the controller).
    pub fn shutdown(&self) {
        self.state().shut_down = true;
        self.shared.changed.notify_waiters();
    }

    /// Shuts the queue down the moment `stop` is cancelled (a lost Lease,
    /// a shutdown): a leased item is no longer [`WorkQueue::wanted`], so its
    /// send is refused, whether or not its owners have withdrawn it yet.
    pub fn shut_down_when(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        K: Send + 'static,
        R: Send + 'static,
        R::Lane: Send,
    {
        let queue = self.clone();
        async move {
            stop.cancelled().await;
            queue.shutdown();
        }
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
                Slot::Leased => class.leased += 1,
            }
        }
        depths
    }

    /// Queued and waiting (not leased) items per request that added them.
    pub fn request_depths(&self) -> HashMap<R, usize> {
        let mut depths = HashMap::new();
        for entry in self.state().entries.values() {
            if entry.slot != Slot::Leased {
                for (request, _) in &entry.owners {
                    *depths.entry(request.clone()).or_default() += 1;
                }
            }
        }
        depths
    }

    /// Whether any item still owes `request` an answer: queued, waiting or leased for it. Once
    /// this is false, every answer to it has been given (workers answer before they end a lease),
    /// so a request still waiting for one would wait forever. One pass over every item.
    pub fn answers_to(&self, request: &R) -> bool {
        self.state().entries.values().any(|entry| {
            entry
                .owners
                .iter()
                .chain(&entry.leased_for)
                .any(|(r, _)| r == request)
        })
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
    /// The owner whose lane the item takes its turn in: one of the best class among `owners`
    /// (while leased, the lease's).
    request: R,
    class: Class,
    /// The requests the item's next lease answers, each once with the best class it asked in, in
    /// the order they asked. While leased: those that asked since the lease began; if none did,
    /// the item leaves the queue when the lease ends well.
    owners: Vec<(R, Class)>,
    /// While leased: the requests the lease answers; they want the item again if it fails.
    leased_for: Vec<(R, Class)>,
    failures: u32,
    /// Identifies the current lane entry or timer of this item; older ones are stale.
    ticket: u64,
    slot: Slot,
}

impl<R: Request> Entry<R> {
    /// Adds `request` to the owners, or raises its class if it is one.
    fn join(&mut self, request: R, class: Class) {
        match self.owners.iter_mut().find(|(r, _)| *r == request) {
            Some((_, known)) => *known = (*known).min(class),
            None => self.owners.push((request, class)),
        }
    }

    /// Takes the lease's owners back (the item comes back for them), after any that asked
    /// during the lease.
    fn take_back(&mut self) {
        for (request, class) in std::mem::take(&mut self.leased_for) {
            self.join(request, class);
        }
    }

    /// Picks the lane among the owners (there is at least one): the current one if it is of
    /// the best class, else the first owner of that class. Returns whether it changed.
    fn settle(&mut self) -> bool {
        let Some(best) = self.owners.iter().map(|(_, c)| *c).min() else {
            return false;
        };
        let current = self.owners.iter().find(|(r, _)| *r == self.request);
        if self.class == best && current.is_some_and(|(_, c)| *c == best) {
            return false;
        }
        if let Some((request, class)) = self.owners.iter().find(|(_, c)| *c == best) {
            self.request = request.clone();
            self.class = *class;
        }
        true
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Ready,
    Waiting,
    Leased,
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
                    owners: vec![(request.clone(), class)],
                    leased_for: Vec::new(),
                    failures: 0,
                    ticket,
                    slot: Slot::Ready,
                },
            );
            self.push_ready(&request, class, item, ticket, now);
            return Added::Queued;
        };
        entry.join(request, class);
        match entry.slot {
            // The lane of the next lease is settled when this one ends.
            Slot::Leased => Added::AfterLease,
            // The timer finds the lane when it fires.
            Slot::Waiting => {
                entry.settle();
                Added::Merged
            }
            Slot::Ready => {
                let (old, old_class) = (entry.request.lane(), entry.class);
                if entry.settle() {
                    entry.ticket = ticket;
                    let (request, class) = (entry.request.clone(), entry.class);
                    self.lane(old_class).unready(&old, 1);
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
        entry.slot = Slot::Leased;
        entry.leased_for = std::mem::take(&mut entry.owners);
        self.leased += 1;
        let mut owners = vec![entry.request.clone()];
        owners.extend(
            entry
                .leased_for
                .iter()
                .map(|(r, _)| r)
                .filter(|r| **r != entry.request)
                .cloned(),
        );
        Some(Lease {
            failures: entry.failures,
            request: entry.request.clone(),
            owners,
            item,
            class,
        })
    }

    /// Ends the lease of `item`; returns the backoff of a failure. The item comes back for the
    /// requests that asked during the lease (after a success), or also for those the lease
    /// answered (after a failure or a requested delay); with none left, it leaves the queue.
    fn end(&mut self, item: K, outcome: Outcome, now: Instant) -> Option<Duration> {
        let entry = self.entries.get_mut(&item)?;
        if entry.slot != Slot::Leased {
            return None;
        }
        self.leased -= 1;
        let (at, backoff) = match outcome {
            Outcome::Done => {
                entry.failures = 0;
                entry.leased_for.clear();
                (now, None)
            }
            Outcome::Failed => {
                entry.take_back();
                let delay = self.config.backoff.delay(entry.failures, &mut self.rng);
                entry.failures = entry.failures.saturating_add(1);
                (now + delay, Some(delay))
            }
            Outcome::After(delay) => {
                entry.take_back();
                (now + delay, None)
            }
        };
        if entry.owners.is_empty() {
            self.entries.remove(&item);
            return None;
        }
        entry.settle();
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

    fn cancel(&mut self, request: &R, now: Instant) -> usize {
        let before = self.entries.len();
        let mut waiting = 0;
        // Ready items taken out of the request's lane, by class: their lanes skip them when
        // met. Those other owners still want go to their lanes.
        let mut ready = [0, 0];
        let mut moved = Vec::new();
        let mut tickets = self.next_ticket;
        self.entries.retain(|item, entry| {
            let owned = |owners: &[(R, Class)]| owners.iter().any(|(r, _)| r == request);
            if !owned(&entry.owners) && !owned(&entry.leased_for) {
                return true;
            }
            entry.owners.retain(|(r, _)| r != request);
            entry.leased_for.retain(|(r, _)| r != request);
            match entry.slot {
                // Its end decides, from the owners left.
                Slot::Leased => true,
                Slot::Waiting if entry.owners.is_empty() => {
                    waiting += 1;
                    false
                }
                Slot::Ready if entry.owners.is_empty() => {
                    ready[entry.class as usize] += 1;
                    false
                }
                Slot::Waiting => {
                    entry.settle();
                    true
                }
                Slot::Ready => {
                    let (lane, class) = (entry.request.clone(), entry.class);
                    if entry.settle() {
                        if lane == *request {
                            ready[class as usize] += 1;
                        }
                        tickets += 1;
                        entry.ticket = tickets;
                        moved.push((item.clone(), entry.request.clone(), entry.class, tickets));
                    }
                    true
                }
            }
        });
        self.next_ticket = tickets;
        self.waiting -= waiting;
        let lane = request.lane();
        self.interactive
            .unready(&lane, ready[Class::Interactive as usize]);
        self.background
            .unready(&lane, ready[Class::Background as usize]);
        for (item, owner, class, ticket) in moved {
            self.push_ready(&owner, class, item, ticket, now);
        }
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
