//! Real PostgreSQL and MariaDB servers for tests and the demo, from Debian's
//! packages (`tools/db/install.sh` installs them): each on 127.0.0.1 with a
//! free port and a temporary data directory, with a database `argo` owned by
//! a user `argo`, stopped cleanly and removed on drop. The `argo` user may
//! connect only over TLS (a fresh self-signed certificate), so the TLS
//! settings of Argo's persistence block are exercised.
//!
//! Both servers refuse to run as root, so as root they run as the package's
//! own user (`postgres`, `mysql`), else as `nobody`.

pub mod argodb;
mod process;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Executor;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::argo::db::{ConnectionPool, Database, Persistence};
use crate::testenv::{IoError, free_port};

use process::{RunAs, Server};

/// The database and user every fixture creates.
pub const DATABASE: &str = "argo";
pub const USER: &str = "argo";
pub const PASSWORD: &str = "argo-pw";
/// The Secret (keys `username`, `password`) [`DbServer::argo_db_config`] names.
pub const CREDENTIALS_SECRET: &str = "argo-db";
/// The offload table the fixtures' persistence names.
pub const TABLE_NAME: &str = "argo_workflows";
/// How long a server gets to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const INSTALL_HINT: &str = "install it with `bash tools/db/install.sh` (what `make test` runs)";

/// Why a database server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{what} not found (looked in {looked}): {INSTALL_HINT}")]
    BinaryMissing { what: &'static str, looked: String },

    #[error(transparent)]
    Io(#[from] IoError),

    #[error("{what} failed ({status}); last lines of {log}:\n{log_tail}")]
    Setup {
        what: String,
        status: String,
        log: PathBuf,
        log_tail: String,
    },

    #[error(
        "{what} did not accept connections within {waited:?} ({last}); last lines of {log}:\n{log_tail}"
    )]
    NotReady {
        what: &'static str,
        waited: Duration,
        last: String,
        log: PathBuf,
        log_tail: String,
    },

    #[error("{what}: {source}")]
    Sql {
        what: String,
        #[source]
        source: sqlx::Error,
    },

    #[error("generating the server's TLS certificate: {0}")]
    Certificate(String),

    #[error("Argo's DB helper (tools/argodb): {0}")]
    ArgoDb(String),

    #[error("user {0} (to run the database server as, since root may not) does not exist")]
    NoUser(&'static str),
}

