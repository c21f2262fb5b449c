//! `rewind retry` and `rewind status` as a user runs them: the real binary,
//! with the unprivileged user's kubeconfig, against an in-process controller
//! on the shared control plane; in a pseudo-terminal where the test is about
//! what a person sees.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use rewind::argo::db::ArgoDatabase;
use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::crd::{CREATED_BY, WorkflowRetry};
use rewind::protocol::request::{RetryPhase, annotations, workflowretry_token};
use rewind::testenv::localcluster::{LocalCluster, Role as ClusterRole, USER_NAME};
use rewind::testenv::workload::FailedDag;
use serde_json::Value;

use crate::support::archived::{Archive, Archived, Rows};
use crate::support::controller as ctl;
use crate::support::grants::{self, rule};

/// What one run of the CLI wrote and how it ended.
struct Run {
    stdout: String,
    stderr: String,
    status: ExitStatus,
    /// In a terminal: how much of `stdout` (bytes) was shown by when.
    timeline: Vec<(Duration, usize)>,
}

impl Run {
    /// Fails unless the CLI exited 0, showing all it wrote (in a terminal, all in `stdout`).
    fn ensure_success(&self) -> anyhow::Result<()> {
        ensure!(
            self.status.success(),
            "exit {:?}:\n{}{}",
            self.status,
            self.stdout,
            self.stderr
        );
        Ok(())
    }
}

/// Runs the CLI with pipes: not a terminal.
async fn run_piped(mut command: Command) -> anyhow::Result<Run> {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await?
        .context("running rewind")?;
    Ok(Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        status: output.status,
        timeline: Vec::new(),
    })
}

/// Runs the CLI with stdin, stdout and stderr on a pseudo-terminal, as in a
/// person's shell, and returns everything the terminal showed (in `stdout`),
/// sending SIGINT (Ctrl-C) after `interrupt` if given.
/// libc's openpty (libc is already a dependency) keeps this to a few lines.
async fn run_in_pty(mut command: Command, interrupt: Option<Duration>) -> anyhow::Result<Run> {
    tokio::task::spawn_blocking(move || {
        let (mut master, mut slave) = (0, 0);
        let size = libc::winsize {
            ws_row: 40,
            ws_col: 160,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two new descriptors, which we own from here on.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        ensure!(rc == 0, "openpty: {}", std::io::Error::last_os_error());
        let (master, slave) =
            unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        command
            .env("TERM", "xterm-256color")
            .stdin(slave.try_clone()?)
            .stdout(slave.try_clone()?)
            .stderr(slave);
        let mut child = command.spawn().context("starting rewind in a pty")?;
        if let Some(after) = interrupt {
            let pid = child.id() as libc::pid_t;
            std::thread::spawn(move || {
                std::thread::sleep(after);
                // SAFETY: a plain kill(2) of our own child.
                unsafe { libc::kill(pid, libc::SIGINT) };
            });
        }
        // The command holds copies of the terminal's end: drop them, so
        // reading ends when the child exits.
        drop(command);
        let mut master = File::from(master);
        let mut shown = Vec::new();
        let mut timeline = Vec::new();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match master.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    shown.extend_from_slice(&buf[..n]);
                    timeline.push((started.elapsed(), shown.len()));
                }
                // EIO: every holder of the terminal's other end is gone.
                Err(e) if e.raw_os_error() == Some(libc::EIO) => break,
                Err(e) => return Err(e).context("reading the pty"),
            }
        }
        let status = child.wait()?;
        Ok(Run {
            stdout: String::from_utf8_lossy(&shown).into_owned(),
            stderr: String::new(),
            status,
            timeline,
        })
    })
    .await?
}

/// The `rewind` binary as the test user runs it in one namespace: each test
/// runs it several times, differing only in its arguments.
struct Cli<'a> {
    cluster: &'a LocalCluster,
    namespace: &'a str,
}

