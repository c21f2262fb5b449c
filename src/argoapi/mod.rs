//! The Argo Server's two retry calls, served by rewind:
//! `PUT /api/v1/workflows/{namespace}/{name}/retry` and
//! `PUT /api/v1/archived-workflows/{uid}/retry`, with Argo's request and
//! answer shapes ([`wire`]), so Argo's UI, the `argo` CLI and Hera reach
//! rewind when an Ingress or HTTPRoute sends those two paths here and
//! everything else to argo-server.
//!
//! A call is authenticated and authorized as Argo's server would ([`auth`]),
//! within a budget of reviews of its own ([`review`]), becomes rewind's
//! request and is followed to its end ([`retry`]). It may run on every
//! replica: it only writes the request and reads its progress, which the
//! leader serves. Served over TLS ([`tls`]) unless plain HTTP is asked for,
//! within bounds on what any caller can cost ([`listener`]).

pub mod auth;
pub mod listener;
pub mod retry;
pub mod review;
pub mod sso;
pub mod tls;
pub mod wire;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::Uri;
use axum::routing::put;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::argoapi::auth::{Account, AuthMode, Authenticated, Authenticator};
use crate::argoapi::listener::{Limits, Shares};
use crate::argoapi::review::Reviews;
use crate::argoapi::sso::Sso;
use crate::argoapi::wire::{Code, Status};

/// How long a WorkflowRetry created for a call is kept after it finished:
/// long enough to look at with `rewind status`, short enough that a UI's
/// clicks do not pile up.
pub const TTL: Duration = Duration::from_secs(3600);

/// How the listener is configured.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Argo's `--auth-mode` values of the installation in front.
    pub modes: Vec<AuthMode>,
    /// The Argo Server's ServiceAccount (server mode, SSO without SSO RBAC).
    pub server_account: Option<Account>,
    /// The Argo Server, asked who an SSO caller is.
    pub argo_server: Option<ArgoServer>,
    /// Whether the Argo Server's SSO RBAC is on (its `sso.rbac.enabled`): SSO
    /// callers then act as the ServiceAccount it maps them to, else as the
    /// Argo Server's own. Required in SSO mode.
    pub sso_rbac: Option<bool>,
    /// Whether the Argo Server delegates SSO RBAC to a call's namespace (its
    /// `SSO_DELEGATE_RBAC_TO_NAMESPACE=true`).
    pub sso_delegate: bool,
    /// Serve TLS with this certificate; `None` serves plain HTTP.
    pub tls: Option<tls::CertFiles>,
    /// What any caller may cost the listener.
    pub limits: Limits,
    /// The reviews of callers' budget.
    pub reviews: review::Budget,
}

/// Where the Argo Server is and how to trust it.
#[derive(Clone, Debug)]
pub struct ArgoServer {
    pub url: Uri,
    /// A PEM file of the CA that signed its certificate (an Argo Server's own
    /// certificate is usually self-signed); the system's roots otherwise.
    pub ca_file: Option<PathBuf>,
    /// Trust any certificate, as `argo --insecure-skip-verify` does.
    pub insecure_skip_verify: bool,
}

