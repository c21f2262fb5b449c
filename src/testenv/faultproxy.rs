//! A fault-injecting proxy between a client (the controller under test) and the local
//! plane's kube-apiserver, for the stale, unobserved and intermediate states of Sieve
//! (OSDI '22): per verb and resource it can hold a request, answer 429 with Retry-After,
//! stall or cut a watch, drop chosen watch events and serve a list at an older
//! resourceVersion. It terminates TLS with the plane's own serving certificate, so a
//! client trusting the plane's CA accepts it, and forwards each request unchanged (the
//! client's own bearer token included) over a fresh TLS connection to the API server.
//! Rules change at run time; every request is recorded on arrival so a test can wait
//! for "the DeleteCollection has arrived and is being held".

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use super::localcluster::{self, LocalCluster, Role};
use crate::argoapi::tls::{CertFiles, server_config};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Why the proxy cannot start, or a test's wait on it ended.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("fault proxy: the plane's CA {path} is no usable PEM certificate: {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("fault proxy: the plane's serving certificate: {0}")]
    Tls(#[from] crate::argoapi::tls::TlsError),
    #[error("fault proxy: the plane's server URL {0} has no host and port")]
    ServerUrl(String),
    #[error("fault proxy: binding 127.0.0.1:0: {0}")]
    Bind(#[source] std::io::Error),
    #[error("fault proxy: the {role:?} client configuration: {source}")]
    Config {
        role: Role,
        #[source]
        source: localcluster::Error,
    },
    #[error("fault proxy: no request matching {matcher:?} arrived within {timeout:?}")]
    NotSeen { matcher: Matcher, timeout: Duration },
}

/// Which requests a rule applies to: the method (any if `None`), a suffix of the path and
/// whether it is a watch. `Matcher::new(Method::DELETE, "/namespaces/ns/pods")` is the
/// DeleteCollection of ns's pods; `Matcher::new(Method::GET, "/namespaces/ns/pods")` their
/// list and watch, `.watch(false)` the list alone.
#[derive(Clone, Debug)]
pub struct Matcher {
    method: Option<Method>,
    path_suffix: String,
    watch: Option<bool>,
    query_contains: Option<String>,
}

impl Matcher {
    pub fn new(method: Method, path_suffix: impl Into<String>) -> Self {
        Self {
            method: Some(method),
            path_suffix: path_suffix.into(),
            watch: None,
            query_contains: None,
        }
    }

    /// Any method on a path ending with `path_suffix`.
    pub fn any_method(path_suffix: impl Into<String>) -> Self {
        Self {
            method: None,
            path_suffix: path_suffix.into(),
            watch: None,
            query_contains: None,
        }
    }

    /// Only watches (`true`) or only the rest (`false`).
    pub fn watch(mut self, watch: bool) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Only requests whose query, percent-decoded, contains `text`: a list by its
    /// selectors, say.
    pub fn query_contains(mut self, text: impl Into<String>) -> Self {
        self.query_contains = Some(text.into());
        self
    }

    pub fn matches(&self, method: &Method, uri: &Uri) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && uri.path().ends_with(&self.path_suffix)
            && self.watch.is_none_or(|w| w == is_watch(uri))
            && self.query_contains.as_ref().is_none_or(|text| {
                let query = uri.query().unwrap_or_default();
                form_urlencoded::parse(query.as_bytes()).any(|(key, value)| {
                    key.contains(text.as_str()) || value.contains(text.as_str())
                })
            })
    }
}

