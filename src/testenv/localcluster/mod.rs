//! A real local control plane on 127.0.0.1 for tests and the demo: etcd and kube-apiserver,
//! plus kube-controller-manager, kube-scheduler and kwok (fake nodes) when pods must run.
//!
//! The API server has RBAC on, an admin (system:masters) and an unprivileged user
//! ([`USER_NAME`]) with a kubeconfig each, and Argo's Workflow CRDs installed. The test
//! fixture and `rewind local-cluster` ([`run_until_signal`]) both start it through
//! [`LocalCluster::start`]. Stopping (or dropping) it ends every process and removes its
//! directory; a process that outlives us is killed by the kernel.

mod binaries;
mod certs;
mod cli;
mod components;
mod crds;
mod error;
mod kubeconfig;
mod kwok;
mod layout;
mod ports;
mod process;
mod rbac;
mod readiness;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::testenv::io_error;

pub use binaries::{BIN_DIR_ENV, Binaries};
pub use cli::run_until_signal;
pub use components::Component;
pub use error::Error;
pub use kubeconfig::{ADMIN_NAME, CONTROLLER_NAME, USER_NAME};
pub use kwok::{NODE_COUNT, NODE_LABEL_SELECTOR};
pub use rbac::{controller_cluster_role, service_account_token};

use kubeconfig::Credential;
use layout::Layout;
use ports::Ports;
use process::Processes;
use readiness::{Deadline, wait_for};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Also run kube-controller-manager, kube-scheduler and kwok with [`NODE_COUNT`] fake
    /// nodes, so pods get scheduled and "run".
    pub scheduling: bool,
    /// Write an audit log of every request (JSON lines, Metadata level, one line per
    /// request) to [`LocalCluster::audit_log_path`].
    pub audit: bool,
    /// The API server's port; by default a free one.
    pub api_port: Option<u16>,
    /// Where the binaries are; by default $REWIND_BIN_DIR, else tools/controlplane/build.sh's output.
    pub bin_dir: Option<PathBuf>,
    /// Extra kube-apiserver flags, last so they win (e.g. `--max-requests-inflight=20`).
    pub extra_apiserver_args: Vec<String>,
    /// How long starting may take, binaries already built.
    pub startup_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            scheduling: false,
            audit: false,
            api_port: None,
            bin_dir: None,
            extra_apiserver_args: Vec::new(),
            startup_timeout: Duration::from_secs(90),
        }
    }
}

/// Whose credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// In system:masters: allowed everything.
    Admin,
    /// [`USER_NAME`], in no special group: allowed only what RBAC grants it.
    User,
    /// [`CONTROLLER_NAME`]: allowed what the controller's ClusterRole grants.
    Controller,
}

/// A running local control plane. Stop it with [`LocalCluster::stop`]; dropping it stops it too.
pub struct LocalCluster {
    // Fields drop in order: the processes stop (see `Processes`' Drop), then the directory goes.
    processes: Processes,
    layout: Layout,
    server_url: String,
    admin: kube::Client,
    user: kube::Client,
    audit: bool,
}

