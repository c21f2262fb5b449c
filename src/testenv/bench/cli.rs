//! The command line and logging shared by the benchmark mains (benches/*, `harness = false`).
//!
//! `cargo bench --features testenv --bench NAME -- FLAGS` runs a main with its flags and `--bench`;
//! `cargo test --all-targets --features testenv` runs the same binary with neither, and a main then only says
//! how to run it (or checks committed results): [`parse`] tells the two apart.

/// The flags of benchmark `name` when `cargo bench` runs it, and the command line that
/// reproduces the run (`cargo bench --features testenv --bench NAME -- FLAGS`, the flags as given); `None`
/// without `--bench`, when `cargo test` runs it. Exits with clap's message on a bad flag
/// or `--help`.
pub fn parse<A: clap::Parser>(name: &str) -> Option<(A, String)> {
    match parse_from(name, std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(err) => err.exit(),
    }
}

/// [`parse`] of `args` (without the program's own name).
pub fn parse_from<A: clap::Parser>(
    name: &str,
    args: impl IntoIterator<Item = String>,
) -> Result<Option<(A, String)>, clap::Error> {
    let mut flags: Vec<String> = args.into_iter().collect();
    let before = flags.len();
    // cargo bench appends it; it is not one of the benchmark's flags.
    flags.retain(|f| f != "--bench");
    if flags.len() == before {
        return Ok(None);
    }
    // The program's name as usage shows it: how to pass the flags, not the hashed binary.
    let program = format!("cargo bench --features testenv --bench {name} --");
    let command = format!("{}{program} {}", controller_settings(), flags.join(" "));
    let args = A::try_parse_from(std::iter::once(program).chain(flags))?;
    Ok(Some((args, command)))
}

/// The controller's flags given by environment (`REWIND_MAX_BULK_IN_FLIGHT=32 `, say), which
/// its child process inherits: part of what reproduces a run. The control plane's directory
/// and the benchmarks' own switches (`REWIND_BENCH_*`) change no result.
fn controller_settings() -> String {
    let mut vars: Vec<String> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("REWIND_") && k != "REWIND_BIN_DIR" && !k.starts_with("REWIND_BENCH_")
        })
        .map(|(k, v)| format!("{k}={v} "))
        .collect();
    vars.sort();
    vars.concat()
}

/// A count that must be at least 1 (a clap `value_parser`).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>().map_err(|e| e.to_string())? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` or else warnings only.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube logs every failed request, and the control plane's readiness checks fail
                // until it is ready.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,kube_client::client::builder=off")
                }),
        )
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug, PartialEq)]
    struct Args {
        #[arg(long, value_delimiter = ',', default_value = "1000")]
        pods: Vec<usize>,
        #[arg(long, value_delimiter = ',')]
        rows: Vec<String>,
        #[arg(long, value_parser = at_least_one, default_value = "3")]
        repetitions: usize,
        #[arg(long)]
        slow: bool,
        #[arg(long)]
        out: Option<String>,
    }

    fn parsed(args: &[&str]) -> Result<Option<(Args, String)>, clap::Error> {
        parse_from("retry", args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn without_bench_nothing_is_parsed() {
        assert!(parsed(&[]).unwrap().is_none());
        // Not even flags that would not parse: cargo test passes none, but it is not a run.
        assert!(parsed(&["--nope"]).unwrap().is_none());
    }

    #[test]
    fn the_flags_and_the_command_that_reproduces_them() {
        let given =
            "--pods 8000,20000 --rows floor,rewind-bulk --repetitions 3 --out retry-neighbour";
        let (args, command) = parsed(&[given.split(' ').collect(), vec!["--bench"]].concat())
            .unwrap()
            .unwrap();
        assert_eq!(
            args,
            Args {
                pods: vec![8000, 20000],
                rows: vec!["floor".into(), "rewind-bulk".into()],
                repetitions: 3,
                slow: false,
                out: Some("retry-neighbour".into()),
            }
        );
        assert_eq!(
            command,
            format!(
                "{}cargo bench --features testenv --bench retry -- {given}",
                controller_settings()
            )
        );
        let (args, _) = parsed(&["--bench", "--slow"]).unwrap().unwrap();
        assert_eq!(
            (args.pods, args.repetitions, args.slow),
            (vec![1000], 3, true)
        );
    }

    #[test]
    fn bad_flags_are_clap_errors() {
        let err = |args: &[&str]| parsed(args).unwrap_err().kind();
        assert_eq!(
            err(&["--bench", "--nope"]),
            clap::error::ErrorKind::UnknownArgument
        );
        assert_eq!(
            err(&["--bench", "--repetitions", "0"]),
            clap::error::ErrorKind::ValueValidation
        );
        assert_eq!(
            err(&["--bench", "--help"]),
            clap::error::ErrorKind::DisplayHelp
        );
    }
}
