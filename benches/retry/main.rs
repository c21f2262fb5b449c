//! Side by side, each run on a fresh control plane with its audit log on: N failed pods of
//! an Argo-shaped workflow (and some succeeded ones, which must stay) retried once by
//!
//! - `floor`: one raw DeleteCollection of the same pods (the API server's own limit);
//! - `rewind-bulk`: the real `rewind controller` binary, qps 20 / burst 30 (its default);
//! - `rewind-pod-qps20`, `rewind-pod-qps200`: the same with `--no-bulk` (one DELETE per
//!   pod) at qps 20 / burst 30 and qps 200 / burst 300;
//! - `peer`: Argo's own RetryWorkflow in process (tools/peer) at 20/30, as the Argo Server;
//! - `argo-cli`: the same at 5/10, as `argo retry` without a server (at N >= 8000 only
//!   with `--slow`: it takes about N/5 seconds);
//! - `rewind-archived`, `peer-archived`: an archived workflow (written by Argo's own code
//!   into PostgreSQL, deleted from the cluster, its pods left behind) retried by a
//!   WorkflowRetry and by Argo's RetryArchivedWorkflow at 20/30;
//!
//! - `rewind-batch`, `peer-batch` (only when named in `--rows`): `--batch WxP`, W workflows of
//!   P failed pods each retried by one `rewind retry -l` and by Argo's `argo retry -l` loop,
//!   with a second user's small retry during rewind's (batch.rs; N is W × P);
//!
//! plus the computed per-pod floors N/20 and N/200. Rows run in alternating order over the
//! repetitions. A workflow over Argo's size limit even compressed (20,000 pods) is stored as
//! Argo's controller stores it then: its nodes offloaded into PostgreSQL, which rewind and
//! the peer read; archived rows are left out at that size. Per run: wall time from the
//! request to the job done (checked: the failed pods gone, the succeeded ones kept, the
//! workflow reset or created; rewind's reset equal to its planner's), the steps and the
//! retrier's requests by verb from the audit log, rewind's and the peer's CPU seconds and
//! peak RSS (rewind's CPU counted over the retry only, the peer's over its whole process),
//! and a neighbour's latency (its own user and namespace: GET a pod, LIST workflows, PATCH
//! a ConfigMap, 20 a second) during the retry beside its idle baseline on the same control
//! plane just before.
//!
//!     cargo bench --features testenv --bench retry -- --pods 1000,8000 --repetitions 3 [--rows floor,rewind-bulk]
//!         [--slow] [--succeeded 100] [--idle-seconds 5] [--out NAME]
//!     cargo bench --features testenv --bench retry -- --rows rewind-batch,peer-batch --batch 200x100
//!         [--small-pods 20] [--small-after 5] [--succeeded 10] [--repetitions 1] [--out NAME]
//!     cargo bench --features testenv --bench retry -- --render bench/results/a.json,bench/results/b.json --out NAME
//!
//! Writes bench/results/NAME.json (every run and the summary), NAME.md (the table) and
//! NAME.png (the chart); `--render` summarises and draws again from saved runs. With
//! REWIND_BENCH_KEEP_AUDIT set, each run's audit log is kept beside the controller logs.
//! `--scale 1000x1000` measures the controller among many workflows instead (scale.rs).

mod batch;
mod chart;
mod scale;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::wait::await_condition;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use rewind::argo::plan::compress::DEFAULT_MAX_WORKFLOW_SIZE;
use rewind::argo::plan::{RetryOptions, plan_retry_at};
use rewind::argo::workflow::{Workflow, labels};
use rewind::engine::assess::bulk_selectors;
use rewind::engine::pods::delete_collection;
use rewind::protocol::crd::{CREATED_BY, WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::{self, RetryPhase, annotations};
use rewind::testenv::argo;
use rewind::testenv::bench::audit::{self, Audited};
use rewind::testenv::bench::batch as batch_report;
use rewind::testenv::bench::child::{RewindController, run_measured};
use rewind::testenv::bench::cli;
use rewind::testenv::bench::neighbours::{self, Neighbour};
use rewind::testenv::bench::report::{self, Measured, Reference, RowSummary};
use rewind::testenv::bench::usage::Usage;
use rewind::testenv::db::DbServer;
use rewind::testenv::db::argodb::{ArgoDbTool as ArgosCode, ArgoLine};
use rewind::testenv::localcluster::{ADMIN_NAME, CONTROLLER_NAME, LocalCluster, Options, Role};
use rewind::testenv::trials::{NOW, differences};
use rewind::testenv::workload::{FailedDag, delete_workflow, hydrated};

const NAMESPACE: &str = "bench";
const WORKFLOW: &str = "big-retry";
const REQUEST: &str = "big-retry-archived";
const FINISH: Duration = Duration::from_secs(4 * 3600);
const RESULTS: &str = "bench/results";
/// Set (to anything), each run's audit log is kept beside the controller logs: where a run's
/// time went, request by request.
const KEEP_AUDIT: &str = "REWIND_BENCH_KEEP_AUDIT";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Floor,
    RewindBulk,
    RewindPod20,
    RewindPod200,
    Peer,
    ArgoCli,
    RewindArchived,
    PeerArchived,
    RewindBatch,
    PeerBatch,
}

impl Row {
    const ALL: [Row; 10] = [
        Row::Floor,
        Row::RewindBulk,
        Row::RewindPod20,
        Row::RewindPod200,
        Row::Peer,
        Row::ArgoCli,
        Row::RewindArchived,
        Row::PeerArchived,
        Row::RewindBatch,
        Row::PeerBatch,
    ];

    /// The rows run without `--rows`: all but the batch rows, which retry another workload.
    fn default_rows() -> Vec<Row> {
        Row::ALL.into_iter().filter(|r| !r.batch()).collect()
    }

