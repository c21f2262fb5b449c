//! What anyone who can reach the listener can cost, bounded. An Ingress
//! often sends the UI's Retry button here from the internet, and the
//! listener shares its process with the retry engine: a caller must not be
//! able to hold its memory, its connections or its calls.
//!
//! - Connections: at most [`Limits::max_connections`], and
//!   [`Limits::max_connections_per_source`] from one address; one past either
//!   is closed at once. hyper closes a connection whose request head has not
//!   arrived within [`Limits::header_timeout`], an idle keep-alive one
//!   included, and refuses a head larger than [`MAX_HEAD`] (431).
//! - Calls: at most [`Limits::max_calls`] in flight, and
//!   [`Limits::max_calls_per_source`] from one address; one past either is
//!   answered 503 with `Retry-After`.
//! - Bodies: read only once the caller is authenticated (see `retry`), at
//!   most [`Limits::max_body`] (a declared larger length is answered 413
//!   before a byte is read), within [`Limits::body_timeout`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::debug;

use crate::argoapi::tls::ServerConfig;
use crate::argoapi::wire::{Code, Status};

/// The largest request head (request line and headers) read: a UI's
/// cookies and an SSO token are a few KiB; hyper answers 431 past it.
pub const MAX_HEAD: usize = 64 * 1024;

/// How long calls in progress may still take once the listener stops: a
/// rolling update must not wait for a long retry (it goes on without its
/// caller, who can ask again or look with `rewind status`).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The listener's bounds; each is a flag and a chart value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_body: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    pub max_calls: usize,
    pub max_calls_per_source: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // A retry call carries at most 100 parameters of 4 KiB and a
            // 1 KiB selector (what a request may hold): about 410 KiB.
            max_body: 512 * 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_connections_per_source: 128,
            // A call is held for its whole retry (seconds to minutes), so a
            // busy UI has many in flight; each holds a few KiB once its body
            // is parsed.
            max_calls: 256,
            max_calls_per_source: 32,
        }
    }
}

/// Where a connection comes from, for per-source shares: an IPv4 address,
/// or an IPv6 /64 (one host is handed a whole /64, so its addresses are one
/// source).
fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// Counts what sources hold (connections, or calls) under a total and a
/// per-source cap, refusing at once past either. Written here: tower's
/// ConcurrencyLimit is one global count that makes a call wait, and
/// tower-governor limits a rate per key, not what a key holds at once.
#[derive(Debug)]
pub struct Shares {
    total: usize,
    per_source: usize,
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One share held; given back when dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    source: IpAddr,
}

impl Shares {
    pub fn new(total: usize, per_source: usize) -> Arc<Self> {
        Arc::new(Shares {
            total,
            per_source,
            held: Mutex::new((0, HashMap::new())),
        })
    }

    /// A share for `ip`'s source, unless it or everyone holds the most allowed.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<Share> {
        let source = source_of(ip);
        let mut held = self.held.lock().expect("the shares lock is never poisoned");
        let (all, by_source) = &mut *held;
        let mine = by_source.entry(source).or_default();
        if *all >= self.total || *mine >= self.per_source {
            if *mine == 0 {
                by_source.remove(&source);
            }
            return None;
        }
        *mine += 1;
        *all += 1;
        Some(Share {
            shares: self.clone(),
            source,
        })
    }

    /// How many shares are held (for tests and logs).
    pub fn held(&self) -> usize {
        self.held
            .lock()
            .expect("the shares lock is never poisoned")
            .0
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self
            .shares
            .held
            .lock()
            .expect("the shares lock is never poisoned");
        let (all, by_source) = &mut *held;
        *all -= 1;
        if let Some(mine) = by_source.get_mut(&self.source) {
            *mine -= 1;
            if *mine == 0 {
                by_source.remove(&self.source);
            }
        }
    }
}

/// Admits a call within its source's and everyone's share of calls in
/// flight (`router` layers it over every route).
pub async fn admit(State(calls): State<Arc<Shares>>, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip());
    // Every connection `serve` accepts carries its peer; a router served
    // another way has no source to count by, so it counts as one.
    let ip = peer.unwrap_or(IpAddr::from([0, 0, 0, 0]));
    match calls.try_take(ip) {
        Some(_share) => next.run(request).await,
        None => {
            debug!(source = %source_of(ip), "call refused: too many calls in flight");
            Status::new(
                Code::Unavailable,
                format!(
                    "rewind's Argo API has too many calls in flight (at most {} from one address, {} in all); try again in a second",
                    calls.per_source, calls.total
                ),
            )
            .into_response()
        }
    }
}

