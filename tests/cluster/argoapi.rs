//! Argo's retry API served by the controller, called over HTTP(S) by curl as Argo's
//! clients call it, with real ServiceAccount tokens: who may retry what, the answers'
//! shapes, and that a retry through the API is the planner's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rewind::argo::db::ArgoDatabase;
use rewind::argo::workflow::{Workflow, labels};
use rewind::argoapi::auth::AuthMode;
use rewind::argoapi::tls::CertFiles;
use rewind::controller::ArgoApiOptions;
use rewind::protocol::crd::{AskedBy, WorkflowRetry};
use rewind::protocol::request::RetryPhase;
use rewind::testenv::clients::{self, ArgoServer, Dex};
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster, Role as ClusterRole};
use rewind::testenv::workload::FailedDag;
use serde_json::{Value, json};

use crate::support::archived::Rows;
use crate::support::argo_api::{call, free_addr, put};
use crate::support::controller as ctl;
use crate::support::grants::{account, delete_pods, named, workflow_verbs};

/// Checks an error answer: grpc-gateway's shape, `http` and `code`, a message holding `words`.
fn ensure_status(answer: &(u16, Value), http: u16, code: i64, words: &str) -> anyhow::Result<()> {
    let (status, body) = answer;
    ensure!(
        *status == http && body["code"] == code && body["details"] == json!([]),
        "expected HTTP {http} with gRPC code {code}, got {status} {body}"
    );
    let message = body["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains(words),
        "the message should say {words:?}: {message}"
    );
    Ok(())
}

fn api_options(addr: SocketAddr, tls: Option<CertFiles>) -> ArgoApiOptions {
    rewind::testenv::clients::client_mode_api(addr, tls)
}

/// A self-signed certificate for 127.0.0.1 in `dir`, as the chart generates one.
fn certificate(dir: &Path) -> anyhow::Result<CertFiles> {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    let files = CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, cert.cert.pem())?;
    std::fs::write(&files.key, cert.signing_key.serialize_pem())?;
    Ok(files)
}

