//! The cluster's directory (removed when dropped) and where each file lives in it.

use std::io;
use std::path::{Path, PathBuf};

use super::{Component, Role};

#[derive(Debug)]
pub(super) struct Layout {
    root: PathBuf,
}

impl Drop for Layout {
    fn drop(&mut self) {
        if let Err(error) = self.remove() {
            tracing::warn!(dir = %self.root.display(), %error, "cannot remove the cluster directory");
        }
    }
}

impl Layout {
    /// Takes ownership of `root`: it is removed when this is dropped.
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// Removes the directory; idempotent.
    pub fn remove(&self) -> io::Result<()> {
        match std::fs::remove_dir_all(&self.root) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.root.join("ca.crt")
    }

    pub fn serving_cert(&self) -> PathBuf {
        self.root.join("apiserver.crt")
    }

    pub fn serving_key(&self) -> PathBuf {
        self.root.join("apiserver.key")
    }

    pub fn service_account_key(&self) -> PathBuf {
        self.root.join("service-account.key")
    }

    pub fn service_account_public_key(&self) -> PathBuf {
        self.root.join("service-account.pub")
    }

    pub fn token_file(&self) -> PathBuf {
        self.root.join("tokens.csv")
    }

    pub fn audit_policy(&self) -> PathBuf {
        self.root.join("audit-policy.yaml")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.root.join("audit.log")
    }

    pub fn kubeconfig(&self, role: Role) -> PathBuf {
        self.root.join(match role {
            Role::Admin => "admin.kubeconfig",
            Role::User => "user.kubeconfig",
            Role::Controller => "controller.kubeconfig",
        })
    }

    pub fn kwok_config(&self) -> PathBuf {
        self.root.join("kwok.yaml")
    }

    pub fn etcd_data(&self) -> PathBuf {
        self.root.join("etcd")
    }

    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    pub fn log(&self, component: Component) -> PathBuf {
        self.logs().join(format!("{component}.log"))
    }

    /// A scratch HOME for kwok, which would otherwise also load ~/.kwok/kwok.yaml.
    pub fn kwok_home(&self) -> PathBuf {
        self.root.join("kwok-home")
    }
}
