//! `helm upgrade` from the previous chart version to this one with a retry in flight on two
//! replicas, done as docs/operating.md ("Upgrading") says: the CRD applied first, then the
//! chart, then the Deployment's rollout, one replica at a time. The request in flight ends
//! once (one reset, one `Retried`, Succeeded), the WorkflowRetry objects stored under the
//! previous CRD still read through the typed API, and the chart's objects are the new
//! version's.
//!
//! The controller is not run as a pod (the local control plane runs no kubelet for it): the
//! `rewind` binary runs with the installed Deployment's arguments and environment, signed in
//! as the chart's ServiceAccount, as in install.rs. It is this build's binary before and after
//! the upgrade: the image is the same binary; what the upgrade changes is the chart's objects
//! (the CRD, the policies, the rules, the labels) and the Deployment's arguments.
//!
//! For its duration the cluster serves the previous version's CRD, and the chart's user roles
//! (`rewind-retry`, `rewind-view`) are named as the install test's: it runs alone (`ALONE` in
//! main.rs), and sets the CRD back and uninstalls whatever happened.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rewind::argo::workflow::Workflow;
use rewind::protocol::crd::{CRD_FILE, WorkflowRetry};
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::kubelet::{Deployed, service_account_kubeconfig};
use rewind::testenv::localcluster::LocalCluster;
use rewind::testenv::workload::FailedDag;
use tokio::process::Command;
use tokio::time::Instant;

use crate::support::chart::{ChartDeployment as _, RELEASE};
use crate::support::controller as ctl;
use crate::support::helm::{CHART, helm};
use crate::support::replica::{self, Replica, logs};
use crate::support::workflowretry::{live, wait_finished};

/// The previous chart version, 0.1.0, as it stood at this commit. No version was released:
/// 0.1.0 is what an installation from this repository had before 0.2.0. The commit is on
/// main's first-parent line, before the engine merge (7ff5300) added
/// `--terminating-timeout` to the Deployment and before the WorkflowRetry CRD gained
/// `status.asked` (15f4cb7), so this upgrade has all an upgrade can have to do: a CRD to
/// apply first (a field added), Deployment arguments added, a policy added (the pod policy)
/// and one changed (the WorkflowRetry policy also matches updates), the controller's rules
/// narrowed (create on workflows only with the archive on) and values added. The newest
/// commit that changed the chart, 900edf8, changed only the WorkflowRetry policy: from its
/// parent neither the CRD step nor new arguments would be tested.
const PREVIOUS: &str = "f025be492c71eb47d8db351c0c7efe4482ef49d0";
const PREVIOUS_VERSION: &str = "0.1.0";
/// The chart's folder in the repository.
const CHART_PATH: &str = "deploy/helm/rewind";
/// The field manager the local control plane installed the CRDs with: the previous CRD is
/// applied, and the current one put back at the end, as it, so the cluster is left as found.
const LOCALCLUSTER_MANAGER: &str = "rewind-localcluster";
/// A finalizer of someone else's that holds plan pods deleted but not gone, so the retry
/// stays in flight, waiting for them (rule 2), until the test releases them.
const HOLD: &str = "example.com/hold";
const HELD: usize = 5;
const WAIT: Duration = Duration::from_secs(30);

pub async fn the_previous_chart_upgraded_mid_retry_ends_the_request_once_and_keeps_its_objects(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let work = tempfile::tempdir()?;
    let previous = previous_chart(work.path()).await?;
    let outcome = upgrade_mid_retry(&cluster, &namespace, &previous, work.path()).await;
    // Whatever happened: the current CRD, as the other tests expect it, and no release.
    let current_crd = Path::new(CHART).join("crds").join(CRD_FILE);
    let restored = apply_crd(&admin, &current_crd, LOCALCLUSTER_MANAGER).await;
    let uninstalled = helm(
        &cluster,
        work.path(),
        &["uninstall", RELEASE, "--namespace", &namespace],
    )
    .await;
    outcome?;
    restored.context("setting the cluster's WorkflowRetry CRD back to the current one")?;
    uninstalled?;
    Ok(())
}