    fn name(self) -> &'static str {
        match self {
            Row::Floor => "floor",
            Row::RewindBulk => "rewind-bulk",
            Row::RewindPod20 => "rewind-pod-qps20",
            Row::RewindPod200 => "rewind-pod-qps200",
            Row::Peer => "peer",
            Row::ArgoCli => "argo-cli",
            Row::RewindArchived => "rewind-archived",
            Row::PeerArchived => "peer-archived",
            Row::RewindBatch => "rewind-batch",
            Row::PeerBatch => "peer-batch",
        }
    }

    fn archived(self) -> bool {
        matches!(self, Row::RewindArchived | Row::PeerArchived)
    }

    /// Whether it retries the batch (batch.rs) rather than one workflow of `--pods`.
    fn batch(self) -> bool {
        matches!(self, Row::RewindBatch | Row::PeerBatch)
    }

    /// rewind's flags for this row; `None` for rows rewind does not run.
    fn rewind_flags(self) -> Option<&'static [&'static str]> {
        match self {
            Row::RewindBulk | Row::RewindArchived | Row::RewindBatch => {
                Some(&["--qps", "20", "--burst", "30"])
            }
            Row::RewindPod20 => Some(&["--qps", "20", "--burst", "30", "--no-bulk"]),
            Row::RewindPod200 => Some(&["--qps", "200", "--burst", "300", "--no-bulk"]),
            _ => None,
        }
    }

    /// The peer's client budget (qps, burst) for this row; `None` for rows it does not run.
    fn peer_budget(self) -> Option<(u32, u32)> {
        match self {
            Row::Peer | Row::PeerArchived | Row::PeerBatch => Some((20, 30)),
            Row::ArgoCli => Some((5, 10)),
            _ => None,
        }
    }
}

impl std::str::FromStr for Row {
    type Err = String;

    fn from_str(name: &str) -> Result<Row, String> {
        Row::ALL
            .into_iter()
            .find(|r| r.name() == name.trim())
            .ok_or_else(|| {
                let all: Vec<&str> = Row::ALL.iter().map(|r| r.name()).collect();
                format!("unknown row {name:?}; rows: {}", all.join(","))
            })
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The row a row's time is compared with: Argo's retry of the same kind at the same budget.
fn peer_of(row: &str) -> Option<&'static str> {
    match row {
        "rewind-archived" => Some("peer-archived"),
        "rewind-batch" => Some("peer-batch"),
        "peer-archived" | "peer-batch" | "peer" => None,
        _ => Some("peer"),
    }
}

/// Side by side retries of N failed pods, each run on a fresh control plane (the module docs
/// of benches/retry/main.rs say what each row runs).
#[derive(clap::Parser)]
struct Args {
    /// Failed pods, comma-separated: every row runs at each N.
    #[arg(long, value_delimiter = ',', value_parser = number, default_value = "1000")]
    pods: Vec<usize>,
    /// The rows to run, comma-separated; all but rewind-batch and peer-batch by default.
    #[arg(long, value_delimiter = ',', default_values_t = Row::default_rows(), hide_default_value = true)]
    rows: Vec<Row>,
    /// Runs of each row at each N, in alternating order; at least 1.
    #[arg(long, value_parser = cli::at_least_one, default_value = "3")]
    repetitions: usize,
    /// Succeeded pods beside the failed ones (of each workflow of a batch), which must stay.
    #[arg(long, default_value = "100")]
    succeeded: usize,
    /// The batch rows' workload: WORKFLOWS failed workflows of PODS failed pods each,
    /// labelled alike in one namespace.
    #[arg(long, value_name = "WORKFLOWSxPODS", value_parser = parse_by::<batch::Shape>, default_value = "200x100")]
    batch: batch::Shape,
    /// rewind-batch: the failed pods of a workflow a second user retries during the batch
    /// (0: no second user).
    #[arg(long, value_name = "PODS", default_value = "20")]
    small_pods: usize,
    /// rewind-batch: when the second user asks, in seconds from the batch command's start.
    #[arg(long, value_name = "SECONDS", default_value = "5")]
    small_after: f64,
    /// Run argo-cli at N >= 8000 too (it takes about N/5 seconds).
    #[arg(long)]
    slow: bool,
    /// Seconds of the neighbour's idle baseline before each retry.
    #[arg(long, value_name = "SECONDS", default_value = "5")]
    idle_seconds: u64,
    /// The results' file name without a directory: bench/results/NAME.json, .md and .png.
    #[arg(long, value_name = "NAME", value_parser = file_name)]
    out: Option<String>,
    /// Summarise and draw again from saved runs (comma-separated JSON files; needs --out).
    #[arg(long, value_delimiter = ',', value_name = "FILES")]
    render: Vec<PathBuf>,
    /// Measure the controller among many workflows instead (scale.rs), e.g. 1000x1000.
    #[arg(long, value_name = "WORKFLOWSxNODES", value_parser = parse_by::<scale::Scale>)]
    scale: Option<scale::Scale>,
    /// The command line that reproduces the run, recorded in the results.
    #[arg(skip)]
    command: String,
}

/// One of `--pods`, spaces around it allowed.
fn number(s: &str) -> Result<usize, std::num::ParseIntError> {
    s.trim().parse()
}

/// `--scale` or `--batch`, its error with its cause (clap shows only the outermost context).
fn parse_by<T: std::str::FromStr<Err = anyhow::Error>>(s: &str) -> Result<T, String> {
    s.parse().map_err(|e: anyhow::Error| format!("{e:#}"))
}

/// `AxB` as two counts, for `flag`, which takes `form`.
fn by(s: &str, flag: &str, form: &str) -> anyhow::Result<(usize, usize)> {
    let count = |v: &str| {
        v.trim()
            .parse::<usize>()
            .with_context(|| format!("{flag} takes {form}, not {s:?}"))
    };
    let (a, b) = s
        .split_once('x')
        .with_context(|| format!("{flag} takes {form}"))?;
    Ok((count(a)?, count(b)?))
}

/// `--out`: results go to bench/results only.
fn file_name(s: &str) -> Result<String, &'static str> {
    match s.is_empty() || s.contains('/') {
        true => Err("--out takes a file name without a directory"),
        false => Ok(s.to_owned()),
    }
}

