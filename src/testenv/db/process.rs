//! One database server process and its temporary directory.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::DbError;
use crate::testenv::io_error;

/// How long a server gets to stop after its shutdown signal before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(20);
const TAIL_BYTES: u64 = 4 * 1024;

/// The user a server runs as: ourselves, or (as root) an unprivileged one.
#[derive(Clone, Copy, Debug)]
pub(super) struct RunAs {
    ids: Option<(u32, u32)>,
}

impl RunAs {
    /// As root: `preferred` (the package's user) if it exists, else `nobody`.
    pub fn pick(preferred: &'static str) -> Result<RunAs, DbError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(RunAs { ids: None });
        }
        let ids = user_ids(preferred)
            .or_else(|| user_ids("nobody"))
            .ok_or(DbError::NoUser(preferred))?;
        Ok(RunAs { ids: Some(ids) })
    }
}

fn user_ids(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    // SAFETY: getpwnam reads a NUL-terminated name; the record it returns is
    // copied out at once, before any other call could overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: pw is non-null and points to a valid passwd record.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// A server's directory (data, socket, log) and, once spawned, its process.
pub(super) struct Server {
    name: &'static str,
    run_as: RunAs,
    dir: tempfile::TempDir,
    log: PathBuf,
    child: Option<(Child, libc::c_int)>,
    /// How the server was started, to start it again after [`Server::stop`].
    launch: Option<(PathBuf, Vec<OsString>, libc::c_int)>,
}

impl Server {
    pub fn prepare(name: &'static str, run_as: RunAs) -> Result<Server, DbError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("rewind-{name}-"))
            .tempdir()
            .map_err(io_error("creating a temporary directory for", name))?;
        let log = dir.path().join(format!("{name}.log"));
        let server = Server {
            name,
            run_as,
            dir,
            log,
            child: None,
            launch: None,
        };
        server.chown(server.dir.path())?;
        Ok(server)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|(child, _)| child.id())
    }

    /// Writes `contents` to `name` in the directory, readable only by the
    /// server's user (as servers insist for private keys).
    pub fn write_private(&self, name: &str, contents: &str) -> Result<PathBuf, DbError> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).map_err(io_error("writing", &path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(io_error("restricting", &path))?;
        self.chown(&path)?;
        Ok(path)
    }

    /// Hands `path` to the user the server runs as.
    pub fn chown(&self, path: &Path) -> Result<(), DbError> {
        match self.run_as.ids {
            Some((uid, gid)) => Ok(std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(io_error("handing over", path))?),
            None => Ok(()),
        }
    }

    fn command(&self, program: impl AsRef<OsStr>, args: &[&OsStr]) -> Result<Command, DbError> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io_error("opening", &self.log))?;
        let log2 = log.try_clone().map_err(io_error("opening", &self.log))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        if let Some((uid, gid)) = self.run_as.ids {
            command.uid(uid).gid(gid);
        }
        Ok(command)
    }

    /// Runs a setup step to completion; its output goes to the log.
    pub async fn run(&self, what: &str, program: PathBuf, args: &[&OsStr]) -> Result<(), DbError> {
        let command = self.command(&program, args)?;
        let status = tokio::process::Command::from(command)
            .status()
            .await
            .map_err(io_error("running", &program))?;
        if status.success() {
            Ok(())
        } else {
            Err(DbError::Setup {
                what: format!("{} {what}", self.name),
                status: status.to_string(),
                log: self.log.clone(),
                log_tail: self.log_tail(),
            })
        }
    }

    /// Starts the server; `stop_signal` asks it to shut down cleanly.
    pub fn spawn(
        &mut self,
        program: PathBuf,
        args: &[&OsStr],
        stop_signal: libc::c_int,
    ) -> Result<(), DbError> {
        self.launch = Some((
            program,
            args.iter().map(|a| a.to_os_string()).collect(),
            stop_signal,
        ));
        self.respawn()
    }

    /// Starts the server as [`Server::spawn`] last did (same arguments: same port and data).
    pub fn respawn(&mut self) -> Result<(), DbError> {
        let (program, args, stop_signal) = self
            .launch
            .clone()
            .expect("respawn is only called after spawn");
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let mut command = self.command(&program, &args)?;
        // SAFETY: between fork and exec the closure only calls prctl(2), which
        // is async-signal-safe, and allocates nothing. It runs after the uid
        // change, which would otherwise clear the death signal.
        unsafe {
            command.pre_exec(|| {
                // Killed with us if we die without stopping it (when the
                // thread that forked it ends, to be precise: the test
                // binaries start their servers on the main thread).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(io_error("starting", &program))?;
        tracing::debug!(server = self.name, pid = child.id(), "started");
        self.child = Some((child, stop_signal));
        Ok(())
    }

    /// Asks the server to shut down cleanly and waits for it (killing it after a grace
    /// period); its directory stays.
    pub fn stop(&mut self) {
        let Some((mut child, signal)) = self.child.take() else {
            return;
        };
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions; the child is not
        // reaped yet (we hold it), so the pid cannot have been reused.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    tracing::warn!(server = self.name, "did not stop in time; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        tracing::debug!(server = self.name, "stopped");
    }

    /// An error if the server has exited.
    pub fn check_running(&mut self, what: &'static str) -> Result<(), DbError> {
        if let Some((child, _)) = &mut self.child
            && let Ok(Some(status)) = child.try_wait()
        {
            return Err(DbError::Setup {
                what: format!("{what} server"),
                status: format!("exited: {status}"),
                log: self.log.clone(),
                log_tail: self.log_tail(),
            });
        }
        Ok(())
    }

    /// The last lines of the log, or why it cannot be read.
    pub fn log_tail(&self) -> String {
        let read = || -> io::Result<String> {
            let mut file = File::open(&self.log)?;
            let len = file.metadata()?.len();
            file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        read().unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