async fn upgrade_mid_retry(
    cluster: &LocalCluster,
    namespace: &str,
    previous: &Path,
    work: &Path,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let (from_version, to_version) = (chart_version(previous)?, chart_version(Path::new(CHART))?);
    ensure!(
        from_version == PREVIOUS_VERSION,
        "the chart at {PREVIOUS} is version {from_version}, not {PREVIOUS_VERSION}"
    );
    ensure!(
        semver(&to_version)? > semver(&from_version)?,
        "the chart's version {to_version} is not above the previous {from_version}: bump it"
    );

    // The cluster as 0.1.0's `helm install` left it: its CRD (Helm creates crds/ only when
    // absent, and the cluster has the current one).
    let previous_crd = previous.join("crds").join(CRD_FILE);
    apply_crd(&admin, &previous_crd, LOCALCLUSTER_MANAGER).await?;
    let install = install_args(namespace, previous);
    let install: Vec<&str> = install.iter().map(String::as_str).collect();
    helm(cluster, work, &install).await?;
    let old_dir = work.join("old");
    let old = Deployed::read(cluster, namespace, RELEASE, &old_dir).await?;
    old.ensure_chart(&from_version)?;

    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), namespace);
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    let target = ctl::KillTarget::create(cluster, namespace).await?;
    let early = FailedDag {
        name: "early".into(),
        failed: 4,
        succeeded: 1,
    };
    early.create(&admin, namespace, 8, || ()).await?;
    retries
        .create(&PostParams::default(), &live("early", &early.name, None))
        .await?;
    wait_schema(&retries, "early", false).await?;

    let kubeconfig =
        service_account_kubeconfig(cluster, namespace, &old.service_account, &old_dir).await?;
    let lease = old.lease()?;
    let mut old_a = old.start("rewind-old-a", &kubeconfig, &old_dir)?;
    let mut old_b = old.start("rewind-old-b", &kubeconfig, &old_dir)?;
    let leader = wait_leader(cluster, namespace, &lease, &mut [&mut old_a, &mut old_b]).await?;
    tracing::info!(leader, "two replicas of chart {from_version}");

    // A WorkflowRetry served to its end under the previous CRD: the status this binary
    // writes, less what that CRD prunes (`asked`), as a 0.1.0 controller would leave it.
    let early_done = wait_finished(&retries, "early").await?;
    let status = early_done.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded),
        "WorkflowRetry early ended {status:?}"
    );
    ensure!(
        status.asked.is_none(),
        "the previous CRD kept status.asked ({:?}): it is not the one in force",
        status.asked
    );

    // The retry in flight: plan pods held, so it waits for them across the upgrade.
    let held: Vec<String> = target.planned.iter().take(HELD).cloned().collect();
    let hold = serde_json::json!({"metadata": {"finalizers": [HOLD]}});
    for name in &held {
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&hold))
            .await
            .with_context(|| format!("holding pod {name}"))?;
    }
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    retries
        .create(&PostParams::default(), &live("across", &target.name, None))
        .await?;
    let in_flight = InFlight {
        workflows: &workflows,
        retries: &retries,
        target: &target,
        held: &held,
    };
    in_flight
        .wait(cluster, namespace)
        .await
        .with_context(|| format!("before the upgrade; logs:\n{}", logs([&old_a, &old_b])))?;

    // The upgrade: the CRD first, as `kubectl apply --server-side --force-conflicts -f
    // deploy/helm/rewind/crds/` does, then the chart, with the values set at install.
    tracing::info!(
        held = held.len(),
        "the retry waits on its held pods; upgrading"
    );
    let upgrading = Instant::now();
    let current_crd = Path::new(CHART).join("crds").join(CRD_FILE);
    apply_crd(&admin, &current_crd, "kubectl").await?;
    wait_schema(&retries, "early", true).await?;
    helm(
        cluster,
        work,
        &[
            "upgrade",
            RELEASE,
            CHART,
            "--namespace",
            namespace,
            "--reset-then-reuse-values",
        ],
    )
    .await?;
    let new_dir = work.join("new");
    let new = Deployed::read(cluster, namespace, RELEASE, &new_dir).await?;
    new.ensure_chart(&to_version)?;
    ensure!(
        new.args.contains(&format!("--namespace={namespace}")),
        "the upgrade lost the values set at install: {:?}",
        new.args
    );
    let added: Vec<&String> = (new.deployed_args.iter())
        .filter(|a| !old.deployed_args.contains(a))
        .collect();
    ensure!(
        !added.is_empty(),
        "chart {to_version} runs the controller with {from_version}'s arguments: the rollout tests nothing new"
    );
    tracing::info!(?added, "the Deployment's new arguments");
    // An object 0.1.0 did not have: the pod policy.
    let policy = format!("{RELEASE}-pod-finalizer-only");
    let policy = Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .get(&policy)
        .await
        .with_context(|| format!("chart {to_version}'s policy {policy}"))?;
    let chart_label = policy.labels().get("helm.sh/chart").cloned();
    ensure!(
        chart_label == Some(format!("rewind-{to_version}")),
        "the pod policy is labelled {chart_label:?}"
    );

    // The rollout, as a Deployment's (maxSurge 1, maxUnavailable 0): a new replica, once
    // ready, replaces an old one, stopped as the kubelet stops a pod (SIGTERM); the leader
    // first, so the retry changes hands mid-flight.
    let kubeconfig =
        service_account_kubeconfig(cluster, namespace, &new.service_account, &new_dir).await?;
    let lease = new.lease()?;
    let (mut first, mut second) = match leader.as_str() {
        "rewind-old-a" => (old_a, old_b),
        _ => (old_b, old_a),
    };
    let mut new_a = new.start("rewind-new-a", &kubeconfig, &new_dir)?;
    new_a.wait_ready(WAIT).await?;
    first.stop().await?;
    let mut new_b = new.start("rewind-new-b", &kubeconfig, &new_dir)?;
    new_b.wait_ready(WAIT).await?;
    second.stop().await?;
    let leader = wait_leader(cluster, namespace, &lease, &mut [&mut new_a, &mut new_b]).await?;
    tracing::info!(leader, took = ?upgrading.elapsed(), "rolled out chart {to_version}");
    in_flight
        .wait(cluster, namespace)
        .await
        .with_context(|| format!("after the rollout; logs:\n{}", logs([&new_a, &new_b])))?;

    // Released, the held pods go and the new leader ends the request.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    for name in &held {
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&release))
            .await
            .with_context(|| format!("releasing pod {name}"))?;
    }
    let released = Instant::now();
    let across = wait_finished(&retries, "across")
        .await
        .with_context(|| format!("logs:\n{}", logs([&first, &second, &new_a, &new_b])))?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    tracing::info!(after = ?released.elapsed(), "the held pods released, the request ended");
    new_a.stop().await?;
    new_b.stop().await?;
    let status = across.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded),
        "WorkflowRetry across ended {status:?}"
    );

    // Once: one reset of each workflow, one `Retried`, and the pods of the plan only.
    let after = workflows.get(&target.name).await?;
    ctl::ensure_reset_as_planned(&after, &target.plan.workflow, from, to)?;
    target
        .ensure_only_outsiders_left(cluster, namespace)
        .await?;
    let user = format!("system:serviceaccount:{namespace}:{}", new.service_account);
    let log = ctl::audit_log(cluster, namespace)?;
    for workflow in [&target.name, &early.name] {
        let resets = log
            .iter()
            .filter(|a| {
                a.user == user
                    && a.verb == "update"
                    && a.resource == "workflows"
                    && &a.name == workflow
                    && a.code == 200
            })
            .count();
        ensure!(
            resets == 1,
            "workflow {workflow} was reset {resets} times; the audit log has {:?}",
            ctl::summary(&log, &user)
        );
    }
    let reasons = ctl::event_reasons(cluster, namespace, &target.name).await?;
    let retried = reasons.iter().filter(|r| *r == "Retried").count();
    ensure!(
        retried == 1 && !reasons.iter().any(|r| r == "RetryFailed"),
        "the Events about {} are {reasons:?}: expected one Retried and no RetryFailed",
        target.name
    );

    // The objects stored before the upgrade read through the typed API, as they were.
    let listed = retries
        .list(&ListParams::default())
        .await
        .context("listing the WorkflowRetries stored before the upgrade")?;
    let names: Vec<String> = listed.items.iter().map(|r| r.name_any()).collect();
    ensure!(names == ["across", "early"], "WorkflowRetries {names:?}");
    let early_now = retries.get("early").await?;
    ensure!(
        early_now.status == early_done.status,
        "WorkflowRetry early changed after its end: {:?}, then {:?}",
        early_done.status,
        early_now.status
    );
    Ok(())
}

