//! Many tenants at once, as a platform team's busy cluster loads rewind: namespaces each
//! asking about one retry a second, most for workflows that do not exist (a typo, a stale
//! name), some for real ones, while a quiet namespace retries a large workflow by annotation.
//! The quiet retry keeps its pace, the real ones end soon after they are asked, and every
//! request ends soon after the load stops. `cargo bench --bench tenants` runs the full size.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use rewind::argo::workflow::Workflow;
use rewind::protocol::crd::{WorkflowRetry, WorkflowRetrySpec};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::localcluster::{LocalCluster, Role};
use rewind::testenv::workload::FailedDag;

use crate::support::controller as ctl;

/// Busy namespaces, each asking one retry a second for [`LOAD`].
const TENANTS: usize = 20;
const LOAD: Duration = Duration::from_secs(30);
/// One ask in this many names a real workflow; the others name none.
const REAL_EVERY: usize = 10;

/// Twenty namespaces ask a WorkflowRetry a second each for 30 s (nine in ten naming no
/// workflow, one in ten a real 5-pod one), with the controller's default budget, while a
/// quiet namespace retries a 200-pod workflow by annotation: the quiet retry takes at most
/// 10 s (see the bound's comment), every real retry ends within 30 s of its ask, and every
/// request has ended within 60 s after the load stops. Every namespace asks its real retry
/// in the same second, the worst case for the quiet one.
pub async fn a_quiet_tenants_retry_keeps_its_pace_beside_many_busy_tenants(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let prefix = &namespace[..namespace.len().min(50)];
    let busy: Vec<String> = (0..TENANTS).map(|i| format!("{prefix}-t{i:02}")).collect();
    let reals = LOAD.as_secs() as usize / REAL_EVERY;
    for tenant in &busy {
        cluster.create_namespace(tenant).await?;
        for r in 0..reals {
            let real = FailedDag {
                name: format!("real-{r}"),
                failed: 5,
                succeeded: 1,
            };
            real.create(&admin, tenant, 4, || ()).await?;
        }
    }
    for name in ["alone", "during"] {
        let quiet = FailedDag {
            name: name.into(),
            failed: 200,
            succeeded: 2,
        };
        quiet.create(&admin, &namespace, 16, || ()).await?;
    }
    let mut served: Vec<&str> = busy.iter().map(String::as_str).collect();
    served.push(&namespace);
    let (controller, _) = ctl::start_serving(
        cluster.config(Role::Controller).await?,
        &served,
        rewind::controller::Options::default(),
        None,
    )
    .await?;

    let alone = quiet_retry(&cluster, &namespace, "alone").await?;
    let load = {
        let (admin, busy) = (admin.clone(), busy.clone());
        tokio::spawn(async move { ask_every_second(admin, busy).await })
    };
    tokio::time::sleep(LOAD / 2).await;
    let during = quiet_retry(&cluster, &namespace, "during").await?;
    load.await.context("the load's task")??;
    let stopped = Timestamp::now();

    // Every request ends within 60 s of the load's end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut open;
    loop {
        open = 0;
        let mut late_reals = Vec::new();
        for tenant in &busy {
            let api: Api<WorkflowRetry> = Api::namespaced(admin.clone(), tenant);
            for object in api.list(&ListParams::default()).await?.items {
                let status = object.status.clone().unwrap_or_default();
                if !status.phase.is_some_and(RetryPhase::is_finished) {
                    open += 1;
                    continue;
                }
                let real = object
                    .spec
                    .workflow_name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("real-"));
                let asked = object.creation_timestamp().map(|t| t.0);
                let ended = status
                    .finished_at
                    .as_deref()
                    .and_then(|t| t.parse::<Timestamp>().ok());
                if let (true, Some(asked), Some(ended)) = (real, asked, ended)
                    && ended.duration_since(asked).as_secs() > 30
                {
                    late_reals.push(format!(
                        "{tenant}/{} ({}s)",
                        object.name_any(),
                        ended.duration_since(asked).as_secs()
                    ));
                }
            }
        }
        if open == 0 {
            ensure!(
                late_reals.is_empty(),
                "real retries ended more than 30 s after they were asked: {late_reals:?}"
            );
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{open} requests had not ended 60 s after the load stopped"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let drained = Timestamp::now().duration_since(stopped);
    let ratio = during.as_secs_f64() / alone.as_secs_f64();
    tracing::info!(
        ?alone,
        ?during,
        ratio,
        drained_seconds = drained.as_secs(),
        tenants = TENANTS,
        "a quiet retry beside busy tenants"
    );
    let up = controller.is_up();
    controller.stop().await?;
    ensure!(up, "the controller stopped");
    // Before the budget had priorities and per-tenant delete turns (a7d058f), this quiet
    // retry took 84.8 s and the real retries 88-100 s from their ask. With request slots
    // taken only for a chosen request (926e70e) it measured 0.98-1.16 s (1.40-1.81x alone)
    // here and 2.37 s (3.30x) in one clean-clone CI run: most of a quiet retry's time under
    // load is the API server's own DeleteCollection of its 200 pods, which the busy plane
    // slows (benches/tenants.rs measures rewind's share apart). The bound catches
    // starvation, not the machine.
    ensure!(
        during <= Duration::from_secs(10),
        "beside {TENANTS} busy namespaces, the quiet retry took {during:?} against {alone:?} alone ({ratio:.2}x)"
    );
    Ok(())
}

/// Creates one WorkflowRetry a second in each of `busy` for [`LOAD`]: every
/// [`REAL_EVERY`]th names one of the namespace's real workflows, the others a missing one.
async fn ask_every_second(admin: kube::Client, busy: Vec<String>) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for second in 0..LOAD.as_secs() as usize {
        tick.tick().await;
        let target = match second % REAL_EVERY {
            0 => format!("real-{}", second / REAL_EVERY),
            _ => format!("missing-{second}"),
        };
        let asks = busy.iter().map(|tenant| {
            let api: Api<WorkflowRetry> = Api::namespaced(admin.clone(), tenant);
            let object = WorkflowRetry::new(
                &format!("ask-{second:03}"),
                WorkflowRetrySpec {
                    workflow_name: Some(target.clone()),
                    ..Default::default()
                },
            );
            async move { api.create(&PostParams::default(), &object).await }
        });
        futures::future::try_join_all(asks)
            .await
            .context("creating the second's WorkflowRetries")?;
    }
    Ok(())
}

/// Retries the 200-pod workflow `name` by annotation; the time from the ask to its end.
async fn quiet_retry(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Duration> {
    let workflows: Api<Workflow> = Api::namespaced(cluster.admin_client(), namespace);
    let asked = tokio::time::Instant::now();
    ctl::request_retry(cluster, namespace, name, "1").await?;
    let (_, status) = ctl::wait_finished(&workflows, name, "1", Duration::from_secs(300)).await?;
    let took = asked.elapsed();
    ensure!(
        status.phase == RetryPhase::Succeeded,
        "the quiet retry of {name} did not reset it: {status:?}"
    );
    Ok(took)
}
