//! Waiting for the control plane to be usable, failing fast when a process dies.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams};

use super::layout::Layout;
use super::process::{Processes, log_tail};
use super::{Component, Error};

const POLL: Duration = Duration::from_millis(100);

/// The startup's time budget.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    started: Instant,
    timeout: Duration,
}

impl Deadline {
    pub fn new(timeout: Duration) -> Self {
        Self {
            started: Instant::now(),
            timeout,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Polls `probe` until it is true. Fails as soon as any process exits, or at the deadline
/// with the log of `blame`, the component whose work `what` is.
pub(super) async fn wait_for<F, Fut>(
    what: &str,
    blame: Component,
    deadline: Deadline,
    processes: &mut Processes,
    layout: &Layout,
    mut probe: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        processes.check_running()?;
        if probe().await {
            tracing::debug!(what, elapsed = ?deadline.elapsed(), "ready");
            return Ok(());
        }
        if deadline.elapsed() >= deadline.timeout {
            let log = layout.log(blame);
            return Err(Error::Timeout {
                what: what.to_owned(),
                waited: deadline.elapsed(),
                component: blame,
                log_tail: log_tail(&log),
                log,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The API server answers /readyz with 200: storage, RBAC bootstrap and the other
/// post-start hooks are done.
pub(super) async fn api_ready(client: &kube::Client) -> bool {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a static request is valid");
    client.request_text(request).await.is_ok()
}

/// kube-controller-manager's service-account controller has created `default/default`,
/// the account pods run as unless they name another.
pub(super) async fn default_service_account(client: &kube::Client) -> bool {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    matches!(api.get_opt("default").await, Ok(Some(_)))
}

/// Every fake node is Ready, i.e. kwok manages it and the scheduler may use it.
pub(super) async fn nodes_ready(client: &kube::Client, count: usize) -> bool {
    let api: Api<Node> = Api::all(client.clone());
    let Ok(nodes) = api
        .list(&ListParams::default().labels(super::kwok::NODE_LABEL_SELECTOR))
        .await
    else {
        return false;
    };
    let ready = nodes.items.iter().filter(|node| {
        let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
        conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    ready.count() == count
}