/// `helm install` of `chart` scoped to the test's namespace, as install.rs does: the
/// cluster is shared with other tests.
fn install_args(namespace: &str, chart: &Path) -> Vec<String> {
    vec![
        "install".into(),
        RELEASE.into(),
        chart.display().to_string(),
        "--namespace".into(),
        namespace.into(),
        "--set".into(),
        format!("controller.namespaces={{{namespace}}}"),
        "--set".into(),
        format!(
            "admission.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={namespace}"
        ),
    ]
}

/// Extracts the chart at [`PREVIOUS`] into `dir` (`git archive | tar -x`), returning its path.
async fn previous_chart(dir: &Path) -> anyhow::Result<PathBuf> {
    let repo = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        let mut command = Command::new("git");
        command.args(args).current_dir(repo);
        command
    };
    let found = git(&["cat-file", "-e", &format!("{PREVIOUS}^{{commit}}")])
        .output()
        .await
        .context("running git")?;
    if !found.status.success() {
        let shallow = git(&["rev-parse", "--is-shallow-repository"])
            .output()
            .await
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
            .unwrap_or(false);
        bail!(
            "this test needs the repository's history: it installs the previous chart version \
             from commit {PREVIOUS}, which {repo} does not have{} (`git fetch --unshallow`; \
             CI checks out with fetch-depth: 0):\n{}",
            if shallow { " (a shallow clone)" } else { "" },
            String::from_utf8_lossy(&found.stderr)
        );
    }
    let tar = dir.join("previous.tar");
    let archived = git(&["archive", "--output"])
        .arg(&tar)
        .args([PREVIOUS, CHART_PATH])
        .output()
        .await?;
    ensure!(
        archived.status.success(),
        "git archive {PREVIOUS} {CHART_PATH} failed:\n{}",
        String::from_utf8_lossy(&archived.stderr)
    );
    let extracted = Command::new("tar")
        .arg("-x")
        .arg("-f")
        .arg(&tar)
        .arg("-C")
        .arg(dir)
        .output()
        .await
        .context("running tar")?;
    ensure!(
        extracted.status.success(),
        "tar -x failed:\n{}",
        String::from_utf8_lossy(&extracted.stderr)
    );
    Ok(dir.join(CHART_PATH))
}

