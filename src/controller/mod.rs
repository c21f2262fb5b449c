//! The controller: wires the watches (workflows and WorkflowRetry objects),
//! the workflow archive, the queue, the delete workers, the API
//! budget, garbage collection, the HTTP endpoints and Argo's retry API
//! together.

pub mod argo_config;
pub mod dispatch;
pub mod expiry;
pub mod gc;
pub mod http;
pub mod leader;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::api::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::argo::db::ArgoDatabase;
use crate::argo::workflow::Workflow;
use crate::argoapi::{self, ArgoApi};
use crate::controller::leader::{LeaderError, LeaseConfig, Role};
use crate::controller::watch::State;
use crate::engine::budget::{self, Budget, BudgetConfig};
use crate::engine::queue::{QueueConfig, WorkQueue};
use crate::engine::workers::{self, Outcomes};
use crate::engine::{Engine, drive};
use crate::retry::admission::Admission;
use crate::retry::cache::WorkflowCache;
use crate::retry::{Context, RetryConfig, Scope};
use crate::telemetry::metrics::{ContainerLimits, Metrics};

/// Everything the controller can be told.
#[derive(Clone, Debug)]
pub struct Options {
    pub scope: Scope,
    pub budget: BudgetConfig,
    /// Delete workers (each sends one request at a time).
    pub workers: usize,
    /// DeleteCollections in flight at once, across requests (raised to the
    /// retries' `bulk_parallelism` where below it, so one bulk delete's parts
    /// still go side by side).
    pub max_bulk_in_flight: usize,
    pub queue: QueueConfig,
    pub retry: RetryConfig,
    /// Sweep for orphan pods this often; `None` turns garbage collection off.
    pub pod_gc: Option<Duration>,
    /// Where to serve /healthz, /readyz and /metrics; `None` serves nothing.
    pub http_addr: Option<SocketAddr>,
    /// Names this controller in Events (`reportingController`).
    pub reporter: String,
    /// Work only while holding this lease; `None` works at once, alone.
    pub leader_election: Option<LeaseConfig>,
    /// Argo's workflow-controller ConfigMap (NAMESPACE/NAME), read for Argo's
    /// database before work starts, unless [`Controller::with_database`] gave one.
    pub argo_configmap: Option<String>,
    /// Serve the Argo Server's retry calls here; `None` serves none.
    pub argo_api: Option<ArgoApiOptions>,
    /// The container's limits, exported beside the process's own use.
    pub limits: ContainerLimits,
}

/// Where and how to serve the Argo Server's retry calls (see [`argoapi`]).
#[derive(Clone, Debug)]
pub struct ArgoApiOptions {
    pub addr: SocketAddr,
    pub settings: argoapi::Settings,
}

/// Why the controller stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("serving HTTP on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Leader(#[from] LeaderError),
    #[error("serving Argo's retry API on {addr}: {source}")]
    ArgoApi {
        addr: SocketAddr,
        #[source]
        source: argoapi::SettingsError,
    },
}

impl Default for Options {
    fn default() -> Self {
        Options {
            scope: Scope::default(),
            budget: BudgetConfig::default(),
            workers: BudgetConfig::default().workers.get(),
            max_bulk_in_flight: workers::DEFAULT_MAX_BULK_IN_FLIGHT,
            queue: QueueConfig::default(),
            retry: RetryConfig::default(),
            pod_gc: None,
            http_addr: None,
            reporter: "rewind".into(),
            leader_election: None,
            argo_configmap: None,
            argo_api: None,
            limits: ContainerLimits::default(),
        }
    }
}

/// A configured controller; [`Controller::run`] starts it.
pub struct Controller {
    options: Options,
    budget: Budget,
    ctx: Context,
    /// The delete workers' client (see [`workers::delete_client`]).
    delete_client: kube::Client,
    /// What the workflow watches fill `ctx.workflows` with, one per watch.
    writers: Vec<Writer<PartialObjectMeta<Workflow>>>,
    state: State,
    /// The lease's own client: outside the budget (renewals never wait for
    /// pod deletions) and with short timeouts (fencing, see `leader`).
    lease_client: Option<kube::Client>,
    /// The Argo API's client for reviews of its callers: outside the
    /// budget, so calls anyone can make never take pod deletions' tokens
    /// (the reviews have a budget of their own, `argoapi::review`).
    review_client: Option<kube::Client>,
}

