//! The API budget (rule 5): a token bucket for mutating requests, another for reads, a cap on
//! requests in flight, and pauses the API server orders with 429 or 503 and Retry-After.
//!
//! [`BudgetLayer`] applies it to every request a `kube::Client` sends ([`client`] builds such a
//! client), so nothing the controller does can bypass the budget.

mod bucket;
mod classes;
mod flows;
mod layer;
mod slots;

pub use classes::{Priority, with_priority};
pub use flows::on_behalf_of;

pub use bucket::Rate;
pub use layer::{BudgetLayer, BudgetService, client};

use std::cell::Cell;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use bucket::TokenBucket;
use http::header::RETRY_AFTER;
use http::{HeaderMap, Method, Request, StatusCode};
use slots::{Slot, Slots};

/// The header API Priority and Fairness sets on its answers (rejections included): the UID of the
/// priority level that handled the request (k8s.io/api/flowcontrol/v1
/// ResponseHeaderMatchedPriorityLevelConfigurationUID).
const PRIORITY_LEVEL_HEADER: &str = "X-Kubernetes-PF-PriorityLevel-UID";

/// Limits of a [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetConfig {
    /// POST, PUT, PATCH and DELETE (defaults: 20 QPS, burst 30, like Argo's controller).
    pub writes: Rate,
    /// GET, LIST and WATCH (defaults: 50 QPS, burst 100).
    pub reads: Rate,
    /// Requests in flight at once (watches, which stay open, are not counted); fewer for a
    /// while after the server throttled (see `slots`), and a few more for delete workers'
    /// writes whose token is in hand.
    pub workers: NonZeroUsize,
    /// The longest pause a Retry-After can order, against a bogus header stopping us for hours
    /// (API Priority and Fairness asks for at most 32 s).
    pub max_pause: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            writes: Rate::new(20, 30).expect("non-zero"),
            reads: Rate::new(50, 100).expect("non-zero"),
            workers: NonZeroUsize::new(32).expect("non-zero"),
            max_pause: Duration::from_secs(60),
        }
    }
}

/// The two token buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bucket {
    Read,
    Write,
}

impl Bucket {
    /// Its place in per-bucket arrays.
    fn index(self) -> usize {
        match self {
            Bucket::Read => 0,
            Bucket::Write => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Read => "read",
            Bucket::Write => "write",
        }
    }
}

/// What a request does, as far as the budget is concerned: its HTTP method, with a GET that
/// watches (`watch=true`) told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    Watch,
    Post,
    Put,
    Patch,
    Delete,
    /// Any other method (kube sends none); budgeted as a write, to be safe.
    Other,
}

impl Verb {
    pub fn of<B>(request: &Request<B>) -> Verb {
        match *request.method() {
            Method::GET if is_watch(request.uri().query()) => Verb::Watch,
            Method::GET => Verb::Get,
            Method::POST => Verb::Post,
            Method::PUT => Verb::Put,
            Method::PATCH => Verb::Patch,
            Method::DELETE => Verb::Delete,
            _ => Verb::Other,
        }
    }

    pub fn bucket(self) -> Bucket {
        match self {
            Verb::Get | Verb::Watch => Bucket::Read,
            Verb::Post | Verb::Put | Verb::Patch | Verb::Delete | Verb::Other => Bucket::Write,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Watch => "WATCH",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Patch => "PATCH",
            Verb::Delete => "DELETE",
            Verb::Other => "OTHER",
        }
    }
}

/// The `watch` query parameter, read the way the API server parses booleans.
fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        query.split('&').any(|pair| {
            matches!(
                pair.split_once('='),
                Some(("watch", "1" | "t" | "T" | "true" | "TRUE" | "True"))
            )
        })
    })
}