/// Over TLS with client-mode tokens: no token, a tampered one and one without `update` are
/// refused (401, 401, 403 naming the verb and namespace) and leave every pod; a Running
/// workflow is refused in Argo's words; a missing one is Argo's 404; the allowed call answers
/// with the reset workflow, the planner's, and only the controller deleted pods.
pub async fn argos_retry_call_is_authorized_like_argos_and_answers_the_reset_workflow(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 12,
        succeeded: 3,
    };
    let before = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&before)?;
    let selector = format!("{}={}", labels::WORKFLOW, dag.name);
    let pods_before = ctl::pod_names(&cluster, &namespace, &selector).await?;
    let allowed = account(
        &admin,
        &namespace,
        "alice",
        &[workflow_verbs(&["get", "update"]), delete_pods()],
    )
    .await?;
    let reader = account(
        &admin,
        &namespace,
        "bob",
        &[workflow_verbs(&["get", "list", "patch"])],
    )
    .await?;
    // Everything on workflows but no pods: Argo's server fails deleting the pods as them.
    let podless = account(
        &admin,
        &namespace,
        "erin",
        &[workflow_verbs(&["get", "list", "update", "patch"])],
    )
    .await?;

    let dir = cluster.dir().join(format!("argoapi-{namespace}"));
    std::fs::create_dir_all(&dir)?;
    let tls = certificate(&dir)?;
    let ca = tls.cert.clone();
    let addr = free_addr()?;
    let mut options = ctl::options(50, 50, true);
    options.argo_api = Some(api_options(addr, Some(tls)));
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let url = |name: &str| format!("https://{addr}/api/v1/workflows/{namespace}/{name}/retry");
    let body = json!({"name": "wf", "namespace": namespace});
    let ca = Some(ca.as_path());

    let none = put(&url("wf"), None, &body, ca).await?;
    ensure_status(&none, 401, 16, "token not valid")?;
    ensure_status(&none, 401, 16, "carried no token")?;
    let tampered = format!("Bearer {}x", allowed);
    ensure_status(
        &put(&url("wf"), Some(&tampered), &body, ca).await?,
        401,
        16,
        "token not valid",
    )?;
    let denied = put(&url("wf"), Some(&format!("Bearer {reader}")), &body, ca).await?;
    ensure_status(
        &denied,
        403,
        7,
        &format!(
            "system:serviceaccount:{namespace}:bob (client mode (a Kubernetes token)) may not update workflows.argoproj.io in namespace {namespace}"
        ),
    )?;
    let podless = put(&url("wf"), Some(&format!("Bearer {podless}")), &body, ca).await?;
    ensure_status(
        &podless,
        403,
        7,
        &format!(
            "system:serviceaccount:{namespace}:erin (client mode (a Kubernetes token)) may not delete pods in namespace {namespace}"
        ),
    )?;
    // Names that are no names are refused before any review: an escaped NUL, a query.
    for bad in ["a%00b", "a%3Fx=1", "UPPER"] {
        ensure_status(
            &put(&url(bad), Some(&format!("Bearer {allowed}")), &body, ca).await?,
            400,
            3,
            "is not a DNS-1123 subdomain",
        )?;
    }
    ensure!(
        ctl::pod_names(&cluster, &namespace, &selector).await? == pods_before,
        "a refused call deleted pods"
    );
    let bearer = format!("Bearer {allowed}");
    ensure_status(
        &put(&url("nope"), Some(&bearer), &body, ca).await?,
        404,
        5,
        "workflows.argoproj.io \"nope\" not found",
    )?;

    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let (status, answer) = put(&url("wf"), Some(&bearer), &body, ca).await?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    ensure!(
        status == 200,
        "the allowed retry answered {status}: {answer}"
    );
    let answered: Workflow = serde_json::from_value(answer)?;
    ensure!(
        answered.name_any() == "wf"
            && answered.metadata.namespace.as_deref() == Some(namespace.as_str()),
        "the answer is not the workflow: {:?}",
        answered.metadata
    );
    ctl::ensure_reset_as_planned(&answered, &plan.workflow, from, to)?;
    let left = ctl::pod_names(&cluster, &namespace, &selector).await?;
    ensure!(
        left.iter().all(|p| !plan.pods_to_delete.contains(p))
            && left.len() == pods_before.len() - plan.pods_to_delete.len(),
        "the retry did not delete exactly the plan's pods: {left:?}"
    );
    let deleters: Vec<String> = ctl::audit_log(&cluster, &namespace)?
        .into_iter()
        .filter(|a| {
            a.resource == "pods" && matches!(a.verb.as_str(), "delete" | "deletecollection")
        })
        .map(|a| a.user)
        .collect();
    ensure!(
        !deleters.is_empty() && deleters.iter().all(|u| u == CONTROLLER_NAME),
        "pods must be deleted by the controller alone: {deleters:?}"
    );
    // The call left a WorkflowRetry where an operator sees what it did, and who asked.
    let objects = Api::<WorkflowRetry>::namespaced(admin.clone(), &namespace)
        .list(&Default::default())
        .await?
        .items;
    let alice = format!("system:serviceaccount:{namespace}:alice");
    for object in &objects {
        let asker = AskedBy::of(object);
        ensure!(
            asker.as_ref().is_some_and(|a| a.user == alice
                && a.groups.contains(&"system:serviceaccounts".to_owned())
                && a.acting_as.is_none()),
            "the WorkflowRetry should record {alice} and their groups as its asker: {asker:?}"
        );
        let started = format!("rewind started the retry asked by {alice} (groups ");
        ctl::wait_event_note(
            &cluster,
            &namespace,
            &object.name_any(),
            "RetryStarted",
            &started,
        )
        .await?;
    }
    let asked: Vec<_> = objects
        .into_iter()
        .map(|r| (r.spec.workflow_name.clone(), r.status.unwrap_or_default()))
        .map(|(w, s)| (w, s.phase, s.pods_deleted, s.pods_total))
        .collect();
    let deleted = plan.pods_to_delete.len() as u64;
    ensure!(
        asked
            == [(
                Some("wf".into()),
                Some(RetryPhase::Succeeded),
                deleted,
                deleted
            )],
        "the call should leave one Succeeded WorkflowRetry of wf counting {deleted} pods: {asked:?}"
    );

    // The reset workflow has no phase until Argo's controller runs it: Argo refuses that.
    let again = put(&url("wf"), Some(&bearer), &body, ca).await?;
    ensure_status(&again, 400, 3, "Cannot retry a workflow in phase")?;
    controller.stop().await
}