impl<'a> Cli<'a> {
    /// Lets the test user ask for retries in `namespace` (annotations and
    /// WorkflowRetry objects, as the chart's `rewind-retry` role does), and read
    /// pods, for the dry run's bulk assessment.
    async fn granted(cluster: &'a LocalCluster, namespace: &'a str) -> anyhow::Result<Self> {
        grants::grant_user(
            &cluster.admin_client(),
            namespace,
            "rewind-cli-user",
            vec![
                rule(
                    "argoproj.io",
                    "workflows",
                    &["get", "list", "watch", "patch"],
                ),
                rule("", "pods", &["get", "list"]),
                rule(
                    "rewind.dev",
                    "workflowretries",
                    &["create", "get", "list", "watch"],
                ),
            ],
        )
        .await?;
        Ok(Cli { cluster, namespace })
    }

    /// The `rewind` binary with `args`, the user's kubeconfig and namespace.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rewind"));
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig_path(ClusterRole::User))
            .args(["-n", self.namespace])
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null());
        command
    }

    /// Runs `rewind ARGS` with pipes.
    async fn piped(&self, args: &[&str]) -> anyhow::Result<Run> {
        run_piped(self.command(args)).await
    }

    /// Runs `rewind ARGS` in a pseudo-terminal.
    async fn in_pty(&self, args: &[&str]) -> anyhow::Result<Run> {
        run_in_pty(self.command(args), None).await
    }
}

async fn failed_workflow(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    failed: usize,
) -> anyhow::Result<FailedDag> {
    let dag = FailedDag {
        name: name.into(),
        failed,
        succeeded: 3,
    };
    dag.create(&cluster.admin_client(), namespace, 16, || ())
        .await
        .with_context(|| format!("creating workflow {name} and its pods"))?;
    Ok(dag)
}

/// Labels `workflow` with an Argo controller instance ID no controller
/// serves, so no controller (not even one another test starts for every
/// namespace) answers its requests.
async fn unserved(cluster: &LocalCluster, namespace: &str, workflow: &str) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"labels": {labels::CONTROLLER_INSTANCE_ID: "nobody-serves-this"}}});
    Api::<Workflow>::namespaced(cluster.admin_client(), namespace)
        .patch_metadata(workflow, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling workflow {workflow}"))?;
    Ok(())
}

/// A success and a failure in a terminal: the progress bar moves, the
/// summary names the pods deleted, and the exit code tells them apart.
pub async fn retry_in_a_terminal_shows_progress_then_the_summary_or_the_refusal(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    failed_workflow(&cluster, &namespace, "big", 150).await?;
    // A succeeded workflow: the controller refuses it (nothing to retry).
    FailedDag {
        name: "done".into(),
        failed: 0,
        succeeded: 2,
    }
    .create(&cluster.admin_client(), &namespace, 16, || ())
    .await
    .context("creating workflow done")?;
    // Single deletes at 30/s: about 5 s, so the bar shows several states.
    let controller = ctl::start(&cluster, &namespace, ctl::options(30, 5, false)).await?;

    let ok = cli.in_pty(&["retry", "big"]).await?;
    let refused = cli.in_pty(&["retry", "done"]).await?;
    let bad_selector = cli
        .in_pty(&["retry", "big", "--node-field-selector", "oops"])
        .await?;
    controller.stop().await?;

    let shown = &ok.stdout;
    ok.ensure_success()?;
    ensure!(
        shown.contains("big") && shown.contains("/150 pods") && shown.contains("pods/s  ETA"),
        "no progress bar in:\n{shown}"
    );
    ensure!(
        shown.contains("DeletingPods"),
        "the bar never showed the DeletingPods phase:\n{shown}"
    );
    ensure!(
        shown.contains(&format!("{namespace}/big: retried; 150 pods deleted in")),
        "no summary in:\n{shown}"
    );
    ensure!(
        shown.contains('\x1b'),
        "a terminal should get a drawn bar:\n{shown:?}"
    );

    let shown = &refused.stdout;
    ensure!(
        refused.status.code() == Some(1),
        "a refused retry must exit 1, got {:?}:\n{shown}",
        refused.status
    );
    ensure!(
        shown.contains(&format!(
            "retry of {namespace}/done failed: To retry a succeeded workflow, set the options restartSuccessful and nodeFieldSelector — nothing to retry"
        )),
        "the failure should carry the controller's message and hint:\n{shown}"
    );
    ensure!(
        shown.contains("Failed"),
        "the bar should end Failed:\n{shown}"
    );

    // A selector that does not parse is refused before anything is asked, as `argo retry` does.
    let shown = &bad_selector.stdout;
    ensure!(
        bad_selector.status.code() == Some(1)
            && shown
                .contains("unable to parse node field selector 'oops': invalid selector: 'oops'")
            && shown.contains("the node field selector takes"),
        "{shown}"
    );
    Ok(())
}

