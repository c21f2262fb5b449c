//! Argo's retry call, timed from call to answer, on one control plane per size: the same
//! failed workflow (N failed pods + N/10 succeeded ones, which must stay) retried by
//!
//! - `rewind-api`: the real `argo` CLI v4.1.4 (`argo retry NAME`, `ARGO_HTTP1=true`) through
//!   nginx routing as the chart's Ingress to the real `rewind controller` binary's Argo API
//!   (TLS, client auth mode: a TokenReview and two SubjectAccessReviews per call);
//! - `argo-server`: the same CLI call to a real `argo server` v4.1.4 alone, which deletes
//!   the pods itself (client mode, its default client budget 20/30);
//! - `rewind-annotation`: the reference, rewind's own path: the annotation written → its
//!   Succeeded status seen (polled every 20 ms), with the same controller.
//!
//! Every call runs as the same ServiceAccount token. Rows alternate their order over the
//! repetitions; each run gets a fresh namespace. A run is checked: the failed pods gone,
//! the succeeded ones kept, the workflow reset.
//!
//!     cargo bench --features testenv --bench argo_api -- --pods 100,8000 --repetitions 3 [--rows rewind-api,argo-server] [--out NAME]
//!
//! Writes bench/results/NAME.json (every run and the medians) and NAME.md (the table).
//! Under `cargo test` it checks that each committed argo-api*.md is its JSON rendered.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};

use rewind::argo::workflow::{Workflow, labels};
use rewind::protocol::request::{self, RetryPhase, annotations};
use rewind::testenv::bench::child::RewindController;
use rewind::testenv::bench::stats::Summary;
use rewind::testenv::bench::{caller, cli};
use rewind::testenv::clients::{ArgoServer, Router};
use rewind::testenv::free_port;
use rewind::testenv::localcluster::{LocalCluster, Options};
use rewind::testenv::workload::FailedDag;

const RESULTS: &str = "bench/results";
const PREFIX: &str = "argo-api";
const WORKFLOW: &str = "big";
const FINISH: Duration = Duration::from_secs(3 * 3600);
const ACCOUNT: &str = "retrier";
const ACCOUNT_NAMESPACE: &str = "default";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Row {
    RewindApi,
    ArgoServer,
    RewindAnnotation,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::RewindApi => "rewind-api",
            Row::ArgoServer => "argo-server",
            Row::RewindAnnotation => "rewind-annotation",
        }
    }
}

#[derive(clap::Parser)]
#[command(about = "Argo's retry call through rewind's Argo API and through Argo's server alone")]
struct Args {
    /// Failed pods per workflow (comma-separated sizes; one control plane each).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    pods: Vec<usize>,
    /// Runs per row and size.
    #[arg(long, value_parser = cli::at_least_one, default_value = "3")]
    repetitions: usize,
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Row::RewindApi, Row::ArgoServer, Row::RewindAnnotation])]
    rows: Vec<Row>,
    /// Results file name under bench/results (without extension).
    #[arg(long, default_value = PREFIX)]
    out: String,
    #[arg(skip)]
    command: String,
}

/// One timed retry.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Run {
    pods: usize,
    row: String,
    repetition: usize,
    /// Call to answer (the CLI's process, start to exit; the annotation: patch to Succeeded seen).
    seconds: f64,
}

/// The medians of one row at one size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RowSummary {
    pods: usize,
    row: String,
    seconds: Summary,
}

#[derive(Serialize, Deserialize)]
struct Results {
    command: String,
    started: String,
    finished: String,
    cpus: usize,
    runs: Vec<Run>,
    summary: Vec<RowSummary>,
}

fn summarize(runs: &[Run]) -> Vec<RowSummary> {
    let mut by: BTreeMap<(usize, String), Vec<f64>> = BTreeMap::new();
    for run in runs {
        by.entry((run.pods, run.row.clone()))
            .or_default()
            .push(run.seconds);
    }
    by.into_iter()
        .filter_map(|((pods, row), values)| {
            Some(RowSummary {
                pods,
                row,
                seconds: Summary::of(values)?,
            })
        })
        .collect()
}