impl Controller {
    /// Builds the budgeted client. Must be called inside a tokio runtime.
    pub fn new(config: kube::Config, options: Options) -> Result<Self, kube::Error> {
        let pod_name = std::env::var("POD_NAME").ok();
        // The Lease's name for this replica, which is also what the leader's
        // series tell apart.
        let identity = match &options.leader_election {
            Some(lease) => lease.identity.clone(),
            None => pod_name.clone().unwrap_or_else(|| options.reporter.clone()),
        };
        let metrics = Arc::new(Metrics::new(&identity, &options.budget, options.limits));
        let lease_client = match &options.leader_election {
            Some(lease) => {
                let mut config = config.clone();
                config.connect_timeout = Some(lease.request_timeout());
                config.read_timeout = Some(lease.request_timeout());
                config.write_timeout = Some(lease.request_timeout());
                Some(kube::Client::try_from(config)?)
            }
            None => None,
        };
        let review_client = match &options.argo_api {
            Some(_) => {
                let mut config = config.clone();
                config.connect_timeout = Some(argoapi::review::TIMEOUT);
                config.read_timeout = Some(argoapi::review::TIMEOUT);
                config.write_timeout = Some(argoapi::review::TIMEOUT);
                Some(kube::Client::try_from(config)?)
            }
            None => None,
        };
        let budget = Budget::with_observer(&options.budget, metrics.clone());
        let delete_client = workers::delete_client(config.clone(), &budget)?;
        let client = budget::client(config, &budget)?;
        let reporter = Reporter {
            controller: options.reporter.clone(),
            instance: pod_name,
        };
        let (workflows, writers) = WorkflowCache::new(options.scope.namespaces.len().max(1));
        let ctx = Context {
            workflows,
            admission: Admission::new(options.retry.max_pods_in_flight),
            progress: Default::default(),
            recorder: crate::retry::recorder::Recorder::new(client.clone(), reporter),
            engine: Engine {
                client,
                queue: WorkQueue::new(options.queue),
                outcomes: Outcomes::default(),
                observer: metrics.clone(),
            },
            config: options.retry.clone(),
            scope: options.scope.clone(),
            metrics,
            database: None,
        };
        Ok(Controller {
            options,
            budget,
            ctx,
            delete_client,
            writers,
            state: State::default(),
            lease_client,
            review_client,
        })
    }

    /// Uses Argo's database: archived retries (WorkflowRetry
    /// `archivedWorkflowUID`) and offloaded node status. Without it, those
    /// requests fail with a message saying so.
    pub fn with_database(mut self, database: Arc<dyn ArgoDatabase>) -> Self {
        self.ctx.database = Some(database);
        self
    }

