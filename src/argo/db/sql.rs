//! Argo's tables in SQL (v4.1.4 `persist/sqldb`), on PostgreSQL or
//! MySQL/MariaDB: read an archived workflow, read offloaded nodes, and
//! offload nodes the way Argo's offload repo does, so Argo reads them back.

use futures::future::BoxFuture;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgPool, PgSslMode};
use sqlx::{Executor, Row as _};

use super::{ArgoDatabase, Database, DbError, Persistence, go_json};
use crate::argo::plan::compress::Nodes;
use crate::argo::workflow::{Workflow, labels};

/// Argo's archive table (fixed name).
pub const ARCHIVE_TABLE: &str = "argo_archived_workflows";
/// What Argo writes for `\u0000` on PostgreSQL, whose jsonb cannot hold it.
const POSTGRES_NULL_REPLACEMENT: &str = "ARGO_POSTGRES_NULL_REPLACEMENT";
/// A small pool: rewind reads one row per archived retry.
const DEFAULT_MAX_CONNECTIONS: u32 = 4;
/// Rows above this many bytes close their connection once read or written
/// (see `release`).
const LARGE_ROW: usize = 1 << 20;

/// Whether a database error may pass: no connection, a connection lost,
/// a server shutting down or overloaded, a deadlock.
fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        // sqlx reports a rejected TLS certificate as invalid data: a setting
        // to fix, not a fault that passes.
        sqlx::Error::Io(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
        ),
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // PostgreSQL SQLSTATE: connection exceptions, insufficient
            // resources, operator intervention (shutdown), serialization
            // failure, deadlock.
            Some(code) if code.starts_with("08") || code.starts_with("53") => true,
            Some("57P01" | "57P02" | "57P03" | "40001" | "40P01") => true,
            // MySQL: too many connections, lock wait timeout, deadlock,
            // server gone away, connection lost.
            _ => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| matches!(e.number(), 1040 | 1205 | 1213 | 2006 | 2013)),
        },
        _ => false,
    }
}