/// What one results file holds.
#[derive(Serialize, Deserialize)]
struct Results {
    command: String,
    started: String,
    finished: String,
    cpus: usize,
    pods: Vec<usize>,
    repetitions: usize,
    succeeded: usize,
    rows: Vec<String>,
    runs: Vec<Measured>,
    summary: Vec<RowSummary>,
    /// How the requester saw a rewind retry done; runs saved before it watched polled.
    #[serde(default = "polled")]
    done_seen: String,
}

const WATCHED: &str = "on a watch of the object";

fn polled() -> String {
    "polled every 50 ms".into()
}

/// Shared by every run: the binaries, and Argo's database when an archived row runs.
struct Context {
    rewind: PathBuf,
    peer: PathBuf,
    db: Option<(DbServer, ArgosCode)>,
    succeeded: usize,
    batch: batch::Options,
    idle: Duration,
    logs: PathBuf,
}

fn computed(pods: &[usize]) -> Vec<(String, usize, f64)> {
    pods.iter()
        .flat_map(|&n| {
            [20, 200].map(|qps| {
                (
                    format!("per-pod floor N/{qps}"),
                    n,
                    n as f64 / f64::from(qps),
                )
            })
        })
        .collect()
}

fn summarize(runs: &[Measured], pods: &[usize]) -> Vec<RowSummary> {
    let order: Vec<&str> = Row::ALL.iter().map(|r| r.name()).collect();
    report::summarize(
        runs,
        &order,
        &computed(pods),
        &Reference {
            floor: "floor",
            peer: &peer_of,
        },
    )
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let started = Timestamp::now();
    let peer = tokio::task::spawn_blocking(|| argo::binary("peer")).await??;
    let offloading = args
        .pods
        .iter()
        .map(|&n| offloaded(&dag(n, args.succeeded).workflow(NAMESPACE)))
        .collect::<anyhow::Result<Vec<bool>>>()?;
    let db = match args.scale.is_none()
        && (args.rows.iter().any(|r| r.archived()) || offloading.contains(&true))
    {
        false => None,
        true => {
            let db = DbServer::postgres()
                .await
                .context("starting PostgreSQL (`bash tools/db/install.sh` installs it)")?;
            let code = tokio::task::spawn_blocking(|| ArgosCode::locate(ArgoLine::V4)).await??;
            let migrate = db.argodb_request("migrate", json!({}));
            let c = code.clone();
            tokio::task::spawn_blocking(move || c.one(migrate)).await??;
            Some((db, code))
        }
    };
    let logs = tempfile::Builder::new()
        .prefix("rewind-bench-")
        .tempdir()?
        .keep();
    let context = Context {
        rewind: PathBuf::from(env!("CARGO_BIN_EXE_rewind")),
        peer,
        db,
        succeeded: args.succeeded,
        batch: batch::Options {
            shape: args.batch,
            small_pods: args.small_pods,
            small_after: Duration::from_secs_f64(args.small_after),
        },
        idle: Duration::from_secs(args.idle_seconds),
        logs,
    };
    println!(
        "{} repetitions, rows in alternating order, each run on a fresh control plane; controller logs in {}",
        args.repetitions,
        context.logs.display()
    );
    if let Some(scale) = args.scale {
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| format!("scale-{}x{}", scale.workflows, scale.nodes));
        return scale::run(&context, scale, args.pods[0], &args.command, &out).await;
    }
    // The rows to run at each N: the single rows at each of `--pods`, the batch rows at the
    // batch's.
    let (batched, single): (Vec<Row>, Vec<Row>) = args.rows.iter().partition(|r| r.batch());
    let mut plan: Vec<(usize, Vec<Row>)> = Vec::new();
    for (&n, &offloaded) in args.pods.iter().zip(&offloading) {
        if single.is_empty() {
            break;
        }
        if offloaded {
            println!(
                "N = {n}: the workflow is over Argo's size limit even compressed, so its nodes are offloaded (and a workflow created from the archive offloads them too)"
            );
        }
        let rows = single
            .iter()
            .copied()
            .filter(|&r| r != Row::ArgoCli || n < 8000 || args.slow)
            .collect();
        plan.push((n, rows));
    }
    if !batched.is_empty() {
        plan.push((args.batch.total(), batched));
    }
    let pods: Vec<usize> = plan.iter().map(|(n, _)| *n).collect();
    let out = args.out.clone().unwrap_or_else(|| match single.is_empty() {
        true => format!("retry-batch-{}", args.batch),
        false => {
            let pods: Vec<String> = args.pods.iter().map(usize::to_string).collect();
            format!("retry-{}", pods.join("-"))
        }
    });
    let mut runs = Vec::new();
    let result = async {
        for (n, rows) in &plan {
            for rep in 0..args.repetitions {
                let mut order = rows.clone();
                if rep % 2 == 1 {
                    order.reverse();
                }
                for row in order {
                    let m = measure(&context, row, *n, rep).await.with_context(|| {
                        format!("{} at N = {n}, repetition {}", row.name(), rep + 1)
                    })?;
                    print_run(&m);
                    runs.push(m);
                    // Saved as it goes: a long run interrupted keeps what it measured.
                    write(&args, &pods, &out, started, &runs)?;
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    if let Some((db, _)) = context.db {
        db.stop();
    }
    result?;
    let summary = write(&args, &pods, &out, started, &runs)?;
    println!("\n{}", report::markdown(&summary));
    println!("Written: {RESULTS}/{out}.json, .md, .png");
    Ok(())
}

fn print_run(m: &Measured) {
    let s = &m.steps;
    let f = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"));
    let p99 = |l: &neighbours::Latency| f(l.p99_ms);
    println!(
        "  N={} rep {} {:18} wall {:7.2}s  audit {:7.2}s (read+plan {}, list {}, delete {}, confirm {}, commit {}); requests {:?}; {}neighbour p99 {} → {} ms",
        m.pods,
        m.repetition + 1,
        m.row,
        m.wall_seconds,
        s.total,
        f(s.read_plan),
        f(s.list),
        f(s.delete),
        f(s.confirm),
        f(s.commit),
        m.requests,
        m.usage.map_or_else(String::new, |u| format!(
            "CPU {:.2}s, peak RSS {:.0} MiB; ",
            u.cpu_seconds,
            u.peak_rss_bytes as f64 / 1048576.0
        )),
        p99(&m.neighbour_idle),
        p99(&m.neighbour_during),
    );
    if let Some(b) = &m.batch {
        println!(
            "    {} workflows × {} pods: command returned after {:.2}s; busiest second {} writes, {} requests{}",
            b.workflows,
            b.pods_each,
            b.command_seconds,
            b.busiest_writes,
            b.busiest_requests,
            b.small.as_ref().map_or_else(String::new, |s| format!(
                "; second user's {} pods asked at {:.2}s, reset {:.2}s later (audit {})",
                s.pods,
                s.asked_after_seconds,
                s.wall_seconds,
                f(s.audit_seconds)
            ))
        );
    }
}

/// Writes the runs so far (at the Ns `pods`) and their summary; returns the summary.
fn write(
    args: &Args,
    pods: &[usize],
    out: &str,
    started: Timestamp,
    runs: &[Measured],
) -> anyhow::Result<Vec<RowSummary>> {
    let summary = summarize(runs, pods);
    let results = Results {
        command: args.command.clone(),
        started: started.to_string(),
        finished: Timestamp::now().to_string(),
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        pods: pods.to_vec(),
        repetitions: args.repetitions,
        succeeded: args.succeeded,
        rows: args.rows.iter().map(|r| r.name().to_owned()).collect(),
        runs: runs.to_vec(),
        summary,
        done_seen: WATCHED.into(),
    };
    save(&results, out)?;
    Ok(results.summary)
}

fn save(results: &Results, out: &str) -> anyhow::Result<()> {
    let dir = results_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(format!("{out}.json")),
        serde_json::to_string_pretty(results)? + "\n",
    )?;
    std::fs::write(dir.join(format!("{out}.md")), markdown(results, out))?;
    match chart::draw(&results.summary, &dir.join(format!("{out}.png"))) {
        Ok(()) => {}
        Err(e) => eprintln!("no chart: {e:#}"),
    }
    Ok(())
}

/// Where results are written and committed.
fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(RESULTS)
}

/// The results in `dir` whose name starts with `prefix`: (name without `.json`, JSON path).
fn committed(dir: &Path, prefix: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if let Some(out) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
            .filter(|n| n.starts_with(prefix))
        {
            found.push((out.to_owned(), path));
        }
    }
    Ok(found)
}

