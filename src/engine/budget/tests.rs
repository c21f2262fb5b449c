use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::*;

#[derive(Default)]
struct Recorder {
    waits: Mutex<Vec<(Bucket, Duration)>>,
    tokens: Mutex<Vec<Bucket>>,
    responses: Mutex<Vec<(Verb, Option<StatusCode>)>>,
    pauses: Mutex<Vec<(Bucket, Duration)>>,
    max_in_flight: AtomicUsize,
}

impl BudgetObserver for Recorder {
    fn token_wait(&self, bucket: Bucket, waited: Duration) {
        self.waits.lock().unwrap().push((bucket, waited));
    }
    fn token_taken(&self, bucket: Bucket, _priority: Priority) {
        self.tokens.lock().unwrap().push(bucket);
    }
    fn in_flight(&self, requests: usize) {
        self.max_in_flight.fetch_max(requests, Ordering::SeqCst);
    }
    fn response(&self, verb: Verb, status: Option<StatusCode>) {
        self.responses.lock().unwrap().push((verb, status));
    }
    fn paused(&self, bucket: Bucket, pause: Duration) {
        self.pauses.lock().unwrap().push((bucket, pause));
    }
}

fn budget(writes: (u32, u32), reads: (u32, u32), workers: usize) -> (Budget, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let config = BudgetConfig {
        writes: Rate::new(writes.0, writes.1).unwrap(),
        reads: Rate::new(reads.0, reads.1).unwrap(),
        workers: NonZeroUsize::new(workers).unwrap(),
        ..BudgetConfig::default()
    };
    (Budget::with_observer(&config, recorder.clone()), recorder)
}

fn request(method: Method, uri: &str) -> Request<()> {
    Request::builder().method(method).uri(uri).body(()).unwrap()
}

fn post() -> Request<()> {
    request(Method::POST, "/api/v1/namespaces/argo/pods")
}

fn get() -> Request<()> {
    request(Method::GET, "/api/v1/namespaces/argo/pods/p")
}

type Sent = Arc<Mutex<Vec<(Verb, Duration)>>>;

/// A server that records when each request arrived (since `start`) and answers with `answer`.
fn server(
    start: Instant,
    answer: impl Fn(Verb) -> Response<()> + Clone + Send + 'static,
) -> (
    impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone + Send,
    Sent,
) {
    let sent: Sent = Arc::default();
    let log = sent.clone();
    let service = tower::service_fn(move |request: Request<()>| {
        let verb = Verb::of(&request);
        log.lock().unwrap().push((verb, start.elapsed()));
        let response = answer(verb);
        async move { Ok::<_, Infallible>(response) }
    });
    (service, sent)
}

fn ok(_: Verb) -> Response<()> {
    Response::new(())
}

fn status(code: StatusCode, retry_after: Option<&str>) -> Response<()> {
    let mut response = Response::builder().status(code);
    if let Some(seconds) = retry_after {
        response = response.header("Retry-After", seconds);
    }
    response.body(()).unwrap()
}

/// Sends every request at once, each from its own task, and waits for all answers.
async fn send_all<S>(service: &S, requests: Vec<Request<()>>) -> Vec<StatusCode>
where
    S: Service<Request<()>, Response = Response<()>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| tokio::spawn(service.clone().oneshot(request)))
        .collect();
    let mut codes = Vec::new();
    for task in tasks {
        codes.push(task.await.unwrap().unwrap().status());
    }
    codes
}

/// The most requests sent in any half-open window `[t, t + width)`.
fn busiest_window(sent: &[(Verb, Duration)], width: Duration) -> usize {
    let mut times: Vec<_> = sent.iter().map(|(_, at)| *at).collect();
    times.sort();
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t < times[i] + width)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn times_of(sent: &Sent, verb: Verb) -> Vec<Duration> {
    sent.lock()
        .unwrap()
        .iter()
        .filter(|(v, _)| *v == verb)
        .map(|(_, at)| *at)
        .collect()
}

