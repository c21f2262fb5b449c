//! Argo's own clients retrying through rewind: the real `argo` CLI v4.1.4 and Hera from PyPI,
//! pointed at nginx, which routes as the chart's Ingress does (the two retry paths to
//! rewind's Argo API over TLS, everything else to a real `argo server`). Each call runs as a
//! ServiceAccount's Kubernetes token (Argo's client auth mode); the CLI's scenario first
//! tries without a token, with a tampered one and with one that may not update workflows,
//! and each of those must leave every pod as it was.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use rewind::argo::workflow::labels;
use rewind::argoapi::tls::CertFiles;
use rewind::controller::ArgoApiOptions;
use rewind::testenv::clients::{Router, client_mode_api};
use rewind::testenv::free_port;
use rewind::testenv::localcluster::{CONTROLLER_NAME, service_account_token};

use crate::run::{ApiCall, ApiClient, Retry};

/// Which of Argo's clients, and how it names the workflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `argo retry NAME` (`argo archive retry UID` for an archived workflow), after the
    /// denied attempts.
    Cli,
    /// `argo retry -l SELECTOR`: the CLI lists through argo-server, then retries each.
    CliLabel,
    /// Hera's `WorkflowsService.retry_workflow` (`retry_archived_workflow`).
    Hera,
    /// Argo's UI in headless Chromium (`ui_retry.js`): RETRY on the workflow's page (the
    /// archived workflow's, by its UID), then the panel's Retry.
    Ui,
    /// A double click on Retry: two `argo retry NAME` at once. One retries; the other is
    /// answered with Argo's refusal of a workflow already retried.
    DoubleClick,
}

/// A client with what it needs: Argo's `argo` binary, the argo server (serving Argo's UI for
/// [`Kind::Ui`]), Hera's Python, playwright-core's directory.
pub struct Client {
    pub kind: Kind,
    pub argo: PathBuf,
    pub argo_server: SocketAddr,
    pub python: PathBuf,
    pub playwright: Option<PathBuf>,
}

impl ApiClient for Client {
    fn listener(&self, namespace: &str) -> anyhow::Result<ArgoApiOptions> {
        let dir = std::env::temp_dir().join(format!("rewind-e2e-api-{namespace}"));
        std::fs::create_dir_all(&dir)?;
        // As the chart serves it: TLS with a self-signed certificate.
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])?;
        let files = CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, cert.cert.pem())?;
        std::fs::write(&files.key, cert.signing_key.serialize_pem())?;
        Ok(client_mode_api(
            SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            Some(files),
        ))
    }

    fn retry<'a>(&'a self, call: ApiCall<'a>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.retry_through_nginx(call))
    }
}

/// `verbs` on workflows.
fn workflows_rule(verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec!["argoproj.io".into()]),
        resources: Some(vec!["workflows".into()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

/// Deleting pods, which Argo's server does as the caller in a retry.
fn delete_pods() -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["pods".into()]),
        verbs: vec!["delete".into()],
        ..Default::default()
    }
}

/// A ServiceAccount holding `verbs` on workflows in `namespace` (and deleting its pods,
/// with `pods`), and a token of it.
pub async fn token(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    verbs: &[&str],
    pods: bool,
) -> anyhow::Result<String> {
    let meta = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let account = ServiceAccount {
        metadata: meta.clone(),
        ..Default::default()
    };
    accounts.create(&PostParams::default(), &account).await?;
    let role = Role {
        metadata: meta.clone(),
        rules: Some(
            std::iter::once(workflows_rule(verbs))
                .chain(pods.then(delete_pods))
                .collect(),
        ),
    };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await?;
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(service_account_token(&accounts, name).await?)
}

/// What one run of a client printed.
struct Ran {
    ok: bool,
    out: String,
}

