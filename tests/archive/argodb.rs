//! Argo's own database code (tools/argodb: persist/sqldb of v4.1.4 and
//! v3.7.6) writing and reading the real tables, driven over JSON lines.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context as _, bail};
use rewind::testenv::db::{DbServer, PASSWORD, TABLE_NAME, USER};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug)]
pub enum Line {
    V4,
    V3,
}

/// The helper binaries (v4, v3), built by tools/argodb/build.sh once per
/// process. Panics when the build fails: these tests never skip.
fn binary(line: Line) -> PathBuf {
    static BINARIES: OnceLock<[PathBuf; 2]> = OnceLock::new();
    let paths = BINARIES.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/argodb/build.sh");
        let output = Command::new("bash")
            .arg(&script)
            .args(["v4", "v3"])
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "{} failed ({}); it needs Go on PATH and the Go module proxy or a warm module cache",
            script.display(),
            output.status
        );
        let paths: Vec<PathBuf> = String::from_utf8(output.stdout)
            .expect("build.sh prints UTF-8 paths")
            .lines()
            .map(PathBuf::from)
            .collect();
        paths.try_into().expect("build.sh prints two paths")
    });
    paths[match line {
        Line::V4 => 0,
        Line::V3 => 1,
    }]
    .clone()
}

#[derive(Debug, Deserialize)]
pub struct Answer {
    #[serde(default)]
    pub version: String,
    /// Go's json.Marshal output (nodes or workflow).
    #[serde(default)]
    pub json: String,
    pub error: Option<String>,
}

/// Runs `requests` through one helper process; one answer per request.
pub fn run(line: Line, requests: &[Value]) -> anyhow::Result<Vec<Answer>> {
    let binary = binary(line);
    let mut child = Command::new(&binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        for request in requests {
            serde_json::to_writer(&mut stdin, request)?;
            stdin.write_all(b"\n")?;
        }
    }
    // Argo's MySQL code path logs a line or two to stdout (upper/db); answers
    // are the JSON objects, the rest goes to stderr.
    let mut answers = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        if line.starts_with('{') {
            answers.push(serde_json::from_str(&line)?);
        } else {
            eprintln!("{}: {line}", binary.display());
        }
    }
    let status = child.wait()?;
    if !status.success() || answers.len() != requests.len() {
        bail!(
            "{} exited {status} after {} of {} answers",
            binary.display(),
            answers.len(),
            requests.len()
        );
    }
    Ok(answers)
}

/// One request, and its answer or Argo's error.
pub fn one(line: Line, request: Value) -> anyhow::Result<Answer> {
    let answer = run(line, std::slice::from_ref(&request))?
        .pop()
        .expect("one answer");
    if let Some(error) = &answer.error {
        bail!("Argo's code failed on {}: {error}", request["op"]);
    }
    Ok(answer)
}

/// A request on `db`'s `argo` database, as the `argo` user.
pub fn request(db: &DbServer, op: &str, fields: Value) -> Value {
    let mut request = json!({
        "op": op, "db": db.argo_db_config(), "user": USER, "password": PASSWORD,
        "tableName": TABLE_NAME,
    });
    let object = request.as_object_mut().expect("an object");
    for (k, v) in fields.as_object().expect("fields are an object") {
        object.insert(k.clone(), v.clone());
    }
    request
}