/// Under `cargo test` (the tests run every target; `scale::check_committed` beside it): each
/// committed `retry*.json` holds the summary of its own runs, and its `.md` is that summary
/// rendered. A change to the summary or the table that leaves them stale fails here;
/// `--render FILE.json --out NAME` renders them again. Returns how many were checked.
fn check_committed() -> anyhow::Result<usize> {
    let dir = results_dir();
    let mut checked = 0;
    for (out, path) in committed(&dir, "retry")? {
        let text = std::fs::read_to_string(&path)?;
        let mut results: Results =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let again = |what: &str| {
            format!(
                "{} is stale: its {what}; run `cargo bench --features testenv --bench retry -- --render {RESULTS}/{out}.json --out {out}`",
                path.display()
            )
        };
        let md = dir.join(format!("{out}.md"));
        let rendered =
            std::fs::read_to_string(&md).with_context(|| format!("reading {}", md.display()))?;
        ensure!(
            rendered == markdown(&results, &out),
            again("table is not its summary rendered")
        );
        // To the table's precision: the runs' floats were rounded when they were saved.
        results.summary = summarize(&results.runs, &results.pods);
        ensure!(
            rendered == markdown(&results, &out),
            again("summary is not that of its runs")
        );
        checked += 1;
    }
    Ok(checked)
}

