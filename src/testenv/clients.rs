//! Argo's own server and clients, for the end-to-end tests and the benchmark of rewind's
//! Argo API: a real `argo server` (Argo's `argo` binary, built by `tools/argo/build.sh
//! cli`), Debian's nginx routing as the chart's Ingress does (the two retry paths to
//! rewind, everything else to argo-server), and Hera's Python (tools/clients/install.sh).

use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::argoapi::auth::AuthMode;
use crate::argoapi::tls::CertFiles;
use crate::controller::ArgoApiOptions;
use crate::testenv::argo::{self, CONTROLLER_NAMESPACE, Error, log_tail, spawn_tied};
use crate::testenv::free_port;
use crate::testenv::localcluster::{LocalCluster, Role};

const CLIENTS_SCRIPT: &str = "tools/clients/install.sh";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The chart's helpers, whose `rewind.retryPaths` are the Ingress's and HTTPRoute's paths:
/// nginx here routes by the same regular expressions.
const CHART_HELPERS: &str = include_str!("../../deploy/helm/rewind/templates/_helpers.tpl");

/// The regular expressions of Argo's two retry paths, as the chart routes them.
pub fn retry_paths() -> Vec<String> {
    let block = CHART_HELPERS
        .split(r#"{{- define "rewind.retryPaths" -}}"#)
        .nth(1)
        .and_then(|rest| rest.split("{{- end -}}").next())
        .expect("the chart's helpers define rewind.retryPaths");
    block
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(str::to_owned)
        .collect()
}

/// A child process with its log in a directory of its own; killed when dropped.
struct Process {
    what: &'static str,
    child: Option<Child>,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Process {
    fn start(what: &'static str, mut command: Command) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("rewind-clients-")
            .tempdir()
            .map_err(io_error(
                "creating a temporary directory in",
                std::env::temp_dir(),
            ))?;
        Self::start_in(what, command_in(&mut command, dir.path())?, dir)
    }

    fn start_in(
        what: &'static str,
        command: &mut Command,
        dir: tempfile::TempDir,
    ) -> Result<Self, Error> {
        let log = dir.path().join("out.log");
        let child =
            spawn_tied(command).map_err(io_error("starting", format!("{what} ({command:?})")))?;
        Ok(Process {
            what,
            child: Some(child),
            dir,
            log,
        })
    }

    fn check_running(&mut self) -> Result<(), Error> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        match child
            .try_wait()
            .map_err(io_error("waiting for", &self.log))?
        {
            Some(status) => Err(Error::ProcessExited {
                what: self.what,
                status,
                log: self.log.clone(),
                log_tail: log_tail(&self.log),
            }),
            None => Ok(()),
        }
    }

    /// Waits until something accepts connections on `addr`.
    async fn wait_listening(&mut self, addr: SocketAddr) -> Result<(), Error> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "{} to listen on {addr}; its log:\n{}",
                        self.what,
                        log_tail(&self.log)
                    ),
                    waited: START_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `url` is served: any answer but a gateway's refusal (502,
    /// 503, 504), asked with curl (Debian's package). A listening port is not
    /// yet a serving server: the Argo Server's HTTP gateway answers 503 until
    /// it reaches its own gRPC side, and a 401 there comes from that side.
    async fn wait_answering(&mut self, url: &str) -> Result<(), Error> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            let probe = tokio::process::Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
                .args(["--max-time", "5", url])
                .output()
                .await
                .map_err(io_error("running curl (Debian package curl) on", url))?;
            let code = String::from_utf8_lossy(&probe.stdout);
            if !matches!(code.trim(), "000" | "502" | "503" | "504") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "{} to answer {url}; its log:\n{}",
                        self.what,
                        log_tail(&self.log)
                    ),
                    waited: START_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) -> Result<(), Error> {
        let result = self.check_running();
        if let Some(child) = self.child.take() {
            tokio::task::spawn_blocking(move || argo::stop(child))
                .await
                .expect("the stop thread does not panic");
        }
        result
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `command` writing its output to `dir`/out.log.
fn command_in<'a>(command: &'a mut Command, dir: &Path) -> Result<&'a mut Command, Error> {
    let log = dir.join("out.log");
    let out = File::create(&log).map_err(io_error("creating", &log))?;
    let err = out.try_clone().map_err(io_error("opening", &log))?;
    Ok(command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0))
}