impl DbError {
    fn sql(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> DbError {
        let what = what.into();
        move |source| DbError::Sql { what, source }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    MariaDb,
}

/// A running database server; stopped and its directory removed on drop.
pub struct DbServer {
    kind: Kind,
    port: u16,
    server: Server,
}

impl DbServer {
    pub async fn start(kind: Kind) -> Result<DbServer, DbError> {
        match kind {
            Kind::Postgres => Self::postgres().await,
            Kind::MariaDb => Self::mariadb().await,
        }
    }

    /// PostgreSQL (the newest of Debian's /usr/lib/postgresql/*/bin, or PATH).
    pub async fn postgres() -> Result<DbServer, DbError> {
        let bin = postgres_bin()?;
        let run_as = RunAs::pick("postgres")?;
        let server = Server::prepare("postgres", run_as)?;
        let dir = server.dir().to_owned();
        let pwfile = server.write_private("pwfile", PASSWORD)?;
        let (cert, key) = server_certificate(&server)?;
        let data = dir.join("data");
        server
            .run(
                "initdb",
                bin.join("initdb"),
                &[
                    "-D".as_ref(),
                    data.as_os_str(),
                    "-U".as_ref(),
                    "postgres".as_ref(),
                    "--auth=scram-sha-256".as_ref(),
                    format!("--pwfile={}", pwfile.display()).as_ref(),
                    "-E".as_ref(),
                    "UTF8".as_ref(),
                    "--no-locale".as_ref(),
                    "--no-sync".as_ref(),
                ],
            )
            .await?;
        // The superuser may connect in the clear; everyone else over TLS.
        server.write_private(
            "data/pg_hba.conf",
            "local all all scram-sha-256\n\
             host all postgres 127.0.0.1/32 scram-sha-256\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n",
        )?;
        let port = free_port()?;
        let mut server = server;
        server.spawn(
            bin.join("postgres"),
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-h".as_ref(),
                "127.0.0.1".as_ref(),
                "-p".as_ref(),
                port.to_string().as_ref(),
                "-k".as_ref(),
                dir.as_os_str(),
                // A test database: durability is not wanted, speed is.
                "-c".as_ref(),
                "fsync=off".as_ref(),
                "-c".as_ref(),
                "synchronous_commit=off".as_ref(),
                "-c".as_ref(),
                "full_page_writes=off".as_ref(),
                "-c".as_ref(),
                "ssl=on".as_ref(),
                "-c".as_ref(),
                format!("ssl_cert_file={}", cert.display()).as_ref(),
                "-c".as_ref(),
                format!("ssl_key_file={}", key.display()).as_ref(),
            ],
            libc::SIGINT, // PostgreSQL's fast shutdown
        )?;
        let mut this = DbServer {
            kind: Kind::Postgres,
            port,
            server,
        };
        let admin = postgres_admin(port);
        let mut conn = this.wait_ready("PostgreSQL", || admin.connect()).await?;
        for statement in [
            format!("CREATE USER {USER} PASSWORD '{PASSWORD}'"),
            format!("CREATE DATABASE {DATABASE} OWNER {USER}"),
        ] {
            conn.execute(statement.as_str())
                .await
                .map_err(DbError::sql(format!("PostgreSQL: {statement}")))?;
        }
        let _ = conn.close().await;
        Ok(this)
    }

    /// MariaDB (Debian's mariadb-server: mariadb-install-db and mariadbd).
    pub async fn mariadb() -> Result<DbServer, DbError> {
        let install = find_binary(
            "mariadb-install-db",
            &["mariadb-install-db", "mysql_install_db"],
        )?;
        let mariadbd = find_binary("mariadbd", &["mariadbd", "mysqld"])?;
        let run_as = RunAs::pick("mysql")?;
        let server = Server::prepare("mariadb", run_as)?;
        let dir = server.dir().to_owned();
        let data = dir.join("data");
        let (cert, key) = server_certificate(&server)?;
        server
            .run(
                "mariadb-install-db",
                install,
                &[
                    "--no-defaults".as_ref(),
                    format!("--datadir={}", data.display()).as_ref(),
                    "--auth-root-authentication-method=normal".as_ref(),
                    "--skip-test-db".as_ref(),
                    "--skip-name-resolve".as_ref(),
                ],
            )
            .await?;
        let port = free_port()?;
        let socket = dir.join("mysqld.sock");
        let mut server = server;
        server.spawn(
            mariadbd,
            &[
                "--no-defaults".as_ref(),
                format!("--datadir={}", data.display()).as_ref(),
                format!("--socket={}", socket.display()).as_ref(),
                format!("--pid-file={}", dir.join("mysqld.pid").display()).as_ref(),
                format!("--port={port}").as_ref(),
                "--bind-address=127.0.0.1".as_ref(),
                "--skip-name-resolve".as_ref(),
                "--skip-log-bin".as_ref(),
                "--innodb-buffer-pool-size=64M".as_ref(),
                "--innodb-flush-log-at-trx-commit=0".as_ref(),
                format!("--ssl-cert={}", cert.display()).as_ref(),
                format!("--ssl-key={}", key.display()).as_ref(),
            ],
            libc::SIGTERM,
        )?;
        let mut this = DbServer {
            kind: Kind::MariaDb,
            port,
            server,
        };
        let admin = mariadb_admin(&dir);
        let mut conn = this.wait_ready("MariaDB", || admin.connect()).await?;
        for statement in [
            format!("CREATE DATABASE {DATABASE}"),
            format!("CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}' REQUIRE SSL"),
            format!("GRANT ALL ON {DATABASE}.* TO '{USER}'@'%'"),
        ] {
            conn.execute(statement.as_str())
                .await
                .map_err(DbError::sql(format!("MariaDB: {statement}")))?;
        }
        let _ = conn.close().await;
        Ok(this)
    }

    /// Stops the server (a clean, fast shutdown), keeping its data and port for
    /// [`DbServer::start_again`]: a database restart, as an operator's.
    pub fn halt(&mut self) {
        self.server.stop();
    }

    /// Starts the server [`DbServer::halt`] stopped, on the same port and data, and waits
    /// until it accepts connections.
    pub async fn start_again(&mut self) -> Result<(), DbError> {
        self.server.respawn()?;
        match self.kind {
            Kind::Postgres => {
                let admin = postgres_admin(self.port);
                let conn = self.wait_ready("PostgreSQL", || admin.connect()).await?;
                let _ = conn.close().await;
            }
            Kind::MariaDb => {
                let admin = mariadb_admin(self.server.dir());
                let conn = self.wait_ready("MariaDB", || admin.connect()).await?;
                let _ = conn.close().await;
            }
        }
        Ok(())
    }

    async fn wait_ready<C, F>(
        &mut self,
        what: &'static str,
        connect: impl Fn() -> F,
    ) -> Result<C, DbError>
    where
        F: Future<Output = Result<C, sqlx::Error>>,
    {
        let started = Instant::now();
        loop {
            self.server.check_running(what)?;
            let last = match connect().await {
                Ok(conn) => return Ok(conn),
                Err(e) => e.to_string(),
            };
            if started.elapsed() > START_TIMEOUT {
                return Err(DbError::NotReady {
                    what,
                    waited: started.elapsed(),
                    last,
                    log: self.server.log().to_owned(),
                    log_tail: self.server.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process ID.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// The temporary directory holding its data, socket and log.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// The server's own log (stdout and stderr).
    pub fn log(&self) -> &Path {
        self.server.log()
    }

    /// The persistence settings for the `argo` database, as rewind resolves
    /// them from Argo's config.
    pub fn persistence(&self) -> Persistence {
        Persistence {
            // TLS without verification: the certificate is self-signed.
            database: match self.kind {
                Kind::Postgres => Database::Postgres {
                    ssl_mode: "require".into(),
                },
                Kind::MariaDb => Database::MySql {
                    options: [("tls".to_owned(), "skip-verify".to_owned())].into(),
                },
            },
            host: "127.0.0.1".into(),
            port: Some(self.port),
            database_name: DATABASE.into(),
            table_name: TABLE_NAME.into(),
            username: USER.into(),
            password: PASSWORD.into(),
            pool: ConnectionPool::default(),
            connect_timeout: Duration::from_secs(5),
            cluster_name: crate::argo::db::DEFAULT_CLUSTER_NAME.into(),
            instance_id: String::new(),
            node_status_offload: true,
            archive: true,
        }
    }

    /// The database part of Argo's `persistence` block for this server (what
    /// Argo's `config.DBConfig` reads), without credentials.
    pub fn argo_db_config(&self) -> Value {
        let common = json!({
            "host": "127.0.0.1", "port": self.port, "database": DATABASE, "tableName": TABLE_NAME,
            "userNameSecret": {"name": CREDENTIALS_SECRET, "key": "username"},
            "passwordSecret": {"name": CREDENTIALS_SECRET, "key": "password"},
        });
        let mut common = common;
        let tls = match self.kind {
            Kind::Postgres => json!({"ssl": true, "sslMode": "require"}),
            Kind::MariaDb => json!({"options": {"tls": "skip-verify"}}),
        };
        for (k, v) in tls.as_object().expect("an object") {
            common[k] = v.clone();
        }
        match self.kind {
            Kind::Postgres => json!({"postgresql": common}),
            Kind::MariaDb => json!({"mysql": common}),
        }
    }

    /// Runs one SQL statement on the `argo` database as the `argo` user (over
    /// TLS, as Argo connects); returns the rows it affected. For tests that
    /// must put into Argo's tables what Argo's code would not write.
    pub async fn execute(&self, statement: &str) -> Result<u64, DbError> {
        let what = || format!("{:?}: {statement}", self.kind);
        let affected = match self.kind {
            Kind::Postgres => {
                let mut conn = PgConnectOptions::new_without_pgpass()
                    .host("127.0.0.1")
                    .port(self.port)
                    .username(USER)
                    .password(PASSWORD)
                    .database(DATABASE)
                    .connect()
                    .await
                    .map_err(DbError::sql(what()))?;
                let done = conn
                    .execute(statement)
                    .await
                    .map_err(DbError::sql(what()))?;
                let _ = conn.close().await;
                done.rows_affected()
            }
            Kind::MariaDb => {
                let mut conn = MySqlConnectOptions::new()
                    .host("127.0.0.1")
                    .port(self.port)
                    .username(USER)
                    .password(PASSWORD)
                    .database(DATABASE)
                    .connect()
                    .await
                    .map_err(DbError::sql(what()))?;
                let done = conn
                    .execute(statement)
                    .await
                    .map_err(DbError::sql(what()))?;
                let _ = conn.close().await;
                done.rows_affected()
            }
        };
        Ok(affected)
    }

    /// Creates Argo's tables with Argo's own migration (v4.1.4, which v3.7.6
    /// reads and writes too).
    pub fn create_argo_schema(&self) -> Result<(), DbError> {
        argodb::ArgoDbTool::locate(argodb::ArgoLine::V4)?
            .one(self.argodb_request("migrate", json!({})))
            .map(drop)
    }

    /// Stops the server (waiting for it) and removes its directory.
    pub fn stop(self) {
        drop(self);
    }
}

/// A fresh self-signed certificate for 127.0.0.1 and its key, as files the
/// server's user may read: (certificate, key).
fn server_certificate(server: &Server) -> Result<(PathBuf, PathBuf), DbError> {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .map_err(|e| DbError::Certificate(e.to_string()))?;
    Ok((
        server.write_private("server.crt", &certified.cert.pem())?,
        server.write_private("server.key", &certified.signing_key.serialize_pem())?,
    ))
}

/// PostgreSQL's superuser, who may connect in the clear.
fn postgres_admin(port: u16) -> PgConnectOptions {
    PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .password(PASSWORD)
        .database("postgres")
}

/// MariaDB's root, who has no password and may log in on the socket only.
fn mariadb_admin(dir: &Path) -> MySqlConnectOptions {
    MySqlConnectOptions::new()
        .socket(dir.join("mysqld.sock"))
        .username("root")
}

/// A port free on 127.0.0.1 now (the server binds it a moment later).
/// Debian installs PostgreSQL's server binaries under
/// /usr/lib/postgresql/VERSION/bin, not on PATH.
fn postgres_bin() -> Result<PathBuf, DbError> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let initdb = find_binary("PostgreSQL's initdb", &["initdb"])?;
    Ok(initdb.parent().unwrap_or(Path::new("/")).to_owned())
}

/// The first of `names` on PATH or in /usr/sbin and /usr/bin.
fn find_binary(what: &'static str, names: &[&str]) -> Result<PathBuf, DbError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .collect();
    for name in names {
        for dir in &dirs {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(DbError::BinaryMissing {
        what,
        looked: format!("{} on PATH, /usr/sbin, /usr/bin", names.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_a_clear_error() {
        let err = find_binary("mariadbd", &["no-such-mariadbd"]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("no-such-mariadbd") && message.contains("tools/db/install.sh"),
            "{message}"
        );
    }
}
