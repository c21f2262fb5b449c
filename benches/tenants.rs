//! Many tenants at once (`cargo bench --features testenv --bench tenants`): a busy cluster as
//! a platform team's would load rewind, beside a quiet namespace's retry.
//!
//! `--tenants` namespaces each create one WorkflowRetry a second for `--seconds`; one in
//! `--real-every` names a real failed workflow of 5 pods (namespace i's in the seconds where
//! second + i is a multiple of it, as independent tenants' would fall; with `--aligned`, every
//! namespace's in the same second, the worst case), the others a workflow that does not exist
//! (a typo, a stale name). With `--mix` the asks are in turn a WorkflowRetry, an annotation
//! (on a real workflow) and Argo's retry call through rewind's Argo API. A quiet namespace retries a workflow of `--quiet-pods` failed
//! pods by annotation: [`IDLE_ASKS`] times on the idle controller, [`DURING_ASKS`] times
//! evenly spaced during the load, and once as the load stops. The controller is the release binary with its defaults but for `--qps` and
//! `--burst` (and `--bulk-parallelism`, given), serving every namespace. Measured: each quiet retry from its ask to its end;
//! each real retry from its WorkflowRetry's creation to its end; how long after the load every
//! request had ended; the backlog (asked, not ended) and the controller's RSS each second; the
//! controller's writes in the API server's audit log (busiest second against qps + burst, by
//! verb). Written to bench/results/NAME.md, .json and .png (`--out NAME`, default tenants).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, PartialObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use rewind::argo::workflow::Workflow;
use rewind::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::{self, RetryPhase, annotations};
use rewind::testenv::bench::child::RewindController;
use rewind::testenv::bench::stats;
use rewind::testenv::bench::{audit, caller};
use rewind::testenv::free_port;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Options};
use rewind::testenv::workload::FailedDag;

#[path = "../tests/support/font.rs"]
mod font;

const RESULTS: &str = "bench/results";
const QUIET: &str = "quiet";

/// The quiet retries on the idle controller (their median is the idle time) and during the
/// load, at evenly spaced moments: one ask is luck, five show the spread.
const IDLE_ASKS: usize = 3;
const DURING_ASKS: usize = 5;
const REAL_PODS: usize = 5;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Args {
    tenants: usize,
    seconds: usize,
    real_every: usize,
    /// Every namespace asks its real retry in the same second (the worst case); otherwise
    /// namespace i asks in the seconds where (second + i) is a multiple of `real_every`.
    #[serde(default)]
    aligned: bool,
    /// The asks are a mix: WorkflowRetries, annotations (on real workflows) and Argo's retry
    /// call (through rewind's Argo API), in turn; otherwise WorkflowRetries only.
    #[serde(default)]
    mix: bool,
    quiet_pods: usize,
    qps: u32,
    burst: u32,
    read_qps: u32,
    read_burst: u32,
    /// The controller's `--bulk-parallelism`; above 1 every workflow's pods are spread over
    /// `NODES` nodes, so a bulk delete has parts to split into.
    #[serde(default = "one")]
    bulk_parallelism: usize,
    out: String,
}

fn one() -> usize {
    1
}

/// The nodes the pods ran on with `--bulk-parallelism` above 1 (as a node pool's might).
const NODES: usize = 8;

