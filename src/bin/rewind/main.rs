use std::io::Read;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use rewind::argo::plan::compress::{
    Algorithm, Compression, DEFAULT_MAX_NODES_SIZE, DEFAULT_MAX_WORKFLOW_SIZE, GzipImplementation,
};
use rewind::argo::plan::{ArgoVersion, RetryOptions};
use rewind::argo::workflow::Workflow;
use rewind::argoapi::auth::{Account, AuthMode};
use rewind::argoapi::listener::Limits;
use rewind::argoapi::review::Budget as ReviewBudget;
use rewind::argoapi::tls::CertFiles;
use rewind::argoapi::{ArgoServer, Settings};
use rewind::controller::leader::LeaseConfig;
use rewind::controller::{ArgoApiOptions, Controller, Options};
use rewind::engine::budget::{BudgetConfig, Rate};
use rewind::engine::drive::OnSettleTimeout;
use rewind::engine::workers::DEFAULT_MAX_BULK_IN_FLIGHT;
use rewind::retry::admission::DEFAULT_MAX_PODS;
use rewind::retry::{DEFAULT_BULK_PARALLELISM, DEFAULT_MAX_OPEN_PER_NAMESPACE, RetryConfig, Scope};
use rewind::telemetry::logging::{self, LogFormat};
use rewind::telemetry::metrics::ContainerLimits;

mod connect;
#[cfg(feature = "testenv")]
mod demo;
mod retry;
mod status;

/// Retries failed Argo Workflows, live and archived, fast and politely.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "REWIND_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (kubeconfig rules as kubectl's, or in-cluster config).
    // Boxed: its many flags make it far larger than the other commands.
    Controller(Box<ControllerArgs>),
    /// Retry workflows as `argo retry` does, through the rewind controller, and follow the retries.
    Retry(retry::RetryArgs),
    /// Show retry requests and their progress, kubectl-style.
    Status(status::StatusArgs),
    /// Print the retry plan of a workflow, offline: what `argo retry` would reset and delete.
    Plan(PlanArgs),
    /// Print the WorkflowRetry CRD (YAML), as committed in deploy/crds/.
    Crd,
    /// Start a local control plane (etcd, kube-apiserver, ...) until Ctrl-C.
    #[cfg(feature = "testenv")]
    LocalCluster(LocalClusterArgs),
    /// Start a local control plane, create a failed workflow with many pods, retry it, report.
    #[cfg(feature = "testenv")]
    Demo(demo::DemoArgs),
}

#[derive(clap::Args)]
struct ControllerArgs {
    /// Namespace to watch (repeatable or comma-separated); all namespaces when omitted.
    #[arg(
        long = "namespace",
        short = 'n',
        env = "REWIND_NAMESPACES",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// Serve only workflows with this workflows.argoproj.io/controller-instanceid label.
    #[arg(long, env = "REWIND_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", env = "REWIND_HTTP_ADDR")]
    http_addr: SocketAddr,
    /// Argo's workflow-controller ConfigMap (NAMESPACE/NAME): its `persistence` block and the
    /// Secrets it names give Argo's database (archived workflows, offloaded nodes).
    /// Empty: no database.
    #[arg(
        long,
        default_value = "argo/workflow-controller-configmap",
        env = "REWIND_ARGO_CONFIGMAP"
    )]
    argo_configmap: String,
    /// The container's memory limit in bytes, exported as rewind_memory_limit_bytes so alerts
    /// compare the process's memory with it (the chart sets it from the downward API).
    #[arg(long, value_name = "BYTES", env = "REWIND_MEMORY_LIMIT")]
    memory_limit: Option<u64>,
    /// The container's CPU limit in millicores, exported as rewind_cpu_limit_cores (the chart
    /// sets it from the downward API).
    #[arg(long, value_name = "MILLICORES", env = "REWIND_CPU_LIMIT")]
    cpu_limit: Option<u64>,
    #[command(flatten)]
    tuning: Tuning,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    argo_api: ArgoApiArgs,
}

