//! Argo's database (its `persistence`): the workflow archive and the
//! offloaded node status of large workflows, in Argo's own tables.
//!
//! [`ArgoDatabase`] is what the retry flows need of it; [`Sql`] implements it
//! on PostgreSQL or MySQL/MariaDB as Argo's `persistence` block
//! ([`Persistence`], read by [`parse_config`]) configures it.

mod config;
pub mod go_json;
mod sql;

use futures::future::BoxFuture;

pub use config::{
    ConnectionPool, DEFAULT_CLUSTER_NAME, DEFAULT_TABLE_NAME, Database, PersistConfig, Persistence,
    SecretKeySelector, config_yaml, parse_config,
};
pub use sql::{ARCHIVE_TABLE, Sql};

use crate::argo::plan::compress::Nodes;
use crate::argo::workflow::Workflow;

/// Argo's database, as the retry flows use it.
pub trait ArgoDatabase: Send + Sync {
    /// Argo archives workflows here (`persistence.archive`).
    fn archives(&self) -> bool;

    /// Argo offloads node status here (`persistence.nodeStatusOffLoad`).
    fn offloads(&self) -> bool;

    /// The archived workflow with this UID, fully hydrated as Argo stored it;
    /// `None` if the archive has no such row.
    fn archived_workflow<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<Workflow>, DbError>>;

    /// The nodes offloaded for workflow `uid` at `version`.
    fn offloaded_nodes<'a>(
        &'a self,
        uid: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<Nodes, DbError>>;

    /// Offloads `nodes` for workflow `uid` as Argo does; returns the version
    /// Argo would (`fnv:` and the FNV-32 hash of Go's JSON of the nodes).
    fn offload_nodes<'a>(
        &'a self,
        uid: &'a str,
        namespace: &'a str,
        nodes: &'a Nodes,
    ) -> BoxFuture<'a, Result<String, DbError>>;
}

/// Why Argo's database could not be read or written. The message reaches
/// users (a request's status, Events) and so never names the database's
/// host, name or user: those are in `target`, for the controller's log.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{what} in Argo's database failed; {}", database_hint(*.transient))]
    Database {
        what: String,
        /// The database's address, for logs only.
        target: String,
        #[source]
        source: sqlx::Error,
        transient: bool,
    },

    #[error(
        "archived workflow {uid} in Argo's database (table {ARCHIVE_TABLE}) is not a valid workflow: \
         {source}; the row is corrupt: repair or delete it, then retry"
    )]
    CorruptArchivedWorkflow {
        uid: String,
        target: String,
        #[source]
        source: serde_json::Error,
    },

    #[error(
        "offloaded nodes of workflow {uid} (version {version}) in Argo's database (table {table}) are \
         not valid JSON: {source}; the row is corrupt: repair or delete it"
    )]
    CorruptOffloadedNodes {
        uid: String,
        version: String,
        table: String,
        target: String,
        #[source]
        source: serde_json::Error,
    },

    #[error(
        "no offloaded nodes for workflow {uid} version {version} in Argo's database (table {table}): \
         check that clusterName and tableName match Argo's persistence config; Argo deletes old \
         versions once they are unused"
    )]
    OffloadedNodesMissing {
        uid: String,
        version: String,
        table: String,
        target: String,
    },

    #[error(
        "{what} in Argo's database: {size} bytes of JSON, over the {limit} rewind reads \
         (--max-nodes-size); a retry needs about three times its JSON in memory: raise the \
         controller's memory limit to 3 × the size plus 64 MiB (--max-nodes-size follows it \
         unless set; if set, raise it too), then retry"
    )]
    RowTooLarge {
        /// What the row holds: "archived workflow UID", "offloaded nodes of workflow UID (version V)".
        what: String,
        size: usize,
        limit: usize,
        target: String,
    },

    #[error("Argo's persistence config in ConfigMap {configmap}: {problem}")]
    Config { configmap: String, problem: String },

    /// At start only: the controller's log is the only reader.
    #[error("database settings for {target}: {problem}; fix Argo's persistence config")]
    Settings { target: String, problem: String },
}

fn database_hint(transient: bool) -> &'static str {
    if transient {
        "the database may be down or unreachable, and the request is retried with backoff; the controller's log has the details"
    } else {
        "check Argo's persistence config (host, database, credentials, TLS) and its tables; the controller's log has the details"
    }
}

impl DbError {
    /// Whether trying again later may succeed (an unreachable database), as
    /// opposed to a fault that stays until someone fixes it (a corrupt row, a
    /// wrong config).
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Database { transient, .. } => *transient,
            DbError::CorruptArchivedWorkflow { .. }
            | DbError::CorruptOffloadedNodes { .. }
            | DbError::OffloadedNodesMissing { .. }
            | DbError::RowTooLarge { .. }
            | DbError::Config { .. }
            | DbError::Settings { .. } => false,
        }
    }

    /// The database the error happened on (host, port, database), for logs.
    pub fn target(&self) -> Option<&str> {
        match self {
            DbError::Database { target, .. }
            | DbError::CorruptArchivedWorkflow { target, .. }
            | DbError::CorruptOffloadedNodes { target, .. }
            | DbError::OffloadedNodesMissing { target, .. }
            | DbError::RowTooLarge { target, .. }
            | DbError::Settings { target, .. } => Some(target),
            DbError::Config { .. } => None,
        }
    }
}