impl LocalCluster {
    /// Starts a cluster in a fresh temporary directory and waits until it is usable.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("rewind-cluster-")
            .tempdir()
            .map_err(io_error(
                "creating a temporary directory in",
                std::env::temp_dir(),
            ))?
            .keep();
        Self::start_at(options, dir).await
    }

    /// Starts a cluster whose files live in `dir`, which must be empty or missing; it is
    /// removed when the cluster stops.
    pub async fn start_in(options: Options, dir: PathBuf) -> Result<Self, Error> {
        fs::create_dir_all(&dir).map_err(io_error("creating", &dir))?;
        let mut entries = fs::read_dir(&dir).map_err(io_error("reading", &dir))?;
        if entries.next().is_some() {
            return Err(Error::DirNotEmpty(dir));
        }
        let dir = dir.canonicalize().map_err(io_error("resolving", &dir))?;
        Self::start_at(options, dir).await
    }

    async fn start_at(options: Options, dir: PathBuf) -> Result<Self, Error> {
        // Owned from here on: any early return or cancellation removes the directory.
        let layout = Layout::new(dir);
        let (binaries, ports, admin, user) = prepare(&options, &layout).await?;
        // Counted from here: a cold build of the binaries may take far longer than startup.
        let deadline = Deadline::new(options.startup_timeout);
        let mut cluster = LocalCluster {
            processes: Processes::new()?,
            server_url: format!("https://127.0.0.1:{}", ports.api),
            layout,
            admin,
            user,
            audit: options.audit,
        };
        // On error `cluster` is dropped, which stops what did start and removes the directory.
        cluster.boot(&options, &binaries, &ports, deadline).await?;
        tracing::info!(server = %cluster.server_url, dir = %cluster.dir().display(), elapsed = ?deadline.elapsed(), "local control plane ready");
        Ok(cluster)
    }

    async fn boot(
        &mut self,
        options: &Options,
        binaries: &Binaries,
        ports: &Ports,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.spawn(Component::Etcd, binaries, ports, options)?;
        self.spawn(Component::ApiServer, binaries, ports, options)?;
        let admin = self.admin.clone();
        wait_for(
            "the API server's /readyz",
            Component::ApiServer,
            deadline,
            &mut self.processes,
            &self.layout,
            || readiness::api_ready(&admin),
        )
        .await?;

        if options.scheduling {
            for component in [
                Component::ControllerManager,
                Component::Scheduler,
                Component::Kwok,
            ] {
                self.spawn(component, binaries, ports, options)?;
            }
            let nodes: Api<Node> = Api::all(admin.clone());
            for node in kwok::fake_nodes() {
                let name = node.metadata.name.clone().unwrap_or_default();
                nodes
                    .create(&PostParams::default(), &node)
                    .await
                    .map_err(Error::kube(format!("creating fake node {name}")))?;
            }
        }

        let crds = crds::argo()?;
        crds::install(&admin, &crds).await?;
        rbac::install_controller(&admin).await?;
        let names: Vec<String> = crds
            .iter()
            .filter_map(|crd| crd.metadata.name.clone())
            .collect();
        wait_for(
            "Argo's CRDs to be Established",
            Component::ApiServer,
            deadline,
            &mut self.processes,
            &self.layout,
            || crds::established(&admin, &names),
        )
        .await?;

        if options.scheduling {
            wait_for(
                "the default ServiceAccount (made by the controller manager)",
                Component::ControllerManager,
                deadline,
                &mut self.processes,
                &self.layout,
                || readiness::default_service_account(&admin),
            )
            .await?;
            wait_for(
                "kwok's fake nodes to be Ready",
                Component::Kwok,
                deadline,
                &mut self.processes,
                &self.layout,
                || readiness::nodes_ready(&admin, NODE_COUNT),
            )
            .await?;
        }
        Ok(())
    }

    fn spawn(
        &mut self,
        component: Component,
        binaries: &Binaries,
        ports: &Ports,
        options: &Options,
    ) -> Result<(), Error> {
        let mut command = Command::new(binaries.path(component)?);
        command.args(components::args(component, &self.layout, ports, options));
        if component == Component::Kwok {
            command.env("HOME", self.layout.kwok_home());
        }
        self.processes
            .start(component, command, self.layout.log(component))
    }

    /// A client acting as the admin (system:masters).
    pub fn admin_client(&self) -> kube::Client {
        self.admin.clone()
    }

    /// A client acting as [`USER_NAME`], who may do only what RBAC grants.
    pub fn user_client(&self) -> kube::Client {
        self.user.clone()
    }

    /// The client configuration a user of `role`'s kubeconfig gets.
    pub async fn config(&self, role: Role) -> Result<kube::Config, Error> {
        config(&self.layout.kubeconfig(role)).await
    }

    pub fn kubeconfig_path(&self, role: Role) -> PathBuf {
        self.layout.kubeconfig(role)
    }

    /// The directory holding the cluster's files (kubeconfigs, certificates, logs, etcd data).
    pub fn dir(&self) -> &Path {
        self.layout.root()
    }

    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The CA certificate (PEM) every client of the cluster trusts.
    pub fn ca_cert_path(&self) -> PathBuf {
        self.layout.ca_cert()
    }

    /// The API server's serving certificate and key (PEM), valid for 127.0.0.1: what a
    /// proxy in front of it presents so clients that trust the CA accept it.
    pub fn serving_cert_paths(&self) -> (PathBuf, PathBuf) {
        (self.layout.serving_cert(), self.layout.serving_key())
    }

    /// The API server's audit log, if [`Options::audit`] was set: one JSON object per line
    /// (audit.k8s.io/v1 Event at stage ResponseComplete, or ResponseStarted for watches).
    pub fn audit_log_path(&self) -> Option<PathBuf> {
        self.audit.then(|| self.layout.audit_log())
    }

    /// A component's log file.
    pub fn log_path(&self, component: Component) -> PathBuf {
        self.layout.log(component)
    }

    /// The process id of each running component.
    pub fn pids(&self) -> Vec<(Component, u32)> {
        self.processes.pids()
    }

    /// Creates a namespace with its `default` ServiceAccount, which pods need to be
    /// admitted, without waiting for kube-controller-manager (which may not run).
    pub async fn create_namespace(&self, name: &str) -> Result<(), Error> {
        let namespaces: Api<Namespace> = Api::all(self.admin.clone());
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        };
        namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata,
                    ..Default::default()
                },
            )
            .await
            .map_err(Error::kube(format!("creating namespace {name}")))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), name);
        let metadata = ObjectMeta {
            name: Some("default".to_owned()),
            ..Default::default()
        };
        match accounts
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata,
                    ..Default::default()
                },
            )
            .await
        {
            // The controller manager's service-account controller may have been first.
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(source) => Err(Error::Kube {
                action: format!("creating ServiceAccount {name}/default"),
                source,
            }),
        }
    }

    /// Stops every process (SIGTERM, SIGKILL after a grace period), waits for them and
    /// removes the cluster's directory.
    pub async fn stop(mut self) -> Result<(), Error> {
        let shutdown = tokio::task::spawn_blocking(move || self.shutdown());
        shutdown
            .await
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        self.processes.stop_all(process::STOP_GRACE);
        let root = self.layout.root();
        Ok(self.layout.remove().map_err(io_error("removing", root))?)
    }
}