/// The Argo Server's retry calls, served by rewind (off unless --argo-api-addr is given).
#[derive(clap::Args)]
struct ArgoApiArgs {
    /// Serve Argo's two retry calls (PUT .../retry) on this address, for an Ingress or
    /// HTTPRoute that sends them here and everything else to argo-server.
    #[arg(long, env = "REWIND_ARGO_API_ADDR")]
    argo_api_addr: Option<SocketAddr>,
    /// PEM certificate chain to serve them with (tls.crt of a kubernetes.io/tls Secret).
    #[arg(long, env = "REWIND_ARGO_API_TLS_CERT", requires = "argo_api_tls_key")]
    argo_api_tls_cert: Option<PathBuf>,
    /// PEM private key of that certificate (tls.key).
    #[arg(long, env = "REWIND_ARGO_API_TLS_KEY", requires = "argo_api_tls_cert")]
    argo_api_tls_key: Option<PathBuf>,
    /// Serve them over plain HTTP (true, behind a proxy that terminates TLS); when false a
    /// certificate is required.
    #[arg(long, env = "REWIND_ARGO_API_PLAINTEXT", default_value_t = false, action = clap::ArgAction::Set)]
    argo_api_plaintext: bool,
    /// The auth modes of the Argo Server in front, as its auth-mode flag gives them: client, server, sso
    /// (repeatable or comma-separated).
    #[arg(
        long,
        default_value = "client",
        env = "REWIND_ARGO_API_AUTH_MODE",
        value_delimiter = ','
    )]
    argo_api_auth_mode: Vec<AuthMode>,
    /// The Argo Server's ServiceAccount (NAMESPACE/NAME): callers in server mode, and SSO
    /// callers without SSO RBAC, are authorized as it, as Argo acts as it for them.
    #[arg(long, env = "REWIND_ARGO_SERVER_SERVICE_ACCOUNT")]
    argo_server_service_account: Option<Account>,
    /// The Argo Server (e.g. https://argo-server.argo:2746), asked who an SSO caller is.
    #[arg(long, env = "REWIND_ARGO_SERVER_URL")]
    argo_server_url: Option<http::Uri>,
    /// PEM CA certificate the Argo Server's certificate is signed with.
    #[arg(long, env = "REWIND_ARGO_SERVER_CA_FILE")]
    argo_server_ca_file: Option<PathBuf>,
    /// Trust any certificate of the Argo Server (as the argo CLI does when told to skip verifying).
    #[arg(long, env = "REWIND_ARGO_SERVER_INSECURE_SKIP_VERIFY")]
    argo_server_insecure_skip_verify: bool,
    /// Whether the Argo Server's SSO RBAC is on (sso.rbac.enabled in its ConfigMap): SSO callers
    /// act as the ServiceAccount it maps them to (true) or as the Argo Server's own (false).
    /// Required with auth mode sso.
    #[arg(long, value_name = "BOOL", env = "REWIND_ARGO_API_SSO_RBAC", action = clap::ArgAction::Set)]
    argo_api_sso_rbac: Option<bool>,
    /// The Argo Server runs with SSO_DELEGATE_RBAC_TO_NAMESPACE=true: an SSO call on another
    /// namespace than the Argo Server's acts as that namespace's ServiceAccount whose rbac-rule
    /// matches the user, when its precedence is above the login account's.
    #[arg(long, env = "REWIND_ARGO_API_SSO_DELEGATE_RBAC_TO_NAMESPACE")]
    argo_api_sso_delegate_rbac_to_namespace: bool,
    #[command(flatten)]
    limits: ArgoApiLimits,
}

