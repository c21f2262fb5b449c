//! Leader election with two `rewind` processes on one Lease: only the leader works, the standby
//! is ready and says so in /metrics, takes over after a SIGKILL within the lease duration plus a
//! few seconds (finishing the retry with exactly one reset), and at once after a graceful stop.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::config::Kubeconfig;
use rewind::argo::workflow::Workflow;
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::support::controller as ctl;

const LEASE: &str = "rewind";

pub async fn a_killed_leader_is_replaced_and_the_retry_resets_exactly_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let target = ctl::KillTarget::create(&cluster, &namespace).await?;
    let logs = tempfile::tempdir()?;
    let duration = Duration::from_secs(6);

    let mut a = Replica::spawn(&cluster, &namespace, "rewind-a", duration, logs.path())?;
    wait_holder(
        &cluster,
        &namespace,
        Some("rewind-a"),
        Duration::from_secs(20),
        &mut [&mut a],
    )
    .await?;
    let mut b = Replica::spawn(&cluster, &namespace, "rewind-b", duration, logs.path())?;
    b.wait_http("/readyz", "200", "standby").await?;
    b.wait_http("/metrics", "200", "rewind_leader 0").await?;
    a.wait_http("/metrics", "200", "rewind_leader 1").await?;

    let from =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(1);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &target.name, token).await?;
    // Kill the leader while it is deleting (10 deletes a second: 120 pods take 12 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let left_at_kill = loop {
        let left = target.planned_left(&cluster, &namespace).await?;
        if left <= target.planned.len() - 20 {
            break left;
        }
        ensure!(
            Instant::now() < deadline,
            "the leader deleted fewer than 20 pods in 20 s:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        b.log().lines().all(|l| !l.contains("acquired the lease")),
        "the standby acquired the lease while the leader was alive:\n{}",
        b.log()
    );
    a.child.start_kill()?;
    let killed = Instant::now();
    a.child.wait().await?;
    ensure!(
        left_at_kill > 0,
        "the leader finished before it was killed: the test proves nothing"
    );

    wait_holder(
        &cluster,
        &namespace,
        Some("rewind-b"),
        duration + Duration::from_secs(5),
        &mut [&mut b],
    )
    .await?;
    let takeover = killed.elapsed();
    tracing::info!(?takeover, left_at_kill, "the standby took over");
    ensure!(
        takeover <= duration + Duration::from_secs(3),
        "the standby took over {takeover:?} after the kill; the lease lasts {duration:?}"
    );
    b.wait_http("/metrics", "200", "rewind_leader 1").await?;

    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let (after, status) =
        ctl::wait_finished(&workflows, &target.name, token, Duration::from_secs(60))
            .await
            .with_context(|| format!("the new leader's log:\n{}", b.log()))?;
    let to = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(1);
    b.stop().await?;
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "the retry ended {status:?}"
    );
    ensure!(
        after.annotation(annotations::OBSERVED) == Some(token),
        "the token was not observed"
    );
    ctl::ensure_reset_as_planned(&after, &target.plan.workflow, from, to)?;
    target
        .ensure_only_outsiders_left(&cluster, &namespace)
        .await?;
    let updates: Vec<u16> = ctl::audit_log(&cluster, &namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == "update"
                && a.resource == "workflows"
                && a.name == target.name
        })
        .map(|a| a.code)
        .collect();
    ensure!(
        updates.iter().filter(|&&code| code == 200).count() == 1,
        "expected exactly one successful reset of {}, the audit log has codes {updates:?}",
        target.name
    );
    Ok(())
}