/// The flags `cargo bench` passes (with `--bench`); `None` when `cargo test` runs this
/// binary, which then only checks the committed results.
fn args() -> anyhow::Result<Option<Args>> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(None);
    }
    let mut args = Args {
        tenants: 100,
        seconds: 180,
        real_every: 10,
        aligned: false,
        mix: false,
        quiet_pods: 200,
        qps: 20,
        burst: 30,
        read_qps: 50,
        read_burst: 100,
        bulk_parallelism: 1,
        out: "tenants".into(),
    };
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--aligned" => args.aligned = true,
            "--mix" => args.mix = true,
            _ => {}
        }
        if flag == "--aligned" || flag == "--mix" {
            continue;
        }
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--tenants" => args.tenants = value()?.parse()?,
            "--seconds" => args.seconds = value()?.parse()?,
            "--real-every" => args.real_every = value()?.parse()?,
            "--quiet-pods" => args.quiet_pods = value()?.parse()?,
            "--qps" => args.qps = value()?.parse()?,
            "--burst" => args.burst = value()?.parse()?,
            "--read-qps" => args.read_qps = value()?.parse()?,
            "--read-burst" => args.read_burst = value()?.parse()?,
            "--bulk-parallelism" => args.bulk_parallelism = value()?.parse()?,
            "--out" => args.out = value()?,
            other => bail!(
                "unknown flag {other}; flags: --tenants --seconds --real-every --aligned --mix --quiet-pods --qps --burst --read-qps --read-burst --bulk-parallelism --out"
            ),
        }
    }
    ensure!(
        args.tenants > 0 && args.seconds > 0 && args.real_every > 0 && args.bulk_parallelism > 0,
        "counts must be positive"
    );
    Ok(Some(args))
}

/// A WorkflowRetry of the load: when it was created, when the watch saw it end, and
/// whether it names a real workflow.
struct Asked {
    created: Timestamp,
    ended: Option<Timestamp>,
    real: bool,
}

type Ends = Arc<Mutex<HashMap<String, Asked>>>;