/// What any caller may cost the Argo API listener (it is often reachable from the internet).
#[derive(clap::Args)]
struct ArgoApiLimits {
    /// The largest request body, in bytes; a larger one is refused with 413 before it is read
    /// (a retry call carries at most about 410 KiB).
    #[arg(long, value_name = "BYTES", default_value_t = nonzero(Limits::default().max_body), env = "REWIND_ARGO_API_MAX_BODY")]
    argo_api_max_body: NonZeroUsize,
    /// Close a connection whose request headers have not arrived within this (an idle
    /// keep-alive connection too, and a TLS handshake).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration, env = "REWIND_ARGO_API_HEADER_TIMEOUT")]
    argo_api_header_timeout: Duration,
    /// Answer 408 to a call whose body has not arrived within this.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration, env = "REWIND_ARGO_API_BODY_TIMEOUT")]
    argo_api_body_timeout: Duration,
    /// Open connections at most; one more is closed at once.
    #[arg(long, default_value_t = nonzero(Limits::default().max_connections), env = "REWIND_ARGO_API_MAX_CONNECTIONS")]
    argo_api_max_connections: NonZeroUsize,
    /// Open connections from one address (an IPv6 /64) at most; behind a proxy every call
    /// comes from the proxy's addresses, so raise it there.
    #[arg(long, default_value_t = nonzero(Limits::default().max_connections_per_source), env = "REWIND_ARGO_API_MAX_CONNECTIONS_PER_SOURCE")]
    argo_api_max_connections_per_source: NonZeroUsize,
    /// Calls in flight at most (a call lasts as long as its retry); one more is answered 503
    /// with Retry-After.
    #[arg(long, default_value_t = nonzero(Limits::default().max_calls), env = "REWIND_ARGO_API_MAX_CALLS")]
    argo_api_max_calls: NonZeroUsize,
    /// Calls in flight from one address at most.
    #[arg(long, default_value_t = nonzero(Limits::default().max_calls_per_source), env = "REWIND_ARGO_API_MAX_CALLS_PER_SOURCE")]
    argo_api_max_calls_per_source: NonZeroUsize,
    /// Reviews of callers (TokenReviews, SubjectAccessReviews, the Argo Server's userinfo) per
    /// second: their own budget, apart from --qps.
    #[arg(long, default_value_t = nonzero32(ReviewBudget::default().qps), env = "REWIND_ARGO_API_REVIEW_QPS")]
    argo_api_review_qps: NonZeroU32,
    /// Reviews that may go at once after a quiet spell.
    #[arg(long, default_value_t = nonzero32(ReviewBudget::default().burst), env = "REWIND_ARGO_API_REVIEW_BURST")]
    argo_api_review_burst: NonZeroU32,
    /// Reviews one address may have waiting or in flight; one more is answered 503.
    #[arg(long, default_value_t = nonzero(ReviewBudget::default().per_source), env = "REWIND_ARGO_API_REVIEWS_PER_SOURCE")]
    argo_api_reviews_per_source: NonZeroUsize,
}

fn nonzero(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("a default bound is not zero")
}

fn nonzero32(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("a default bound is not zero")
}

impl ArgoApiLimits {
    fn limits(&self) -> (Limits, ReviewBudget) {
        let limits = Limits {
            max_body: self.argo_api_max_body.get(),
            header_timeout: self.argo_api_header_timeout,
            body_timeout: self.argo_api_body_timeout,
            max_connections: self.argo_api_max_connections.get(),
            max_connections_per_source: self.argo_api_max_connections_per_source.get(),
            max_calls: self.argo_api_max_calls.get(),
            max_calls_per_source: self.argo_api_max_calls_per_source.get(),
        };
        let reviews = ReviewBudget {
            qps: self.argo_api_review_qps.get(),
            burst: self.argo_api_review_burst.get(),
            per_source: self.argo_api_reviews_per_source.get(),
            ..ReviewBudget::default()
        };
        (limits, reviews)
    }
}

