//! The API server's audit log (JSON lines, one event per request): who sent
//! what, and when the server received and answered it. A benchmark reads its
//! timings here rather than from the client, whose clock includes its own
//! queueing.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Error;
use crate::testenv::io_error;

/// One request: who, what, on which object, received and answered when.
#[derive(Clone, Debug, PartialEq)]
pub struct Audited {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub namespace: String,
    /// The object's name; empty for a list or a collection.
    pub name: String,
    pub received: Timestamp,
    pub completed: Timestamp,
}

impl Audited {
    /// Whether the request changes something: what a budget's write bucket pays for.
    pub fn is_mutating(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// Every request of the log, ordered by the time the server received it.
/// Lines that are not JSON events are skipped: the server may be writing the last one.
pub fn parse(text: &str) -> Result<Vec<Audited>, Error> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let time = |key: &str| -> Result<Timestamp, Error> {
            let t = s(&event[key]);
            t.parse().map_err(|_| Error::AuditTimestamp(t))
        };
        out.push(Audited {
            user: s(&event["user"]["username"]),
            verb: s(&event["verb"]),
            resource: s(&event["objectRef"]["resource"]),
            namespace: s(&event["objectRef"]["namespace"]),
            name: s(&event["objectRef"]["name"]),
            received: time("requestReceivedTimestamp")?,
            completed: time("stageTimestamp")?,
        });
    }
    out.sort_by_key(|a| a.received);
    Ok(out)
}

/// [`parse`] of the file at `path`.
pub fn read(path: &Path) -> Result<Vec<Audited>, Error> {
    let text = std::fs::read_to_string(path).map_err(io_error("reading", path))?;
    parse(&text)
}

/// How many requests of each verb.
pub fn by_verb<'a>(requests: impl IntoIterator<Item = &'a Audited>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in requests {
        *counts.entry(a.verb.clone()).or_default() += 1;
    }
    counts
}

/// The most of `requests` the server received within one second (any window `[t, t + 1 s)`):
/// what a client budget of qps Q and burst B holds to at most B + Q.
pub fn busiest_second<'a>(requests: impl IntoIterator<Item = &'a Audited>) -> usize {
    let mut times: Vec<Timestamp> = requests.into_iter().map(|a| a.received).collect();
    times.sort_unstable();
    let second = k8s_openapi::jiff::SignedDuration::from_secs(1);
    let mut start = 0;
    let mut busiest = 0;
    for (end, t) in times.iter().enumerate() {
        while times[start] + second <= *t {
            start += 1;
        }
        busiest = busiest.max(end + 1 - start);
    }
    busiest
}

/// Seconds from `from` to `to` (negative if `to` is earlier).
pub fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

/// A retry's steps as the API server saw them, in seconds: from the request to the first
/// list of pods (read and plan), to the first delete (list), to the last delete's answer
/// (delete), to the workflow's write (confirm gone: what happens between), and that
/// write's answer (commit). A step the retrier does not take is `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Steps {
    pub read_plan: Option<f64>,
    pub list: Option<f64>,
    pub delete: Option<f64>,
    pub confirm: Option<f64>,
    pub commit: Option<f64>,
    /// From the request to the commit's answer (or the last delete's, without a commit).
    pub total: f64,
}

