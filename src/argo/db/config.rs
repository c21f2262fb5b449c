//! Argo's `persistence` block (v4.1.4 `config/config.go` PersistConfig), as
//! Argo's own `workflow-controller-configmap` carries it, so a user
//! configures the database once, for Argo. Pure: the controller reads the
//! ConfigMap and the Secrets it names.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::DbError;

/// Argo's default offload table (the Helm chart's and the docs' `tableName`).
pub const DEFAULT_TABLE_NAME: &str = "argo_workflows";
/// `persistence.clusterName` when unset (`PersistConfig.GetClusterName`).
pub const DEFAULT_CLUSTER_NAME: &str = "default";
/// `connectionTimeoutSeconds` when unset (`DBConfig.ConnectionTimeout`).
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The database rewind reads Argo's archive from and writes offloaded nodes
/// to, with the credentials resolved.
#[derive(Clone, PartialEq)]
pub struct Persistence {
    pub database: Database,
    pub host: String,
    /// None: the driver's default port.
    pub port: Option<u16>,
    pub database_name: String,
    /// The offload table.
    pub table_name: String,
    pub username: String,
    pub password: String,
    pub pool: ConnectionPool,
    pub connect_timeout: Duration,
    /// Rows are scoped to it (`clustername` column).
    pub cluster_name: String,
    /// Argo's top-level `instanceID`: archived rows are scoped to it too.
    pub instance_id: String,
    pub node_status_offload: bool,
    pub archive: bool,
}

impl fmt::Debug for Persistence {
    // The password never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Persistence")
            .field("database", &self.database)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database_name", &self.database_name)
            .field("table_name", &self.table_name)
            .field("username", &self.username)
            .field("pool", &self.pool)
            .field("connect_timeout", &self.connect_timeout)
            .field("cluster_name", &self.cluster_name)
            .field("instance_id", &self.instance_id)
            .field("node_status_offload", &self.node_status_offload)
            .field("archive", &self.archive)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Database {
    /// `ssl`/`sslMode` as Argo maps them to lib/pq's sslmode: no ssl is
    /// "disable"; ssl without a mode is "prefer".
    Postgres { ssl_mode: String },
    /// go-sql-driver/mysql DSN options (`tls`, `charset`, server variables...).
    MySql { options: BTreeMap<String, String> },
}

/// `persistence.connectionPool`; zero means the driver's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConnectionPool {
    pub max_idle_conns: u32,
    pub max_open_conns: u32,
    pub conn_max_lifetime: Option<Duration>,
}

impl Persistence {
    /// "host:port/database" for messages.
    pub fn target(&self) -> String {
        let kind = match self.database {
            Database::Postgres { .. } => "postgresql",
            Database::MySql { .. } => "mysql",
        };
        match self.port {
            Some(port) => format!("{kind} {}:{port}/{}", self.host, self.database_name),
            None => format!("{kind} {}/{}", self.host, self.database_name),
        }
    }
}