impl ArgoApiArgs {
    fn options(self) -> anyhow::Result<Option<ArgoApiOptions>> {
        let Some(addr) = self.argo_api_addr else {
            return Ok(None);
        };
        let tls = match (self.argo_api_tls_cert, self.argo_api_tls_key) {
            (Some(_), Some(_)) if self.argo_api_plaintext => bail!(
                "--argo-api-plaintext=true serves plain HTTP, yet a certificate is given (--argo-api-tls-cert); give one or the other"
            ),
            (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
            _ if self.argo_api_plaintext => None,
            _ => bail!(
                "--argo-api-addr serves TLS: give --argo-api-tls-cert and --argo-api-tls-key (the chart generates a self-signed pair), or --argo-api-plaintext=true behind a proxy that terminates TLS"
            ),
        };
        let (limits, reviews) = self.limits.limits();
        let argo_server = self.argo_server_url.map(|url| ArgoServer {
            url,
            ca_file: self.argo_server_ca_file,
            insecure_skip_verify: self.argo_server_insecure_skip_verify,
        });
        Ok(Some(ArgoApiOptions {
            addr,
            settings: Settings {
                modes: self.argo_api_auth_mode,
                server_account: self.argo_server_service_account,
                argo_server,
                sso_rbac: self.argo_api_sso_rbac,
                sso_delegate: self.argo_api_sso_delegate_rbac_to_namespace,
                tls,
                limits,
                reviews,
            },
        }))
    }
}

/// Leader election, for running several replicas.
#[derive(clap::Args)]
struct LeaderArgs {
    /// Work only while holding a coordination.k8s.io Lease; stand by (ready) otherwise.
    #[arg(long, env = "REWIND_LEADER_ELECT")]
    leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "rewind", env = "REWIND_LEASE_NAME")]
    lease_name: String,
    /// Namespace of the Lease (the chart passes its own namespace).
    #[arg(long, default_value = "default", env = "REWIND_LEASE_NAMESPACE")]
    lease_namespace: String,
    /// A standby takes over this long after the leader's last renewal (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = parse_duration, env = "REWIND_LEASE_DURATION")]
    lease_duration: Duration,
    /// This replica's name in the Lease; a random one when omitted.
    #[arg(long, env = "POD_NAME")]
    lease_identity: Option<String>,
}

impl LeaderArgs {
    fn lease(self) -> Option<LeaseConfig> {
        self.leader_elect.then(|| LeaseConfig {
            name: self.lease_name,
            namespace: self.lease_namespace,
            identity: self.lease_identity.unwrap_or_else(|| {
                let suffix: String = std::iter::repeat_with(fastrand::lowercase)
                    .take(8)
                    .collect();
                format!("rewind-{suffix}")
            }),
            duration: self.lease_duration,
        })
    }
}

