//! Prometheus on loopback, for tests of the chart's dashboard and alerts against a real
//! controller: it scrapes its targets every `interval`, evaluates the rule files, and answers
//! PromQL over its HTTP API.
//!
//! The binary comes from tools/prometheus/build.sh (Prometheus' Go module, cached like the
//! control plane). It runs as a child process with its data in a temporary directory and its
//! HTTP API on a free loopback port, and dies with its parent.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

use crate::testenv::bench::child::kill_with_parent;
use crate::testenv::{IoError, io_error};

const BUILD_SCRIPT: &str = "tools/prometheus/build.sh";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why Prometheus could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Build(#[from] crate::testenv::BuildError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("Prometheus exited ({status}) before it was ready:\n{log}")]
    Exited { status: ExitStatus, log: String },
    #[error("Prometheus was not ready within {}s:\n{log}", START_TIMEOUT.as_secs())]
    NotReady { log: String },
    #[error("GET {path} on Prometheus: {reason}")]
    Http { path: String, reason: String },
}

/// What to scrape and evaluate.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `job` label of every target.
    pub job: String,
    pub targets: Vec<SocketAddr>,
    pub rule_files: Vec<PathBuf>,
    /// Scrape and evaluation interval.
    pub interval: Duration,
}

/// One series of a query's answer: its labels and its samples (Unix seconds, value).
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub samples: Vec<(f64, f64)>,
}

/// A running Prometheus; dropping it kills it.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// Builds (once; cached under ~/.cache/rewind) Prometheus and promtool and returns the
/// directory holding both.
pub fn binaries() -> Result<PathBuf, Error> {
    Ok(crate::testenv::build_tool(BUILD_SCRIPT, &[])?)
}

