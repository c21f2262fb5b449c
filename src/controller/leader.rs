//! Leader election on a coordination.k8s.io Lease (kube-lease-manager), so
//! that of several replicas exactly one watches workflows and deletes pods.
//!
//! The crate holds, renews and releases the lease; this module adds what it
//! leaves to its user:
//! - A standby rebuilds its manager every `retry` period, so it sees a lease
//!   released by a graceful stop at once instead of sleeping until the old
//!   holder's expiry.
//! - Fencing: the lease's own client times out within a third of the renewal
//!   margin, so a leader that cannot renew learns it (an error) and stops
//!   working before the lease can expire and a standby take over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerError, LeaseParams};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Where the lease lives and how long it lasts.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique per replica (the pod name).
    pub identity: String,
    /// A standby may take over this long after the leader's last renewal.
    pub duration: Duration,
}

impl LeaseConfig {
    /// The leader renews this long before expiry: a third of the duration.
    fn grace(&self) -> u64 {
        (self.duration.as_secs() / 3).max(1)
    }

    /// How often a standby looks at the lease.
    fn retry(&self) -> Duration {
        Duration::from_secs(self.grace()).min(Duration::from_secs(2))
    }

    /// Per-request timeout of the lease client, so a failed renewal is known
    /// well within the grace period.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.grace()) / 3
    }
}

/// Why leading ended other than by a requested stop.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "lease {namespace}/{name} (as {identity}): {source}; check the API server is reachable and the ServiceAccount may get, create and patch leases in {namespace}"
    )]
    Lease {
        name: String,
        namespace: String,
        identity: String,
        #[source]
        source: LeaseManagerError,
    },
    #[error(
        "lease {namespace}/{name} was taken over by another replica; this one stopped working and exits so it can start over as a standby"
    )]
    Lost { name: String, namespace: String },
    #[error("the lease configuration is invalid: {0}")]
    Config(String),
}

/// Whether this replica is standing by; read by /readyz and /metrics.
#[derive(Clone, Debug)]
pub struct Role {
    standby: Arc<AtomicBool>,
}

impl Role {
    /// A replica without leader election always works.
    pub fn leader() -> Self {
        Role {
            standby: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn standby() -> Self {
        Role {
            standby: Arc::new(AtomicBool::new(true)),
        }
    }

    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
    }
}

/// Holds the lease while this replica leads.
pub struct Leadership {
    manager: LeaseManager,
    config: LeaseConfig,
    role: Role,
}

impl LeaseConfig {
    fn error(&self, source: LeaseManagerError) -> LeaderError {
        LeaderError::Lease {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            identity: self.identity.clone(),
            source,
        }
    }

    async fn manager(&self, client: &kube::Client) -> Result<LeaseManager, LeaderError> {
        let duration = self.duration.as_secs();
        if duration <= self.grace() {
            return Err(LeaderError::Config(format!(
                "a lease duration of {:?} is too short; give at least 2s",
                self.duration
            )));
        }
        let params = LeaseParams::new(self.identity.clone(), duration, self.grace());
        LeaseManager::new(
            client.clone(),
            self.name.clone(),
            self.namespace.clone(),
            params,
            LeaseCreateMode::AutoCreate,
        )
        .await
        .map_err(|e| self.error(e))
    }
}

/// Stands by until this replica holds the lease (`Some`) or `shutdown` is
/// cancelled (`None`). API errors are logged and retried: a standby has
/// nothing to fence.
pub async fn acquire(
    client: &kube::Client,
    config: &LeaseConfig,
    role: &Role,
    shutdown: &CancellationToken,
) -> Result<Option<Leadership>, LeaderError> {
    role.set_standby(true);
    info!(lease = %config.name, namespace = %config.namespace, identity = %config.identity, "standing by for the lease");
    loop {
        let manager = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            manager = config.manager(client) => manager,
        };
        let outcome = match manager {
            Ok(manager) => tokio::select! {
                _ = shutdown.cancelled() => {
                    // A stop can come between taking the lease and learning it.
                    release(&manager, config).await;
                    return Ok(None);
                }
                changed = tokio::time::timeout(config.retry(), manager.changed()) => match changed {
                    Ok(Ok(true)) => Ok(Some(manager)),
                    Ok(Ok(false)) | Err(_) => Ok(None),
                    Ok(Err(e)) => Err(config.error(e)),
                },
            },
            Err(e) => Err(e),
        };
        match outcome {
            Ok(Some(manager)) => {
                info!(lease = %config.name, identity = %config.identity, "acquired the lease; leading");
                role.set_standby(false);
                return Ok(Some(Leadership {
                    manager,
                    config: config.clone(),
                    role: role.clone(),
                }));
            }
            Ok(None) => {}
            Err(LeaderError::Config(e)) => return Err(LeaderError::Config(e)),
            Err(e) => {
                warn!(error = %e, "cannot look at the lease; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(config.retry()) => {}
                }
            }
        }
    }
}

impl Leadership {
    /// Renews the lease until `shutdown` is cancelled (then releases it, so
    /// a standby takes over at once) or renewal fails (an error: the caller
    /// must stop working now, before the lease expires).
    pub async fn hold(self, shutdown: CancellationToken) -> Result<(), LeaderError> {
        let Leadership {
            manager,
            config,
            role,
        } = self;
        let renewing = tokio::select! {
            _ = shutdown.cancelled() => None,
            result = manager.changed() => Some(result),
        };
        role.set_standby(true);
        match renewing {
            None => {
                release(&manager, &config).await;
                Ok(())
            }
            Some(Ok(_)) => Err(LeaderError::Lost {
                name: config.name,
                namespace: config.namespace,
            }),
            Some(Err(e)) => Err(config.error(e)),
        }
    }
}

/// Frees the lease if this replica holds it, so a standby takes over at once.
async fn release(manager: &LeaseManager, config: &LeaseConfig) {
    match tokio::time::timeout(config.duration, manager.release()).await {
        Ok(Ok(())) => info!(lease = %config.name, "released the lease"),
        Ok(Err(e)) => {
            warn!(error = %config.error(e), "could not release the lease; a standby takes over when it expires")
        }
        Err(_) => {
            warn!(lease = %config.name, "releasing the lease timed out; a standby takes over when it expires")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(secs: u64) -> LeaseConfig {
        LeaseConfig {
            name: "rewind".into(),
            namespace: "ns".into(),
            identity: "a".into(),
            duration: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_failed_renewal_is_known_before_the_lease_expires() {
        for secs in [3, 6, 15, 60] {
            let c = config(secs);
            // The leader renews at expiry - grace; its two requests (patch
            // and read back) time out before expiry.
            assert!(
                c.request_timeout() * 2 < Duration::from_secs(c.grace()),
                "{secs}s"
            );
            assert!(c.grace() < secs, "{secs}s");
            assert!(c.retry() <= Duration::from_secs(2), "{secs}s");
        }
    }
}
