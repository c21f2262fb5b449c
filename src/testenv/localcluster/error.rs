use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use super::Component;
use crate::testenv::IoError;

/// Why the local control plane could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{name} not found in {dir}: build the control plane with `{build}` \
         (or point REWIND_BIN_DIR at a directory holding it)"
    )]
    BinaryMissing {
        name: &'static str,
        dir: PathBuf,
        build: String,
    },

    #[error("building the control plane with `{command}` failed ({status}); its output is above")]
    Build { command: String, status: ExitStatus },

    #[error(
        "port {port} on 127.0.0.1, wanted for {component}, is already taken: stop whatever listens there or pick another port"
    )]
    PortTaken { port: u16, component: Component },

    #[error("cannot start {component} ({binary}): {source}")]
    Spawn {
        component: Component,
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{component} exited during startup ({status}); last lines of {log}:\n{log_tail}")]
    Exited {
        component: Component,
        status: ExitStatus,
        log: PathBuf,
        log_tail: String,
    },

    #[error(
        "timed out after {waited:?} waiting for {what}; last lines of {component}'s log {log}:\n{log_tail}"
    )]
    Timeout {
        what: String,
        waited: Duration,
        component: Component,
        log: PathBuf,
        log_tail: String,
    },

    #[error("cluster directory {0} is not empty: pass an empty or missing directory")]
    DirNotEmpty(PathBuf),

    #[error(transparent)]
    Io(#[from] IoError),

    #[error("generating the cluster's certificates and keys: {0}")]
    Certificates(#[from] rcgen::Error),

    #[error("random tokens for the cluster's users: {0}")]
    Random(#[from] getrandom::Error),

    #[error("loading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },

    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("Argo CRD {file} is not a valid CustomResourceDefinition: {source}")]
    Crd {
        file: &'static str,
        #[source]
        source: serde_yaml_ng::Error,
    },

    #[error("{file} holds no valid {kind}: {source}")]
    Rbac {
        file: &'static str,
        kind: &'static str,
        #[source]
        source: serde_yaml_ng::Error,
    },

    #[error("waiting for a signal to stop: {0}")]
    Signal(#[source] std::io::Error),
}

impl Error {
    pub(super) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}
