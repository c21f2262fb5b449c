//! What a batch run measures beside a retry's figures: many workflows retried by one
//! command (`rewind retry -l`, or Argo's `argo retry -l` loop), that command's own time and
//! cost, the retrier's busiest second, and a second user's small retry asked meanwhile;
//! and the table of them.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::report::Measured;
use super::stats::Summary;
use super::usage::Usage;

/// One batch run's own figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Workflows retried by the one command.
    pub workflows: usize,
    /// Failed pods of each.
    pub pods_each: usize,
    /// From the command's start to its return: `rewind retry` returns once it has seen every
    /// request end (it polls), Argo's loop once its last RPC answered.
    pub command_seconds: f64,
    /// The command's CPU and peak RSS where it is not the retrier itself (rewind's CLI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_usage: Option<Usage>,
    /// What the command said where it failed (its exit status and its words); `None` where
    /// it succeeded. The workflows are checked all the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_failed: Option<String>,
    /// The retrier's most mutating requests the API server received within one second
    /// (what rewind's write bucket pays for), and its most requests of any kind (what
    /// client-go's limiter, Argo's budget, pays for); watches left out.
    pub busiest_writes: usize,
    pub busiest_requests: usize,
    /// The second user's retry, where one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small: Option<SmallRetry>,
}

/// A second user's retry of a small workflow, asked while the batch ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmallRetry {
    /// Its failed pods.
    pub pods: usize,
    /// When it was asked, in seconds from the batch command's start.
    pub asked_after_seconds: f64,
    /// From its request (the annotation's patch sent) to its reset, seen on a watch.
    pub wall_seconds: f64,
    /// The same from the audit log: the patch received → the controller's write of the
    /// reset workflow answered.
    pub audit_seconds: Option<f64>,
}

/// The batch runs among `runs` as a Markdown table, a line per row and shape in `order`'s
/// order of rows: medians (with min–max over several runs), then what each command that
/// failed said. `peer` names the row a row's speed-up is measured against. `None` without
/// batch runs.
pub fn markdown(
    runs: &[Measured],
    order: &[&str],
    peer: &dyn Fn(&str) -> Option<&'static str>,
) -> Option<String> {
    let batch: Vec<(&Measured, &Batch)> = runs
        .iter()
        .filter_map(|r| Some((r, r.batch.as_ref()?)))
        .collect();
    if batch.is_empty() {
        return None;
    }
    let shapes: BTreeSet<(usize, usize)> = batch
        .iter()
        .map(|(_, b)| (b.workflows, b.pods_each))
        .collect();
    let of = |row: &str, shape: (usize, usize)| -> Vec<(&Measured, &Batch)> {
        batch
            .iter()
            .copied()
            .filter(|(r, b)| r.row == row && (b.workflows, b.pods_each) == shape)
            .collect()
    };
    let median_wall = |row: &str, shape| {
        Summary::of(of(row, shape).iter().map(|(r, _)| r.wall_seconds)).map(|s| s.median)
    };
    let mut out = String::from(
        "| row | workflows × failed pods | runs | wall s | command returned s | speed-up vs peer | small retry: pods | asked at s | request → reset s | audit s | busiest second: writes | all requests | command CPU s | command peak RSS MiB |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for shape in shapes {
        for &row in order {
            let ours = of(row, shape);
            let Some(wall) = median_wall(row, shape) else {
                continue;
            };
            let speed_up = peer(row)
                .and_then(|p| median_wall(p, shape))
                .map_or_else(|| "–".to_owned(), |p| format!("{:.1}×", p / wall));
            let small: Vec<&SmallRetry> =
                ours.iter().filter_map(|(_, b)| b.small.as_ref()).collect();
            let usage: Vec<Usage> = ours.iter().filter_map(|(_, b)| b.command_usage).collect();
            let batch = |f: fn(&Batch) -> f64, digits| cell(ours.iter().map(|(_, b)| f(b)), digits);
            let small = |f: fn(&SmallRetry) -> Option<f64>, digits| {
                cell(small.iter().filter_map(|s| f(s)), digits)
            };
            let _ = writeln!(
                out,
                "| {row} | {} × {} | {} | {} | {} | {speed_up} | {} | {} | {} | {} | {} | {} | {} | {} |",
                shape.0,
                shape.1,
                ours.len(),
                cell(ours.iter().map(|(r, _)| r.wall_seconds), 2),
                batch(|b| b.command_seconds, 2),
                small(|s| Some(s.pods as f64), 0),
                small(|s| Some(s.asked_after_seconds), 2),
                small(|s| Some(s.wall_seconds), 2),
                small(|s| s.audit_seconds, 2),
                batch(|b| b.busiest_writes as f64, 0),
                batch(|b| b.busiest_requests as f64, 0),
                cell(usage.iter().map(|u| u.cpu_seconds), 2),
                cell(
                    usage
                        .iter()
                        .map(|u| u.peak_rss_bytes as f64 / (1024.0 * 1024.0)),
                    0
                ),
            );
        }
    }
    for (run, batch) in &batch {
        if let Some(said) = &batch.command_failed {
            let _ = write!(
                out,
                "\n{} ({} × {}, run {}): the command failed: {said}\n",
                run.row,
                batch.workflows,
                batch.pods_each,
                run.repetition + 1
            );
        }
    }
    Some(out)
}