/// Why the listener cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "--argo-api-auth-mode names no mode; give client, server or sso, as Argo's --auth-mode"
    )]
    NoMode,
    #[error(
        "auth mode {mode} acts as the Argo Server's own ServiceAccount; set --argo-server-service-account NAMESPACE/NAME (the chart's argoApi.argoServer.serviceAccount)"
    )]
    NoServerAccount { mode: &'static str },
    #[error(
        "auth mode sso needs the Argo Server to ask who an SSO caller is; set --argo-server-url (e.g. https://argo-server.argo:2746)"
    )]
    NoArgoServer,
    #[error(
        "auth mode sso: say whether the Argo Server's SSO RBAC is on (sso.rbac.enabled in its ConfigMap) with --argo-api-sso-rbac=true or false (the chart's argoApi.sso.rbac): SSO callers act as the ServiceAccount it maps them to, or as the Argo Server's own"
    )]
    NoSsoRbac,
    #[error("building a client of the Argo Server at {url}: {source}")]
    ArgoServerClient {
        url: Uri,
        // Boxed: kube's error is large and this one is rare.
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// What the handlers share.
#[derive(Clone)]
pub struct ArgoApi {
    /// rewind's own client: it writes requests and reads results.
    client: kube::Client,
    auth: Arc<Authenticator>,
    reviews: Arc<Reviews<Authenticated>>,
    limits: Limits,
    ttl: Duration,
}

impl ArgoApi {
    /// Checks `settings` and builds the Argo Server's client; callers are
    /// reviewed with `review_client`, outside `client`'s budget. Must be
    /// called inside a tokio runtime.
    pub fn new(
        client: kube::Client,
        review_client: kube::Client,
        settings: &Settings,
    ) -> Result<Self, SettingsError> {
        let Settings {
            modes,
            server_account,
            argo_server,
            limits,
            reviews,
            sso_rbac,
            sso_delegate,
            ..
        } = settings;
        if modes.is_empty() {
            return Err(SettingsError::NoMode);
        }
        if modes.contains(&AuthMode::Server) && server_account.is_none() {
            return Err(SettingsError::NoServerAccount { mode: "server" });
        }
        let sso = match (argo_server, modes.contains(&AuthMode::Sso), sso_rbac) {
            (None, true, _) => return Err(SettingsError::NoArgoServer),
            (Some(_), true, None) => return Err(SettingsError::NoSsoRbac),
            (Some(_), true, Some(false)) if server_account.is_none() => {
                return Err(SettingsError::NoServerAccount {
                    mode: "sso without SSO RBAC",
                });
            }
            (Some(server), true, Some(rbac)) => Some(Sso {
                argo_server: argo_server_client(server)?,
                rbac: *rbac,
                delegate: *sso_delegate,
            }),
            (_, false, _) => None,
        };
        Ok(ArgoApi {
            client,
            auth: Arc::new(Authenticator {
                modes: modes.clone(),
                server_account: server_account.clone(),
                sso,
            }),
            reviews: Arc::new(Reviews::new(review_client, *reviews)),
            limits: *limits,
            ttl: TTL,
        })
    }
}

/// A client that sends requests to the Argo Server and nothing of its own:
/// kube's client speaks HTTPS with a given CA, which is all `/userinfo` needs.
fn argo_server_client(server: &ArgoServer) -> Result<kube::Client, SettingsError> {
    let mut config = kube::Config::new(server.url.clone());
    config.root_cert_file = server.ca_file.clone();
    config.accept_invalid_certs = server.insecure_skip_verify;
    config.connect_timeout = Some(review::TIMEOUT);
    config.read_timeout = Some(review::TIMEOUT);
    config.write_timeout = Some(review::TIMEOUT);
    kube::Client::try_from(config).map_err(|source| SettingsError::ArgoServerClient {
        url: server.url.clone(),
        source: Box::new(source),
    })
}

/// The two retry calls, each within the shares of calls in flight;
/// anything else is refused saying where it belongs.
pub fn router(api: ArgoApi) -> Router {
    let calls = Shares::new(api.limits.max_calls, api.limits.max_calls_per_source);
    Router::new()
        .route(
            "/api/v1/workflows/{namespace}/{name}/retry",
            put(retry::live),
        )
        .route(
            "/api/v1/archived-workflows/{uid}/retry",
            put(retry::archived),
        )
        .fallback(|| async {
            Status::new(
                Code::NotFound,
                "rewind serves only Argo's two retry calls (PUT /api/v1/workflows/{namespace}/{name}/retry and PUT /api/v1/archived-workflows/{uid}/retry); route every other request to argo-server",
            )
        })
        .with_state(api)
        .layer(axum::middleware::from_fn_with_state(calls, listener::admit))
}

/// Serves [`router`] on `listener` within the API's limits until
/// `shutdown`, over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<tls::ServerConfig>>,
    api: ArgoApi,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let limits = api.limits;
    listener::serve(listener, tls, router(api), limits, shutdown).await
}