/// What one second of the run saw.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Sample {
    second: f64,
    asked: usize,
    ended: usize,
    rss_mib: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Results {
    args: Args,
    date: String,
    /// Each quiet retry on the idle controller, then during the load, in order.
    quiet_idle_seconds: Vec<f64>,
    quiet_during_seconds: Vec<f64>,
    /// Each quiet retry as the API server saw it (idle, then during the load): where its
    /// time went.
    quiet_idle_steps: Vec<Option<audit::Steps>>,
    quiet_during_steps: Vec<Option<audit::Steps>>,
    quiet_after_seconds: f64,
    asked: usize,
    real_asked: usize,
    real_end_p50_seconds: f64,
    real_end_max_seconds: f64,
    /// From the load's last ask until every request had ended.
    drained_seconds: f64,
    peak_rss_mib: f64,
    idle_rss_mib: f64,
    writes_busiest_second: usize,
    writes_by_verb: BTreeMap<String, usize>,
    samples: Vec<Sample>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(args) = args()? else {
        check_committed()?;
        println!(
            "tenants is a benchmark: cargo bench --features testenv --bench tenants -- --tenants 100 --seconds 180 (see benches/tenants.rs); {RESULTS}/tenants.md matches its run"
        );
        return Ok(());
    };
    let cluster = LocalCluster::start(Options {
        audit: true,
        // Never rotated (the API server's default is at 100 MB): the busiest second and the
        // counts by verb need every write of the run.
        extra_apiserver_args: vec!["--audit-log-maxsize=1000000".into()],
        ..Options::default()
    })
    .await?;
    let admin = cluster.admin_client();
    let tenants: Vec<String> = (0..args.tenants)
        .map(|i| format!("tenant-{i:03}"))
        .collect();
    let reals = args.seconds.div_ceil(args.real_every);
    println!(
        "creating {} namespaces with {reals} failed workflows of {REAL_PODS} pods each",
        args.tenants
    );
    cluster.create_namespace(QUIET).await?;
    let nodes: Vec<String> = if args.bulk_parallelism > 1 {
        (0..NODES).map(|n| format!("node-{n}")).collect()
    } else {
        Vec::new()
    };
    futures::stream::iter(tenants.iter())
        .map(|tenant| {
            let (cluster, admin, nodes) = (&cluster, admin.clone(), &nodes);
            async move {
                cluster.create_namespace(tenant).await?;
                for r in 0..reals {
                    let real = FailedDag {
                        name: format!("real-{r}"),
                        failed: REAL_PODS,
                        succeeded: 1,
                    };
                    real.create_on(&admin, tenant, nodes, 6, || ()).await?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    let idle_names = (0..IDLE_ASKS).map(|i| format!("idle-{i}"));
    let during_names = (0..DURING_ASKS).map(|i| format!("during-{i}"));
    for name in idle_names.chain(during_names).chain(["after".to_owned()]) {
        let quiet = FailedDag {
            name,
            failed: args.quiet_pods,
            succeeded: 2,
        };
        quiet.create_on(&admin, QUIET, &nodes, 16, || ()).await?;
    }

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_rewind"));
    let log = std::env::temp_dir().join(format!("rewind-{}-controller.log", args.out));
    let argo_api = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut flags: Vec<String> = Vec::new();
    if args.mix {
        // Every call comes from this one address, as through one Argo Server: the limits
        // per address and of reviews are sized for the load, as `--qps` is (a call costs
        // three SubjectAccessReviews; a real one lasts a second or two).
        flags.extend([
            format!("--argo-api-addr={argo_api}"),
            "--argo-api-plaintext=true".into(),
            "--argo-api-review-qps=200".into(),
            "--argo-api-review-burst=300".into(),
            "--argo-api-reviews-per-source=128".into(),
            "--argo-api-max-calls-per-source=256".into(),
            "--argo-api-max-connections-per-source=256".into(),
        ]);
    }
    let controller = RewindController::start(
        &binary,
        &cluster,
        &[
            flags,
            vec![
                "--qps".into(),
                args.qps.to_string(),
                "--burst".into(),
                args.burst.to_string(),
                "--read-qps".into(),
                args.read_qps.to_string(),
                "--read-burst".into(),
                args.read_burst.to_string(),
                "--bulk-parallelism".into(),
                args.bulk_parallelism.to_string(),
                "--argo-configmap".into(),
                String::new(),
            ],
        ]
        .concat(),
        log.clone(),
        Duration::from_secs(60),
    )
    .await?;
    let rss = |c: &RewindController| {
        c.usage()
            .map(|u| u.peak_rss_bytes as f64 / (1024.0 * 1024.0))
            .unwrap_or(0.0)
    };
    let idle_rss_mib = current_rss_mib(controller.pid());
    let mut quiet_idle: Vec<(Timestamp, f64)> = Vec::new();
    for i in 0..IDLE_ASKS {
        quiet_idle.push(quiet_retry(&admin, &format!("idle-{i}")).await?);
    }
    let idle_seconds: Vec<f64> = quiet_idle.iter().map(|(_, s)| *s).collect();
    println!("quiet retries on an idle controller: {idle_seconds:.2?} s");

    // Every WorkflowRetry's end, as a watch of all namespaces sees it.
    let ends: Ends = Arc::default();
    let watching = {
        let (ends, api) = (ends.clone(), Api::<WorkflowRetry>::all(admin.clone()));
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                if let Ok(Event::Apply(o) | Event::InitApply(o)) = event {
                    // Those of the load's asks: not the ones rewind's Argo API creates.
                    if !o.name_any().starts_with("ask-") {
                        continue;
                    }
                    let status = o.status.clone().unwrap_or_default();
                    let ended = status
                        .phase
                        .is_some_and(RetryPhase::is_finished)
                        .then(Timestamp::now);
                    let real = o
                        .spec
                        .workflow_name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("real-"));
                    let created = o.creation_timestamp().map_or_else(Timestamp::now, |t| t.0);
                    let mut ends = ends.lock().unwrap();
                    let entry = ends.entry(o.uid().unwrap_or_default()).or_insert(Asked {
                        created,
                        ended: None,
                        real,
                    });
                    if entry.ended.is_none() {
                        entry.ended = ended;
                    }
                }
            }
        })
    };

    let start = Instant::now();
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let sampling = {
        let (ends, samples, pid) = (ends.clone(), samples.clone(), controller.pid());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let (asked, ended) = {
                    let ends = ends.lock().unwrap();
                    (
                        ends.len(),
                        ends.values().filter(|e| e.ended.is_some()).count(),
                    )
                };
                samples.lock().unwrap().push(Sample {
                    second: start.elapsed().as_secs_f64(),
                    asked,
                    ended,
                    rss_mib: current_rss_mib(pid),
                });
            }
        })
    };
    println!(
        "load: {} namespaces, one retry a second each, for {} s",
        args.tenants, args.seconds
    );
    let askers = Askers {
        admin: admin.clone(),
        argo: match args.mix {
            true => {
                let token =
                    caller::token(&admin, "default", "retrier", Duration::from_secs(3600)).await?;
                let client = kube::Client::try_from(kube::Config::new(
                    format!("http://{argo_api}").parse()?,
                ))?;
                Some((client, token))
            }
            false => None,
        },
        ends: ends.clone(),
        annotated: Arc::default(),
    };
    let following = tokio::spawn(askers.clone().follow_annotations());
    let load = {
        let (tenants, a) = (tenants.clone(), args.clone());
        tokio::spawn(async move { ask_every_second(askers, tenants, &a).await })
    };
    let load_start = Instant::now();
    let mut quiet_during: Vec<(Timestamp, f64)> = Vec::new();
    for i in 0..DURING_ASKS {
        let at =
            Duration::from_secs(args.seconds as u64) * (i as u32 + 1) / (DURING_ASKS as u32 + 1);
        tokio::time::sleep_until(load_start + at).await;
        quiet_during.push(quiet_retry(&admin, &format!("during-{i}")).await?);
    }
    let during_seconds: Vec<f64> = quiet_during.iter().map(|(_, s)| *s).collect();
    println!("quiet retries during the load: {during_seconds:.2?} s");
    let asked = load.await??;
    let load_end = start.elapsed();
    let (_, quiet_after) = quiet_retry(&admin, "after").await?;
    println!("quiet retry as the load stops: {quiet_after:.2} s");
    let deadline = Instant::now() + Duration::from_secs(900);
    let drained = loop {
        let (seen, open) = {
            let ends = ends.lock().unwrap();
            (
                ends.len(),
                ends.values().filter(|e| e.ended.is_none()).count(),
            )
        };
        if seen >= asked && open == 0 {
            break start.elapsed() - load_end;
        }
        ensure!(
            Instant::now() < deadline,
            "{open} requests had not ended 15 minutes after the load"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "every request ended {:.1} s after the load",
        drained.as_secs_f64()
    );
    sampling.abort();
    watching.abort();
    following.abort();
    let peak_rss_mib = rss(&controller);
    controller.stop()?;

    let real: Vec<f64> = ends
        .lock()
        .unwrap()
        .values()
        .filter(|e| e.real)
        .filter_map(|a| a.ended.map(|e| audit::seconds(a.created, e)))
        .collect();
    let requests = audit::read(&cluster.audit_log_path().context("the audit log")?)?;
    let writes: Vec<_> = requests
        .iter()
        .filter(|r| r.user == CONTROLLER_NAME && r.is_mutating())
        .collect();
    let mut quiet_requests: Vec<_> = requests
        .iter()
        .filter(|r| r.user == CONTROLLER_NAME && r.namespace == QUIET)
        .collect();
    quiet_requests.sort_by_key(|r| r.received);
    let steps_of = |asks: &[(Timestamp, f64)]| -> Vec<Option<audit::Steps>> {
        asks.iter()
            .map(|(asked, seconds)| {
                // Its own requests: the next quiet retry starts after its end.
                let until = *asked + Duration::from_secs_f64(seconds + 0.05);
                let within: Vec<_> = quiet_requests
                    .iter()
                    .copied()
                    .filter(|r| r.received <= until)
                    .collect();
                audit::steps(&within, *asked).map(|(steps, _)| steps)
            })
            .collect()
    };
    let (quiet_idle_steps, quiet_during_steps) = (steps_of(&quiet_idle), steps_of(&quiet_during));
    let results = Results {
        date: Timestamp::now().strftime("%Y-%m-%d").to_string(),
        quiet_idle_seconds: idle_seconds,
        quiet_idle_steps,
        quiet_during_seconds: during_seconds,
        quiet_during_steps,
        quiet_after_seconds: quiet_after,
        asked,
        real_asked: real.len(),
        real_end_p50_seconds: stats::median(real.clone()),
        real_end_max_seconds: real.iter().copied().fold(0.0, f64::max),
        drained_seconds: drained.as_secs_f64(),
        peak_rss_mib,
        idle_rss_mib,
        writes_busiest_second: audit::busiest_second(writes.iter().copied()),
        writes_by_verb: audit::by_verb(writes.iter().copied()),
        samples: samples.lock().unwrap().clone(),
        args,
    };
    write(&results)?;
    Ok(())
}

