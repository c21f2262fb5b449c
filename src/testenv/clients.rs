//! Argo's own server and clients, for the end-to-end tests and the benchmark of rewind's
//! Argo API: a real `argo server` (Argo's `argo` binary, built by `tools/argo/build.sh
//! cli`), Debian's nginx routing as the chart's Ingress does (the two retry paths to
//! rewind, everything else to argo-server), and Hera's Python (tools/clients/install.sh).

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::testenv::argo::{self, CONTROLLER_NAMESPACE, Error, io, log_tail, spawn_tied};
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

/// A free port on loopback (bound and released: the caller binds it next).
pub fn free_port() -> Result<u16, Error> {
    let probe = TcpListener::bind("127.0.0.1:0").map_err(io("binding", "127.0.0.1:0"))?;
    Ok(probe
        .local_addr()
        .map_err(io("reading the address of", "127.0.0.1:0"))?
        .port())
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
            .map_err(io(
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
        let child = spawn_tied(command).map_err(io("starting", format!("{what} ({command:?})")))?;
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
        match child.try_wait().map_err(io("waiting for", &self.log))? {
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
    let out = File::create(&log).map_err(io("creating", &log))?;
    let err = out.try_clone().map_err(io("opening", &log))?;
    Ok(command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0))
}

use std::os::unix::process::CommandExt as _;

/// A real `argo server` v4.1.4 with the admin's credentials, plain HTTP on loopback, in
/// client auth mode (every call acts as its caller's Kubernetes token), reading Argo's
/// database from an Argo controller's ConfigMap (for its archive, and its instance ID).
pub struct ArgoServer {
    process: Process,
    pub addr: SocketAddr,
}

impl ArgoServer {
    /// `argo` is the binary of `tools/argo/build.sh cli` (or `cli-ui`, which serves Argo's UI).
    pub async fn start(
        cluster: &LocalCluster,
        argo: &Path,
        configmap: &str,
    ) -> Result<Self, Error> {
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let name = configmap
            .strip_prefix(&format!("{CONTROLLER_NAMESPACE}/"))
            .unwrap_or(configmap);
        let mut command = Command::new(argo);
        command
            .arg("server")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path(Role::Admin))
            .args(["--namespace", CONTROLLER_NAMESPACE, "--configmap", name])
            .args(["--auth-mode", "client", "--secure=false"])
            .args(["--port", &port.to_string()])
            // The UI's own links point at this server; nothing is fetched from elsewhere.
            .args(["--x-frame-options", "SAMEORIGIN", "--loglevel", "info"])
            // In client mode it builds each caller's client from the default loading rules.
            .env("KUBECONFIG", cluster.kubeconfig_path(Role::Admin))
            .env("ARGO_SERVER_METRICS_PORT", free_port()?.to_string());
        let mut process = Process::start("argo server", command)?;
        process.wait_listening(addr).await?;
        tracing::info!(%addr, log = %process.log.display(), "argo server started");
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
            .map_err(io(
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
        fs::write(&conf, config).map_err(io("writing", &conf))?;
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