fn markdown(results: &Results, out: &str) -> String {
    let mut md = format!(
        "# Retry benchmark: {out}\n\n`{}`\n\nFrom {} to {} on {} CPUs; medians over each row's runs (with min–max); N failed pods + {} succeeded ones, which must stay.\n\n",
        results.command, results.started, results.finished, results.cpus, results.succeeded
    );
    md.push_str(&report::markdown(&results.summary));
    md.push_str(&format!(
        "\nwall: request to job done as the client saw it (rewind: annotation or WorkflowRetry written → done seen, {}; peer: its own call → return; floor: the request's round trip). audit: the same from the API server's audit log, with its steps. CPU: rewind's over the retry, the peer's whole process. Neighbour: another user sending GET pod / LIST workflows / PATCH ConfigMap, 20 a second.\n",
        results.done_seen
    ));
    let order: Vec<&str> = Row::ALL.iter().map(|r| r.name()).collect();
    if let Some(table) = batch_report::markdown(&results.runs, &order, &peer_of) {
        md.push_str("\n## Batches\n\n");
        md.push_str(&table);
        md.push_str("\nN (above) is the batch's failed pods in all; each workflow also has the succeeded pods, which must stay. rewind-batch: `rewind retry -l team=ml` (one request per workflow, one token: one asker), the controller at qps 20 / burst 30; wall from the command's start until every workflow's reset is seen on a watch; command returned: when the command itself returned (it polls every workflow's status). peer-batch: Argo's `argo retry -l team=ml` through an Argo Server (the server's ListWorkflows, then its RetryWorkflow one workflow after another), each call with clients of its own at 20/30 (one for pods, one for workflows), as the Argo Server gives every call in its default auth mode (client); wall and command returned are its loop's time. speed-up: the peer's wall over the row's. small retry: a second user (another identity and token: another asker) asks, \"asked at\" seconds after the batch command started, for the retry of a workflow of \"pods\" failed pods in the same namespace; request → reset from its patch sent to its reset seen on a watch, audit s from its patch received to the controller's write of the reset workflow answered. The main table's steps and requests are the controller's for the batch: its requests naming the second user's workflow are left out (its pod list and DeleteCollection name none and are counted). busiest second: the retrier's most requests received within one second (audit log, watches left out), mutating ones (what rewind's write bucket pays for: at 20/30 at most 50 a second) and all (what client-go's limiters, Argo's budget, pay for: 50 a second per client at most, and each call has new ones). command CPU and peak RSS: rewind's CLI process (the main table's CPU and peak RSS are the controller's and the peer's).\n");
    }
    if let Some(table) = report::neighbour_markdown(&results.summary) {
        md.push_str("\n## Where the neighbour's time goes\n\n");
        md.push_str(&table);
        md.push_str("\nEach cell idle → during, medians over the runs that measured it. seen: the neighbour's p99 by kind of request, as it timed them. served: the same requests from the audit log, received → answered, so without the neighbour's own side (its process waiting for a CPU, the network). LIST's wait for the cache: the API server's own histogram (apiserver_watch_cache_read_wait_seconds) of how long consistent LISTs of workflows waited for its watch cache to reach etcd's current revision, which the retry's deletes move on; p99 is the upper bound of the bucket holding it. CPUs busy: the share of all the machine's CPUs in use, whoever used them. cores: what each process used on average during the retry (1.00 is one core); bench is the benchmark's process, which runs the neighbour, watches the workflow and sends the floor's request (the peer, a process of its own, shows only in CPUs busy).\n");
    }
    md
}

fn render(args: &Args) -> anyhow::Result<()> {
    let mut merged: Option<Results> = None;
    for path in &args.render {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: Results =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        merged = Some(match merged {
            None => r,
            Some(mut m) => {
                m.command = format!("{}; {}", m.command, r.command);
                m.pods.extend(r.pods);
                m.runs.extend(r.runs);
                if !m.done_seen.contains(&r.done_seen) {
                    m.done_seen = format!("{}, or {}", m.done_seen, r.done_seen);
                }
                // Saved runs may be merged in any order: the span is the earliest start
                // to the latest finish.
                let at = |t: &str| t.parse::<Timestamp>().ok();
                if at(&r.started) < at(&m.started) {
                    m.started = r.started;
                }
                if at(&r.finished) > at(&m.finished) {
                    m.finished = r.finished;
                }
                m
            }
        });
    }
    let mut results = merged.context("--render needs at least one file")?;
    results.pods.sort_unstable();
    results.pods.dedup();
    results.summary = summarize(&results.runs, &results.pods);
    let out = args.out.clone().context("--render needs --out")?;
    save(&results, &out)?;
    println!("{}", report::markdown(&results.summary));
    Ok(())
}

/// One run of `row` on a fresh control plane.
async fn measure(context: &Context, row: Row, pods: usize, rep: usize) -> anyhow::Result<Measured> {
    let cluster = LocalCluster::start(Options {
        audit: true,
        // One audit log however long the run (a batch's is hundreds of megabytes): the API
        // server would start a new file past 100 MB, and only the current one is read.
        extra_apiserver_args: vec!["--audit-log-maxsize=10000".into()],
        ..Options::default()
    })
    .await
    .context("starting a local control plane")?;
    let result = measure_on(&cluster, context, row, pods, rep).await;
    if std::env::var_os(KEEP_AUDIT).is_some()
        && let Some(audit) = cluster.audit_log_path()
    {
        let kept = context
            .logs
            .join(format!("{}-{pods}-{}-audit.log", row.name(), rep + 1));
        if let Err(e) = std::fs::copy(&audit, &kept) {
            eprintln!("keeping the audit log as {}: {e}", kept.display());
        }
    }
    cluster
        .stop()
        .await
        .context("stopping the local control plane")?;
    result
}

/// What a row retries, created before the retrier starts.
enum Workload {
    /// The workflow of `--pods` (the module docs say how each row stores it).
    One {
        /// As created, its nodes in it.
        original: Workflow,
        /// Argo's ConfigMap NAMESPACE/NAME where the row needs its persistence, else empty.
        configmap: String,
        /// The archived workflow's UID, for archived rows.
        archived_uid: Option<String>,
    },
    /// The batch rows' workflows (batch.rs).
    Batch(batch::Prepared),
}