/// How one ask is made.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Object,
    Annotation,
    Call,
}

/// How namespace `i` asks in `second`: a WorkflowRetry, or with `--mix` in turn an annotation
/// (on a real workflow: a typo'd name cannot be annotated) and Argo's retry call.
fn kind(args: &Args, second: usize, i: usize, real: bool) -> Kind {
    match ((second + i) % 3, args.mix, real) {
        (_, false, _) => Kind::Object,
        (1, true, true) => Kind::Annotation,
        (2, true, _) => Kind::Call,
        _ => Kind::Object,
    }
}

/// What the load asks with, and where it notes each ask and its end.
#[derive(Clone)]
struct Askers {
    admin: kube::Client,
    /// rewind's Argo API (with `--mix`) and the caller's bearer token.
    argo: Option<(kube::Client, String)>,
    ends: Ends,
    /// (namespace, workflow) -> the token an annotation asked with.
    annotated: Arc<Mutex<HashMap<(String, String), String>>>,
}

impl Askers {
    fn asked(&self, key: String, real: bool) {
        self.ends.lock().unwrap().insert(
            key,
            Asked {
                created: Timestamp::now(),
                ended: None,
                real,
            },
        );
    }

    fn ended(&self, key: &str) {
        if let Some(asked) = self.ends.lock().unwrap().get_mut(key) {
            asked.ended.get_or_insert_with(Timestamp::now);
        }
    }