/// The chart's version, from its Chart.yaml.
fn chart_version(chart: &Path) -> anyhow::Result<String> {
    let file = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    let chart: serde_json::Value = serde_yaml_ng::from_str(&text)?;
    let version = chart["version"]
        .as_str()
        .context("Chart.yaml has no version")?;
    ensure!(
        chart["appVersion"].as_str() == Some(version),
        "{}: appVersion {} differs from version {version}",
        file.display(),
        chart["appVersion"]
    );
    Ok(version.to_owned())
}

/// MAJOR.MINOR.PATCH, as numbers to compare.
fn semver(version: &str) -> anyhow::Result<[u64; 3]> {
    let parts: Vec<u64> = version
        .split('.')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("version {version} is not MAJOR.MINOR.PATCH"))?;
    parts
        .try_into()
        .map_err(|_| anyhow::anyhow!("version {version} is not MAJOR.MINOR.PATCH"))
}

/// Server-side applies the CRD in `file` as field manager `manager`, taking over conflicts.
async fn apply_crd(client: &kube::Client, file: &Path, manager: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text)?;
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &crd.name_any(),
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying {}", file.display()))?;
    Ok(())
}

/// Waits until the API server serves the CRD that keeps `status.asked` (`keeps`: 0.2.0's) or
/// prunes it (0.1.0's), seen in a dry run of a status patch of WorkflowRetry `name`: a
/// changed CRD is in force a moment after it is applied. Nothing is stored.
async fn wait_schema(api: &Api<WorkflowRetry>, name: &str, keeps: bool) -> anyhow::Result<()> {
    let patch =
        serde_json::json!({"status": {"asked": {"token": "probe", "resourceVersion": "1"}}});
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = api
            .patch_status(name, &dry_run, &Patch::Merge(&patch))
            .await
            .context("a dry run of a WorkflowRetry status patch")?;
        if answer.status.and_then(|s| s.asked).is_some() == keeps {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "after {WAIT:?} the API server still {} status.asked",
            if keeps { "prunes" } else { "keeps" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The retry across the upgrade, in flight: every plan pod gone but the held ones, which
/// are terminating, and the request deleting, not yet ended.
struct InFlight<'a> {
    workflows: &'a Api<Workflow>,
    retries: &'a Api<WorkflowRetry>,
    target: &'a ctl::KillTarget,
    held: &'a [String],
}

impl InFlight<'_> {
    async fn wait(&self, cluster: &LocalCluster, namespace: &str) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(cluster.admin_client(), namespace);
        let deadline = Instant::now() + WAIT;
        loop {
            let left: Vec<Pod> = pods
                .list(&ListParams::default().labels(&self.target.selector))
                .await?
                .items
                .into_iter()
                .filter(|p| self.target.planned.contains(&p.name_any()))
                .collect();
            let only_held_terminating = left.len() == self.held.len()
                && left.iter().all(|p| {
                    self.held.contains(&p.name_any()) && p.metadata.deletion_timestamp.is_some()
                });
            let workflow = self.workflows.get(&self.target.name).await?;
            let token = workflow.annotation(annotations::RETRY).unwrap_or_default();
            let report = ctl::status_of(&workflow, token)?;
            let deleting = report.as_ref().map(|r| r.phase) == Some(RetryPhase::DeletingPods);
            let across = self.retries.get("across").await?;
            ensure!(
                !across.is_finished(),
                "WorkflowRetry across ended while its pods are held: {:?}",
                across.status
            );
            if only_held_terminating && deleting {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the retry is not waiting on its held pods after {WAIT:?}: plan pods left {:?}, \
                 the workflow's report {report:?}",
                left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits until one of `replicas` holds Lease `lease`; its name.
async fn wait_leader(
    cluster: &LocalCluster,
    namespace: &str,
    lease: &str,
    replicas: &mut [&mut Replica],
) -> anyhow::Result<String> {
    replica::wait_holder(cluster, namespace, lease, WAIT, replicas, |_| {
        format!("none of the replicas took Lease {lease} within {WAIT:?}")
    })
    .await
}
