//! Child processes whose cost is measured: the real `rewind controller`
//! binary, and a command run to its end with its rusage.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Error;
use super::usage::{self, Usage};
use crate::testenv::io_error;
use crate::testenv::localcluster::{LocalCluster, Role};

/// `rewind controller` running as a child process with the controller's kubeconfig, its
/// /readyz on a free loopback port, its logs in a file. Dropping it kills it.
pub struct RewindController {
    child: Child,
    http: SocketAddr,
    log: PathBuf,
}

impl RewindController {
    /// Starts `binary controller ARGS...` and waits until /readyz answers 200.
    pub async fn start(
        binary: &Path,
        cluster: &LocalCluster,
        args: &[String],
        log: PathBuf,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let http = free_port()?;
        let out = File::create(&log).map_err(io_error("creating", &log))?;
        let err = out.try_clone().map_err(io_error("opening", &log))?;
        // REWIND_BENCH_WRAP runs the controller under a profiler, e.g. "heaptrack -o DIR/h":
        // its figures then are the profiler's, its profile the controller's.
        let wrap = std::env::var("REWIND_BENCH_WRAP").unwrap_or_default();
        let mut wrap = wrap.split_whitespace();
        let mut command = match wrap.next() {
            Some(profiler) => {
                let mut command = Command::new(profiler);
                command.args(wrap).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .arg("controller")
            .args(["--http-addr", &http.to_string()])
            .args(args)
            .env("KUBECONFIG", cluster.kubeconfig_path(Role::Controller))
            .env("REWIND_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        kill_with_parent(&mut command);
        let child = command.spawn().map_err(io_error("starting", binary))?;
        let mut controller = RewindController { child, http, log };
        let started = Instant::now();
        loop {
            if let Some(status) = controller
                .child
                .try_wait()
                .map_err(io_error("waiting for", binary))?
            {
                return Err(Error::Exited {
                    what: "rewind controller",
                    status: status.to_string(),
                    log: controller.log.clone(),
                });
            }
            let http = controller.http;
            if tokio::task::spawn_blocking(move || ready(http))
                .await
                .unwrap_or(false)
            {
                return Ok(controller);
            }
            if started.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: "the rewind controller's /readyz".into(),
                    waited: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its CPU time and peak RSS so far.
    pub fn usage(&self) -> Result<Usage, Error> {
        usage::of_running(self.pid())
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Where it serves /metrics, /healthz and /readyz.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The API requests it has sent (`rewind_api_requests_total`, every verb
    /// and code), from its /metrics.
    pub async fn api_requests(&self) -> Result<u64, Error> {
        let http = self.http;
        let metrics = tokio::task::spawn_blocking(move || get(http, "/metrics"))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| Error::Timeout {
                what: "a 200 answer from the rewind controller's /metrics".into(),
                waited: Duration::from_secs(5),
            })?;
        Ok(metrics
            .lines()
            .filter(|l| l.starts_with("rewind_api_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// SIGTERM (it shuts down cleanly), then waits.
    pub fn stop(mut self) -> Result<(), Error> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        self.child
            .wait()
            .map_err(io_error("waiting for", &self.log))?;
        Ok(())
    }
}

impl Drop for RewindController {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a child run to its end left: its exit status, stdout, stderr, and its usage.
pub struct Finished {
    pub success: bool,
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    pub usage: Usage,
    pub wall: Duration,
}

/// Runs `command` to its end (blocking) and reaps it with wait4(2) for its rusage.
pub fn run_measured(mut command: Command) -> Result<Finished, Error> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    kill_with_parent(&mut command);
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(io_error("starting", command.get_program()))?;
    // stderr read on a thread so neither pipe can fill up and stall the child.
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaps our child, which std's Child never waits for after this.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut rusage) };
    let wall = started.elapsed();
    if reaped != pid {
        return Err(
            io_error("waiting for", command.get_program())(std::io::Error::last_os_error()).into(),
        );
    }
    let success = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let status = if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else {
        format!("signal {}", libc::WTERMSIG(status))
    };
    Ok(Finished {
        success,
        status,
        stdout,
        stderr: stderr.join().unwrap_or_default(),
        usage: usage::of_rusage(&rusage),
        wall,
    })
}

/// The child dies with us, whatever ends us.
pub(crate) fn kill_with_parent(command: &mut Command) {
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn free_port() -> Result<SocketAddr, Error> {
    Ok(SocketAddr::from((
        [127, 0, 0, 1],
        crate::testenv::free_port()?,
    )))
}

/// Whether GET /readyz answers 200.
fn ready(addr: SocketAddr) -> bool {
    get(addr, "/readyz").is_some()
}

/// The body of GET `path` if it answers 200: the controller's HTTP endpoints
/// answer HTTP/1.0 and close, so a plain socket reads them.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    (head.get(9..12) == Some("200")).then(|| body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measured_child_reports_its_output_and_cpu() {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done; echo oops >&2; exit 3",
        ]);
        let finished = run_measured(command).unwrap();
        assert!(!finished.success);
        assert_eq!(finished.status, "exit status 3");
        assert_eq!(finished.stdout, "done\n");
        assert_eq!(finished.stderr, "oops\n");
        assert!(finished.usage.cpu_seconds > 0.0, "{:?}", finished.usage);
        assert!(finished.usage.peak_rss_bytes > 0);
    }

    #[test]
    fn nothing_listening_is_not_ready() {
        assert!(!ready(free_port().unwrap()));
    }
}
