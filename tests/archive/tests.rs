//! The tests, each run on PostgreSQL and on MariaDB.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;
use rewind::argo::db::{ArgoDatabase, Database, DbError, Sql, go_json};
use rewind::controller::argo_config::load_persistence;
use rewind::testenv::db::{Kind, PASSWORD, USER};
use serde_json::{Value, json};
use sqlx::Connection;

use crate::Env;
use crate::argodb::{self, Line, request};

/// A UID no other test uses (tests share one database).
fn new_uid(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{test}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Nodes with most of NodeStatus's fields, written in an order Go never
/// uses (reversed), with strings Go escapes.
fn nodes(name: &str) -> Value {
    let node = |id: &str, phase: &str| {
        json!({
            "restartingPodUID": "", "failedPodRestarts": 0, "taskResultSynced": true,
            "synchronizationStatus": {"waiting": "sem"},
            "memoizationStatus": {"cacheName": "c", "key": "k", "hit": false},
            "hostNodeName": "node-1", "outboundNodes": [format!("{id}-x")], "children": [],
            "outputs": {"exitCode": "1", "result": "a<b>&c\u{2028}",
                        "artifacts": [{"name": "log", "s3": {"key": "k/log"}}],
                        "parameters": [{"valueFrom": {"path": "/tmp/o"}, "value": "v", "name": "o"}]},
            "inputs": {"parameters": [{"enum": ["1", "2"], "default": "1", "value": "2", "name": "p"}]},
            "nodeFlag": {"retried": true}, "podIP": "", "resourcesDuration": {"memory": 5, "cpu": 2},
            "progress": "1/1", "estimatedDuration": 3,
            "finishedAt": "2024-01-01T00:01:00Z", "startedAt": "2024-01-01T00:00:00Z",
            "message": "Error (exit code 1)", "boundaryID": name, "phase": phase,
            "templateScope": "local/", "templateRef": {"template": "t", "name": "wt"},
            "templateName": "main", "type": "Pod", "displayName": format!("{id}\t<x>"),
            "name": format!("{name}.{id}"), "id": format!("{name}-{id}"),
        })
    };
    json!({
        format!("{name}-b"): node("b", "Failed"),
        format!("{name}-a"): node("a", "Succeeded"),
        name: {"id": name, "name": name, "type": "DAG", "phase": "Failed",
               "children": [format!("{name}-a"), format!("{name}-b")],
               "startedAt": "2024-01-01T00:00:00Z", "finishedAt": null},
    })
}

/// A failed workflow as Argo's controller writes it.
fn workflow(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": name, "namespace": "argo", "uid": uid,
                     "creationTimestamp": "2024-01-01T00:00:00Z",
                     "labels": {"workflows.argoproj.io/phase": "Failed",
                                "workflows.argoproj.io/completed": "true"},
                     "annotations": {"note": "nul:\u{0} html:<&> ls:\u{2028}"}},
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "x"}}],
                 "arguments": {"parameters": [{"name": "p", "value": "a\u{0}b"}]}},
        "status": {"phase": "Failed", "startedAt": "2024-01-01T00:00:00Z",
                   "finishedAt": "2024-01-01T00:01:00Z", "nodes": nodes(name)},
    })
}

/// Argo's offload repo (of `line`) saves `nodes` under `uid`.
fn saved_by_argo(
    env: &Env,
    line: Line,
    uid: &str,
    nodes: &Value,
) -> anyhow::Result<argodb::Answer> {
    argodb::one(
        line,
        request(
            &env.db,
            "save",
            json!({"uid": uid, "namespace": "argo", "nodes": nodes}),
        ),
    )
}

fn archive_request(env: &Env, wf: &Value, cluster: &str, instance: &str) -> Value {
    request(
        &env.db,
        "archive",
        json!({"workflow": wf, "clusterName": cluster, "instanceID": instance}),
    )
}