/// The archived call: it needs `create` on workflows (403 without, naming it), a
/// namespace (400), and creates the archived workflow as the planner says, answering with it.
pub async fn argos_archived_retry_call_creates_the_workflow(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let workflows: Api<Workflow> = Api::namespaced(admin.clone(), &namespace);
    let dag = FailedDag {
        name: "old".into(),
        failed: 3,
        succeeded: 1,
    };
    // Archived and gone, its pods with it.
    let row = workflows
        .create(&PostParams::default(), &dag.workflow(&namespace))
        .await?;
    let uid = row.uid().context("a created workflow has a UID")?;
    workflows.delete("old", &DeleteParams::background()).await?;
    while workflows.get_opt("old").await?.is_some() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plan = ctl::expected_plan(&row)?;
    let creator = account(
        &admin,
        &namespace,
        "carol",
        &[workflow_verbs(&["get", "create"]), delete_pods()],
    )
    .await?;
    let updater = account(
        &admin,
        &namespace,
        "dave",
        &[workflow_verbs(&["get", "update"]), delete_pods()],
    )
    .await?;

    let archive: Arc<dyn ArgoDatabase> = Arc::new(Rows(BTreeMap::from([(uid.clone(), row)])));
    let addr = free_addr()?;
    let mut options = ctl::options(50, 50, true);
    options.argo_api = Some(api_options(addr, None));
    let controller = ctl::start_with_archive(&cluster, &namespace, options, Some(archive)).await?;
    let url = format!("http://{addr}/api/v1/archived-workflows/{uid}/retry");
    let body = json!({"uid": uid, "namespace": namespace});

    ensure_status(
        &put(&url, Some(&format!("Bearer {updater}")), &body, None).await?,
        403,
        7,
        &format!("may not create workflows.argoproj.io in namespace {namespace}"),
    )?;
    let bearer = format!("Bearer {creator}");
    ensure_status(
        &put(&url, Some(&bearer), &json!({"uid": uid}), None).await?,
        400,
        3,
        "names no namespace",
    )?;
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let (status, answer) = put(&url, Some(&bearer), &body, None).await?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    ensure!(
        status == 200,
        "the archived retry answered {status}: {answer}"
    );
    let created: Workflow = serde_json::from_value(answer)?;
    ensure!(
        created.name_any() == "old" && created.uid() != Some(uid.clone()),
        "the answer is not the created workflow: {:?}",
        created.metadata
    );
    // Argo clears the UID and resourceVersion; the API server sets a new creation time.
    let mut expected = plan.workflow;
    let mut actual = created.clone();
    for wf in [&mut expected, &mut actual] {
        wf.metadata.uid = None;
        wf.metadata.resource_version = None;
        wf.metadata.creation_timestamp = None;
    }
    ctl::ensure_reset_as_planned(&actual, &expected, from, to)?;
    // Argo's words when the workflow exists live, with its code: AlreadyExists.
    ensure_status(
        &put(&url, Some(&bearer), &body, None).await?,
        409,
        6,
        "Workflow already exists on cluster, use argo retry old instead",
    )?;
    controller.stop().await
}