fn markdown(results: &Results, out: &str) -> String {
    let mut md = format!(
        "# Argo's retry call: {out}\n\n`{}`\n\nFrom {} to {} on {} CPUs; medians (min–max) over each row's runs; N failed pods + N/10 succeeded ones, which must stay.\n\n| pods | row | call to answer, s | runs | vs rewind-annotation |\n|---:|---|---:|---:|---:|\n",
        results.command, results.started, results.finished, results.cpus
    );
    for s in &results.summary {
        let reference = results
            .summary
            .iter()
            .find(|r| r.pods == s.pods && r.row == Row::RewindAnnotation.name())
            .map_or_else(
                || "–".to_owned(),
                |r| format!("{:.2}×", s.seconds.median / r.seconds.median),
            );
        md.push_str(&format!(
            "| {} | {} | {:.2} ({:.2}–{:.2}) | {} | {} |\n",
            s.pods, s.row, s.seconds.median, s.seconds.min, s.seconds.max, s.seconds.n, reference
        ));
    }
    md.push_str("\nrewind-api: `argo retry` (the real CLI v4.1.4, its process start to exit) through nginx routing as the chart's Ingress to rewind's Argo API over TLS; it answers once the retry ended, as Argo's call does. argo-server: the same call to a real `argo server` v4.1.4, which deletes the pods one request each at its 20/30 client budget. rewind-annotation: rewind's own path, the annotation written to the Succeeded status seen (polled every 20 ms), the reference for the API's overhead.\n");
    md
}

fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(RESULTS)
}

fn save(results: &Results, out: &str) -> anyhow::Result<()> {
    let dir = results_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(format!("{out}.json")),
        serde_json::to_string_pretty(results)? + "\n",
    )?;
    std::fs::write(dir.join(format!("{out}.md")), markdown(results, out))?;
    Ok(())
}

/// Under `cargo test`: each committed argo-api*.json's summary is that of its runs, and its
/// .md is it rendered.
fn check_committed() -> anyhow::Result<usize> {
    let dir = results_dir();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(out) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
            .filter(|n| n.starts_with(PREFIX))
        else {
            continue;
        };
        let results: Results = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let stale = format!(
            "{} is stale: rerun the benchmark (its command is in the file)",
            path.display()
        );
        ensure!(
            results.summary == summarize(&results.runs),
            "{stale}: its summary is not that of its runs"
        );
        let md = std::fs::read_to_string(dir.join(format!("{out}.md")))?;
        ensure!(
            md == markdown(&results, out),
            "{stale}: its table is not its summary rendered"
        );
        checked += 1;
    }
    Ok(checked)
}

/// Everything one control plane runs for the rows.
struct Plane {
    cluster: LocalCluster,
    rewind: RewindController,
    router: Router,
    argo_server: ArgoServer,
    argo: PathBuf,
    token: String,
    _dir: tempfile::TempDir,
}

async fn plane(rewind_bin: &Path, argo: &Path) -> anyhow::Result<Plane> {
    let cluster = LocalCluster::start(Options::default()).await?;
    let admin = cluster.admin_client();
    let token = caller::token(&admin, ACCOUNT_NAMESPACE, ACCOUNT, FINISH).await?;
    let dir = tempfile::tempdir()?;
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])?;
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, cert.cert.pem())?;
    std::fs::write(&key, cert.signing_key.serialize_pem())?;
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let args: Vec<String> = vec![
        "--argo-configmap=".into(),
        format!("--argo-api-addr={api}"),
        "--argo-api-plaintext=false".into(),
        format!("--argo-api-tls-cert={}", crt.display()),
        format!("--argo-api-tls-key={}", key.display()),
    ];
    let rewind = RewindController::start(
        rewind_bin,
        &cluster,
        &args,
        dir.path().join("rewind.log"),
        Duration::from_secs(60),
    )
    .await?;
    // The argo server reads its configuration from a ConfigMap in its namespace and stops
    // without one; Argo's defaults (no archive) are what this bench needs.
    cluster.create_namespace("argo").await?;
    Api::<ConfigMap>::namespaced(admin.clone(), "argo")
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("workflow-controller-configmap".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
    let argo_server =
        ArgoServer::start(&cluster, argo, "argo/workflow-controller-configmap").await?;
    let router = Router::start(api, true, argo_server.addr).await?;
    Ok(Plane {
        cluster,
        rewind,
        router,
        argo_server,
        argo: argo.to_owned(),
        token,
        _dir: dir,
    })
}

impl Plane {
    async fn stop(self) -> anyhow::Result<()> {
        self.router.stop().await?;
        self.argo_server.stop().await?;
        self.rewind.stop()?;
        self.cluster.stop().await?;
        Ok(())
    }