/// The counts a terminal's bar showed ("N/TOTAL pods"), each with when.
fn counts_shown(run: &Run, total: usize) -> Vec<(Duration, usize)> {
    let suffix = format!("/{total} pods");
    let text = &run.stdout;
    text.match_indices(&suffix)
        .filter_map(|(at, _)| {
            let digits = text[..at]
                .bytes()
                .rev()
                .take_while(u8::is_ascii_digit)
                .count();
            let count = text[at - digits..at].parse().ok()?;
            let (when, _) = run.timeline.iter().find(|(_, len)| *len >= at)?;
            Some((*when, count))
        })
        .collect()
}

/// During a bulk delete (one request the API server carries out pod by
/// pod), `rewind retry` in a terminal shows the count rising each second,
/// while the workflow is written at most three times (the request, the
/// reset, the final report): the progress goes to the WorkflowRetry.
pub async fn a_bulk_delete_shows_its_count_rising_each_second(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const PODS: usize = 3000;
    let cli = Cli::granted(&cluster, &namespace).await?;
    failed_workflow(&cluster, &namespace, "bulk", PODS).await?;
    let controller = ctl::start(&cluster, &namespace, ctl::options(20, 30, true)).await?;
    let run = cli.in_pty(&["retry", "bulk"]).await?;
    controller.stop().await?;
    run.ensure_success()?;
    let counts = counts_shown(&run, PODS);
    // When the count first showed each new value, up to the whole plan.
    let mut rises: Vec<(Duration, usize)> = Vec::new();
    for (when, count) in counts {
        if rises.last().is_none_or(|&(_, last)| count > last) {
            rises.push((when, count));
        }
    }
    let moving: Vec<&(Duration, usize)> = rises
        .iter()
        .filter(|(_, c)| (1..PODS).contains(c))
        .collect();
    let (Some(first), Some(last)) = (moving.first(), moving.last()) else {
        bail!("the count never moved between 0 and {PODS}: {rises:?}");
    };
    let slowest = rises
        .windows(2)
        .filter(|w| w[0].1 > 0)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or_default();
    ensure!(
        moving.len() >= 2 && slowest <= Duration::from_secs(1),
        "the count should rise at least once a second during the bulk delete ({:?} from the first to the last partial count); it rose at {rises:?}",
        last.0 - first.0
    );
    eprintln!(
        "bulk delete of {PODS} pods: the count rose {} times, at most {slowest:?} apart",
        rises.len()
    );
    let writes: Vec<String> = ctl::audit_log(&cluster, &namespace)?
        .into_iter()
        .filter(|a| {
            a.resource == "workflows"
                && a.name == "bulk"
                && !a.dry_run
                && matches!(a.verb.as_str(), "patch" | "update")
        })
        .map(|a| format!("{} {} by {}", a.verb, a.name, a.user))
        .collect();
    ensure!(
        writes.len() <= 3,
        "the workflow should be written at most 3 times, it was written {} times: {writes:?}",
        writes.len()
    );
    Ok(())
}