/// Receives what the metrics layer shows about the budget. Every method defaults to nothing.
pub trait BudgetObserver: Send + Sync {
    /// A request of `bucket` waited `waited` for a token (zero when one was there), pauses
    /// included.
    fn token_wait(&self, _bucket: Bucket, _waited: Duration) {}
    /// A token was taken from `bucket` (for a request, or ahead of one) at `priority`.
    fn token_taken(&self, _bucket: Bucket, _priority: Priority) {}
    /// Requests in flight changed to `requests`.
    fn in_flight(&self, _requests: usize) {}
    /// A request ended: with a response status, or `None` when no response came.
    fn response(&self, _verb: Verb, _status: Option<StatusCode>) {}
    /// The server's Retry-After paused `bucket` for `pause`.
    fn paused(&self, _bucket: Bucket, _pause: Duration) {}
}

struct Silent;

impl BudgetObserver for Silent {}

/// The budget shared by every request of the controller; clones share it.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    reads: TokenBucket,
    writes: TokenBucket,
    slots: Slots,
    flows: flows::Flows,
    /// Each bucket's line, by priority: reads, writes.
    lines: [classes::Line; 2],
    max_pause: Duration,
    observer: Arc<dyn BudgetObserver>,
}

impl Budget {
    /// Must be called inside a tokio runtime (its clock times the buckets).
    pub fn new(config: &BudgetConfig) -> Self {
        Budget::with_observer(config, Arc::new(Silent))
    }

    pub fn with_observer(config: &BudgetConfig, observer: Arc<dyn BudgetObserver>) -> Self {
        Budget {
            inner: Arc::new(Inner {
                reads: TokenBucket::new(config.reads),
                writes: TokenBucket::new(config.writes),
                slots: Slots::new(config.workers.get()),
                flows: flows::Flows::default(),
                lines: Default::default(),
                max_pause: config.max_pause,
                observer,
            }),
        }
    }

    /// The tower layer that puts requests through this budget.
    pub fn layer(&self) -> BudgetLayer {
        BudgetLayer::new(self.clone())
    }

    /// Requests in flight now (watches not counted).
    pub fn in_flight(&self) -> usize {
        self.inner.slots.in_use()
    }

    /// Waits for a write token, in `flow` (a namespace) at the task's priority and for its
    /// asker, for a request sent at once with [`WriteToken::spend_on`]: a delete worker takes
    /// the token of the item it leased, then proves and sends it, so the proof is taken with
    /// the token in hand. Its write then waits for nothing but a slot and a pause.
    pub async fn take_write_token(&self, flow: &str) -> WriteToken {
        let _turns = self.turns(flow, Bucket::Write).await;
        self.write_token(flow, Line::Priority).await
    }

    /// Waits for a write token ahead of every priority and turn, for a request that holds a
    /// slot few others can have (a DeleteCollection's: see `engine::workers`), spent with
    /// [`WriteToken::spend_on`]. Such a request already waited its turn for the slot; waiting
    /// again for its namespace's turn would hold the slot while every other namespace's
    /// writes go first, and the bulk deletes of all tenants behind it. Those waiting so are
    /// as many as the slots.
    pub async fn take_write_token_ahead(&self, flow: &str) -> WriteToken {
        self.write_token(flow, Line::Ahead).await
    }

    async fn write_token(&self, flow: &str, line: Line) -> WriteToken {
        let start = tokio::time::Instant::now();
        self.outside_pauses(flow, || self.take(Bucket::Write, flow, line, false))
            .await;
        self.inner
            .observer
            .token_wait(Bucket::Write, start.elapsed());
        WriteToken(())
    }

    /// The turns a request of `flow` waits for before its bucket's line: its asker's inside
    /// the namespace, then the namespace's, both at the task's priority, so a namespace's
    /// reports never hold back its own retries.
    async fn turns(
        &self,
        flow: &str,
        bucket: Bucket,
    ) -> (Option<flows::Turn<'_>>, flows::Turn<'_>) {
        let line = flows::of_priority(flow, classes::priority());
        let asker = match flows::asker() {
            Some(asker) => Some(
                self.inner
                    .flows
                    .turn(&flows::of_asker(&line, &asker), bucket)
                    .await,
            ),
            None => None,
        };
        (asker, self.inner.flows.turn(&line, bucket).await)
    }

