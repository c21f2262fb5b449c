//! Argo's own database code (tools/argodb: `persist/sqldb` of v4.1.4 and
//! v3.7.6) run against a fixture's database: the schema (`Migrate`), archived
//! workflows (`ArchiveWorkflow`, `GetWorkflow`) and offloaded nodes (`Save`,
//! `Get`), so tests and the demo use Argo's real tables and bytes.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

use super::{DbError, DbServer, PASSWORD, TABLE_NAME, USER};
use crate::testenv::io_error;

const BUILD_SCRIPT: &str = "tools/argodb/build.sh";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgoLine {
    /// argo-workflows v4.1.4 (tools/argodb/v4).
    V4,
    /// argo-workflows v3.7.6 (tools/argodb/v3).
    V3,
}

/// What Argo's code answered to one request.
#[derive(Debug, Deserialize)]
pub struct Answer {
    /// The offload version (`save`).
    #[serde(default)]
    pub version: String,
    /// Go's json.Marshal of the nodes (`get`, `marshal`) or of the workflow
    /// (`getArchived`; empty when there is no row).
    #[serde(default)]
    pub json: String,
    error: Option<String>,
}

/// A built helper binary.
#[derive(Clone, Debug)]
pub struct ArgoDbTool {
    binary: PathBuf,
}

impl ArgoDbTool {
    /// Builds (once, cached under ~/.cache/rewind) and locates the helper.
    pub fn locate(line: ArgoLine) -> Result<ArgoDbTool, DbError> {
        let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR")).join(BUILD_SCRIPT);
        let script = if compiled_in.is_file() {
            compiled_in
        } else {
            PathBuf::from(BUILD_SCRIPT)
        };
        let line = match line {
            ArgoLine::V4 => "v4",
            ArgoLine::V3 => "v3",
        };
        // stderr is inherited so a cold Go build's progress is visible.
        let output = Command::new("bash")
            .arg(&script)
            .arg(line)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(io_error("running", &script))?;
        let binary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if !output.status.success() || binary.is_empty() {
            return Err(DbError::ArgoDb(format!(
                "`bash {} {line}` failed ({}); it needs Go on PATH and the Go module proxy or a warm module cache",
                script.display(),
                output.status
            )));
        }
        Ok(ArgoDbTool {
            binary: binary.into(),
        })
    }

    /// Runs `requests` through one helper process: one answer per request,
    /// each carrying Argo's error if its code failed.
    pub fn run(&self, requests: &[Value]) -> Result<Vec<Result<Answer, String>>, DbError> {
        let failed =
            |problem: String| DbError::ArgoDb(format!("{}: {problem}", self.binary.display()));
        let mut child = Command::new(&self.binary)
            // upper/db (under Argo's persist/sqldb) logs a query slower than its threshold
            // with every argument at WARNING: with a large workflow, megabytes of JSON.
            .env("UPPER_DB_LOG", "ERROR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io_error("starting", &self.binary))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // Written from a thread while answers are read, so no pipe fills up.
        let writer = std::thread::scope(|scope| {
            let writer = scope.spawn(move || -> std::io::Result<()> {
                for request in requests {
                    serde_json::to_writer(&mut stdin, request)?;
                    stdin.write_all(b"\n")?;
                }
                Ok(())
            });
            let answers = BufReader::new(stdout)
                .lines()
                .map(|line| {
                    let line = line.map_err(|e| failed(format!("reading answers: {e}")))?;
                    let answer: Answer = serde_json::from_str(&line)
                        .map_err(|e| failed(format!("answer {line:?}: {e}")))?;
                    Ok(match answer.error {
                        Some(error) => Err(error),
                        None => Ok(answer),
                    })
                })
                .collect::<Result<Vec<_>, DbError>>();
            (writer.join(), answers)
        });
        let status = child
            .wait()
            .map_err(io_error("waiting for", &self.binary))?;
        let answers = writer.1?;
        if !status.success() || answers.len() != requests.len() || !matches!(writer.0, Ok(Ok(()))) {
            return Err(failed(format!(
                "exited {status} after {} of {} answers",
                answers.len(),
                requests.len()
            )));
        }
        Ok(answers)
    }

    /// One request; Argo's error is an error.
    pub fn one(&self, request: Value) -> Result<Answer, DbError> {
        let op = request["op"].clone();
        self.run(std::slice::from_ref(&request))?
            .pop()
            .expect("one answer per request")
            .map_err(|e| DbError::ArgoDb(format!("Argo's code failed on {op}: {e}")))
    }
}

impl DbServer {
    /// The request that archives `workflow` with Argo's `ArchiveWorkflow`,
    /// as Argo's controller does (cluster name and instance ID unset).
    pub fn archive_request(&self, workflow: &crate::argo::workflow::Workflow) -> Value {
        self.argodb_request(
            "archive",
            json!({"workflow": workflow, "clusterName": "", "instanceID": ""}),
        )
    }

    /// A request for the Argo DB helper on this server's `argo` database, as
    /// the `argo` user, with `fields` (uid, workflow, nodes...) added.
    pub fn argodb_request(&self, op: &str, fields: Value) -> Value {
        let mut request = json!({
            "op": op, "db": self.argo_db_config(), "user": USER, "password": PASSWORD,
            "tableName": TABLE_NAME,
        });
        if let (Some(request), Value::Object(fields)) = (request.as_object_mut(), fields) {
            request.extend(fields);
        }
        request
    }
}