/// `--dry-run -o json` prints exactly the planner's plan, and the API
/// server's audit log shows no mutating request from the CLI's user.
pub async fn dry_run_prints_the_planners_plan_and_changes_nothing(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    let dag = failed_workflow(&cluster, &namespace, "wf", 40).await?;
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), &namespace);
    let before = workflows.get(&dag.name).await?;
    let plan = ctl::expected_plan(&before)?;

    let run = cli
        .piped(&["retry", "wf", "--dry-run", "-o", "json"])
        .await?;
    run.ensure_success()?;
    let printed: Value = serde_json::from_str(&run.stdout)
        .with_context(|| format!("parsing the dry run's JSON:\n{}", run.stdout))?;
    let preview = &printed[0];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    ensure!(
        strings(&preview["podsToDelete"]) == plan.pods_to_delete,
        "pods differ: {preview}"
    );
    ensure!(
        strings(&preview["nodesReset"]) == plan.nodes_reset,
        "reset nodes differ: {preview}"
    );
    ensure!(
        strings(&preview["nodesDeleted"]) == plan.nodes_deleted,
        "deleted nodes differ: {preview}"
    );
    ensure!(
        preview["bulkPods"] == 40 && preview["podsListed"] == true,
        "the 40 failed pods should go in one bulk delete: {preview}"
    );

    // The human form tells the same.
    let human = cli.piped(&["retry", "wf", "--dry-run"]).await?;
    human.ensure_success()?;
    ensure!(
        human.stdout.contains("pods to delete:   40")
            && human
                .stdout
                .contains("bulk delete:      yes: one DeleteCollection for 40 pods"),
        "{}",
        human.stdout
    );

    // The audit log is written asynchronously: give it a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = ctl::audit_log(&cluster, &namespace)?;
    let by_user: Vec<_> = log.iter().filter(|a| a.user == USER_NAME).collect();
    ensure!(
        by_user
            .iter()
            .any(|a| a.verb == "get" && a.resource == "workflows"),
        "the dry run's reads should be in the audit log: {:?}",
        ctl::summary(&log, USER_NAME)
    );
    ensure!(
        !by_user.iter().any(|a| a.is_mutating()),
        "the dry run sent mutating requests: {:?}",
        ctl::summary(&log, USER_NAME)
    );
    let after = workflows.get(&dag.name).await?;
    ensure!(
        after.annotation(annotations::RETRY).is_none(),
        "the dry run asked for a retry"
    );
    Ok(())
}