use crate::testenv::io_error;
use std::os::unix::process::CommandExt as _;

/// A real `argo server` v4.1.4 with the admin's credentials, plain HTTP on loopback, reading
/// its configuration from a ConfigMap in its namespace (an Argo controller's, for its
/// archive and instance ID; or one with an `sso` section).
pub struct ArgoServer {
    process: Process,
    pub addr: SocketAddr,
}

impl ArgoServer {
    /// In client auth mode (every call acts as its caller's Kubernetes token), beside Argo's
    /// controller: `configmap` is its ConfigMap (`argo/NAME`). `argo` is the binary of
    /// `tools/argo/build.sh cli` (or `cli-ui`, which serves Argo's UI).
    pub async fn start(
        cluster: &LocalCluster,
        argo: &Path,
        configmap: &str,
    ) -> Result<Self, Error> {
        let name = configmap
            .strip_prefix(&format!("{CONTROLLER_NAMESPACE}/"))
            .unwrap_or(configmap);
        Self::start_in(
            cluster,
            argo,
            CONTROLLER_NAMESPACE,
            name,
            "client",
            free_port()?,
        )
        .await
    }

    /// In `auth_mode` (Argo's `--auth-mode`), on `port`, in `namespace` with its ConfigMap
    /// `configmap` there: SSO's callback URL names the port, so the caller picks it.
    pub async fn start_in(
        cluster: &LocalCluster,
        argo: &Path,
        namespace: &str,
        configmap: &str,
        auth_mode: &str,
        port: u16,
    ) -> Result<Self, Error> {
        Self::start_with_env(cluster, argo, namespace, configmap, auth_mode, port, &[]).await
    }

    /// [`start_in`](Self::start_in) with environment variables `env` (Argo reads some
    /// settings only there, e.g. `SSO_DELEGATE_RBAC_TO_NAMESPACE`).
    pub async fn start_with_env(
        cluster: &LocalCluster,
        argo: &Path,
        namespace: &str,
        configmap: &str,
        auth_mode: &str,
        port: u16,
        env: &[(&str, &str)],
    ) -> Result<Self, Error> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut command = Command::new(argo);
        command
            .arg("server")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path(Role::Admin))
            .args(["--namespace", namespace, "--configmap", configmap])
            .args(["--auth-mode", auth_mode, "--secure=false"])
            .args(["--port", &port.to_string()])
            // The UI's own links point at this server; nothing is fetched from elsewhere.
            .args(["--x-frame-options", "SAMEORIGIN", "--loglevel", "info"])
            // In client mode it builds each caller's client from the default loading rules.
            .env("KUBECONFIG", cluster.kubeconfig_path(Role::Admin))
            .env("ARGO_SERVER_METRICS_PORT", free_port()?.to_string())
            .envs(env.iter().copied());
        let mut process = Process::start("argo server", command)?;
        process.wait_listening(addr).await?;
        // The gateway dials the gRPC side once per service, and a dial made
        // before the port listened backs off for a second or more: each
        // service the tests call is waited for, not one for all.
        for path in [
            "version".to_owned(),
            format!("workflows/{namespace}"),
            "archived-workflows".to_owned(),
        ] {
            process
                .wait_answering(&format!("http://{addr}/api/v1/{path}"))
                .await?;
        }
        tracing::info!(%addr, auth_mode, log = %process.log.display(), "argo server started");
        Ok(ArgoServer { process, addr })
    }

    pub fn log_path(&self) -> &Path {
        &self.process.log
    }

    pub async fn stop(self) -> Result<(), Error> {
        self.process.stop().await
    }
}

/// nginx routing as the chart's Ingress: [`retry_paths`] to rewind's Argo API (over TLS,
/// as the chart serves it, when `rewind_tls`), every other path to argo-server.
pub struct Router {
    process: Process,
    pub addr: SocketAddr,
}

