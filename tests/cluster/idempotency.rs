//! Rule 4 with a real crash: the `rewind` binary killed (SIGKILL) at several points of a retry
//! and restarted ends with exactly one reset, the token observed, and the planner's workflow.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use rewind::argo::workflow::Workflow;
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Child;

use crate::support::controller as ctl;
use crate::support::process::{self, read};

/// How long each run lives before it is killed; a last run finishes the retry.
const KILL_AFTER: [Duration; 3] = [
    Duration::from_millis(500),
    Duration::from_millis(1500),
    Duration::from_secs(3),
];

pub async fn a_controller_killed_mid_retry_resumes_and_resets_exactly_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let target = ctl::KillTarget::create(&cluster, &namespace).await?;
    let logs = tempfile::tempdir()?;

    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let token = "retry-1";
    ctl::request_retry(&cluster, &namespace, &target.name, token).await?;
    // Plan pods left after each kill, to show the kills fell inside the retry.
    let mut left_after_kill = Vec::new();
    for (run, lifetime) in KILL_AFTER.iter().enumerate() {
        let log = logs.path().join(format!("run-{run}.log"));
        let mut child = spawn_controller(&cluster, &namespace, &log)?;
        tokio::time::sleep(*lifetime).await;
        if let Some(exit) = child.try_wait()? {
            bail!(
                "controller run {run} exited by itself ({exit}) before it was killed:\n{}",
                read(&log)
            );
        }
        child.start_kill()?;
        child.wait().await?;
        left_after_kill.push(target.planned_left(&cluster, &namespace).await?);
    }
    let log = logs.path().join("run-last.log");
    let mut child = spawn_controller(&cluster, &namespace, &log)?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let finished =
        ctl::wait_finished(&workflows, &target.name, token, Duration::from_secs(60)).await;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    let ready = readyz(&log).await;
    child.start_kill()?;
    child.wait().await?;
    let (after, status) =
        finished.with_context(|| format!("the last controller run's log:\n{}", read(&log)))?;
    tracing::info!(
        ?left_after_kill,
        planned = target.planned.len(),
        "plan pods left after each kill"
    );

    ready.context("the controller's HTTP endpoints on 127.0.0.1:0")?;
    ensure!(
        left_after_kill
            .iter()
            .any(|&n| n > 0 && n < target.planned.len()),
        "no kill fell while pods were being deleted (plan pods left after each kill: {left_after_kill:?} of {}): the test proves nothing",
        target.planned.len()
    );
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "expected the retry to succeed, its status is {status:?}"
    );
    ensure!(
        after.annotation(annotations::OBSERVED) == Some(token),
        "expected {}={token}, found {:?}",
        annotations::OBSERVED,
        after.annotation(annotations::OBSERVED)
    );
    ctl::ensure_reset_as_planned(&after, &target.plan.workflow, from, to)?;
    target
        .ensure_only_outsiders_left(&cluster, &namespace)
        .await?;

    let log = ctl::audit_log(&cluster, &namespace)?;
    let updates: Vec<u16> = log
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
        "expected exactly one successful update (the reset) of workflow {} by the controller, the audit log has codes {updates:?}",
        target.name
    );
    Ok(())
}

fn spawn_controller(cluster: &LocalCluster, namespace: &str, log: &Path) -> anyhow::Result<Child> {
    // Slow enough that the retry spans the kills: 10 single deletes a second.
    let tuning = ["--qps", "10", "--burst", "10", "--no-bulk"];
    process::spawn_controller(cluster, &[namespace], log, &tuning)
}

/// Finds the address the controller bound (it was given port 0) in its log and asks /readyz.
async fn readyz(log: &Path) -> anyhow::Result<()> {
    let text = read(log);
    let addr = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|l| l["fields"]["addr"].as_str().map(str::to_owned))
        .with_context(|| format!("no log line names the HTTP address:\n{text}"))?;
    let addr: std::net::SocketAddr = addr
        .parse()
        .with_context(|| format!("{addr:?} is not an address"))?;
    ensure!(addr.port() != 0, "the controller reports port 0");
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: rewind\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    ensure!(
        answer.starts_with("HTTP/1.1 200"),
        "GET /readyz on {addr} answered: {answer}"
    );
    Ok(())
}