/// Without a terminal: timestamped lines on stderr, `-o json` on stdout;
/// `-l` picks several workflows; `--no-wait` returns once the request is set.
pub async fn piped_output_json_selector_and_no_wait(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), &namespace);
    for name in ["a", "b", "c"] {
        failed_workflow(&cluster, &namespace, name, 5).await?;
    }
    for name in ["a", "b"] {
        let patch = serde_json::json!({"metadata": {"labels": {"team": "ml"}}});
        workflows
            .patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let run = cli.piped(&["retry", "-l", "team=ml", "-o", "json"]).await?;
    let no_wait = cli
        .piped(&["retry", "c", "--no-wait", "-o", "name"])
        .await?;
    let table = cli.piped(&["status", "b"]).await?;
    // Asking again for a workflow just reset: Argo's words, then rewind's.
    let again = cli.piped(&["retry", "a"]).await?;
    // One workflow named: asked with a WorkflowRetry, which the controller
    // turns into the workflow's request under a token naming its UID.
    let c_retry = workflowretries(&cluster, &namespace)
        .await?
        .into_iter()
        .find(|r| r.spec.workflow_name.as_deref() == Some("c"));
    let c_token = c_retry
        .as_ref()
        .and_then(|r| r.uid())
        .map(|uid| workflowretry_token(&uid));
    let status = ctl::wait_finished(
        &workflows,
        "c",
        c_token.as_deref().unwrap_or_default(),
        Duration::from_secs(30),
    )
    .await;
    controller.stop().await?;

    run.ensure_success()?;
    let printed: Value = serde_json::from_str(&run.stdout)
        .with_context(|| format!("parsing -o json:\n{}", run.stdout))?;
    let mut retried: Vec<(String, String)> = printed
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["workflow"].as_str().unwrap_or_default().to_owned(),
                o["status"]["phase"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    retried.sort();
    ensure!(
        retried
            == [
                ("a".into(), "Succeeded".into()),
                ("b".into(), "Succeeded".into())
            ],
        "-l team=ml should retry a and b: {printed}"
    );
    ensure!(
        !run.stderr.contains('\x1b'),
        "escape codes without a terminal: {:?}",
        run.stderr
    );
    for name in ["a", "b"] {
        let line = run
            .stderr
            .lines()
            .find(|l| l.contains(&format!(" {namespace}/{name} Succeeded 5/5 pods deleted")))
            .with_context(|| format!("no final progress line for {name} in:\n{}", run.stderr))?;
        let stamp = line.split(' ').next().unwrap_or_default();
        stamp
            .parse::<Timestamp>()
            .with_context(|| format!("the line should start with a timestamp: {line}"))?;
    }

    let first = printed
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["workflow"] == "a")
        .and_then(|o| o["request"].as_str())
        .unwrap_or_default();
    ensure!(
        again.status.code() == Some(1)
            && again.stderr.contains(&format!(
                "failed: Cannot retry a workflow in phase  — not finished: it was reset by request {first} at "
            ))
            && again.stderr.contains("waits for Argo's controller"),
        "a second retry of a reset workflow should say why it is refused:\n{}{}",
        again.stdout,
        again.stderr
    );

    let mut lines = table.stdout.lines();
    let (header, row) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    let cells: Vec<&str> = row.split_whitespace().collect();
    ensure!(
        header.split_whitespace().collect::<Vec<_>>()
            == ["WORKFLOW", "REQUEST", "PHASE", "PODS", "AGE", "MESSAGE"]
            && cells.first() == Some(&"b")
            && cells.get(2) == Some(&"Succeeded")
            && cells.get(3) == Some(&"5/5")
            && row.contains("deleted 5 pods; the workflow was reset"),
        "rewind status b:\n{}",
        table.stdout
    );

    no_wait.ensure_success()?;
    ensure!(
        c_retry.as_ref().is_some_and(
            |r| no_wait.stdout.trim() == format!("workflowretry.rewind.dev/{}", r.name_any())
        ),
        "-o name prints the WorkflowRetry asked for c: {:?}",
        no_wait.stdout
    );
    status.context("the --no-wait request should still run to its end")?;
    let labelled = workflows.get("c").await?;
    ensure!(
        labelled.label(labels::COMPLETED).is_none(),
        "c was not reset by its --no-wait request"
    );
    Ok(())
}

/// A batch the controller cannot start at once (its reads at 2 a second: half
/// of the 12 requests are still unanswered 10 s after they were asked):
/// the last requests wait in its queue past `--controller-timeout`, and the
/// CLI, seeing the controller answer the first, follows them all to the end.
pub async fn a_batch_waiting_in_the_controllers_queue_is_followed_to_its_end(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const WORKFLOWS: usize = 12;
    let cli = Cli::granted(&cluster, &namespace).await?;
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), &namespace);
    for i in 0..WORKFLOWS {
        let name = format!("q{i:02}");
        failed_workflow(&cluster, &namespace, &name, 3).await?;
        let patch = serde_json::json!({"metadata": {"labels": {"team": "q"}}});
        workflows
            .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let mut options = ctl::options(50, 50, true);
    options.budget.reads = rewind::engine::budget::Rate::new(2, 1).expect("non-zero rate");
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let started = std::time::Instant::now();
    let run = cli
        .piped(&[
            "retry",
            "-l",
            "team=q",
            "--controller-timeout",
            "10s",
            "-o",
            "json",
        ])
        .await?;
    let took = started.elapsed();
    controller.stop().await?;
    ensure!(
        run.status.success(),
        "exit {:?} after {took:?}:\n{}{}",
        run.status,
        run.stdout,
        run.stderr
    );
    let printed: Value = serde_json::from_str(&run.stdout)
        .with_context(|| format!("parsing -o json:\n{}", run.stdout))?;
    let succeeded = printed
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["status"]["phase"] == "Succeeded")
        .count();
    ensure!(
        succeeded == WORKFLOWS && took > Duration::from_secs(10),
        "all {WORKFLOWS} should succeed, some after the 10 s timeout (the batch took {took:?}): {printed}"
    );
    Ok(())
}