    /// `argo retry NAME -n NAMESPACE` against `server`; its wall time.
    async fn argo_retry(&self, server: SocketAddr, namespace: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let output = tokio::process::Command::new(&self.argo)
            .args(["retry", WORKFLOW, "-n", namespace])
            .env_clear()
            .env("HOME", std::env::temp_dir())
            .env("ARGO_SERVER", server.to_string())
            .env("ARGO_HTTP1", "true")
            .env("ARGO_SECURE", "false")
            .env("ARGO_TOKEN", format!("Bearer {}", self.token))
            .kill_on_drop(true)
            .output()
            .await?;
        let took = started.elapsed();
        ensure!(
            output.status.success(),
            "argo retry via {server} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(took)
    }

    /// The annotation written, then the Succeeded status seen.
    async fn annotate(&self, namespace: &str) -> anyhow::Result<Duration> {
        let workflows: Api<Workflow> = Api::namespaced(self.cluster.admin_client(), namespace);
        let token = "bench-1";
        let patch = request::patch(token, &Default::default());
        let started = Instant::now();
        workflows
            .patch_metadata(WORKFLOW, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        loop {
            let meta = workflows.get_metadata(WORKFLOW).await?;
            let status = meta
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| request::status_of(a, token).ok().flatten());
            match status {
                Some(s) if s.phase == RetryPhase::Succeeded => return Ok(started.elapsed()),
                Some(s) if s.phase == RetryPhase::Failed => {
                    anyhow::bail!("the retry failed: {}", s.message)
                }
                _ => {}
            }
            ensure!(started.elapsed() < FINISH, "no end within {FINISH:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn run(&self, pods: usize, row: Row, repetition: usize) -> anyhow::Result<Run> {
        let namespace = format!("{}-{pods}-{repetition}", row.name());
        self.cluster.create_namespace(&namespace).await?;
        let admin = self.cluster.admin_client();
        let dag = FailedDag {
            name: WORKFLOW.into(),
            failed: pods,
            succeeded: pods / 10,
        };
        dag.create(&admin, &namespace, 64, || ()).await?;
        let took = match row {
            Row::RewindApi => self.argo_retry(self.router.addr, &namespace).await?,
            Row::ArgoServer => self.argo_retry(self.argo_server.addr, &namespace).await?,
            Row::RewindAnnotation => self.annotate(&namespace).await?,
        };
        // Checked: the failed pods gone, the succeeded kept, the workflow reset.
        let left = Api::<Pod>::namespaced(admin.clone(), &namespace)
            .list_metadata(
                &ListParams::default().labels(&format!("{}={WORKFLOW}", labels::WORKFLOW)),
            )
            .await?
            .items
            .len();
        ensure!(
            left == pods / 10,
            "{} at {pods}: {left} pods left, expected the {} succeeded ones",
            row.name(),
            pods / 10
        );
        let workflow = Api::<Workflow>::namespaced(admin, &namespace)
            .get(WORKFLOW)
            .await?;
        ensure!(
            workflow.status.phase.as_deref() != Some("Failed"),
            "{} at {pods}: the workflow was not reset",
            row.name()
        );
        if row != Row::ArgoServer {
            let observed = workflow.metadata.annotations.unwrap_or_default();
            ensure!(
                observed.contains_key(annotations::OBSERVED),
                "{} at {pods}: rewind did not record its request",
                row.name()
            );
        }
        println!(
            "  N={pods} rep {} {:18} {:8.3}s",
            repetition + 1,
            row.name(),
            took.as_secs_f64()
        );
        Ok(Run {
            pods,
            row: row.name().into(),
            repetition,
            seconds: took.as_secs_f64(),
        })
    }
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let rewind_bin = PathBuf::from(env!("CARGO_BIN_EXE_rewind"));
    let argo = tokio::task::spawn_blocking(|| rewind::testenv::argo::binary("cli")).await??;
    tokio::task::spawn_blocking(rewind::testenv::clients::hera_python).await??;
    let started = Timestamp::now();
    let mut runs = Vec::new();
    for &pods in &args.pods {
        let plane = plane(&rewind_bin, &argo).await?;
        let result = async {
            for repetition in 0..args.repetitions {
                let mut rows = args.rows.clone();
                // Alternating order: no row always runs first (or last) on the plane.
                if repetition % 2 == 1 {
                    rows.reverse();
                }
                for row in rows {
                    runs.push(plane.run(pods, row, repetition).await?);
                }
            }
            anyhow::Ok(())
        }
        .await;
        plane.stop().await?;
        result?;
        let results = Results {
            command: args.command.clone(),
            started: started.to_string(),
            finished: Timestamp::now().to_string(),
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            summary: summarize(&runs),
            runs: runs.clone(),
        };
        save(&results, &args.out)?;
    }
    print!(
        "{}",
        std::fs::read_to_string(results_dir().join(format!("{}.md", args.out)))?
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Some((mut args, command)) = cli::parse::<Args>("argo_api") else {
        let checked = check_committed()?;
        println!(
            "argo_api is a benchmark: cargo bench --features testenv --bench argo_api -- --pods 100 (see benches/argo_api.rs); the {checked} committed results in {RESULTS} match their runs"
        );
        return Ok(());
    };
    args.command = command;
    cli::init_logging();
    tokio::runtime::Runtime::new()?.block_on(bench(args))
}