pub async fn archived_workflow_reads_the_row_argo_wrote(env: Arc<Env>) -> anyhow::Result<()> {
    let archive = Sql::connect(&env.db.persistence()).await?;
    for line in [Line::V4, Line::V3] {
        let uid = new_uid("read");
        let wf = workflow("wf-read", &uid);
        argodb::one(line, archive_request(&env, &wf, "", ""))?;
        let argo = argodb::one(line, request(&env.db, "getArchived", json!({"uid": uid})))?;
        let argo: Value = serde_json::from_str(&argo.json)?;

        let ours = archive
            .archived_workflow(&uid)
            .await?
            .with_context(|| format!("{line:?}: the archived row is not found"))?;
        // Compared through rewind's type, which is how rewind sees either.
        let argo: rewind::argo::workflow::Workflow = serde_json::from_value(argo)?;
        assert_eq!(ours, argo, "{line:?}");
        assert_eq!(
            ours.annotation("note"),
            Some("nul:\u{0} html:<&> ls:\u{2028}")
        );
        assert_eq!(
            ours.label("workflows.argoproj.io/workflow-archiving-status"),
            Some("Persisted")
        );
        if env.db.kind() == Kind::Postgres {
            // Argo stores `\u0000` as its replacement string on PostgreSQL.
            let stored: String = sqlx::query_scalar(
                "SELECT workflow->'metadata'->'annotations'->>'note' FROM argo_archived_workflows WHERE uid = $1",
            )
            .bind(&uid)
            .fetch_one(&mut admin_pg(&env).await?)
            .await?;
            assert_eq!(
                stored,
                "nul:ARGO_POSTGRES_NULL_REPLACEMENT html:<&> ls:\u{2028}"
            );
        }
    }
    assert!(archive.archived_workflow("no-such-uid").await?.is_none());
    archive.close().await;
    Ok(())
}

pub async fn archived_rows_are_scoped_to_cluster_and_instance(env: Arc<Env>) -> anyhow::Result<()> {
    let (other_cluster, other_instance) = (new_uid("scope-c"), new_uid("scope-i"));
    argodb::one(
        Line::V4,
        archive_request(&env, &workflow("wf-c", &other_cluster), "east", ""),
    )?;
    argodb::one(
        Line::V4,
        archive_request(&env, &workflow("wf-i", &other_instance), "", "i2"),
    )?;
    let default = Sql::connect(&env.db.persistence()).await?;
    assert!(default.archived_workflow(&other_cluster).await?.is_none());
    assert!(default.archived_workflow(&other_instance).await?.is_none());

    let mut east = env.db.persistence();
    east.cluster_name = "east".into();
    let east = Sql::connect(&east).await?;
    assert!(east.archived_workflow(&other_cluster).await?.is_some());
    assert!(east.archived_workflow(&other_instance).await?.is_none());

    let mut i2 = env.db.persistence();
    i2.instance_id = "i2".into();
    let i2 = Sql::connect(&i2).await?;
    assert_eq!(
        i2.archived_workflow(&other_instance)
            .await?
            .context("instance i2 sees its row")?
            .name(),
        "wf-i"
    );
    Ok(())
}