/// Creates the workflow of `--pods` as `row` retries it.
async fn one(
    cluster: &LocalCluster,
    context: &Context,
    row: Row,
    pods: usize,
) -> anyhow::Result<Workload> {
    let admin = cluster.admin_client();
    let dag = dag(pods, context.succeeded);
    let workflow = dag.workflow(NAMESPACE);
    let mut configmap = String::new();
    let offload = offloaded(&workflow)?;
    // Argo's persistence as the row needs it: offloading above the size limit (the workflow
    // an archived retry creates is as large, so offloaded too), the archive for archived rows.
    if offload || row.archived() {
        let (db, _) = context
            .db
            .as_ref()
            .context("offloaded nodes and archived rows need the database")?;
        let persistence = argo::Persistence {
            database: db.argo_db_config(),
            archive: row.archived(),
            offload,
        };
        let name = argo::install_config(cluster, None, Some(&persistence)).await?;
        configmap = format!("{}/{name}", argo::CONTROLLER_NAMESPACE);
    }
    let original = match (offload, &context.db) {
        (true, Some((db, code))) => create_offloaded(&admin, db, code, &dag, workflow).await?,
        _ => hydrated(
            dag.create(&admin, NAMESPACE, 64, || ())
                .await
                .context("creating the workflow and its pods")?,
        )?,
    };
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut archived_uid = None;
    if let (true, Some((db, code))) = (row.archived(), &context.db) {
        // What Argo's controller does when it archives a workflow: hydrate (from the offload
        // table, when offloaded), ArchiveWorkflow.
        let hydrated = match offload {
            true => original.clone(),
            false => hydrated(workflows.get(WORKFLOW).await?)?,
        };
        let uid = hydrated.uid().context("a created workflow has a UID")?;
        let archive = db.archive_request(&hydrated);
        let code = code.clone();
        tokio::task::spawn_blocking(move || code.one(archive)).await??;
        ensure!(
            delete_workflow(&workflows, WORKFLOW, Duration::from_secs(60)).await?,
            "workflow {WORKFLOW} was not deleted within a minute"
        );
        archived_uid = Some(uid);
    }
    Ok(Workload::One {
        original,
        configmap,
        archived_uid,
    })
}

async fn measure_on(
    cluster: &LocalCluster,
    context: &Context,
    row: Row,
    pods: usize,
    rep: usize,
) -> anyhow::Result<Measured> {
    cluster.create_namespace(NAMESPACE).await?;
    neighbours::prepare(cluster).await?;
    let workload = match row.batch() {
        true => Workload::Batch(batch::prepare(cluster, context).await?),
        false => one(cluster, context, row, pods).await?,
    };
    let configmap = match &workload {
        Workload::One { configmap, .. } => configmap.as_str(),
        Workload::Batch(_) => "",
    };

    // The retrier ready (rewind started and synced) before the idle baseline, so the
    // baseline includes its watches.
    let controller = match row.rewind_flags() {
        None => None,
        Some(flags) => {
            let mut args: Vec<String> = ["--namespace", NAMESPACE, "--argo-configmap", configmap]
                .map(String::from)
                .to_vec();
            args.extend(flags.iter().map(|f| f.to_string()));
            let log = context
                .logs
                .join(format!("{}-{pods}-{}.log", row.name(), rep + 1));
            Some(
                RewindController::start(
                    &context.rewind,
                    cluster,
                    &args,
                    log,
                    Duration::from_secs(120),
                )
                .await?,
            )
        }
    };
    // Who keeps the CPUs busy while the neighbour waits: the control plane, rewind, and this
    // process (the neighbour itself, the watch on the workflow, the floor's request).
    let mut processes: Vec<(String, u32)> = cluster
        .pids()
        .into_iter()
        .map(|(component, pid)| (component.to_string(), pid))
        .collect();
    processes.push(("bench".into(), std::process::id()));
    if let Some(controller) = &controller {
        processes.push(("rewind".into(), controller.pid()));
    }
    let observe = neighbours::Observe {
        processes,
        metrics: Some(cluster.admin_client()),
    };
    let mut idle = neighbours::idle(cluster.user_client(), context.idle, &observe).await;

    let neighbour = Neighbour::start(cluster.user_client(), &observe).await;
    let before = controller
        .as_ref()
        .map(RewindController::usage)
        .transpose()?;
    let asked_at = Timestamp::now();
    let retried = match &workload {
        Workload::One { archived_uid, .. } => retry(
            cluster,
            context,
            row,
            pods,
            configmap,
            archived_uid.as_deref(),
        )
        .await
        .map(|(wall, usage, request_uid)| (wall, usage, request_uid, None)),
        Workload::Batch(prepared) => batch::retry(cluster, context, row, prepared)
            .await
            .map(|(wall, usage, ran)| (wall, usage, None, Some(ran))),
    };
    let mut during = neighbour.finish().await;
    let after = controller
        .as_ref()
        .map(RewindController::usage)
        .transpose()?;
    if let Some(controller) = controller {
        controller.stop()?;
    }
    let (wall, peer_usage, request_uid, ran) = retried?;
    let usage = match (before, after) {
        (Some(b), Some(a)) => Some(Usage {
            cpu_seconds: a.cpu_seconds - b.cpu_seconds,
            peak_rss_bytes: a.peak_rss_bytes,
        }),
        _ => peer_usage,
    };

    match &workload {
        Workload::One {
            original,
            archived_uid,
            ..
        } => {
            check(
                cluster,
                row,
                WORKFLOW,
                pods,
                context.succeeded,
                archived_uid.as_deref(),
                request_uid.as_deref(),
            )
            .await?;
            if row.rewind_flags().is_some() && !row.archived() {
                let workflows = Api::namespaced(cluster.admin_client(), NAMESPACE);
                check_reset(context, &workflows, original, asked_at).await?;
            }
        }
        Workload::Batch(prepared) => {
            batch::check(cluster, context, row, prepared, asked_at).await?
        }
    }

    let log = audit::read(
        &cluster
            .audit_log_path()
            .context("the control plane audits")?,
    )?;
    let actor = match row.rewind_flags() {
        Some(_) => CONTROLLER_NAME,
        None => ADMIN_NAME,
    };
    let retrier: Vec<&Audited> = log
        .iter()
        .filter(|a| a.user == actor && a.received >= asked_at)
        .collect();
    let ours: Vec<&Audited> = retrier
        .iter()
        .copied()
        .filter(|a| !(row.batch() && batch::second_users(a)))
        .collect();
    let asked = match row.rewind_flags() {
        // The user's request: the annotation, or the WorkflowRetry created.
        Some(_) => {
            log.iter()
                .find(|a| {
                    a.user == ADMIN_NAME
                        && a.received >= asked_at
                        && matches!(
                            (a.verb.as_str(), a.resource.as_str()),
                            ("patch", "workflows") | ("create", "workflowretries")
                        )
                })
                .context("the audit log has no retry request")?
                .received
        }
        None => {
            ours.first()
                .context("the audit log has no request of the peer")?
                .received
        }
    };
    let (steps, within) = audit::steps(&ours, asked)
        .context("the audit log shows no delete and no workflow written")?;
    idle.serve_from(&log);
    during.serve_from(&log);
    let batch = ran.map(|ran| ran.measured(&retrier, &log, context.batch.shape));
    Ok(Measured {
        row: row.name().into(),
        pods,
        repetition: rep,
        wall_seconds: wall,
        steps,
        requests: audit::by_verb(within),
        usage,
        neighbour_idle: idle,
        neighbour_during: during,
        batch,
    })
}