/// Budget and behaviour, shared by `controller` and `demo`.
#[derive(clap::Args, Clone, Debug)]
pub struct Tuning {
    /// Mutating API requests per second (every POST, PUT, PATCH, DELETE).
    #[arg(long, default_value = "20", env = "REWIND_QPS")]
    qps: NonZeroU32,
    /// Mutating API requests allowed in a burst.
    #[arg(long, default_value = "30", env = "REWIND_BURST")]
    burst: NonZeroU32,
    /// Read API requests per second (GET, LIST, WATCH).
    #[arg(long, default_value = "50", env = "REWIND_READ_QPS")]
    read_qps: NonZeroU32,
    /// Read API requests allowed in a burst.
    #[arg(long, default_value = "100", env = "REWIND_READ_BURST")]
    read_burst: NonZeroU32,
    /// API requests in flight at most (and delete workers).
    #[arg(long, default_value = "32", env = "REWIND_WORKERS")]
    workers: NonZeroUsize,
    /// Never use DeleteCollection; delete every pod with its own request.
    #[arg(long, env = "REWIND_NO_BULK")]
    no_bulk: bool,
    /// Split a bulk delete into this many DeleteCollections by node, sent side by side (each
    /// one write of the budget).
    #[arg(long, default_value_t = NonZeroUsize::new(DEFAULT_BULK_PARALLELISM).expect("not zero"), env = "REWIND_BULK_PARALLELISM")]
    bulk_parallelism: NonZeroUsize,
    /// Delete pods whose workflow no longer exists, in the background, this often (e.g. 60s).
    #[arg(long, value_parser = parse_duration, env = "REWIND_POD_GC")]
    pod_gc: Option<Duration>,
    /// The Argo line the cluster runs: its retry rules differ ("v4" or "v3.7").
    #[arg(long, default_value = "v4", env = "REWIND_ARGO_VERSION")]
    argo_version: ArgoVersion,
    /// Argo's MAX_WORKFLOW_SIZE: above it, nodes are written compressed.
    #[arg(long, default_value_t = DEFAULT_MAX_WORKFLOW_SIZE, env = "MAX_WORKFLOW_SIZE")]
    max_workflow_size: usize,
    /// Argo's ALWAYS_OFFLOAD_NODE_STATUS: with Argo's database, always offload nodes.
    #[arg(long, env = "ALWAYS_OFFLOAD_NODE_STATUS")]
    always_offload_node_status: bool,
    /// DeleteCollections in flight at once, across retries (at least --bulk-parallelism), and
    /// one more for an asker with none in flight: the API server deletes each one's pods one
    /// by one, so more would only queue there, where its other clients wait too.
    #[arg(long, default_value_t = NonZeroUsize::new(DEFAULT_MAX_BULK_IN_FLIGHT).expect("not zero"), env = "REWIND_MAX_BULK_IN_FLIGHT")]
    max_bulk_in_flight: NonZeroUsize,
    /// Planned pods in deletion at once, across retries: a retry past it waits (Pending, saying
    /// why) until enough others are done. Bounds the controller's memory.
    #[arg(long, default_value_t = DEFAULT_MAX_PODS, env = "REWIND_MAX_PODS_IN_FLIGHT")]
    max_pods_in_flight: usize,
    /// WorkflowRetry objects served at once in one namespace: the others wait their turn, in
    /// the order they came, their status saying why. Bounds what one namespace's burst costs
    /// the controller and the other namespaces.
    #[arg(long, default_value_t = NonZeroUsize::new(DEFAULT_MAX_OPEN_PER_NAMESPACE).expect("not zero"), env = "REWIND_MAX_OPEN_PER_NAMESPACE")]
    max_open_per_namespace: NonZeroUsize,
    /// How long a planned pod may stay terminating (deleted, but kept by a finalizer or by a
    /// node that does not confirm it stopped) before its retry fails naming it, what keeps it
    /// and what to do, and gives back its share of --max-pods-in-flight (e.g. 5m).
    #[arg(long, default_value = "5m", value_parser = parse_timeout, env = "REWIND_TERMINATING_TIMEOUT")]
    terminating_timeout: Duration,
    /// How long a planned pod of a live workflow may wait for Argo's controller to finish with
    /// it (label it workflows.argoproj.io/completed=true, which Argo does from a queue rate
    /// limited to 10 pods a second, minutes late under load) before --on-settle-timeout:
    /// deleted earlier, Argo's queued label could land on the pod it re-creates under that
    /// name, whose node then stays Pending. Also how long a reset is followed for a strand.
    #[arg(long, default_value = "10m", value_parser = parse_timeout, env = "REWIND_SETTLE_TIMEOUT")]
    settle_timeout: Duration,
    /// What a retry does with planned pods Argo has not finished with at --settle-timeout: fail,
    /// naming them and deleting none, or delete them anyway and say so.
    #[arg(long, value_enum, default_value_t = OnSettleTimeout::Fail, env = "REWIND_ON_SETTLE_TIMEOUT")]
    on_settle_timeout: OnSettleTimeout,
    /// The most bytes of JSON rewind reads for a workflow's nodes: status.compressedNodes
    /// inflated, or a row of Argo's database (offloaded nodes, an archived workflow). A
    /// retry of a larger one fails, saying so: a retry needs about three times its nodes'
    /// JSON in memory, and a decompression bomb stops here. Unset: (--memory-limit - 64 MiB)
    /// / 3 (85.3 MiB under the chart's 320 MiB), or 67108864 (64 MiB) without a memory limit
    #[arg(long, value_name = "BYTES", env = "REWIND_MAX_NODES_SIZE")]
    max_nodes_size: Option<usize>,
    #[command(flatten)]
    compression: CompressionArgs,
}