/// What the proxy does to a matching request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Forwards the request only after this long.
    Hold(Duration),
    /// Forwards the request only once the test cancels this token (its "release").
    HoldUntil(CancellationToken),
    /// Answers 429 TooManyRequests with `Retry-After: seconds` and does not forward.
    TooManyRequests { retry_after_seconds: u32 },
    /// Answers 500 InternalError and does not forward (an API server or etcd failure).
    InternalError,
    /// Answers a Status with this code and does not forward: a 422 from a failed JSON
    /// patch `test`, a 403 from a missing RBAC rule.
    Refuse(StatusCode),
    /// Forwards a watch's first `after_events` events, then nothing more, keeping the
    /// connection open until the client gives up.
    StallWatch { after_events: usize },
    /// Forwards a watch's first `after_events` events, then breaks the connection.
    CutWatch { after_events: usize },
    /// Drops every watch event whose bytes (JSON or protobuf) contain this string, e.g.
    /// a pod's name or UID.
    DropEvents { containing: String },
    /// Holds back every watch event whose bytes contain this string until `until` is
    /// cancelled, then forwards the last one held: the client misses the states between
    /// (Sieve's unobserved states) yet sees the latest, as a watch always delivers it. A
    /// watch begun after `until` is cancelled is unaffected.
    SkipEvents {
        containing: String,
        until: CancellationToken,
    },
    /// Serves a list (not a continued page) at exactly this older resourceVersion
    /// (`resourceVersionMatch=Exact`, which etcd serves while it keeps that revision).
    StaleList { resource_version: String },
    /// Forwards the request and lets the API server answer it in full (a write lands), then
    /// breaks the connection before the client has the answer's body: a load balancer's
    /// reset or an API server restart, where the client cannot tell whether its write was
    /// done.
    LoseAnswer,
    /// Forwards the request, reads the API server's whole answer, and gives it to the
    /// client only once the test cancels this token: a list whose snapshot is older than
    /// its arrival (a slow network, a client paused), the world changing meanwhile.
    HoldAnswerUntil(CancellationToken),
    /// As [`Fault::HoldAnswerUntil`], for this long.
    HoldAnswer(Duration),
}

/// A fault applied to matching requests, the next `times` of them or all.
#[derive(Clone, Debug)]
pub struct Rule {
    pub matcher: Matcher,
    pub fault: Fault,
    pub times: Option<usize>,
}

impl Rule {
    pub fn new(matcher: Matcher, fault: Fault) -> Self {
        Self {
            matcher,
            fault,
            times: None,
        }
    }

    /// Applies to the next `n` matching requests only.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }
}

/// A rule's handle, to remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleId(u64);

/// A request as it arrived at the proxy.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    /// Path and query.
    pub uri: Uri,
    pub watch: bool,
    pub at: Instant,
}

struct Upstream {
    addr: String,
    name: ServerName<'static>,
    tls: TlsConnector,
}

impl Upstream {
    /// One fresh connection per request: a cut or stalled stream never poisons another.
    async fn send(&self, request: Request<Incoming>) -> Result<Response<Incoming>, BoxError> {
        let tcp = TcpStream::connect(&self.addr).await?;
        let tls = self.tls.connect(self.name.clone(), tcp).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "fault proxy: upstream connection ended");
            }
        });
        Ok(sender.send_request(request).await?)
    }
}

