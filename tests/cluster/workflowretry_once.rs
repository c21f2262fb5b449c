//! Rule 4 for WorkflowRetry objects, under what Sieve calls intermediate and stale states: a
//! request whose end cannot be recorded, or that resumes after a crash, never creates or
//! resets its workflow a second time; and a WorkflowRetry never overwrites a user's request
//! that reached the workflow after it looked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use axum::Json;
use axum::extract::State;
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rewind::argo::db::ArgoDatabase;
use rewind::argo::workflow::Workflow;
use rewind::argoapi::tls::{CertFiles, server_config};
use rewind::protocol::crd::{CREATED_BY, CREATING, WorkflowRetry};
use rewind::protocol::request::{RetryPhase, annotations};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role};
use rewind::testenv::workload::FailedDag;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::archived::Rows;
use crate::support::controller as ctl;
use crate::support::refusal::{StatusRefusal, refused_status_writes};
use crate::support::workflowretry::{archived, live, phase_and_message, wait_finished};

const WAIT: Duration = Duration::from_secs(60);

/// The workflow of `dag` as Argo archived it (no pods: the retry has none left to delete),
/// deleted from the cluster; its row and old UID.
async fn archived_row(
    workflows: &Api<Workflow>,
    dag: &FailedDag,
    namespace: &str,
) -> anyhow::Result<(Workflow, String)> {
    workflows
        .create(&PostParams::default(), &dag.workflow(namespace))
        .await?;
    let row = workflows.get(&dag.name).await?;
    let uid = row.uid().context("a created workflow has a UID")?;
    delete_and_wait(workflows, &dag.name).await?;
    Ok((row, uid))
}

async fn delete_and_wait(workflows: &Api<Workflow>, name: &str) -> anyhow::Result<()> {
    workflows.delete(name, &DeleteParams::background()).await?;
    wait_gone(workflows, name).await
}