/// Server auth mode (Argo's `--auth-mode server`): callers need no token and act as the
/// Argo Server's ServiceAccount, as with Argo; rewind authorizes that account, so what it
/// may not do is refused (403 naming it) and what it may is done.
pub async fn in_server_mode_a_call_acts_as_the_argo_servers_account(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 4,
        succeeded: 1,
    };
    let before = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&before)?;
    // The Argo Server's account may read workflows but not update them, at first.
    account(
        &admin,
        &namespace,
        "argo-server",
        &[workflow_verbs(&["get"])],
    )
    .await?;
    let addr = free_addr()?;
    let mut options = ctl::options(50, 50, true);
    let mut api = api_options(addr, None);
    api.settings.modes = vec![AuthMode::Server];
    api.settings.server_account = Some(
        format!("{namespace}/argo-server")
            .parse()
            .map_err(anyhow::Error::msg)?,
    );
    options.argo_api = Some(api);
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let url = format!("http://{addr}/api/v1/workflows/{namespace}/wf/retry");
    let selector = format!("{}=wf", labels::WORKFLOW);
    let pods_before = ctl::pod_names(&cluster, &namespace, &selector).await?;
    ensure_status(
        &put(&url, None, &json!({}), None).await?,
        403,
        7,
        &format!(
            "system:serviceaccount:{namespace}:argo-server (server mode) may not update workflows.argoproj.io in namespace {namespace}"
        ),
    )?;
    ensure!(
        ctl::pod_names(&cluster, &namespace, &selector).await? == pods_before,
        "a refused call deleted pods"
    );
    Api::<Role>::namespaced(admin.clone(), &namespace)
        .patch(
            "argo-server",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": [workflow_verbs(&["get", "update"]), delete_pods()]})),
        )
        .await?;
    let from = Timestamp::now() - SignedDuration::from_secs(1);
    // Any token, or none, is the server's account in server mode alone. RBAC's cache takes
    // the new rule within moments; a refused call deletes nothing, so asking again is safe.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let (status, answer) = loop {
        let answer = put(&url, Some("Bearer whatever"), &json!({}), None).await?;
        if answer.0 != 403 || tokio::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    ensure!(
        status == 200,
        "the server-mode retry answered {status}: {answer}"
    );
    ctl::ensure_reset_as_planned(&serde_json::from_value(answer)?, &plan.workflow, from, to)?;
    controller.stop().await
}

/// A ServiceAccount `name` holding `rules`, which Argo's SSO RBAC maps the
/// users `rule` matches to at `precedence`: its annotations, and its token in the Secret
/// Argo reads it from (`NAME.service-account-token`).
async fn sso_account(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    rules: &[PolicyRule],
    rule: &str,
    precedence: &str,
) -> anyhow::Result<()> {
    let token = account(admin, namespace, name, rules).await?;
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "workflows.argoproj.io/rbac-rule": rule,
                "workflows.argoproj.io/rbac-rule-precedence": precedence,
            }}})),
        )
        .await?;
    secret(
        admin,
        namespace,
        &format!("{name}.service-account-token"),
        &[("token", &token)],
    )
    .await
}

/// `rules` in `namespace` for the ServiceAccount `name` of `account_namespace`.
async fn grant(
    admin: &kube::Client,
    namespace: &str,
    account_namespace: &str,
    name: &str,
    rules: Vec<PolicyRule>,
) -> anyhow::Result<()> {
    let role = format!("{account_namespace}-{name}");
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &Role {
                metadata: named(&role),
                rules: Some(rules),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: named(&role),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: role.clone(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.into(),
                    namespace: Some(account_namespace.into()),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Ok(())
}

async fn secret(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    data: &[(&str, &str)],
) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: named(name),
                string_data: Some(
                    data.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("creating Secret {name}"))?;
    Ok(())
}

/// Argo's SSO in `namespace` (the Argo Server's, where it reads them): its client in dex
/// with `users`, the secrets it reads, its ConfigMap `argo-sso` with SSO RBAC on. Dex, and
/// the port the Argo Server must listen on (dex's redirect names it).
async fn sso_provider(
    admin: &kube::Client,
    namespace: &str,
    users: &[&str],
) -> anyhow::Result<(Dex, u16)> {
    let client_secret = format!("secret-{}", fastrand::u64(..));
    secret(
        admin,
        namespace,
        "argo-server-sso",
        &[
            ("client-id", "argo-server"),
            ("client-secret", &client_secret),
        ],
    )
    .await?;
    let argo_port = rewind::testenv::free_port()?;
    let redirect = format!("http://127.0.0.1:{argo_port}/oauth2/callback");
    let dex = Dex::start("argo-server", &client_secret, &redirect, users).await?;
    let sso = json!({
        "issuer": dex.issuer,
        "clientId": {"name": "argo-server-sso", "key": "client-id"},
        "clientSecret": {"name": "argo-server-sso", "key": "client-secret"},
        "redirectUrl": redirect,
        "scopes": ["email"],
        "rbac": {"enabled": true},
    });
    Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: named("argo-sso"),
                data: Some(BTreeMap::from([("sso".to_owned(), sso.to_string())])),
                ..Default::default()
            },
        )
        .await?;
    Ok((dex, argo_port))
}