/// Reads a call's body within `limits`: a declared length past the limit is
/// refused before anything is read, a body that grows past it is refused as
/// soon as it does, one that trickles past the timeout is cut off.
pub async fn read_body(
    limits: &Limits,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, Response> {
    let too_large = || {
        Status::new(
            Code::ResourceExhausted,
            format!(
                "the request body is larger than {} bytes, more than any retry request holds (--argo-api-max-body)",
                limits.max_body
            ),
        )
        .with_http(StatusCode::PAYLOAD_TOO_LARGE)
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(
        limits.body_timeout,
        axum::body::to_bytes(body, limits.max_body),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if is_length_limit(&e) => Err(too_large()),
        Ok(Err(e)) => Err(Status::new(
            Code::InvalidArgument,
            format!("reading the request body failed: {e}"),
        )
        .into_response()),
        Err(_) => Err(Status::new(
            Code::DeadlineExceeded,
            format!(
                "the request body did not arrive within {:?} (--argo-api-body-timeout)",
                limits.body_timeout
            ),
        )
        .with_http(StatusCode::REQUEST_TIMEOUT)),
    }
}

/// Whether reading a body failed on its length limit (`to_bytes` wraps
/// http-body-util's error in axum's).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Serves `app` on `listener` within `limits` until `shutdown`, over TLS
/// when `tls` is given; calls still in progress [`STOP_GRACE`] later are cut
/// off.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let connections = Shares::new(limits.max_connections, limits.max_connections_per_source);
    let acceptor = tls.map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause, as axum's own loop does.
                    debug!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Some(share) = connections.try_take(peer.ip()) else {
            debug!(%peer, "connection closed: too many connections");
            continue;
        };
        let app = app.clone().map_request(move |mut request: Request<_>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            request
        });
        let service = TowerToHyperService::new(app);
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(MAX_HEAD)
            .max_header_size(MAX_HEAD);
        let (acceptor, watcher) = (acceptor.clone(), graceful.watcher());
        tokio::spawn(async move {
            let _share = share;
            let _ = tcp.set_nodelay(true);
            let served = match acceptor {
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            watcher
                                .watch(http.serve_connection(TokioIo::new(tls), service))
                                .await
                        }
                        Ok(Err(e)) => return debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => return debug!(%peer, "TLS handshake timed out"),
                    }
                }
                None => {
                    watcher
                        .watch(http.serve_connection(TokioIo::new(tcp), service))
                        .await
                }
            };
            if let Err(e) = served {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(STOP_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        debug!("calls still in progress were cut off at shutdown");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn shares_cap_each_source_and_everyone_and_come_back_when_dropped() {
        let shares = Shares::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = shares.try_take(a).unwrap();
        let _a2 = shares.try_take(a).unwrap();
        assert!(shares.try_take(a).is_none(), "a third share for one source");
        let b1 = shares.try_take(b).unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        assert!(shares.try_take(c).is_none(), "past the total");
        assert_eq!(shares.held(), 3);
        drop(a1);
        drop(b1);
        assert_eq!(shares.held(), 1);
        assert!(shares.try_take(c).is_some());
        // A refused source keeps no entry behind.
        assert_eq!(shares.held.lock().unwrap().1.len(), 1);
    }

    #[test]
    fn an_ipv6_host_is_one_source_and_a_mapped_ipv4_its_address() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(source_of(one), source_of(other));
        assert_ne!(
            source_of(one),
            source_of("2001:db8:1:3::1".parse().unwrap())
        );
        assert_eq!(
            source_of("::ffff:10.1.2.3".parse().unwrap()),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }

    #[tokio::test]
    async fn a_body_is_refused_past_its_declared_or_read_length_and_its_time() {
        let limits = Limits {
            max_body: 8,
            body_timeout: Duration::from_millis(50),
            ..Limits::default()
        };
        let mut declared = HeaderMap::new();
        declared.insert(CONTENT_LENGTH, HeaderValue::from_static("67108864"));
        // Not read at all: a body that would fail if polled.
        let unread = Body::from_stream(futures::stream::once(async {
            Err::<Bytes, _>(std::io::Error::other("the body was read"))
        }));
        let refused = read_body(&limits, &declared, unread).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let grown = read_body(&limits, &HeaderMap::new(), Body::from("0123456789"))
            .await
            .unwrap_err();
        assert_eq!(grown.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let slow = Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        let cut = read_body(&limits, &HeaderMap::new(), slow)
            .await
            .unwrap_err();
        assert_eq!(cut.status(), StatusCode::REQUEST_TIMEOUT);
        let fine = read_body(&limits, &HeaderMap::new(), Body::from("{}"))
            .await
            .unwrap();
        assert_eq!(&fine[..], b"{}");
    }
}