#[test]
fn verbs_are_read_from_method_and_watch_parameter() {
    let cases = [
        (Method::GET, "/api/v1/pods", Verb::Get, Bucket::Read),
        (
            Method::GET,
            "/api/v1/pods?labelSelector=a%3Db&watch=true",
            Verb::Watch,
            Bucket::Read,
        ),
        (
            Method::GET,
            "/api/v1/pods?watch=1",
            Verb::Watch,
            Bucket::Read,
        ),
        (
            Method::GET,
            "/api/v1/pods?watch=false",
            Verb::Get,
            Bucket::Read,
        ),
        (
            Method::GET,
            "/api/v1/pods?allowWatchBookmarks=true",
            Verb::Get,
            Bucket::Read,
        ),
        (
            Method::POST,
            "/api/v1/namespaces/a/pods",
            Verb::Post,
            Bucket::Write,
        ),
        (
            Method::PUT,
            "/apis/argoproj.io/v1alpha1/namespaces/a/workflows/w",
            Verb::Put,
            Bucket::Write,
        ),
        (
            Method::PATCH,
            "/api/v1/namespaces/a/pods/p",
            Verb::Patch,
            Bucket::Write,
        ),
        (
            Method::DELETE,
            "/api/v1/namespaces/a/pods?labelSelector=x",
            Verb::Delete,
            Bucket::Write,
        ),
        (Method::HEAD, "/api/v1/pods", Verb::Other, Bucket::Write),
    ];
    for (method, uri, verb, bucket) in cases {
        let got = Verb::of(&request(method.clone(), uri));
        assert_eq!((got, got.bucket()), (verb, bucket), "{method} {uri}");
    }
}

