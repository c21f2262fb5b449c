//! Replicas of the controller, as a Deployment's pods: the `rewind` binary run as a process,
//! watched through its log, its HTTP port and the Lease it shares, and stopped as the kubelet
//! stops a pod (leader.rs, upgrade.rs, install.rs).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use rewind::testenv::localcluster::LocalCluster;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::process;

pub struct Replica {
    /// Its pod name, which it holds the Lease as.
    pub name: String,
    pub child: Child,
    log: PathBuf,
}

impl Replica {
    /// Starts `command` as replica `name`, its output in `dir`/`name`.log; killed when dropped.
    pub fn spawn(name: &str, command: &mut Command, dir: &Path) -> anyhow::Result<Replica> {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting the rewind binary")?;
        Ok(Replica {
            name: name.to_owned(),
            child,
            log,
        })
    }

    pub fn log(&self) -> String {
        process::read(&self.log)
    }

    /// SIGTERM, as the kubelet stops a pod; the process must exit 0 within 10 s.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
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

    /// Waits until /readyz answers 200, as a rollout waits for a new pod (a standby is ready).
    pub async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let ready = |answer: &str| answer.starts_with("HTTP/1.1 200");
        let Some(last) = self.poll_http("/readyz", within, ready).await? else {
            return Ok(());
        };
        bail!(
            "{} was not ready within {within:?}; /readyz answered:\n{last}\nlog:\n{}",
            self.name,
            self.log()
        )
    }

    /// Waits until GET `path` answers `code` with `needle` in the body.
    pub async fn wait_http(
        &mut self,
        path: &str,
        code: &str,
        needle: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        let status = format!("HTTP/1.1 {code}");
        let answered = |answer: &str| answer.starts_with(&status) && answer.contains(needle);
        let Some(last) = self.poll_http(path, within, answered).await? else {
            return Ok(());
        };
        bail!(
            "GET {path} on {} never answered {code} with {needle:?}; last answer:\n{last}\nlog:\n{}",
            self.name,
            self.log()
        )
    }

    /// Asks GET `path` until `done` takes the answer (`None`) or `within` passes (the last
    /// answer, for the caller's message); fails at once if the replica exits.
    async fn poll_http(
        &mut self,
        path: &str,
        within: Duration,
        done: impl Fn(&str) -> bool,
    ) -> anyhow::Result<Option<String>> {
        let deadline = Instant::now() + within;
        let mut last = String::new();
        while Instant::now() < deadline {
            self.ensure_running()?;
            if let Some(addr) = self.http_addr() {
                last = get(addr, path).await.unwrap_or_else(|e| e.to_string());
                if done(&last) {
                    return Ok(None);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Some(last))
    }

    fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(exit) = self.child.try_wait()? {
            bail!("{} exited ({exit}):\n{}", self.name, self.log());
        }
        Ok(())
    }

    /// Where it serves /readyz (it was given port 0), from its JSON log: not the address of
    /// Argo's retry API, which it may also log.
    fn http_addr(&self) -> Option<SocketAddr> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| {
                l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("serving /healthz"))
            })
            .and_then(|l| l["fields"]["addr"].as_str().and_then(|a| a.parse().ok()))
    }
}

/// The replicas' logs, each under its name, for a failure message.
pub fn logs<'a>(replicas: impl IntoIterator<Item = &'a Replica>) -> String {
    replicas
        .into_iter()
        .map(|r| format!("--- {}\n{}", r.name, r.log()))
        .collect()
}

/// Who holds Lease `lease`, if anyone.
pub async fn holder(
    cluster: &LocalCluster,
    namespace: &str,
    lease: &str,
) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(cluster.admin_client(), namespace);
    Ok(leases
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// Waits until one of `replicas` holds Lease `lease`, failing early if one exits; its name.
/// After `within` it fails with `timed_out`'s words for the holder then (each test says what
/// it waited for).
pub async fn wait_holder(
    cluster: &LocalCluster,
    namespace: &str,
    lease: &str,
    within: Duration,
    replicas: &mut [&mut Replica],
    timed_out: impl FnOnce(Option<&str>) -> String,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let found = holder(cluster, namespace, lease).await?;
        if let Some(holder) = found
            .clone()
            .filter(|h| replicas.iter().any(|r| &r.name == h))
        {
            return Ok(holder);
        }
        for r in replicas.iter_mut() {
            r.ensure_running()?;
        }
        ensure!(
            Instant::now() < deadline,
            "{}; logs:\n{}",
            timed_out(found.as_deref()),
            logs(replicas.iter().map(|r| &**r))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: rewind\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}