/// Every pod of the workflow with its UID: what a refused call must leave.
async fn pods(pods: &Api<Pod>, workflow: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let listed = pods
        .list(&ListParams::default().labels(&format!("{}={workflow}", labels::WORKFLOW)))
        .await?;
    Ok(listed
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

impl Client {
    async fn retry_through_nginx(&self, call: ApiCall<'_>) -> anyhow::Result<()> {
        let ApiCall {
            cluster,
            api,
            namespace,
            scenario,
            archived_uid,
        } = call;
        let admin = cluster.admin_client();
        // The audit log's times are in microseconds; the fixture deleted pods before.
        let since = k8s_openapi::jiff::Timestamp::now();
        let allowed = token(
            &admin,
            namespace,
            "retrier",
            &["get", "list", "watch", "update", "create"],
            true,
        )
        .await?;
        let router = Router::start(api.addr, true, self.argo_server).await?;
        let server = router.addr;
        let result = async {
            if self.kind == Kind::Cli && archived_uid.is_none() {
                let viewer = token(
                    &admin,
                    namespace,
                    "viewer",
                    &["get", "list", "watch"],
                    false,
                )
                .await?;
                let pods_api: Api<Pod> = Api::namespaced(admin.clone(), namespace);
                let before = pods(&pods_api, &scenario.name).await?;
                // The CLI sends no call without a token: curl does, through nginx.
                let none = tokio::process::Command::new("curl")
                    .args(["-sS", "-X", "PUT", "--data-binary", "{}"])
                    .arg(format!(
                        "http://{server}/api/v1/workflows/{namespace}/{}/retry",
                        scenario.name
                    ))
                    .output()
                    .await
                    .context("running curl")?;
                let none = String::from_utf8_lossy(&none.stdout);
                ensure!(
                    none.contains("\"code\":16") && none.contains("carried no token"),
                    "a call without a token should be refused (401): {none}"
                );
                let tampered = format!("{allowed}x");
                for (token, says) in [
                    (Some(tampered.as_str()), "token not valid".to_owned()),
                    (
                        Some(viewer.as_str()),
                        format!("may not update workflows.argoproj.io in namespace {namespace}"),
                    ),
                ] {
                    let ran = self
                        .cli(
                            server,
                            token,
                            namespace,
                            &scenario.name,
                            None,
                            &scenario.retry,
                        )
                        .await?;
                    ensure!(
                        !ran.ok && ran.out.contains(&says),
                        "argo retry with a bad token should fail saying {says:?}; it printed:\n{}",
                        ran.out
                    );
                }
                ensure!(
                    pods(&pods_api, &scenario.name).await? == before,
                    "a refused call changed the workflow's pods"
                );
            }
            let click = || {
                self.cli(
                    server,
                    Some(&allowed),
                    namespace,
                    &scenario.name,
                    archived_uid,
                    &scenario.retry,
                )
            };
            let ran = match self.kind {
                Kind::Cli | Kind::CliLabel => click().await?,
                Kind::Hera => {
                    self.hera(
                        server,
                        &allowed,
                        namespace,
                        &scenario.name,
                        archived_uid,
                        &scenario.retry,
                    )
                    .await?
                }
                Kind::Ui => {
                    self.ui(server, &allowed, namespace, &scenario.name, archived_uid)
                        .await?
                }
                Kind::DoubleClick => {
                    let (first, second) = tokio::join!(click(), async {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        click().await
                    });
                    let (ok, refused): (Vec<Ran>, Vec<Ran>) =
                        [first?, second?].into_iter().partition(|r| r.ok);
                    ensure!(
                        ok.len() == 1
                            && refused[0].out.contains("Cannot retry a workflow in phase"),
                        "of two calls at once, one should retry and the other be refused as Argo refuses a workflow already retried; they printed:\n{}",
                        ok.iter().chain(&refused).map(|r| r.out.as_str()).collect::<Vec<_>>().join("\n---\n")
                    );
                    tracing::info!(refused = refused[0].out.trim(), "the double click's other call");
                    ok.into_iter().next().expect("one call retried")
                }
            };
            ensure!(
                ran.ok,
                "the {:?} client's retry failed:\n{}",
                self.kind,
                ran.out
            );
            anyhow::Ok(())
        }
        .await;
        let routed = router.access_log();
        router.stop().await?;
        result.with_context(|| format!("nginx's access log:\n{routed}"))?;
        // The retry call went to rewind, and argo-server deleted no pod: only rewind did.
        let to_rewind = format!("PUT {} ", api.addr);
        ensure!(
            routed
                .lines()
                .any(|l| l.starts_with(&to_rewind) && l.contains("/retry 200")),
            "no retry call answered by rewind ({}) in nginx's access log:\n{routed}",
            api.addr
        );
        if let Some(log) = cluster.audit_log_path() {
            let text = std::fs::read_to_string(&log)?;
            let deleters: Vec<String> = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|e| {
                    e["requestReceivedTimestamp"]
                        .as_str()
                        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                        .is_some_and(|t| t >= since)
                        && e["objectRef"]["namespace"] == *namespace
                        && e["objectRef"]["resource"] == "pods"
                        && matches!(e["verb"].as_str(), Some("delete" | "deletecollection"))
                })
                .filter_map(|e| e["user"]["username"].as_str().map(str::to_owned))
                .collect();
            // argo-server in client mode acts as its caller: a pod it deleted would carry the
            // caller's name (Argo's own controller, as the admin, may delete pods too).
            let caller = format!("system:serviceaccount:{namespace}:retrier");
            ensure!(
                // An archived workflow's pods went with it: nothing is left to delete.
                (archived_uid.is_some() || deleters.iter().any(|u| u == CONTROLLER_NAME))
                    && !deleters.contains(&caller),
                "rewind's controller ({CONTROLLER_NAME}) should delete the pods, the caller's argo-server ({caller}) none: {deleters:?}"
            );
        }
        Ok(())
    }

    /// The `argo` CLI over HTTP/1 at `server` (`ARGO_SERVER`), as the CLI's docs set it up.
    async fn cli(
        &self,
        server: SocketAddr,
        token: Option<&str>,
        namespace: &str,
        name: &str,
        archived_uid: Option<&str>,
        retry: &Retry,
    ) -> anyhow::Result<Ran> {
        let mut command = tokio::process::Command::new(&self.argo);
        match (archived_uid, self.kind) {
            (Some(uid), _) => command.args(["archive", "retry", uid, "--uid"]),
            (None, Kind::CliLabel) => command.args([
                "retry",
                "-l",
                &format!("{}=archive", labels::CONTROLLER_INSTANCE_ID),
            ]),
            (None, _) => command.args(["retry", name]),
        };
        command.args(["-n", namespace]);
        if retry.restart_successful {
            command.arg("--restart-successful");
        }
        if let Some(selector) = retry.node_field_selector {
            command.args(["--node-field-selector", selector]);
        }
        for parameter in &retry.parameters {
            command.args(["-p", parameter]);
        }
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::temp_dir())
            .env("ARGO_SERVER", server.to_string())
            .env("ARGO_HTTP1", "true")
            .env("ARGO_SECURE", "false")
            .kill_on_drop(true);
        if let Some(token) = token {
            command.env("ARGO_TOKEN", format!("Bearer {token}"));
        }
        run(command, "argo").await
    }

    /// Hera's WorkflowsService at `server`.
    async fn hera(
        &self,
        server: SocketAddr,
        token: &str,
        namespace: &str,
        name: &str,
        archived_uid: Option<&str>,
        retry: &Retry,
    ) -> anyhow::Result<Ran> {
        let options = serde_json::json!({
            "restart_successful": retry.restart_successful,
            "node_field_selector": retry.node_field_selector,
            "parameters": (!retry.parameters.is_empty()).then_some(&retry.parameters),
        });
        let script = r#"
import json, sys
from hera.workflows import WorkflowsService
from hera.workflows.models import RetryArchivedWorkflowRequest, WorkflowRetryRequest
host, token, namespace, name, uid, options = sys.argv[1:7]
options = {k: v for k, v in json.loads(options).items() if v is not None}
service = WorkflowsService(host=host, token=token, namespace=namespace, verify_ssl=False)
if uid:
    wf = service.retry_archived_workflow(uid, RetryArchivedWorkflowRequest(uid=uid, namespace=namespace, **options))
else:
    wf = service.retry_workflow(name, WorkflowRetryRequest(name=name, namespace=namespace, **options))
print("retried", wf.metadata.namespace, wf.metadata.name, wf.status.phase if wf.status else None)
"#;
        let mut command = tokio::process::Command::new(&self.python);
        command
            .args(["-c", script])
            .arg(format!("http://{server}/"))
            .arg(token)
            .arg(namespace)
            .arg(name)
            .arg(archived_uid.unwrap_or_default())
            .arg(options.to_string())
            .kill_on_drop(true);
        let ran = run(command, "hera").await?;
        ensure!(
            !ran.ok || ran.out.contains(&format!("retried {namespace} {name}")),
            "Hera's answer is not the retried workflow:\n{}",
            ran.out
        );
        Ok(ran)
    }
}

