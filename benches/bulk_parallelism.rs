//! Beyond the serial floor: one exact DeleteCollection of a failed workflow's pods against
//! the same request split by node into k parallel ones (`rewind controller
//! --bulk-parallelism k`, the selectors [`rewind::engine::assess::split_bulk`] builds), and what each
//! costs a neighbour. The API server deletes one request's pods one after another
//! (`--delete-collection-workers` 1), so k requests may use k threads.
//!
//!     cargo bench --features testenv --bench bulk_parallelism -- --pods 8000 --nodes 32 --reps 3 --k 1,2,4,8
//!
//! Each run starts a fresh control plane (no etcd history from the previous run), creates
//! `--pods` failed Argo-shaped pods (and `--succeeded` succeeded ones the selectors must
//! keep) spread round-robin over `--nodes` nodes, measures a neighbour's GET and LIST
//! latency idle for 3 s, then sends the k requests at once while the neighbour goes on, and
//! checks that exactly the failed pods are gone. Runs alternate the order of k between
//! repetitions. Prints the wall time (median, min, max), the speed-up over k = 1 and the
//! neighbour's p50/p99.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Resource as _};
use rewind::argo::plan::{RetryOptions, plan_retry};
use rewind::argo::workflow::labels;
use rewind::engine::assess::{DeleteWork, SUCCEEDED, bulk_selectors, split_bulk};
use rewind::testenv::bench::cli;
use rewind::testenv::localcluster::{LocalCluster, Options, Role};
use rewind::testenv::workload::FailedDag;

const NAMESPACE: &str = "bench";
const NEIGHBOUR: &str = "neighbour";
const WORKFLOW: &str = "wide";
/// The neighbour's pace: one request every this long.
const NEIGHBOUR_EVERY: Duration = Duration::from_millis(20);
const IDLE: Duration = Duration::from_secs(3);

/// One DeleteCollection against the same split by node into k parallel ones, each run on a
/// fresh control plane.
#[derive(clap::Parser)]
struct Args {
    /// Failed pods to delete.
    #[arg(long, default_value = "8000")]
    pods: usize,
    /// Succeeded pods the selectors must keep.
    #[arg(long, default_value = "100")]
    succeeded: usize,
    /// Nodes the pods are spread over, round-robin.
    #[arg(long, default_value = "32")]
    nodes: usize,
    /// Repetitions, alternating the order of k.
    #[arg(long, default_value = "3")]
    reps: usize,
    /// Parallel requests to compare, comma-separated numbers >= 1.
    #[arg(long = "k", value_delimiter = ',', value_parser = cli::at_least_one, default_value = "1,2,4,8")]
    ks: Vec<usize>,
}

/// Latencies of one kind of neighbour request, in milliseconds.
#[derive(Default)]
struct Latencies(Vec<f64>);

impl Latencies {
    fn quantile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    }
}

/// What the neighbour saw.
#[derive(Default)]
struct Neighbour {
    get: Latencies,
    list: Latencies,
}

struct Run {
    k: usize,
    requests: usize,
    seconds: f64,
    /// CPU seconds kube-apiserver and etcd spent during the deletes.
    server_cpu: f64,
    idle: Neighbour,
    busy: Neighbour,
}

/// GETs a pod and LISTs ConfigMaps in its own namespace, alternately, until `stop`.
async fn neighbour(client: Client, stop: Arc<AtomicBool>) -> anyhow::Result<Neighbour> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NEIGHBOUR);
    let maps: Api<ConfigMap> = Api::namespaced(client, NEIGHBOUR);
    let mut seen = Neighbour::default();
    let mut tick = tokio::time::interval(NEIGHBOUR_EVERY);
    let mut get = true;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let start = Instant::now();
        if get {
            pods.get("neighbour").await?;
            seen.get.0.push(start.elapsed().as_secs_f64() * 1e3);
        } else {
            maps.list(&ListParams::default()).await?;
            seen.list.0.push(start.elapsed().as_secs_f64() * 1e3);
        }
        get = !get;
    }
    Ok(seen)
}