/// Waits until workflow `name`, whose deletion was asked, is gone.
async fn wait_gone(workflows: &Api<Workflow>, name: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while workflows.get_opt(name).await?.is_some() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "workflow {name} was not deleted within 20s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The codes of the controller's `verb` requests on workflow `name`, in the audit log.
fn controller_writes(
    cluster: &LocalCluster,
    namespace: &str,
    verb: &str,
    name: &str,
) -> anyhow::Result<Vec<u16>> {
    Ok(ctl::audit_log(cluster, namespace)?
        .iter()
        .filter(|a| {
            a.user == CONTROLLER_NAME
                && a.verb == verb
                && a.resource == "workflows"
                && a.name == name
                && !a.dry_run
        })
        .map(|a| a.code)
        .collect())
}

/// Finding 4: the status saying an archived retry created its workflow is refused (a
/// ValidatingAdmissionPolicy), and the created workflow is then deleted (as its TTL would
/// after a fast failure). The workflow stays, held by rewind's finalizer, until its UID is
/// recorded; the controller, serving the unfinished request again, must never create it a
/// second time; once the status can be written, the request ends Succeeded naming the
/// workflow it created, and the deletion completes.
pub async fn an_archived_retry_whose_end_is_not_recorded_never_creates_again(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    const REQUEST: &str = "retry-archived";
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 6,
        succeeded: 1,
    };
    let (row, old_uid) = archived_row(&workflows, &dag, &namespace).await?;
    let archive: Arc<dyn ArgoDatabase> = Arc::new(Rows(BTreeMap::from([(old_uid.clone(), row)])));
    let request = retries
        .create(&PostParams::default(), &archived(REQUEST, &old_uid))
        .await?;
    let request_uid = request.uid().unwrap_or_default();
    let policy = StatusRefusal::install(&cluster, &namespace, &retries, REQUEST).await?;
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(archive),
    )
    .await?;

    let deadline = tokio::time::Instant::now() + WAIT;
    let first = loop {
        let created = workflows
            .get_metadata_opt(&dag.name)
            .await?
            .filter(|w| w.annotations().get(CREATED_BY) == Some(&request_uid));
        if let Some(created) = created
            && refused_status_writes(&cluster, &namespace, REQUEST)? > 0
        {
            break created.uid().context("a created workflow has a UID")?;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no create followed by a refused status write within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    workflows
        .delete(&dag.name, &DeleteParams::background())
        .await?;
    // The controller tries the unfinished request again 1, 2 and 4 s later (its backoff).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while tokio::time::Instant::now() < deadline {
        let creates = controller_writes(&cluster, &namespace, "create", &dag.name)?;
        ensure!(
            creates.len() == 1,
            "the request whose end was not recorded created workflow {} again: the controller's creates answered {creates:?}",
            dag.name
        );
        let held = workflows.get_metadata_opt(&dag.name).await?;
        ensure!(
            held.as_ref()
                .is_some_and(|w| w.uid().as_deref() == Some(first.as_str())
                    && w.finalizers().iter().any(|f| f == CREATING)),
            "the created workflow {} went before its UID was recorded: {held:?}",
            dag.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    policy.remove(&retries).await?;
    let finished = wait_finished(&retries, REQUEST).await?;
    controller.stop().await?;
    let status = finished.status.clone().unwrap_or_default();
    ensure!(
        status.phase == Some(RetryPhase::Succeeded)
            && status.workflow_uid.as_deref() == Some(first.as_str()),
        "expected Succeeded naming the workflow created first (UID {first}): {status:?}"
    );
    let creates = controller_writes(&cluster, &namespace, "create", &dag.name)?;
    ensure!(
        creates == [201],
        "expected exactly one create of workflow {}, the controller's creates answered {creates:?}",
        dag.name
    );
    // Recorded, the workflow is released and its deletion completes.
    wait_gone(&workflows, &dag.name).await?;
    Ok(())
}

/// Finding 4, after a crash: three archived requests whose controller stopped during the
/// create, each on a workflow of its own. One stopped after its status said Committing and
/// before the create: its workflow is not there, so it was never created (a created one is
/// held by rewind's finalizer until its UID is recorded), and it is created once. One
/// stopped after the create and before recording it: its workflow is there, held, though
/// deleted meanwhile (by its TTL, say); it ends Succeeded naming it, creates nothing, and
/// releases it. One stopped after its status named the created workflow, since gone: it ends
/// Succeeded saying so, and creates nothing.
pub async fn an_archived_retry_resumed_in_its_create_creates_exactly_once(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let [before, unrecorded, after] = ["before-create", "unrecorded", "after-create"];
    let mut rows = BTreeMap::new();
    let mut requests = BTreeMap::new();
    for name in [before, unrecorded, after] {
        let dag = FailedDag {
            name: name.into(),
            failed: 3,
            succeeded: 1,
        };
        let (row, old_uid) = archived_row(&workflows, &dag, &namespace).await?;
        rows.insert(old_uid.clone(), row);
        let request = retries
            .create(&PostParams::default(), &archived(name, &old_uid))
            .await?;
        let mut status = json!({"phase": "Committing", "workflowName": name});
        if name == after {
            status["workflowUID"] = json!("0b5c6f9e-1d2a-4c3b-9e8f-7a6b5c4d3e2f");
        }
        retries
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await?;
        requests.insert(name, request.uid().unwrap_or_default());
    }
    // What the create of `unrecorded` left: its workflow, held, then deleted.
    let mut held = FailedDag {
        name: unrecorded.into(),
        failed: 3,
        succeeded: 1,
    }
    .workflow(&namespace);
    held.metadata
        .annotations
        .get_or_insert_default()
        .insert(CREATED_BY.into(), requests[unrecorded].clone());
    held.metadata.finalizers = Some(vec![CREATING.into()]);
    let held_uid = workflows
        .create(&PostParams::default(), &held)
        .await?
        .uid()
        .unwrap_or_default();
    workflows
        .delete(unrecorded, &DeleteParams::background())
        .await?;

    let archive: Arc<dyn ArgoDatabase> = Arc::new(Rows(rows));
    let controller = ctl::start_with_archive(
        &cluster,
        &namespace,
        ctl::options(50, 50, true),
        Some(archive),
    )
    .await?;
    let ended: Vec<_> = futures::future::join_all(
        [before, unrecorded, after].map(|name| wait_finished(&retries, name)),
    )
    .await;
    controller.stop().await?;
    let [ended_before, ended_unrecorded, ended_after] =
        <[_; 3]>::try_from(ended).map_err(|_| anyhow::anyhow!("three requests"))?;

    let (phase, message) = phase_and_message(&ended_before?);
    let created = workflows.get_metadata_opt(before).await?;
    ensure!(
        phase == Some(RetryPhase::Succeeded)
            && controller_writes(&cluster, &namespace, "create", before)? == [201]
            && created.as_ref().is_some_and(|w| {
                w.annotations().get(CREATED_BY) == Some(&requests[before])
                    && !w.finalizers().iter().any(|f| f == CREATING)
            }),
        "the request stopped before its create should create its workflow once, released: {phase:?} {message:?}, {created:?}"
    );

    let status = ended_unrecorded?.status.unwrap_or_default();
    let creates = controller_writes(&cluster, &namespace, "create", unrecorded)?;
    ensure!(
        status.phase == Some(RetryPhase::Succeeded)
            && status.workflow_uid.as_deref() == Some(held_uid.as_str())
            && creates.is_empty(),
        "the request stopped before recording its create should end Succeeded naming workflow {held_uid}, creating nothing: {status:?}, creates {creates:?}"
    );
    wait_gone(&workflows, unrecorded).await?;

    let (phase, message) = phase_and_message(&ended_after?);
    let creates = controller_writes(&cluster, &namespace, "create", after)?;
    ensure!(
        phase == Some(RetryPhase::Succeeded)
            && message.contains("no longer in the cluster")
            && creates.is_empty(),
        "the request stopped after recording its create should end Succeeded saying the workflow is gone, creating nothing: {phase:?} {message:?}, creates {creates:?}"
    );
    Ok(())
}

/// Finding 5: a WorkflowRetry's request reset the workflow, and the controller stopped before
/// the WorkflowRetry said so (its status still DeletingPods). Meanwhile the workflow ran and
/// failed again, and a user's request was answered (as a controller leaves it: Failed, for a
/// bad option), overwriting the workflow's record and report of the first. Resumed, the
/// WorkflowRetry must not ask again: the workflow is reset once, and the WorkflowRetry ends
/// with an answer naming the user's request.
pub async fn a_resumed_live_workflowretry_never_asks_twice(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 6,
        succeeded: 2,
    };
    let failed = dag.create(&admin, &namespace, 8, || ()).await?;
    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    retries
        .create(&PostParams::default(), &live("retry-wf", &dag.name, None))
        .await?;
    let (phase, message) = phase_and_message(&wait_finished(&retries, "retry-wf").await?);
    ensure!(
        phase == Some(RetryPhase::Succeeded),
        "the first retry should succeed: {message}"
    );
    controller.stop().await?;

    // What a crash right before the WorkflowRetry recorded the end leaves.
    let unfinished = json!({"status": {"phase": "DeletingPods", "message": "", "conditions": [], "finishedAt": null}});
    retries
        .patch_status(
            "retry-wf",
            &PatchParams::default(),
            &Patch::Merge(&unfinished),
        )
        .await?;
    // Argo ran the reset workflow, which failed again; a user's request was then answered.
    let mut again = workflows.get(&dag.name).await?;
    again.status = failed.status.clone();
    again.metadata.labels = failed.metadata.labels.clone();
    let answered = json!({
        "token": "user-1", "phase": "Failed", "podsTotal": 0, "podsDeleted": 0,
        "message": "annotation rewind.dev/restart-successful must be \"true\" or \"false\", not \"maybe\"",
    });
    let on_workflow = again.metadata.annotations.get_or_insert_default();
    for (key, value) in [
        (annotations::RETRY, "user-1".to_owned()),
        (annotations::RESTART_SUCCESSFUL, "maybe".to_owned()),
        (annotations::OBSERVED, "user-1".to_owned()),
        (annotations::STATUS, answered.to_string()),
    ] {
        on_workflow.insert(key.into(), value);
    }
    workflows
        .replace(&dag.name, &PostParams::default(), &again)
        .await?;

    let controller = ctl::start(&cluster, &namespace, ctl::options(50, 50, true)).await?;
    let finished = wait_finished(&retries, "retry-wf").await;
    // Time for a second ask, had there been one, to reset the workflow.
    tokio::time::sleep(Duration::from_secs(2)).await;
    controller.stop().await?;
    let resets: Vec<u16> = controller_writes(&cluster, &namespace, "update", &dag.name)?
        .into_iter()
        .filter(|code| *code == 200)
        .collect();
    ensure!(
        resets.len() == 1,
        "one WorkflowRetry reset workflow {} {} times",
        dag.name,
        resets.len()
    );
    let (phase, message) = phase_and_message(&finished?);
    ensure!(
        phase.is_some_and(RetryPhase::is_finished) && message.contains("user-1"),
        "the WorkflowRetry should end naming the request that replaced its own: {phase:?} {message:?}"
    );
    Ok(())
}

/// Finding 8: a user's request reaches the workflow while the WorkflowRetry's ask is inside the
/// API server (held there by an admission webhook: the WorkflowRetry decided from a view
/// without it). The ask must not overwrite it: the user's request is served and answered, and
/// the WorkflowRetry ends with an answer of its own, after it.
pub async fn a_workflowretry_never_overwrites_a_users_request_asked_meanwhile(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let retries: Api<WorkflowRetry> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "wf".into(),
        failed: 6,
        succeeded: 2,
    };
    dag.create(&admin, &namespace, 8, || ()).await?;
    let hold = Hold::install(&cluster, &namespace, &dag.name).await?;
    // Two single deletes a second: the user's request is still deleting when the held ask
    // is let go.
    let controller = ctl::start(&cluster, &namespace, ctl::options(2, 1, false)).await?;
    retries
        .create(&PostParams::default(), &live("retry-wf", &dag.name, None))
        .await?;
    tokio::time::timeout(WAIT, hold.held.notified())
        .await
        .context("the WorkflowRetry did not ask within 60s")?;
    ctl::request_retry(&cluster, &namespace, &dag.name, "user-1").await?;
    hold.release.cancel();

    let user_end = ctl::wait_finished(&workflows, &dag.name, "user-1", WAIT).await;
    let finished = wait_finished(&retries, "retry-wf").await;
    controller.stop().await?;
    hold.remove().await?;
    let (_, user_status) = user_end.with_context(
        || "the user's request was overwritten by the WorkflowRetry's ask, and never answered",
    )?;
    ensure!(
        user_status.phase == RetryPhase::Succeeded,
        "the user's request should reset the workflow: {user_status:?}"
    );
    let resets: Vec<u16> = controller_writes(&cluster, &namespace, "update", &dag.name)?
        .into_iter()
        .filter(|code| *code == 200)
        .collect();
    ensure!(
        resets.len() == 1,
        "expected one reset (the user's), the controller reset workflow {} {} times",
        dag.name,
        resets.len()
    );
    let (phase, message) = phase_and_message(&finished?);
    ensure!(
        phase == Some(RetryPhase::Failed) && message.contains("user-1"),
        "the WorkflowRetry, asked after the user's request reset the workflow, should be refused naming it: {phase:?} {message:?}"
    );
    Ok(())
}