/// With no controller, the CLI stops waiting and says what to check.
pub async fn without_a_controller_retry_says_so_and_how_to_check(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    failed_workflow(&cluster, &namespace, "wf", 2).await?;
    unserved(&cluster, &namespace, "wf").await?;
    let started = std::time::Instant::now();
    let run = cli
        .piped(&["retry", "wf", "--controller-timeout", "2s"])
        .await?;
    ensure!(
        !run.status.success(),
        "should fail:\n{}{}",
        run.stdout,
        run.stderr
    );
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    let all = format!("{}{}", run.stdout, run.stderr);
    ensure!(
        all.contains("no rewind controller answered WorkflowRetry")
            && all.contains("(workflow wf) within 2s")
            && all.contains("kubectl get lease rewind"),
        "{all}"
    );

    // `rewind status` shows the request as waiting.
    let status = cli.piped(&["status"]).await?;
    status.ensure_success()?;
    let row = status
        .stdout
        .lines()
        .find(|l| l.starts_with("wf "))
        .with_context(|| format!("no row for wf in:\n{}", status.stdout))?;
    ensure!(
        status.stdout.starts_with("WORKFLOW") && row.contains("Waiting"),
        "{}",
        status.stdout
    );
    Ok(())
}

/// Ctrl-C stops following, says the request keeps running, and leaves it.
pub async fn ctrl_c_stops_following_and_leaves_the_request(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    failed_workflow(&cluster, &namespace, "wf", 2).await?;
    unserved(&cluster, &namespace, "wf").await?;
    let run = run_in_pty(
        cli.command(&["retry", "wf", "--controller-timeout", "60s"]),
        Some(Duration::from_secs(3)),
    )
    .await?;
    let shown = &run.stdout;
    ensure!(
        run.status.code() == Some(130),
        "exit {:?}:\n{shown}",
        run.status
    );
    ensure!(
        shown.contains("Stopped following. The retry requests keep running on the controller"),
        "{shown}"
    );
    let retries = workflowretries(&cluster, &namespace).await?;
    ensure!(
        retries
            .iter()
            .any(|r| r.spec.workflow_name.as_deref() == Some("wf")),
        "the request should stay, as a WorkflowRetry for wf: {retries:?}"
    );
    Ok(())
}

/// A failed workflow `name` archived and deleted, its pods left behind (held
/// by Argo's finalizer): returns its UID, its archived row and the number of
/// pods the retry must delete.
async fn archived_workflow(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
    failed: usize,
) -> anyhow::Result<(String, Workflow, usize)> {
    let dag = FailedDag {
        name: name.into(),
        failed,
        succeeded: 2,
    };
    let old = Archived::create(cluster, namespace, dag, Archive::InTest).await?;
    Ok((old.uid, old.row, old.plan.pods_to_delete.len()))
}

/// The WorkflowRetry objects in `namespace`.
async fn workflowretries(
    cluster: &LocalCluster,
    namespace: &str,
) -> anyhow::Result<Vec<WorkflowRetry>> {
    Ok(
        Api::<WorkflowRetry>::namespaced(cluster.admin_client(), namespace)
            .list(&ListParams::default())
            .await?
            .items,
    )
}

