//! Argo's retry API listener against hostile clients, on the real binary: what anyone who
//! can reach the port tries (big bodies, trickled headers, many connections, junk tokens,
//! odd paths) leaves the process under [`PEAK`] and a real caller answered within
//! [`ANSWERED_WITHIN`] meanwhile. The attackers come from other loopback addresses than the
//! real caller (127.0.0.2 and up), as they would from other hosts.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use rewind::testenv::localcluster::LocalCluster;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use crate::support::argo_api::{free_addr, put};
use crate::support::grants::{account, delete_pods, workflow_verbs};
use crate::support::process::{peak_rss_kib, spawn_controller, wait_ready};

/// The process's peak resident memory may not pass this (KiB): the chart's limit is 320 Mi,
/// and the engine needs the rest.
const PEAK: u64 = 128 * 1024;
/// A real caller's call is answered within this while the listener is attacked.
const ANSWERED_WITHIN: Duration = Duration::from_secs(2);
/// The header and body timeouts the controller runs with here (10 s by default).
const TIMEOUT: Duration = Duration::from_secs(3);

/// A connection from `from` to `to`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// The status of an answer's first line.
fn status_of(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|&b| b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Sends `head` and then `body` (as fast as the server takes it) from `from`; the answer's
/// status, or `None` when the server closed the connection without one. Reading goes on
/// when the server stops taking the body.
async fn call(
    from: IpAddr,
    to: SocketAddr,
    head: &str,
    body: &[u8],
) -> anyhow::Result<Option<u16>> {
    let stream = connect_from(from, to).await?;
    let (mut reader, mut writer) = stream.into_split();
    let writing = async {
        let _ = async {
            writer.write_all(head.as_bytes()).await?;
            writer.write_all(body).await
        }
        .await;
        std::future::pending::<()>().await
    };
    let reading = async {
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
            if answer.windows(2).any(|w| w == b"\r\n") {
                break;
            }
        }
        status_of(&answer)
    };
    let answered = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            status = reading => status,
            _ = writing => unreachable!("writing never ends by itself"),
        }
    })
    .await
    .context("the listener neither answered nor closed a connection within 30 s")?;
    Ok(answered)
}

/// A retry call's head for `path`.
fn head(path: &str, extra: &str) -> String {
    format!("PUT {path} HTTP/1.1\r\nHost: rewind\r\nContent-Type: application/json\r\n{extra}\r\n")
}

/// `body` in chunks of 64 KiB, as `Transfer-Encoding: chunked` sends it.
fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + body.len() / 1000 + 16);
    for part in body.chunks(64 * 1024) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// The real caller: a call on a workflow that is not there, answered 404 once its token
/// and its three permissions were reviewed and the workflow looked for.
struct Caller {
    url: String,
    bearer: String,
}

impl Caller {
    async fn answered(&self, during: &str) -> anyhow::Result<Duration> {
        let asked = Instant::now();
        let (status, body) = put(&self.url, Some(&self.bearer), &json!({}), None).await?;
        let took = asked.elapsed();
        ensure!(
            status == 404,
            "the real caller's call answered {status} {body} during {during}"
        );
        ensure!(
            took <= ANSWERED_WITHIN,
            "the real caller waited {took:?} during {during} (at most {ANSWERED_WITHIN:?})"
        );
        Ok(took)
    }
}