/// SSO auth mode: a real `argo server --auth-mode sso` logs users in through dex (SSO RBAC
/// on), and rewind asks it who a `v2:` token is (`/api/v1/userinfo`) and authorizes the
/// ServiceAccount it names. The user mapped to an account without `update` is refused (403
/// naming it) and leaves every pod, a tampered token is refused (401), and the user mapped
/// to an account with it has the workflow reset as planned, its pods deleted by rewind.
pub async fn in_sso_mode_a_call_acts_as_the_account_argos_sso_rbac_maps_the_user_to(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 5,
        succeeded: 2,
    };
    let before = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&before)?;
    let selector = format!("{}=wf", labels::WORKFLOW);
    let pods_before = ctl::pod_names(&cluster, &namespace, &selector).await?;
    let (alice, bob) = ("alice@example.com", "bob@example.com");
    let rule = |email: &str| format!("email == '{email}'");
    sso_account(
        &admin,
        &namespace,
        "sso-retrier",
        &[workflow_verbs(&["get", "update"]), delete_pods()],
        &rule(alice),
        "1",
    )
    .await?;
    sso_account(
        &admin,
        &namespace,
        "sso-reader",
        &[workflow_verbs(&["get"])],
        &rule(bob),
        "1",
    )
    .await?;

    let (dex, argo_port) = sso_provider(&admin, &namespace, &[alice, bob]).await?;
    let argo = rewind::testenv::argo::binary("cli")?;
    let server =
        ArgoServer::start_in(&cluster, &argo, &namespace, "argo-sso", "sso", argo_port).await?;

    let addr = free_addr()?;
    let mut options = ctl::options(50, 50, true);
    let mut api = api_options(addr, None);
    api.settings.modes = vec![AuthMode::Sso];
    api.settings.argo_server = Some(argo_server(server.addr)?);
    api.settings.sso_rbac = Some(true);
    options.argo_api = Some(api);
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let url = format!("http://{addr}/api/v1/workflows/{namespace}/wf/retry");
    let body = json!({"name": "wf", "namespace": namespace});

    let logs = || {
        format!(
            "argo server's log:\n{}\ndex's log:\n{}",
            rewind::testenv::argo::log_tail(server.log_path()),
            rewind::testenv::argo::log_tail(dex.log_path())
        )
    };
    let reader = clients::sso_login(server.addr, bob)
        .await
        .with_context(logs)?;
    let retrier = clients::sso_login(server.addr, alice)
        .await
        .with_context(logs)?;
    ensure_status(
        &put(&url, Some(&reader), &body, None).await?,
        403,
        7,
        &format!(
            "system:serviceaccount:{namespace}:sso-reader (SSO (the ServiceAccount Argo's SSO RBAC maps the user to)) may not update workflows.argoproj.io in namespace {namespace}"
        ),
    )?;
    ensure_status(
        &put(&url, Some(&format!("{retrier}x")), &body, None).await?,
        401,
        16,
        "the Argo Server refused this SSO token",
    )?;
    ensure!(
        ctl::pod_names(&cluster, &namespace, &selector).await? == pods_before,
        "a refused call deleted pods"
    );

    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let (status, answer) = put(&url, Some(&retrier), &body, None).await?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    ensure!(status == 200, "the SSO retry answered {status}: {answer}");
    ctl::ensure_reset_as_planned(&serde_json::from_value(answer)?, &plan.workflow, from, to)?;
    let deleters: Vec<String> = ctl::audit_log(&cluster, &namespace)?
        .into_iter()
        .filter(|a| {
            a.resource == "pods" && matches!(a.verb.as_str(), "delete" | "deletecollection")
        })
        .map(|a| a.user)
        .collect();
    ensure!(
        !deleters.is_empty() && deleters.iter().all(|u| u == CONTROLLER_NAME),
        "pods must be deleted by the controller alone: {deleters:?}"
    );
    let login = format!("system:serviceaccount:{namespace}:sso-retrier");
    ensure_asked_by_sso(&admin, &namespace, alice, &login).await?;
    controller.stop().await?;
    server.stop().await?;
    dex.stop().await?;
    Ok(())
}

