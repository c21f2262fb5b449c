//! `--scale WxN`: the controller among W workflows of N nodes each (finished, no pods) and
//! the retried one (`--pods` failed pods): its time from start to ready (/readyz: the
//! workflow cache synced), its RSS then and its peak over a retry, and that retry's time,
//! beside the same on a cluster holding only the retried workflow. Each on a fresh control
//! plane.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _, stream};
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};

use rewind::argo::workflow::Workflow;
use rewind::testenv::bench::child::RewindController;
use rewind::testenv::localcluster::{LocalCluster, Options};
use rewind::testenv::workload::FailedDag;

use super::{Context, NAMESPACE, RESULTS, Row, WORKFLOW, check, committed, results_dir, retry};

const MIB: f64 = 1024.0 * 1024.0;

/// How many workflows, of how many nodes each.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub workflows: usize,
    pub nodes: usize,
}

impl std::str::FromStr for Scale {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Scale> {
        let (workflows, nodes) = super::by(s, "--scale", "WORKFLOWSxNODES, e.g. 1000x1000")?;
        Ok(Scale { workflows, nodes })
    }
}

#[derive(Serialize, Deserialize)]
struct Measured {
    cluster: String,
    workflows: usize,
    nodes_each: usize,
    create_seconds: f64,
    ready_seconds: f64,
    rss_ready_mib: f64,
    cpu_ready_seconds: f64,
    /// API requests the controller sent from its start until ready.
    #[serde(default)]
    api_requests_ready: u64,
    retried_pods: usize,
    retry_seconds: f64,
    peak_rss_mib: f64,
}

pub async fn run(
    context: &Context,
    scale: Scale,
    pods: usize,
    command: &str,
    out: &str,
) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for loaded in [false, true] {
        let cluster = LocalCluster::start(Options::default())
            .await
            .context("starting a local control plane")?;
        let result = once(&cluster, context, scale, pods, loaded).await;
        cluster.stop().await?;
        let m = result?;
        println!(
            "  {:6} cluster: {} workflows of {} nodes created in {:.1}s; controller ready in {:.2}s (RSS {:.1} MiB, CPU {:.2}s, {} API requests); retry of {} pods {:.2}s; peak RSS {:.1} MiB",
            m.cluster,
            m.workflows,
            m.nodes_each,
            m.create_seconds,
            m.ready_seconds,
            m.rss_ready_mib,
            m.cpu_ready_seconds,
            m.api_requests_ready,
            m.retried_pods,
            m.retry_seconds,
            m.peak_rss_mib
        );
        runs.push(m);
    }
    let results = Results {
        command: command.to_owned(),
        succeeded: context.succeeded,
        runs,
    };
    let md = markdown(&results, out);
    println!("\n{md}");
    let dir = results_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{out}.md")), &md)?;
    std::fs::write(
        dir.join(format!("{out}.json")),
        serde_json::to_string_pretty(&results)? + "\n",
    )?;
    println!("Written: {RESULTS}/{out}.json, .md");
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct Results {
    command: String,
    /// Succeeded pods beside the retried workflow's failed ones.
    succeeded: usize,
    /// The empty cluster's, then the loaded one's.
    runs: Vec<Measured>,
}

fn markdown(results: &Results, out: &str) -> String {
    let pods = results.runs.first().map_or(0, |m| m.retried_pods);
    let empty_retry = results
        .runs
        .iter()
        .find(|m| m.cluster == "empty")
        .map(|m| m.retry_seconds);
    let mut md = format!(
        "# Informer scale: {out}\n\n`{}`\n\nEach on a fresh control plane; the retried workflow has {pods} failed pods (+{} succeeded). Targets: ready within 10 s, RSS under 64 MiB, the retry within 1.2x of the same retry on the empty cluster.\n\n| cluster | workflows | nodes of each other workflow | created in s | ready in s | peak RSS to ready MiB | CPU to ready s | API requests to ready | retry s | retry vs empty | peak RSS MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        results.command, results.succeeded
    );
    for m in &results.runs {
        let ratio = empty_retry.map_or(f64::NAN, |e| m.retry_seconds / e);
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.2} | {:.1} | {:.2} | {} | {:.2} | {:.2}x | {:.1} |\n",
            m.cluster,
            m.workflows,
            m.nodes_each,
            m.create_seconds,
            m.ready_seconds,
            m.rss_ready_mib,
            m.cpu_ready_seconds,
            m.api_requests_ready,
            m.retry_seconds,
            ratio,
            m.peak_rss_mib
        ));
    }
    if let [empty, loaded] = &results.runs[..] {
        let per = (loaded.rss_ready_mib - empty.rss_ready_mib) * MIB
            / (loaded.workflows.saturating_sub(empty.workflows).max(1)) as f64;
        md.push_str(&format!(
            "\nRSS per cached workflow: {per:.0} bytes (peak RSS to ready, loaded minus empty, over the other workflows).\n"
        ));
    }
    md
}

