//! Leader election with two `rewind` processes on one Lease: only the leader works, the standby
//! is ready and says so in /metrics, takes over after a SIGKILL within the lease duration plus a
//! few seconds (finishing the retry with exactly one reset), and at once after a graceful stop.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::config::Kubeconfig;
use rewind::argo::workflow::Workflow;
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role};
use tokio::time::Instant;

use crate::support::controller as ctl;
use crate::support::process;
use crate::support::replica::{self, Replica};

const LEASE: &str = "rewind";
/// How long a replica has to answer over HTTP as a step expects.
const HTTP_WAIT: Duration = Duration::from_secs(20);

pub async fn a_killed_leader_is_replaced_and_the_retry_resets_exactly_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let target = ctl::KillTarget::create(&cluster, &namespace).await?;
    let logs = tempfile::tempdir()?;
    let duration = Duration::from_secs(6);

    let mut a = spawn(&cluster, &namespace, "rewind-a", duration, logs.path())?;
    wait_holder(&cluster, &namespace, Duration::from_secs(20), &mut a).await?;
    let mut b = spawn(&cluster, &namespace, "rewind-b", duration, logs.path())?;
    b.wait_http("/readyz", "200", "standby", HTTP_WAIT).await?;
    b.wait_http("/metrics", "200", "rewind_leader 0", HTTP_WAIT)
        .await?;
    a.wait_http("/metrics", "200", "rewind_leader 1", HTTP_WAIT)
        .await?;

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
        duration + Duration::from_secs(5),
        &mut b,
    )
    .await?;
    let takeover = killed.elapsed();
    tracing::info!(?takeover, left_at_kill, "the standby took over");
    ensure!(
        takeover <= duration + Duration::from_secs(3),
        "the standby took over {takeover:?} after the kill; the lease lasts {duration:?}"
    );
    b.wait_http("/metrics", "200", "rewind_leader 1", HTTP_WAIT)
        .await?;

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
    let mut a = spawn(&cluster, &namespace, "rewind-a", duration, logs.path())?;
    wait_holder(&cluster, &namespace, Duration::from_secs(20), &mut a).await?;
    let mut b = spawn(&cluster, &namespace, "rewind-b", duration, logs.path())?;
    b.wait_http("/readyz", "200", "standby", HTTP_WAIT).await?;

    let stopping = Instant::now();
    a.stop().await?;
    let stopped = stopping.elapsed();
    let after_stop = holder(&cluster, &namespace).await?;
    ensure!(
        after_stop.as_deref() != Some("rewind-a"),
        "rewind-a still holds the lease after a graceful stop"
    );
    wait_holder(&cluster, &namespace, Duration::from_secs(5), &mut b).await?;
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
    let mut a = spawn_with(&kubeconfig, &namespace, "rewind-a", duration, logs.path())?;
    wait_holder(&cluster, &namespace, Duration::from_secs(20), &mut a).await?;
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

fn spawn(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    duration: Duration,
    dir: &Path,
) -> anyhow::Result<Replica> {
    let kubeconfig = cluster.kubeconfig_path(Role::Controller);
    spawn_with(&kubeconfig, namespace, name, duration, dir)
}

fn spawn_with(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    duration: Duration,
    dir: &Path,
) -> anyhow::Result<Replica> {
    Replica::spawn(
        name,
        process::controller_command(kubeconfig, namespace)
            .args(["--leader-elect"])
            .args(["--lease-namespace", namespace, "--lease-name", LEASE])
            .args(["--lease-duration", &format!("{}s", duration.as_secs())])
            // Slow enough that a kill falls inside the retry: 10 single deletes a second.
            .args(["--qps", "10", "--burst", "10", "--no-bulk"])
            .env("POD_NAME", name),
        dir,
    )
}

async fn holder(cluster: &LocalCluster, namespace: &str) -> anyhow::Result<Option<String>> {
    replica::holder(cluster, namespace, LEASE).await
}

/// Waits until `replica` holds the lease, failing early if it exits.
async fn wait_holder(
    cluster: &LocalCluster,
    namespace: &str,
    within: Duration,
    replica: &mut Replica,
) -> anyhow::Result<()> {
    let expected = Some(replica.name.clone());
    replica::wait_holder(cluster, namespace, LEASE, within, &mut [replica], |found| {
        format!("the lease holder is {found:?}, not {expected:?}, after {within:?}")
    })
    .await?;
    Ok(())
}
