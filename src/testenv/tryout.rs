//! `make try` (`rewind local-cluster --try`): a local cluster to try rewind on as a new user
//! would, following README.md: Argo's own workflow-controller runs workflows on kwok's fake
//! nodes, where a pod of a node named "flaky" fails the first time and succeeds when
//! retried; the user installs the chart with Helm, and, since kwok runs no containers, the
//! chart's rewind Deployment runs here as a process ([`kubelet`]), its Argo retry API on a
//! loopback port printed at the start. Runs until Ctrl-C or SIGTERM.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use tokio::signal::unix::{SignalKind, signal};

use crate::testenv::argo::{self, ArgoController, Outcomes, spawn_tied};
use crate::testenv::kubelet::{self, Deployed};
use crate::testenv::localcluster::{self, Binaries, LocalCluster, Options, Role};
use crate::testenv::{BuildError, IoError, build_tool, free_port, io_error};

/// Pods of a node whose name (past the workflow's) holds this fail their first time.
pub const FLAKY: &str = "flaky";
/// The chart's Deployments, which the try-out runs here.
const CHART_SELECTOR: &str = "app.kubernetes.io/name=rewind";
/// How often the Deployments are looked at, as a kubelet's sync loop would.
const SYNC: Duration = Duration::from_secs(2);
/// A process that exited is started again after this long.
const BACKOFF: Duration = Duration::from_secs(10);
/// Tokens last an hour; renewed well before, as the kubelet renews projected tokens.
const TOKEN_RENEWAL: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cluster(#[from] localcluster::Error),
    #[error(transparent)]
    Argo(#[from] argo::Error),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Runs the try-out until Ctrl-C or SIGTERM; keeps its files in `dir` if given.
pub async fn run(dir: Option<PathBuf>) -> Result<(), Error> {
    let mut interrupt = signal(SignalKind::interrupt()).map_err(localcluster::Error::Signal)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(localcluster::Error::Signal)?;
    let started = Instant::now();
    // The clients the user will run, built (once) before anything starts.
    let tools = tokio::task::spawn_blocking(|| -> Result<_, BuildError> {
        let helm = build_tool("tools/helm/build.sh", &[])?;
        let argo = build_tool("tools/argo/build.sh", &["cli"])?;
        Ok([helm, argo.parent().map(Path::to_owned).unwrap_or_default()])
    })
    .await
    .expect("the build thread does not panic")?;
    let options = Options {
        scheduling: true,
        ..Default::default()
    };
    let start = async {
        let cluster = match dir {
            Some(dir) => LocalCluster::start_in(options, dir).await?,
            None => LocalCluster::start(options).await?,
        };
        let argo = ArgoController::start(&cluster, &argo::Options::default()).await?;
        Ok::<_, Error>((cluster, argo))
    };
    let (cluster, argo) = tokio::select! {
        started = start => started?,
        _ = interrupt.recv() => return Ok(()),
        _ = terminate.recv() => return Ok(()),
    };
    let _outcomes = Outcomes::start(
        Api::all(cluster.admin_client()),
        Arc::new(|workflow, node| {
            (node.strip_prefix(workflow)).is_some_and(|rest| rest.contains(FLAKY))
        }),
    );
    let argo_api = free_port()?;
    let rewind = std::env::current_exe().map_err(io_error("finding", "this binary"))?;
    let bin = |path: &Path| path.display().to_string();
    let path = [
        Binaries::locate(None)?.dir().to_owned(),
        tools[0].clone(),
        tools[1].clone(),
        rewind.parent().map(Path::to_owned).unwrap_or_default(),
    ];
    let mut kubelet = StandIn::new(&cluster, rewind, argo_api)?;
    println!(
        "Local control plane ready in {:.1?} at {}, with Argo's workflow-controller v4.1.4.",
        started.elapsed(),
        cluster.server_url()
    );
    println!("Its pods run on fake nodes (kwok): those of a node named {FLAKY}* fail once.");
    println!(
        "The chart's rewind Deployment, once installed, runs here as a process; Argo's \
         retry API at https://127.0.0.1:{argo_api}."
    );
    println!("Files and logs: {}", cluster.dir().display());
    println!();
    println!(
        "export KUBECONFIG={}",
        bin(&cluster.kubeconfig_path(Role::Admin))
    );
    println!(
        "export PATH={}:$PATH",
        path.iter().map(|p| bin(p)).collect::<Vec<_>>().join(":")
    );
    println!(
        "export ARGO_SERVER=127.0.0.1:{argo_api} ARGO_HTTP1=true ARGO_SECURE=true \
         ARGO_INSECURE_SKIP_VERIFY=true"
    );
    println!();
    println!("Then follow README.md, \"Try it on your machine\". Press Ctrl-C to stop.");

    let mut tick = tokio::time::interval(SYNC);
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = tick.tick() => kubelet.sync(&cluster).await,
        }
    }
    println!("Stopping...");
    kubelet.stop_all().await;
    argo.stop().await?;
    cluster.stop().await?;
    Ok(())
}

/// The chart's Deployments run here, one process each (a Deployment's replicas share one
/// process: leader election needs no second one to work).
struct StandIn {
    dir: PathBuf,
    /// This binary, which the Deployment's container runs here.
    rewind: PathBuf,
    /// Given to the first Deployment's Argo retry API.
    argo_api: u16,
    running: BTreeMap<(String, String), Running>,
    /// When a Deployment's process last exited, so it is started again after [`BACKOFF`].
    exited: BTreeMap<(String, String), Instant>,
    /// The last error said of a Deployment, so a repeated one is said once.
    said: BTreeMap<(String, String), String>,
}