impl Prometheus {
    /// Starts Prometheus on `config` and waits until it is ready.
    pub async fn start(config: &Config) -> Result<Self, Error> {
        let binary = tokio::task::spawn_blocking(binaries)
            .await
            .expect("building does not panic")?
            .join("prometheus");
        let dir = tempfile::tempdir().map_err(io_error("creating", std::env::temp_dir()))?;
        let seconds = format!("{}s", config.interval.as_secs().max(1));
        let file = serde_json::json!({
            "global": {"scrape_interval": seconds, "evaluation_interval": seconds},
            "rule_files": config.rule_files,
            "scrape_configs": [{
                "job_name": config.job,
                "static_configs": [{"targets": config.targets.iter().map(ToString::to_string).collect::<Vec<_>>()}],
            }],
        });
        // JSON is YAML, which is what Prometheus reads.
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, file.to_string())
            .map_err(io_error("writing", &config_path))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], crate::testenv::free_port()?));
        let log = dir.path().join("prometheus.log");
        let out = std::fs::File::create(&log).map_err(io_error("creating", &log))?;
        let err = out.try_clone().map_err(io_error("opening", &log))?;
        let mut command = std::process::Command::new(&binary);
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        kill_with_parent(&mut command);
        let child = Command::from(command)
            .kill_on_drop(true)
            .spawn()
            .map_err(io_error("starting", &binary))?;
        let mut prometheus = Prometheus {
            child,
            addr,
            log,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = prometheus
                .child
                .try_wait()
                .map_err(io_error("waiting for", &binary))?
            {
                return Err(Error::Exited {
                    status,
                    log: prometheus.log(),
                });
            }
            if prometheus.get("/-/ready").await.is_ok() {
                return Ok(prometheus);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::NotReady {
                    log: prometheus.log(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What Prometheus logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }

    /// `expr` at `at`.
    pub async fn query(&self, expr: &str, at: SystemTime) -> Result<Vec<Series>, Error> {
        let path = format!("/api/v1/query?query={}&time={}", encode(expr), unix(at));
        series(&self.api(&path).await?)
    }

    /// `expr` from `start` to `end`, every `step`.
    pub async fn query_range(
        &self,
        expr: &str,
        start: SystemTime,
        end: SystemTime,
        step: Duration,
    ) -> Result<Vec<Series>, Error> {
        let path = format!(
            "/api/v1/query_range?query={}&start={}&end={}&step={}",
            encode(expr),
            unix(start),
            unix(end),
            step.as_secs_f64()
        );
        series(&self.api(&path).await?)
    }

    /// The names of every metric Prometheus holds.
    pub async fn metric_names(&self) -> Result<BTreeSet<String>, Error> {
        let names = self.api("/api/v1/label/__name__/values").await?;
        Ok(names
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect())
    }

    /// The metric names `expr` selects, as Prometheus' own parser reads it.
    pub async fn selected_metrics(&self, expr: &str) -> Result<BTreeSet<String>, Error> {
        let tree = self
            .api(&format!("/api/v1/parse_query?query={}", encode(expr)))
            .await?;
        let mut names = BTreeSet::new();
        selectors(&tree, &mut names);
        Ok(names)
    }

    /// The rule groups as Prometheus evaluates them (`/api/v1/rules`: health, last error,
    /// alerts).
    pub async fn rules(&self) -> Result<Value, Error> {
        self.api("/api/v1/rules").await
    }

    /// GET `path` of the HTTP API; its `data` when its status is success.
    async fn api(&self, path: &str) -> Result<Value, Error> {
        let body = self.get(path).await?;
        let answer: Value = serde_json::from_str(&body).map_err(|e| Error::Http {
            path: path.to_owned(),
            reason: format!("not JSON ({e}): {body}"),
        })?;
        if answer["status"] != "success" {
            return Err(Error::Http {
                path: path.to_owned(),
                reason: format!("{}: {}", answer["errorType"], answer["error"]),
            });
        }
        Ok(answer["data"].clone())
    }

    /// GET `path`; the body of a 2xx answer (and of a 4xx, which the API explains in JSON).
    async fn get(&self, path: &str) -> Result<String, Error> {
        let failed = |reason: String| Error::Http {
            path: path.to_owned(),
            reason,
        };
        let mut stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| failed(e.to_string()))?;
        // HTTP/1.0: the answer is the rest of the stream, never chunked.
        let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .ok_or_else(|| failed(format!("no header in {answer:?}")))?;
        let status = head.split_whitespace().nth(1).unwrap_or_default();
        match status.chars().next() {
            Some('2' | '4') => Ok(body.to_owned()),
            _ => Err(failed(format!("status {status}: {body}"))),
        }
    }
}

/// The series of a query's `data` (a vector, a matrix or a scalar).
fn series(data: &Value) -> Result<Vec<Series>, Error> {
    let sample =
        |v: &Value| -> Option<(f64, f64)> { Some((v[0].as_f64()?, v[1].as_str()?.parse().ok()?)) };
    let labels = |v: &Value| -> BTreeMap<String, String> {
        v["metric"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect()
    };
    let result = &data["result"];
    let found = match data["resultType"].as_str() {
        Some("matrix") => result
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| Series {
                labels: labels(s),
                samples: s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(sample)
                    .collect(),
            })
            .collect(),
        Some("vector") => result
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| Series {
                labels: labels(s),
                samples: sample(&s["value"]).into_iter().collect(),
            })
            .collect(),
        Some("scalar") => vec![Series {
            labels: BTreeMap::new(),
            samples: sample(result).into_iter().collect(),
        }],
        other => {
            return Err(Error::Http {
                path: "a query".into(),
                reason: format!("an answer of type {other:?}: {data}"),
            });
        }
    };
    Ok(found)
}

/// Collects the names of the vector selectors in a parsed query (`/api/v1/parse_query`).
fn selectors(node: &Value, names: &mut BTreeSet<String>) {
    match node {
        Value::Object(fields) => {
            if fields.get("type").and_then(Value::as_str) == Some("vectorSelector")
                && let Some(name) = fields.get("name").and_then(Value::as_str)
            {
                names.insert(name.to_owned());
            }
            fields.values().for_each(|v| selectors(v, names));
        }
        Value::Array(items) => items.iter().for_each(|v| selectors(v, names)),
        _ => {}
    }
}

/// A query parameter, percent-encoded (RFC 3986: all but the unreserved characters).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn unix(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode(r#"sum by (le) (rate(x{job=~"a|b"}[5m])) / 2"#),
            "sum%20by%20%28le%29%20%28rate%28x%7Bjob%3D~%22a%7Cb%22%7D%5B5m%5D%29%29%20%2F%202"
        );
    }

    #[test]
    fn selectors_are_found_anywhere_in_the_tree() {
        let tree = serde_json::json!({
            "type": "binaryExpr",
            "lhs": {"type": "call", "args": [{"type": "matrixSelector", "vectorSelector": {"type": "vectorSelector", "name": "a_total"}}]},
            "rhs": {"type": "vectorSelector", "name": "b"},
        });
        let mut names = BTreeSet::new();
        selectors(&tree, &mut names);
        assert_eq!(names, BTreeSet::from(["a_total".into(), "b".into()]));
    }
}