    /// Takes a token of `bucket` for a request of `flow` when `line`'s turn comes, and first a
    /// request slot if `slot`.
    async fn take(&self, bucket: Bucket, flow: &str, line: Line, slot: bool) -> Option<Slot> {
        let line_of = &self.inner.lines[bucket.index()];
        let _pass = match line {
            Line::Priority => line_of.enter(classes::priority(), flow).await,
            Line::Ahead => line_of.enter_ahead().await,
        };
        // The slot is taken once the line chose this request, not while it waits in the
        // line: a slot is for a request about to be sent. Taken before its turn, the slots
        // filled with waiting reports and answers (each waits behind every retry's write)
        // while retries' reads, whose tokens were there, waited for a slot: under 100
        // namespaces' load, reads ran at half their budget, 2.8 s a read.
        let slot = match slot {
            true => Some(self.inner.slots.acquire().await),
            false => None,
        };
        self.bucket(bucket).acquire().await;
        self.inner.observer.token_taken(bucket, classes::priority());
        slot
    }

    /// Runs `take` (a token, or the wait for a pause) outside any pause of `flow`: again if
    /// the flow was paused meanwhile (a token taken then is dropped, so nothing is sent
    /// before the pause ends).
    async fn outside_pauses<T, F: Future<Output = T>>(
        &self,
        flow: &str,
        take: impl Fn() -> F,
    ) -> T {
        loop {
            while let Some(until) = self.inner.flows.paused_until(flow) {
                tokio::time::sleep_until(until).await;
            }
            let taken = take().await;
            if self.inner.flows.paused_until(flow).is_none() {
                return taken;
            }
        }
    }

    /// Waits until a request of `verb` in `flow` (its namespace) may be sent: the flow's turn
    /// (see [`Budget::turns`]), a worker slot (except for watches), then a token when the
    /// bucket's line serves the task's priority (unless the task spends a [`WriteToken`] on
    /// this write: it had its turns), outside any pause of the bucket or the flow. The slot is
    /// held until the returned admission is dropped.
    async fn admit(&self, verb: Verb, flow: &str) -> Admission {
        let bucket = verb.bucket();
        let observer = &self.inner.observer;
        let prepaid =
            bucket == Bucket::Write && PREPAID.try_with(|p| p.replace(false)).unwrap_or(false);
        let start = tokio::time::Instant::now();
        let needs_slot = verb != Verb::Watch;
        let slot = match prepaid {
            // A token taken ahead was taken before any pause that began since (while this
            // request waited for a slot, say): the pause holds it back too.
            true => {
                let slot = self.inner.slots.acquire_now().await;
                self.outside_pauses(flow, || async {
                    self.bucket(bucket).sit_out_pause().await;
                })
                .await;
                Some(slot)
            }
            // The flow's turns first, then the bucket's line, which takes the slot once it
            // chose this request: a flow with thousands of requests waits as one.
            false => {
                let _turns = self.turns(flow, bucket).await;
                self.outside_pauses(flow, || self.take(bucket, flow, Line::Priority, needs_slot))
                    .await
            }
        };
        let waited = start.elapsed();
        observer.token_wait(bucket, waited);
        let _ = ADMITTED.try_with(|at| at.set(Some(tokio::time::Instant::now())));
        if slot.is_some() {
            observer.in_flight(self.in_flight());
        }
        Admission {
            budget: self.clone(),
            slot,
        }
    }

