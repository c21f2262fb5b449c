//! The process's CPU time, resident memory and start time, read from /proc
//! at each scrape under the names every Prometheus client library gives
//! them, so dashboards and alerts written for any process work on rewind.
//!
//! Read with std rather than the procfs crate: the product's default build
//! carries no procfs or libc (tests/layers.rs keeps it so), and these are
//! four numbers in three short text files.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Linux gives CPU and start times in clock ticks of USER_HZ, which is 100
/// on every architecture Kubernetes runs on; prometheus/procfs assumes the
/// same. Asking `sysconf(_SC_CLK_TCK)` would need libc.
const TICKS_PER_SECOND: f64 = 100.0;

/// What one scrape reports.
#[derive(Debug, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    resident_bytes: u64,
    start_time_seconds: f64,
}

/// Reads `/proc/self/stat`, `/proc/self/status` and `/proc/stat`; `None`
/// where they are missing (not Linux) or unreadable.
fn read() -> Option<Sample> {
    let file = |path: &str| std::fs::read_to_string(path).ok();
    parse(
        &file("/proc/self/stat")?,
        &file("/proc/self/status")?,
        &file("/proc/stat")?,
    )
}

/// The sample in the three files' text (see proc_pid_stat(5), proc_pid_status(5), proc_stat(5)).
fn parse(stat: &str, status: &str, system: &str) -> Option<Sample> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses itself: fields are counted from the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 (utime), 15 (stime) and 22 (starttime), counted from 1, of
    // which the first two are before the ')'.
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    let cpu_ticks = ticks(14)? + ticks(15)?;
    let started_ticks = ticks(22)?;
    let resident_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    let boot_time: u64 = system
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(Sample {
        cpu_seconds: cpu_ticks as f64 / TICKS_PER_SECOND,
        resident_bytes: resident_kib * 1024,
        start_time_seconds: boot_time as f64 + started_ticks as f64 / TICKS_PER_SECOND,
    })
}

/// Adds the `process_*` metrics to each scrape (none where /proc is missing).
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = read() else {
            return Ok(());
        };
        let metrics: [(&str, &str, &dyn EncodeMetric); 3] = [
            (
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                &ConstCounter::new(sample.cpu_seconds),
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                &ConstGauge::new(sample.resident_bytes),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                &ConstGauge::new(sample.start_time_seconds),
            ),
        ];
        for (name, help, metric) in metrics {
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_text_with_a_command_name_full_of_spaces_and_parentheses() {
        // A name with a space and a ')' in it, as any process may give itself (prctl).
        let stat = "4242 (re wind) (x) S 1 4242 4242 0 -1 4194560 9000 0 0 0 \
                    250 75 0 0 20 0 12 0 123456 1048576000 37000 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 17640 0 0 0 17 1 0 0 0 0 0";
        let status = "Name:\tre wind\nVmPeak:\t  200000 kB\nVmRSS:\t   148000 kB\nThreads:\t12\n";
        let system = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1700000000\nprocesses 7\n";
        assert_eq!(
            parse(stat, status, system),
            Some(Sample {
                cpu_seconds: 3.25,
                resident_bytes: 148000 * 1024,
                start_time_seconds: 1_700_000_000.0 + 1234.56,
            })
        );
        assert_eq!(parse("4242 (rewind", status, system), None);
        assert_eq!(parse(stat, "Name:\trewind\n", system), None);
    }

    #[test]
    fn reads_this_process() {
        let sample = read().expect("/proc is there on Linux");
        assert!(sample.resident_bytes > 0);
        assert!(sample.start_time_seconds > 1_600_000_000.0);
        // The start time is the same at every scrape, so `changes()` counts only restarts.
        assert_eq!(
            read().unwrap().start_time_seconds,
            sample.start_time_seconds
        );
    }
}