/// The Argo Server at `addr` (plain HTTP), as rewind's settings name it.
fn argo_server(addr: SocketAddr) -> anyhow::Result<rewind::argoapi::ArgoServer> {
    Ok(rewind::argoapi::ArgoServer {
        url: format!("http://{addr}").parse()?,
        ca_file: None,
        insecure_skip_verify: false,
    })
}

/// rewind's Argo API on its own, over plain HTTP with the controller's credentials, until the
/// guard is dropped: where a call is refused nothing is written, so no controller is needed.
async fn api_alone(
    cluster: &LocalCluster,
    settings: &rewind::argoapi::Settings,
) -> anyhow::Result<(SocketAddr, tokio_util::sync::DropGuard)> {
    let client = kube::Client::try_from(cluster.config(ClusterRole::Controller).await?)?;
    let api = rewind::argoapi::ArgoApi::new(client.clone(), client, settings)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(rewind::argoapi::serve(listener, None, api, stop.clone()));
    Ok((addr, stop.drop_guard()))
}

/// SSO RBAC as Argo's gatekeeper applies it, with the real `argo server` and dex: its login
/// account (in the Argo Server's namespace) may retry the workflow, and the workflow's
/// namespace has an account of higher precedence whose rule matches the user and that may
/// not even read it. With `SSO_DELEGATE_RBAC_TO_NAMESPACE=true` Argo's own server acts as
/// the latter and refuses the retry (403 naming it), and so does rewind, told of the
/// delegation; without it Argo's server reads the workflow as the login account and rewind
/// resets it. rewind told SSO RBAC is off ignores the account userinfo names and acts as
/// the Argo Server's own (which may only read). No refused call deletes a pod.
pub async fn with_sso_delegation_a_call_acts_as_the_namespaces_account_as_in_argo(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 4,
        succeeded: 2,
    };
    let before = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&before)?;
    let selector = format!("{}=wf", labels::WORKFLOW);
    let pods_before = ctl::pod_names(&cluster, &namespace, &selector).await?;
    let alice = "alice@example.com";
    let rule = format!("email == '{alice}'");

    // The Argo Server lives in a namespace of its own: Argo's SSO namespace.
    let argo_ns = format!("{}-argo", &namespace[..namespace.len().min(50)]);
    cluster.create_namespace(&argo_ns).await?;
    sso_account(&admin, &argo_ns, "sso-login", &[], &rule, "1").await?;
    grant(
        &admin,
        &namespace,
        &argo_ns,
        "sso-login",
        vec![workflow_verbs(&["get", "update"]), delete_pods()],
    )
    .await?;
    sso_account(&admin, &namespace, "sso-team", &[], &rule, "2").await?;
    account(&admin, &argo_ns, "argo-server", &[]).await?;
    grant(
        &admin,
        &namespace,
        &argo_ns,
        "argo-server",
        vec![workflow_verbs(&["get"])],
    )
    .await?;
    let (dex, argo_port) = sso_provider(&admin, &argo_ns, &[alice]).await?;
    let argo = rewind::testenv::argo::binary("cli")?;

    // rewind's API as the controller serves it: SSO RBAC on, no delegation.
    let addr = free_addr()?;
    let mut options = ctl::options(50, 50, true);
    let mut api = api_options(addr, None);
    api.settings.modes = vec![AuthMode::Sso];
    let base = api.settings.clone();
    let settings = |server: SocketAddr, rbac: bool, delegate: bool| {
        let mut settings = base.clone();
        settings.argo_server = Some(argo_server(server)?);
        settings.sso_rbac = Some(rbac);
        settings.sso_delegate = delegate;
        settings.server_account = Some(
            format!("{argo_ns}/argo-server")
                .parse()
                .map_err(anyhow::Error::msg)?,
        );
        anyhow::Ok(settings)
    };
    api.settings = settings(SocketAddr::from(([127, 0, 0, 1], argo_port)), true, false)?;
    options.argo_api = Some(api);
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let path = format!("/api/v1/workflows/{namespace}/wf/retry");
    let body = json!({"name": "wf", "namespace": namespace});
    let untouched = || async {
        ensure!(
            ctl::pod_names(&cluster, &namespace, &selector).await? == pods_before,
            "a refused call deleted pods"
        );
        anyhow::Ok(())
    };

    let delegating = ArgoServer::start_with_env(
        &cluster,
        &argo,
        &argo_ns,
        "argo-sso",
        "sso",
        argo_port,
        &[("SSO_DELEGATE_RBAC_TO_NAMESPACE", "true")],
    )
    .await?;
    let logs = |server: &ArgoServer| {
        format!(
            "argo server's log:\n{}\ndex's log:\n{}",
            rewind::testenv::argo::log_tail(server.log_path()),
            rewind::testenv::argo::log_tail(dex.log_path())
        )
    };
    let token = clients::sso_login(delegating.addr, alice)
        .await
        .with_context(|| logs(&delegating))?;
    // Argo's own server acts as sso-team in the workflow's namespace and refuses.
    let argos = put(
        &format!("http://{}{path}", delegating.addr),
        Some(&token),
        &body,
        None,
    )
    .await?;
    ensure!(
        argos.0 == 403
            && argos.1["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("system:serviceaccount:{namespace}:sso-team"))),
        "Argo's server should refuse as {namespace}/sso-team: {argos:?}\n{}",
        logs(&delegating)
    );
    untouched().await?;
    let (alone, _stop) = api_alone(&cluster, &settings(delegating.addr, true, true)?).await?;
    ensure_status(
        &put(&format!("http://{alone}{path}"), Some(&token), &body, None).await?,
        403,
        7,
        &format!(
            "system:serviceaccount:{namespace}:sso-team (SSO (the ServiceAccount of the call's namespace Argo's SSO RBAC delegates the user to"
        ),
    )?;
    untouched().await?;
    delegating.stop().await?;

    // The same Argo Server without delegation, on the same port (dex's redirect names it).
    let server =
        ArgoServer::start_in(&cluster, &argo, &argo_ns, "argo-sso", "sso", argo_port).await?;
    let token = clients::sso_login(server.addr, alice)
        .await
        .with_context(|| logs(&server))?;
    // Argo's server acts as sso-login: it reads the workflow (its retry would delete pods
    // itself, so the cheaper call shows it).
    let (status, read) = call(
        "GET",
        &format!("http://{}/api/v1/workflows/{namespace}/wf", server.addr),
        Some(&token),
        None,
        None,
    )
    .await?;
    ensure!(
        status == 200 && read["metadata"]["name"] == "wf",
        "Argo's server should read the workflow as {argo_ns}/sso-login: {status} {read}"
    );
    // Told SSO RBAC is off, rewind acts as the Argo Server's own account whatever userinfo
    // names (here sso-login, which may retry).
    let (alone, _stop) = api_alone(&cluster, &settings(server.addr, false, false)?).await?;
    ensure_status(
        &put(&format!("http://{alone}{path}"), Some(&token), &body, None).await?,
        403,
        7,
        &format!(
            "system:serviceaccount:{argo_ns}:argo-server (SSO without SSO RBAC (the Argo Server's own ServiceAccount)) may not update"
        ),
    )?;
    untouched().await?;

    let from = Timestamp::now() - SignedDuration::from_secs(1);
    let (status, answer) = put(&format!("http://{addr}{path}"), Some(&token), &body, None).await?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    ensure!(status == 200, "the SSO retry answered {status}: {answer}");
    ctl::ensure_reset_as_planned(&serde_json::from_value(answer)?, &plan.workflow, from, to)?;
    let deleters: Vec<String> = ctl::audit_log(&cluster, &namespace)?
        .into_iter()
        .filter(|a| {
            a.resource == "pods" && matches!(a.verb.as_str(), "delete" | "deletecollection")
        })
        .map(|a| a.user)
        .collect();
    ensure!(
        !deleters.is_empty() && deleters.iter().all(|u| u == CONTROLLER_NAME),
        "pods must be deleted by the controller alone: {deleters:?}"
    );
    let login = format!("system:serviceaccount:{argo_ns}:sso-login");
    ensure_asked_by_sso(&admin, &namespace, alice, &login).await?;
    controller.stop().await?;
    server.stop().await?;
    dex.stop().await?;
    Ok(())
}

