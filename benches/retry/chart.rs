//! The chart: time against N (floor, rewind, the peer) and the neighbour's p99 per row at
//! the N with the most rows, as a PNG. Text is drawn with a TrueType font read from the machine
//! (DejaVu Sans, or $REWIND_BENCH_FONT): plotters' own font loading needs system libraries.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use rewind::testenv::bench::report::RowSummary;

#[path = "../../tests/support/font.rs"]
mod font;

/// The rows drawn against N, with their colours.
const LINES: [(&str, RGBColor); 6] = [
    ("floor", BLACK),
    ("rewind-bulk", RGBColor(0, 110, 200)),
    ("rewind-pod-qps20", RGBColor(120, 180, 240)),
    ("peer", RGBColor(210, 60, 40)),
    ("argo-cli", RGBColor(240, 150, 60)),
    ("per-pod floor N/20", RGBColor(140, 140, 140)),
];

pub fn draw(summary: &[RowSummary], path: &Path) -> anyhow::Result<()> {
    font::register()?;
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(760);
    against_n(summary, &left)?;
    neighbours(summary, &right)?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn against_n(
    summary: &[RowSummary],
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> anyhow::Result<()> {
    let points = |row: &str| -> Vec<(f64, f64)> {
        summary
            .iter()
            .filter(|s| s.row == row)
            .map(|s| (s.pods as f64, s.wall.median))
            .collect()
    };
    let all: Vec<(f64, f64)> = LINES.iter().flat_map(|(row, _)| points(row)).collect();
    let (nmin, nmax) = all
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (tmin, tmax) = all
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if all.is_empty() {
        return Ok(());
    }
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Retry time against N (median wall seconds)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            ((nmin / 1.5)..(nmax * 1.5)).log_scale(),
            ((tmin / 2.0).max(0.01)..(tmax * 2.0)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("failed pods (N)")
        .x_labels(4)
        .x_label_formatter(&|n| format!("{n:.0}"))
        .y_desc("seconds")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (row, colour) in LINES {
        let p = points(row);
        if p.is_empty() {
            continue;
        }
        let style = ShapeStyle::from(colour).stroke_width(2);
        chart
            .draw_series(LineSeries::new(p.clone(), style))?
            .label(row)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(p.into_iter().map(|xy| Circle::new(xy, 4, style.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

fn neighbours(
    summary: &[RowSummary],
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> anyhow::Result<()> {
    // The N with the most rows measured, the largest of those: the comparison across rows.
    let measured = |n: usize| {
        summary
            .iter()
            .filter(|s| s.pods == n && s.during_p99_ms.is_some())
            .count()
    };
    let Some(n) = summary
        .iter()
        .filter(|s| s.during_p99_ms.is_some())
        .map(|s| s.pods)
        .max_by_key(|&n| (measured(n), n))
    else {
        return Ok(());
    };
    let rows: Vec<(&str, f64, f64)> = summary
        .iter()
        .filter(|s| s.pods == n)
        .filter_map(|s| {
            Some((
                s.row.as_str(),
                s.idle_p99_ms?.median,
                s.during_p99_ms?.median,
            ))
        })
        .collect();
    let top = rows.iter().map(|r| r.1.max(r.2)).fold(1.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("Neighbour p99 (ms) at N = {n}: idle → during"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(140)
        .build_cartesian_2d(0.0..top, (0..rows.len()).into_segmented())?;
    let names: Vec<String> = rows.iter().map(|r| r.0.to_owned()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(WHITE)
        .x_desc("milliseconds")
        .label_style(("sans-serif", 14))
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_labels(rows.len())
        .draw()?;
    let bar = |i: usize, value: f64, lower: bool, colour: RGBColor| {
        let (a, b) = match lower {
            true => (SegmentValue::Exact(i), SegmentValue::CenterOf(i)),
            false => (SegmentValue::CenterOf(i), SegmentValue::Exact(i + 1)),
        };
        Rectangle::new([(0.0, a), (value, b)], colour.filled())
    };
    let idle = RGBColor(170, 170, 170);
    let during = RGBColor(210, 60, 40);
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .map(|(i, r)| bar(i, r.1, true, idle)),
        )?
        .label("idle")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], idle.filled()));
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .map(|(i, r)| bar(i, r.2, false, during)),
        )?
        .label("during the retry")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], during.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}