/// Argo's compression settings, read under Argo's own variable names so one
/// ConfigMap can feed both: rewind writes compressed nodes as the cluster's
/// Argo would.
#[derive(clap::Args, Clone, Debug)]
struct CompressionArgs {
    /// Argo's WORKFLOW_COMPRESSION_ALGORITHM: gzip, zstd or brotli (v4 only).
    #[arg(long, default_value = "gzip", env = "WORKFLOW_COMPRESSION_ALGORITHM")]
    compression_algorithm: Algorithm,
    /// Argo's WORKFLOW_COMPRESSION_LEVEL (gzip 1-9, zstd 1-4, brotli 0-11; else the default).
    #[arg(long, env = "WORKFLOW_COMPRESSION_LEVEL")]
    compression_level: Option<String>,
    /// Argo's GZIP_IMPLEMENTATION: PGZip (default) or GZip.
    #[arg(long, default_value = "PGZip", env = "GZIP_IMPLEMENTATION")]
    gzip_implementation: GzipImplementation,
}

impl CompressionArgs {
    fn settings(&self) -> Compression {
        Compression {
            algorithm: self.compression_algorithm,
            level: self.compression_level.clone(),
            gzip_implementation: self.gzip_implementation,
        }
    }
}

impl Tuning {
    fn options(&self, scope: Scope, http_addr: Option<SocketAddr>) -> Options {
        Options {
            scope,
            budget: BudgetConfig {
                writes: Rate {
                    qps: self.qps,
                    burst: self.burst,
                },
                reads: Rate {
                    qps: self.read_qps,
                    burst: self.read_burst,
                },
                workers: self.workers,
                ..BudgetConfig::default()
            },
            workers: self.workers.get(),
            max_bulk_in_flight: self.max_bulk_in_flight.get(),
            retry: RetryConfig {
                allow_bulk: !self.no_bulk,
                bulk_parallelism: self.bulk_parallelism.get(),
                argo_version: self.argo_version,
                max_workflow_size: self.max_workflow_size,
                always_offload_node_status: self.always_offload_node_status,
                max_nodes_size: self.max_nodes_size.unwrap_or(DEFAULT_MAX_NODES_SIZE),
                max_pods_in_flight: self.max_pods_in_flight,
                max_open_per_namespace: self.max_open_per_namespace.get(),
                terminating_timeout: self.terminating_timeout,
                settle_timeout: self.settle_timeout,
                on_settle_timeout: self.on_settle_timeout,
                compression: self.compression.settings(),
                ..RetryConfig::default()
            },
            pod_gc: self.pod_gc,
            http_addr,
            ..Options::default()
        }
    }
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(format!("{s:?} is no time at all; give a duration like 10s")),
        d => Ok(d),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 5m or 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{s:?} is not a duration like 30s, 5m or 1h")),
    }
}

/// A duration that is not zero: a wait that ends before it starts is no wait.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(format!("{s:?} is no wait: give a duration like 30s or 5m")),
        d => Ok(d),
    }
}

