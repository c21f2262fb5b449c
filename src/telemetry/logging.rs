//! Logging set-up shared by every `rewind` command.

use std::ffi::OsStr;
use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object a line, for log collectors; never coloured.
    Json,
}

/// Whether text logs carry colour: only on a terminal, and not when
/// `NO_COLOR` is set to anything but the empty string (no-color.org). A file,
/// a pipe or `kubectl logs` gets plain text.
pub fn use_color(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the global subscriber, writing to stderr. `RUST_LOG` overrides
/// `default_filter`.
pub fn init(format: LogFormat, default_filter: &str) {
    let color = use_color(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    init_with(format, default_filter, color, std::io::stderr);
}

/// Installs the global subscriber with the given writer (e.g. a log file).
pub fn init_with<W>(format: LogFormat, default_filter: &str, color: bool, writer: W)
where
    W: for<'w> fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing::subscriber::set_global_default(subscriber(format, filter, color, writer))
        .expect("the global subscriber is installed once");
}

fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    color: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => {
            Box::new(registry.with(fmt::layer().with_ansi(color).with_writer(writer)))
        }
        // JSON carries no escape codes, whatever the output.
        LogFormat::Json => {
            Box::new(registry.with(fmt::layer().json().with_ansi(false).with_writer(writer)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_color(true, None));
        assert!(!use_color(false, None), "a file or pipe gets no colour");
        assert!(!use_color(true, Some(OsStr::new("1"))), "NO_COLOR wins");
        assert!(!use_color(false, Some(OsStr::new("1"))));
        // no-color.org: an empty NO_COLOR does not count as set.
        assert!(use_color(true, Some(OsStr::new(""))));
    }

    /// What `subscriber` writes for one event, with colour on or off.
    fn written(format: LogFormat, color: bool) -> String {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let make = move || Sink(sink.clone());
        let subscriber = subscriber(format, EnvFilter::new("info"), color, make);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(workflow = "wf", "retry started");
        });
        String::from_utf8(buffer.lock().unwrap().clone()).unwrap()
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn text_logs_carry_escape_codes_only_when_coloured_and_json_never() {
        let plain = written(LogFormat::Text, false);
        assert!(
            plain.contains("retry started") && plain.contains("workflow=\"wf\""),
            "{plain}"
        );
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(written(LogFormat::Text, true).contains('\x1b'));
        let json = written(LogFormat::Json, true);
        assert!(json.contains(r#""workflow":"wf""#), "{json}");
        assert!(!json.contains('\x1b'), "{json:?}");
    }
}