pub async fn a_graceful_stop_releases_the_lease_at_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let logs = tempfile::tempdir()?;
    // Long enough that a takeover by expiry would fail the test.
    let duration = Duration::from_secs(30);
    let mut a = Replica::spawn(&cluster, &namespace, "rewind-a", duration, logs.path())?;
    wait_holder(
        &cluster,
        &namespace,
        Some("rewind-a"),
        Duration::from_secs(20),
        &mut [&mut a],
    )
    .await?;
    let mut b = Replica::spawn(&cluster, &namespace, "rewind-b", duration, logs.path())?;
    b.wait_http("/readyz", "200", "standby").await?;

    let stopping = Instant::now();
    a.stop().await?;
    let stopped = stopping.elapsed();
    let after_stop = holder(&cluster, &namespace).await?;
    ensure!(
        after_stop.as_deref() != Some("rewind-a"),
        "rewind-a still holds the lease after a graceful stop"
    );
    wait_holder(
        &cluster,
        &namespace,
        Some("rewind-b"),
        Duration::from_secs(5),
        &mut [&mut b],
    )
    .await?;
    let takeover = stopping.elapsed();
    tracing::info!(?stopped, ?takeover, "graceful handover");
    b.stop().await?;
    ensure!(
        holder(&cluster, &namespace).await?.is_none(),
        "the last replica's graceful stop left the lease held"
    );
    Ok(())
}

/// The API server becomes unreachable for the leader (its only road to it, a loopback proxy,
/// is cut): it must stop working, and exit, before its lease expires.
pub async fn a_leader_that_cannot_renew_stops_before_its_lease_expires(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let logs = tempfile::tempdir()?;
    let duration = Duration::from_secs(6);
    let proxy = Proxy::start(cluster.server_url()).await?;
    let mut config = Kubeconfig::read_from(cluster.kubeconfig_path(Role::Controller))?;
    for c in &mut config.clusters {
        if let Some(cluster) = c.cluster.as_mut() {
            cluster.server = Some(format!("https://{}", proxy.addr));
        }
    }
    let kubeconfig = logs.path().join("through-proxy.kubeconfig");
    std::fs::write(&kubeconfig, serde_yaml_ng::to_string(&config)?)?;
    let mut a = Replica::spawn_with(&kubeconfig, &namespace, "rewind-a", duration, logs.path())?;
    wait_holder(
        &cluster,
        &namespace,
        Some("rewind-a"),
        Duration::from_secs(20),
        &mut [&mut a],
    )
    .await?;
    // Let it renew at least once through the proxy first.
    tokio::time::sleep(duration).await;
    ensure!(
        a.child.try_wait()?.is_none(),
        "the leader exited with the API reachable:\n{}",
        a.log()
    );

    proxy.cut();
    let exit = tokio::time::timeout(duration * 2, a.child.wait())
        .await
        .with_context(|| {
            format!(
                "the leader kept running with the API unreachable:\n{}",
                a.log()
            )
        })??;
    let exited_at = Timestamp::now();
    ensure!(
        !exit.success(),
        "the leader exited 0 on losing the API: {exit}"
    );
    let lease = Api::<Lease>::namespaced(cluster.admin_client(), &namespace)
        .get(LEASE)
        .await?
        .spec
        .context("the lease has no spec")?;
    ensure!(
        lease.holder_identity.as_deref() == Some("rewind-a"),
        "holder {:?}",
        lease.holder_identity
    );
    let renewed = lease.renew_time.context("the lease has no renewTime")?.0;
    let expires = renewed + SignedDuration::try_from(duration)?;
    let margin = expires.duration_since(exited_at);
    tracing::info!(%renewed, %exited_at, ?margin, "the leader stopped before its lease expired");
    ensure!(
        exited_at < expires,
        "the leader exited at {exited_at}, after its lease expired at {expires}:\n{}",
        a.log()
    );
    ensure!(
        a.log().contains("lease"),
        "the leader's log does not say it lost the lease:\n{}",
        a.log()
    );
    Ok(())
}

/// Forwards loopback TCP connections to the API server until cut; then refuses them.
struct Proxy {
    addr: std::net::SocketAddr,
    cut: tokio_util::sync::CancellationToken,
}

