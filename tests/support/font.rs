//! The one font the PNG charts draw text with (the retry benchmark's, the dashboard's):
//! a TrueType file read from the machine (DejaVu Sans, or $REWIND_BENCH_FONT), since
//! plotters' own font loading needs system libraries.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::anyhow;
use plotters::style::FontStyle;

const FONTS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers the font as plotters' "sans-serif", once for the whole process.
pub fn register() -> anyhow::Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = std::env::var("REWIND_BENCH_FONT")
            .ok()
            .or_else(|| {
                FONTS
                    .iter()
                    .find(|p| Path::new(p).is_file())
                    .map(|p| p.to_string())
            })
            .ok_or_else(|| format!("no font file (looked at {FONTS:?}; set REWIND_BENCH_FONT)"))?;
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {path}: {e}"))?;
        // Registered once for the whole process, so leaking it is what 'static asks.
        plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            Box::leak(bytes.into_boxed_slice()),
        )
        .map_err(|_| format!("{path} is not a usable TrueType font"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}