/// `rewind retry --archived UID`, piped: it creates a WorkflowRetry, follows
/// it with timestamped lines to Succeeded, prints the summary and exits 0;
/// the workflow exists again, and `rewind status` lists the request. In a
/// terminal, the bar and the summary name the created workflow.
pub async fn archived_retry_creates_a_workflowretry_and_follows_it_to_the_end(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    let (uid, row, planned) = archived_workflow(&cluster, &namespace, "wf", 30).await?;
    let (tty_uid, tty_row, tty_planned) =
        archived_workflow(&cluster, &namespace, "tty", 10).await?;
    let archive: Arc<dyn ArgoDatabase> = Arc::new(Rows(BTreeMap::from([
        (uid.clone(), row),
        (tty_uid.clone(), tty_row),
    ])));
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(archive),
    )
    .await?;
    let run = cli.piped(&["retry", "--archived", &uid]).await?;
    let table = cli.piped(&["status", "wf"]).await?;
    let tty = cli.in_pty(&["retry", "--archived", &tty_uid]).await?;
    controller.stop().await?;

    run.ensure_success()?;
    let retries = workflowretries(&cluster, &namespace).await?;
    let [retry] = retries
        .iter()
        .filter(|r| r.spec.archived_workflow_uid.as_deref() == Some(uid.as_str()))
        .collect::<Vec<_>>()[..]
    else {
        bail!("expected one WorkflowRetry for {uid}, found {retries:?}");
    };
    let name = retry.name_any();
    let status = retry.status.clone().unwrap_or_default();
    ensure!(
        name.starts_with("retry-")
            && retry.spec.archived_workflow_uid.as_deref() == Some(uid.as_str())
            && status.phase == Some(RetryPhase::Succeeded)
            && status.workflow_name.as_deref() == Some("wf"),
        "the CLI's WorkflowRetry {name}: {:?} {status:?}",
        retry.spec
    );
    ensure!(
        !run.stderr.contains('\x1b'),
        "escape codes without a terminal: {:?}",
        run.stderr
    );
    let last = run
        .stderr
        .lines()
        .find(|l| {
            l.contains(&format!(
                " {namespace}/wf Succeeded {planned}/{planned} pods deleted"
            ))
        })
        .with_context(|| format!("no final progress line in:\n{}", run.stderr))?;
    last.split(' ')
        .next()
        .unwrap_or_default()
        .parse::<Timestamp>()
        .with_context(|| format!("the line should start with a timestamp: {last}"))?;
    let summary = format!("{namespace}/wf: retried; {planned} pods deleted in ");
    ensure!(
        run.stdout.contains(&summary) && run.stdout.contains(&format!("(workflowretry/{name})")),
        "no summary {summary:?} naming workflowretry/{name} in:\n{}",
        run.stdout
    );
    let workflow = Api::<Workflow>::namespaced(cluster.admin_client(), &namespace)
        .get("wf")
        .await
        .context("the retry should have created workflow wf")?;
    ensure!(
        workflow.uid().as_deref() != Some(uid.as_str())
            && workflow.annotation(CREATED_BY) == retry.uid().as_deref(),
        "wf should be a new workflow created by {name}: uid {:?}, {CREATED_BY} {:?}",
        workflow.uid(),
        workflow.annotation(CREATED_BY)
    );

    table.ensure_success()?;
    let row = table
        .stdout
        .lines()
        .find(|l| l.contains(&format!("workflowretry/{name}")))
        .with_context(|| format!("no row for {name} in:\n{}", table.stdout))?;
    let cells: Vec<&str> = row.split_whitespace().collect();
    let pods = format!("{planned}/{planned}");
    ensure!(
        cells.first() == Some(&"wf")
            && cells.get(2) == Some(&"Succeeded")
            && cells.get(3) == Some(&pods.as_str())
            && row.contains("created workflow wf"),
        "rewind status:\n{}",
        table.stdout
    );

    let shown = &tty.stdout;
    tty.ensure_success()?;
    ensure!(
        shown.contains('\x1b')
            && shown.contains(&format!("{tty_planned}/{tty_planned} pods"))
            && shown.contains(&format!(
                "{namespace}/tty: retried; {tty_planned} pods deleted in "
            )),
        "no drawn bar or summary for tty in:\n{shown}"
    );
    Ok(())
}

