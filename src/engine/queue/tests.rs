use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use proptest::prelude::*;
use tokio::time::{Instant, advance};

use super::*;

type Queue = WorkQueue<u32, &'static str>;

fn config() -> QueueConfig {
    QueueConfig {
        backoff: Backoff {
            jitter: 0.0,
            ..Backoff::default()
        },
        ..QueueConfig::default()
    }
}

/// The lease `next` gives without waiting, if any.
fn ready(q: &Queue) -> Option<Lease<u32, &'static str>> {
    q.next().now_or_never().flatten()
}

fn take(q: &Queue) -> Lease<u32, &'static str> {
    ready(q).expect("an item should be ready")
}

/// Leases and finishes `n` items, returning (request, item) in lease order.
fn serve(q: &Queue, n: usize) -> Vec<(&'static str, u32)> {
    (0..n)
        .map(|_| {
            let lease = take(q);
            let got = (lease.request, lease.item);
            q.done(lease);
            got
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn interactive_items_go_before_background_ones() {
    let q = WorkQueue::new(config());
    q.add("gc", Class::Background, 1);
    q.add("gc", Class::Background, 2);
    q.add("retry", Class::Interactive, 3);
    q.add("retry", Class::Interactive, 4);
    assert_eq!(
        serve(&q, 4),
        [("retry", 3), ("retry", 4), ("gc", 1), ("gc", 2)]
    );
    assert!(ready(&q).is_none());
}

#[tokio::test(start_paused = true)]
async fn requests_of_very_different_sizes_take_turns() {
    let q = WorkQueue::new(config());
    for pod in 0..10_000 {
        q.add("huge", Class::Interactive, pod);
    }
    for pod in 0..20 {
        q.add("small", Class::Interactive, 100_000 + pod);
    }
    let first = serve(&q, 40);
    let small_done_at = first.iter().rposition(|(r, _)| *r == "small");
    assert_eq!(
        small_done_at,
        Some(39),
        "the small retry should finish within 40 leases"
    );
    assert!(
        first.chunks(2).all(|pair| pair[0].0 != pair[1].0),
        "no alternation: {first:?}"
    );
    // Within one request, items keep their order.
    let small: Vec<_> = first
        .iter()
        .filter(|(r, _)| *r == "small")
        .map(|(_, p)| *p)
        .collect();
    assert_eq!(small, (100_000..100_020).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn the_same_item_is_queued_once() {
    let q = WorkQueue::new(config());
    assert_eq!(q.add("retry", Class::Interactive, 7), Added::Queued);
    assert_eq!(q.add("retry", Class::Interactive, 7), Added::Merged);
    assert_eq!(q.add("other", Class::Interactive, 7), Added::Merged);
    assert_eq!(q.stats().interactive, 1);
    assert_eq!(serve(&q, 1), [("retry", 7)]);
    assert!(ready(&q).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_leased_item_goes_to_no_second_worker_and_comes_back_once_after_done() {
    let q = WorkQueue::new(config());
    q.add("retry", Class::Interactive, 7);
    let lease = take(&q);
    assert_eq!(q.add("retry", Class::Interactive, 7), Added::AfterLease);
    assert_eq!(q.add("retry", Class::Interactive, 7), Added::AfterLease);
    assert!(ready(&q).is_none(), "a leased item was handed out twice");
    assert_eq!(q.stats().leased, 1);
    q.done(lease);
    assert_eq!(serve(&q, 1), [("retry", 7)]);
    assert!(ready(&q).is_none(), "a re-added item was queued twice");
    assert_eq!(q.stats(), QueueStats::default());
}

#[tokio::test(start_paused = true)]
async fn an_interactive_add_takes_over_a_background_item() {
    let q = WorkQueue::new(config());
    q.add("gc", Class::Background, 1);
    q.add("gc", Class::Background, 2);
    assert_eq!(q.add("retry", Class::Interactive, 2), Added::Merged);
    assert_eq!(q.add("gc", Class::Background, 2), Added::Merged);
    let stats = q.stats();
    assert_eq!((stats.interactive, stats.background), (1, 1));
    let lease = take(&q);
    assert_eq!(
        (lease.request, lease.class, lease.item),
        ("retry", Class::Interactive, 2)
    );
    q.done(lease);
    assert_eq!(serve(&q, 1), [("gc", 1)]);
    assert!(ready(&q).is_none());
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_until_forgotten() {
    let q = WorkQueue::new(config());
    q.add("retry", Class::Interactive, 1);
    let mut delays = Vec::new();
    for expected_failures in 0..4 {
        let lease = q.next().await.expect("the item comes back");
        assert_eq!(lease.failures, expected_failures);
        let start = Instant::now();
        let delay = q.requeue(lease);
        assert!(ready(&q).is_none(), "the item came back before its backoff");
        let lease = q.next().await.expect("the item comes back");
        assert_eq!(
            start.elapsed(),
            delay,
            "the item came back after a different delay"
        );
        delays.push(delay.as_millis());
        q.requeue_after(lease, Duration::ZERO);
    }
    assert_eq!(delays, [5, 10, 20, 40]);

    let lease = q.next().await.expect("the item comes back");
    assert_eq!(lease.failures, 4);
    q.forget(&1);
    assert_eq!(q.requeue(lease), Duration::from_millis(5));
    let lease = q.next().await.expect("the item comes back");
    q.done(lease);
    assert_eq!(q.stats(), QueueStats::default());

    q.add("retry", Class::Interactive, 1);
    assert_eq!(take(&q).failures, 0, "done should reset the failure count");
}

#[tokio::test(start_paused = true)]
async fn requeue_after_waits_without_counting_a_failure() {
    let q = WorkQueue::new(config());
    q.add("retry", Class::Interactive, 1);
    q.add("retry", Class::Interactive, 2);
    let lease = take(&q);
    let start = Instant::now();
    q.requeue_after(lease, Duration::from_secs(2));
    assert_eq!(q.stats().waiting, 1);
    assert_eq!(serve(&q, 1), [("retry", 2)]);
    let lease = q.next().await.expect("the item comes back");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!((lease.item, lease.failures), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn background_is_served_once_it_waited_max_wait_under_interactive_load() {
    let q = WorkQueue::new(QueueConfig {
        background_max_wait: Duration::from_secs(10),
        ..config()
    });
    q.add("gc", Class::Background, 0);
    let start = Instant::now();
    let mut background_at = None;
    // A steady stream: one new interactive item per 100 ms, always one ready.
    for pod in 1..=200 {
        q.add("retry", Class::Interactive, pod);
        let lease = take(&q);
        if lease.class == Class::Background {
            background_at = Some(start.elapsed());
            q.done(lease);
            q.done(take(&q));
        } else {
            q.done(lease);
        }
        advance(Duration::from_millis(100)).await;
    }
    let waited = background_at.expect("background starved");
    assert!(
        waited >= Duration::from_secs(10) && waited <= Duration::from_millis(10_100),
        "background served after {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn default_floor_leaves_a_100_pod_retry_untouched_by_a_gc_backlog() {
    let q = WorkQueue::new(QueueConfig::default());
    for pod in 0..5_000 {
        q.add("gc", Class::Background, pod);
    }
    // GC runs alone for a while at 20 leases per second, then a user retries 100 pods.
    let step = Duration::from_millis(50);
    for _ in 0..300 {
        q.done(take(&q));
        advance(step).await;
    }
    for pod in 0..100 {
        q.add("retry", Class::Interactive, 10_000 + pod);
    }
    for _ in 0..100 {
        let lease = take(&q);
        assert_eq!(
            lease.class,
            Class::Interactive,
            "a GC item took a user retry's slot"
        );
        q.done(lease);
        advance(step).await;
    }
    assert_eq!(take(&q).class, Class::Background);
}

#[tokio::test(start_paused = true)]
async fn cancel_drops_a_requests_items_and_its_pending_re_adds() {
    let q = WorkQueue::new(config());
    for pod in 0..5 {
        q.add("deleted", Class::Interactive, pod);
    }
    q.add("kept", Class::Interactive, 100);
    let leased = take(&q);
    assert_eq!(leased.request, "deleted");
    q.add("deleted", Class::Interactive, leased.item);
    let waiting = take(&q);
    assert_eq!(waiting.request, "kept");
    q.requeue_after(waiting, Duration::from_secs(1));
    let waiting = take(&q);
    q.requeue_after(waiting, Duration::from_secs(1));
    assert_eq!(
        q.request_depths(),
        HashMap::from([("deleted", 4), ("kept", 1)])
    );

    assert_eq!(q.cancel(&"deleted"), 4);
    assert_eq!(q.request_depths(), HashMap::from([("kept", 1)]));
    q.done(leased);
    let lease = q.next().await.expect("the kept item comes back");
    assert_eq!((lease.request, lease.item), ("kept", 100));
    q.done(lease);
    assert!(ready(&q).is_none());
    assert_eq!(q.stats(), QueueStats::default());
}

#[tokio::test(start_paused = true)]
async fn next_waits_for_an_add() {
    let q = WorkQueue::new(config());
    let worker = tokio::spawn({
        let q = q.clone();
        async move { q.next().await.map(|lease| lease.item) }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!worker.is_finished());
    q.add("retry", Class::Interactive, 9);
    assert_eq!(worker.await.expect("worker panicked"), Some(9));
}

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_every_waiting_worker() {
    let q = WorkQueue::new(config());
    q.add("retry", Class::Interactive, 1);
    let held = take(&q);
    q.requeue_after(held, Duration::from_secs(3600));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.next().await.is_none() })
        })
        .collect();
    tokio::task::yield_now().await;
    q.shutdown();
    let start = Instant::now();
    for worker in workers {
        assert!(worker.await.expect("worker panicked"));
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "workers waited for the timer"
    );
    assert_eq!(q.add("retry", Class::Interactive, 2), Added::ShutDown);
    assert!(q.next().await.is_none());
}

/// Issue 47, finding 10: a lost Lease stops every send at once, not as each
/// owner withdraws its work.
#[tokio::test(start_paused = true)]
async fn a_stop_makes_every_item_unwanted_at_once() {
    let q = WorkQueue::new(config());
    q.add("gc", Class::Background, 1);
    q.add("retry", Class::Interactive, 2);
    let leased = take(&q);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(q.shut_down_when(stop.clone()));
    tokio::task::yield_now().await;
    assert!(q.wanted(&leased.item) && q.wanted(&1));
    stop.cancel();
    tokio::task::yield_now().await;
    assert!(
        !q.wanted(&leased.item) && !q.wanted(&1),
        "items still wanted after the stop"
    );
    assert!(q.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn concurrent_workers_finish_every_item_and_never_share_one() {
    let q: Queue = WorkQueue::new(QueueConfig::default());
    let active = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let finished = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (q, active, finished) = (q.clone(), active.clone(), finished.clone());
            tokio::spawn(async move {
                while let Some(lease) = q.next().await {
                    assert!(
                        active.lock().unwrap().insert(lease.item),
                        "two workers on {}",
                        lease.item
                    );
                    tokio::time::sleep(Duration::from_millis(u64::from(lease.item % 3))).await;
                    active.lock().unwrap().remove(&lease.item);
                    // Every fifth item fails twice before it succeeds.
                    if lease.item % 5 == 0 && lease.failures < 2 {
                        q.requeue(lease);
                    } else {
                        finished.lock().unwrap().push(lease.item);
                        q.done(lease);
                    }
                }
            })
        })
        .collect();
    for item in 0..1_000 {
        let (request, class) = match item % 3 {
            0 => ("gc", Class::Background),
            1 => ("big", Class::Interactive),
            _ => ("small", Class::Interactive),
        };
        q.add(request, class, item);
        if item % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    tokio::time::timeout(Duration::from_secs(3600), async {
        while finished.lock().unwrap().len() < 1_000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("workers stalled");
    q.shutdown();
    for worker in workers {
        worker.await.expect("a worker panicked");
    }
    let mut finished = finished.lock().unwrap().clone();
    finished.sort();
    assert_eq!(finished, (0..1_000).collect::<Vec<_>>());
    assert_eq!(q.stats(), QueueStats::default());
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        item: u32,
        request: usize,
        background: bool,
    },
    Next,
    Done(usize),
    Fail(usize),
    After(usize, u64),
    Forget(u32),
    Cancel(usize),
    Advance(u64),
}

const REQUESTS: [&str; 3] = ["a", "b", "c"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..8u32, 0..3usize, any::<bool>())
            .prop_map(|(item, request, background)| Op::Add { item, request, background }),
        4 => Just(Op::Next),
        2 => any::<usize>().prop_map(Op::Done),
        1 => any::<usize>().prop_map(Op::Fail),
        1 => (any::<usize>(), 0..50u64).prop_map(|(i, ms)| Op::After(i, ms)),
        1 => (0..8u32).prop_map(Op::Forget),
        1 => (0..3usize).prop_map(Op::Cancel),
        1 => (0..60u64).prop_map(Op::Advance),
    ]
}

/// What the queue should hold for one item: whom its next lease answers (each request with
/// the best class it asked in), whom its current lease answers, and its state.
#[derive(Debug, Clone, Default)]
struct Model {
    owners: BTreeMap<usize, Class>,
    leased_for: BTreeMap<usize, Class>,
    state: Held,
}

impl Model {
    /// The class its lane must be in: the best its owners asked in.
    fn class(&self) -> Class {
        self.owners
            .values()
            .copied()
            .min()
            .expect("a queued item has an owner")
    }

    fn join(owners: &mut BTreeMap<usize, Class>, request: usize, class: Class) {
        let known = owners.entry(request).or_insert(class);
        *known = (*known).min(class);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum Held {
    Queued {
        at: Instant,
    },
    #[default]
    Leased,
}

fn check(q: &Queue, model: &HashMap<u32, Model>) {
    let stats = q.stats();
    let leased = model.values().filter(|m| m.state == Held::Leased).count();
    assert_eq!(stats.leased, leased, "leased count");
    assert_eq!(
        stats.interactive + stats.background + stats.waiting,
        model.len() - leased,
        "queued count"
    );
    for (i, request) in REQUESTS.iter().enumerate() {
        let owed = model
            .values()
            .any(|m| m.owners.contains_key(&i) || m.leased_for.contains_key(&i));
        assert_eq!(q.answers_to(request), owed, "answers owed to {request}");
    }
}

async fn run(ops: Vec<Op>) {
    // A floor that never fires here keeps "interactive first" exact.
    let q: Queue = WorkQueue::new(QueueConfig {
        background_max_wait: Duration::from_secs(24 * 3600),
        ..QueueConfig::default()
    });
    let mut model: HashMap<u32, Model> = HashMap::new();
    let mut held: Vec<Lease<u32, &'static str>> = Vec::new();
    for op in ops {
        let now = Instant::now();
        match op {
            Op::Add {
                item,
                request,
                background,
            } => {
                let class = if background {
                    Class::Background
                } else {
                    Class::Interactive
                };
                q.add(REQUESTS[request], class, item);
                let m = model.entry(item).or_insert_with(|| Model {
                    state: Held::Queued { at: now },
                    ..Model::default()
                });
                Model::join(&mut m.owners, request, class);
            }
            Op::Next => {
                let due: Vec<(u32, Class)> = model
                    .iter()
                    .filter(|(_, m)| matches!(m.state, Held::Queued { at } if at <= now))
                    .map(|(item, m)| (*item, m.class()))
                    .collect();
                match ready(&q) {
                    None => assert!(due.is_empty(), "nothing leased though {due:?} are due"),
                    Some(lease) => {
                        let m = model.get_mut(&lease.item).expect("leased an unknown item");
                        assert!(
                            matches!(m.state, Held::Queued { at } if at <= now),
                            "leased {} in state {:?}",
                            lease.item,
                            m.state
                        );
                        // The lease answers exactly the requests that asked before it began, its
                        // lane's first, and takes the best class they asked in.
                        let mut owners: Vec<&str> = m.owners.keys().map(|&r| REQUESTS[r]).collect();
                        let mut answered = lease.owners.clone();
                        assert_eq!(answered.first(), Some(&lease.request), "{lease:?}");
                        answered.sort();
                        owners.sort();
                        assert_eq!(answered, owners, "whom lease {lease:?} answers");
                        assert_eq!(lease.class, m.class());
                        assert_eq!(
                            m.owners
                                .get(&REQUESTS.iter().position(|r| *r == lease.request).unwrap()),
                            Some(&lease.class),
                            "the lane's request asked in the lease's class"
                        );
                        if due.iter().any(|(_, c)| *c == Class::Interactive) {
                            assert_eq!(lease.class, Class::Interactive);
                        }
                        m.leased_for = std::mem::take(&mut m.owners);
                        m.state = Held::Leased;
                        held.push(lease);
                    }
                }
            }
            Op::Done(i) | Op::Fail(i) | Op::After(i, _) if !held.is_empty() => {
                let lease = held.swap_remove(i % held.len());
                let item = lease.item;
                let m = model.get_mut(&item).expect("held an unknown item");
                assert_eq!(m.state, Held::Leased, "held {item}");
                let at = match op {
                    Op::Done(_) => {
                        q.done(lease);
                        m.leased_for.clear();
                        now
                    }
                    Op::Fail(_) => {
                        let delay = q.requeue(lease);
                        assert!(delay <= Backoff::default().cap);
                        now + delay
                    }
                    _ => {
                        let Op::After(_, ms) = op else { unreachable!() };
                        q.requeue_after(lease, Duration::from_millis(ms));
                        now + Duration::from_millis(ms)
                    }
                };
                for (r, c) in std::mem::take(&mut m.leased_for) {
                    Model::join(&mut m.owners, r, c);
                }
                if m.owners.is_empty() {
                    model.remove(&item);
                } else {
                    m.state = Held::Queued { at };
                }
            }
            Op::Done(_) | Op::Fail(_) | Op::After(..) => {}
            Op::Forget(item) => q.forget(&item),
            Op::Cancel(request) => {
                q.cancel(&REQUESTS[request]);
                model.retain(|_, m| {
                    m.owners.remove(&request);
                    m.leased_for.remove(&request);
                    m.state == Held::Leased || !m.owners.is_empty()
                });
            }
            Op::Advance(ms) => advance(Duration::from_millis(ms)).await,
        }
        check(&q, &model);
    }
    // Drain: every item still wanted is leased exactly once more, then the queue is empty.
    for lease in held.drain(..) {
        let m = model.get_mut(&lease.item).expect("held an unknown item");
        m.leased_for.clear();
        if m.owners.is_empty() {
            model.remove(&lease.item);
        } else {
            m.state = Held::Queued { at: Instant::now() };
        }
        q.done(lease);
    }
    advance(Backoff::default().cap).await;
    while let Some(lease) = ready(&q) {
        let m = model
            .remove(&lease.item)
            .expect("leased an item nobody wanted");
        assert!(
            matches!(m.state, Held::Queued { .. }),
            "leased {} twice",
            lease.item
        );
        q.done(lease);
    }
    assert!(model.is_empty(), "lost items: {model:?}");
    assert_eq!(q.stats(), QueueStats::default());
    assert!(REQUESTS.iter().all(|r| !q.answers_to(r)));
}

proptest! {
    #[test]
    fn no_item_is_lost_or_duplicated(ops in prop::collection::vec(op(), 1..120)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a paused tokio runtime");
        runtime.block_on(run(ops));
    }
}

#[tokio::test(start_paused = true)]
async fn depths_count_each_item_once_by_class_and_state() {
    let q = WorkQueue::new(config());
    q.add("retry", Class::Interactive, 1);
    q.add("retry", Class::Interactive, 2);
    q.add("retry", Class::Interactive, 3);
    q.add("gc", Class::Background, 4);
    let first = take(&q);
    let second = take(&q);
    q.requeue_after(second, Duration::from_secs(2));
    let depths = q.depths();
    assert_eq!(
        depths.interactive,
        ClassDepths {
            ready: 1,
            waiting: 1,
            leased: 1
        }
    );
    assert_eq!(
        depths.background,
        ClassDepths {
            ready: 1,
            ..ClassDepths::default()
        }
    );
    q.done(first);
    assert_eq!(q.depths().interactive.leased, 0);
}

#[tokio::test(start_paused = true)]
async fn an_item_two_requests_queued_is_sent_once_and_answers_both() {
    let q = WorkQueue::new(config());
    assert_eq!(q.add("first", Class::Interactive, 7), Added::Queued);
    assert_eq!(q.add("second", Class::Interactive, 7), Added::Merged);
    assert_eq!(q.add("second", Class::Interactive, 7), Added::Merged);
    assert_eq!(q.stats().interactive, 1, "queued once");
    let lease = take(&q);
    assert_eq!(
        (lease.request, lease.owners.as_slice()),
        ("first", ["first", "second"].as_slice()),
        "the lease answers both requests, each once"
    );
    assert!(q.answers_to(&"second"), "an answer is owed while leased");
    q.done(lease);
    assert!(ready(&q).is_none(), "sent twice");
    assert!(!q.answers_to(&"first") && !q.answers_to(&"second"));
}

#[tokio::test(start_paused = true)]
async fn a_request_that_asks_during_a_lease_is_answered_by_the_next_one() {
    let q = WorkQueue::new(config());
    q.add("first", Class::Interactive, 7);
    let lease = take(&q);
    assert_eq!(q.add("second", Class::Interactive, 7), Added::AfterLease);
    assert_eq!(lease.owners, ["first"], "asked before the lease began");
    q.done(lease);
    let again = take(&q);
    assert_eq!(
        (again.request, again.owners.as_slice()),
        ("second", ["second"].as_slice())
    );
    q.done(again);
    assert_eq!(q.stats(), QueueStats::default());
}

#[tokio::test(start_paused = true)]
async fn cancelling_one_request_leaves_a_shared_item_to_the_others_in_their_lane() {
    let q = WorkQueue::new(config());
    q.add("gone", Class::Interactive, 1);
    q.add("stays", Class::Interactive, 1);
    q.add("stays", Class::Interactive, 2);
    q.add("gone", Class::Interactive, 3);
    assert_eq!(
        q.cancel(&"gone"),
        1,
        "only item 3 was the cancelled request's alone"
    );
    assert_eq!(q.request_depths(), HashMap::from([("stays", 2)]));
    let mut served = serve(&q, 2);
    served.sort();
    assert_eq!(served, [("stays", 1), ("stays", 2)]);
    assert!(ready(&q).is_none());

    // A retry took over a garbage-collection item; cancelled, it goes back to background.
    q.add("gc", Class::Background, 5);
    q.add("retry", Class::Interactive, 5);
    q.add("retry", Class::Interactive, 6);
    assert_eq!(q.cancel(&"retry"), 1);
    let stats = q.stats();
    assert_eq!((stats.interactive, stats.background), (0, 1));
    let lease = take(&q);
    assert_eq!(
        (lease.request, lease.class, lease.owners.as_slice()),
        ("gc", Class::Background, ["gc"].as_slice())
    );
    q.done(lease);
    assert_eq!(q.stats(), QueueStats::default());
}

#[tokio::test(start_paused = true)]
async fn a_failed_lease_comes_back_for_its_requests_not_for_cancelled_ones() {
    let q = WorkQueue::new(config());
    q.add("a", Class::Interactive, 1);
    q.add("b", Class::Interactive, 1);
    let lease = take(&q);
    assert_eq!(q.cancel(&"a"), 0, "a leased item is not dropped");
    q.requeue_after(lease, Duration::ZERO);
    let again = take(&q);
    assert_eq!(
        (again.request, again.owners.as_slice()),
        ("b", ["b"].as_slice())
    );
    q.cancel(&"b");
    assert!(!q.answers_to(&"b"));
    q.requeue(again);
    assert_eq!(
        q.stats(),
        QueueStats::default(),
        "an item nobody wants any more came back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leased_item_is_wanted_until_its_requests_are_cancelled_or_the_queue_stops() {
    let q = WorkQueue::new(config());
    q.add("a", Class::Interactive, 1);
    q.add("b", Class::Interactive, 1);
    q.add("a", Class::Interactive, 2);
    let one = take(&q);
    assert!(q.wanted(&one.item));
    q.cancel(&"a");
    assert!(q.wanted(&one.item), "b still wants it");
    q.cancel(&"b");
    assert!(!q.wanted(&one.item), "nobody wants it");
    q.done(one);
    q.add("c", Class::Interactive, 3);
    let three = take(&q);
    assert!(q.wanted(&three.item));
    q.shutdown();
    assert!(
        !q.wanted(&three.item),
        "a stopped queue (a lost Lease) wants nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_request_learns_its_leased_items_and_waits_for_their_leases_to_end() {
    let q = Queue::new(config());
    q.add("a", Class::Interactive, 1);
    q.add("a", Class::Interactive, 2);
    q.add("a", Class::Interactive, 3);
    let one = take(&q);
    let two = take(&q);
    let leased = q.withdraw(&"a");
    let mut leased_sorted = leased.clone();
    leased_sorted.sort();
    assert_eq!(leased_sorted, [1, 2], "the queued item 3 was not leased");
    assert!(
        ready(&q).is_none(),
        "item 3 left the queue with its request"
    );
    assert!(!q.wanted(&one.item) && !q.wanted(&two.item));
    let mut released = Box::pin(q.released(&leased));
    assert!((&mut released).now_or_never().is_none(), "two leases open");
    q.done(one);
    assert!((&mut released).now_or_never().is_none(), "one lease open");
    q.requeue(two);
    assert!(
        (&mut released).now_or_never().is_some(),
        "every lease ended, the failed one not queued again for nobody"
    );
}
