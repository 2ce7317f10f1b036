//! PNG plots drawn with plotters into an RGB buffer and encoded with `png`.
//! The font is embedded (DejaVu Sans), so no system font is needed.

use anyhow::{anyhow, Context};
use plotters::prelude::*;
use std::sync::Once;

/// Plot size in pixels.
pub const SIZE: (u32, u32) = (960, 540);

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err()
        {
            panic!("the embedded DejaVu Sans font does not parse");
        }
    });
}

/// Tick labels without a decimal tail for whole numbers.
fn tick(v: &f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn err<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| anyhow!("drawing {what}: {e:?}")
}

/// Encodes an RGB8 buffer as PNG.
pub fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().context("PNG header")?;
    writer.write_image_data(rgb).context("PNG data")?;
    writer.finish().context("PNG end")?;
    Ok(out)
}

/// One named line of `(x, y)` points.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

fn bounds(series: &[Series]) -> ((f64, f64), (f64, f64)) {
    let pts = || series.iter().flat_map(|s| s.points.iter().copied());
    let fold = |f: fn(&(f64, f64)) -> f64| {
        pts()
            .map(|p| f(&p))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let widen = |(lo, hi): (f64, f64)| {
        if !lo.is_finite() {
            (0.0, 1.0)
        } else if hi - lo < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo, hi)
        }
    };
    (widen(fold(|p| p.0)), widen(fold(|p| p.1)))
}

/// A line chart with markers and a legend.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> anyhow::Result<Vec<u8>> {
    register_font();
    let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err(title))?;
        let ((x0, x1), (_, y1)) = bounds(series);
        let y_top = if y1 > 0.0 { y1 * 1.05 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, 0f64..y_top)
            .map_err(err(title))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_label_formatter(&tick)
            .label_style((FONT, 14))
            .draw()
            .map_err(err(title))?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err(title))?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err(title))?;
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err(title))?;
        root.present().map_err(err(title))?;
    }
    encode_png(&buf, SIZE)
}

/// Per-layer distribution of expert counts on a log axis: one dot per
/// expert at `count + 1` (dead experts sit on the floor at 1), and the
/// layer's median as a line.
pub fn count_distribution(layers: &[(u32, Vec<u64>)]) -> anyhow::Result<Vec<u8>> {
    let title = "Expert token counts per layer (count + 1, log scale)";
    register_font();
    let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err(title))?;
        let max = layers
            .iter()
            .flat_map(|l| l.1.iter())
            .copied()
            .max()
            .unwrap_or(1)
            .max(1) as f64
            + 1.0;
        let lo = layers.iter().map(|l| l.0).min().unwrap_or(0) as f64 - 0.5;
        let hi = layers.iter().map(|l| l.0).max().unwrap_or(0) as f64 + 0.5;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(lo..hi, (1f64..max * 2.0).log_scale())
            .map_err(err(title))?;
        chart
            .configure_mesh()
            .x_desc("layer")
            .y_desc("tokens routed + 1")
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .label_style((FONT, 14))
            .draw()
            .map_err(err(title))?;
        let dots = layers.iter().flat_map(|(l, counts)| {
            let n = counts.len().max(1) as f64;
            counts.iter().enumerate().map(move |(e, &c)| {
                let jitter = (e as f64 / n - 0.5) * 0.6;
                Circle::new(
                    (*l as f64 + jitter, c as f64 + 1.0),
                    2,
                    BLUE.mix(0.5).filled(),
                )
            })
        });
        chart.draw_series(dots).map_err(err(title))?;
        let medians = layers.iter().map(|(l, counts)| {
            let mut v = counts.clone();
            v.sort_unstable();
            (
                *l as f64,
                v.get(v.len() / 2).copied().unwrap_or(0) as f64 + 1.0,
            )
        });
        chart
            .draw_series(LineSeries::new(medians, RED.stroke_width(2)))
            .map_err(err(title))?
            .label("median")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err(title))?;
        root.present().map_err(err(title))?;
    }
    encode_png(&buf, SIZE)
}