fn is_duplicate_key(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Argo's database as its `persistence` block configures it: a (lazy)
/// connection pool and what Argo keeps there.
#[derive(Clone, Debug)]
pub struct Sql {
    archives: bool,
    offloads: bool,
    pool: Pool,
    cluster_name: String,
    instance_id: String,
    table_name: String,
    target: String,
    /// The largest row rewind reads (`--max-nodes-size`): a retry needs
    /// about three times its JSON in memory, so a larger one is refused by
    /// its size, which the database tells without sending the row.
    max_row_size: usize,
}

#[derive(Clone, Debug)]
enum Pool {
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// go-sql-driver/mysql options that configure the driver rather than the
/// server session; those rewind has no equivalent for are ignored.
const MYSQL_DRIVER_OPTIONS: &[&str] = &[
    "allowAllFiles",
    "allowCleartextPasswords",
    "allowFallbackToPlaintext",
    "allowNativePasswords",
    "allowOldPasswords",
    "charset",
    "checkConnLiveness",
    "clientFoundRows",
    "collation",
    "columnsWithAlias",
    "compress",
    "connectionAttributes",
    "interpolateParams",
    "loc",
    "maxAllowedPacket",
    "multiStatements",
    "parseTime",
    "readTimeout",
    "rejectReadOnly",
    "serverPubKey",
    "timeTruncate",
    "timeout",
    "tls",
    "writeTimeout",
];

impl Sql {
    /// A pool on the database `p` names. Lazy: no connection is made until the
    /// first query, so an unreachable database shows as a transient error there.
    pub async fn connect(p: &Persistence) -> Result<Sql, DbError> {
        let target = p.target();
        let config_error = |problem: String| DbError::Settings {
            target: target.clone(),
            problem,
        };
        if !is_identifier(&p.table_name) {
            return Err(config_error(format!(
                "tableName {:?} is not a plain SQL table name (letters, digits, _)",
                p.table_name
            )));
        }
        let max = match p.pool.max_open_conns {
            0 => DEFAULT_MAX_CONNECTIONS,
            n => n,
        };
        let pool = match &p.database {
            Database::Postgres { ssl_mode } => {
                let ssl_mode: PgSslMode = ssl_mode.parse().map_err(|_| {
                    config_error(format!(
                        "postgresql.sslMode {ssl_mode:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                    ))
                })?;
                let mut options = PgConnectOptions::new_without_pgpass()
                    .host(&p.host)
                    .username(&p.username)
                    .password(&p.password)
                    .database(&p.database_name)
                    .ssl_mode(ssl_mode);
                if let Some(port) = p.port {
                    options = options.port(port);
                }
                Pool::Postgres(pool_options::<sqlx::Postgres>(p, max).connect_lazy_with(options))
            }
            Database::MySql { options: mysql } => {
                let mut options = MySqlConnectOptions::new()
                    .host(&p.host)
                    .username(&p.username)
                    .password(&p.password)
                    .database(&p.database_name)
                    .ssl_mode(mysql_ssl_mode(mysql.get("tls").map(String::as_str)).ok_or_else(
                        || {
                            config_error(format!(
                                "mysql.options.tls {:?} is not one of true, false, skip-verify, preferred",
                                mysql["tls"]
                            ))
                        },
                    )?);
                if let Some(port) = p.port {
                    options = options.port(port);
                }
                if let Some(charset) = mysql.get("charset") {
                    // go-sql-driver takes a comma-separated preference list.
                    options = options.charset(charset.split(',').next().unwrap_or(charset));
                }
                if let Some(collation) = mysql.get("collation") {
                    options = options.collation(collation);
                }
                let mut session = Vec::new();
                for (key, value) in mysql {
                    if MYSQL_DRIVER_OPTIONS.contains(&key.as_str()) {
                        continue;
                    }
                    if !is_identifier(key) {
                        return Err(config_error(format!(
                            "mysql.options key {key:?} is not a server variable name"
                        )));
                    }
                    // As go-sql-driver does: the value is sent as written.
                    session.push(format!("SET {key}={value}"));
                }
                let pool = pool_options::<sqlx::MySql>(p, max).after_connect(move |conn, _| {
                    let session = session.clone();
                    Box::pin(async move {
                        for statement in &session {
                            conn.execute(statement.as_str()).await?;
                        }
                        Ok(())
                    })
                });
                Pool::MySql(pool.connect_lazy_with(options))
            }
        };
        tracing::debug!(%target, table = %p.table_name, cluster = %p.cluster_name, "archive pool ready");
        Ok(Sql {
            archives: p.archive,
            offloads: p.node_status_offload,
            pool,
            cluster_name: p.cluster_name.clone(),
            instance_id: p.instance_id.clone(),
            table_name: p.table_name.clone(),
            target,
            max_row_size: crate::argo::plan::compress::DEFAULT_MAX_NODES_SIZE,
        })
    }

    /// Refuses rows over `limit` bytes (`--max-nodes-size`; 64 MiB by default here).
    pub fn with_max_row_size(mut self, limit: usize) -> Self {
        self.max_row_size = limit;
        self
    }

    /// A row's read as [`DbError`] says it, for `what` it holds.
    fn row<T>(&self, what: impl FnOnce() -> String, row: Row<T>) -> Result<Option<T>, DbError> {
        match row {
            Row::Missing => Ok(None),
            Row::TooLarge(size) => Err(DbError::RowTooLarge {
                what: what(),
                size,
                limit: self.max_row_size,
                target: self.target.clone(),
            }),
            Row::Parsed(parsed) => Ok(Some(parsed)),
        }
    }

    fn db_error(&self, what: String) -> impl FnOnce(sqlx::Error) -> DbError + '_ {
        move |source| DbError::Database {
            what,
            target: self.target.clone(),
            transient: is_transient(&source),
            source,
        }
    }

    /// The archived workflow (fully hydrated, as Argo stored it), scoped to
    /// clustername and instanceid; None if no row.
    async fn read_archived(&self, uid: &str) -> Result<Option<Workflow>, DbError> {
        let what = || format!("reading archived workflow {uid}");
        let corrupt = |source| DbError::CorruptArchivedWorkflow {
            uid: uid.to_owned(),
            target: self.target.clone(),
            source,
        };
        let binds = [self.cluster_name.as_str(), self.instance_id.as_str(), uid];
        let max = self.max_row_size;
        let read = match &self.pool {
            // A copy of the text only where PostgreSQL's stand-in for NUL must be put back.
            Pool::Postgres(pool) => {
                parse_row(
                    pool,
                    &Sized::Postgres.select(
                        "workflow::text",
                        "argo_archived_workflows \
                         WHERE clustername = $1 AND instanceid = $2 AND uid = $3",
                        max,
                    ),
                    binds,
                    max,
                    |text| {
                        if text.contains(POSTGRES_NULL_REPLACEMENT) {
                            serde_json::from_str::<Workflow>(
                                &text.replace(POSTGRES_NULL_REPLACEMENT, "\\u0000"),
                            )
                        } else {
                            serde_json::from_str(text)
                        }
                    },
                )
                .await
            }
            Pool::MySql(pool) => {
                parse_row(
                    pool,
                    &Sized::MySql.select(
                        "CAST(workflow AS CHAR CHARACTER SET utf8mb4)",
                        "argo_archived_workflows \
                         WHERE clustername = ? AND instanceid = ? AND uid = ?",
                        max,
                    ),
                    binds,
                    max,
                    |text| serde_json::from_str::<Workflow>(text),
                )
                .await
            }
        };
        let read = read.map_err(self.db_error(what()))?;
        let Some(parsed) = self.row(|| format!("archived workflow {uid}"), read)? else {
            return Ok(None);
        };
        let mut wf = parsed.map_err(corrupt)?;
        // As Argo's GetWorkflow: a workflow read from the archive is Persisted.
        wf.metadata.labels.get_or_insert_default().insert(
            labels::WORKFLOW_ARCHIVING_STATUS.to_owned(),
            "Persisted".to_owned(),
        );
        Ok(Some(wf))
    }

    /// Offloaded nodes (status.offloadNodeStatusVersion) of a live or archived workflow.
    async fn read_offloaded(&self, uid: &str, version: &str) -> Result<Nodes, DbError> {
        let what = || format!("reading offloaded nodes of workflow {uid} version {version}");
        let missing = || DbError::OffloadedNodesMissing {
            uid: uid.to_owned(),
            version: version.to_owned(),
            table: self.table_name.clone(),
            target: self.target.clone(),
        };
        let corrupt = |source| DbError::CorruptOffloadedNodes {
            uid: uid.to_owned(),
            version: version.to_owned(),
            table: self.table_name.clone(),
            target: self.target.clone(),
            source,
        };
        let max = self.max_row_size;
        let sql = match &self.pool {
            Pool::Postgres(_) => Sized::Postgres.select(
                "nodes::text",
                &format!(
                    "{} WHERE clustername = $1 AND uid = $2 AND version = $3",
                    self.table_name
                ),
                max,
            ),
            Pool::MySql(_) => Sized::MySql.select(
                "CAST(nodes AS CHAR CHARACTER SET utf8mb4)",
                &format!(
                    "{} WHERE clustername = ? AND uid = ? AND version = ?",
                    self.table_name
                ),
                max,
            ),
        };
        let binds = [self.cluster_name.as_str(), uid, version];
        // Straight into node statuses: no value tree of them in between.
        let parse = |text: &str| serde_json::from_str::<Nodes>(text);
        let read = match &self.pool {
            Pool::Postgres(pool) => parse_row(pool, &sql, binds, max, parse).await,
            Pool::MySql(pool) => parse_row(pool, &sql, binds, max, parse).await,
        };
        let read = read.map_err(self.db_error(what()))?;
        self.row(
            || format!("the offloaded nodes of workflow {uid} (version {version})"),
            read,
        )?
        .ok_or_else(missing)?
        .map_err(corrupt)
    }

    /// Writes nodes as Argo's offload repo Save does (an insert; an existing
    /// row of the same version is the same nodes, so a duplicate is fine);
    /// returns the version string Argo would.
    async fn write_offloaded(
        &self,
        uid: &str,
        namespace: &str,
        nodes: &Nodes,
    ) -> Result<String, DbError> {
        let marshalled = go_json::marshal_nodes(nodes);
        let version = go_json::offload_version(&marshalled);
        // Go's encoder writes only valid UTF-8 (it substitutes U+FFFD), and
        // so does ours, from Rust strings.
        let text = String::from_utf8(marshalled).expect("Go-style JSON is UTF-8");
        let what = format!("offloading nodes of workflow {uid} version {version}");
        let binds = [self.cluster_name.as_str(), uid, &version, namespace];
        let result = match &self.pool {
            Pool::Postgres(pool) => {
                let sql = format!(
                    "INSERT INTO {} (clustername, uid, version, namespace, nodes) VALUES ($1, $2, $3, $4, CAST($5 AS json))",
                    self.table_name
                );
                insert_text(pool, &sql, binds, text).await
            }
            Pool::MySql(pool) => {
                let sql = format!(
                    "INSERT INTO {} (clustername, uid, version, namespace, nodes) VALUES (?, ?, ?, ?, ?)",
                    self.table_name
                );
                insert_text(pool, &sql, binds, text).await
            }
        };
        match result {
            Err(e) if is_duplicate_key(&e) => {
                tracing::debug!(%uid, %version, "offloaded nodes already written");
                Ok(version)
            }
            Err(e) => Err(self.db_error(what)(e)),
            Ok(()) => Ok(version),
        }
    }

    /// Closes the pool's connections.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Postgres(pool) => pool.close().await,
            Pool::MySql(pool) => pool.close().await,
        }
    }
}

/// A row as [`parse_row`] read it.
enum Row<T> {
    Missing,
    /// Over the size given, in bytes: neither sent nor parsed.
    TooLarge(usize),
    Parsed(T),
}

/// How each database measures a text in bytes, for [`Sized::select`].
enum Sized {
    Postgres,
    MySql,
}

impl Sized {
    /// `SELECT` of `value`'s size in bytes and of `value` itself only when at
    /// most `max` bytes, `from` the table and condition given: a row over
    /// `--max-nodes-size` is refused by its size alone, never sent (a
    /// gigabyte row would otherwise be read whole, and held, to be refused).
    /// `max` is the controller's own setting, never a user's text.
    fn select(&self, value: &str, from: &str, max: usize) -> String {
        let length = match self {
            Sized::Postgres => format!("octet_length({value})::bigint"),
            Sized::MySql => format!("LENGTH({value})"),
        };
        format!("SELECT {length}, CASE WHEN {length} <= {max} THEN {value} END FROM {from}")
    }
}

/// Runs `sql` (a [`Sized::select`]) with its text parameters and parses its
/// row's value, if there is one, from the row's own bytes: no copy of the
/// text (megabytes for a large workflow), on either database; a row over
/// `max` bytes is neither sent nor parsed.
async fn parse_row<DB, T>(
    pool: &sqlx::Pool<DB>,
    sql: &str,
    binds: [&str; 3],
    max: usize,
    parse: impl FnOnce(&str) -> T,
) -> Result<Row<T>, sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let mut query = sqlx::query::<DB>(sql);
    for value in binds {
        query = query.bind(value);
    }
    let mut connection = pool.acquire().await?;
    let Some(row) = query.fetch_optional(&mut *connection).await? else {
        return Ok(Row::Missing);
    };
    let size: Option<i64> = row.try_get(0)?;
    if let Some(size) = size.and_then(|s| usize::try_from(s).ok())
        && size > max
    {
        return Ok(Row::TooLarge(size));
    }
    let text: &str = row.try_get(1)?;
    // The buffer holds the row itself (8 MiB for 20,000 nodes): closed, the
    // connection lets it go once the row is parsed.
    release(connection, text.len()).await;
    Ok(Row::Parsed(parse(text)))
}