async fn watch_neighbour<F: std::future::Future>(
    client: &Client,
    during: F,
) -> anyhow::Result<(F::Output, Neighbour)> {
    let stop = Arc::new(AtomicBool::new(false));
    let watching = tokio::spawn(neighbour(client.clone(), stop.clone()));
    let out = during.await;
    stop.store(true, Ordering::Relaxed);
    Ok((out, watching.await??))
}

/// Creates the workflow and its failed and succeeded pods, node `node-{i % nodes}` each;
/// returns the plan's pods and the node of each, as the controller reads them from the
/// workflow.
async fn create_pods(
    client: &Client,
    args: &Args,
) -> anyhow::Result<(Vec<String>, BTreeMap<String, String>)> {
    let dag = FailedDag {
        name: WORKFLOW.into(),
        failed: args.pods,
        succeeded: args.succeeded,
    };
    let nodes: Vec<String> = (0..args.nodes).map(|i| format!("node-{i:02}")).collect();
    let workflow = dag.create_on(client, NAMESPACE, &nodes, 64, || ()).await?;
    let plan = plan_retry(&workflow, &RetryOptions::default())?;
    Ok((plan.pods_to_delete, plan.pod_nodes))
}

/// The same request rewind's workers send: selectors and a metadata-only answer.
async fn delete_collection(client: &Client, labels: &str, fields: &str) -> anyhow::Result<usize> {
    let lp = ListParams::default().labels(labels).fields(fields);
    let mut request = kube::core::Request::new(Pod::url_path(&(), Some(NAMESPACE)))
        .delete_collection(&DeleteParams::default(), &lp)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        ),
    );
    let deleted: serde_json::Value = client.request(request).await?;
    Ok(deleted["items"].as_array().map_or(0, Vec::len))
}

/// CPU seconds (user and system) the control plane's processes used so far.
fn server_cpu(cluster: &LocalCluster) -> anyhow::Result<f64> {
    let mut ticks = 0u64;
    for (_, pid) in cluster.pids() {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the parenthesised command: utime and stime are the 12th and 13th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        ticks += fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    }
    // Linux reports these in USER_HZ, 100 per second.
    Ok(ticks as f64 / 100.0)
}

async fn once(args: &Args, k: usize) -> anyhow::Result<Run> {
    let cluster = LocalCluster::start(Options::default()).await?;
    let admin = cluster.admin_client();
    cluster.create_namespace(NAMESPACE).await?;
    cluster.create_namespace(NEIGHBOUR).await?;
    let other = FailedDag {
        name: "neighbour".into(),
        failed: 1,
        succeeded: 0,
    };
    let (mut pod, _) = other.pods(&other.workflow(NEIGHBOUR)).remove(0);
    pod.metadata.name = Some("neighbour".into());
    Api::<Pod>::namespaced(admin.clone(), NEIGHBOUR)
        .create(&PostParams::default(), &pod)
        .await?;
    let (plan, hint) = create_pods(&admin, args)
        .await
        .context("creating the pods")?;
    let (labels, fields) = bulk_selectors(WORKFLOW);
    let whole = DeleteWork::Bulk {
        workflow: WORKFLOW.into(),
        label_selector: labels,
        field_selector: fields,
        pods: plan,
        // Sent here by the benchmark itself, never re-proved by a worker.
        uids: Default::default(),
    };
    let parts = split_bulk(vec![whole], k, &hint);
    // The neighbour's own client: its requests do not queue behind the deletes'.
    let neighbour_client = Client::try_from(cluster.config(Role::Admin).await?)?;
    let ((), idle) = watch_neighbour(&neighbour_client, tokio::time::sleep(IDLE)).await?;
    let cpu_before = server_cpu(&cluster)?;
    let start = Instant::now();
    let (deleted, busy) = watch_neighbour(
        &neighbour_client,
        futures::future::try_join_all(parts.iter().map(|part| {
            let DeleteWork::Bulk {
                label_selector,
                field_selector,
                ..
            } = part
            else {
                unreachable!("split_bulk returns bulk work for bulk work")
            };
            delete_collection(&admin, label_selector, field_selector)
        })),
    )
    .await?;
    let seconds = start.elapsed().as_secs_f64();
    let server_cpu = server_cpu(&cluster)? - cpu_before;
    let deleted: usize = deleted?.into_iter().sum();
    let left: Vec<Pod> = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&format!("{}={WORKFLOW}", labels::WORKFLOW)))
        .await?
        .items;
    let failed_left = left
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(SUCCEEDED))
        .count();
    ensure!(
        failed_left == 0 && left.len() == args.succeeded && deleted >= args.pods,
        "k={k}: {deleted} deleted, {failed_left} failed pods left, {} pods left (expected {})",
        left.len(),
        args.succeeded
    );
    cluster.stop().await?;
    Ok(Run {
        k,
        requests: parts.len(),
        seconds,
        server_cpu,
        idle,
        busy,
    })
}

fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let mut runs: Vec<Run> = Vec::new();
    for rep in 0..args.reps {
        let mut order = args.ks.clone();
        if rep % 2 == 1 {
            order.reverse();
        }
        for &k in &order {
            let run = once(&args, k).await?;
            eprintln!(
                "rep {rep} k={k}: {:.2} s over {} requests, server CPU {:.1} s; neighbour GET p99 {:.1} ms, LIST p99 {:.1} ms (idle {:.1} / {:.1})",
                run.seconds,
                run.requests,
                run.server_cpu,
                run.busy.get.quantile(0.99),
                run.busy.list.quantile(0.99),
                run.idle.get.quantile(0.99),
                run.idle.list.quantile(0.99),
            );
            runs.push(run);
        }
    }
    println!(
        "{} failed pods (+{} succeeded kept) on {} nodes, {} repetitions, fresh control plane each",
        args.pods, args.succeeded, args.nodes, args.reps
    );
    println!(
        "| k | requests | seconds median (min-max) | vs k=1 | server CPU s | neighbour GET p50/p99 ms | LIST p50/p99 ms | idle GET p99 / LIST p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let base = runs
        .iter()
        .filter(|r| r.k == 1)
        .map(|r| r.seconds)
        .collect::<Vec<_>>();
    let base = (!base.is_empty()).then(|| stats(&base).0);
    for &k in &args.ks {
        let of_k: Vec<&Run> = runs.iter().filter(|r| r.k == k).collect();
        let (med, min, max) = stats(&of_k.iter().map(|r| r.seconds).collect::<Vec<_>>());
        let median_of =
            |f: &dyn Fn(&Run) -> f64| stats(&of_k.iter().map(|r| f(r)).collect::<Vec<_>>()).0;
        println!(
            "| {k} | {} | {med:.2} ({min:.2}-{max:.2}) | {} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} |",
            of_k[0].requests,
            base.map_or("-".into(), |b| format!("{:.2}x", b / med)),
            median_of(&|r| r.server_cpu),
            median_of(&|r| r.busy.get.quantile(0.5)),
            median_of(&|r| r.busy.get.quantile(0.99)),
            median_of(&|r| r.busy.list.quantile(0.5)),
            median_of(&|r| r.busy.list.quantile(0.99)),
            median_of(&|r| r.idle.get.quantile(0.99)),
            median_of(&|r| r.idle.list.quantile(0.99)),
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Some((args, _)) = cli::parse::<Args>("bulk_parallelism") else {
        println!(
            "bulk_parallelism is a benchmark: cargo bench --features testenv --bench bulk_parallelism -- --pods 8000 --nodes 32"
        );
        return Ok(());
    };
    cli::init_logging();
    tokio::runtime::Runtime::new()?.block_on(bench(args))
}