    /// Asks for a retry of `target` in `tenant` as `kind` says.
    async fn ask(
        &self,
        kind: Kind,
        tenant: String,
        second: usize,
        target: String,
        real: bool,
    ) -> anyhow::Result<()> {
        let name = format!("ask-{second:04}");
        match kind {
            Kind::Object => {
                let api: Api<WorkflowRetry> = Api::namespaced(self.admin.clone(), &tenant);
                let object = WorkflowRetry::new(
                    &name,
                    WorkflowRetrySpec {
                        workflow_name: Some(target),
                        ..Default::default()
                    },
                );
                api.create(&PostParams::default(), &object).await?;
            }
            Kind::Annotation => {
                self.asked(annotation_key(&tenant, &target), real);
                self.annotated
                    .lock()
                    .unwrap()
                    .insert((tenant.clone(), target.clone()), name.clone());
                let patch =
                    serde_json::json!({"metadata": {"annotations": {annotations::RETRY: name}}});
                Api::<Workflow>::namespaced(self.admin.clone(), &tenant)
                    .patch_metadata(
                        &target,
                        &Default::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await?;
            }
            Kind::Call => {
                let (client, token) = self
                    .argo
                    .clone()
                    .context("--mix starts rewind's Argo API")?;
                let key = format!("call/{tenant}/{name}");
                self.asked(key.clone(), real);
                let this = self.clone();
                // Argo's call answers once the retry ended: its answer is the end.
                tokio::spawn(async move {
                    let request =
                        http::Request::put(format!("/api/v1/workflows/{tenant}/{target}/retry"))
                            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
                            .header(http::header::CONTENT_TYPE, "application/json")
                            .body(b"{}".to_vec())
                            .expect("a valid request");
                    match client.request_text(request).await {
                        Ok(_) => {}
                        // Argo's NotFound (its gRPC code in the body): the answer a typo gets.
                        Err(kube::Error::Api(_)) if !real => {}
                        Err(error) => eprintln!("Argo's retry call for {tenant}/{target}: {error}"),
                    }
                    this.ended(&key);
                });
            }
        }
        Ok(())
    }

    /// Notes the end of each annotation's request as a watch of the workflows sees it.
    async fn follow_annotations(self) {
        let api = Api::<PartialObjectMeta<Workflow>>::all(self.admin.clone());
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let Ok(Event::Apply(meta) | Event::InitApply(meta)) = event else {
                continue;
            };
            let key = (meta.namespace().unwrap_or_default(), meta.name_any());
            let Some(token) = self.annotated.lock().unwrap().get(&key).cloned() else {
                continue;
            };
            if let Ok(Some(status)) = request::status_of(meta.annotations(), &token)
                && status.phase.is_finished()
            {
                self.annotated.lock().unwrap().remove(&key);
                self.ended(&annotation_key(&key.0, &key.1));
            }
        }
    }
}

