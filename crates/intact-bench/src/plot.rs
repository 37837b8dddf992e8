//! A benchmark's runs as CSV rows and PNG charts (`intact-bench wan
//! --out DIR`): one row per run, for scripts and spreadsheets, and per
//! item a chart of each way's throughput (median, with the fastest and
//! slowest run as whiskers, the link's limit as a line) beside its CPU
//! seconds, as the RIVA paper's Fig. 11 puts CPU beside time.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::Context;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// The font the charts' text is drawn with (Debian's fonts-dejavu-core,
/// which `scripts/setup --bench` installs).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One way's bar.
pub struct Bar {
    pub label: String,
    /// Its lowest, median and highest throughput (slowest, median and
    /// fastest run), Mbit/s.
    pub min: f64,
    pub median: f64,
    pub max: f64,
    /// Its CPU seconds (median).
    pub cpu: f64,
}

/// Registers [`FONT`] as plotters' sans-serif once; an error says where
/// the font was looked for.
fn font() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = std::fs::read(FONT).map_err(|e| {
            format!("{FONT}: {e} (install fonts-dejavu-core: scripts/setup --bench)")
        })?;
        // plotters keeps the font for the process's life.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT} is not a font plotters can read"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// Draws `bars` as a PNG at `path`: throughput on the left (with the
/// link's `limit`, Mbit/s, as a line), CPU seconds on the right.
pub fn bars_png(path: &Path, title: &str, bars: &[Bar], limit: Option<f64>) -> anyhow::Result<()> {
    font()?;
    let n = bars.len().max(1);
    let height = 90 + 34 * n as u32;
    let root = BitMapBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let (left, right) = root.split_horizontally(1000);
    let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
    let label_of = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            labels.get(*i).copied().unwrap_or("").to_string()
        }
        SegmentValue::Last => String::new(),
    };

    let top = bars.iter().map(|b| b.max).chain(limit).fold(1.0, f64::max) * 1.08;
    let mut chart = ChartBuilder::on(&left)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(430)
        .build_cartesian_2d(0.0..top, (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("Mbit/s (median; whiskers: fastest and slowest run)")
        .y_label_formatter(&label_of)
        .y_labels(n)
        .label_style(("sans-serif", 13))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| bar(i, b.median, BLUE)))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        PathElement::new(
            vec![
                (b.min, SegmentValue::CenterOf(i)),
                (b.max, SegmentValue::CenterOf(i)),
            ],
            BLACK.stroke_width(2),
        )
    }))?;
    if let Some(l) = limit {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(l, SegmentValue::Exact(0)), (l, SegmentValue::Last)],
                RED.stroke_width(2),
            )))?
            .label(format!("iperf3: {l:.0} Mbit/s"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }

    let cpu_top = bars.iter().map(|b| b.cpu).fold(0.1, f64::max) * 1.1;
    let mut cpu = ChartBuilder::on(&right)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..cpu_top, (0..n).into_segmented())?;
    cpu.configure_mesh()
        .disable_y_mesh()
        .x_desc("CPU s (both ends, median)")
        .y_label_formatter(&|_| String::new())
        .label_style(("sans-serif", 13))
        .draw()?;
    cpu.draw_series(bars.iter().enumerate().map(|(i, b)| bar(i, b.cpu, GREEN)))?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The `i`th bar, from 0 to `value`, in `color`.
fn bar(i: usize, value: f64, color: RGBColor) -> Rectangle<(f64, SegmentValue<usize>)> {
    let mut r = Rectangle::new(
        [
            (0.0, SegmentValue::Exact(i)),
            (value, SegmentValue::Exact(i + 1)),
        ],
        color.mix(0.6).filled(),
    );
    r.set_margin(6, 6, 0, 0);
    r
}

/// A file name's part made of `text`: letters and digits kept, runs of
/// anything else one dash.
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_keep_letters_and_digits() {
        assert_eq!(slug("1024 MiB, one file"), "1024-mib-one-file");
        assert_eq!(slug("medium: 200 × 1 MiB"), "medium-200-1-mib");
    }

    #[test]
    fn a_chart_is_a_png_of_the_size_asked() {
        if std::fs::metadata(FONT).is_err() {
            let why = format!("no {FONT} (scripts/setup installs it)");
            intact_testkit::skip("a_chart_is_a_png_of_the_size_asked", &why);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.png");
        let bars = [
            Bar {
                label: "a".into(),
                min: 700.0,
                median: 800.0,
                max: 850.0,
                cpu: 5.0,
            },
            Bar {
                label: "b".into(),
                min: 200.0,
                median: 260.0,
                max: 270.0,
                cpu: 4.0,
            },
        ];
        bars_png(&p, "t", &bars, Some(900.0)).unwrap();
        let png = std::fs::read(&p).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, at bytes 16..24.
        let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((w, h), (1400, 90 + 34 * 2));
    }
}
