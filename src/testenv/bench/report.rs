//! Results: one [`Measured`] per run, summarised per row and N into medians
//! with min and max, ratios to the floor and to the peer, and a Markdown table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::audit::Steps;
use super::batch::Batch;
use super::neighbours::{KINDS, Latency};
use super::stats::{Summary, median};
use super::usage::Usage;

/// One run of one row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measured {
    pub row: String,
    pub pods: usize,
    pub repetition: usize,
    /// Seconds from the request to the job done, as the client saw it.
    pub wall_seconds: f64,
    /// The same, and its steps, as the API server's audit log times them.
    pub steps: Steps,
    /// The retrier's API requests by verb, from the audit log.
    pub requests: BTreeMap<String, usize>,
    /// The retrier's CPU seconds and peak RSS, where it is a process of its own.
    pub usage: Option<Usage>,
    pub neighbour_idle: Latency,
    pub neighbour_during: Latency,
    /// A batch run's own figures (many workflows retried by one command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Batch>,
}

/// Medians of a row's steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMedians {
    pub read_plan: Option<f64>,
    pub list: Option<f64>,
    pub delete: Option<f64>,
    pub confirm: Option<f64>,
    pub commit: Option<f64>,
}

/// A row at one N, over its repetitions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowSummary {
    pub row: String,
    pub pods: usize,
    /// Not measured: N/qps, what one DELETE per pod within the budget needs at least.
    pub computed: bool,
    pub wall: Summary,
    pub audit_total: Option<Summary>,
    pub steps: StepMedians,
    /// Median count of each verb.
    pub requests: BTreeMap<String, f64>,
    pub cpu_seconds: Option<Summary>,
    pub peak_rss_mib: Option<Summary>,
    pub idle_p50_ms: Option<Summary>,
    pub idle_p99_ms: Option<Summary>,
    pub during_p50_ms: Option<Summary>,
    pub during_p99_ms: Option<Summary>,
    /// Median wall time over the floor's at the same N.
    pub vs_floor: Option<f64>,
    /// Median wall time over the peer's (the row [`Reference::peer`] names) at the same N.
    pub vs_peer: Option<f64>,
    /// Where the neighbour's time went; absent where no run measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<NeighbourSummary>,
}

/// Medians over a row's runs of what explains the neighbour's latency, each as (idle,
/// during) where it has both.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NeighbourSummary {
    pub runs: usize,
    /// p99 as the neighbour saw it, by kind of request.
    pub seen_p99_ms_by_kind: BTreeMap<String, (f64, f64)>,
    /// p99 as the API server served the neighbour's requests (audit log), all and by kind.
    pub served_p99_ms: Option<(f64, f64)>,
    pub served_p99_ms_by_kind: BTreeMap<String, (f64, f64)>,
    /// How long consistent LISTs of workflows waited for the API server's watch cache: the
    /// mean, and the upper bound of the bucket holding the 99th percentile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_wait_mean_ms: Option<(f64, f64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_wait_p99_at_most_ms: Option<(f64, f64)>,
    /// The share of the machine's CPUs busy.
    pub machine_busy: Option<(f64, f64)>,
    /// Cores each process used during the retry.
    pub cores_during: BTreeMap<String, f64>,
}

/// What a row is compared with.
pub struct Reference<'a> {
    pub floor: &'a str,
    /// The peer row a row is compared with, if any.
    pub peer: &'a dyn Fn(&str) -> Option<&'a str>,
}