struct State {
    rules: Mutex<Vec<(RuleId, Rule)>>,
    next_rule: AtomicU64,
    seen: Mutex<Vec<Seen>>,
    upstream: Upstream,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked holding the lock leaves data that is still worth reading.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The proxy; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: CancellationToken,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 in front of `cluster`'s API server, with no rules.
    pub async fn start(cluster: &LocalCluster) -> Result<Self, ProxyError> {
        let (cert, key) = cluster.serving_cert_paths();
        let acceptor = TlsAcceptor::from(server_config(&CertFiles { cert, key })?);

        let ca_path = cluster.ca_cert_path();
        let ca_error = |reason: String| ProxyError::Ca {
            path: ca_path.clone(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&ca_path).map_err(|e| ca_error(e.to_string()))? {
            roots
                .add(cert.map_err(|e| ca_error(e.to_string()))?)
                .map_err(|e| ca_error(e.to_string()))?;
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ca_error(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();

        let server: Uri = cluster
            .server_url()
            .parse()
            .map_err(|_| ProxyError::ServerUrl(cluster.server_url().to_owned()))?;
        let (Some(host), Some(port)) = (server.host(), server.port_u16()) else {
            return Err(ProxyError::ServerUrl(cluster.server_url().to_owned()));
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| ProxyError::ServerUrl(cluster.server_url().to_owned()))?;
        let upstream = Upstream {
            addr: format!("{host}:{port}"),
            name,
            tls: TlsConnector::from(Arc::new(client)),
        };

        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ProxyError::Bind)?;
        let addr = listener.local_addr().map_err(ProxyError::Bind)?;
        let state = Arc::new(State {
            rules: Mutex::default(),
            next_rule: AtomicU64::new(0),
            seen: Mutex::default(),
            upstream,
        });
        let shutdown = CancellationToken::new();
        tokio::spawn(accept(listener, acceptor, state.clone(), shutdown.clone()));
        Ok(Self {
            addr,
            state,
            shutdown,
        })
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// `role`'s client configuration, pointed at the proxy.
    pub async fn config(
        &self,
        cluster: &LocalCluster,
        role: Role,
    ) -> Result<kube::Config, ProxyError> {
        let mut config = cluster
            .config(role)
            .await
            .map_err(|source| ProxyError::Config { role, source })?;
        config.cluster_url = self.url().parse().expect("an https URL of an address");
        Ok(config)
    }

    pub fn add(&self, rule: Rule) -> RuleId {
        let id = RuleId(self.state.next_rule.fetch_add(1, Ordering::Relaxed));
        lock(&self.state.rules).push((id, rule));
        id
    }

    pub fn remove(&self, id: RuleId) {
        lock(&self.state.rules).retain(|(rule, _)| *rule != id);
    }

    /// Every request so far, in order of arrival.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.state.seen).clone()
    }

    /// The requests so far that `matcher` takes.
    pub fn seen_matching(&self, matcher: &Matcher) -> Vec<Seen> {
        lock(&self.state.seen)
            .iter()
            .filter(|s| matcher.matches(&s.method, &s.uri))
            .cloned()
            .collect()
    }

    /// Waits until a request `matcher` takes has arrived at or after `since`.
    pub async fn wait_for(
        &self,
        matcher: &Matcher,
        since: Instant,
        timeout: Duration,
    ) -> Result<Seen, ProxyError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self
                .seen_matching(matcher)
                .into_iter()
                .find(|s| s.at >= since);
            if let Some(seen) = arrived {
                return Ok(seen);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProxyError::NotSeen {
                    matcher: matcher.clone(),
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: Arc<State>,
    shutdown: CancellationToken,
) {
    loop {
        let tcp = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    tracing::warn!(%error, "fault proxy: accepting a connection");
                    continue;
                }
            },
        };
        let (acceptor, state, shutdown) = (acceptor.clone(), state.clone(), shutdown.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::debug!(%error, "fault proxy: a TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(state.serve(request).await) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new());
            tokio::select! {
                _ = http.serve_connection(TokioIo::new(tls), service) => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

impl State {
    /// The faults of the rules that take this request, counting it against their `times`.
    fn faults_for(&self, method: &Method, uri: &Uri) -> Vec<Fault> {
        let mut rules = lock(&self.rules);
        let mut faults = Vec::new();
        for (_, rule) in rules.iter_mut() {
            if rule.matcher.matches(method, uri) && rule.times != Some(0) {
                faults.push(rule.fault.clone());
                if let Some(times) = &mut rule.times {
                    *times -= 1;
                }
            }
        }
        rules.retain(|(_, rule)| rule.times != Some(0));
        faults
    }

    async fn serve(&self, mut request: Request<Incoming>) -> Response<Body> {
        let watch = is_watch(request.uri());
        lock(&self.seen).push(Seen {
            method: request.method().clone(),
            uri: request.uri().clone(),
            watch,
            at: Instant::now(),
        });
        let faults = self.faults_for(request.method(), request.uri());
        let mut stream = StreamFaults::default();
        let mut lose_answer = false;
        let mut hold_answer = None;
        for fault in faults {
            match fault {
                Fault::Hold(duration) => tokio::time::sleep(duration).await,
                Fault::HoldUntil(release) => release.cancelled().await,
                Fault::TooManyRequests {
                    retry_after_seconds,
                } => return too_many_requests(retry_after_seconds),
                Fault::InternalError => {
                    return status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the fault proxy failed this request",
                        None,
                    );
                }
                Fault::Refuse(code) => {
                    return status(code, "the fault proxy refused this request", None);
                }
                Fault::StaleList { resource_version } if !watch => {
                    let uri = at_resource_version(request.uri(), &resource_version);
                    *request.uri_mut() = uri;
                }
                Fault::StaleList { .. } => {}
                Fault::LoseAnswer => lose_answer = true,
                Fault::HoldAnswerUntil(release) => hold_answer = Some(release),
                Fault::HoldAnswer(duration) => {
                    let release = CancellationToken::new();
                    let expiry = release.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(duration).await;
                        expiry.cancel();
                    });
                    hold_answer = Some(release);
                }
                Fault::StallWatch { after_events } => stream.stall_after = Some(after_events),
                Fault::CutWatch { after_events } => stream.cut_after = Some(after_events),
                Fault::DropEvents { containing } => stream.drop.push(containing),
                Fault::SkipEvents { containing, until } => {
                    stream.skip.push(Skip {
                        containing,
                        until,
                        held: None,
                    });
                }
            }
        }
        let response = match self.upstream.send(request).await {
            Ok(response) => response,
            Err(error) => return status(StatusCode::BAD_GATEWAY, &error.to_string(), None),
        };
        if lose_answer {
            let (parts, body) = response.into_parts();
            // The whole answer read: the API server has done the request.
            let _ = body.collect().await;
            let broken = futures::stream::once(async {
                Err::<Frame<Bytes>, BoxError>("fault proxy: the answer was lost".into())
            });
            return Response::from_parts(parts, StreamBody::new(broken).boxed_unsync());
        }
        if let Some(release) = hold_answer {
            let (parts, body) = response.into_parts();
            let answer = match body.collect().await {
                Ok(answer) => answer.to_bytes(),
                Err(error) => return status(StatusCode::BAD_GATEWAY, &error.to_string(), None),
            };
            release.cancelled().await;
            return Response::from_parts(
                parts,
                Full::new(answer).map_err(|e| match e {}).boxed_unsync(),
            );
        }
        if !watch || stream.is_empty() {
            return response.map(|body| body.map_err(BoxError::from).boxed_unsync());
        }
        let (parts, body) = response.into_parts();
        let protobuf = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("protobuf"));
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(stream.apply(body, protobuf, tx));
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        });
        Response::from_parts(parts, StreamBody::new(frames).boxed_unsync())
    }
}