/// The median of `values`, with their min–max when there are several; "–" for none.
fn cell(values: impl IntoIterator<Item = f64>, digits: usize) -> String {
    match Summary::of(values) {
        None => "–".to_owned(),
        Some(s) if s.n == 1 => format!("{:.digits$}", s.median),
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            s.median, s.min, s.max
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(row: &str, wall: f64, batch: Batch) -> Measured {
        Measured {
            row: row.into(),
            pods: batch.workflows * batch.pods_each,
            repetition: 0,
            wall_seconds: wall,
            steps: Default::default(),
            requests: Default::default(),
            usage: None,
            neighbour_idle: Default::default(),
            neighbour_during: Default::default(),
            batch: Some(batch),
        }
    }

    fn batch(command_seconds: f64, small: Option<f64>) -> Batch {
        Batch {
            workflows: 200,
            pods_each: 100,
            command_seconds,
            command_usage: small.map(|_| Usage {
                cpu_seconds: 0.5,
                peak_rss_bytes: 20 * 1024 * 1024,
            }),
            command_failed: None,
            busiest_writes: 50,
            busiest_requests: if small.is_some() { 120 } else { 50 },
            small: small.map(|wall| SmallRetry {
                pods: 20,
                asked_after_seconds: 5.0,
                wall_seconds: wall,
                audit_seconds: Some(wall - 0.1),
            }),
        }
    }

    #[test]
    fn a_line_per_batch_row_with_its_speed_up() {
        let mut single = run("rewind", 3.0, batch(0.0, None));
        single.batch = None;
        let mut runs = vec![
            single,
            run("rewind-batch", 40.0, batch(45.0, Some(1.0))),
            run("peer-batch", 1000.0, batch(1000.0, None)),
            run("rewind-batch", 50.0, batch(52.0, Some(2.0))),
        ];
        let mut failed = run("rewind-batch", 50.0, batch(52.0, Some(2.0)));
        failed.repetition = 1;
        failed.batch.as_mut().unwrap().command_failed = Some("exit status 1: no".into());
        runs[3] = failed;
        let peer = |row: &str| (row == "rewind-batch").then_some("peer-batch");
        let table = markdown(&runs, &["rewind", "rewind-batch", "peer-batch"], &peer).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6);
        assert_eq!(
            lines[5],
            "rewind-batch (200 × 100, run 2): the command failed: exit status 1: no"
        );
        assert_eq!(lines[0].matches('|').count(), lines[1].matches('|').count());
        assert_eq!(
            lines[2],
            "| rewind-batch | 200 × 100 | 2 | 45.00 (40.00–50.00) | 48.50 (45.00–52.00) | 22.2× | 20 (20–20) | 5.00 (5.00–5.00) | 1.50 (1.00–2.00) | 1.40 (0.90–1.90) | 50 (50–50) | 120 (120–120) | 0.50 (0.50–0.50) | 20 (20–20) |"
        );
        assert_eq!(
            lines[3],
            "| peer-batch | 200 × 100 | 1 | 1000.00 | 1000.00 | – | – | – | – | – | 50 | 50 | – | – |"
        );
        assert_eq!(markdown(&runs[..1], &["rewind"], &peer), None);
    }
}