/// One summary per (N, row) in `order`'s order of rows, N ascending; rows without runs are
/// left out. `computed` rows (name, N, seconds) are added as given.
pub fn summarize(
    runs: &[Measured],
    order: &[&str],
    computed: &[(String, usize, f64)],
    reference: &Reference<'_>,
) -> Vec<RowSummary> {
    let mut pods: Vec<usize> = runs.iter().map(|r| r.pods).collect();
    pods.sort_unstable();
    pods.dedup();
    let mut out = Vec::new();
    for &n in &pods {
        for &row in order {
            let ours: Vec<&Measured> = runs
                .iter()
                .filter(|r| r.pods == n && r.row == row)
                .collect();
            if let Some(summary) = summarize_row(row, n, &ours) {
                out.push(summary);
            }
        }
        for (name, _, seconds) in computed.iter().filter(|c| c.1 == n) {
            out.push(RowSummary {
                row: name.clone(),
                pods: n,
                computed: true,
                wall: Summary::of([*seconds]).expect("one value"),
                audit_total: None,
                steps: StepMedians::default(),
                requests: BTreeMap::new(),
                cpu_seconds: None,
                peak_rss_mib: None,
                idle_p50_ms: None,
                idle_p99_ms: None,
                during_p50_ms: None,
                during_p99_ms: None,
                vs_floor: None,
                vs_peer: None,
                neighbour: None,
            });
        }
    }
    let wall = |row: &str, n: usize| {
        out.iter()
            .find(|s| s.row == row && s.pods == n && !s.computed)
            .map(|s| s.wall.median)
    };
    let ratios: Vec<(Option<f64>, Option<f64>)> = out
        .iter()
        .map(|s| {
            let floor = wall(reference.floor, s.pods).map(|f| s.wall.median / f);
            let peer = (reference.peer)(&s.row)
                .and_then(|p| wall(p, s.pods))
                .map(|p| s.wall.median / p);
            (floor, peer)
        })
        .collect();
    for (s, (floor, peer)) in out.iter_mut().zip(ratios) {
        (s.vs_floor, s.vs_peer) = (floor, peer);
    }
    out
}

fn summarize_row(row: &str, pods: usize, runs: &[&Measured]) -> Option<RowSummary> {
    let wall = Summary::of(runs.iter().map(|r| r.wall_seconds))?;
    let step = |f: fn(&Steps) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(|r| f(&r.steps)).collect();
        (!v.is_empty()).then(|| median(v))
    };
    let mut verbs: Vec<&String> = runs.iter().flat_map(|r| r.requests.keys()).collect();
    verbs.sort();
    verbs.dedup();
    let requests = verbs
        .into_iter()
        .map(|verb| {
            let counts = runs
                .iter()
                .map(|r| r.requests.get(verb).copied().unwrap_or(0) as f64)
                .collect();
            (verb.clone(), median(counts))
        })
        .collect();
    let usage =
        |f: fn(&Usage) -> f64| Summary::of(runs.iter().filter_map(|r| r.usage.as_ref().map(f)));
    let latency = |during: bool, f: fn(&Latency) -> Option<f64>| {
        Summary::of(runs.iter().filter_map(|r| {
            f(if during {
                &r.neighbour_during
            } else {
                &r.neighbour_idle
            })
        }))
    };
    Some(RowSummary {
        row: row.to_owned(),
        pods,
        computed: false,
        wall,
        audit_total: Summary::of(runs.iter().map(|r| r.steps.total)),
        steps: StepMedians {
            read_plan: step(|s| s.read_plan),
            list: step(|s| s.list),
            delete: step(|s| s.delete),
            confirm: step(|s| s.confirm),
            commit: step(|s| s.commit),
        },
        requests,
        cpu_seconds: usage(|u| u.cpu_seconds),
        peak_rss_mib: usage(|u| u.peak_rss_bytes as f64 / (1024.0 * 1024.0)),
        idle_p50_ms: latency(false, |l| l.p50_ms),
        idle_p99_ms: latency(false, |l| l.p99_ms),
        during_p50_ms: latency(true, |l| l.p50_ms),
        during_p99_ms: latency(true, |l| l.p99_ms),
        vs_floor: None,
        vs_peer: None,
        neighbour: summarize_neighbour(runs),
    })
}

