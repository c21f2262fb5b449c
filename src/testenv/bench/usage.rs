//! CPU time and peak resident memory: a process's, from /proc while it runs or
//! from wait4(2)'s rusage once it has ended; and who kept the machine's CPUs
//! busy over a stretch of time ([`Cpus`]).

use std::collections::BTreeMap;

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
    let proc_err = |file: &str| {
        let path = format!("/proc/{pid}/{file}");
        move |source| Error::Proc { path, source }
    };
    let process = procfs::process::Process::new(pid as i32).map_err(proc_err("stat"))?;
    let stat = process.stat().map_err(proc_err("stat"))?;
    let status = process.status().map_err(proc_err("status"))?;
    let ticks = procfs::ticks_per_second() as f64;
    Ok(Usage {
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        // In KiB.
        peak_rss_bytes: status.vmhwm.unwrap_or_default() * 1024,
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

/// The CPU time of the whole machine (/proc/stat) and of some named processes at one
/// moment; [`Cpus::since`] turns two of them into who used the CPUs in between.
#[derive(Clone, Debug)]
pub struct Cpus {
    at: std::time::Instant,
    busy_ticks: u64,
    all_ticks: u64,
    processes: BTreeMap<String, f64>,
}

/// Who used the CPUs over a stretch of time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuShare {
    /// The share of all the machine's CPUs that was busy (0–1), whoever used them.
    pub machine_busy: f64,
    /// Cores each named process used on average (1.0: one core all the time).
    pub cores: BTreeMap<String, f64>,
}

impl Cpus {
    /// Now, for `processes` (name, pid); a process that has gone is left out.
    pub fn now(processes: &[(String, u32)]) -> Result<Cpus, Error> {
        let stat = <procfs::KernelStats as procfs::CurrentSI>::current().map_err(|source| {
            Error::Proc {
                path: "/proc/stat".into(),
                source,
            }
        })?;
        let t = &stat.total;
        let idle = t.idle + t.iowait.unwrap_or_default();
        // Guest time is counted in user time already.
        let all = t.user
            + t.nice
            + t.system
            + idle
            + t.irq.unwrap_or_default()
            + t.softirq.unwrap_or_default()
            + t.steal.unwrap_or_default();
        Ok(Cpus {
            at: std::time::Instant::now(),
            busy_ticks: all - idle,
            all_ticks: all,
            processes: processes
                .iter()
                .filter_map(|(name, pid)| Some((name.clone(), of_running(*pid).ok()?.cpu_seconds)))
                .collect(),
        })
    }

    /// From `earlier` to this one; processes missing from either are left out.
    pub fn since(&self, earlier: &Cpus) -> CpuShare {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64();
        let all = self.all_ticks.saturating_sub(earlier.all_ticks);
        CpuShare {
            machine_busy: match all {
                0 => 0.0,
                all => self.busy_ticks.saturating_sub(earlier.busy_ticks) as f64 / all as f64,
            },
            cores: self
                .processes
                .iter()
                .filter_map(|(name, cpu)| {
                    let before = earlier.processes.get(name)?;
                    (seconds > 0.0).then(|| (name.clone(), (cpu - before) / seconds))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_running_process() {
        let usage = of_running(std::process::id()).unwrap();
        assert!(usage.peak_rss_bytes > 1024 * 1024, "{usage:?}");
        assert!(matches!(
            of_running(u32::MAX >> 1),
            Err(Error::Proc { path, .. }) if path == format!("/proc/{}/stat", u32::MAX >> 1)
        ));
    }

    #[test]
    fn a_busy_thread_shows_in_its_process_and_the_machine() {
        let me = [
            ("me".to_owned(), std::process::id()),
            ("gone".to_owned(), u32::MAX >> 1),
        ];
        let before = Cpus::now(&me).unwrap();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(300) {
            std::hint::black_box(spin.elapsed());
        }
        let share = Cpus::now(&me).unwrap().since(&before);
        assert!(
            share.machine_busy > 0.0 && share.machine_busy <= 1.0,
            "{share:?}"
        );
        assert_eq!(share.cores.keys().collect::<Vec<_>>(), ["me"]);
        // One spinning thread is about one core; ticks are 10 ms, other tests run beside.
        assert!(share.cores["me"] > 0.1, "{share:?}");
    }
}
