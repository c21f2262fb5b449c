//! Peak memory of a retry's read, plan and write-back against the size and shape of the
//! workflow's nodes, without a cluster: for each point, `rewind plan` (the controller's
//! planner, its allocator settings, the workflow given up to the planner as the controller
//! gives it) reads a wide failed DAG as the API server sends it (`rewind::testenv::shapes`,
//! nodes gzip-compressed in `compressedNodes`), plans the retry and compresses the reset
//! workflow's nodes. Its peak RSS (the kernel's, from `wait4`) is compared with the same
//! command on a 10-node workflow and with the bound the project holds a retry's peak to:
//! 32 MiB + twice the nodes' JSON, of which the controller's idle 18 MiB leaves 14 MiB over
//! the base.
//!
//!     cargo bench --features testenv --bench memory -- --nodes 1000,5000,20000,50000 --shapes lean,rich [--other PATH] --out memory-sweep
//!
//! `--other PATH` runs another build's `rewind plan` at each point too (an earlier commit's,
//! say), side by side. Offline there is no database: a workflow over Argo's size limit even
//! compressed ends at the offload, after its nodes were read, planned and encoded; the
//! controller then writes them to the offload table from one more JSON of the same size.
//! Not covered: the controller's buffers around the planner (the HTTP body), the offload
//! table's row as read, and archived retries (the retry benchmark's rows measure those).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, ensure};
use plotters::prelude::*;
use rewind::testenv::bench::{child, cli};
use rewind::testenv::shapes::{Shape, workflow_json};

#[path = "../tests/support/font.rs"]
mod font;

const RESULTS: &str = "bench/results";
/// The bound of a retry's peak RSS: this much plus twice the nodes' JSON.
const BOUND_BASE_MIB: f64 = 32.0;
/// The controller's idle RSS (docs/operating.md), which the bound's base includes.
const CONTROLLER_IDLE_MIB: f64 = 18.0;
/// What `rewind plan` says of a workflow Argo would offload (PlanError::TooLarge).
const OFFLOAD_REFUSED: &str = "offload node status is not supported";

/// Peak RSS of `rewind plan` by the nodes' count and shape.
#[derive(clap::Parser)]
struct Args {
    /// Pod nodes under the one DAG node, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = cli::at_least_one, default_value = "1000,5000,20000,50000")]
    nodes: Vec<usize>,
    #[arg(long, value_delimiter = ',', value_enum, default_value = "lean,rich")]
    shapes: Vec<Shape>,
    /// Another build's `rewind` binary to measure side by side.
    #[arg(long)]
    other: Option<PathBuf>,
    /// Write bench/results/NAME.md and NAME.png too.
    #[arg(long)]
    out: Option<String>,
    /// Only write the workflow of `--nodes` (one count) and the first of `--shapes` to
    /// this file and print its nodes' JSON size: the run's own child, which keeps the
    /// generator's memory out of the measuring process (a child's peak RSS counts its
    /// parent's RSS at the moment it was spawned).
    #[arg(long, hide = true)]
    generate: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let Some((args, command)) = cli::parse::<Args>("memory") else {
        println!(
            "memory is a benchmark: cargo bench --features testenv --bench memory -- --nodes 1000,20000 (see benches/memory.rs)"
        );
        return Ok(());
    };
    if let Some(file) = args.generate {
        let (body, json) = workflow_json(args.nodes[0], args.shapes[0]);
        std::fs::write(file, body)?;
        println!("{json}");
        return Ok(());
    }
    let ours = PathBuf::from(env!("CARGO_BIN_EXE_rewind"));
    let dir = tempfile::tempdir()?;
    let base = run(&ours, &generate(dir.path(), 10, Shape::Lean)?.0)?.peak;
    println!("`rewind plan` of a 10-node workflow: peak RSS {base:.1} MiB");
    let other_header = match args.other {
        Some(_) => " other build's peak RSS MiB | other ÷ ours |",
        None => "",
    };
    let mut table = format!(
        "| shape | nodes | nodes JSON MiB | written | peak RSS MiB | over base MiB | over base ÷ JSON | bound over base MiB | within | plan s |{other_header}\n|---|---:|---:|---|---:|---:|---:|---:|---|---:|{}\n",
        if args.other.is_some() {
            "---:|---:|"
        } else {
            ""
        }
    );
    let mut all_within = true;
    let mut drawn = Vec::new();
    for &shape in &args.shapes {
        for &nodes in &args.nodes {
            let (file, json) = generate(dir.path(), nodes, shape)?;
            let point = run(&ours, &file)?;
            let over = point.peak - base;
            let bound = BOUND_BASE_MIB - CONTROLLER_IDLE_MIB + 2.0 * json;
            let within = over <= bound;
            all_within &= within;
            let mut row = format!(
                "| {shape:?} | {nodes} | {json:.1} | {} | {:.1} | {over:.1} | {:.2} | {bound:.1} | {} | {:.2} |",
                if point.offloaded {
                    "offloaded"
                } else {
                    "compressed"
                },
                point.peak,
                over / json,
                if within { "yes" } else { "**no**" },
                point.seconds,
            );
            let mut theirs = None;
            if let Some(other) = &args.other {
                let peak = run(other, &file)?.peak;
                row.push_str(&format!(" {peak:.1} | {:.2}× |", peak / point.peak));
                theirs = Some(peak - base);
            }
            drawn.push(Drawn {
                shape,
                json,
                over,
                theirs,
            });
            println!("{row}");
            table.push_str(&row);
            table.push('\n');
            std::fs::remove_file(file)?;
        }
    }
    if let Some(name) = args.out {
        let text = format!(
            "# Memory by the nodes' size and shape: {name}\n\n`{command}`\n\nOn {} CPUs. `rewind plan` of a 10-node workflow peaks at {base:.1} MiB (the base). \
             The bound over the base is a retry's bound, 32 MiB + 2 × nodes JSON, less the controller's idle {CONTROLLER_IDLE_MIB} MiB. \
             written: how the reset workflow's nodes go out (offloaded: over Argo's size limit even compressed; offline the run ends at the offload).\n\n{table}",
            std::thread::available_parallelism().map_or(0, usize::from)
        );
        std::fs::write(Path::new(RESULTS).join(format!("{name}.md")), text)?;
        chart(&drawn, &Path::new(RESULTS).join(format!("{name}.png")))?;
    }
    ensure!(all_within, "a point's peak is over the bound");
    Ok(())
}