/// The steps of one retrier's `requests` (its own, in received order, watches left out),
/// asked for at `started`; also the requests up to its end. `None` without a delete or a
/// workflow write.
pub fn steps<'a>(
    requests: &[&'a Audited],
    started: Timestamp,
) -> Option<(Steps, Vec<&'a Audited>)> {
    let ours: Vec<&Audited> = requests
        .iter()
        .copied()
        .filter(|a| a.received >= started && a.verb != "watch")
        .collect();
    let is_delete = |a: &&&Audited| {
        a.resource == "pods" && matches!(a.verb.as_str(), "delete" | "deletecollection")
    };
    let first_delete = ours.iter().find(is_delete);
    let last_deleted = ours.iter().filter(is_delete).map(|a| a.completed).max();
    let commit = ours
        .iter()
        .filter(|a| a.resource == "workflows" && matches!(a.verb.as_str(), "update" | "create"))
        .max_by_key(|a| a.received);
    let list = ours
        .iter()
        .find(|a| a.resource == "pods" && a.verb == "list")
        .filter(|l| first_delete.is_none_or(|d| l.received <= d.received));
    let end = match (commit, last_deleted) {
        (Some(c), _) => c.completed,
        (None, Some(d)) => d,
        (None, None) => return None,
    };
    let first_step = list.or(first_delete).or(commit)?;
    let steps = Steps {
        read_plan: Some(seconds(started, first_step.received)),
        list: list
            .zip(first_delete)
            .map(|(l, d)| seconds(l.received, d.received)),
        delete: first_delete
            .zip(last_deleted)
            .map(|(d, last)| seconds(d.received, last)),
        confirm: last_deleted
            .zip(commit)
            .map(|(last, c)| seconds(last, c.received)),
        commit: commit.map(|c| seconds(c.received, c.completed)),
        total: seconds(started, end),
    };
    let within = ours.into_iter().filter(|a| a.received <= end).collect();
    Some((steps, within))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(user: &str, verb: &str, resource: &str, received: &str, completed: &str) -> String {
        serde_json::json!({
            "kind": "Event", "stage": "ResponseComplete",
            "user": {"username": user}, "verb": verb,
            "objectRef": {"resource": resource, "namespace": "bench", "name": "wf"},
            "requestReceivedTimestamp": received, "stageTimestamp": completed,
        })
        .to_string()
    }

    fn log() -> Vec<Audited> {
        let lines = [
            line(
                "c",
                "watch",
                "workflows",
                "2026-01-01T00:00:00.000000Z",
                "2026-01-01T00:00:00.001000Z",
            ),
            line(
                "a",
                "patch",
                "workflows",
                "2026-01-01T00:00:01.000000Z",
                "2026-01-01T00:00:01.010000Z",
            ),
            line(
                "c",
                "list",
                "pods",
                "2026-01-01T00:00:01.200000Z",
                "2026-01-01T00:00:01.250000Z",
            ),
            line(
                "c",
                "delete",
                "pods",
                "2026-01-01T00:00:01.500000Z",
                "2026-01-01T00:00:01.600000Z",
            ),
            line(
                "c",
                "delete",
                "pods",
                "2026-01-01T00:00:01.550000Z",
                "2026-01-01T00:00:02.000000Z",
            ),
            line(
                "c",
                "patch",
                "workflows",
                "2026-01-01T00:00:01.700000Z",
                "2026-01-01T00:00:01.710000Z",
            ),
            line(
                "c",
                "update",
                "workflows",
                "2026-01-01T00:00:02.500000Z",
                "2026-01-01T00:00:02.600000Z",
            ),
            line(
                "c",
                "create",
                "events",
                "2026-01-01T00:00:02.700000Z",
                "2026-01-01T00:00:02.710000Z",
            ),
        ];
        // Out of order, and a torn last line: the server may be writing it.
        let mut text: Vec<String> = lines.iter().rev().cloned().collect();
        text.push("{\"kind\": \"Ev".into());
        parse(&text.join("\n")).unwrap()
    }

    #[test]
    fn parses_in_received_order_and_skips_torn_lines() {
        let log = log();
        assert_eq!(log.len(), 8);
        assert_eq!(log[0].verb, "watch");
        assert_eq!(log[1].user, "a");
        assert_eq!(log[1].namespace, "bench");
        assert_eq!(log[1].name, "wf");
        assert!(log.windows(2).all(|w| w[0].received <= w[1].received));
    }

    #[test]
    fn a_bad_timestamp_is_an_error() {
        let bad = line("a", "get", "pods", "yesterday", "2026-01-01T00:00:00Z");
        assert!(matches!(parse(&bad), Err(Error::AuditTimestamp(t)) if t == "yesterday"));
    }

    #[test]
    fn counts_requests_by_verb() {
        let log = log();
        let counts = by_verb(log.iter().filter(|a| a.user == "c"));
        let expected: BTreeMap<String, usize> = [
            ("create", 1),
            ("delete", 2),
            ("list", 1),
            ("patch", 1),
            ("update", 1),
            ("watch", 1),
        ]
        .into_iter()
        .map(|(v, n)| (v.to_owned(), n))
        .collect();
        assert_eq!(counts, expected);
    }

    #[test]
    fn the_busiest_second_of_the_writes() {
        let log = log();
        let writes: Vec<&Audited> = log.iter().filter(|a| a.is_mutating()).collect();
        // patch 1.0, delete 1.5, delete 1.55, patch 1.7, update 2.5, create 2.7.
        assert_eq!(writes.len(), 6);
        assert_eq!(busiest_second(writes.iter().copied()), 4);
        // A window is half-open: 1.7 and 2.7 are a second apart, not within one.
        assert_eq!(busiest_second(writes[3..].iter().copied()), 2);
        assert_eq!(busiest_second(&log), 5);
        assert_eq!(busiest_second(&[]), 0);
    }

    #[test]
    fn steps_from_request_to_commit() {
        let log = log();
        let asked = log.iter().find(|a| a.user == "a").unwrap().received;
        let ours: Vec<&Audited> = log.iter().filter(|a| a.user == "c").collect();
        let (s, within) = steps(&ours, asked).unwrap();
        let close = |x: Option<f64>, y: f64| (x.unwrap() - y).abs() < 1e-9;
        assert!(close(s.read_plan, 0.2));
        assert!(close(s.list, 0.3));
        // From the first delete sent to the last one answered, overlapping ones included.
        assert!(close(s.delete, 0.5));
        assert!(close(s.confirm, 0.5));
        assert!(close(s.commit, 0.1));
        assert!((s.total - 1.6).abs() < 1e-9);
        // The watch (before) and the event (after the commit) are not the retry's.
        assert_eq!(by_verb(within.iter().copied()).values().sum::<usize>(), 5);
    }

    #[test]
    fn a_lone_delete_collection_is_all_delete() {
        let text = line(
            "a",
            "deletecollection",
            "pods",
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:03.5Z",
        );
        let log = parse(&text).unwrap();
        let (s, within) = steps(&[&log[0]], log[0].received).unwrap();
        assert_eq!(s.delete, Some(2.5));
        assert_eq!(s.total, 2.5);
        assert_eq!((s.list, s.commit), (None, None));
        assert_eq!(within.len(), 1);
        assert!(steps(&[], log[0].received).is_none());
    }
}
