//! Argo's real database: servers with Argo's schema, and Argo's own database code
//! (tools/argodb) to write and read its rows, as Argo's controller and server do.

use anyhow::Context as _;
use rewind::argo::workflow::Workflow;
use rewind::testenv::db::{DbServer, Kind};
use serde_json::json;

// Argo's own database code, shared with the archive tests.
#[allow(dead_code)]
#[path = "../../archive/argodb.rs"]
mod shared;
pub use shared::*;

/// A database server with Argo's schema, made by Argo's own migration.
pub async fn argo_db(kind: Kind) -> anyhow::Result<DbServer> {
    let db = DbServer::start(kind).await?;
    let migrate = request(&db, "migrate", json!({}));
    tokio::task::spawn_blocking(move || one(Line::V4, migrate)).await??;
    Ok(db)
}

/// One request to Argo's database code (v4.1.4).
pub async fn argo(request: serde_json::Value) -> anyhow::Result<Answer> {
    tokio::task::spawn_blocking(move || one(Line::V4, request)).await?
}

/// Archives `workflow` in `db` as Argo's controller does, and reads the row back as Argo's
/// server does for an archived retry.
pub async fn archive(db: &DbServer, workflow: &Workflow) -> anyhow::Result<Workflow> {
    argo(db.archive_request(workflow)).await?;
    let uid = workflow.metadata.uid.as_deref().unwrap_or_default();
    let read = argo(request(db, "getArchived", json!({"uid": uid}))).await?;
    serde_json::from_str(&read.json).context("Argo's read of its archived row")
}