/// Runs `attack` while the real caller calls three times; the slowest answer.
async fn meanwhile<F>(
    caller: &Caller,
    during: &str,
    attack: F,
) -> anyhow::Result<(F::Output, Duration)>
where
    F: Future,
{
    let attacking = attack;
    tokio::pin!(attacking);
    // Let the attack start before the caller calls.
    let output = tokio::select! {
        output = &mut attacking => Some(output),
        _ = tokio::time::sleep(Duration::from_millis(300)) => None,
    };
    let mut slowest = Duration::ZERO;
    let calling = async {
        for _ in 0..3 {
            slowest = slowest.max(caller.answered(during).await?);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::Ok(())
    };
    let output = match output {
        Some(output) => {
            calling.await?;
            output
        }
        None => {
            let (output, called) = tokio::join!(attacking, calling);
            called?;
            output
        }
    };
    Ok((output, slowest))
}

pub async fn argos_retry_api_stays_small_and_answers_a_real_caller_under_attack(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let token = account(
        &admin,
        &namespace,
        "alice",
        &[workflow_verbs(&["get", "update"]), delete_pods()],
    )
    .await?;
    let addr = free_addr()?;
    let log = cluster.dir().join(format!("{namespace}-controller.log"));
    let timeout = format!("{}s", TIMEOUT.as_secs());
    let mut child = spawn_controller(
        &cluster,
        &[&namespace],
        &log,
        &[
            "--argo-configmap",
            "",
            "--argo-api-addr",
            &addr.to_string(),
            "--argo-api-plaintext=true",
            "--argo-api-header-timeout",
            &timeout,
            "--argo-api-body-timeout",
            &timeout,
        ],
    )?;
    let pid = child.id().context("the controller's pid")?;
    wait_ready(&log).await?;
    let caller = Caller {
        url: format!("http://{addr}/api/v1/workflows/{namespace}/nope/retry"),
        bearer: format!("Bearer {token}"),
    };
    let idle = caller.answered("a quiet moment").await?;
    let idle_peak = peak_rss_kib(pid)?;
    let path = format!("/api/v1/workflows/{namespace}/wf/retry");
    let mut figures = vec![format!("idle: answered in {idle:?}, peak {idle_peak} KiB")];

    // 1. 150 unauthenticated calls with 2 MB bodies at once: half declare their length,
    // half send it chunked behind a junk token. Each is refused (401, or 503 past a share)
    // before its body is read.
    let big = vec![b'x'; 2_000_000];
    let chunked_big = chunked(&big);
    let from: IpAddr = "127.0.0.2".parse()?;
    let (answers, slowest) = meanwhile(&caller, "150 calls with 2 MB bodies", async {
        let calls = (0..150).map(|i| {
            let (path, big, chunked_big) = (&path, &big, &chunked_big);
            async move {
                if i % 2 == 0 {
                    let head = head(path, &format!("Content-Length: {}\r\n", big.len()));
                    call(from, addr, &head, big).await
                } else {
                    let extra =
                        format!("Authorization: Bearer junk-{i}\r\nTransfer-Encoding: chunked\r\n");
                    call(from, addr, &head(path, &extra), chunked_big).await
                }
            }
        });
        futures::future::join_all(calls).await
    })
    .await?;
    let answers: Vec<Option<u16>> = answers.into_iter().collect::<anyhow::Result<_>>()?;
    ensure!(
        answers
            .iter()
            .all(|a| matches!(a, Some(401 | 413 | 503) | None)),
        "every big call is refused: {answers:?}"
    );
    let peak = peak_rss_kib(pid)?;
    figures.push(format!(
        "150 x 2 MB: caller's slowest {slowest:?}, peak {peak} KiB"
    ));
    ensure!(
        peak < PEAK,
        "peak RSS {peak} KiB after the big bodies ({figures:?})"
    );

    // 2. 300 connections trickling their headers, a line every half second.
    let from: IpAddr = "127.0.0.3".parse()?;
    let (closed, slowest) = meanwhile(&caller, "300 trickled-header connections", async {
        let trickles = (0..300).map(|_| async move {
            let started = Instant::now();
            let mut stream = connect_from(from, addr).await?;
            let mut chunk = [0u8; 256];
            let _ = stream
                .write_all(format!("PUT {} HTTP/1.1\r\n", "/api/v1/workflows/a/b/retry").as_bytes())
                .await;
            loop {
                tokio::select! {
                    read = stream.read(&mut chunk) => match read {
                        Ok(0) | Err(_) => return anyhow::Ok(started.elapsed()),
                        Ok(_) => {}
                    },
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {
                        if stream.write_all(b"X-Slow: 1\r\n").await.is_err() {
                            return anyhow::Ok(started.elapsed());
                        }
                    }
                }
                ensure!(
                    started.elapsed() < TIMEOUT * 4,
                    "a trickling connection was still open after {:?}",
                    started.elapsed()
                );
            }
        });
        futures::future::join_all(trickles).await
    })
    .await?;
    let closed: Vec<Duration> = closed.into_iter().collect::<anyhow::Result<_>>()?;
    let longest = closed.iter().max().copied().unwrap_or_default();
    ensure!(
        longest < TIMEOUT + Duration::from_secs(2),
        "a trickling connection stayed open {longest:?} (header timeout {TIMEOUT:?})"
    );
    let peak = peak_rss_kib(pid)?;
    figures.push(format!(
        "300 trickled: longest open {longest:?}, caller's slowest {slowest:?}, peak {peak} KiB"
    ));
    ensure!(
        peak < PEAK,
        "peak RSS {peak} KiB after the trickles ({figures:?})"
    );

    // 3. 400 calls with junk tokens in flight at once, each a token of its own.
    let from: IpAddr = "127.0.0.4".parse()?;
    let (answers, slowest) = meanwhile(&caller, "400 junk-token calls", async {
        let calls = (0..400).map(|i| {
            let path = &path;
            async move {
                let extra =
                    format!("Authorization: Bearer junk-token-{i}\r\nContent-Length: 2\r\n");
                call(from, addr, &head(path, &extra), b"{}").await
            }
        });
        futures::future::join_all(calls).await
    })
    .await?;
    let answers: Vec<Option<u16>> = answers.into_iter().collect::<anyhow::Result<_>>()?;
    let refused = answers.iter().filter(|a| **a == Some(401)).count();
    let busy = answers.iter().filter(|a| **a == Some(503)).count();
    // Past the source's connection share a connection is closed with no answer.
    let closed = answers.iter().filter(|a| a.is_none()).count();
    ensure!(
        refused + busy + closed == answers.len() && refused > 0,
        "every junk call is answered 401 or 503, or closed: {answers:?}"
    );
    let peak = peak_rss_kib(pid)?;
    figures.push(format!(
        "400 junk tokens: {refused} x 401, {busy} x 503, {closed} closed, caller's slowest {slowest:?}, peak {peak} KiB"
    ));
    ensure!(
        peak < PEAK,
        "peak RSS {peak} KiB after the junk tokens ({figures:?})"
    );

    // 4. A 64 MiB body from an authenticated caller is refused before a byte of it is sent.
    let from: IpAddr = "127.0.0.5".parse()?;
    let extra = format!(
        "Authorization: Bearer {token}\r\nContent-Length: {}\r\n",
        64 << 20
    );
    ensure!(
        call(from, addr, &head(&path, &extra), b"").await? == Some(413),
        "a declared 64 MiB body should be refused with 413 before it is read"
    );

    // 5. Odd paths and methods.
    let odd = [
        (format!("GET {path} HTTP/1.1\r\nHost: r\r\n\r\n"), Some(405)),
        (
            head(
                &format!("/api/v1/workflows/{namespace}/a%00b/retry"),
                &format!("Authorization: Bearer {token}\r\nContent-Length: 0\r\n"),
            ),
            Some(400),
        ),
        (
            head(
                "/api/v1/archived-workflows/..%2f..%2fetc/retry",
                "Content-Length: 0\r\n",
            ),
            Some(400),
        ),
        (head("/api/v1/info", "Content-Length: 0\r\n"), Some(404)),
        (head(&format!("/{}", "a".repeat(70 * 1024)), ""), Some(431)),
        (
            head("/x", &format!("X-Big: {}\r\n", "a".repeat(70 * 1024))),
            Some(431),
        ),
    ];
    for (request, expected) in odd {
        let got = call(from, addr, &request, b"").await?;
        ensure!(
            got == expected,
            "{:?} answered {got:?}, expected {expected:?}",
            &request[..request.len().min(80)]
        );
    }

    let peak = peak_rss_kib(pid)?;
    tracing::info!(?figures, peak_kib = peak, "the listener under attack");
    ensure!(peak < PEAK, "peak RSS {peak} KiB ({figures:?})");
    ensure!(
        child.try_wait()?.is_none(),
        "the controller exited:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    caller.answered("the end").await?;
    child.kill().await?;
    Ok(())
}