/// Each committed `scale-*.json` parses, and its `.md` is it rendered; returns how many were
/// checked.
pub fn check_committed() -> anyhow::Result<usize> {
    let dir = results_dir();
    let mut checked = 0;
    for (out, path) in committed(&dir, "scale-")? {
        let results: Results = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let md = dir.join(format!("{out}.md"));
        let rendered =
            std::fs::read_to_string(&md).with_context(|| format!("reading {}", md.display()))?;
        anyhow::ensure!(
            rendered == markdown(&results, &out),
            "{} is not {} rendered; run the command it names again",
            md.display(),
            path.display()
        );
        checked += 1;
    }
    Ok(checked)
}

async fn once(
    cluster: &LocalCluster,
    context: &Context,
    scale: Scale,
    pods: usize,
    loaded: bool,
) -> anyhow::Result<Measured> {
    let admin = cluster.admin_client();
    cluster.create_namespace(NAMESPACE).await?;
    let created = Instant::now();
    let dag = FailedDag {
        name: WORKFLOW.into(),
        failed: pods,
        succeeded: context.succeeded,
    };
    dag.create(&admin, NAMESPACE, 64, || ()).await?;
    let others = match loaded {
        true => scale.workflows.saturating_sub(1),
        false => 0,
    };
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), NAMESPACE);
    // Finished workflows as Argo leaves them, a tenth of their nodes failed; no pods;
    // the labels and annotation Argo's controller and server add beside those of
    // `FailedDag`: who submitted it, its archiving and its pods' name format.
    let failed = scale.nodes / 10;
    let succeeded = scale.nodes.saturating_sub(failed + 1);
    stream::iter(0..others)
        .map(|i| {
            let workflows = workflows.clone();
            async move {
                let dag = FailedDag {
                    name: format!("scale-{i:05}"),
                    failed,
                    succeeded,
                };
                let mut workflow = dag.workflow(NAMESPACE);
                let meta = &mut workflow.metadata;
                meta.labels.get_or_insert_default().extend(
                    [
                        (
                            "workflows.argoproj.io/creator",
                            "system-serviceaccount-argo-argo-server",
                        ),
                        (
                            "workflows.argoproj.io/workflow-archiving-status",
                            "Archived",
                        ),
                    ]
                    .map(|(k, v)| (k.to_owned(), v.to_owned())),
                );
                meta.annotations
                    .get_or_insert_default()
                    .insert("workflows.argoproj.io/pod-name-format".into(), "v2".into());
                workflows
                    .create(&PostParams::default(), &workflow)
                    .await
                    .map(drop)
            }
        })
        // Many at once: 100,000 workflows one by one would take most of an hour.
        .buffer_unordered(64)
        .try_collect::<()>()
        .await
        .context("creating the other workflows")?;
    let create_seconds = created.elapsed().as_secs_f64();

    let args: Vec<String> = ["--namespace", NAMESPACE, "--argo-configmap", ""]
        .map(String::from)
        .to_vec();
    let log = context.logs.join(format!(
        "scale-{}.log",
        if loaded { "loaded" } else { "empty" }
    ));
    let started = Instant::now();
    let controller = RewindController::start(
        &context.rewind,
        cluster,
        &args,
        log,
        Duration::from_secs(300),
    )
    .await?;
    let ready_seconds = started.elapsed().as_secs_f64();
    let ready = controller.usage()?;
    let api_requests_ready = controller.api_requests().await?;
    let retried = retry(cluster, context, Row::RewindBulk, pods, "", None).await;
    let after = controller.usage()?;
    controller.stop()?;
    let (retry_seconds, _, _) = retried?;
    check(
        cluster,
        Row::RewindBulk,
        WORKFLOW,
        pods,
        context.succeeded,
        None,
        None,
    )
    .await?;
    Ok(Measured {
        cluster: if loaded { "loaded" } else { "empty" }.into(),
        workflows: others + 1,
        nodes_each: if loaded { scale.nodes } else { 0 },
        create_seconds,
        ready_seconds,
        rss_ready_mib: ready.peak_rss_bytes as f64 / MIB,
        cpu_ready_seconds: ready.cpu_seconds,
        api_requests_ready,
        retried_pods: pods,
        retry_seconds,
        peak_rss_mib: after.peak_rss_bytes as f64 / MIB,
    })
}