impl Router {
    pub async fn start(
        rewind: SocketAddr,
        rewind_tls: bool,
        argo_server: SocketAddr,
    ) -> Result<Self, Error> {
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = tempfile::Builder::new()
            .prefix("rewind-nginx-")
            .tempdir()
            .map_err(io_error(
                "creating a temporary directory in",
                std::env::temp_dir(),
            ))?;
        let d = dir.path().display();
        let scheme = if rewind_tls { "https" } else { "http" };
        let retry_locations: String = retry_paths()
            .iter()
            .map(|path| {
                // ingress-nginx matches use-regex paths as case-insensitive regular expressions.
                format!(
                    "    location ~* \"^{path}\" {{ proxy_pass {scheme}://{rewind}; proxy_ssl_verify off; }}\n"
                )
            })
            .collect();
        let config = format!(
            "worker_processes 1;\n\
             error_log {d}/out.log info;\n\
             pid {d}/nginx.pid;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n\
               # Which upstream served each call: the tests check the routing by it.\n\
               log_format routed '$request_method $upstream_addr $uri $status';\n\
               access_log {d}/access.log routed;\n\
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
               # As the chart's Ingress: a retry call answers when the retry ended.\n\
               proxy_read_timeout 3600s; proxy_http_version 1.1; proxy_buffering off;\n\
               proxy_set_header Host $host; proxy_set_header Connection \"\";\n\
               server {{\n\
                 listen {addr};\n\
             {retry_locations}\
                 location / {{ proxy_pass http://{argo_server}; }}\n\
               }}\n\
             }}\n"
        );
        let conf = dir.path().join("nginx.conf");
        fs::write(&conf, config).map_err(io_error("writing", &conf))?;
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("nginx"));
        let mut command = Command::new(nginx);
        command
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir.path())
            .args(["-g", "daemon off;"]);
        let mut process = Process::start_in("nginx", command_in(&mut command, dir.path())?, dir)?;
        process.wait_listening(addr).await?;
        Ok(Router { process, addr })
    }

    /// nginx's access log, a line a call: `METHOD UPSTREAM PATH STATUS`.
    pub fn access_log(&self) -> String {
        fs::read_to_string(self.process.dir.path().join("access.log")).unwrap_or_default()
    }

    pub async fn stop(self) -> Result<(), Error> {
        self.process.stop().await
    }
}

/// Installs (once) nginx and Hera (tools/clients/install.sh); the Python that has Hera.
pub fn hera_python() -> Result<PathBuf, Error> {
    Ok(crate::testenv::build_tool(CLIENTS_SCRIPT, &[])?)
}

const DEX_SCRIPT: &str = "tools/dex/build.sh";

/// The password of every [`Dex`] user.
pub const SSO_PASSWORD: &str = "rewind-sso";
/// [`SSO_PASSWORD`] hashed with bcrypt (cost 10, the least dex takes), as dex's static
/// passwords are given.
const SSO_PASSWORD_HASH: &str = "$2b$10$NYAAlKTlJI.8b5gvaKzccu7zCH/md7VT/N.LGXk2uCfXhoZS19y3K";

/// dex (built from its Go module by tools/dex/build.sh), an OpenID Connect provider on
/// loopback for Argo's SSO: its own password database with the given users, one static
/// client (the Argo Server), no approval screen.
pub struct Dex {
    process: Process,
    /// The issuer URL Argo's `sso.issuer` names.
    pub issuer: String,
}

impl Dex {
    /// `users` are e-mail addresses, each with [`SSO_PASSWORD`]; `redirect` is the Argo
    /// Server's `/oauth2/callback`.
    pub async fn start(
        client_id: &str,
        client_secret: &str,
        redirect: &str,
        users: &[&str],
    ) -> Result<Self, Error> {
        let dex = crate::testenv::build_tool(DEX_SCRIPT, &[])?;
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let issuer = format!("http://{addr}/dex");
        let passwords: Vec<serde_json::Value> = users
            .iter()
            .enumerate()
            .map(|(i, email)| {
                serde_json::json!({
                    "email": email,
                    "hash": SSO_PASSWORD_HASH,
                    "username": email.split('@').next().unwrap_or(email),
                    "userID": format!("rewind-sso-user-{i}"),
                })
            })
            .collect();
        let config = serde_json::json!({
            "issuer": issuer,
            "storage": {"type": "memory"},
            "web": {"http": addr.to_string()},
            "logger": {"level": "info"},
            "oauth2": {"skipApprovalScreen": true},
            "enablePasswordDB": true,
            "staticPasswords": passwords,
            "staticClients": [{
                "id": client_id,
                "secret": client_secret,
                "name": "Argo Server",
                "redirectURIs": [redirect],
            }],
        });
        let dir = tempfile::Builder::new()
            .prefix("rewind-dex-")
            .tempdir()
            .map_err(io_error(
                "creating a temporary directory in",
                std::env::temp_dir(),
            ))?;
        // dex reads YAML, of which JSON is a part.
        let file = dir.path().join("config.yaml");
        fs::write(&file, config.to_string()).map_err(io_error("writing", &file))?;
        let mut command = Command::new(dex);
        command.arg("serve").arg(&file);
        let mut process = Process::start_in("dex", command_in(&mut command, dir.path())?, dir)?;
        process.wait_listening(addr).await?;
        tracing::info!(%issuer, log = %process.log.display(), "dex started");
        Ok(Dex { process, issuer })
    }