/// Argo's `PersistConfig`, as it reads it from the ConfigMap.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistConfig {
    pub postgresql: Option<PostgreSqlConfig>,
    pub mysql: Option<MySqlConfig>,
    pub connection_pool: Option<PoolConfig>,
    pub connection_timeout_seconds: Option<u32>,
    #[serde(rename = "nodeStatusOffLoad")]
    pub node_status_offload: Option<bool>,
    pub archive: Option<bool>,
    pub cluster_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseConfig {
    #[serde(default)]
    pub host: String,
    pub port: Option<u16>,
    #[serde(default)]
    pub database: String,
    pub table_name: Option<String>,
    #[serde(default)]
    pub user_name_secret: SecretKeySelector,
    #[serde(default)]
    pub password_secret: SecretKeySelector,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSqlConfig {
    #[serde(flatten)]
    pub common: DatabaseConfig,
    #[serde(default)]
    pub ssl: bool,
    pub ssl_mode: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MySqlConfig {
    #[serde(flatten)]
    pub common: DatabaseConfig,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolConfig {
    #[serde(default)]
    pub max_idle_conns: u32,
    #[serde(default)]
    pub max_open_conns: u32,
    /// Argo's TTL: "30s", "5m", "1h", "2d" or a Go duration.
    pub conn_max_lifetime: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SecretKeySelector {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub key: String,
}

/// The parts of Argo's controller config rewind reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArgoConfig {
    persistence: Option<PersistConfig>,
    #[serde(rename = "instanceID", default)]
    instance_id: String,
}

/// The YAML Argo parses from its ConfigMap (`config/controller.go`
/// parseConfigMap): the `config` key alone, or every key as a top-level field.
pub fn config_yaml(data: &BTreeMap<String, String>) -> String {
    if let Some(config) = data.get("config") {
        return config.clone();
    }
    let mut yaml = String::new();
    for (name, value) in data {
        if value.contains('\n') {
            yaml.push_str(name);
            yaml.push_str(":\n  ");
            yaml.push_str(&value.trim_matches('\n').replace('\n', "\n  "));
            yaml.push('\n');
        } else {
            yaml.push_str(&format!("{name}: {value}\n"));
        }
    }
    yaml
}

/// The `persistence` block and `instanceID` of Argo's config; None without a
/// `persistence` block.
pub fn parse_config(
    configmap: &str,
    data: &BTreeMap<String, String>,
) -> Result<Option<(PersistConfig, String)>, DbError> {
    let config: ArgoConfig =
        serde_yaml_ng::from_str(&config_yaml(data)).map_err(|e| DbError::Config {
            configmap: configmap.to_owned(),
            problem: format!("its workflow controller config is not valid YAML: {e}"),
        })?;
    Ok(config.persistence.map(|p| (p, config.instance_id)))
}

impl PersistConfig {
    /// Which database, and its common settings; an error names what is wrong.
    fn database(&self, configmap: &str) -> Result<(&DatabaseConfig, Database), DbError> {
        let problem = |problem: &str| DbError::Config {
            configmap: configmap.to_owned(),
            problem: problem.to_owned(),
        };
        match (&self.postgresql, &self.mysql) {
            (Some(pg), None) => {
                let ssl_mode = match (pg.ssl, pg.ssl_mode.as_deref()) {
                    (false, _) => "disable",
                    (true, Some(mode)) if !mode.is_empty() => mode,
                    (true, _) => "prefer",
                };
                Ok((
                    &pg.common,
                    Database::Postgres {
                        ssl_mode: ssl_mode.to_owned(),
                    },
                ))
            }
            (None, Some(my)) => Ok((
                &my.common,
                Database::MySql {
                    options: my.options.clone(),
                },
            )),
            (Some(_), Some(_)) => Err(problem(
                "persistence names both postgresql and mysql: keep one",
            )),
            (None, None) => Err(problem(
                "persistence names no database: add a postgresql or mysql block",
            )),
        }
    }

    /// The Secrets holding the user name and password: (name, key) each.
    pub fn credential_secrets(&self, configmap: &str) -> Result<[&SecretKeySelector; 2], DbError> {
        let (common, _) = self.database(configmap)?;
        Ok([&common.user_name_secret, &common.password_secret])
    }

    /// The resolved settings, given the credentials and Argo's `instanceID`.
    pub fn resolve(
        &self,
        configmap: &str,
        username: String,
        password: String,
        instance_id: String,
    ) -> Result<Persistence, DbError> {
        let (common, database) = self.database(configmap)?;
        let problem = |problem: String| DbError::Config {
            configmap: configmap.to_owned(),
            problem,
        };
        if common.host.is_empty() {
            return Err(problem("persistence has no database host".into()));
        }
        let pool = self.connection_pool.clone().unwrap_or_default();
        let conn_max_lifetime = match pool.conn_max_lifetime.as_deref() {
            None | Some("") => None,
            Some(ttl) => Some(parse_ttl(ttl).ok_or_else(|| {
                problem(format!(
                    "connectionPool.connMaxLifetime {ttl:?} is not a duration (like 30s, 5m, 1h, 2d)"
                ))
            })?)
            .filter(|d| !d.is_zero()),
        };
        Ok(Persistence {
            database,
            host: common.host.clone(),
            port: common.port.filter(|&p| p != 0),
            database_name: common.database.clone(),
            table_name: common
                .table_name
                .clone()
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| DEFAULT_TABLE_NAME.to_owned()),
            username,
            password,
            pool: ConnectionPool {
                max_idle_conns: pool.max_idle_conns,
                max_open_conns: pool.max_open_conns,
                conn_max_lifetime,
            },
            connect_timeout: match self.connection_timeout_seconds {
                None | Some(0) => DEFAULT_CONNECT_TIMEOUT,
                Some(s) => Duration::from_secs(s.into()),
            },
            cluster_name: self
                .cluster_name
                .clone()
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| DEFAULT_CLUSTER_NAME.to_owned()),
            instance_id,
            node_status_offload: self.node_status_offload.unwrap_or(false),
            archive: self.archive.unwrap_or(false),
        })
    }
}

/// Argo's `config.TTL`: a whole number of days, hours, minutes or seconds,
/// else a Go duration (only the forms Argo's own docs use: units h, m, s, ms).
fn parse_ttl(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "d" => n.checked_mul(86_400)?,
        "h" => n.checked_mul(3_600)?,
        "m" => n.checked_mul(60)?,
        "s" => n,
        "ms" => return Some(Duration::from_millis(n)),
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn per_key_configmap_is_assembled_like_argo() {
        let cm = data(&[
            ("instanceID", "i1"),
            (
                "persistence",
                "archive: true\npostgresql:\n  host: db\n  port: 5432\n  database: argo\n  tableName: t\n  userNameSecret: {name: s, key: u}\n  passwordSecret: {name: s, key: p}\n",
            ),
        ]);
        let (p, instance) = parse_config("argo/cm", &cm).unwrap().unwrap();
        assert_eq!(instance, "i1");
        let resolved = p
            .resolve("argo/cm", "u".into(), "pw".into(), instance)
            .unwrap();
        assert_eq!(
            resolved.database,
            Database::Postgres {
                ssl_mode: "disable".into()
            }
        );
        assert_eq!(
            (
                resolved.host.as_str(),
                resolved.port,
                resolved.table_name.as_str()
            ),
            ("db", Some(5432), "t")
        );
        assert_eq!(resolved.cluster_name, "default");
        assert!(resolved.archive && !resolved.node_status_offload);
        assert!(!format!("{resolved:?}").contains("pw"));
    }

    #[test]
    fn config_key_and_mysql_options() {
        let cm = data(&[(
            "config",
            "persistence:\n  clusterName: c2\n  nodeStatusOffLoad: true\n  connectionTimeoutSeconds: 2\n  connectionPool: {maxOpenConns: 3, maxIdleConns: 1, connMaxLifetime: 2m}\n  mysql:\n    host: m\n    database: argo\n    options: {tls: 'true'}\n",
        )]);
        let (p, instance) = parse_config("argo/cm", &cm).unwrap().unwrap();
        let r = p
            .resolve("argo/cm", "u".into(), "p".into(), instance)
            .unwrap();
        assert_eq!(r.table_name, DEFAULT_TABLE_NAME);
        assert_eq!(r.cluster_name, "c2");
        assert_eq!(r.connect_timeout, Duration::from_secs(2));
        assert_eq!(r.pool.max_open_conns, 3);
        assert_eq!(r.pool.conn_max_lifetime, Some(Duration::from_secs(120)));
        assert!(matches!(r.database, Database::MySql { ref options } if options["tls"] == "true"));
    }

    #[test]
    fn ssl_modes_as_argo_maps_them() {
        let mode = |ssl, mode: Option<&str>| {
            let p = PersistConfig {
                postgresql: Some(PostgreSqlConfig {
                    common: DatabaseConfig {
                        host: "h".into(),
                        ..Default::default()
                    },
                    ssl,
                    ssl_mode: mode.map(str::to_owned),
                }),
                ..Default::default()
            };
            match p
                .resolve("a/b", String::new(), String::new(), String::new())
                .unwrap()
                .database
            {
                Database::Postgres { ssl_mode } => ssl_mode,
                Database::MySql { .. } => unreachable!(),
            }
        };
        assert_eq!(mode(false, Some("verify-full")), "disable");
        assert_eq!(mode(true, None), "prefer");
        assert_eq!(mode(true, Some("verify-ca")), "verify-ca");
    }

    #[test]
    fn no_persistence_block_is_none_and_bad_config_is_clear() {
        assert!(
            parse_config("a/b", &data(&[("instanceID", "x")]))
                .unwrap()
                .is_none()
        );
        let both = PersistConfig {
            postgresql: Some(PostgreSqlConfig::default()),
            mysql: Some(MySqlConfig::default()),
            ..Default::default()
        };
        let err = both
            .resolve("a/b", String::new(), String::new(), String::new())
            .unwrap_err();
        assert!(
            err.to_string().contains("both postgresql and mysql"),
            "{err}"
        );
    }

    #[test]
    fn ttls_like_argo() {
        assert_eq!(parse_ttl("2d"), Some(Duration::from_secs(172_800)));
        assert_eq!(parse_ttl("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_ttl("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_ttl("x"), None);
    }
}
