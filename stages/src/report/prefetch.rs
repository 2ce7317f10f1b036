//! The prefetch figure (issue #56): hit rate against bytes moved per token
//! for LRU, LRU with prefetch of `m = k` guessed experts (the trace's
//! lookahead at distance 1, else the "same experts as this layer"
//! baseline), LRU with the oracle prefetcher, and Belady, one point per
//! replayed capacity; one panel per trace kind (rows) and split (columns).

use super::panels::{small_multiples, Frame, Line, PanelSpec};
use crate::StagesError;
use numbers::Split;
use plotters::style::RGBColor;
use replay::predict::Predictor;
use replay::results::{PrefetchRow, ReplayReport, TraceKind};
use replay::Policy;

/// The figure's lines: label, colour, and per panel `(x, hit rate)` points.
struct Series {
    label: String,
    colour: RGBColor,
    points: Vec<Vec<(f64, f64)>>,
}

/// The guess source drawn: lookahead at distance 1 when the trace has it.
pub fn drawn_predictor(r: &ReplayReport) -> Option<Predictor> {
    [Predictor::Lookahead(1), Predictor::SameLayer(1)]
        .into_iter()
        .find(|p| r.prefetch.iter().any(|row| row.predictor == *p))
}

/// Draws the figure; `None` when the results hold no prefetch rows with
/// bytes (replay without the model's expert sizes).
pub fn draw(r: &ReplayReport) -> Result<Option<Vec<u8>>, StagesError> {
    let Some(guess) = drawn_predictor(r) else {
        return Ok(None);
    };
    let Some(m) = r.prefetch.iter().map(|row| row.m).min() else {
        return Ok(None);
    };
    let traces: Vec<TraceKind> = [TraceKind::Prefill, TraceKind::Decode]
        .into_iter()
        .filter(|t| r.prefetch.iter().any(|row| row.trace_mode == *t))
        .collect();
    let splits = [Split::Fit, Split::Heldout];
    let panels: Vec<(TraceKind, Split)> = traces
        .iter()
        .flat_map(|&t| splits.map(|s| (t, s)))
        .collect();
    let rows = |policy: Policy, predictor: Predictor, t: TraceKind, s: Split| {
        r.prefetch
            .iter()
            .filter(move |row| {
                (row.policy, row.predictor, row.m, row.trace_mode, row.split)
                    == (policy, predictor, m, t, s)
            })
            .collect::<Vec<&PrefetchRow>>()
    };
    // Bytes in KB or MB, whichever keeps the axis above 1.
    let most = r
        .prefetch
        .iter()
        .flat_map(|row| [row.base_bytes_per_token, row.bytes_per_token])
        .flatten()
        .fold(0f64, f64::max);
    if most == 0.0 {
        return Ok(None);
    }
    let (scale, unit) = if most >= 2e6 {
        (1e6, "MB")
    } else {
        (1e3, "KB")
    };
    let line = |policy, predictor, base: bool| -> Vec<Vec<(f64, f64)>> {
        panels
            .iter()
            .map(|&(t, s)| {
                let mut points: Vec<(f64, f64)> = rows(policy, predictor, t, s)
                    .into_iter()
                    .filter_map(|row| {
                        let (bytes, hit) = match base {
                            true => (row.base_bytes_per_token?, row.base_hit_rate),
                            false => (row.bytes_per_token?, row.hit_rate),
                        };
                        Some((bytes / scale, hit))
                    })
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                points
            })
            .collect()
    };
    let series = [
        Series {
            label: "lru".into(),
            colour: super::replay::colour(Policy::Lru),
            points: line(Policy::Lru, guess, true),
        },
        Series {
            label: format!("lru + {guess} (m = {m})"),
            colour: RGBColor(213, 94, 0),
            points: line(Policy::Lru, guess, false),
        },
        Series {
            label: format!("lru + oracle (m = {m})"),
            colour: RGBColor(0, 158, 115),
            points: line(Policy::Lru, Predictor::Oracle, false),
        },
        Series {
            label: "belady".into(),
            colour: super::replay::colour(Policy::Belady),
            points: line(Policy::Belady, guess, true),
        },
    ];
    let legend: Vec<(String, RGBColor)> =
        series.iter().map(|s| (s.label.clone(), s.colour)).collect();
    let markers: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().flatten().map(|p| p.0))
        .collect();
    let specs: Vec<PanelSpec<'_>> = panels
        .iter()
        .enumerate()
        .map(|(i, &(t, s))| PanelSpec {
            row: traces.iter().position(|x| *x == t).unwrap_or(0),
            column: usize::from(s == Split::Heldout),
            title: format!("{s} / {t} trace / token steps"),
            lines: series
                .iter()
                .map(|x| Line {
                    colour: x.colour,
                    points: &x.points[i],
                })
                .collect(),
        })
        .collect();
    let x_label = format!("{unit} moved per token (demand + prefetch, all layers)");
    let frame = Frame {
        title: "Hit rate against bytes moved, with and without prefetch",
        x_label: &x_label,
        y_label: "hit rate",
        legend: &legend,
        markers_at: &markers,
    };
    small_multiples(&frame, &specs).map(Some)
}
