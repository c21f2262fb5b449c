//! End to end with Argo's own workflow-controller (v4.1.4, built from its Go module) on the
//! local control plane with kube-scheduler, kube-controller-manager and kwok.
//!
//! Each scenario runs a workflow in which some pods fail, then retries it twice, in two
//! namespaces under the same name: once with rewind (its controller in process), once with
//! Argo's own retry code (tools/peer, the Argo Server's RetryWorkflow). Both must end
//! Succeeded, keep the first run's succeeded pods, give new pods exactly to the nodes the
//! retry reset, and agree node by node. Three scenarios keep the failed workflow in Argo's
//! database (PostgreSQL, Argo's own schema): `archived` (Argo archives it and it is deleted;
//! a WorkflowRetry against Argo's `RetryArchivedWorkflow`), `archived-orphaned` (deleted
//! with its pods orphaned, where rewind refuses until they are deleted: see [`Mode`]) and
//! `offloaded` (its nodes offloaded). One control plane, the database and Argo's controllers (v4, v3.7.6, v4 with
//! the archive, v4 offloading) serve the whole binary; if they cannot start, every test fails
//! (never skipped).
//!
//! The `cli-*` and `hera-*` scenarios ask rewind through its Argo API with Argo's own
//! clients instead ([`clients`]): the real `argo` CLI and Hera, through nginx routing as the
//! chart's Ingress, beside a real `argo server` (the archive controller's ConfigMap).
//!
//! `fast-retries-*` retry workflows the moment they turn Failed, without waiting for Argo to
//! finish with their pods ([`fast`]); the 20×100 one runs with `--ignored`.
//! `strand-fixed-by-its-command` strands a reset node by hand and runs the fix rewind names
//! for it ([`strand`]).

mod clients;
mod fast;
mod run;
mod strand;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use libtest_mimic::{Arguments, Failed, Trial};
use rewind::argo::plan::ArgoVersion;
use rewind::argo::workflow::Workflow;
use rewind::testenv::argo::{self, ArgoController};
use rewind::testenv::clients::ArgoServer;
use rewind::testenv::db::DbServer;
use rewind::testenv::localcluster::{LocalCluster, Options};
use tracing_subscriber::EnvFilter;

use run::{ApiClient, Budgets, Mode, Retry, Scenario};

const WORK: &str = r#"
  - name: work
    inputs:
      parameters:
      - name: msg
        value: "{{workflow.parameters.msg}}"
    container:
      image: busybox
      command: [echo]
      args: ["{{inputs.parameters.msg}}"]
"#;

fn workflow(body: &str) -> Workflow {
    let yaml = format!(
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata:\n  name: placeholder\n{body}{WORK}"
    );
    serde_yaml_ng::from_str(&yaml).expect("a valid workflow")
}

/// The v4 scenarios, then the DAG with retryStrategy again under Argo v3.7.6 (its own
/// controller, instance ID `v3`; rewind with v3.7 rules; v3.7.6's RetryWorkflow).
fn scenarios() -> Vec<(Scenario, Option<clients::Kind>)> {
    let mut all: Vec<_> = plain_scenarios().into_iter().map(|s| (s, None)).collect();
    all.extend(client_scenarios());
    all
}

/// Argo's clients through rewind's Argo API: on the archive controller, whose ConfigMap the
/// argo server reads (its archive and instance ID); live with every option, by label, and
/// archived.
fn client_scenarios() -> Vec<(Scenario, Option<clients::Kind>)> {
    let v4 = v4_scenarios();
    let find = |name: &str| {
        v4.iter()
            .find(|s| s.name == name)
            .expect("a v4 scenario")
            .clone()
    };
    let archived = database_scenarios()
        .into_iter()
        .find(|s| s.mode == Mode::Archived)
        .expect("the archived scenario");
    [
        ("cli-retry", find("selector-parameters"), clients::Kind::Cli),
        ("cli-retry-label", find("steps"), clients::Kind::CliLabel),
        (
            "cli-retry-double-click",
            find("steps"),
            clients::Kind::DoubleClick,
        ),
        ("cli-archive-retry", archived.clone(), clients::Kind::Cli),
        (
            "hera-retry",
            find("selector-parameters"),
            clients::Kind::Hera,
        ),
        ("hera-archive-retry", archived.clone(), clients::Kind::Hera),
        ("ui-retry", find("steps"), clients::Kind::Ui),
        ("ui-archive-retry", archived, clients::Kind::Ui),
    ]
    .into_iter()
    .map(|(name, mut scenario, kind)| {
        scenario.name = name.into();
        scenario.instance_id = Some(ARCHIVE_INSTANCE.into());
        (scenario, Some(kind))
    })
    .collect()
}