impl Client {
    /// Argo's UI in headless Chromium, through `server` (`ui_retry.js`).
    async fn ui(
        &self,
        server: SocketAddr,
        token: &str,
        namespace: &str,
        name: &str,
        archived_uid: Option<&str>,
    ) -> anyhow::Result<Ran> {
        let playwright = self
            .playwright
            .as_ref()
            .context("the UI scenarios need playwright-core (tools/clients/browser.sh)")?;
        let mut command = tokio::process::Command::new("node");
        command
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/e2e/ui_retry.js"
            ))
            .arg(format!("http://{server}/"))
            .arg(token)
            .arg(namespace)
            .arg(name)
            .args(archived_uid)
            .env("NODE_PATH", playwright.join("node_modules"))
            .env(
                "SCREENSHOT",
                std::env::temp_dir().join(format!("rewind-ui-{namespace}.png")),
            )
            .kill_on_drop(true);
        let ran = run(command, "node ui_retry.js").await?;
        ensure!(
            !ran.ok || ran.out.contains(&format!("retried {namespace} {name}")),
            "the UI did not show the retried workflow:\n{}",
            ran.out
        );
        Ok(ran)
    }
}

async fn run(mut command: tokio::process::Command, what: &str) -> anyhow::Result<Ran> {
    let output = command
        .output()
        .await
        .with_context(|| format!("running {what}"))?;
    Ok(Ran {
        ok: output.status.success(),
        out: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

/// The `argo` binary serving Argo's UI, and playwright-core's directory, built or installed
/// once (slow: the UI's npm install and webpack build).
pub fn ui_tools() -> anyhow::Result<(PathBuf, PathBuf)> {
    let argo = rewind::testenv::argo::binary("cli-ui")?;
    let playwright = rewind::testenv::build_tool("tools/clients/browser.sh", &[])?;
    Ok((argo, playwright))
}

/// The `argo` binary (Argo's CLI and server, v4.1.4) and Hera's Python, built or installed once.
pub fn tools() -> anyhow::Result<(PathBuf, PathBuf)> {
    let argo = rewind::testenv::argo::binary("cli")?;
    let python = rewind::testenv::clients::hera_python()?;
    Ok((argo, python))
}