    /// Obeys a throttling answer: a 429 or 503 with Retry-After. The max-inflight filter's
    /// answer (the server is overloaded for everyone) pauses the bucket the request came from;
    /// the other bucket goes on (that filter limits reads and writes separately, and a read
    /// throttled too pauses the read bucket itself). A rejection by API Priority and Fairness,
    /// which names the priority level that rejected it, pauses the request's flow (its
    /// namespace), reads and writes alike: that flow asks nothing more before Retry-After has
    /// passed, while other namespaces' retries go on (each of their own rejections pauses them
    /// in turn). Returns whether it paused.
    fn obey(&self, verb: Verb, flow: &str, status: StatusCode, headers: &HeaderMap) -> bool {
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return false;
        }
        let Some(seconds) = headers
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
        else {
            return false;
        };
        let pause = Duration::from_secs(seconds).min(self.inner.max_pause);
        let priority_level = headers
            .get(PRIORITY_LEVEL_HEADER)
            .and_then(|value| value.to_str().ok());
        if priority_level.is_some() {
            self.inner.flows.pause(flow, pause);
            for bucket in [Bucket::Read, Bucket::Write] {
                self.inner.observer.paused(bucket, pause);
            }
        } else {
            self.bucket(verb.bucket()).pause(pause);
            self.inner.observer.paused(verb.bucket(), pause);
        }
        tracing::info!(
            bucket = verb.bucket().as_str(),
            namespace = flow,
            status = status.as_u16(),
            pause_seconds = pause.as_secs(),
            priority_level,
            "API server asked to slow down; pausing requests"
        );
        true
    }

    fn bucket(&self, bucket: Bucket) -> &TokenBucket {
        match bucket {
            Bucket::Read => &self.inner.reads,
            Bucket::Write => &self.inner.writes,
        }
    }
}

/// Where a request waits in its bucket's line (see `classes`).
#[derive(Clone, Copy)]
enum Line {
    /// At its task's priority.
    Priority,
    /// Ahead of every priority: it holds a scarce slot.
    Ahead,
}

tokio::task_local! {
    /// Set while a task spends a [`WriteToken`]: its next write takes no token from the bucket.
    static PREPAID: Cell<bool>;
    /// Set while a task runs [`admitted_at`]: when the budget last let one of its requests go.
    static ADMITTED: Cell<Option<tokio::time::Instant>>;
}

/// Runs `work` and returns, with its output, when the budget let its last request go (`None`
/// if none went). An answer reflects the API server no earlier than that: a list answers
/// from a snapshot taken after its send, so a proof made from it dates from then, not from
/// before the wait for a turn and a token, which under many tenants' load is the longer part.
pub async fn admitted_at<F: Future>(work: F) -> (F::Output, Option<tokio::time::Instant>) {
    ADMITTED
        .scope(Cell::new(None), async {
            let output = work.await;
            (output, ADMITTED.with(Cell::get))
        })
        .await
}

/// A write token taken before the request that spends it is chosen; see
/// [`Budget::take_write_token`].
#[must_use = "a token not spent on a request is wasted budget"]
#[derive(Debug)]
pub struct WriteToken(());

impl WriteToken {
    /// Runs `work`, whose first write request spends this token instead of waiting for
    /// another. Start it right away: a token is the permission to send now.
    pub async fn spend_on<F: Future>(self, work: F) -> F::Output {
        PREPAID.scope(Cell::new(true), work).await
    }
}

/// A request's right to be in flight; [`Admission::finish`] (or dropping it) frees the slot.
struct Admission {
    budget: Budget,
    slot: Option<Slot>,
}

impl Admission {
    /// Frees the slot, telling the cap whether the request was throttled or answered.
    fn finish(mut self, throttled: bool, answered: bool) {
        self.release(throttled, answered);
    }

    fn release(&mut self, throttled: bool, answered: bool) {
        if let Some(slot) = self.slot.take() {
            self.budget.inner.slots.release(slot, throttled, answered);
            self.budget
                .inner
                .observer
                .in_flight(self.budget.in_flight());
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.release(false, false);
    }
}

#[cfg(test)]
mod tests;