fn annotation_key(tenant: &str, workflow: &str) -> String {
    format!("annotation/{tenant}/{workflow}")
}

/// Asks once a second in every namespace; returns how many it asked.
async fn ask_every_second(
    askers: Askers,
    tenants: Vec<String>,
    args: &Args,
) -> anyhow::Result<usize> {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut asked = 0;
    for second in 0..args.seconds {
        tick.tick().await;
        let done = futures::stream::iter(tenants.clone().into_iter().enumerate())
            .map(|(i, tenant)| {
                let phase = if args.aligned { 0 } else { i };
                let real = (second + phase) % args.real_every == 0;
                let target = match real {
                    true => format!("real-{}", second / args.real_every),
                    false => format!("missing-{second}"),
                };
                askers.ask(kind(args, second, i, real), tenant, second, target, real)
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await
            .context("asking the second's retries")?;
        asked += done.len();
    }
    Ok(asked)
}

/// Retries the quiet namespace's workflow `name` by annotation: when it was asked, and the
/// seconds from the ask to its end.
async fn quiet_retry(admin: &kube::Client, name: &str) -> anyhow::Result<(Timestamp, f64)> {
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), QUIET);
    let token = "1";
    let (at, asked) = (Timestamp::now(), Instant::now());
    let patch = serde_json::json!({"metadata": {"annotations": {annotations::RETRY: token}}});
    workflows
        .patch_metadata(name, &Default::default(), &kube::api::Patch::Merge(&patch))
        .await?;
    loop {
        let wf = workflows.get(name).await?;
        let on_workflow = wf.metadata.annotations.clone().unwrap_or_default();
        if let Ok(Some(status)) = request::status_of(&on_workflow, token)
            && status.phase.is_finished()
        {
            ensure!(
                status.phase == RetryPhase::Succeeded,
                "the quiet retry of {name} ended {status:?}"
            );
            return Ok((at, asked.elapsed().as_secs_f64()));
        }
        ensure!(
            asked.elapsed() < Duration::from_secs(900),
            "the quiet retry of {name} did not end in 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The process's resident memory now, in MiB (0 if it cannot be read).
fn current_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Under `cargo test`: each committed result's table is its JSON rendered
/// (`REWIND_UPDATE_RESULTS=1` renders them again, after a change of the table's words).
fn check_committed() -> anyhow::Result<()> {
    for name in ["tenants", "tenants-aligned", "tenants-mix"] {
        let dir = Path::new(RESULTS);
        let json = std::fs::read_to_string(dir.join(format!("{name}.json")))?;
        let results: Results =
            serde_json::from_str(&json).with_context(|| format!("reading {name}.json"))?;
        if std::env::var_os("REWIND_UPDATE_RESULTS").is_some() {
            std::fs::write(dir.join(format!("{name}.md")), markdown(&results))?;
        }
        let md = std::fs::read_to_string(dir.join(format!("{name}.md")))?;
        ensure!(
            md == markdown(&results),
            "{RESULTS}/{name}.md has drifted from {name}.json: run the benchmark again"
        );
    }
    Ok(())
}

fn write(results: &Results) -> anyhow::Result<()> {
    let dir = Path::new(RESULTS);
    let name = &results.args.out;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(dir.join(format!("{name}.md")), markdown(results))?;
    draw(results, &dir.join(format!("{name}.png")))?;
    println!("{}", markdown(results));
    println!("Written: {RESULTS}/{name}.json, .md, .png");
    Ok(())
}

fn markdown(r: &Results) -> String {
    let a = &r.args;
    let idle = stats::median(r.quiet_idle_seconds.clone());
    let ratio = |s: f64| s / idle;
    let slowest = r.quiet_during_seconds.iter().copied().fold(0.0, f64::max);
    format!(
        "# Many tenants at once ({date})\n\n\
         `cargo bench --features testenv --bench tenants -- --tenants {t} --seconds {s} --real-every {e}{al}{mx} --quiet-pods {q} --qps {qps} --burst {b} --read-qps {rq} --read-burst {rb}{bp} --out {out}`\n\n\
         {t} namespaces each asked a retry a second for {s} s ({asked} in all; {how}): one in {e} named a real \
         failed workflow of {REAL_PODS} pods ({real} such; {when}), the others a workflow that does not exist. A quiet namespace \
         retried a {q}-pod workflow by annotation {ia} times on the idle controller, {da} times during the load (evenly spaced) and once as it stopped. \
         The controller: the release binary, its defaults but for its budget: writes {qps} QPS, burst {b}; reads {rq} QPS, burst {rb}{bpt}.\n\n\
         | measure | value |\n|---|---:|\n\
         | quiet retry, idle controller, median | {idle:.2} s |\n\
         | quiet retry during the load, median / slowest | {during:.2} / {slowest:.2} s ({rd:.2}x idle) |\n\
         | the slowest of those, as the API server saw it | {slow_steps} |\n\
         | rewind's own share of a quiet retry (its time less its DeleteCollection's on the API server), idle, median / slowest | {own_idle} |\n\
         | rewind's own share of a quiet retry during the load, median / slowest | {own_during} |\n\
         | quiet retry, as the load stops | {after:.2} s ({ra:.2}x idle) |\n\
         | real retries, ask to end, median | {rp:.1} s |\n\
         | real retries, ask to end, slowest | {rm:.1} s |\n\
         | every request ended, after the load's last ask | {drained:.1} s |\n\
         | controller RSS idle / peak | {irss:.1} / {prss:.1} MiB |\n\
         | controller writes, busiest second (audit log; budget allows qps + burst = {allowed}) | {busiest} |\n\
         | controller writes by verb | {verbs} |\n\n\
         The plot ({out}.png): requests asked and not yet ended, and the controller's RSS, each second.\n",
        date = r.date,
        t = a.tenants,
        s = a.seconds,
        e = a.real_every,
        al = if a.aligned { " --aligned" } else { "" },
        mx = if a.mix { " --mix" } else { "" },
        how = if a.mix {
            "in turn a WorkflowRetry, an annotation on a real workflow (a missing one cannot be annotated: a WorkflowRetry instead) and Argo's retry call through rewind's Argo API"
        } else {
            "each a WorkflowRetry"
        },
        when = if a.aligned {
            "every namespace asked its real retry in the same second".to_owned()
        } else {
            format!(
                "namespace i in the seconds where second + i is a multiple of {}",
                a.real_every
            )
        },
        q = a.quiet_pods,
        qps = a.qps,
        b = a.burst,
        rq = a.read_qps,
        rb = a.read_burst,
        bp = if a.bulk_parallelism > 1 {
            format!(" --bulk-parallelism {}", a.bulk_parallelism)
        } else {
            String::new()
        },
        bpt = if a.bulk_parallelism > 1 {
            format!(
                "; `--bulk-parallelism {}`, every workflow's pods spread over {NODES} nodes",
                a.bulk_parallelism
            )
        } else {
            String::new()
        },
        out = a.out,
        asked = r.asked,
        real = r.real_asked,
        ia = r.quiet_idle_seconds.len(),
        da = r.quiet_during_seconds.len(),
        during = stats::median(r.quiet_during_seconds.clone()),
        rd = ratio(slowest),
        slow_steps = slowest_steps(r),
        own_idle = own_share(&r.quiet_idle_seconds, &r.quiet_idle_steps),
        own_during = own_share(&r.quiet_during_seconds, &r.quiet_during_steps),
        after = r.quiet_after_seconds,
        ra = ratio(r.quiet_after_seconds),
        rp = r.real_end_p50_seconds,
        rm = r.real_end_max_seconds,
        drained = r.drained_seconds,
        irss = r.idle_rss_mib,
        prss = r.peak_rss_mib,
        allowed = a.qps + a.burst,
        busiest = r.writes_busiest_second,
        verbs = r
            .writes_by_verb
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The quiet retries' times less their deletes' on the API server (the DeleteCollection of a
/// workflow's pods runs one delete after another there, slower as the server is busier):
/// median / slowest, in seconds.
fn own_share(seconds: &[f64], steps: &[Option<audit::Steps>]) -> String {
    let own: Vec<f64> = seconds
        .iter()
        .zip(steps)
        .filter_map(|(s, steps)| Some(s - steps.as_ref()?.delete?))
        .collect();
    if own.is_empty() {
        return "-".into();
    }
    let slowest = own.iter().copied().fold(0.0, f64::max);
    format!("{:.2} / {slowest:.2} s", stats::median(own))
}

/// Where the slowest quiet retry during the load spent its time, by the audit log.
fn slowest_steps(r: &Results) -> String {
    let slowest = r
        .quiet_during_seconds
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i);
    let Some(Some(steps)) = slowest.and_then(|i| r.quiet_during_steps.get(i)) else {
        return "-".into();
    };
    let s = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    format!(
        "to its first list {} s, list to first delete {} s, deletes {} s, to the reset {} s, reset {} s",
        s(steps.read_plan),
        s(steps.list),
        s(steps.delete),
        s(steps.confirm),
        s(steps.commit)
    )
}

fn draw(r: &Results, path: &Path) -> anyhow::Result<()> {
    font::register()?;
    let root = BitMapBackend::new(path, (1000, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let end = r.samples.last().map_or(1.0, |s| s.second);
    let backlog = r
        .samples
        .iter()
        .map(|s| (s.second, (s.asked - s.ended) as f64));
    let top = r
        .samples
        .iter()
        .map(|s| (s.asked - s.ended) as f64)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&left)
        .caption("requests asked, not ended", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..top * 1.1)?;
    chart.configure_mesh().x_desc("seconds").draw()?;
    chart.draw_series(LineSeries::new(backlog, &BLUE))?;
    let rss_top = r.samples.iter().map(|s| s.rss_mib).fold(64.0, f64::max);
    let mut chart = ChartBuilder::on(&right)
        .caption("controller RSS (MiB; line: 64)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..rss_top * 1.1)?;
    chart.configure_mesh().x_desc("seconds").draw()?;
    chart.draw_series(LineSeries::new(
        r.samples.iter().map(|s| (s.second, s.rss_mib)),
        &RED,
    ))?;
    chart.draw_series(LineSeries::new([(0.0, 64.0), (end, 64.0)], &BLACK))?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