/// A validating admission webhook on loopback that holds the controller's first write of a
/// workflow in one namespace until released: the API server has applied the write's patch
/// to the workflow as it stood, and stores it once the webhook answers.
struct Hold {
    name: String,
    admin: kube::Client,
    /// Notified when the first write is held.
    held: Arc<Notify>,
    release: CancellationToken,
    stop: CancellationToken,
}

#[derive(Clone)]
struct HoldState {
    first: Arc<AtomicBool>,
    probed: Arc<AtomicBool>,
    held: Arc<Notify>,
    release: CancellationToken,
}

async fn review(State(state): State<HoldState>, Json(review): Json<Value>) -> Json<Value> {
    let request = &review["request"];
    if request["dryRun"].as_bool() == Some(true) {
        state.probed.store(true, Ordering::SeqCst);
    } else if !state.first.swap(true, Ordering::SeqCst) {
        state.held.notify_one();
        state.release.cancelled().await;
    }
    Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": request["uid"], "allowed": true},
    }))
}

impl Hold {
    async fn install(
        cluster: &LocalCluster,
        namespace: &str,
        workflow: &str,
    ) -> anyhow::Result<Hold> {
        let dir = cluster.dir().join(format!("hold-{namespace}"));
        std::fs::create_dir_all(&dir)?;
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])?;
        let files = CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, cert.cert.pem())?;
        std::fs::write(&files.key, cert.signing_key.serialize_pem())?;
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = tcp.local_addr()?.port();
        let config = server_config(&files)?;
        let state = HoldState {
            first: Arc::default(),
            probed: Arc::default(),
            held: Arc::default(),
            release: CancellationToken::new(),
        };
        let app = axum::Router::new()
            .route("/hold", axum::routing::post(review))
            .with_state(state.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            rewind::argoapi::listener::serve(tcp, Some(config), app, Default::default(), stopped)
                .await
        });

        let admin = cluster.admin_client();
        let name = format!("{namespace}-hold");
        let bundle = base64::engine::general_purpose::STANDARD.encode(cert.cert.pem());
        let webhook: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "hold.rewind.test",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/hold"), "caBundle": bundle},
                "rules": [{
                    "apiGroups": ["argoproj.io"], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": ["workflows"],
                }],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "matchConditions": [{
                    "name": "the-controller",
                    "expression": format!("request.userInfo.username == '{CONTROLLER_NAME}'"),
                }],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 30,
            }],
        }))?;
        Api::<ValidatingWebhookConfiguration>::all(admin.clone())
            .create(&PostParams::default(), &webhook)
            .await?;
        let hold = Hold {
            name,
            admin,
            held: state.held.clone(),
            release: state.release.clone(),
            stop,
        };
        // The API server calls the webhook once its configuration reached the admission chain:
        // probe with dry runs as the controller until it does.
        let controller = kube::Client::try_from(cluster.config(Role::Controller).await?)?;
        let as_controller: Api<Workflow> = Api::namespaced(controller, namespace);
        let probe = json!({"metadata": {"annotations": {"rewind.test/probe": "1"}}});
        let params = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !state.probed.load(Ordering::SeqCst) {
            as_controller
                .patch_metadata(workflow, &params, &Patch::Merge(&probe))
                .await?;
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the API server did not call the webhook within 30s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(hold)
    }

    async fn remove(self) -> anyhow::Result<()> {
        self.release.cancel();
        Api::<ValidatingWebhookConfiguration>::all(self.admin.clone())
            .delete(&self.name, &DeleteParams::default())
            .await?;
        self.stop.cancel();
        Ok(())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release.cancel();
    }
}
