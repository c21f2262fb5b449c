//! What rewind tells operators: Prometheus metrics and log lines.

pub mod logging;
pub mod metrics;
mod process;