/// What to do to one watch's events.
#[derive(Default)]
struct StreamFaults {
    stall_after: Option<usize>,
    cut_after: Option<usize>,
    drop: Vec<String>,
    skip: Vec<Skip>,
}

/// A [`Fault::SkipEvents`] on one watch, with the last event it holds back.
struct Skip {
    containing: String,
    until: CancellationToken,
    held: Option<Bytes>,
}

type FrameSender = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

/// How often a watch with events held back looks whether they are released.
const RELEASE_CHECK: Duration = Duration::from_millis(50);

impl StreamFaults {
    fn is_empty(&self) -> bool {
        self.stall_after.is_none()
            && self.cut_after.is_none()
            && self.drop.is_empty()
            && self.skip.is_empty()
    }

    /// Whether `event` is held back, now the latest of its kind held.
    fn hold(&mut self, event: &Bytes) -> bool {
        let skip = self
            .skip
            .iter_mut()
            .find(|s| !s.until.is_cancelled() && contains(event, s.containing.as_bytes()));
        match skip {
            Some(skip) => {
                skip.held = Some(event.clone());
                true
            }
            None => false,
        }
    }

    /// The events held back by skips now released.
    fn released(&mut self) -> Vec<Bytes> {
        self.skip
            .iter_mut()
            .filter(|s| s.until.is_cancelled())
            .filter_map(|s| s.held.take())
            .collect()
    }

    async fn apply(mut self, mut body: Incoming, protobuf: bool, tx: FrameSender) {
        let mut buffer = BytesMut::new();
        let mut forwarded = 0;
        loop {
            if self.stall_after.is_some_and(|n| forwarded >= n) {
                tx.closed().await;
                return;
            }
            if self.cut_after.is_some_and(|n| forwarded >= n) {
                // An error frame makes hyper abort the connection mid-body; the pause
                // first lets it flush what was forwarded, which it would otherwise drop.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = tx.send(Err("fault proxy: watch cut".into())).await;
                return;
            }
            if let Some(event) = next_event(&mut buffer, protobuf) {
                if self
                    .drop
                    .iter()
                    .any(|needle| contains(&event, needle.as_bytes()))
                {
                    continue;
                }
                if self.hold(&event) {
                    continue;
                }
                if tx.send(Ok(Frame::data(event))).await.is_err() {
                    return;
                }
                forwarded += 1;
                continue;
            }
            for event in self.released() {
                if tx.send(Ok(Frame::data(event))).await.is_err() {
                    return;
                }
                forwarded += 1;
            }
            let next = match self.skip.iter().any(|s| s.held.is_some()) {
                // A body frame not yet come is not lost by giving up the wait for it.
                true => match tokio::time::timeout(RELEASE_CHECK, body.frame()).await {
                    Ok(next) => next,
                    Err(_) => continue,
                },
                false => body.frame().await,
            };
            match next {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(error)) => {
                    let _ = tx.send(Err(error.into())).await;
                    return;
                }
                None => return,
            }
        }
    }
}