/// Gives `connection` back to its pool, unless it just read or wrote a row of
/// over [`LARGE_ROW`] bytes: a connection keeps its buffers as large as the
/// largest message it read or wrote, and a pooled one lives on, so that one
/// is closed instead.
async fn release<DB: sqlx::Database>(connection: sqlx::pool::PoolConnection<DB>, row_bytes: usize) {
    if row_bytes > LARGE_ROW
        && let Err(error) = connection.close().await
    {
        tracing::debug!(%error, "closing a connection after a large row failed");
    }
}

/// Runs the insert `sql` with its text parameters, `text` last. The text is
/// moved into the query (encoded there, not kept beside it), and the
/// connection is [`release`]d after.
async fn insert_text<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &str,
    binds: [&str; 4],
    text: String,
) -> Result<(), sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let row_bytes = text.len();
    let mut query = sqlx::query::<DB>(sql);
    for value in binds {
        query = query.bind(value);
    }
    let mut connection = pool.acquire().await?;
    let result = query.bind(text).execute(&mut *connection).await.map(drop);
    release(connection, row_bytes).await;
    result
}

impl ArgoDatabase for Sql {
    fn archives(&self) -> bool {
        self.archives
    }

    fn offloads(&self) -> bool {
        self.offloads
    }

    fn archived_workflow<'a>(
        &'a self,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<Workflow>, DbError>> {
        Box::pin(self.read_archived(uid))
    }

    fn offloaded_nodes<'a>(
        &'a self,
        uid: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<Nodes, DbError>> {
        Box::pin(self.read_offloaded(uid, version))
    }

    fn offload_nodes<'a>(
        &'a self,
        uid: &'a str,
        namespace: &'a str,
        nodes: &'a Nodes,
    ) -> BoxFuture<'a, Result<String, DbError>> {
        Box::pin(self.write_offloaded(uid, namespace, nodes))
    }
}

