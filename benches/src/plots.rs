//! Line charts of metrics against offered load, as SVG, with one line per target.
//!
//! Text is measured with an embedded subset of DejaVu Sans (plotters' `ab_glyph` backend), so the
//! layout comes out the same on machines without system fonts, such as CI; the SVGs name the
//! `sans-serif` family and the viewer picks the font.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// The embedded font (license: `assets/LICENSE-DejaVu.txt`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");

/// Registers the embedded font as `sans-serif` (once; every plotting entry point calls it).
pub fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold, FontStyle::Italic, FontStyle::Oblique] {
            // The font is a compile-time constant known to parse; a failure would show as missing
            // text, never a crash.
            let _ = plotters::style::register_font("sans-serif", style, FONT);
        }
    });
}

/// Colour-blind-safe palette (Okabe-Ito), one colour per target.
pub const COLORS: [RGBColor; 6] =
    [RGBColor(0, 114, 178), RGBColor(213, 94, 0), RGBColor(0, 158, 115), RGBColor(204, 121, 167), RGBColor(230, 159, 0), RGBColor(86, 180, 233)];

/// One line: a target's values at each offered load.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Line {
    /// Legend text.
    pub label: String,
    /// `(offered load, value)`, in load order.
    pub points: Vec<(f64, f64)>,
    /// Half-widths of the values' 95% intervals, drawn as error bars (empty: none).
    pub errors: Vec<f64>,
}

impl Line {
    /// A line without error bars.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self { label: label.into(), points, errors: Vec::new() }
    }
}

/// A horizontal reference line (an SLO threshold).
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// Its value, in the chart's unit.
    pub value: f64,
    /// Legend text, e.g. `SLO: TTFT 2000 ms`.
    pub label: String,
}

/// A chart to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// File stem of the SVG.
    pub name: String,
    /// Caption.
    pub title: String,
    /// X axis description, with unit.
    pub x_desc: String,
    /// Y axis description, with unit.
    pub y_desc: String,
    /// One line per target.
    pub lines: Vec<Line>,
    /// Optional SLO line.
    pub threshold: Option<Threshold>,
    /// Optional ceiling: the best any scheduler could do at each load, drawn dashed.
    pub ceiling: Option<Line>,
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// Draws `chart` on `area`.
pub fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<()>
where
    DB::ErrorType: 'static,
{
    register_fonts();
    let xs = chart.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0.is_finite() { (x0, x1) } else { (0.0, 1.0) };
    // The y range holds every value with its error bar, and the ceiling.
    let spans = chart.lines.iter().chain(&chart.ceiling).flat_map(|l| {
        l.points.iter().enumerate().map(|(i, p)| {
            let e = l.errors.get(i).copied().filter(|e| e.is_finite()).unwrap_or(0.0);
            (p.1 - e, p.1 + e)
        })
    });
    let (mut y0, mut y1) = spans.filter(|s| s.0.is_finite() && s.1.is_finite()).fold((0.0f64, 0.0f64), |(a, b), s| (a.min(s.0), b.max(s.1)));
    if let Some(t) = &chart.threshold {
        y1 = y1.max(t.value);
        y0 = y0.min(t.value);
    }
    if y1 - y0 < 1e-12 {
        y1 = y0 + 1.0;
    }
    // Headroom above the data for the legend (upper left), so it never hides a line.
    let entries = chart.lines.len() + usize::from(chart.threshold.is_some()) + usize::from(chart.ceiling.is_some());
    let plot_px = (area.dim_in_pixel().1 as f64 - 110.0).max(100.0);
    let legend = ((18 * entries + 28) as f64 / plot_px).min(0.6);
    let pad = (y1 - y0) * 0.05;
    let y0 = if y0 < 0.0 { y0 - pad } else { y0 };
    let y1 = y0 + (y1 + pad - y0) / (1.0 - legend);
    let xpad = ((x1 - x0) * 0.05).max(0.05 * x1.abs().max(1.0));
    let mut c = ChartBuilder::on(area)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d((x0 - xpad)..(x1 + xpad), y0..y1)
        .map_err(err)?;
    c.configure_mesh()
        .x_desc(&chart.x_desc)
        .y_desc(&chart.y_desc)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        // No minor grid: its lines were over half of every chart's bytes, and the reports'
        // charts travel with the repository (to CI and to GPU hosts, whose carry is bounded).
        .max_light_lines(0)
        .draw()
        .map_err(err)?;
    if let Some(t) = &chart.threshold {
        let red = RGBColor(200, 30, 30);
        let style = ShapeStyle { color: red.to_rgba(), filled: false, stroke_width: 2 };
        c.draw_series(DashedLineSeries::new(vec![(x0 - xpad, t.value), (x1 + xpad, t.value)], 8, 5, style))
            .map_err(err)?
            .label(&t.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(2)));
    }
    if let Some(ceil) = &chart.ceiling {
        let grey = RGBColor(90, 90, 90);
        let style = ShapeStyle { color: grey.to_rgba(), filled: false, stroke_width: 2 };
        let pts: Vec<(f64, f64)> = ceil.points.iter().copied().filter(|p| p.1.is_finite()).collect();
        c.draw_series(DashedLineSeries::new(pts, 6, 4, style))
            .map_err(err)?
            .label(&ceil.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2)));
    }
    for (i, line) in chart.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = line.points.iter().copied().filter(|p| p.1.is_finite()).collect();
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(err)?;
        let bars = line.points.iter().zip(&line.errors).filter(|(p, e)| p.1.is_finite() && e.is_finite() && **e > 0.0);
        c.draw_series(bars.map(|(&(x, y), &e)| ErrorBar::new_vertical(x, y - e, y, y + e, color.stroke_width(2), 8))).map_err(err)?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Writes `dir/<name>.svg`. SVG only: it renders wherever the reports are read, scales, and is
/// a fraction of a PNG's size in the repository (which also travels to GPU hosts).
pub fn write_chart(dir: &Path, chart: &Chart) -> Result<()> {
    let size = (720, 460);
    let svg = dir.join(format!("{}.svg", chart.name));
    let root = SVGBackend::new(&svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    draw(&root, chart)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `dir/<name>.svg` with `charts` in a grid of `cols` columns.
pub fn write_grid(dir: &Path, name: &str, charts: &[&Chart], cols: usize) -> Result<()> {
    let cols = cols.max(1);
    let rows = charts.len().div_ceil(cols).max(1);
    let size = (560 * cols as u32, 380 * rows as u32);
    let svg = dir.join(format!("{name}.svg"));
    let root = SVGBackend::new(&svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    for (area, chart) in root.split_evenly((rows, cols)).iter().zip(charts) {
        draw(area, chart)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
