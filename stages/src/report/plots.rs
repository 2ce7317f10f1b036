//! PNG plots drawn with plotters into an RGB buffer and encoded with `png`.
//! The font is embedded (DejaVu Sans), so no system font is needed.

use crate::StagesError;
use plotters::prelude::*;
use std::sync::Once;

/// Plot size in pixels.
pub const SIZE: (u32, u32) = (960, 540);

/// Family name the embedded font is registered under.
pub(super) const FONT: &str = "sans-serif";

/// Registers the embedded font once per process.
pub(super) fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err()
        {
            panic!("the embedded DejaVu Sans font does not parse");
        }
    });
}

/// Turns a plotters error into one naming the plot being drawn.
pub(super) fn err<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> StagesError + '_ {
    move |e| StagesError::Draw {
        plot: what.to_string(),
        problem: format!("{e:?}"),
    }
}

/// Encodes an RGB8 buffer as PNG.
pub fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>, StagesError> {
    let encode = |what: &str| {
        let what = what.to_string();
        move |e: png::EncodingError| StagesError::Encode {
            what,
            source: e.into(),
        }
    };
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(encode("the PNG header"))?;
    writer
        .write_image_data(rgb)
        .map_err(encode("the PNG data"))?;
    writer.finish().map_err(encode("the PNG end"))?;
    Ok(out)
}

/// One named line of `(x, y)` points, with intervals drawn as bars.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
    /// Intervals `(x, lo, hi)` drawn as vertical bars (none: empty; an
    /// unknown one, NaN, is not drawn).
    pub intervals: Vec<(f64, f64, f64)>,
}

fn bounds(series: &[Series]) -> ((f64, f64), (f64, f64)) {
    let pts = || {
        series.iter().flat_map(|s| {
            let ends = s
                .intervals
                .iter()
                .filter(|b| b.1.is_finite() && b.2.is_finite())
                .flat_map(|&(x, lo, hi)| [(x, lo), (x, hi)]);
            s.points.iter().copied().chain(ends)
        })
    };
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

/// A line chart with markers and a legend; x is an integer quantity
/// (layer, capacity), so only whole-number ticks are labelled.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<Vec<u8>, StagesError> {
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
            .x_label_formatter(&int_tick)
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
            // An interval's bar, clipped to the plotted range, with caps.
            let cap = (x1 - x0) / 150.0;
            let bars = s
                .intervals
                .iter()
                .filter(|b| b.1.is_finite() && b.2.is_finite())
                .flat_map(|&(x, lo, hi)| {
                    let (lo, hi) = (lo.clamp(0.0, y_top), hi.clamp(0.0, y_top));
                    [
                        vec![(x, lo), (x, hi)],
                        vec![(x - cap, lo), (x + cap, lo)],
                        vec![(x - cap, hi), (x + cap, hi)],
                    ]
                });
            chart
                .draw_series(bars.map(|path| PathElement::new(path, color.stroke_width(1))))
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

/// One heatmap row per layer: (layer, one value per expert).
pub type LayerRows = [(u32, Vec<f64>)];

/// Integer tick labels; fractional tick positions get none.
pub(super) fn int_tick(v: &f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

/// A colour from white (0) through blue to dark red (1).
fn heat(t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let stops = [
        (255.0, 255.0, 255.0),
        (120.0, 170.0, 230.0),
        (40.0, 60.0, 180.0),
        (200.0, 40.0, 40.0),
        (90.0, 0.0, 0.0),
    ];
    let x = t * (stops.len() - 1) as f64;
    let i = (x.floor() as usize).min(stops.len() - 2);
    let f = x - i as f64;
    let mix = |a: f64, b: f64| (a + (b - a) * f).round() as u8;
    let (a, b) = (stops[i], stops[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// A layer x expert heatmap: one row per layer (integer axis, block index),
/// one column per expert; colour is `log(1 + value)` scaled to the largest,
/// so 48 x 512 cells stay readable where a scatter plot would not. A
/// colour bar labels the scale in the value's units.
pub fn heatmap(title: &str, value_label: &str, rows: &LayerRows) -> Result<Vec<u8>, StagesError> {
    register_font();
    let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err(title))?;
        let (main, bar) = root.split_horizontally(SIZE.0 - 110);
        let n_expert = rows.iter().map(|r| r.1.len()).max().unwrap_or(1).max(1);
        let n_rows = rows.len().max(1);
        let max = rows
            .iter()
            .flat_map(|r| r.1.iter())
            .copied()
            .filter(|v| v.is_finite())
            .fold(0f64, f64::max);
        let scale = |v: f64| {
            if max > 0.0 && v.is_finite() {
                v.max(0.0).ln_1p() / max.ln_1p()
            } else {
                0.0
            }
        };
        let mut chart = ChartBuilder::on(&main)
            .caption(title, (FONT, 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n_expert as f64, -0.5f64..n_rows as f64 - 0.5)
            .map_err(err(title))?;
        // Row i spans [i - 0.5, i + 0.5], so whole-number ticks sit at row
        // centres and are labelled with that row's block index.
        let layer_of = |y: &f64| {
            let i = y.round();
            if (y - i).abs() > 1e-9 || i < 0.0 {
                return String::new();
            }
            rows.get(i as usize)
                .map_or(String::new(), |r| r.0.to_string())
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("expert")
            .y_desc("layer")
            .x_label_formatter(&int_tick)
            .y_labels(n_rows.min(25))
            .y_label_formatter(&layer_of)
            .label_style((FONT, 14))
            .draw()
            .map_err(err(title))?;
        let cells = rows.iter().enumerate().flat_map(|(i, (_, values))| {
            values.iter().enumerate().map(move |(e, &v)| {
                Rectangle::new(
                    [(e as f64, i as f64 - 0.5), (e as f64 + 1.0, i as f64 + 0.5)],
                    heat(scale(v)).filled(),
                )
            })
        });
        chart.draw_series(cells).map_err(err(title))?;
        let mut legend = ChartBuilder::on(&bar)
            .margin_top(50)
            .margin_bottom(52)
            .margin_right(8)
            .y_label_area_size(70)
            .caption(value_label, (FONT, 13))
            .build_cartesian_2d(0f64..1.0, 0f64..1.0)
            .map_err(err(title))?;
        let label_at = |t: &f64| {
            let v = (t * max.ln_1p()).exp_m1();
            if v >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        legend
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_labels(5)
            .y_label_formatter(&label_at)
            .label_style((FONT, 12))
            .draw()
            .map_err(err(title))?;
        legend
            .draw_series((0..100).map(|i| {
                let t = i as f64 / 100.0;
                Rectangle::new([(0.0, t), (1.0, t + 0.01)], heat(t).filled())
            }))
            .map_err(err(title))?;
        root.present().map_err(err(title))?;
    }
    encode_png(&buf, SIZE)
}