/// The one WorkflowRetry in `namespace` records SSO user `user` as its asker, acting as the
/// account `login` that Argo's SSO RBAC maps them to.
async fn ensure_asked_by_sso(
    admin: &kube::Client,
    namespace: &str,
    user: &str,
    login: &str,
) -> anyhow::Result<()> {
    let askers: Vec<Option<AskedBy>> = Api::<WorkflowRetry>::namespaced(admin.clone(), namespace)
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(AskedBy::of)
        .collect();
    ensure!(
        askers.len() == 1
            && askers.iter().all(|a| a
                .as_ref()
                .is_some_and(|a| a.user == user && a.acting_as.as_deref() == Some(login))),
        "the WorkflowRetry should record {user} acting as {login}: {askers:?}"
    );
    Ok(())
}

/// A double click on Argo's UI Retry: two calls for one workflow at once, straight at rewind's
/// listener. One retry (the reset written once, each plan pod deleted once) and two answers,
/// both ending: the reset workflow, and Argo's own refusal of a workflow already retried (what
/// Argo's server answers a second call that reads the workflow after the first reset it).
pub async fn a_double_click_on_retry_resets_once_and_answers_both_calls(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let admin = cluster.admin_client();
    let dag = FailedDag {
        name: "wf".into(),
        failed: 20,
        succeeded: 3,
    };
    let before = dag.create(&admin, &namespace, 8, || ()).await?;
    let plan = ctl::expected_plan(&before)?;
    let token = account(
        &admin,
        &namespace,
        "alice",
        &[workflow_verbs(&["get", "update"]), delete_pods()],
    )
    .await?;
    let addr = free_addr()?;
    // One pod per delete, ten a second: the first call is still deleting when the second comes.
    let mut options = ctl::options(10, 1, false);
    options.argo_api = Some(api_options(addr, None));
    let controller = ctl::start(&cluster, &namespace, options).await?;
    let url = format!("http://{addr}/api/v1/workflows/{namespace}/wf/retry");
    let body = json!({"name": "wf", "namespace": namespace});
    let bearer = format!("Bearer {token}");
    let click = || async {
        tokio::time::timeout(
            Duration::from_secs(90),
            put(&url, Some(&bearer), &body, None),
        )
        .await
        .context("a call did not answer within 90s")?
    };
    let (first, second) = tokio::join!(click(), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        click().await
    });
    let answers = [first?, second?];
    let reset: Vec<&(u16, Value)> = answers.iter().filter(|(s, _)| *s == 200).collect();
    let refused: Vec<&(u16, Value)> = answers.iter().filter(|(s, _)| *s != 200).collect();
    ensure!(
        reset.len() == 1 && refused.len() == 1,
        "expected one call answering the reset workflow and one refused, got {answers:?}"
    );
    let answered: Workflow = serde_json::from_value(reset[0].1.clone())?;
    ensure!(
        answered.name_any() == "wf",
        "the answer is not the workflow: {:?}",
        answered.metadata
    );
    ensure_status(refused[0], 400, 3, "Cannot retry a workflow in phase")?;

    let log = ctl::audit_log(&cluster, &namespace)?;
    let resets = ctl::resets(&log, "wf");
    ensure!(
        resets == 1,
        "expected the reset written once, it was written {resets} times"
    );
    let mut deletes: BTreeMap<&str, usize> = BTreeMap::new();
    for a in log.iter().filter(|a| {
        a.user == CONTROLLER_NAME && a.resource == "pods" && a.verb == "delete" && a.code == 200
    }) {
        *deletes.entry(a.name.as_str()).or_default() += 1;
    }
    let planned: BTreeMap<&str, usize> = plan
        .pods_to_delete
        .iter()
        .map(|p| (p.as_str(), 1))
        .collect();
    ensure!(
        deletes == planned,
        "expected each of the {} plan pods deleted once, the audit log has {deletes:?}",
        planned.len()
    );
    let ended: Vec<_> = Api::<WorkflowRetry>::namespaced(admin.clone(), &namespace)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|r| r.status.unwrap_or_default().phase)
        .collect();
    ensure!(
        ended.len() == 2 && ended.iter().all(|p| p.is_some_and(RetryPhase::is_finished)),
        "expected both calls' WorkflowRetries finished: {ended:?}"
    );
    controller.stop().await
}