#[tokio::test(start_paused = true)]
async fn no_second_has_more_writes_than_burst_plus_qps() {
    let start = Instant::now();
    let (budget, recorder) = budget((20, 30), (50, 100), 1000);
    let (server, sent) = server(start, ok);
    let service = budget.layer().layer(server);
    send_all(&service, (0..200).map(|_| post()).collect()).await;

    let sent = sent.lock().unwrap();
    assert_eq!(sent.len(), 200);
    // The bound is burst + qps = 50; the busiest second here is the first: the 30 saved tokens
    // plus the refills at 50 ms .. 950 ms.
    assert_eq!(busiest_window(&sent, Duration::from_secs(1)), 49);
    // Once the saved tokens are spent, exactly qps: any 5 s hold 100 writes.
    assert_eq!(busiest_window(&sent[30..], Duration::from_secs(5)), 100);
    // 30 at once, then one per 50 ms: the budget is used, not wasted.
    let last = sent.iter().map(|(_, at)| *at).max().unwrap();
    assert_eq!(last, Duration::from_millis(170 * 50));
    let waits = recorder.waits.lock().unwrap();
    assert_eq!(waits.iter().filter(|(_, w)| w.is_zero()).count(), 30);
    assert!(waits.iter().all(|(bucket, _)| *bucket == Bucket::Write));
    assert_eq!(*recorder.tokens.lock().unwrap(), [Bucket::Write; 200]);
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_stops_every_write_for_that_long() {
    let start = Instant::now();
    let first = Arc::new(AtomicUsize::new(0));
    let (budget, recorder) = budget((20, 30), (50, 100), 1000);
    let (server, sent) = server(start, move |verb| {
        if verb == Verb::Post && first.fetch_add(1, Ordering::SeqCst) == 0 {
            status(StatusCode::TOO_MANY_REQUESTS, Some("2"))
        } else {
            Response::new(())
        }
    });
    let service = budget.layer().layer(server);
    let codes = send_all(&service, vec![post()]).await;
    assert_eq!(codes, [StatusCode::TOO_MANY_REQUESTS]);
    let throttled_at = start.elapsed();

    let mut requests: Vec<_> = (0..20).map(|_| post()).collect();
    requests.extend((0..5).map(|_| get()));
    send_all(&service, requests).await;

    let writes = times_of(&sent, Verb::Post);
    assert_eq!(writes.len(), 21);
    let resumed = throttled_at + Duration::from_secs(2);
    assert!(
        writes[1..].iter().all(|at| *at >= resumed),
        "a write went out during the pause: {writes:?}"
    );
    assert!(
        writes[1..].contains(&resumed),
        "writes did not resume when the pause ended"
    );
    assert!(
        times_of(&sent, Verb::Get)
            .iter()
            .all(|at| *at == throttled_at),
        "reads were paused too"
    );
    assert_eq!(
        *recorder.pauses.lock().unwrap(),
        [(Bucket::Write, Duration::from_secs(2))]
    );
}

/// API Priority and Fairness rejects for a priority level that serves reads and writes alike
/// (its 429 names the level): both buckets pause, whichever verb was rejected.
#[tokio::test(start_paused = true)]
async fn a_429_from_a_priority_level_stops_reads_and_writes_for_that_long() {
    for (rejected, other) in [(Verb::Post, Verb::Get), (Verb::Get, Verb::Post)] {
        let start = Instant::now();
        let first = Arc::new(AtomicUsize::new(0));
        let (budget, recorder) = budget((20, 30), (50, 100), 1000);
        let (server, sent) = server(start, move |verb| {
            if verb == rejected && first.fetch_add(1, Ordering::SeqCst) == 0 {
                let mut response = status(StatusCode::TOO_MANY_REQUESTS, Some("3"));
                response.headers_mut().insert(
                    PRIORITY_LEVEL_HEADER,
                    http::HeaderValue::from_static("0b0e2e3c-uid"),
                );
                response
            } else {
                Response::new(())
            }
        });
        let service = budget.layer().layer(server);
        let first_request = if rejected == Verb::Post {
            post()
        } else {
            get()
        };
        let codes = send_all(&service, vec![first_request]).await;
        assert_eq!(codes, [StatusCode::TOO_MANY_REQUESTS]);
        let throttled_at = start.elapsed();

        let mut requests: Vec<_> = (0..5).map(|_| post()).collect();
        requests.extend((0..5).map(|_| get()));
        send_all(&service, requests).await;

        let resumed = throttled_at + Duration::from_secs(3);
        let after: Vec<Duration> = sent.lock().unwrap()[1..]
            .iter()
            .map(|(_, at)| *at)
            .collect();
        assert_eq!(after.len(), 10);
        assert!(
            after.iter().all(|at| *at >= resumed),
            "{rejected:?} rejected: a request went out during the pause: {after:?}"
        );
        assert!(
            times_of(&sent, other).contains(&resumed),
            "{rejected:?} rejected: {other:?} did not resume when the pause ended"
        );
        let mut pauses = recorder.pauses.lock().unwrap().clone();
        pauses.sort_by_key(|(bucket, _)| bucket.as_str());
        assert_eq!(
            pauses,
            [
                (Bucket::Read, Duration::from_secs(3)),
                (Bucket::Write, Duration::from_secs(3))
            ]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_waiting_for_a_token_when_the_pause_begins_waits_for_the_pause_too() {
    let start = Instant::now();
    let (budget, _) = budget((1, 1), (50, 100), 10);
    let answered = Arc::new(AtomicUsize::new(0));
    let inner = tower::service_fn(move |_: Request<()>| {
        let n = answered.fetch_add(1, Ordering::SeqCst);
        let at = start.elapsed();
        async move {
            if n == 0 {
                // The first write is answered late, after the second began waiting.
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<_, Infallible>((status(StatusCode::TOO_MANY_REQUESTS, Some("2")), at))
            } else {
                Ok((Response::new(()), at))
            }
        }
    })
    .map_response(|(response, at): (Response<()>, Duration)| response.map(|()| at));
    let service = budget.layer().layer(inner);
    let first = tokio::spawn(service.clone().oneshot(post()));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = tokio::spawn(service.clone().oneshot(post()));
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
    let second_sent_at = *second.await.unwrap().unwrap().body();
    // The refill at 1 s would have let it out in the middle of the pause (10 ms to 2.01 s).
    assert_eq!(second_sent_at, Duration::from_millis(2010));
}

#[tokio::test(start_paused = true)]
async fn only_429_and_503_with_retry_after_pause_and_no_longer_than_max_pause() {
    let cases = [
        (StatusCode::SERVICE_UNAVAILABLE, Some("3"), Some(3)),
        (StatusCode::TOO_MANY_REQUESTS, Some("3600"), Some(60)),
        (StatusCode::TOO_MANY_REQUESTS, None, None),
        (StatusCode::TOO_MANY_REQUESTS, Some("soon"), None),
        (StatusCode::INTERNAL_SERVER_ERROR, Some("3"), None),
        (StatusCode::OK, Some("3"), None),
    ];
    for (code, retry_after, paused) in cases {
        let (budget, recorder) = budget((20, 30), (50, 100), 10);
        let (server, _) = server(Instant::now(), move |_| status(code, retry_after));
        send_all(
            &budget.layer().layer(server),
            vec![request(Method::DELETE, "/x")],
        )
        .await;
        let expected: Vec<_> = paused
            .into_iter()
            .map(|s| (Bucket::Write, Duration::from_secs(s)))
            .collect();
        assert_eq!(
            *recorder.pauses.lock().unwrap(),
            expected,
            "{code} {retry_after:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn reads_do_not_take_write_tokens() {
    let start = Instant::now();
    let (budget, recorder) = budget((1, 1), (50, 100), 1000);
    let (server, sent) = server(start, ok);
    let service = budget.layer().layer(server);
    send_all(&service, vec![post()]).await;
    send_all(&service, (0..100).map(|_| get()).collect()).await;
    send_all(&service, vec![post()]).await;

    assert!(
        times_of(&sent, Verb::Get).iter().all(|at| at.is_zero()),
        "reads waited"
    );
    assert_eq!(
        times_of(&sent, Verb::Post),
        [Duration::ZERO, Duration::from_secs(1)]
    );
    let waits = recorder.waits.lock().unwrap();
    assert!(
        waits
            .iter()
            .filter(|(b, _)| *b == Bucket::Read)
            .all(|(_, w)| w.is_zero())
    );
    assert_eq!(
        waits.iter().filter(|(b, _)| *b == Bucket::Read).count(),
        100
    );
    let responses = recorder.responses.lock().unwrap();
    assert_eq!(
        responses.iter().filter(|(v, _)| *v == Verb::Get).count(),
        100
    );
    assert!(
        responses
            .iter()
            .all(|(_, code)| *code == Some(StatusCode::OK))
    );
}

#[tokio::test(start_paused = true)]
async fn requests_in_flight_never_exceed_workers() {
    let (budget, recorder) = budget((1000, 1000), (1000, 1000), 3);
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (now_in, most_in) = (now.clone(), most.clone());
    let slow = tower::service_fn(move |_: Request<()>| {
        let (now, most) = (now_in.clone(), most_in.clone());
        async move {
            most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(()))
        }
    });
    let service = budget.layer().layer(slow);
    let start = Instant::now();
    let mut requests: Vec<_> = (0..15).map(|_| get()).collect();
    requests.extend((0..15).map(|_| post()));
    send_all(&service, requests).await;

    assert_eq!(most.load(Ordering::SeqCst), 3);
    assert_eq!(recorder.max_in_flight.load(Ordering::SeqCst), 3);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(1000),
        "30 requests, 3 at a time"
    );
    assert_eq!(budget.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn open_watches_take_no_worker_slot() {
    let (budget, _) = budget((20, 30), (50, 100), 1);
    let never = tower::service_fn(|request: Request<()>| async move {
        if Verb::of(&request) == Verb::Watch {
            std::future::pending::<()>().await;
        }
        Ok::<_, Infallible>(Response::new(()))
    });
    let service = budget.layer().layer(never);
    let watch = tokio::spawn(
        service
            .clone()
            .oneshot(request(Method::GET, "/api/v1/pods?watch=true")),
    );
    tokio::task::yield_now().await;
    let codes = tokio::time::timeout(
        Duration::from_secs(10),
        send_all(&service, vec![get(), post()]),
    )
    .await
    .expect("the open watch held the only worker slot");
    assert_eq!(codes, [StatusCode::OK, StatusCode::OK]);
    assert!(!watch.is_finished());
    watch.abort();
}

/// kube's retry runs outside the budget, so a retried request is budgeted (and observed) twice.
#[tokio::test]
async fn the_kube_client_sends_every_attempt_through_the_budget() {
    use axum::http::StatusCode as AxumStatus;
    use k8s_openapi::api::core::v1::Pod;

    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().fallback({
        let calls = calls.clone();
        move || {
            let calls = calls.clone();
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    (AxumStatus::SERVICE_UNAVAILABLE, String::new())
                } else {
                    let list = r#"{"apiVersion":"v1","kind":"PodList","metadata":{},"items":[]}"#;
                    (AxumStatus::OK, list.to_owned())
                }
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let (budget, recorder) = budget((20, 30), (50, 100), 4);
    let config = kube::Config::new(url.parse().unwrap());
    let client = client(config, &budget).unwrap();
    let pods: kube::Api<Pod> = kube::Api::all(client);
    let list = pods.list(&Default::default()).await.unwrap();
    assert!(list.items.is_empty());

    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        *recorder.responses.lock().unwrap(),
        [
            (Verb::Get, Some(StatusCode::SERVICE_UNAVAILABLE)),
            (Verb::Get, Some(StatusCode::OK))
        ]
    );
    assert_eq!(recorder.waits.lock().unwrap().len(), 2);
    server.abort();
}

#[tokio::test(start_paused = true)]
async fn a_write_token_taken_ahead_is_spent_by_the_next_write_only() {
    let start = Instant::now();
    let (budget, recorder) = budget((1, 1), (50, 100), 10);
    let (server, sent) = server(start, ok);
    let service = budget.layer().layer(server);
    let token = budget.take_write_token("argo").await;
    // The bucket is empty now: without the token this write would wait a second.
    token
        .spend_on(async {
            service.clone().oneshot(post()).await.unwrap();
            service.clone().oneshot(post()).await.unwrap();
        })
        .await;
    service.clone().oneshot(post()).await.unwrap();
    let times = times_of(&sent, Verb::Post);
    assert_eq!(
        times,
        [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(2)
        ]
    );
    // Three writes, three tokens: the one taken ahead is counted once.
    assert_eq!(*recorder.tokens.lock().unwrap(), [Bucket::Write; 3]);
}

/// A worker takes its token; a 429 pauses the bucket before it sends: the write it then sends
/// waits for the pause to end, token or not.
#[tokio::test(start_paused = true)]
async fn a_write_token_taken_before_a_pause_waits_for_the_pause_too() {
    let start = Instant::now();
    let sent: Sent = Arc::default();
    let log = sent.clone();
    // The first write holds the only slot for 500 ms, then is refused with Retry-After: 2.
    let server = tower::service_fn(move |request: Request<()>| {
        let first = log.lock().unwrap().is_empty();
        log.lock()
            .unwrap()
            .push((Verb::of(&request), start.elapsed()));
        async move {
            if first {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, Infallible>(status(StatusCode::TOO_MANY_REQUESTS, Some("2")))
            } else {
                Ok(Response::new(()))
            }
        }
    });
    let (budget, _) = budget((20, 30), (50, 100), 1);
    let service = budget.layer().layer(server);
    let throttled = tokio::spawn(service.clone().oneshot(post()));
    tokio::task::yield_now().await;
    let token = budget.take_write_token("argo").await;
    let refused = throttled.await.unwrap().unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let answer = token
        .spend_on(service.clone().oneshot(post()))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        times_of(&sent, Verb::Post),
        [Duration::ZERO, Duration::from_millis(2500)],
        "the prepaid write must wait for the pause the 429 ordered after its token was taken"
    );
}

/// The path of each request sent, and when it arrived.
type Paths = Arc<Mutex<Vec<(String, Duration)>>>;

/// A server that records the path of each request and when it arrived.
fn path_server(
    start: Instant,
    answer: impl Fn(&str) -> Response<()> + Clone + Send + 'static,
) -> (
    impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone + Send,
    Paths,
) {
    let sent: Paths = Arc::default();
    let log = sent.clone();
    let service = tower::service_fn(move |request: Request<()>| {
        let path = request.uri().path().to_owned();
        log.lock().unwrap().push((path.clone(), start.elapsed()));
        let response = answer(&path);
        async move { Ok::<_, Infallible>(response) }
    });
    (service, sent)
}

fn post_in(namespace: &str) -> Request<()> {
    request(
        Method::POST,
        &format!("/api/v1/namespaces/{namespace}/pods"),
    )
}

/// Arrival times of the requests to `namespace`.
fn arrivals(sent: &Mutex<Vec<(String, Duration)>>, namespace: &str) -> Vec<Duration> {
    let needle = format!("/namespaces/{namespace}/");
    sent.lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path.contains(&needle))
        .map(|(_, at)| *at)
        .collect()
}

/// A tenant with a thousand writes queued delays another's by about one token, not a thousand.
#[tokio::test(start_paused = true)]
async fn namespaces_take_turns_for_tokens() {
    let start = Instant::now();
    let (budget, _) = budget((20, 1), (50, 100), 2000);
    let (server, sent) = path_server(start, |_| Response::new(()));
    let service = budget.layer().layer(server);
    let flood: Vec<_> = (0..1000).map(|_| post_in("busy")).collect();
    let flooding = {
        let service = service.clone();
        tokio::spawn(async move { send_all(&service, flood).await })
    };
    // The flood is queued; then another tenant asks for three writes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = start.elapsed();
    send_all(&service, (0..3).map(|_| post_in("quiet")).collect()).await;
    let quiet = arrivals(&sent, "quiet");
    assert_eq!(quiet.len(), 3);
    // At 20 tokens a second, turns alternate: each quiet write waits at most two tokens.
    let last = *quiet.iter().max().unwrap() - asked;
    assert!(
        last <= Duration::from_millis(300),
        "the quiet namespace waited {last:?} behind the busy one"
    );
    flooding.abort();
    // The rate holds across flows.
    let all: Vec<(Verb, Duration)> = sent
        .lock()
        .unwrap()
        .iter()
        .map(|(_, at)| (Verb::Post, *at))
        .collect();
    assert!(busiest_window(&all, Duration::from_secs(1)) <= 21);
}

/// API Priority and Fairness rejects a request of one namespace: that namespace pauses for
/// Retry-After, reads and writes; another namespace goes on.
#[tokio::test(start_paused = true)]
async fn a_priority_level_429_pauses_only_its_namespace() {
    let start = Instant::now();
    let first = Arc::new(AtomicUsize::new(0));
    let (budget, _) = budget((20, 30), (50, 100), 1000);
    let (server, sent) = path_server(start, move |path| {
        if path.contains("/namespaces/hit/") && first.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut response = status(StatusCode::TOO_MANY_REQUESTS, Some("4"));
            response.headers_mut().insert(
                PRIORITY_LEVEL_HEADER,
                http::HeaderValue::from_static("0b0e2e3c-uid"),
            );
            response
        } else {
            Response::new(())
        }
    });
    let service = budget.layer().layer(server);
    assert_eq!(
        send_all(&service, vec![post_in("hit")]).await,
        [StatusCode::TOO_MANY_REQUESTS]
    );
    let throttled_at = start.elapsed();
    let mut requests = vec![
        post_in("hit"),
        request(Method::GET, "/api/v1/namespaces/hit/pods/p"),
    ];
    requests.extend((0..3).map(|_| post_in("other")));
    send_all(&service, requests).await;
    let hit = arrivals(&sent, "hit");
    assert!(
        hit[1..]
            .iter()
            .all(|at| *at >= throttled_at + Duration::from_secs(4)),
        "the rejected namespace sent during its pause: {hit:?}"
    );
    assert!(
        arrivals(&sent, "other")
            .iter()
            .all(|at| *at == throttled_at),
        "another namespace was held back"
    );
    assert_eq!(budget.inner.flows.len(), 0, "idle flows are forgotten");
}

/// A flow waiting for tokens holds at most one worker slot: another namespace's read goes
/// out at once though the slots are few and the busy namespace's writes wait long.
#[tokio::test(start_paused = true)]
async fn a_waiting_flow_does_not_hold_every_slot() {
    let start = Instant::now();
    let (budget, _) = budget((1, 1), (50, 100), 2);
    let (server, sent) = path_server(start, |_| Response::new(()));
    let service = budget.layer().layer(server);
    let flood: Vec<_> = (0..50).map(|_| post_in("busy")).collect();
    let flooding = {
        let service = service.clone();
        tokio::spawn(async move { send_all(&service, flood).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = start.elapsed();
    send_all(
        &service,
        vec![request(Method::GET, "/api/v1/namespaces/quiet/pods/p")],
    )
    .await;
    let quiet = arrivals(&sent, "quiet");
    assert_eq!(
        quiet,
        [asked],
        "the read waited for a slot behind the busy writes"
    );
    flooding.abort();
}

/// Inside one namespace, askers take turns: a batch of a thousand writes delays another
/// asker's few by a token or two.
#[tokio::test(start_paused = true)]
async fn askers_in_one_namespace_take_turns() {
    let start = Instant::now();
    let (budget, _) = budget((20, 1), (50, 100), 2000);
    let (server, sent) = path_server(start, |_| Response::new(()));
    let service = budget.layer().layer(server);
    let send_as = |asker: &'static str, n: usize, namespace: &'static str| {
        let service = service.clone();
        tokio::spawn(on_behalf_of(asker.into(), async move {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    tokio::spawn(on_behalf_of(
                        asker.into(),
                        service.clone().oneshot(post_in(namespace)),
                    ))
                })
                .collect();
            for task in tasks {
                task.await.unwrap().unwrap();
            }
        }))
    };
    let batch = send_as("batch", 1000, "team");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = start.elapsed();
    let before = sent.lock().unwrap().len();
    send_as("user", 3, "team").await.unwrap();
    let sent_since = sent.lock().unwrap()[before..].to_vec();
    let took = sent_since.last().unwrap().1 - asked;
    assert!(
        took <= Duration::from_millis(350),
        "the other asker's three writes took {took:?} beside the batch"
    );
    batch.abort();
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_never_comes_ends_the_request_but_a_silent_watch_stays_open() {
    let never = tower::service_fn(|_: Request<()>| async {
        std::future::pending::<Result<Response<Silent>, tower::BoxError>>().await
    });
    let service = layer::AnswerWithin { inner: never };
    let get = tokio::spawn(
        service
            .clone()
            .oneshot(request(Method::GET, "/api/v1/pods")),
    );
    let watch = tokio::spawn(
        service
            .clone()
            .oneshot(request(Method::GET, "/api/v1/pods?watch=true")),
    );
    tokio::time::sleep(layer::ANSWER_TIMEOUT - Duration::from_secs(1)).await;
    assert!(!get.is_finished(), "ended before its bound");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let Err(error) = get.await.unwrap() else {
        panic!("no answer came, yet the request succeeded")
    };
    assert!(error.is::<tokio::time::error::Elapsed>(), "{error}");
    assert!(!watch.is_finished(), "a watch has no such bound");
    watch.abort();
}

/// A body that sends its first bytes and then nothing, its connection kept open.
type Silent = http_body_util::StreamBody<
    futures::stream::BoxStream<'static, Result<hyper::body::Frame<bytes::Bytes>, Infallible>>,
>;

fn silent_after_first_bytes() -> Silent {
    use futures::StreamExt as _;
    let first = hyper::body::Frame::data(bytes::Bytes::from_static(b"{\"items\":["));
    http_body_util::StreamBody::new(
        futures::stream::once(async { Ok(first) })
            .chain(futures::stream::pending())
            .boxed(),
    )
}

/// A list whose answer began and then went silent (a stalled proxy, a half-open connection)
/// ends with an error after the bound, as an answer that never began does; a watch's body
/// may stay silent as long as it likes.
#[tokio::test(start_paused = true)]
async fn an_answer_s_body_gone_silent_ends_the_request_but_a_watch_s_stays_open() {
    use http_body_util::BodyExt as _;
    let stalls = tower::service_fn(|_: Request<()>| async {
        Ok::<_, tower::BoxError>(Response::new(silent_after_first_bytes()))
    });
    let service = layer::AnswerWithin { inner: stalls };
    let list = service
        .clone()
        .oneshot(request(Method::GET, "/api/v1/pods"));
    let mut list = std::pin::pin!(list.await.expect("its headers came").into_body().collect());
    let early = tokio::time::timeout(layer::ANSWER_TIMEOUT - Duration::from_secs(1), &mut list);
    assert!(early.await.is_err(), "ended before its bound");
    let late = tokio::time::timeout(Duration::from_secs(2), list).await;
    let Ok(Err(error)) = late else {
        panic!("the body never ended, yet it did not fail: {late:?}")
    };
    assert!(error.is::<tower_http::timeout::TimeoutError>(), "{error}");
    let watch = service.oneshot(request(Method::GET, "/api/v1/pods?watch=true"));
    let watch = watch.await.expect("its headers came").into_body().collect();
    let silent = tokio::time::timeout(layer::ANSWER_TIMEOUT * 10, watch).await;
    assert!(silent.is_err(), "a watch has no such bound");
}

/// A retry's write that comes while a thousand reports of many namespaces wait goes out next;
/// the reports still get a token in every `classes::FLOOR` + 1.
#[tokio::test(start_paused = true)]
async fn a_retry_s_write_goes_before_waiting_reports_and_reports_still_move() {
    let start = Instant::now();
    let (budget, _) = budget((20, 1), (50, 100), 2000);
    let (server, sent) = path_server(start, |_| Response::new(()));
    let service = budget.layer().layer(server);
    let reports: Vec<_> = (0..1000)
        .map(|i| {
            let service = service.clone();
            tokio::spawn(with_priority(
                Priority::Report,
                service.oneshot(post_in(&format!("busy-{}", i % 50))),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = start.elapsed();
    let before = sent.lock().unwrap().len();
    send_all(&service, (0..3).map(|_| post_in("quiet")).collect()).await;
    let quiet = arrivals(&sent, "quiet");
    let last = *quiet.iter().max().unwrap() - asked;
    // Each write waits at most for the report already in the bucket (a token at 20 a second)
    // and its own; behind fifty namespaces' reports, first come first served, each would wait
    // 2.5 s.
    assert!(
        last <= Duration::from_millis(350),
        "the retry's writes waited {last:?} behind reports"
    );
    assert!(
        before >= 15,
        "reports moved while nothing else waited: {before}"
    );
    for report in reports {
        report.abort();
    }
}

/// A delete worker's token is its item's namespace's: a tenant with a hundred deletes waiting
/// for tokens delays another tenant's delete by a turn, not by a hundred.
#[tokio::test(start_paused = true)]
async fn write_tokens_taken_ahead_take_turns_between_namespaces() {
    let (budget, _) = budget((20, 1), (50, 100), 2000);
    let busy: Vec<_> = (0..100)
        .map(|_| {
            let budget = budget.clone();
            tokio::spawn(async move { drop(budget.take_write_token("busy").await) })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = Instant::now();
    drop(budget.take_write_token("quiet").await);
    assert!(
        asked.elapsed() <= Duration::from_millis(100),
        "the quiet namespace's token waited {:?}",
        asked.elapsed()
    );
    for task in busy {
        task.abort();
    }
}