impl Proxy {
    async fn start(server_url: &str) -> anyhow::Result<Proxy> {
        let upstream = server_url
            .strip_prefix("https://")
            .context("the API server URL is not https")?
            .trim_end_matches('/')
            .to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = tokio_util::sync::CancellationToken::new();
        let stop = cut.clone();
        tokio::spawn(async move {
            loop {
                let (mut down, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => return,
                    },
                };
                let (upstream, stop) = (upstream.clone(), stop.clone());
                tokio::spawn(async move {
                    let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                    }
                });
            }
        });
        Ok(Proxy { addr, cut })
    }

    /// Drops every connection and closes the listener.
    fn cut(&self) {
        self.cut.cancel();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

struct Replica {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Replica {
    fn spawn(
        cluster: &LocalCluster,
        namespace: &str,
        name: &'static str,
        duration: Duration,
        dir: &Path,
    ) -> anyhow::Result<Replica> {
        let kubeconfig = cluster.kubeconfig_path(Role::Controller);
        Self::spawn_with(&kubeconfig, namespace, name, duration, dir)
    }

    fn spawn_with(
        kubeconfig: &Path,
        namespace: &str,
        name: &'static str,
        duration: Duration,
        dir: &Path,
    ) -> anyhow::Result<Replica> {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_rewind"))
            .args([
                "--log-format",
                "json",
                "controller",
                "--namespace",
                namespace,
            ])
            .args(["--http-addr", "127.0.0.1:0", "--leader-elect"])
            .args(["--lease-namespace", namespace, "--lease-name", LEASE])
            .args(["--lease-duration", &format!("{}s", duration.as_secs())])
            // Slow enough that a kill falls inside the retry: 10 single deletes a second.
            .args(["--qps", "10", "--burst", "10", "--no-bulk"])
            .env("POD_NAME", name)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting the rewind binary")?;
        Ok(Replica { name, child, log })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }

    /// SIGTERM, as Kubernetes stops a pod; the process must exit 0 within 10 s.
    async fn stop(&mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("the replica already exited")?;
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        let sent = unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        ensure!(sent == 0, "kill -TERM {pid} failed");
        let exit = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .with_context(|| format!("{} did not stop within 10 s of SIGTERM", self.name))??;
        ensure!(
            exit.success(),
            "{} exited {exit} on SIGTERM:\n{}",
            self.name,
            self.log()
        );
        Ok(())
    }

    /// Polls `path` on the replica's HTTP port until it answers `code` with `needle` in the body.
    async fn wait_http(&mut self, path: &str, code: &str, needle: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(exit) = self.child.try_wait()? {
                bail!("{} exited ({exit}):\n{}", self.name, self.log());
            }
            if let Some(addr) = self.addr() {
                last = get(addr, path).await.unwrap_or_else(|e| e.to_string());
                let status = format!("HTTP/1.1 {code}");
                if last.starts_with(&status) && last.contains(needle) {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "GET {path} on {} never answered {code} with {needle:?}; last answer:\n{last}\nlog:\n{}",
            self.name,
            self.log()
        )
    }

    /// The address the replica bound (it was given port 0), from its log.
    fn addr(&self) -> Option<std::net::SocketAddr> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|l| l["fields"]["addr"].as_str().and_then(|a| a.parse().ok()))
    }
}

async fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: rewind\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

async fn holder(cluster: &LocalCluster, namespace: &str) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(cluster.admin_client(), namespace);
    Ok(leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// Waits until the Lease names `expected`, failing early if a replica exits.
async fn wait_holder(
    cluster: &LocalCluster,
    namespace: &str,
    expected: Option<&str>,
    within: Duration,
    replicas: &mut [&mut Replica],
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let found = holder(cluster, namespace).await?;
        if found.as_deref() == expected {
            return Ok(());
        }
        for r in replicas.iter_mut() {
            if let Some(exit) = r.child.try_wait()? {
                bail!("{} exited ({exit}):\n{}", r.name, r.log());
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the lease holder is {found:?}, not {expected:?}, after {within:?}; logs:\n{}",
            replicas
                .iter()
                .map(|r| format!("--- {}\n{}", r.name, r.log()))
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