#[derive(clap::Args)]
struct PlanArgs {
    /// A Workflow as JSON or YAML (as `kubectl get wf NAME -o json` prints it), or - for stdin.
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    /// Also restart succeeded nodes the selector matches.
    #[arg(long)]
    restart_successful: bool,
    /// Argo's node field selector, e.g. templateName=train.
    #[arg(long, default_value = "")]
    node_field_selector: String,
    /// Override a workflow parameter (repeatable).
    #[arg(short = 'p', long = "parameter", value_name = "NAME=VALUE")]
    parameters: Vec<String>,
    /// The Argo line whose retry rules apply ("v4" or "v3.7").
    #[arg(long, default_value = "v4")]
    argo_version: ArgoVersion,
    /// Argo's MAX_WORKFLOW_SIZE: above it, nodes are written compressed.
    #[arg(long, default_value_t = DEFAULT_MAX_WORKFLOW_SIZE, env = "MAX_WORKFLOW_SIZE")]
    max_workflow_size: usize,
    #[command(flatten)]
    compression: CompressionArgs,
}

#[cfg(feature = "testenv")]
#[derive(clap::Args)]
struct LocalClusterArgs {
    /// Also run kube-controller-manager, kube-scheduler and kwok (fake nodes), so pods "run".
    #[arg(long)]
    scheduling: bool,
    /// Write the API server's audit log (every request, metadata level).
    #[arg(long)]
    audit: bool,
    /// Keep files here instead of a temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The try-out README.md follows (`make try`): also run Argo's workflow-controller, and
    /// the chart's rewind Deployment, once installed, as a process (kwok runs no containers).
    #[arg(long = "try", conflicts_with = "audit")]
    try_out: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `rewind plan` too, so that its memory is the controller's (benches/memory.rs).
    if matches!(cli.command, Command::Controller(_) | Command::Plan(_)) {
        bound_malloc();
    }
    if matches!(cli.command, Command::Controller(_)) {
        give_back_freed_memory();
    }
    // kube logs every failed request at ERROR; we report the ones that matter.
    let filter = match cli.command {
        // A user's command prints what it has to say; logs only for problems.
        Command::Retry(_) | Command::Status(_) => "warn,kube_client::client::builder=off",
        _ => "info,kube=warn,kube_client::client::builder=off",
    };
    match &cli.command {
        #[cfg(feature = "testenv")]
        Command::Demo(args) if !args.verbose => {
            let path = demo::log_file();
            let file = std::fs::File::create(&path)
                .with_context(|| format!("creating the log file {}", path.display()))?;
            logging::init_with(cli.log_format, filter, false, std::sync::Arc::new(file));
        }
        _ => logging::init(cli.log_format, filter),
    }
    match cli.command {
        // Offline: no runtime needed.
        Command::Plan(args) => plan(args),
        Command::Crd => {
            print!("{}", rewind::protocol::crd::crd_yaml());
            Ok(())
        }
        command => tokio::runtime::Runtime::new()?.block_on(async {
            match command {
                Command::Controller(args) => controller(*args).await,
                Command::Retry(args) => retry::run(args).await,
                Command::Status(args) => status::run(args).await,
                #[cfg(feature = "testenv")]
                Command::LocalCluster(args) => local_cluster(args).await,
                #[cfg(feature = "testenv")]
                Command::Demo(args) => demo::run(args).await,
                Command::Plan(_) | Command::Crd => unreachable!("handled above"),
            }
        }),
    }
}

/// glibc's allocator tuned for a long-lived controller's peak RSS, before any
/// thread starts. By default each thread that allocates under contention gets
/// an arena of its own, and a freed large block raises the size from which
/// blocks are mapped apart, so a large workflow parsed on one thread and its
/// plan on another leave two arenas' pages resident. Two arenas and a fixed
/// 128 KiB map threshold (large blocks go back to the kernel when freed) took
/// a 20,000-pod retry's peak RSS from 83 to 77 MiB live and from 89 to 79 MiB
/// archived (bench/results/memory-20000.md has the current figures). An operator's
/// own MALLOC_* or GLIBC_TUNABLES settings are left to win.
fn bound_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set_by_operator = std::env::vars_os().any(|(name, _)| {
            let name = name.to_string_lossy();
            name.starts_with("MALLOC_") || name == "GLIBC_TUNABLES"
        });
        if set_by_operator {
            return;
        }
        const THRESHOLD: libc::c_int = 128 * 1024;
        // SAFETY: mallopt only sets allocator parameters; it is called
        // before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
        }
    }
}