pub async fn a_corrupt_archived_row_is_a_clear_permanent_error(
    env: Arc<Env>,
) -> anyhow::Result<()> {
    let (bad_wf, bad_nodes) = (new_uid("corrupt-wf"), new_uid("corrupt-nodes"));
    // Valid JSON (the column type insists), but no workflow: a name must be a string.
    let row = r#"{"metadata": {"name": 7}}"#;
    match env.db.kind() {
        Kind::Postgres => {
            let mut conn = admin_pg(&env).await?;
            sqlx::query("INSERT INTO argo_archived_workflows (clustername, uid, name, phase, namespace, workflow, startedat, finishedat, instanceid) VALUES ('default', $1, 'bad', 'Failed', 'argo', $2::jsonb, now(), now(), '')")
                .bind(&bad_wf).bind(row).execute(&mut conn).await?;
            sqlx::query("INSERT INTO argo_workflows (clustername, uid, namespace, version, nodes) VALUES ('default', $1, 'argo', 'fnv:1', '[1]'::json)")
                .bind(&bad_nodes).execute(&mut conn).await?;
        }
        Kind::MariaDb => {
            let mut conn = admin_mysql(&env).await?;
            sqlx::query("INSERT INTO argo_archived_workflows (clustername, uid, name, phase, namespace, workflow, startedat, finishedat, instanceid) VALUES ('default', ?, 'bad', 'Failed', 'argo', ?, now(), now(), '')")
                .bind(&bad_wf).bind(row).execute(&mut conn).await?;
            sqlx::query("INSERT INTO argo_workflows (clustername, uid, namespace, version, nodes) VALUES ('default', ?, 'argo', 'fnv:1', '[1]')")
                .bind(&bad_nodes).execute(&mut conn).await?;
        }
    }
    let archive = Sql::connect(&env.db.persistence()).await?;
    let err = archive.archived_workflow(&bad_wf).await.unwrap_err();
    assert!(
        matches!(err, DbError::CorruptArchivedWorkflow { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    let message = err.to_string();
    for part in [bad_wf.as_str(), "argo_archived_workflows", "corrupt"] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    // Users read the message; the database's address is for the log only.
    assert!(!message.contains("127.0.0.1"), "{message:?}");
    assert!(
        err.target().is_some_and(|t| t.contains("127.0.0.1")),
        "{err:?}"
    );

    let err = archive
        .offloaded_nodes(&bad_nodes, "fnv:1")
        .await
        .unwrap_err();
    assert!(
        matches!(err, DbError::CorruptOffloadedNodes { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    let err = archive
        .offloaded_nodes(&bad_nodes, "fnv:2")
        .await
        .unwrap_err();
    assert!(
        matches!(err, DbError::OffloadedNodesMissing { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient(), "{err}");
    Ok(())
}

pub async fn a_database_that_is_down_is_a_transient_error(env: Arc<Env>) -> anyhow::Result<()> {
    // A port nobody listens on: the database is down.
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port();
    let mut down = env.db.persistence();
    down.port = Some(port);
    down.connect_timeout = std::time::Duration::from_secs(1);
    let archive = Sql::connect(&down).await?;
    let err = archive.archived_workflow("x").await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("archived workflow x") && !message.contains(&port.to_string()),
        "{message}"
    );
    assert!(
        err.target()
            .is_some_and(|t| t.contains(&format!("127.0.0.1:{port}"))),
        "{err:?}"
    );
    let err = archive
        .offload_nodes("x", "argo", &typed(&nodes("wf")))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");

    // A wrong password is no passing fault.
    let mut wrong = env.db.persistence();
    wrong.password = "wrong".into();
    let err = Sql::connect(&wrong)
        .await?
        .archived_workflow("x")
        .await
        .unwrap_err();
    assert!(!err.is_transient(), "{err:?}");
    Ok(())
}

pub async fn offloaded_nodes_written_by_rewind_are_read_back_by_argo(
    env: Arc<Env>,
) -> anyhow::Result<()> {
    let uid = new_uid("offload");
    let nodes = nodes("wf-offload");
    let archive = Sql::connect(&env.db.persistence()).await?;
    let version = archive.offload_nodes(&uid, "argo", &typed(&nodes)).await?;
    // Writing the same nodes again is no error, as in Argo.
    assert_eq!(
        archive.offload_nodes(&uid, "argo", &typed(&nodes)).await?,
        version
    );

    for line in [Line::V4, Line::V3] {
        let argo = argodb::one(
            line,
            request(&env.db, "get", json!({"uid": uid, "version": version})),
        )?;
        // Argo reads every field back, and marshals them to rewind's bytes.
        assert_eq!(
            argo.json.as_bytes(),
            go_json::marshal_nodes(&typed(&nodes)),
            "{line:?}"
        );
    }
    // What rewind reads back is what it wrote, every field.
    assert_eq!(
        go_json::marshal_nodes(&archive.offloaded_nodes(&uid, &version).await?),
        go_json::marshal_nodes(&typed(&nodes))
    );
    Ok(())
}

pub async fn offload_version_and_bytes_equal_argos(env: Arc<Env>) -> anyhow::Result<()> {
    let nodes = nodes("wf-version");
    let ours = go_json::marshal_nodes(&typed(&nodes));
    let version = go_json::nodes_version(&typed(&nodes));
    for line in [Line::V4, Line::V3] {
        let uid = new_uid("version");
        let saved = saved_by_argo(&env, line, &uid, &nodes)?;
        ensure!(
            saved.version == version,
            "{line:?}: Argo's version {} != ours {version}",
            saved.version
        );
        let marshalled = argodb::one(line, request(&env.db, "marshal", json!({"nodes": nodes})))?;
        assert_eq!(
            marshalled.json,
            String::from_utf8(ours.clone())?,
            "{line:?}"
        );
    }
    Ok(())
}

pub async fn offloaded_nodes_written_by_argo_are_read_by_rewind(
    env: Arc<Env>,
) -> anyhow::Result<()> {
    let uid = new_uid("argo-offload");
    let nodes = nodes("wf-argo");
    let saved = saved_by_argo(&env, Line::V4, &uid, &nodes)?;
    let archive = Sql::connect(&env.db.persistence()).await?;
    let ours = archive.offloaded_nodes(&uid, &saved.version).await?;
    // Rewind reads every field Argo wrote.
    assert_eq!(
        go_json::marshal_nodes(&ours),
        go_json::marshal_nodes(&typed(&nodes))
    );
    // And rewind writing what it read (e.g. under a new UID) gives Argo's version.
    let copy = archive
        .offload_nodes(&new_uid("copy"), "argo", &ours)
        .await?;
    assert_eq!(copy, saved.version);
    Ok(())
}

/// A row over a megabyte closes its connection once read (its read buffer
/// would stay that large in the pool): the pool opens another, and every read
/// gives the same nodes.
pub async fn rows_over_a_megabyte_are_read_again_and_again(env: Arc<Env>) -> anyhow::Result<()> {
    let uid = new_uid("large-offload");
    let mut nodes = serde_json::Map::new();
    for i in 0..800 {
        let Value::Object(group) = self::nodes(&format!("wf-{i:04}")) else {
            unreachable!("nodes are an object")
        };
        nodes.extend(group);
    }
    let nodes = Value::Object(nodes);
    let saved = saved_by_argo(&env, Line::V4, &uid, &nodes)?;
    let expected = go_json::marshal_nodes(&typed(&nodes));
    ensure!(
        expected.len() > 1 << 20,
        "the nodes must make a row over a megabyte, not {} bytes",
        expected.len()
    );
    let archive = Sql::connect(&env.db.persistence()).await?;
    for _ in 0..3 {
        let read = archive.offloaded_nodes(&uid, &saved.version).await?;
        assert_eq!(go_json::marshal_nodes(&read), expected);
    }
    Ok(())
}

/// A row over `--max-nodes-size` is neither read nor parsed (its size comes first): the
/// retry fails naming the row's size and the flag, instead of the controller taking three
/// times the row in memory. At the limit exactly, it is read.
pub async fn rows_over_max_nodes_size_are_refused_naming_their_size(
    env: Arc<Env>,
) -> anyhow::Result<()> {
    let uid = new_uid("too-large");
    let saved = saved_by_argo(&env, Line::V4, &uid, &nodes("wf-big"))?;
    let archived_uid = new_uid("too-large-archived");
    argodb::one(
        Line::V4,
        archive_request(&env, &workflow("wf-big", &archived_uid), "", ""),
    )?;
    let refused = |e: DbError, what: &str| -> anyhow::Result<usize> {
        let text = e.to_string();
        let DbError::RowTooLarge { size, limit, .. } = e else {
            anyhow::bail!("not refused as too large: {text}");
        };
        ensure!(limit == 100 && size > 100, "{text}");
        ensure!(
            text.contains(what)
                && text.contains(&format!("{size} bytes"))
                && text.contains("--max-nodes-size"),
            "{text}"
        );
        Ok(size)
    };
    let small = Sql::connect(&env.db.persistence())
        .await?
        .with_max_row_size(100);
    let err = small
        .offloaded_nodes(&uid, &saved.version)
        .await
        .expect_err("a row over the limit");
    ensure!(!err.is_transient(), "{err}");
    let nodes_size = refused(err, &format!("offloaded nodes of workflow {uid}"))?;
    let err = small
        .archived_workflow(&archived_uid)
        .await
        .expect_err("a row over the limit");
    ensure!(!err.is_transient(), "{err}");
    let archived_size = refused(err, &format!("archived workflow {archived_uid}"))?;
    let exact = Sql::connect(&env.db.persistence())
        .await?
        .with_max_row_size(nodes_size);
    exact.offloaded_nodes(&uid, &saved.version).await?;
    let exact = exact.with_max_row_size(archived_size);
    ensure!(exact.archived_workflow(&archived_uid).await?.is_some());
    Ok(())
}

pub async fn load_persistence_reads_argos_configmap_and_secrets(
    env: Arc<Env>,
) -> anyhow::Result<()> {
    let namespace = match env.db.kind() {
        Kind::Postgres => "persistence-postgres",
        Kind::MariaDb => "persistence-mariadb",
    };
    env.cluster.create_namespace(namespace).await?;
    let client = env.cluster.admin_client();
    let mut block = env.db.argo_db_config();
    let persist = block.as_object_mut().expect("an object");
    persist.insert("clusterName".into(), json!("east"));
    persist.insert("archive".into(), json!(true));
    persist.insert(
        "connectionPool".into(),
        json!({"maxOpenConns": 2, "maxIdleConns": 1, "connMaxLifetime": "5m"}),
    );
    if env.db.kind() == Kind::MariaDb {
        block["mysql"]["options"] = json!({"tls": "skip-verify", "sql_mode": "'ANSI_QUOTES'"});
    }
    let data = BTreeMap::from([
        ("persistence".to_owned(), serde_yaml_ng::to_string(&block)?),
        ("instanceID".to_owned(), "".to_owned()),
    ]);
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some("workflow-controller-configmap".into()),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            },
        )
        .await?;
    let configmap = format!("{namespace}/workflow-controller-configmap");
    // The Secret is not there yet: a clear error naming it.
    let err = load_persistence(&client, &configmap).await.unwrap_err();
    assert!(err.to_string().contains("argo-db"), "{err}");
    assert!(!err.is_transient(), "{err:?}");

    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("argo-db".into()),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([
                    ("username".to_owned(), ByteString(USER.into())),
                    ("password".to_owned(), ByteString(PASSWORD.into())),
                ])),
                ..Default::default()
            },
        )
        .await?;
    let loaded = load_persistence(&client, &configmap)
        .await?
        .context("the ConfigMap has a persistence block")?;
    let expected_db = match env.db.kind() {
        Kind::Postgres => Database::Postgres {
            ssl_mode: "require".into(),
        },
        Kind::MariaDb => Database::MySql {
            options: BTreeMap::from([
                ("sql_mode".to_owned(), "'ANSI_QUOTES'".to_owned()),
                ("tls".to_owned(), "skip-verify".to_owned()),
            ]),
        },
    };
    assert_eq!(loaded.database, expected_db);
    assert_eq!(loaded.port, Some(env.db.port()));
    assert_eq!(
        (loaded.username.as_str(), loaded.password.as_str()),
        (USER, PASSWORD)
    );
    assert_eq!(loaded.cluster_name, "east");
    assert_eq!(loaded.pool.max_open_conns, 2);
    assert!(loaded.archive);

    // The loaded settings reach the database (and the server variables apply).
    let uid = new_uid("configured");
    argodb::one(
        Line::V4,
        archive_request(&env, &workflow("wf-configured", &uid), "east", ""),
    )?;
    let archive = Sql::connect(&loaded).await?;
    assert!(archive.archived_workflow(&uid).await?.is_some());
    Ok(())
}

/// The fixture's nodes as rewind's node statuses.
fn typed(nodes: &Value) -> rewind::argo::plan::compress::Nodes {
    serde_json::from_value(nodes.clone()).expect("the fixture's nodes are node statuses")
}

/// The fixtures let `argo` in over TLS only, with a self-signed certificate.
pub async fn tls_settings_are_honoured(env: Arc<Env>) -> anyhow::Result<()> {
    let with = |database: Database| {
        let mut p = env.db.persistence();
        p.database = database;
        p
    };
    let (plain, verified) = match env.db.kind() {
        Kind::Postgres => (
            with(Database::Postgres {
                ssl_mode: "disable".into(),
            }),
            with(Database::Postgres {
                ssl_mode: "verify-full".into(),
            }),
        ),
        Kind::MariaDb => (
            with(Database::MySql {
                options: [("tls".to_owned(), "false".to_owned())].into(),
            }),
            with(Database::MySql {
                options: [("tls".to_owned(), "true".to_owned())].into(),
            }),
        ),
    };
    for (what, p) in [("no TLS", plain), ("an unverifiable certificate", verified)] {
        let err = Sql::connect(&p)
            .await?
            .archived_workflow("x")
            .await
            .err()
            .with_context(|| format!("{what} was accepted"))?;
        ensure!(!err.is_transient(), "{what}: {err:?} is called transient");
    }
    // While TLS without verification (the fixture's setting) gets in.
    let archive = Sql::connect(&env.db.persistence()).await?;
    ensure!(archive.archived_workflow("x").await?.is_none());
    Ok(())
}

pub async fn a_fixture_stops_cleanly_and_leaves_nothing(env: Arc<Env>) -> anyhow::Result<()> {
    let db = rewind::testenv::db::DbServer::start(env.db.kind()).await?;
    let pid = db.pid().context("a running server has a pid")?;
    let dir = db.dir().to_owned();
    ensure!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    db.stop();
    ensure!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "server {pid} still runs"
    );
    ensure!(!dir.exists(), "{} is left behind", dir.display());
    Ok(())
}

async fn admin_pg(env: &Env) -> anyhow::Result<sqlx::PgConnection> {
    let options = sqlx::postgres::PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(env.db.port())
        .username(USER)
        .password(PASSWORD)
        .database(rewind::testenv::db::DATABASE);
    Ok(sqlx::PgConnection::connect_with(&options).await?)
}

async fn admin_mysql(env: &Env) -> anyhow::Result<sqlx::MySqlConnection> {
    let options = sqlx::mysql::MySqlConnectOptions::new()
        .host("127.0.0.1")
        .port(env.db.port())
        .username(USER)
        .password(PASSWORD)
        .database(rewind::testenv::db::DATABASE);
    Ok(sqlx::MySqlConnection::connect_with(&options).await?)
}