fn summarize_neighbour(runs: &[&Measured]) -> Option<NeighbourSummary> {
    let runs: Vec<&Measured> = runs
        .iter()
        .copied()
        .filter(|r| r.neighbour_during.served.is_some() || r.neighbour_during.cpus.is_some())
        .collect();
    if runs.is_empty() {
        return None;
    }
    let pair = |f: &dyn Fn(&Latency) -> Option<f64>| {
        let idle: Vec<f64> = runs.iter().filter_map(|r| f(&r.neighbour_idle)).collect();
        let during: Vec<f64> = runs.iter().filter_map(|r| f(&r.neighbour_during)).collect();
        (!idle.is_empty() && !during.is_empty()).then(|| (median(idle), median(during)))
    };
    let by_kind = |f: &dyn Fn(&Latency) -> Option<&BTreeMap<String, f64>>| {
        KINDS
            .iter()
            .filter_map(|(kind, ..)| {
                let p = pair(&|l| f(l).and_then(|m| m.get(*kind).copied()))?;
                Some(((*kind).to_owned(), p))
            })
            .collect()
    };
    let mut processes: Vec<&String> = runs
        .iter()
        .filter_map(|r| r.neighbour_during.cpus.as_ref())
        .flat_map(|c| c.cores.keys())
        .collect();
    processes.sort();
    processes.dedup();
    Some(NeighbourSummary {
        runs: runs.len(),
        seen_p99_ms_by_kind: by_kind(&|l| Some(&l.p99_ms_by_kind)),
        served_p99_ms: pair(&|l| l.served.as_ref()?.p99_ms),
        served_p99_ms_by_kind: by_kind(&|l| Some(&l.served.as_ref()?.p99_ms_by_kind)),
        cache_wait_mean_ms: pair(&|l| Some(l.workflows_cache_wait.as_ref()?.mean_ms)),
        cache_wait_p99_at_most_ms: pair(&|l| l.workflows_cache_wait.as_ref()?.p99_at_most_ms),
        machine_busy: pair(&|l| Some(l.cpus.as_ref()?.machine_busy)),
        cores_during: processes
            .into_iter()
            .map(|p| {
                let cores = runs
                    .iter()
                    .filter_map(|r| r.neighbour_during.cpus.as_ref()?.cores.get(p).copied())
                    .collect();
                (p.clone(), median(cores))
            })
            .collect(),
    })
}

