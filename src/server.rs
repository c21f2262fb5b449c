//! The controller's HTTP endpoints: liveness and readiness probes.

use std::net::SocketAddr;

use axum::{Router, extract::State as AxumState, http::StatusCode, routing::get};
use tokio_util::sync::CancellationToken;

use crate::controller::State;

/// Serves `/healthz` and `/readyz` on `addr` until `shutdown` is cancelled.
pub async fn serve(addr: SocketAddr, state: State, shutdown: CancellationToken) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /healthz and /readyz");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

fn router(state: State) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(AxumState(state): AxumState<State>) -> (StatusCode, &'static str) {
    if state.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "workflow cache not synced yet")
    }
}