/// `--archived --dry-run`: the API server admits the WorkflowRetry in a dry
/// run and nothing is stored; the only mutating requests from the CLI's
/// user in the audit log are those dry runs. `--archived` with workflow
/// names is a usage error.
pub async fn archived_dry_run_is_a_server_side_dry_run_that_creates_nothing(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    let uid = "3f1c9a2e-0000-4000-8000-000000000001";
    let json = cli
        .piped(&["retry", "--archived", uid, "--dry-run", "-o", "json"])
        .await?;
    let human = cli
        .piped(&[
            "retry",
            "--archived",
            uid,
            "--dry-run",
            "--node-field-selector",
            "templateName=train",
        ])
        .await?;
    let misuse = cli.piped(&["retry", "wf", "--archived", uid]).await?;

    json.ensure_success()?;
    let printed: Value = serde_json::from_str(&json.stdout)
        .with_context(|| format!("parsing the dry run's JSON:\n{}", json.stdout))?;
    ensure!(
        printed["kind"] == "WorkflowRetry"
            && printed["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("retry-"))
            && printed["spec"]["archivedWorkflowUID"] == uid,
        "the dry run should print the WorkflowRetry as the API server admitted it: {printed}"
    );
    ensure!(
        human.status.success()
            && human.stdout.contains(&format!(
                "for archived workflow {uid} (dry run: the API server accepted it; nothing was created)"
            ))
            && human.stdout.contains("needs the archived workflow"),
        "exit {:?}:\n{}{}",
        human.status,
        human.stdout,
        human.stderr
    );
    ensure!(
        misuse.status.code() == Some(2)
            && misuse.stderr.contains("--archived <UID>")
            && misuse.stderr.contains("cannot be used with"),
        "--archived with a workflow name should be a usage error: exit {:?}\n{}",
        misuse.status,
        misuse.stderr
    );

    let stored = workflowretries(&cluster, &namespace).await?;
    ensure!(
        stored.is_empty(),
        "the dry run created WorkflowRetry objects: {:?}",
        stored.iter().map(|r| r.name_any()).collect::<Vec<_>>()
    );
    // The audit log is written asynchronously: give it a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = ctl::audit_log(&cluster, &namespace)?;
    let mutating: Vec<_> = log
        .iter()
        .filter(|a| a.user == USER_NAME && a.is_mutating())
        .collect();
    ensure!(
        mutating.len() == 2
            && mutating.iter().all(|a| a.verb == "create"
                && a.resource == "workflowretries"
                && a.dry_run
                && a.code == 201),
        "expected the two dry-run creates and no other mutating request: {mutating:?}"
    );
    Ok(())
}

/// With no controller serving the namespace, `rewind retry --archived`
/// stops waiting, says what to check, exits non-zero, and the WorkflowRetry
/// stays (waiting, in `rewind status`).
pub async fn archived_retry_without_a_controller_says_so_and_how_to_check(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let cli = Cli::granted(&cluster, &namespace).await?;
    let uid = "3f1c9a2e-0000-4000-8000-000000000002";
    let started = std::time::Instant::now();
    let run = cli
        .piped(&["retry", "--archived", uid, "--controller-timeout", "2s"])
        .await?;
    ensure!(
        run.status.code() == Some(1),
        "should fail with 1, got {:?}:\n{}{}",
        run.status,
        run.stdout,
        run.stderr
    );
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    let retries = workflowretries(&cluster, &namespace).await?;
    let [retry] = retries.as_slice() else {
        bail!(
            "expected the WorkflowRetry to stay, found {}",
            retries.len()
        );
    };
    let name = retry.name_any();
    ensure!(
        retry.status.as_ref().and_then(|s| s.phase).is_none(),
        "no controller should have served {name}: {:?}",
        retry.status
    );
    let all = format!("{}{}", run.stdout, run.stderr);
    for needle in [
        format!(
            "no rewind controller answered WorkflowRetry {namespace}/{name} (archived workflow {uid}) within 2s"
        ),
        "kubectl get deployments -A -l app.kubernetes.io/name=rewind".into(),
        "kubectl get lease rewind".into(),
        "--instance-id".into(),
        "--argo-configmap".into(),
        format!("rewind status {name} -n {namespace} -w"),
    ] {
        ensure!(all.contains(&needle), "{needle:?} missing from:\n{all}");
    }

    let status = cli.piped(&["status", &name]).await?;
    status.ensure_success()?;
    let row = status
        .stdout
        .lines()
        .find(|l| l.contains(&format!("workflowretry/{name}")))
        .with_context(|| format!("no row for {name} in:\n{}", status.stdout))?;
    ensure!(
        row.starts_with(&format!("{uid} ")) && row.contains("Waiting"),
        "the pending WorkflowRetry shows the archived UID, Waiting:\n{}",
        status.stdout
    );
    Ok(())
}
