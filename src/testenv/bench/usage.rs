//! A process's CPU time and peak resident memory, from /proc while it runs
//! or from wait4(2)'s rusage once it has ended.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Error;

/// CPU seconds (user + system) and peak resident set size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
}

/// `pid`'s usage so far, from /proc/PID/stat and /proc/PID/status (VmHWM).
pub fn of_running(pid: u32) -> Result<Usage, Error> {
    let read = |file: &str| {
        let path = PathBuf::from(format!("/proc/{pid}/{file}"));
        std::fs::read_to_string(&path).map_err(|source| Error::Io {
            action: "reading",
            path,
            source,
        })
    };
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (stat, status) = (read("stat")?, read("status")?);
    Ok(Usage {
        cpu_seconds: cpu_seconds(&stat, ticks).ok_or(Error::Proc { pid, what: "stat" })?,
        peak_rss_bytes: peak_rss(&status).ok_or(Error::Proc { pid, what: "VmHWM" })?,
    })
}

/// An ended child's usage, from wait4(2)'s rusage (ru_maxrss is in KiB on Linux).
pub fn of_rusage(r: &libc::rusage) -> Usage {
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Usage {
        cpu_seconds: secs(r.ru_utime) + secs(r.ru_stime),
        peak_rss_bytes: r.ru_maxrss as u64 * 1024,
    }
}

/// utime + stime (fields 14 and 15) of /proc/PID/stat, in seconds. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
fn cpu_seconds(stat: &str, ticks_per_second: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second)
}

/// VmHWM (the peak resident set size) of /proc/PID/status, in bytes.
fn peak_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_from_stat_with_a_tricky_command_name() {
        let stat = "4242 (rewind (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123 456 789";
        assert_eq!(cpu_seconds(stat, 100.0), Some(3.0));
        assert_eq!(cpu_seconds("4242 (short) S 1", 100.0), None);
    }

    #[test]
    fn peak_rss_from_status() {
        let status = "Name:\trewind\nVmPeak:\t  99999 kB\nVmHWM:\t   20480 kB\nVmRSS:\t 10240 kB\n";
        assert_eq!(peak_rss(status), Some(20 * 1024 * 1024));
        assert_eq!(peak_rss("Name:\trewind\n"), None);
    }

    #[test]
    fn reads_a_running_process() {
        let usage = of_running(std::process::id()).unwrap();
        assert!(usage.peak_rss_bytes > 1024 * 1024, "{usage:?}");
        assert!(matches!(
            of_running(u32::MAX),
            Err(Error::Io {
                action: "reading",
                ..
            })
        ));
    }
}