/// Writes the workflow of `nodes` pod nodes in a child of our own; its path and the nodes'
/// JSON in MiB.
fn generate(dir: &Path, nodes: usize, shape: Shape) -> anyhow::Result<(PathBuf, f64)> {
    let file = dir.join(format!("{shape:?}-{nodes}.json"));
    let generated = Command::new(std::env::current_exe()?)
        .args(["--bench", "--nodes", &nodes.to_string(), "--shapes"])
        .arg(format!("{shape:?}").to_lowercase())
        .arg("--generate")
        .arg(&file)
        .output()
        .context("generating the workflow")?;
    ensure!(
        generated.status.success(),
        "generating the workflow: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let json: usize = String::from_utf8(generated.stdout)?.trim().parse()?;
    Ok((file, json as f64 / f64::from(1 << 20)))
}

/// One `rewind plan` run.
struct Point {
    /// Peak RSS, MiB.
    peak: f64,
    seconds: f64,
    /// Over Argo's size limit even compressed: Argo would offload the nodes.
    offloaded: bool,
}

/// `rewind plan -f file` by `binary`.
fn run(binary: &Path, file: &Path) -> anyhow::Result<Point> {
    let mut command = Command::new(binary);
    command.args(["plan", "-f"]).arg(file);
    let finished = child::run_measured(command)?;
    let what = format!("{} plan -f {}", binary.display(), file.display());
    let offloaded = finished.stderr.contains(OFFLOAD_REFUSED);
    ensure!(
        finished.success || (offloaded && finished.status == "exit status 1"),
        "{what} failed ({}): {}",
        finished.status,
        finished.stderr
    );
    Ok(Point {
        peak: finished.usage.peak_rss_bytes as f64 / f64::from(1 << 20),
        seconds: finished.wall.as_secs_f64(),
        offloaded,
    })
}

/// One point of the chart: MiB over the base against the nodes' JSON in MiB.
struct Drawn {
    shape: Shape,
    json: f64,
    over: f64,
    theirs: Option<f64>,
}

/// Peak RSS over the base against the nodes' JSON, by shape (and the other build's,
/// dashed), with the bound's line.
fn chart(points: &[Drawn], path: &Path) -> anyhow::Result<()> {
    font::register()?;
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let xmax = points.iter().map(|p| p.json).fold(1.0, f64::max) * 1.05;
    let ymax = points
        .iter()
        .map(|p| p.over.max(p.theirs.unwrap_or_default()))
        .fold(BOUND_BASE_MIB - CONTROLLER_IDLE_MIB + 2.0 * xmax, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "A retry's peak RSS over the base against its nodes' JSON",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("nodes JSON, MiB")
        .y_desc("peak RSS over the base, MiB")
        .label_style(("sans-serif", 14))
        .draw()?;
    let bound = ShapeStyle::from(BLACK).stroke_width(2);
    let intercept = BOUND_BASE_MIB - CONTROLLER_IDLE_MIB;
    chart
        .draw_series(LineSeries::new(
            [(0.0, intercept), (xmax, intercept + 2.0 * xmax)],
            bound,
        ))?
        .label("bound: 32 MiB + 2 × JSON, less 18 MiB idle")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], bound));
    let colours = [
        (Shape::Lean, RGBColor(0, 110, 200)),
        (Shape::Rich, RGBColor(210, 60, 40)),
    ];
    for (shape, colour) in colours {
        let ours: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.shape == shape)
            .map(|p| (p.json, p.over))
            .collect();
        let theirs: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.shape == shape)
            .filter_map(|p| Some((p.json, p.theirs?)))
            .collect();
        for (series, label, width) in [(ours, "", 3), (theirs, ", other build", 1)] {
            if series.is_empty() {
                continue;
            }
            let style = ShapeStyle::from(colour).stroke_width(width);
            chart
                .draw_series(LineSeries::new(series.clone(), style))?
                .label(format!("{shape:?}{label}").to_lowercase())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart.draw_series(
                series
                    .into_iter()
                    .map(|xy| Circle::new(xy, 4, style.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
