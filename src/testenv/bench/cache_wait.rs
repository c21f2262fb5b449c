//! How long the API server's consistent reads waited for its watch cache, by its own
//! histogram `apiserver_watch_cache_read_wait_seconds`. A LIST without a resourceVersion is
//! served from the cache once the cache has seen etcd's current revision, and a burst of
//! writes to other objects (a retry's deletes) moves that revision on.

use serde::{Deserialize, Serialize};

use super::Error;

const METRIC: &str = "apiserver_watch_cache_read_wait_seconds";

/// The API server's metrics as text, read as `admin`. Parsed later by [`between`], so that
/// reading them costs the measured stretch no CPU.
pub async fn scrape(admin: &kube::Client) -> Result<String, Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a valid request");
    admin
        .request_text(request)
        .await
        .map_err(|source| Error::Kube {
            action: "reading the API server's metrics".into(),
            source,
        })
}

/// The waits of one resource's consistent reads between two scrapes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheWait {
    pub reads: u64,
    pub mean_ms: f64,
    /// The upper bound of the histogram bucket holding the 99th percentile; `None` above the
    /// last bound (3 s).
    pub p99_at_most_ms: Option<f64>,
}

/// The waits of `resource` (as the API server names it, e.g. "workflows") from `before` to
/// `after`; `None` if it had no consistent read then or a scrape lacks the histogram.
pub fn between(before: &str, after: &str, resource: &str) -> Option<CacheWait> {
    let (b, a) = (histogram(before, resource)?, histogram(after, resource)?);
    let buckets: Vec<(f64, f64)> = a
        .buckets
        .iter()
        .map(|(le, n)| {
            let earlier = b.buckets.iter().find(|(l, _)| l == le).map_or(0.0, |x| x.1);
            (*le, n - earlier)
        })
        .collect();
    let reads = buckets.last()?.1;
    if reads < 1.0 {
        return None;
    }
    let p99 = buckets
        .iter()
        .find(|(_, n)| *n >= 0.99 * reads)
        .map(|(le, _)| *le)
        .filter(|le| le.is_finite());
    Some(CacheWait {
        reads: reads as u64,
        mean_ms: (a.sum - b.sum) / reads * 1e3,
        p99_at_most_ms: p99.map(|s| s * 1e3),
    })
}

struct Histogram {
    /// Cumulative counts by upper bound, ascending, ending at +Inf.
    buckets: Vec<(f64, f64)>,
    sum: f64,
}

fn histogram(text: &str, resource: &str) -> Option<Histogram> {
    use prometheus_parse::{Scrape, Value};
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).ok()?;
    let ours = |metric: &str, s: &prometheus_parse::Sample| {
        s.metric == metric && s.labels.get("resource") == Some(resource)
    };
    let mut buckets: Vec<(f64, f64)> =
        scrape
            .samples
            .iter()
            .find(|s| ours(METRIC, s))
            .and_then(|s| match &s.value {
                Value::Histogram(counts) => {
                    Some(counts.iter().map(|c| (c.less_than, c.count)).collect())
                }
                _ => None,
            })?;
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let sum = scrape
        .samples
        .iter()
        .find(|s| ours(&format!("{METRIC}_sum"), s))
        .and_then(|s| match s.value {
            Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v) => Some(v),
            _ => None,
        })?;
    Some(Histogram { buckets, sum })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API server's exposition, trimmed to the histogram (two resources) and a neighbour.
    fn exposition(workflows: [u64; 4], sum: f64) -> String {
        let [le5ms, le25ms, le3s, all] = workflows;
        format!(
            "# HELP apiserver_watch_cache_read_wait_seconds [ALPHA] Histogram of time spent waiting for a watch cache to become fresh.
# TYPE apiserver_watch_cache_read_wait_seconds histogram
apiserver_watch_cache_read_wait_seconds_bucket{{group=\"\",resource=\"pods\",le=\"0.005\"}} 7
apiserver_watch_cache_read_wait_seconds_bucket{{group=\"\",resource=\"pods\",le=\"+Inf\"}} 7
apiserver_watch_cache_read_wait_seconds_sum{{group=\"\",resource=\"pods\"}} 0.01
apiserver_watch_cache_read_wait_seconds_count{{group=\"\",resource=\"pods\"}} 7
apiserver_watch_cache_read_wait_seconds_bucket{{group=\"argoproj.io\",resource=\"workflows\",le=\"0.005\"}} {le5ms}
apiserver_watch_cache_read_wait_seconds_bucket{{group=\"argoproj.io\",resource=\"workflows\",le=\"0.025\"}} {le25ms}
apiserver_watch_cache_read_wait_seconds_bucket{{group=\"argoproj.io\",resource=\"workflows\",le=\"3\"}} {le3s}
apiserver_watch_cache_read_wait_seconds_bucket{{group=\"argoproj.io\",resource=\"workflows\",le=\"+Inf\"}} {all}
apiserver_watch_cache_read_wait_seconds_sum{{group=\"argoproj.io\",resource=\"workflows\"}} {sum}
apiserver_watch_cache_read_wait_seconds_count{{group=\"argoproj.io\",resource=\"workflows\"}} {all}
# TYPE apiserver_request_total counter
apiserver_request_total{{code=\"200\",resource=\"workflows\",verb=\"LIST\"}} 99
"
        )
    }

    #[test]
    fn waits_between_two_scrapes() {
        let before = exposition([10, 10, 10, 10], 0.02);
        // 200 reads since: 150 within 5 ms, 48 more within 25 ms, 2 within 3 s.
        let after = exposition([160, 208, 210, 210], 0.02 + 1.0);
        let wait = between(&before, &after, "workflows").unwrap();
        assert_eq!(wait.reads, 200);
        assert!((wait.mean_ms - 5.0).abs() < 1e-9, "{wait:?}");
        assert_eq!(wait.p99_at_most_ms, Some(25.0));
        // One read past the last bound decides the 99th percentile of 50.
        let after = exposition([50, 50, 59, 60], 10.0);
        assert_eq!(
            between(&before, &after, "workflows")
                .unwrap()
                .p99_at_most_ms,
            None
        );
        assert_eq!(between(&before, &before, "workflows"), None);
        assert_eq!(between(&before, &after, "configmaps"), None);
        assert_eq!(between("", &after, "workflows"), None);
    }
}
