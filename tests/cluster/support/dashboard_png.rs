//! The dashboard drawn as a PNG from what Prometheus answered to each of its queries
//! (docs/dashboard.png). Grafana cannot be built here (its web front end is a JavaScript
//! build, not part of its Go module), so this follows its layout by hand: every panel at its
//! place on Grafana's 24-column grid, time series as lines over the run, bar gauges as bars,
//! stats as numbers, each series named by its legend format.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::monitoring_files::{Panel, Query};
use rewind::testenv::prometheus::Series;

#[path = "../../support/font.rs"]
mod font;

/// Pixels per grid column, and per grid row (Grafana's row is 30 px).
const COLUMN: u32 = 75;
const ROW: u32 = 30;
const HEADER: u32 = 44;
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A panel and, for each of its queries, the series Prometheus answered.
pub struct Answered<'p> {
    pub panel: &'p Panel,
    pub answers: Vec<(&'p Query, Vec<Series>)>,
}

/// Draws `panels` (answers over `[start, end]`, Unix seconds) to `path`, under `title`.
pub fn draw(
    path: &Path,
    title: &str,
    panels: &[Answered<'_>],
    (start, end): (f64, f64),
) -> anyhow::Result<()> {
    font::register()?;
    let rows = panels
        .iter()
        .map(|p| p.panel.grid[1] + p.panel.grid[3])
        .max()
        .unwrap_or(0);
    let size = (24 * COLUMN, HEADER + rows * ROW);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw_text(
        title,
        &("sans-serif", 22).into_font().color(&BLACK),
        (12, 10),
    )?;
    for answered in panels {
        let [x, y, w, h] = answered.panel.grid;
        let (left, top) = ((x * COLUMN) as i32, (HEADER + y * ROW) as i32);
        let area = root.clone().shrink((left, top), (w * COLUMN, h * ROW));
        let area = area.margin(3, 3, 3, 3);
        area.fill(&RGBColor(250, 250, 250))?;
        area.draw(&Rectangle::new(
            [(0, 0), ((w * COLUMN - 7) as i32, (h * ROW - 7) as i32)],
            RGBColor(200, 200, 200),
        ))?;
        area.draw_text(
            &answered.panel.title,
            &("sans-serif", 15).into_font().color(&BLACK),
            (8, 6),
        )?;
        let inner = area.margin(26, 4, 4, 4);
        match answered.panel.kind.as_str() {
            "timeseries" => time_series(&inner, answered, (start, end))?,
            "bargauge" => bars(&inner, answered)?,
            _ => numbers(&inner, answered)?,
        }
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `value` in the panel's unit, shortly.
fn formatted(value: f64, unit: &str) -> String {
    match unit {
        "bytes" => format!("{:.0} MiB", value / f64::from(1 << 20)),
        "s" if value < 1.0 => format!("{:.0} ms", value * 1000.0),
        "s" => format!("{value:.1} s"),
        "reqps" => format!("{}/s", formatted(value, "short")),
        _ if value.fract() == 0.0 || value >= 100.0 => format!("{value:.0}"),
        _ if value >= 10.0 => format!("{value:.1}"),
        _ => format!("{value:.2}"),
    }
}

/// Every (legend, series) of a panel's answers that has a finite sample.
fn lines<'a>(answered: &'a Answered<'_>) -> Vec<(String, &'a Series)> {
    answered
        .answers
        .iter()
        .flat_map(|(query, series)| series.iter().map(move |s| (query.legend_of(&s.labels), s)))
        .filter(|(_, s)| s.samples.iter().any(|(_, v)| v.is_finite()))
        .collect()
}

/// Each series' legend and last value.
fn last_values(answered: &Answered<'_>) -> Vec<(String, f64)> {
    lines(answered)
        .into_iter()
        .filter_map(|(legend, s)| Some((legend, s.samples.last()?.1)))
        .collect()
}

fn time_series(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    answered: &Answered<'_>,
    (start, end): (f64, f64),
) -> anyhow::Result<()> {
    let lines = lines(answered);
    let top = lines
        .iter()
        .flat_map(|(_, s)| s.samples.iter().map(|(_, v)| *v))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let unit = answered.panel.unit.clone();
    let mut chart = ChartBuilder::on(area)
        .margin_right(8)
        .x_label_area_size(22)
        .y_label_area_size(62)
        .build_cartesian_2d(0.0..(end - start), 0.0..top)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(235, 235, 235))
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&|s| format!("{s:.0}s"))
        .y_label_formatter(&|v| formatted(*v, &unit))
        .label_style(("sans-serif", 12))
        .draw()?;
    for (i, (legend, series)) in lines.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let style = ShapeStyle::from(colour).stroke_width(2);
        // A gap in the answer (no sample, or not a number) is a gap in the line.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (at, value) in &series.samples {
            if value.is_finite() {
                runs.last_mut().expect("one run").push((at - start, *value));
            } else if !runs.last().expect("one run").is_empty() {
                runs.push(Vec::new());
            }
        }
        for (n, run) in runs.into_iter().filter(|r| !r.is_empty()).enumerate() {
            let drawn = chart.draw_series(LineSeries::new(run, style))?;
            if n == 0 {
                drawn
                    .label(legend.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], style));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 11))
        .draw()?;
    Ok(())
}

/// Horizontal bars of each series' last value.
fn bars(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    answered: &Answered<'_>,
) -> anyhow::Result<()> {
    let values = last_values(answered);
    let top = values.iter().map(|v| v.1).fold(0.0, f64::max).max(1e-3) * 1.25;
    let (width, height) = area.dim_in_pixel();
    let row = (height as f64 / values.len().max(1) as f64).min(30.0);
    let label_width = 150.0;
    for (i, (legend, value)) in values.iter().enumerate() {
        let y = (i as f64 * row) as i32;
        let colour = PALETTE[i % PALETTE.len()];
        area.draw_text(
            legend,
            &("sans-serif", 12).into_font().color(&BLACK),
            (4, y + 4),
        )?;
        let length = (width as f64 - label_width - 80.0) * value / top;
        area.draw(&Rectangle::new(
            [
                (label_width as i32, y + 3),
                ((label_width + length) as i32, y + row as i32 - 3),
            ],
            colour.filled(),
        ))?;
        area.draw_text(
            &formatted(*value, &answered.panel.unit),
            &("sans-serif", 12).into_font().color(&BLACK),
            ((label_width + length) as i32 + 6, y + 4),
        )?;
    }
    Ok(())
}

/// Each series' last value, large, with its name.
fn numbers(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    answered: &Answered<'_>,
) -> anyhow::Result<()> {
    let values = last_values(answered);
    let (width, _) = area.dim_in_pixel();
    let cell = width as i32 / values.len().max(1) as i32;
    for (i, (legend, value)) in values.iter().enumerate() {
        let x = i as i32 * cell + 20;
        area.draw_text(
            &formatted(*value, &answered.panel.unit),
            &("sans-serif", 48)
                .into_font()
                .color(&PALETTE[i % PALETTE.len()]),
            (x, 40),
        )?;
        area.draw_text(
            legend,
            &("sans-serif", 15).into_font().color(&BLACK),
            (x, 110),
        )?;
    }
    Ok(())
}