/// Every 10 s, glibc's free pages go back to the kernel. A large retry's nodes
/// are freed in place, among blocks still in use, and glibc returns only the
/// free top of its heap on its own: with 20,000 rich nodes planned and freed,
/// 32 MiB stayed resident; `malloc_trim` took that to 12 MiB in 2 ms (it
/// walks the free lists and releases every free page).
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    std::thread::spawn(|| {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(10));
            // SAFETY: malloc_trim only releases free memory; it is thread-safe.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
}

async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer().await.context(
        "finding Kubernetes credentials (set KUBECONFIG, or run in a pod with a ServiceAccount)",
    )?;
    let scope = Scope {
        namespaces: args.namespaces,
        instance_id: args.instance_id,
    };
    if args.argo_configmap.is_empty() {
        tracing::info!(
            "--argo-configmap is empty: archived retries and offloaded nodes are not served"
        );
    }
    let mut options = Options {
        leader_election: args.leader.lease(),
        argo_configmap: Some(args.argo_configmap).filter(|c| !c.is_empty()),
        argo_api: args.argo_api.options()?,
        limits: ContainerLimits {
            memory_bytes: args.memory_limit,
            cpu_cores: args.cpu_limit.map(|millicores| millicores as f64 / 1000.0),
        },
        ..args.tuning.options(scope, Some(args.http_addr))
    };
    if args.tuning.max_nodes_size.is_none()
        && let Some(limit) = args.memory_limit
    {
        options.retry.max_nodes_size = rewind::retry::max_nodes_size_within(limit);
        tracing::info!(
            memory_limit = limit,
            max_nodes_size = options.retry.max_nodes_size,
            "--max-nodes-size follows --memory-limit: a retry reads at most this many bytes of nodes JSON"
        );
    }
    let controller = Controller::new(config, options).context("building the Kubernetes client")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    controller.run(shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

fn plan(args: PlanArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the workflow from stdin")?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    // JSON is YAML too, but serde_json reports JSON mistakes more clearly.
    let workflow: Workflow = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).context("parsing the workflow as JSON")?
    } else {
        serde_yaml_ng::from_str(&text).context("parsing the workflow as YAML")?
    };
    let options = RetryOptions {
        restart_successful: args.restart_successful,
        node_field_selector: args.node_field_selector,
        parameters: (!args.parameters.is_empty()).then_some(args.parameters),
        argo_version: args.argo_version,
        max_workflow_size: args.max_workflow_size,
        compression: args.compression.settings(),
        ..RetryOptions::default()
    };
    match rewind::argo::plan::plan_retry_owned(workflow, &options) {
        Ok(plan) => {
            println!("{}", serde_json::to_string_pretty(&plan)?);
            Ok(())
        }
        Err(e) => bail!("{e}"),
    }
}

#[cfg(feature = "testenv")]
async fn local_cluster(args: LocalClusterArgs) -> anyhow::Result<()> {
    if args.try_out {
        rewind::testenv::tryout::run(args.dir).await?;
        return Ok(());
    }
    let options = rewind::testenv::localcluster::Options {
        scheduling: args.scheduling,
        audit: args.audit,
        ..Default::default()
    };
    rewind::testenv::localcluster::run_until_signal(options, args.dir).await?;
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM, so Kubernetes' pod termination stops us cleanly.
async fn cancel_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("signal received, shutting down");
    token.cancel();
}
