//! The controller's HTTP endpoints: liveness and readiness probes, metrics.

use std::sync::Arc;

use axum::{
    Router, extract::State as AxumState, http::StatusCode, http::header, response::IntoResponse,
    routing::get,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::controller::leader::Role;
use crate::controller::watch::State;
use crate::engine::workers::Queue;
use crate::telemetry::metrics::Metrics;

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub state: State,
    pub metrics: Arc<Metrics>,
    pub queue: Queue,
    pub role: Role,
}

/// Serves `/healthz`, `/readyz` and `/metrics` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    endpoints: Endpoints,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(endpoints))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(endpoints)
}

async fn readyz(AxumState(e): AxumState<Endpoints>) -> (StatusCode, &'static str) {
    // A standby is ready so rollouts proceed; it has no cache to sync.
    if e.role.is_standby() {
        (StatusCode::OK, "standby")
    } else if e.state.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "workflow cache not synced yet",
        )
    }
}

async fn metrics(AxumState(e): AxumState<Endpoints>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            // What prometheus-client writes (it ends with `# EOF`, and has an
            // info metric, which the older text format has no type for).
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        e.metrics.encode(e.queue.depths()),
    )
}