    /// The metrics this controller updates (for the demo's report).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.ctx.metrics.clone()
    }

    /// True once the workflow cache has synced.
    pub fn state(&self) -> State {
        self.state.clone()
    }

    /// Runs until `shutdown` is cancelled. Requests in progress stay pending
    /// in their annotations and resume at the next start. With leader
    /// election, it stands by (ready) until it holds the lease, works while it
    /// holds it, releases it at shutdown, and returns an error as soon as it
    /// can no longer renew it.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let role = match self.options.leader_election {
            Some(_) => Role::standby(),
            None => Role::leader(),
        };
        self.ctx.metrics.set_leader(!role.is_standby());
        let server = match self.options.http_addr {
            Some(addr) => {
                let http = |source| RunError::Http { addr, source };
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(http)?;
                info!(addr = %listener.local_addr().map_err(http)?, "serving /healthz, /readyz and /metrics");
                let endpoints = http::Endpoints {
                    state: self.state.clone(),
                    metrics: self.ctx.metrics.clone(),
                    queue: self.ctx.engine.queue.clone(),
                    role: role.clone(),
                };
                Some((
                    addr,
                    tokio::spawn(http::serve(listener, endpoints, shutdown.clone())),
                ))
            }
            None => None,
        };
        // Every replica serves Argo's retry calls: a call only writes a
        // request and reads its progress, and the leader serves the request.
        let argo_api = match &self.options.argo_api {
            Some(options) => Some((
                options.addr,
                tokio::spawn(self.serve_argo_api(options, shutdown.clone()).await?),
            )),
            None => None,
        };
        let result = match (&self.options.leader_election, &self.lease_client) {
            (Some(lease), Some(client)) => {
                let (lease, client) = (lease.clone(), client.clone());
                match leader::acquire(&client, &lease, &role, &shutdown).await {
                    Ok(Some(leadership)) => {
                        self.ctx.metrics.set_leader(true);
                        // Work stops at shutdown or as soon as the lease
                        // cannot be renewed; at shutdown the lease is
                        // released once the work has stopped.
                        let work = shutdown.child_token();
                        let worked = CancellationToken::new();
                        let (stop_working, until) = (work.clone(), worked.clone());
                        let metrics = self.ctx.metrics.clone();
                        let holding = tokio::spawn(async move {
                            let held = leadership.hold(until).await;
                            metrics.set_leader(false);
                            stop_working.cancel();
                            held
                        });
                        self.work(work).await;
                        worked.cancel();
                        holding.await.expect("holding the lease does not panic")
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            _ => {
                self.work(shutdown.clone()).await;
                Ok(())
            }
        };
        // After a lost lease the caller has not asked to stop; the process
        // ends, so stop serving too.
        shutdown.cancel();
        for (addr, server) in server.into_iter().chain(argo_api) {
            server
                .await
                .expect("the HTTP servers do not panic")
                .map_err(|source| RunError::Http { addr, source })?;
        }
        Ok(result?)
    }

    /// Binds Argo's retry API and loads its certificate: a listener that
    /// cannot serve stops the controller at start, saying why.
    async fn serve_argo_api(
        &self,
        options: &ArgoApiOptions,
        shutdown: CancellationToken,
    ) -> Result<impl Future<Output = std::io::Result<()>> + use<>, RunError> {
        let addr = options.addr;
        let settings = |source| RunError::ArgoApi { addr, source };
        let review_client = self
            .review_client
            .clone()
            .expect("a review client is built when the Argo API is served");
        let api =
            ArgoApi::new(self.ctx.client(), review_client, &options.settings).map_err(settings)?;
        let tls = match &options.settings.tls {
            Some(files) => {
                Some(argoapi::tls::server_config(files).map_err(|e| settings(e.into()))?)
            }
            None => None,
        };
        let http = |source| RunError::Http { addr, source };
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(http)?;
        info!(
            addr = %listener.local_addr().map_err(http)?,
            tls = tls.is_some(),
            "serving Argo's retry API (PUT /api/v1/workflows/{{namespace}}/{{name}}/retry, PUT /api/v1/archived-workflows/{{uid}}/retry)"
        );
        Ok(argoapi::serve(listener, tls, api, shutdown))
    }

    /// Watches and works until `shutdown` is cancelled.
    async fn work(self, shutdown: CancellationToken) {
        let Controller {
            options,
            budget,
            mut ctx,
            delete_client,
            writers,
            state,
            ..
        } = self;
        if ctx.database.is_none()
            && let Some(configmap) = &options.argo_configmap
        {
            let max_row_size = ctx.config.max_nodes_size;
            ctx.database =
                argo_config::database(&ctx.client(), configmap, max_row_size, &shutdown).await;
        }
        let engine = ctx.engine.clone();
        let clients = workers::Clients {
            client: engine.client.clone(),
            delete: delete_client,
            bulk_slots: workers::BulkSlots::new(
                options
                    .max_bulk_in_flight
                    .max(options.retry.bulk_parallelism),
            ),
        };
        let mut tasks = tokio::task::JoinSet::new();
        // Every send stops the moment work does (a lost Lease, a shutdown),
        // not as each request's task withdraws its work: the workers' gate
        // refuses whatever a shut queue holds (rule 3's Lease).
        let stop_sends = tasks.spawn(engine.queue.shut_down_when(shutdown.clone()));
        let turn = workers::Turn::default();
        for _ in 0..options.workers.max(1) {
            tasks.spawn(workers::run(
                clients.clone(),
                budget.clone(),
                turn.clone(),
                engine.queue.clone(),
                engine.outcomes.clone(),
                engine.observer.clone(),
            ));
        }
        if let Some(interval) = options.pod_gc {
            tasks.spawn(gc::run(
                engine.clone(),
                options.scope.clone(),
                interval,
                shutdown.clone(),
            ));
        }
        // Counted from the stop itself, not from the requests' end: the pod's
        // grace period runs from its SIGTERM.
        let shutdown_at = shutdown.clone();
        let mut leave_by = tokio::spawn(async move {
            shutdown_at.cancelled().await;
            tokio::time::sleep(drive::LEAVING_WAIT).await;
        });
        watch::run(ctx, writers, state, shutdown.clone()).await;
        // A watch can also end on its own, `shutdown` not cancelled: the
        // workers end with the queue all the same.
        engine.queue.shutdown();
        stop_sends.abort();
        tokio::select! {
            _ = async { while tasks.join_next().await.is_some() {} } => {}
            _ = &mut leave_by => {
                warn!("stopping with deletes still under way; they may still land, and the next leader lists their pods again");
                tasks.shutdown().await;
            }
        }
        leave_by.abort();
    }
}
