//! Argo's own database code (`rewind::testenv::db::argodb`), built once per
//! test process.

use std::sync::OnceLock;

use rewind::testenv::db::DbServer;
pub use rewind::testenv::db::argodb::{Answer, ArgoDbTool, ArgoLine as Line};
use serde_json::Value;

/// The helper for `line`. Panics when it cannot be built: these tests never skip.
fn helper(line: Line) -> &'static ArgoDbTool {
    static HELPERS: OnceLock<[ArgoDbTool; 2]> = OnceLock::new();
    let helpers = HELPERS.get_or_init(|| {
        [Line::V4, Line::V3].map(|line| ArgoDbTool::locate(line).unwrap_or_else(|e| panic!("{e}")))
    });
    &helpers[match line {
        Line::V4 => 0,
        Line::V3 => 1,
    }]
}

/// One request; Argo's error is an error. A MySQL deadlock is tried again, up to five times,
/// as Argo's controller requeues a workflow whose archiving failed: the tests write rows side
/// by side, and InnoDB may roll one of two archiving transactions back (error 1213, "try
/// restarting transaction").
pub fn one(line: Line, request: Value) -> anyhow::Result<Answer> {
    let mut tries = 0;
    loop {
        match helper(line).one(request.clone()) {
            Err(e) if tries < 4 && e.to_string().contains("Error 1213") => tries += 1,
            answer => return Ok(answer?),
        }
    }
}

/// A request on `db`'s `argo` database.
pub fn request(db: &DbServer, op: &str, fields: Value) -> Value {
    db.argodb_request(op, fields)
}