struct Running {
    generation: i64,
    child: Child,
    log: PathBuf,
    service_account: String,
    token_renewed: Instant,
}

impl StandIn {
    fn new(cluster: &LocalCluster, rewind: PathBuf, argo_api: u16) -> Result<Self, Error> {
        let dir = cluster.dir().join("try");
        std::fs::create_dir_all(&dir).map_err(io_error("creating", &dir))?;
        Ok(StandIn {
            dir,
            rewind,
            argo_api,
            running: BTreeMap::new(),
            exited: BTreeMap::new(),
            said: BTreeMap::new(),
        })
    }

    /// Starts a process for each new Deployment, restarts one whose pod template changed
    /// (`helm upgrade`) or whose process exited, stops one whose Deployment is gone or
    /// scaled to 0, and renews tokens.
    async fn sync(&mut self, cluster: &LocalCluster) {
        let deployments = Api::<Deployment>::all(cluster.admin_client());
        let listed = match deployments
            .list(&ListParams::default().labels(CHART_SELECTOR))
            .await
        {
            Ok(list) => list.items,
            Err(error) => {
                self.say(("", ""), format!("listing Deployments: {error}"));
                return;
            }
        };
        let wanted: BTreeMap<_, _> = (listed.iter())
            .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) != Some(0))
            .map(|d| {
                let key = (d.namespace().unwrap_or_default(), d.name_any());
                (key, d.metadata.generation.unwrap_or_default())
            })
            .collect();
        let keys: Vec<_> = self.running.keys().cloned().collect();
        for key in keys {
            let exited = self
                .running
                .get_mut(&key)
                .and_then(|r| r.child.try_wait().ok().flatten());
            if let Some(status) = exited {
                let running = self.running.remove(&key).expect("listed above");
                println!(
                    "{}/{} exited ({status}); its log: {}; starting it again in {BACKOFF:?}",
                    key.0,
                    key.1,
                    running.log.display()
                );
                self.exited.insert(key, Instant::now());
            } else if wanted.get(&key) != self.running.get(&key).map(|r| &r.generation) {
                let running = self.running.remove(&key).expect("listed above");
                stop(running).await;
                println!("{}/{} stopped", key.0, key.1);
            }
        }
        for (key, generation) in wanted {
            if self.running.contains_key(&key)
                || (self.exited.get(&key)).is_some_and(|at| at.elapsed() < BACKOFF)
            {
                continue;
            }
            match self.start(cluster, &key, generation).await {
                Ok(running) => {
                    self.exited.remove(&key);
                    self.said.remove(&key);
                    self.running.insert(key, running);
                }
                Err(error) => self.say((&key.0, &key.1), error.to_string()),
            }
        }
        for (key, running) in &mut self.running {
            if running.token_renewed.elapsed() > TOKEN_RENEWAL {
                let renewed =
                    kubelet::refresh_token(cluster, &key.0, &running.service_account, &self.dir)
                        .await;
                match renewed {
                    Ok(_) => running.token_renewed = Instant::now(),
                    Err(error) => println!("{}/{}: renewing its token: {error}", key.0, key.1),
                }
            }
        }
    }

    async fn start(
        &self,
        cluster: &LocalCluster,
        (namespace, name): &(String, String),
        generation: i64,
    ) -> Result<Running, kubelet::Error> {
        let dir = self.dir.join(format!("{namespace}-{name}"));
        let mut deployed = Deployed::read(cluster, namespace, name, &dir).await?;
        // The port printed at the start, for the first Deployment running.
        let api = (deployed.arg("--argo-api-addr").is_some() && self.running.is_empty())
            .then_some(self.argo_api);
        if let Some(port) = api {
            deployed.listen("--argo-api-addr", &format!("127.0.0.1:{port}"));
        }
        let http = free_port()?;
        deployed.listen("--http-addr", &format!("127.0.0.1:{http}"));
        let kubeconfig = kubelet::service_account_kubeconfig(
            cluster,
            namespace,
            &deployed.service_account,
            &self.dir,
        )
        .await?;
        let log = self.dir.join(format!("{namespace}-{name}.log"));
        let out = std::fs::File::create(&log).map_err(io_error("creating", &log))?;
        let err = out.try_clone().map_err(io_error("opening", &log))?;
        let mut command = deployed.command(&self.rewind, &format!("{name}-0"), &kubeconfig)?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = spawn_tied(&mut command).map_err(io_error("starting", &self.rewind))?;
        let api = match api {
            Some(port) => format!("Argo's retry API at https://127.0.0.1:{port}, "),
            None => String::new(),
        };
        println!(
            "{namespace}/{name} runs here (pid {}): {api}metrics at \
             http://127.0.0.1:{http}/metrics, its log: {}",
            child.id(),
            log.display()
        );
        Ok(Running {
            generation,
            child,
            log,
            service_account: deployed.service_account.clone(),
            token_renewed: Instant::now(),
        })
    }

    fn say(&mut self, (namespace, name): (&str, &str), message: String) {
        let key = (namespace.to_owned(), name.to_owned());
        if self.said.get(&key) != Some(&message) {
            println!("{namespace}/{name}: {message} (trying again)");
            self.said.insert(key, message);
        }
    }

    async fn stop_all(&mut self) {
        for (_, running) in std::mem::take(&mut self.running) {
            stop(running).await;
        }
    }
}

/// SIGTERM, as the kubelet stops a pod; SIGKILL if it has not exited 10 s later.
async fn stop(running: Running) {
    tokio::task::spawn_blocking(move || argo::stop(running.child))
        .await
        .expect("the stop thread does not panic");
}
