//! rewind's archive module against real PostgreSQL and MariaDB servers
//! (`rewind::testenv::db`), whose tables and rows Argo's own code writes
//! (tools/argodb), plus Argo's ConfigMap and Secrets on a real local control
//! plane. Each server starts once for the binary; every test runs on both. If
//! anything cannot start, every test fails: these tests are never skipped.

mod argodb;
mod tests;

use std::process::ExitCode;
use std::sync::Arc;

use futures::future::BoxFuture;
use libtest_mimic::{Arguments, Failed, Trial};
use rewind::testenv::db::{DbServer, Kind};
use rewind::testenv::localcluster::{LocalCluster, Options};
use tracing_subscriber::EnvFilter;

/// What every test gets: one database server, and the control plane.
pub struct Env {
    pub db: DbServer,
    pub cluster: Arc<LocalCluster>,
}

type Test = fn(Arc<Env>) -> BoxFuture<'static, anyhow::Result<()>>;

macro_rules! tests {
    ($($test:ident),* $(,)?) => {
        vec![$((stringify!($test), (|env| Box::pin(tests::$test(env))) as Test)),*]
    };
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("rewind=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let tests: Vec<(&str, Test)> = tests![
        archived_workflow_reads_the_row_argo_wrote,
        archived_rows_are_scoped_to_cluster_and_instance,
        a_corrupt_archived_row_is_a_clear_permanent_error,
        a_database_that_is_down_is_a_transient_error,
        offloaded_nodes_written_by_rewind_are_read_back_by_argo,
        offload_version_and_bytes_equal_argos,
        offloaded_nodes_written_by_argo_are_read_by_rewind,
        rows_over_a_megabyte_are_read_again_and_again,
        rows_over_max_nodes_size_are_refused_naming_their_size,
        load_persistence_reads_argos_configmap_and_secrets,
        tls_settings_are_honoured,
        a_fixture_stops_cleanly_and_leaves_nothing,
    ];
    let kinds = [(Kind::Postgres, "postgres"), (Kind::MariaDb, "mariadb")];
    let names: Vec<String> = kinds
        .iter()
        .flat_map(|(_, db)| tests.iter().map(move |(name, _)| format!("{db}::{name}")))
        .collect();
    let wanted = |name: &str| {
        !args.list && {
            let trial = Trial::test(name.to_owned(), || Ok(()));
            !args.is_filtered_out(&trial) && !args.is_ignored(&trial)
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");

    // Started on the main thread (block_on polls here), which outlives the
    // servers: they are killed with that thread if this process dies.
    let cluster = names.iter().any(|n| wanted(n)).then(|| {
        runtime
            .block_on(LocalCluster::start(Options::default()))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    });
    let mut envs = Vec::new();
    for (kind, db) in kinds {
        let needed = tests
            .iter()
            .any(|(name, _)| wanted(&format!("{db}::{name}")));
        let env = match (&cluster, needed) {
            (Some(Ok(cluster)), true) => Some(
                runtime
                    .block_on(start_db(kind))
                    .map(|db| {
                        Arc::new(Env {
                            db,
                            cluster: cluster.clone(),
                        })
                    })
                    .map_err(|e| format!("{e:#}")),
            ),
            (Some(Err(e)), true) => {
                Some(Err(format!("the local control plane did not start: {e}")))
            }
            _ => None,
        };
        if let Some(Err(e)) = &env {
            eprintln!("error: {db}: every test fails: {e}");
        }
        envs.push((db, env));
    }

    let mut trials = Vec::new();
    for (db, env) in &envs {
        for (name, test) in &tests {
            let env = env.clone();
            let test = *test;
            let handle = runtime.handle().clone();
            trials.push(Trial::test(format!("{db}::{name}"), move || {
                let env = env
                    .ok_or("not started")?
                    .map_err(|e| Failed::from(format!("setup failed: {e}")))?;
                handle
                    .block_on(test(env))
                    .map_err(|e| Failed::from(format!("{e:#}")))
            }));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);

    drop(envs);
    if let Some(Ok(cluster)) = cluster {
        match Arc::try_unwrap(cluster) {
            Ok(cluster) => {
                if let Err(e) = runtime.block_on(cluster.stop()) {
                    eprintln!("error: stopping the local control plane: {e}");
                    return ExitCode::FAILURE;
                }
            }
            Err(_) => {
                eprintln!("error: a test kept the local control plane alive");
                return ExitCode::FAILURE;
            }
        }
    }
    conclusion.exit_code()
}

/// A server with Argo's schema, created by Argo's own migration.
async fn start_db(kind: Kind) -> anyhow::Result<DbServer> {
    let db = DbServer::start(kind).await?;
    db.create_argo_schema()?;
    Ok(db)
}
