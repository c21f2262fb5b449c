//! The controller: wires the watches (workflows and WorkflowRetry objects),
//! the workflow archive, the queue, the delete workers, the API
//! budget, garbage collection and the HTTP endpoints together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::archived::ArgoDatabase;
use crate::budget::{self, Budget, BudgetConfig};
use crate::metrics::Metrics;
use crate::queue::{QueueConfig, WorkQueue};
use crate::retry::{self, RetryConfig};
use crate::watch::{self, Scope, State};
use crate::workers::{self, Outcomes};

/// Everything the controller can be told.
#[derive(Clone, Debug)]
pub struct Options {
    pub scope: Scope,
    pub budget: BudgetConfig,
    /// Delete workers (each sends one request at a time).
    pub workers: usize,
    pub queue: QueueConfig,
    pub retry: RetryConfig,
    /// Sweep for orphan pods this often; `None` turns garbage collection off.
    pub pod_gc: Option<Duration>,
    /// Where to serve /healthz, /readyz and /metrics; `None` serves nothing.
    pub http_addr: Option<SocketAddr>,
    /// Names this controller in Events (`reportingController`).
    pub reporter: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            scope: Scope::default(),
            budget: BudgetConfig::default(),
            workers: BudgetConfig::default().workers.get(),
            queue: QueueConfig::default(),
            retry: RetryConfig::default(),
            pod_gc: None,
            http_addr: None,
            reporter: "rewind".into(),
        }
    }
}

/// A configured controller; [`Controller::run`] starts it.
pub struct Controller {
    options: Options,
    budget: Budget,
    ctx: retry::Context,
    state: State,
}

impl Controller {
    /// Builds the budgeted client. Must be called inside a tokio runtime.
    pub fn new(config: kube::Config, options: Options) -> Result<Self, kube::Error> {
        let metrics = Arc::new(Metrics::default());
        let budget = Budget::with_observer(&options.budget, metrics.clone());
        let client = budget::client(config, &budget)?;
        let reporter = Reporter {
            controller: options.reporter.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let ctx = retry::Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            queue: WorkQueue::new(options.queue),
            outcomes: Outcomes::default(),
            config: options.retry.clone(),
            metrics,
            database: None,
        };
        Ok(Controller {
            options,
            budget,
            ctx,
            state: State::default(),
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
    /// in their annotations and resume at the next start.
    pub async fn run(self, shutdown: CancellationToken) -> std::io::Result<()> {
        let Controller {
            options,
            budget,
            ctx,
            state,
        } = self;
        let mut tasks = tokio::task::JoinSet::new();
        let turn = workers::Turn::default();
        for _ in 0..options.workers.max(1) {
            tasks.spawn(workers::run(
                ctx.client.clone(),
                budget.clone(),
                turn.clone(),
                ctx.queue.clone(),
                ctx.outcomes.clone(),
            ));
        }
        if let Some(interval) = options.pod_gc {
            tasks.spawn(crate::gc::run(
                ctx.client.clone(),
                options.scope.namespaces.clone(),
                ctx.queue.clone(),
                ctx.outcomes.clone(),
                interval,
                shutdown.clone(),
            ));
        }
        let server = match options.http_addr {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await?;
                info!(addr = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
                let endpoints = crate::server::Endpoints {
                    state: state.clone(),
                    metrics: ctx.metrics.clone(),
                    queue: ctx.queue.clone(),
                };
                Some(tokio::spawn(crate::server::serve(
                    listener,
                    endpoints,
                    shutdown.clone(),
                )))
            }
            None => None,
        };
        let queue = ctx.queue.clone();
        watch::run(ctx, options.scope, state, shutdown.clone()).await;
        queue.shutdown();
        while tasks.join_next().await.is_some() {}
        if let Some(server) = server {
            server.await.expect("the HTTP server does not panic")?;
        }
        Ok(())
    }
}