fn plain_scenarios() -> Vec<Scenario> {
    let mut all = v4_scenarios();
    let mut v3 = all
        .iter()
        .find(|s| s.name == "dag-retry-strategy")
        .expect("the DAG scenario")
        .clone();
    v3.name = "dag-retry-strategy-v3".into();
    v3.argo_version = ArgoVersion::V3_7;
    v3.instance_id = Some(V3_INSTANCE.into());
    all.push(v3);
    all.extend(database_scenarios());
    all
}

const V3_INSTANCE: &str = "v3";
/// The Argo controllers with a database: one archives, one offloads every workflow.
const ARCHIVE_INSTANCE: &str = "archive";
const OFFLOAD_INSTANCE: &str = "offload";

/// A DAG whose failed workflow is kept in Argo's database: archived (and deleted), or with
/// its nodes offloaded.
fn database_scenarios() -> Vec<Scenario> {
    let dag = workflow(
        r#"spec:
  entrypoint: main
  arguments: {parameters: [{name: msg, value: hello}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: work}
      - {name: b, template: work, dependencies: [a]}
      - {name: c, template: work, dependencies: [a]}
      - {name: d, template: work, dependencies: [b, c]}
      - {name: e, template: work}
"#,
    );
    [
        ("archived", ARCHIVE_INSTANCE, Mode::Archived),
        (
            "archived-orphaned",
            ARCHIVE_INSTANCE,
            Mode::ArchivedOrphaned,
        ),
        ("offloaded", OFFLOAD_INSTANCE, Mode::Offloaded),
    ]
    .into_iter()
    .map(|(name, instance, mode)| Scenario {
        name: name.into(),
        workflow: dag.clone(),
        fails: vec![".b".into(), ".e".into()],
        retry: Retry::default(),
        timeout: Duration::from_secs(120),
        argo_version: ArgoVersion::V4,
        instance_id: Some(instance.into()),
        mode,
        // Set from the running controller's ConfigMap.
        argo_configmap: None,
    })
    .collect()
}

fn v4_scenarios() -> Vec<Scenario> {
    let timeout = Duration::from_secs(120);
    vec![
        Scenario {
            name: "steps".into(),
            workflow: workflow(
                r#"spec:
  entrypoint: main
  arguments: {parameters: [{name: msg, value: hello}]}
  templates:
  - name: main
    steps:
    - - {name: a, template: work}
      - {name: b, template: work}
      - {name: c, template: work}
    - - {name: d, template: work}
      - {name: e, template: work}
"#,
            ),
            fails: vec!["[0].b".into()],
            retry: Retry::default(),
            timeout,
            argo_version: ArgoVersion::V4,
            instance_id: None,
            mode: Mode::Live,
            argo_configmap: None,
        },
        Scenario {
            name: "dag-retry-strategy".into(),
            workflow: workflow(
                r#"spec:
  entrypoint: main
  arguments: {parameters: [{name: msg, value: hello}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: work}
      - {name: b, template: flaky, dependencies: [a]}
      - {name: c, template: work, dependencies: [a]}
      - {name: d, template: work, dependencies: [b, c]}
  - name: flaky
    retryStrategy: {limit: "1"}
    container:
      image: busybox
      command: [echo]
      args: ["{{workflow.parameters.msg}}"]
"#,
            ),
            fails: vec![".b(0)".into(), ".b(1)".into(), ".c".into()],
            retry: Retry::default(),
            timeout,
            argo_version: ArgoVersion::V4,
            instance_id: None,
            mode: Mode::Live,
            argo_configmap: None,
        },
        Scenario {
            name: "dag-on-exit".into(),
            workflow: workflow(
                r#"spec:
  entrypoint: main
  onExit: exit
  arguments: {parameters: [{name: msg, value: hello}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: work}
      - {name: b, template: work, dependencies: [a]}
      - {name: c, template: work, dependencies: [a]}
      - {name: d, template: work, dependencies: [b]}
  - name: exit
    steps:
    - - {name: notify, template: work}
"#,
            ),
            fails: vec![".b".into()],
            retry: Retry::default(),
            timeout,
            argo_version: ArgoVersion::V4,
            instance_id: None,
            mode: Mode::Live,
            argo_configmap: None,
        },
        Scenario {
            name: "selector-parameters".into(),
            workflow: workflow(
                r#"spec:
  entrypoint: main
  arguments: {parameters: [{name: msg, value: hello}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: work}
      - {name: b, template: work, dependencies: [a]}
      - {name: c, template: work, dependencies: [a]}
      - {name: d, template: work, dependencies: [b]}
      - {name: e, template: work}
"#,
            ),
            fails: vec![".b".into()],
            retry: Retry {
                restart_successful: true,
                node_field_selector: Some("displayName=c"),
                parameters: vec!["msg=bye".into()],
            },
            timeout,
            argo_version: ArgoVersion::V4,
            instance_id: None,
            mode: Mode::Live,
            argo_configmap: None,
        },
    ]
}

/// The fast-retry trials: name, size, the bound within which every workflow retried the
/// moment it fails ends Succeeded, and whether it runs only with `--ignored` (minutes).
///
/// 20×100 waits for Argo's clean-up queue: its labels of 2,000 pods landed up to 7 minutes
/// after the failures (request to Succeeded 207-430 s on this 2-core machine), where 6×40's
/// take seconds (7-22 s).
fn fast_trials() -> Vec<(&'static str, fast::Size, Duration, bool)> {
    vec![
        (
            "fast-retries-6x40",
            fast::Size {
                workflows: 6,
                pods: 40,
            },
            Duration::from_secs(180),
            false,
        ),
        (
            "fast-retries-20x100",
            fast::Size {
                workflows: 20,
                pods: 100,
            },
            Duration::from_secs(600),
            true,
        ),
    ]
}

/// The trial that strands a reset node and runs the fix rewind names ([`strand`]).
const STRAND: &str = "strand-fixed-by-its-command";

/// Runs one scenario and checks both sides; the differences between the two final
/// workflows fail the test, each listed.
async fn check(
    cluster: &LocalCluster,
    peer: &std::path::Path,
    scenario: Scenario,
    client: Option<&dyn ApiClient>,
) -> anyhow::Result<()> {
    let outcome = run::run(cluster, peer, &scenario, Budgets::default(), false, client).await?;
    for (side, by_rewind) in [(&outcome.rewind, true), (&outcome.argo, false)] {
        let ns = &side.namespace;
        let fates = side.fates();
        tracing::info!(namespace = %ns, ?fates, "pods after the retry");
        let failed = side.before_in("Failed");
        ensure!(!failed.is_empty(), "{ns}: no pod failed on the first run");
        ensure!(
            !fates.replaced.is_empty() || !fates.new.is_empty(),
            "{ns}: the retry ran no new pod"
        );
        for name in fates.replaced.iter().chain(&fates.new) {
            let phase = &side.after[name].phase;
            ensure!(phase == "Succeeded", "{ns}: new pod {name} ended {phase}");
        }
        match scenario.mode {
            Mode::Live => {}
            Mode::Archived => {
                // The first run's pods went with the deleted workflow: exactly the failed
                // ones are run again, under the same names.
                let rerun: Vec<String> = side
                    .before_in("Succeeded")
                    .into_iter()
                    .filter(|name| side.after.contains_key(name))
                    .collect();
                ensure!(
                    rerun.is_empty(),
                    "{ns}: succeeded nodes of the archived workflow ran again: {rerun:?}"
                );
                ensure!(
                    failed.is_subset(&fates.replaced),
                    "{ns}: failed pods {failed:?} were not run again: {fates:?}"
                );
            }
            Mode::ArchivedOrphaned => {
                // Argo's retry deletes the orphans by name; rewind refuses, naming them all.
                let refused = side.refused.as_deref().unwrap_or_default();
                ensure!(
                    side.refused.is_some() == by_rewind
                        && (!by_rewind
                            || (refused.contains("owned by nothing (orphaned)")
                                && failed.iter().all(|pod| refused.contains(pod.as_str())))),
                    "{ns}: rewind should refuse the orphaned failed pods {failed:?}, naming \
                     each; refused: {:?}",
                    side.refused
                );
            }
            Mode::Offloaded => ensure!(
                side.offloaded == (true, true),
                "{ns}: Argo should have offloaded the nodes of the failed and of the final \
                 workflow (ALWAYS_OFFLOAD_NODE_STATUS=true); offloaded: {:?}",
                side.offloaded
            ),
        }
        if !scenario.retry.restart_successful && scenario.mode != Mode::Archived {
            // Argo's retry also runs the exit handler again.
            let reran: Vec<String> = side
                .before_in("Succeeded")
                .into_iter()
                .filter(|name| !fates.kept.contains(name))
                .filter(|name| !side.before[name].node.contains(".onExit"))
                .collect();
            ensure!(
                reran.is_empty(),
                "{ns}: succeeded pods of the first run did not keep their UIDs: {reran:?}"
            );
        }
    }
    for parameter in &scenario.retry.parameters {
        let (name, value) = parameter.split_once('=').expect("name=value");
        let arguments = serde_json::to_value(&outcome.rewind.workflow.spec)?["arguments"].clone();
        let set = arguments["parameters"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["name"] == name && p["value"] == value));
        ensure!(
            set,
            "rewind's retry did not set parameter {parameter}: {arguments}"
        );
    }
    let (rewind, argo) = (outcome.rewind.fates(), outcome.argo.fates());
    ensure!(
        rewind == argo,
        "rewind and Argo's retry treat the pods differently:\nrewind {rewind:?}\nargo   {argo:?}"
    );
    let differences = run::differences(&outcome.rewind.workflow, &outcome.argo.workflow)?;
    ensure!(
        differences.is_empty(),
        "the final workflows differ beyond timestamps and identities:\n{}",
        differences.join("\n")
    );
    tracing::info!(
        scenario = %scenario.name,
        rewind_reset = ?outcome.rewind.reset_took,
        rewind_succeeded = ?outcome.rewind.retry_took,
        argo_reset = ?outcome.argo.reset_took,
        argo_succeeded = ?outcome.argo.retry_took,
        "from the retry request to the reset and to Succeeded"
    );
    Ok(())
}

struct Env {
    cluster: LocalCluster,
    argo: ArgoController,
    /// What the scenarios need beside: absent when only `fast-retries-*` run.
    full: Option<Full>,
}

/// Argo's other controllers, its database, server and clients, and the peers.
struct Full {
    argo_v3: ArgoController,
    /// Argo's controllers with `persistence` on `db`: archive on, and node status offload.
    argo_archive: ArgoController,
    argo_offload: ArgoController,
    db: DbServer,
    peer: PathBuf,
    peer_v3: PathBuf,
    /// Argo's server, for the client scenarios, and what they run.
    argo_server: ArgoServer,
    argo_cli: PathBuf,
    python: PathBuf,
    /// Argo's server with its UI built, and playwright-core: only when a `ui-*` scenario runs.
    ui: Option<(ArgoServer, PathBuf)>,
}

impl Full {
    fn peer(&self, version: ArgoVersion) -> &std::path::Path {
        match version {
            ArgoVersion::V4 => &self.peer,
            ArgoVersion::V3_7 => &self.peer_v3,
        }
    }

    /// The client of a client scenario.
    fn client(&self, kind: clients::Kind) -> clients::Client {
        let (argo_server, playwright) = match (&self.ui, kind) {
            (Some((server, playwright)), clients::Kind::Ui) => {
                (server.addr, Some(playwright.clone()))
            }
            _ => (self.argo_server.addr, None),
        };
        clients::Client {
            kind,
            argo: self.argo_cli.clone(),
            argo_server,
            python: self.python.clone(),
            playwright,
        }
    }

    /// The ConfigMap of the controller that keeps the scenario's workflow in its database
    /// (a client scenario's is the archive controller's, whichever its mode).
    fn configmap(&self, mode: Mode, client: bool) -> Option<String> {
        if client {
            return Some(self.argo_archive.configmap());
        }
        match mode {
            Mode::Live => None,
            Mode::Archived | Mode::ArchivedOrphaned => Some(self.argo_archive.configmap()),
            Mode::Offloaded => Some(self.argo_offload.configmap()),
        }
    }
}

/// [`Env`] for the trials: with `full`, what the scenarios need (`ui`: Argo's server with
/// its UI too); without, the control plane and Argo's v4 controller only.
async fn start(full: bool, ui: bool) -> anyhow::Result<Env> {
    let cluster = LocalCluster::start(Options {
        scheduling: true,
        // The client scenarios check that only rewind deleted pods.
        audit: true,
        ..Options::default()
    })
    .await?;
    let argo = ArgoController::start(&cluster, &argo::Options::default()).await?;
    let full = if full {
        Some(start_full(&cluster, ui).await?)
    } else {
        None
    };
    Ok(Env {
        cluster,
        argo,
        full,
    })
}

/// [`Full`] on `cluster`.
async fn start_full(cluster: &LocalCluster, ui: bool) -> anyhow::Result<Full> {
    let (peer, peer_v3, (argo_cli, python)) = tokio::task::spawn_blocking(|| {
        anyhow::Ok((
            argo::binary("peer")?,
            argo::binary("peer-v3")?,
            clients::tools()?,
        ))
    })
    .await??;
    let argo_v3 = ArgoController::start(
        cluster,
        &argo::Options {
            version: argo::Version::V3,
            instance_id: Some(V3_INSTANCE.into()),
            ..argo::Options::default()
        },
    )
    .await?;
    let db = DbServer::postgres().await?;
    // One after the other: each runs Argo's migration on the shared database at start.
    let mut with_database = Vec::new();
    for (instance, archive, offload) in [
        (ARCHIVE_INSTANCE, true, false),
        (OFFLOAD_INSTANCE, false, true),
    ] {
        let options = argo::Options {
            instance_id: Some(instance.into()),
            persistence: Some(argo::Persistence {
                database: db.argo_db_config(),
                archive,
                offload,
            }),
            ..argo::Options::default()
        };
        with_database.push(ArgoController::start(cluster, &options).await?);
    }
    let argo_offload = with_database.pop().expect("two controllers");
    let argo_archive = with_database.pop().expect("two controllers");
    let argo_server = ArgoServer::start(cluster, &argo_cli, &argo_archive.configmap()).await?;
    let ui = if ui {
        let (argo_ui, playwright) = tokio::task::spawn_blocking(clients::ui_tools).await??;
        let server = ArgoServer::start(cluster, &argo_ui, &argo_archive.configmap()).await?;
        Some((server, playwright))
    } else {
        None
    };
    Ok(Full {
        ui,
        argo_server,
        argo_cli,
        python,
        argo_v3,
        argo_archive,
        argo_offload,
        db,
        peer,
        peer_v3,
    })
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("e2e=info,rewind=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let scenarios = scenarios();
    // The UI's scenarios need Argo's UI built (minutes: tools/argo/ui.sh), so they run only
    // when asked: `make test-ui` (`-- --ignored ui-`).
    let is_ui = |kind: &Option<clients::Kind>| *kind == Some(clients::Kind::Ui);
    let listed: Vec<Trial> =
        scenarios
            .iter()
            .map(|(s, kind)| Trial::test(s.name.clone(), || Ok(())).with_ignored_flag(is_ui(kind)))
            .chain(fast_trials().into_iter().map(|(name, _, _, ignored)| {
                Trial::test(name, || Ok(())).with_ignored_flag(ignored)
            }))
            .chain(std::iter::once(Trial::test(STRAND, || Ok(()))))
            .collect();
    let runs = |t: &&Trial| !args.list && !args.is_filtered_out(t) && !args.is_ignored(t);
    let ui_wanted = listed
        .iter()
        .filter(runs)
        .any(|t| t.name().starts_with("ui-"));
    // The fast trials and the strand need only the control plane and Argo's v4 controller.
    let full_wanted = listed
        .iter()
        .filter(runs)
        .any(|t| !t.name().starts_with("fast-retries-") && t.name() != STRAND);
    let anything_to_run = listed.iter().any(|t| runs(&t));
    let env = if anything_to_run {
        match runtime.block_on(start(full_wanted, ui_wanted)) {
            Ok(env) => Some(Arc::new(env)),
            Err(error) => {
                eprintln!(
                    "error: the control plane or Argo's controller did not start, so every test fails:\n{error:#}"
                );
                None
            }
        }
    } else {
        None
    };
    let trials = scenarios
        .into_iter()
        .map(|(scenario, kind)| {
            let env = env.clone();
            let handle = runtime.handle().clone();
            let ignored = is_ui(&kind);
            Trial::test(scenario.name.clone(), move || {
                let env =
                    env.ok_or_else(|| Failed::from("the environment did not start (see above)"))?;
                let full = env
                    .full
                    .as_ref()
                    .ok_or_else(|| Failed::from("the scenarios' environment was not started"))?;
                let mut scenario = scenario;
                scenario.argo_configmap = full.configmap(scenario.mode, kind.is_some());
                let client = kind.map(|kind| full.client(kind));
                handle
                    .block_on(check(
                        &env.cluster,
                        full.peer(scenario.argo_version),
                        scenario,
                        client.as_ref().map(|c| c as &dyn ApiClient),
                    ))
                    .map_err(|error| Failed::from(format!("{error:#}")))
            })
            .with_ignored_flag(ignored)
        })
        .chain(
            fast_trials()
                .into_iter()
                .map(|(name, size, bound, ignored)| {
                    let env = env.clone();
                    let handle = runtime.handle().clone();
                    Trial::test(name, move || {
                        let env = env.ok_or_else(|| {
                            Failed::from("the environment did not start (see above)")
                        })?;
                        handle
                            .block_on(fast::retried_the_moment_they_fail(
                                &env.cluster,
                                name,
                                size,
                                bound,
                            ))
                            .map_err(|error| Failed::from(format!("{error:#}")))
                    })
                    .with_ignored_flag(ignored)
                }),
        )
        .chain(std::iter::once({
            let env = env.clone();
            let handle = runtime.handle().clone();
            Trial::test(STRAND, move || {
                let env =
                    env.ok_or_else(|| Failed::from("the environment did not start (see above)"))?;
                handle
                    .block_on(strand::the_fix_rewind_names_lets_argo_finish_the_node(
                        &env.cluster,
                        STRAND,
                    ))
                    .map_err(|error| Failed::from(format!("{error:#}")))
            })
        }))
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if let Some(env) = env {
        let Ok(Env {
            cluster,
            argo,
            full,
        }) = Arc::try_unwrap(env)
        else {
            eprintln!("error: a test kept the environment alive");
            return ExitCode::FAILURE;
        };
        let (mut controllers, mut database) = (vec![argo], None);
        if let Some(Full {
            argo_v3,
            argo_archive,
            argo_offload,
            db,
            argo_server,
            ui,
            ..
        }) = full
        {
            for server in std::iter::once(argo_server).chain(ui.map(|(server, _)| server)) {
                if let Err(error) = runtime.block_on(server.stop()) {
                    eprintln!("error: argo server: {error}");
                    return ExitCode::FAILURE;
                }
            }
            controllers.extend([argo_v3, argo_archive, argo_offload]);
            database = Some(db);
        }
        for controller in controllers {
            if let Err(error) = runtime.block_on(controller.stop()) {
                eprintln!("error: Argo's workflow-controller: {error}");
                return ExitCode::FAILURE;
            }
        }
        // After the controllers that use it.
        if let Some(db) = database {
            db.stop();
        }
        if let Err(error) = runtime.block_on(cluster.stop()) {
            eprintln!("error: stopping the local control plane: {error}");
            return ExitCode::FAILURE;
        }
    }
    conclusion.exit_code()
}