/// Sends the row's retry and waits until it is done; returns the wall seconds, the peer's
/// usage, and the WorkflowRetry's UID (archived rewind).
async fn retry(
    cluster: &LocalCluster,
    context: &Context,
    row: Row,
    pods: usize,
    configmap: &str,
    archived_uid: Option<&str>,
) -> anyhow::Result<(f64, Option<Usage>, Option<String>)> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
    match row {
        Row::Floor => {
            // rewind's own bulk request: its selectors and a metadata-only answer.
            let (labels, fields) = bulk_selectors(WORKFLOW);
            let started = Instant::now();
            let n = delete_collection(&admin, NAMESPACE, &labels, &fields).await?;
            let wall = started.elapsed().as_secs_f64();
            ensure!(
                n == pods,
                "the raw DeleteCollection deleted {n} pods, expected {pods}"
            );
            Ok((wall, None, None))
        }
        Row::RewindBulk | Row::RewindPod20 | Row::RewindPod200 => {
            let token = "bench";
            let patch = json!({"metadata": {"annotations": {annotations::RETRY: token}}});
            let started = Instant::now();
            workflows
                .patch_metadata(WORKFLOW, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            // Seen on a watch: polling the workflow (a GET decodes the whole object, a
            // megabyte at 20,000 pods) every 50 ms slowed the DeleteCollection it measured.
            let metadata = Api::<PartialObjectMeta<Workflow>>::namespaced(admin.clone(), NAMESPACE);
            let done = move |meta: Option<&PartialObjectMeta<Workflow>>| {
                meta.is_some_and(|m| {
                    request::status_of(m.annotations(), token)
                        .map_or(true, |s| s.is_some_and(|s| s.phase.is_finished()))
                })
            };
            let meta = within_finish(await_condition(metadata, WORKFLOW, done)).await?;
            let status = request::status_of(meta.annotations(), token)?
                .context("a finished retry has a status")?;
            let wall = started.elapsed().as_secs_f64();
            ensure!(
                status.phase == RetryPhase::Succeeded,
                "the retry failed: {}",
                status.message
            );
            Ok((wall, None, None))
        }
        Row::RewindArchived => {
            let uid = archived_uid.context("an archived row has a UID")?;
            let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), NAMESPACE);
            let request = WorkflowRetry::new(
                REQUEST,
                WorkflowRetrySpec {
                    archived_workflow_uid: Some(uid.to_owned()),
                    ..Default::default()
                },
            );
            let started = Instant::now();
            let created = retries.create(&PostParams::default(), &request).await?;
            let done = |r: Option<&WorkflowRetry>| r.is_some_and(WorkflowRetry::is_finished);
            let status = within_finish(await_condition(retries.clone(), REQUEST, done))
                .await?
                .status
                .unwrap_or_default();
            let wall = started.elapsed().as_secs_f64();
            ensure!(
                status.phase == Some(RetryPhase::Succeeded),
                "the archived retry failed: {}",
                status.message
            );
            Ok((wall, None, created.uid()))
        }
        Row::Peer | Row::ArgoCli | Row::PeerArchived => {
            let mut target = match archived_uid {
                Some(uid) => vec!["retry-archived", "--uid", uid, "--configmap", configmap],
                None => vec!["retry", "--name", WORKFLOW],
            };
            if archived_uid.is_none() && !configmap.is_empty() {
                // Offloaded nodes: the Argo Server reads them with its persistence.
                target.extend(["--configmap", configmap]);
            }
            let (seconds, usage) = run_peer(cluster, context, row, &target).await?;
            Ok((seconds, Some(usage), None))
        }
        Row::RewindBatch | Row::PeerBatch => bail!("{row} retries a batch (batch.rs)"),
    }
}

/// Runs the peer (Argo's own retry code) as the admin, `target` its command and what it
/// retries, at `row`'s budget; returns the seconds it timed its retry, and its usage.
async fn run_peer(
    cluster: &LocalCluster,
    context: &Context,
    row: Row,
    target: &[&str],
) -> anyhow::Result<(f64, Usage)> {
    let (qps, burst) = row.peer_budget().context("a peer row has a budget")?;
    let mut command = Command::new(&context.peer);
    command
        .args(target)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path(Role::Admin))
        .args(["--namespace", NAMESPACE])
        .args(["--qps", &qps.to_string(), "--burst", &burst.to_string()]);
    let finished = tokio::task::spawn_blocking(move || run_measured(command)).await??;
    ensure!(
        finished.success,
        "the peer failed ({}): {}",
        finished.status,
        finished.stderr
    );
    let said: Value = serde_json::from_str(finished.stdout.trim())
        .with_context(|| format!("the peer's answer {:?}", finished.stdout))?;
    let seconds = said["seconds"]
        .as_f64()
        .context("the peer's answer has no seconds")?;
    Ok((seconds, finished.usage))
}