/// Everything before the first process starts: binaries, ports and the cluster's files.
async fn prepare(
    options: &Options,
    layout: &Layout,
) -> Result<(Binaries, Ports, kube::Client, kube::Client), Error> {
    let bin_dir = options.bin_dir.clone();
    // Blocking: it may run build.sh.
    let binaries = tokio::task::spawn_blocking(move || Binaries::locate(bin_dir.as_deref()))
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))?;
    for component in Component::needed(options) {
        binaries.path(component)?;
    }
    let ports = ports::reserve(options.api_port)?;
    let server_url = format!("https://127.0.0.1:{}", ports.api);

    for dir in [layout.logs(), layout.kwok_home()] {
        fs::create_dir_all(&dir).map_err(io_error("creating", &dir))?;
    }
    let pki = certs::generate()?;
    let admin = Credential::random(Role::Admin)?;
    let user = Credential::random(Role::User)?;
    let controller = Credential::random(Role::Controller)?;
    let files = [
        (layout.ca_cert(), pki.ca_cert),
        (layout.serving_cert(), pki.serving_cert),
        (layout.serving_key(), pki.serving_key),
        (layout.service_account_key(), pki.service_account_key),
        (
            layout.service_account_public_key(),
            pki.service_account_public_key,
        ),
        (
            layout.token_file(),
            kubeconfig::token_file(&[&admin, &user, &controller]),
        ),
        (layout.audit_policy(), components::AUDIT_POLICY.to_owned()),
        (layout.kwok_config(), kwok::STAGES.to_owned()),
        (
            layout.kubeconfig(Role::Admin),
            kubeconfig::render(&server_url, &layout.ca_cert(), &admin),
        ),
        (
            layout.kubeconfig(Role::User),
            kubeconfig::render(&server_url, &layout.ca_cert(), &user),
        ),
        (
            layout.kubeconfig(Role::Controller),
            kubeconfig::render(&server_url, &layout.ca_cert(), &controller),
        ),
    ];
    for (path, contents) in files {
        write_private(&path, &contents)?;
    }
    let admin_client = client(&layout.kubeconfig(Role::Admin)).await?;
    let user_client = client(&layout.kubeconfig(Role::User)).await?;
    Ok((binaries, ports, admin_client, user_client))
}

async fn config(path: &Path) -> Result<kube::Config, Error> {
    let kubeconfig_error = |source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_error)
}

/// Writes a file only its owner can read: it may hold a key or a token.
fn write_private(path: &Path, contents: &str) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_error("creating", path))?;
    file.write_all(contents.as_bytes())
        .map_err(io_error("writing", path))?;
    Ok(())
}

/// A client built from a kubeconfig file, exactly as a user of that file would get.
async fn client(path: &Path) -> Result<kube::Client, Error> {
    kube::Client::try_from(config(path).await?).map_err(Error::kube(format!(
        "building a client from {}",
        path.display()
    )))
}