/// The summaries as a Markdown table: medians, with (min–max) where a row ran more than once.
pub fn markdown(rows: &[RowSummary]) -> String {
    let mut out = String::from(
        "| row | N | runs | wall s | vs floor | vs peer | audit s | read+plan | list | delete | confirm | commit | API requests | CPU s | peak RSS MiB | neighbour p50 ms idle → during | neighbour p99 ms idle → during |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n",
    );
    let opt = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
    };
    let spread = |s: Option<&Summary>, digits: usize| match s {
        None => "–".to_owned(),
        Some(s) if s.n == 1 => format!("{:.digits$}", s.median),
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            s.median, s.min, s.max
        ),
    };
    let ratio = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}×"));
    let idle_during = |idle: Option<&Summary>, during: Option<&Summary>| match (idle, during) {
        (Some(i), Some(d)) => format!("{:.1} → {:.1}", i.median, d.median),
        _ => "–".to_owned(),
    };
    for s in rows {
        let requests = match s.requests.is_empty() {
            true => "–".to_owned(),
            false => s
                .requests
                .iter()
                .map(|(verb, n)| format!("{verb} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let row = match s.computed {
            true => format!("{} (computed)", s.row),
            false => s.row.clone(),
        };
        let _ = writeln!(
            out,
            "| {row} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {requests} | {} | {} | {} | {} |",
            s.pods,
            match s.computed {
                true => "–".to_owned(),
                false => s.wall.n.to_string(),
            },
            spread(Some(&s.wall), 2),
            ratio(s.vs_floor),
            ratio(s.vs_peer),
            spread(s.audit_total.as_ref(), 2),
            opt(s.steps.read_plan, 2),
            opt(s.steps.list, 2),
            opt(s.steps.delete, 2),
            opt(s.steps.confirm, 2),
            opt(s.steps.commit, 2),
            spread(s.cpu_seconds.as_ref(), 2),
            spread(s.peak_rss_mib.as_ref(), 0),
            idle_during(s.idle_p50_ms.as_ref(), s.during_p50_ms.as_ref()),
            idle_during(s.idle_p99_ms.as_ref(), s.during_p99_ms.as_ref()),
        );
    }
    out
}

/// Where the neighbour's time went, for the rows that measured it, as a Markdown table; `None`
/// if none did.
pub fn neighbour_markdown(rows: &[RowSummary]) -> Option<String> {
    let measured: Vec<(&RowSummary, &NeighbourSummary)> = rows
        .iter()
        .filter_map(|r| Some((r, r.neighbour.as_ref()?)))
        .collect();
    if measured.is_empty() {
        return None;
    }
    let mut processes: Vec<&String> = measured
        .iter()
        .flat_map(|(_, n)| n.cores_during.keys())
        .collect();
    processes.sort();
    processes.dedup();
    let kinds: Vec<&str> = KINDS.iter().map(|k| k.0).collect();
    let mut out = format!(
        "| row | N | runs | seen p99 ms: {} | served p99 ms: all | {} | LIST's wait for the cache: mean ms | p99 ≤ ms | CPUs busy | cores during: {} |\n|---|---:|---:|{}\n",
        kinds.join(" | "),
        kinds.join(" | "),
        processes
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(2 * kinds.len() + 4 + processes.len()),
    );
    let pair = |p: Option<&(f64, f64)>| {
        p.map_or_else(|| "–".to_owned(), |(i, d)| format!("{i:.1} → {d:.1}"))
    };
    for (r, n) in measured {
        let mut cells = vec![r.row.clone(), r.pods.to_string(), n.runs.to_string()];
        cells.extend(kinds.iter().map(|k| pair(n.seen_p99_ms_by_kind.get(*k))));
        cells.push(pair(n.served_p99_ms.as_ref()));
        cells.extend(kinds.iter().map(|k| pair(n.served_p99_ms_by_kind.get(*k))));
        cells.push(pair(n.cache_wait_mean_ms.as_ref()));
        cells.push(pair(n.cache_wait_p99_at_most_ms.as_ref()));
        cells.push(n.machine_busy.map_or_else(
            || "–".to_owned(),
            |(i, d)| format!("{:.0}% → {:.0}%", i * 100.0, d * 100.0),
        ));
        cells.extend(processes.iter().map(|p| {
            n.cores_during
                .get(*p)
                .map_or_else(|| "–".to_owned(), |c| format!("{c:.2}"))
        }));
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testenv::bench::cache_wait::CacheWait;
    use crate::testenv::bench::neighbours::Served;
    use crate::testenv::bench::usage::CpuShare;

    /// Only rewind's runs say where the neighbour's time went.
    fn run(row: &str, pods: usize, wall: f64, verbs: &[(&str, usize)]) -> Measured {
        let explained = row == "rewind";
        Measured {
            row: row.into(),
            pods,
            repetition: 0,
            wall_seconds: wall,
            steps: Steps {
                delete: Some(wall / 2.0),
                total: wall,
                ..Default::default()
            },
            requests: verbs.iter().map(|(v, n)| ((*v).to_owned(), *n)).collect(),
            usage: (row == "rewind").then_some(Usage {
                cpu_seconds: wall / 10.0,
                peak_rss_bytes: 30 * 1024 * 1024,
            }),
            neighbour_idle: Latency {
                requests: 100,
                errors: 0,
                p50_ms: Some(2.0),
                p99_ms: Some(3.0),
                max_ms: Some(4.0),
                served: explained.then(|| served(1.0)),
                cpus: explained.then(|| cpus(0.1, &[("etcd", 0.01)])),
                workflows_cache_wait: explained.then_some(CacheWait {
                    reads: 30,
                    mean_ms: 0.5,
                    p99_at_most_ms: Some(5.0),
                }),
                ..Latency::default()
            },
            neighbour_during: Latency {
                requests: 100,
                errors: 0,
                p50_ms: Some(4.0),
                p99_ms: Some(9.0),
                max_ms: Some(12.0),
                p99_ms_by_kind: [("list workflows".to_owned(), wall)].into(),
                served: explained.then(|| served(wall)),
                cpus: explained
                    .then(|| cpus(0.9, &[("etcd", 0.3), ("kube-apiserver", wall / 10.0)])),
                // Past the histogram's last bound in one run.
                workflows_cache_wait: explained.then(|| CacheWait {
                    reads: 90,
                    mean_ms: wall * 4.0,
                    p99_at_most_ms: (wall < 5.0).then_some(50.0),
                }),
                ..Latency::default()
            },
            batch: None,
        }
    }

    fn served(p99: f64) -> Served {
        Served {
            requests: 10,
            p99_ms: Some(p99),
            p99_ms_by_kind: [("get pod".to_owned(), p99 / 2.0)].into(),
        }
    }

    fn cpus(busy: f64, cores: &[(&str, f64)]) -> CpuShare {
        CpuShare {
            machine_busy: busy,
            cores: cores.iter().map(|(p, c)| ((*p).to_owned(), *c)).collect(),
        }
    }

    fn summaries() -> Vec<RowSummary> {
        let runs = vec![
            run("floor", 100, 2.0, &[("deletecollection", 1)]),
            run("rewind", 100, 3.0, &[("list", 1), ("deletecollection", 1)]),
            run("rewind", 100, 2.0, &[("list", 2), ("deletecollection", 1)]),
            run("rewind", 100, 5.0, &[("deletecollection", 1)]),
            run("peer", 100, 30.0, &[("delete", 100)]),
            run("floor", 1000, 20.0, &[("deletecollection", 1)]),
        ];
        let peer = |row: &str| (row != "peer").then_some("peer");
        summarize(
            &runs,
            &["floor", "rewind", "peer"],
            &[("pod-floor".into(), 100, 5.0)],
            &Reference {
                floor: "floor",
                peer: &peer,
            },
        )
    }

    #[test]
    fn medians_ratios_and_verb_counts() {
        let s = summaries();
        let names: Vec<(&str, usize)> = s.iter().map(|s| (s.row.as_str(), s.pods)).collect();
        assert_eq!(
            names,
            [
                ("floor", 100),
                ("rewind", 100),
                ("peer", 100),
                ("pod-floor", 100),
                ("floor", 1000)
            ]
        );
        let rewind = &s[1];
        assert_eq!(
            rewind.wall,
            Summary {
                median: 3.0,
                min: 2.0,
                max: 5.0,
                n: 3
            }
        );
        assert_eq!(rewind.vs_floor, Some(1.5));
        assert_eq!(rewind.vs_peer, Some(0.1));
        assert_eq!(rewind.steps.delete, Some(1.5));
        assert_eq!(rewind.steps.list, None);
        // A verb missing from a run counts 0 there.
        assert_eq!(rewind.requests["list"], 1.0);
        assert_eq!(rewind.requests["deletecollection"], 1.0);
        assert_eq!(rewind.cpu_seconds.map(|c| c.median), Some(0.3));
        assert_eq!(s[0].cpu_seconds, None);
        assert_eq!(s[2].vs_peer, None);
        assert!(s[3].computed);
        assert_eq!(s[3].vs_floor, Some(2.5));
        // No peer ran at N = 1000.
        assert_eq!((s[4].vs_floor, s[4].vs_peer), (Some(1.0), None));
    }

    #[test]
    fn table_rows() {
        let table = markdown(&summaries());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + 5);
        assert!(lines[0].starts_with("| row | N | runs | wall s |"));
        assert_eq!(lines[0].matches('|').count(), lines[1].matches('|').count());
        assert_eq!(
            lines[3],
            "| rewind | 100 | 3 | 3.00 (2.00–5.00) | 1.50× | 0.10× | 3.00 (2.00–5.00) | – | – | 1.50 | – | – | deletecollection 1, list 1 | 0.30 (0.20–0.50) | 30 (30–30) | 2.0 → 4.0 | 3.0 → 9.0 |"
        );
        assert_eq!(
            lines[5],
            "| pod-floor (computed) | 100 | – | 5.00 | 2.50× | 0.17× | – | – | – | – | – | – | – | – | – | – | – |"
        );
    }

    #[test]
    fn where_the_neighbours_time_went() {
        let s = summaries();
        assert_eq!(s[0].neighbour, None);
        let rewind = s[1].neighbour.as_ref().unwrap();
        assert_eq!(rewind.runs, 3);
        assert_eq!(rewind.served_p99_ms, Some((1.0, 3.0)));
        assert_eq!(rewind.served_p99_ms_by_kind["get pod"], (0.5, 1.5));
        // The idle runs did not break it down by kind.
        assert!(rewind.seen_p99_ms_by_kind.is_empty());
        assert_eq!(rewind.machine_busy, Some((0.1, 0.9)));
        assert_eq!(rewind.cores_during["kube-apiserver"], 0.3);
        assert_eq!(neighbour_markdown(&s[..1]), None);
        let table = neighbour_markdown(&s).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "| row | N | runs | seen p99 ms: get pod | list workflows | patch configmap | served p99 ms: all | get pod | list workflows | patch configmap | LIST's wait for the cache: mean ms | p99 ≤ ms | CPUs busy | cores during: etcd | kube-apiserver |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                "| rewind | 100 | 3 | – | – | – | 1.0 → 3.0 | 0.5 → 1.5 | – | – | 0.5 → 12.0 | 5.0 → 50.0 | 10% → 90% | 0.30 | 0.30 |",
            ]
        );
    }
}