/// The job done on workflow `name` of `pods` failed pods: exactly the succeeded pods left,
/// and the workflow reset (live) or created anew (archived; by the WorkflowRetry
/// `request_uid` where rewind did it).
async fn check(
    cluster: &LocalCluster,
    row: Row,
    name: &str,
    pods: usize,
    succeeded: usize,
    archived_uid: Option<&str>,
    request_uid: Option<&str>,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let left = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&format!("{}={name}", labels::WORKFLOW)))
        .await?
        .items;
    let kept = left
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
        .count();
    ensure!(
        left.len() == succeeded && kept == succeeded,
        "{} on {name}: expected exactly the {succeeded} succeeded pods of {} to remain, found {} ({kept} succeeded)",
        row.name(),
        pods + succeeded,
        left.len()
    );
    if row == Row::Floor {
        return Ok(());
    }
    let wf = Api::<Workflow>::namespaced(admin, NAMESPACE)
        .get_opt(name)
        .await?
        .with_context(|| format!("{}: workflow {name} is not there", row.name()))?;
    match archived_uid {
        None => ensure!(
            wf.label(labels::COMPLETED).is_none(),
            "{}: workflow {name} was not reset",
            row.name()
        ),
        Some(old) => {
            ensure!(
                wf.uid().as_deref() != Some(old),
                "{}: the workflow was not created anew",
                row.name()
            );
            if let Some(request) = request_uid {
                ensure!(
                    wf.annotation(CREATED_BY) == Some(request),
                    "{}: the workflow was not created by the WorkflowRetry",
                    row.name()
                );
            }
        }
    }
    Ok(())
}

/// The object `wait` waited for, within [`FINISH`].
async fn within_finish<K>(
    wait: impl Future<Output = Result<Option<K>, kube::runtime::wait::Error>>,
) -> anyhow::Result<K> {
    tokio::time::timeout(FINISH, wait)
        .await
        .with_context(|| format!("the retry did not finish within {FINISH:?}"))??
        .context("the object was deleted before the retry finished")
}

fn dag(failed: usize, succeeded: usize) -> FailedDag {
    FailedDag {
        name: WORKFLOW.into(),
        failed,
        succeeded,
    }
}

/// Whether Argo's controller would have offloaded the workflow's nodes: over its size limit
/// even compressed ([`FailedDag::workflow`] leaves the nodes uncompressed then). The API
/// server would refuse such a workflow whole (413 at 20,000 pods).
fn offloaded(workflow: &Workflow) -> anyhow::Result<bool> {
    Ok(workflow.status.nodes.is_some()
        && serde_json::to_vec(workflow)?.len() > DEFAULT_MAX_WORKFLOW_SIZE)
}

/// Creates `workflow` and its pods as Argo's controller leaves them with node status
/// offloading on: the nodes in Argo's table (its own `Save`), the workflow naming their
/// version. Returns the workflow with its nodes in it.
async fn create_offloaded(
    admin: &kube::Client,
    db: &DbServer,
    code: &ArgosCode,
    dag: &FailedDag,
    mut workflow: Workflow,
) -> anyhow::Result<Workflow> {
    let nodes = workflow
        .status
        .nodes
        .take()
        .context("the workflow has nodes")?;
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
    let created = workflows
        .create(&PostParams::default(), &workflow)
        .await
        .context("creating the workflow without its nodes")?;
    let uid = created.uid().context("a created workflow has a UID")?;
    let save = db.argodb_request(
        "save",
        json!({"uid": uid, "namespace": NAMESPACE, "nodes": nodes}),
    );
    let code = code.clone();
    let version = tokio::task::spawn_blocking(move || code.one(save))
        .await??
        .version;
    let patch = json!({"status": {"offloadNodeStatusVersion": version}});
    let created = workflows
        .patch(WORKFLOW, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("naming the offloaded nodes' version")?;
    dag.create_pods_on(admin, &created, &[], 64, || ())
        .await
        .context("creating the pods")?;
    let mut full = created;
    full.status.nodes = Some(nodes);
    full.status.offload_node_status_version = None;
    Ok(full)
}

/// The workflow as rewind reset it equals the planner's retry of `before` (rewind's planner
/// is differential-tested against Argo's code), its nodes read back from Argo's table where
/// the reset offloaded them.
async fn check_reset(
    context: &Context,
    workflows: &Api<Workflow>,
    before: &Workflow,
    asked_at: Timestamp,
) -> anyhow::Result<()> {
    let options = RetryOptions {
        // Compressed or offloaded is how it is stored; the nodes are compared.
        max_workflow_size: usize::MAX,
        ..RetryOptions::default()
    };
    let now = NOW.parse().context("a valid timestamp")?;
    let expected = plan_retry_at(before, &options, now)?.workflow;
    let mut actual = hydrated(workflows.get(&before.name_any()).await?)?;
    if let Some(version) = actual.status.offload_node_status_version.take() {
        let (db, code) = context
            .db
            .as_ref()
            .context("offloaded nodes need the database")?;
        let get = db.argodb_request("get", json!({"uid": actual.uid(), "version": version}));
        let code = code.clone();
        let read = tokio::task::spawn_blocking(move || code.one(get)).await??;
        actual.status.nodes = Some(serde_json::from_str(&read.json)?);
    }
    let differences = differences(
        serde_json::to_value(&actual)?,
        serde_json::to_value(&expected)?,
        asked_at - SignedDuration::from_secs(1),
        Timestamp::now(),
    );
    ensure!(
        differences.is_empty(),
        "the reset workflow is not the planner's: {differences:#?}"
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Some((mut args, command)) = cli::parse::<Args>("retry") else {
        let checked = check_committed()? + scale::check_committed()?;
        println!(
            "retry is a benchmark: cargo bench --features testenv --bench retry -- --pods 1000 (see benches/retry/main.rs); the {checked} committed results in {RESULTS} match their runs"
        );
        return Ok(());
    };
    args.command = command;
    cli::init_logging();
    if !args.render.is_empty() {
        return render(&args);
    }
    tokio::runtime::Runtime::new()?.block_on(bench(args))
}
