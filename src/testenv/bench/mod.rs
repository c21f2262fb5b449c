//! Machinery of the side-by-side retry benchmark (benches/retry): the API
//! server's audit log read as timings and request counts ([`audit`]), the
//! real controller binary and other children measured for CPU and memory
//! ([`child`], [`usage`]), a neighbour whose latency is the retry's cost to
//! others ([`neighbours`]) and the API server's account of its reads' waits
//! ([`cache_wait`]), the caller of Argo's retry calls ([`caller`]), medians with their spread ([`stats`]), the
//! table of results ([`report`]) and what a batch of retries asked by one
//! command adds to it ([`batch`]). Every benchmark main parses its flags and
//! starts its logging with [`cli`].

pub mod audit;
pub mod batch;
pub mod cache_wait;
pub mod caller;
pub mod child;
pub mod cli;
pub mod neighbours;
pub mod report;
pub mod stats;
pub mod usage;

use std::path::PathBuf;
use std::time::Duration;

use crate::testenv::IoError;

/// Why a measurement could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] IoError),

    #[error("the audit log has a timestamp that is not RFC 3339: {0:?}")]
    AuditTimestamp(String),

    #[error("reading {path}: {source}")]
    Proc {
        path: String,
        #[source]
        source: procfs::ProcError,
    },

    #[error("{what} exited ({status}); its log: {log}")]
    Exited {
        what: &'static str,
        status: String,
        log: PathBuf,
    },

    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },

    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("{0}")]
    Cluster(#[from] crate::testenv::localcluster::Error),
}