    pub fn log_path(&self) -> &Path {
        &self.process.log
    }

    pub async fn stop(self) -> Result<(), Error> {
        self.process.stop().await
    }
}

/// Logs `email` in to the Argo Server at `argo` as a browser does (Argo's
/// `/oauth2/redirect`, dex's login form, Argo's callback) and returns the `authorization`
/// cookie Argo sets: `Bearer v2:` and Argo's encrypted token, what its UI then sends.
pub async fn sso_login(argo: SocketAddr, email: &str) -> Result<String, Error> {
    let failed = |what: String| Error::SsoLogin {
        user: email.to_owned(),
        what,
    };
    let dir = tempfile::Builder::new()
        .prefix("rewind-sso-")
        .tempdir()
        .map_err(io_error(
            "creating a temporary directory in",
            std::env::temp_dir(),
        ))?;
    let jar = dir.path().join("cookies");
    let curl = |args: &[&str]| {
        let mut command = tokio::process::Command::new("curl");
        command
            .args([
                "-sS",
                "-L",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{url_effective}",
            ])
            .arg("-c")
            .arg(&jar)
            .arg("-b")
            .arg(&jar)
            .args(args);
        command
    };
    let run = |mut command: tokio::process::Command, step: &'static str| async move {
        let out = command
            .output()
            .await
            .map_err(io_error("running curl for", step))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(failed(format!(
                "{step}: curl failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(text)
    };
    // Argo's redirect to dex, which shows its one connector's login form.
    let form = run(
        curl(&[&format!("http://{argo}/oauth2/redirect")]),
        "opening Argo's SSO login",
    )
    .await?;
    let (code, form_url) = form.split_once(' ').unwrap_or((&form, ""));
    if code != "200" || !form_url.contains("/auth/local") {
        return Err(failed(format!(
            "Argo's /oauth2/redirect should end at dex's login form, it ended at {code} {form_url}"
        )));
    }
    // The form posted: dex sends the browser back to Argo's callback, which sets the cookie.
    let ended = run(
        curl(&[
            "--data-urlencode",
            &format!("login={email}"),
            "--data-urlencode",
            &format!("password={SSO_PASSWORD}"),
            form_url,
        ]),
        "posting dex's login form",
    )
    .await?;
    let cookies = fs::read_to_string(&jar).map_err(io_error("reading", &jar))?;
    cookies
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            (fields.len() == 7 && fields[5] == "authorization").then(|| fields[6].trim_matches('"'))
        })
        .find(|value| value.starts_with("Bearer v2:"))
        .map(str::to_owned)
        .ok_or_else(|| {
            failed(format!(
                "the login ended at {ended} and Argo's callback set no `authorization` cookie of `Bearer v2:`; the cookies:\n{cookies}"
            ))
        })
}

/// rewind's Argo API on `addr` as Argo's `--auth-mode=client` serves: every caller
/// authenticated by its own Kubernetes token; TLS with `tls`, else plain HTTP.
pub fn client_mode_api(addr: SocketAddr, tls: Option<CertFiles>) -> ArgoApiOptions {
    ArgoApiOptions {
        addr,
        settings: crate::argoapi::Settings {
            modes: vec![AuthMode::Client],
            server_account: None,
            argo_server: None,
            sso_rbac: None,
            sso_delegate: false,
            tls,
            limits: Default::default(),
            reviews: Default::default(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_paths_are_the_charts() {
        assert_eq!(
            retry_paths(),
            [
                "/api/v1/workflows/[^/]+/[^/]+/retry",
                "/api/v1/archived-workflows/[^/]+/retry"
            ]
        );
    }
}
