//! The cluster's child processes: spawned so they die with us, stopped gently, then firmly.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{Component, Error};
use crate::testenv::io_error;

/// How long a process gets to exit after SIGTERM before it is killed.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(10);
/// How much of a log an error quotes.
const TAIL_BYTES: u64 = 6 * 1024;
const TAIL_LINES: usize = 30;

/// The running components, in start order.
pub(super) struct Processes {
    spawner: Spawner,
    running: Vec<Process>,
}

impl Processes {
    pub fn new() -> Result<Self, Error> {
        Ok(Self {
            spawner: Spawner::new()?,
            running: Vec::new(),
        })
    }

    /// Starts `command` as `component`, its stdout and stderr going to `log`.
    pub fn start(
        &mut self,
        component: Component,
        mut command: Command,
        log: PathBuf,
    ) -> Result<(), Error> {
        let file = File::create(&log).map_err(io_error("creating", &log))?;
        let file2 = file.try_clone().map_err(io_error("opening", &log))?;
        let binary = PathBuf::from(command.get_program());
        command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            // Its own process group, so a terminal's Ctrl-C reaches only us and we stop
            // the components in order instead of them all dying at once.
            .process_group(0);
        let child = self.spawner.spawn(command).map_err(|source| Error::Spawn {
            component,
            binary,
            source,
        })?;
        tracing::debug!(%component, pid = child.id(), "started");
        self.running.push(Process {
            component,
            child,
            log,
        });
        Ok(())
    }

    /// An error for the first component that has exited, quoting its log.
    pub fn check_running(&mut self) -> Result<(), Error> {
        for process in &mut self.running {
            let status = process
                .child
                .try_wait()
                .map_err(io_error("waiting for", &process.log))?;
            if let Some(status) = status {
                return Err(Error::Exited {
                    component: process.component,
                    status,
                    log: process.log.clone(),
                    log_tail: log_tail(&process.log),
                });
            }
        }
        Ok(())
    }

    pub fn pids(&self) -> Vec<(Component, u32)> {
        self.running
            .iter()
            .map(|p| (p.component, p.child.id()))
            .collect()
    }

    /// Stops every process: first all that depend on etcd, together, then etcd, so the
    /// API server can finish its requests. Waits for each; kills any that outstays `grace`.
    pub fn stop_all(&mut self, grace: Duration) {
        let (storage, clients): (Vec<Process>, Vec<Process>) = self
            .running
            .drain(..)
            .partition(|p| p.component == Component::Etcd);
        stop_together(clients, grace);
        stop_together(storage, grace);
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        // Reaped before the spawner thread ends, so its death signal never hits a live child.
        self.stop_all(STOP_GRACE);
    }
}

fn stop_together(mut processes: Vec<Process>, grace: Duration) {
    for process in &processes {
        process.signal(libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    for process in &mut processes {
        process.wait_until(deadline);
    }
}

struct Process {
    component: Component,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits in pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions; the child is not reaped yet
        // (we hold its Child), so the pid cannot have been reused.
        if unsafe { libc::kill(pid, signal) } != 0 {
            tracing::debug!(component = %self.component, error = %io::Error::last_os_error(), "signal not delivered");
        }
    }

    fn wait_until(&mut self, deadline: Instant) {
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    tracing::debug!(component = %self.component, %status, "stopped");
                    return;
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    tracing::warn!(component = %self.component, "did not stop after SIGTERM; killing it");
                    break;
                }
                Err(error) => {
                    tracing::warn!(component = %self.component, %error, "cannot wait; killing it");
                    break;
                }
            }
        }
        if let Err(error) = self.child.kill().and_then(|()| self.child.wait().map(drop)) {
            tracing::error!(component = %self.component, pid = self.child.id(), %error, "cannot kill");
        }
    }
}

/// The last lines of a log file (or why it cannot be read).
pub(super) fn log_tail(path: &Path) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
        }
        Err(error) => format!("(cannot read {}: {error})", path.display()),
    }
}

/// Spawns children from one dedicated thread. PR_SET_PDEATHSIG fires when the *thread*
/// that forked a child ends, so children are forked by a thread that lives exactly as long
/// as the cluster: if our process dies without stopping them, they get SIGKILL.
struct Spawner {
    requests: Option<mpsc::Sender<(Command, mpsc::Sender<io::Result<Child>>)>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    fn new() -> Result<Self, Error> {
        let (requests, incoming) = mpsc::channel::<(Command, mpsc::Sender<io::Result<Child>>)>();
        let thread = thread::Builder::new()
            .name("localcluster-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    // The requester waits for the reply, so it cannot be gone.
                    let _ = reply.send(command.spawn());
                }
            })
            .map_err(io_error(
                "starting a thread for",
                "the control plane's processes",
            ))?;
        Ok(Self {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    fn spawn(&self, mut command: Command) -> io::Result<Child> {
        let parent = libc::pid_t::try_from(std::process::id()).expect("a pid fits in pid_t");
        // SAFETY: between fork and exec the closure only calls prctl(2) and getppid(2),
        // both async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // We may have died between fork and prctl: then no signal would ever come.
                if libc::getppid() != parent {
                    return Err(io::Error::other("parent exited while starting the child"));
                }
                Ok(())
            });
        }
        let (reply, response) = mpsc::channel();
        let requests = self
            .requests
            .as_ref()
            .expect("requests are open until drop");
        requests
            .send((command, reply))
            .map_err(|_| io::Error::other("spawner thread has ended"))?;
        response
            .recv()
            .map_err(|_| io::Error::other("spawner thread has ended"))?
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = log_tail(&path);
        assert!(tail.starts_with("line 70\n"), "{tail}");
        assert!(tail.ends_with("line 99"), "{tail}");
    }

    #[test]
    fn an_exited_process_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut processes = Processes::new().unwrap();
        let mut command = Command::new("sh");
        command.args(["-c", "echo listen tcp: address already in use; exit 3"]);
        processes
            .start(Component::Etcd, command, dir.path().join("etcd.log"))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = loop {
            match processes.check_running() {
                Err(err) => break err,
                Ok(()) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(()) => panic!("sh did not exit"),
            }
        };
        let message = err.to_string();
        assert!(
            matches!(
                err,
                Error::Exited {
                    component: Component::Etcd,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(message.contains("address already in use"), "{message}");
    }

    #[test]
    fn stop_all_reaps_every_child_even_one_that_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut processes = Processes::new().unwrap();
        let mut stubborn = Command::new("sh");
        // An ignored signal stays ignored across exec.
        stubborn.args(["-c", "trap '' TERM; exec sleep 30"]);
        processes
            .start(Component::Kwok, stubborn, dir.path().join("kwok.log"))
            .unwrap();
        let mut polite = Command::new("sleep");
        polite.arg("30");
        processes
            .start(Component::Etcd, polite, dir.path().join("etcd.log"))
            .unwrap();
        let pids = processes.pids();
        assert_eq!(pids.len(), 2);
        let started = Instant::now();
        processes.stop_all(Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(5));
        for (component, pid) in pids {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "{component} ({pid}) still exists"
            );
        }
    }
}
