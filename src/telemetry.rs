//! Logging set-up shared by every `rewind` command.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default on a terminal).
    #[default]
    Text,
    /// One JSON object a line, for log collectors.
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides `default_filter`.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .init(),
        LogFormat::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .init(),
    }
}