/// The next whole watch event in `buffer`: a JSON line, or a protobuf frame (a 4-byte
/// big-endian length, then that many bytes).
fn next_event(buffer: &mut BytesMut, protobuf: bool) -> Option<Bytes> {
    let end = if protobuf {
        let length: [u8; 4] = buffer.get(..4)?.try_into().ok()?;
        let end = 4 + u32::from_be_bytes(length) as usize;
        (buffer.len() >= end).then_some(end)?
    } else {
        buffer.iter().position(|b| *b == b'\n')? + 1
    };
    Some(buffer.split_to(end).freeze())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1")
}

/// `uri` asking for exactly `resource_version`, unless it continues a paged list (the
/// API server refuses an exact version with a continue token).
fn at_resource_version(uri: &Uri, resource_version: &str) -> Uri {
    let query = uri.query().unwrap_or_default();
    if query.split('&').any(|pair| pair.starts_with("continue=")) {
        return uri.clone();
    }
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|pair| {
            !pair.is_empty()
                && !pair.starts_with("resourceVersion=")
                && !pair.starts_with("resourceVersionMatch=")
        })
        .map(str::to_owned)
        .collect();
    pairs.push(format!("resourceVersion={resource_version}"));
    pairs.push("resourceVersionMatch=Exact".to_owned());
    format!("{}?{}", uri.path(), pairs.join("&"))
        .parse()
        .unwrap_or_else(|_| uri.clone())
}

fn too_many_requests(retry_after_seconds: u32) -> Response<Body> {
    status(
        StatusCode::TOO_MANY_REQUESTS,
        "the fault proxy throttled this request",
        Some(retry_after_seconds),
    )
}

/// A Kubernetes Status answer, as the API server would give it.
fn status(code: StatusCode, message: &str, retry_after: Option<u32>) -> Response<Body> {
    let reason = match code {
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        StatusCode::UNPROCESSABLE_ENTITY => "Invalid",
        StatusCode::FORBIDDEN => "Forbidden",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"retryAfterSeconds": retry_after.unwrap_or(0)},
        "code": code.as_u16(),
    });
    let mut response = Response::builder()
        .status(code)
        .header(CONTENT_TYPE, "application/json");
    if let Some(seconds) = retry_after {
        response = response.header(RETRY_AFTER, seconds.to_string());
    }
    response
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("a status, two known headers and a body make a response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_tell_a_delete_collection_a_list_and_a_watch_apart() {
        let collection: Uri = "/api/v1/namespaces/ns/pods?labelSelector=a%3Db"
            .parse()
            .unwrap();
        let watch: Uri = "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=5"
            .parse()
            .unwrap();
        let one: Uri = "/api/v1/namespaces/ns/pods/p1".parse().unwrap();
        let bulk = Matcher::new(Method::DELETE, "/namespaces/ns/pods");
        assert!(bulk.matches(&Method::DELETE, &collection));
        assert!(!bulk.matches(&Method::DELETE, &one));
        assert!(!bulk.matches(&Method::GET, &collection));
        let list = Matcher::new(Method::GET, "/namespaces/ns/pods").watch(false);
        assert!(list.matches(&Method::GET, &collection));
        assert!(!list.matches(&Method::GET, &watch));
        assert!(
            Matcher::any_method("/pods")
                .watch(true)
                .matches(&Method::GET, &watch)
        );
    }

    #[test]
    fn a_stale_list_asks_for_exactly_the_old_version_unless_it_continues() {
        let uri: Uri = "/api/v1/pods?limit=500&resourceVersion=0&resourceVersionMatch=NotOlderThan"
            .parse()
            .unwrap();
        assert_eq!(
            at_resource_version(&uri, "42").to_string(),
            "/api/v1/pods?limit=500&resourceVersion=42&resourceVersionMatch=Exact"
        );
        let page: Uri = "/api/v1/pods?limit=500&continue=abc".parse().unwrap();
        assert_eq!(at_resource_version(&page, "42"), page);
    }

    #[test]
    fn watch_events_are_split_by_line_or_by_length_prefix() {
        let mut json = BytesMut::from(&b"{\"a\":1}\n{\"b\""[..]);
        assert_eq!(next_event(&mut json, false).unwrap(), &b"{\"a\":1}\n"[..]);
        assert!(next_event(&mut json, false).is_none());
        let mut proto = BytesMut::from(&[0u8, 0, 0, 2, 7, 8, 0, 0][..]);
        assert_eq!(
            next_event(&mut proto, true).unwrap(),
            &[0u8, 0, 0, 2, 7, 8][..]
        );
        assert!(next_event(&mut proto, true).is_none());
        assert_eq!(proto.len(), 2);
    }
}