/// Argo's `connectionPool`: maxOpenConns and connMaxLifetime map onto
/// sqlx's pool; maxIdleConns has no counterpart (sqlx closes a connection
/// idle for 10 minutes, and rewind's pool is small anyway).
fn pool_options<DB: sqlx::Database>(p: &Persistence, max: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(p.connect_timeout)
        .max_lifetime(p.pool.conn_max_lifetime)
}

/// go-sql-driver/mysql's `tls` option: absent or "false" is no TLS, "true"
/// verifies the server's certificate and name, "skip-verify" encrypts without
/// verifying, "preferred" uses TLS when the server offers it.
fn mysql_ssl_mode(tls: Option<&str>) -> Option<MySqlSslMode> {
    match tls {
        None | Some("false") => Some(MySqlSslMode::Disabled),
        Some("true") => Some(MySqlSslMode::VerifyIdentity),
        Some("skip-verify") => Some(MySqlSslMode::Required),
        Some("preferred") => Some(MySqlSslMode::Preferred),
        Some(_) => None,
    }
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_tls_options_as_go_sql_driver_reads_them() {
        assert!(matches!(mysql_ssl_mode(None), Some(MySqlSslMode::Disabled)));
        assert!(matches!(
            mysql_ssl_mode(Some("true")),
            Some(MySqlSslMode::VerifyIdentity)
        ));
        assert!(matches!(
            mysql_ssl_mode(Some("skip-verify")),
            Some(MySqlSslMode::Required)
        ));
        assert!(mysql_ssl_mode(Some("custom")).is_none());
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(is_identifier("argo_workflows"));
        assert!(!is_identifier("x; drop table y"));
        assert!(!is_identifier(""));
    }
}
