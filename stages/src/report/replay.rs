//! Miss-rate curves from `replay/results.json` (read through the replay
//! schema, `ReplayReport`), grouped so that every curve is drawn at any run
//! size and no legend grows with the run: one figure per keep map, one panel
//! per (split, trace, mode) in it, one line per policy. The grouping is also
//! written as `report/miss_rate.json` ([`MissRates`]), the data each figure is
//! drawn from.

use super::panels::{small_multiples, Frame, Line, PanelSpec};
use crate::StagesError;
use numbers::Split;
use plotters::style::RGBColor;
use replay::results::{LruCurve, Mode, ReplayReport, TraceKind};
use replay::Policy;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `report/miss_rate.json`: every miss-rate figure of the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MissRates {
    /// One figure per keep map, in the order the replay results list them.
    pub figures: Vec<Figure>,
}

/// The miss-rate figure of one keep map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// Keep map label (`none` or the map's name).
    pub keep_map: String,
    /// File name of the PNG under `report/`.
    pub png: String,
    /// The figure's one legend: the policies drawn, in [`Policy::ALL`] order.
    pub legend: Vec<Policy>,
    /// The replayed capacities, in order: the points drawn with markers
    /// (LRU's line also passes through every integer capacity between them).
    pub capacities: Vec<f64>,
    /// Panels, row by row: rows are (trace, mode), columns are splits.
    pub panels: Vec<Panel>,
    /// Each replayed capacity as given, with the experts per layer and the
    /// bytes (over all layers) it resolved to under this keep map.
    #[serde(default)]
    pub resident: Vec<Resident>,
}

/// What one capacity became under one keep map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resident {
    /// The capacity as given (`0.25`, `64`, `512MiB`).
    pub capacity_spec: String,
    /// Resident experts per layer (the mean over layers).
    pub experts: f64,
    /// Their bytes over all layers, when the model was known.
    pub bytes: Option<u64>,
}

/// One panel: a split, trace and step mode, every policy's curve over capacity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Panel {
    /// Split.
    pub split: Split,
    /// Prefill or decode trace.
    pub trace_mode: TraceKind,
    /// Token or ubatch steps.
    pub mode: Mode,
    /// Grid row of the panel (one per (trace, mode) of the figure).
    pub row: usize,
    /// Grid column of the panel (one per split of the figure).
    pub column: usize,
    /// One curve per policy, in [`Policy::ALL`] order.
    pub curves: Vec<Curve>,
}

/// One policy's miss rate by capacity, in capacity order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// Policy.
    pub policy: Policy,
    /// `(capacity, miss rate)`: mean resident experts per layer, and
    /// `(misses + forced misses) / (requests + forced misses)`.
    pub points: Vec<(f64, f64)>,
}

/// Identifies a panel: keep map, then (trace, mode) row, then split column.
type PanelKey = (usize, (TraceKind, Mode), Split);

/// Groups every result row and one-pass LRU curve of `r` into figures.
///
/// A row's miss rate is `1 - hit_rate` (forced misses count as misses). A
/// one-pass LRU curve gives LRU's line at every integer capacity, with the
/// forced misses of its group, clipped to the capacities replayed in its
/// figure when two or more were; LRU's replayed rows lie on it exactly and
/// are kept as its points there. Keep map labels become file names with
/// every character outside `[A-Za-z0-9_.-]` replaced by `_` (and a numeric
/// suffix should two collide).
pub fn miss_rates(r: &ReplayReport) -> MissRates {
    let mut keep_maps: Vec<&str> = Vec::new();
    let mut rows: BTreeMap<PanelKey, BTreeMap<Policy, Vec<(f64, f64)>>> = BTreeMap::new();
    let mut forced: BTreeMap<PanelKey, u64> = BTreeMap::new();
    let mut resident: BTreeMap<usize, Vec<Resident>> = BTreeMap::new();
    for row in &r.rows {
        let keep = index_of(&row.keep_map, &mut keep_maps);
        let seen = resident.entry(keep).or_default();
        if !seen.iter().any(|x| x.capacity_spec == row.capacity_spec) {
            seen.push(Resident {
                capacity_spec: row.capacity_spec.clone(),
                experts: row.capacity,
                bytes: row.resident_bytes,
            });
        }
        let key = (keep, (row.trace_mode, row.mode), row.split);
        let points = rows.entry(key).or_default().entry(row.policy).or_default();
        points.push((row.capacity, 1.0 - row.hit_rate));
        forced.insert(key, row.forced_misses);
    }
    let mut one_pass: BTreeMap<PanelKey, &LruCurve> = BTreeMap::new();
    for c in &r.lru_curves {
        let keep = index_of(&c.keep_map, &mut keep_maps);
        let key = (keep, (c.trace_mode, c.mode), c.split);
        rows.entry(key).or_default();
        one_pass.insert(key, c);
    }
    let mut taken = Vec::new();
    let mut figures = Vec::new();
    for (keep, label) in keep_maps.iter().enumerate() {
        let in_figure: Vec<_> = rows.iter().filter(|(k, _)| k.0 == keep).collect();
        let grid_rows = distinct(in_figure.iter().map(|(k, _)| k.1));
        let grid_columns = distinct(in_figure.iter().map(|(k, _)| k.2));
        let capacities = distinct(
            in_figure
                .iter()
                .flat_map(|(_, by_policy)| by_policy.values().flatten())
                .map(|p| Capacity(p.0)),
        );
        let capacities: Vec<f64> = capacities.into_iter().map(|c| c.0).collect();
        let span =
            (capacities.len() >= 2).then(|| (capacities[0], capacities[capacities.len() - 1]));
        let panels: Vec<Panel> = in_figure
            .iter()
            .map(|&(key, by_policy)| {
                let mut curves: BTreeMap<Policy, Vec<(f64, f64)>> = by_policy.clone();
                if let Some(c) = one_pass.get(key) {
                    let line = lru_line(c, forced.get(key).copied().unwrap_or(0), span);
                    curves.entry(Policy::Lru).or_default().extend(line);
                }
                Panel {
                    split: key.2,
                    trace_mode: key.1 .0,
                    mode: key.1 .1,
                    row: position(&grid_rows, &key.1),
                    column: position(&grid_columns, &key.2),
                    curves: curves
                        .into_iter()
                        .filter(|(_, points)| !points.is_empty())
                        .map(|(policy, points)| Curve {
                            policy,
                            points: sorted(points),
                        })
                        .collect(),
                }
            })
            .collect();
        let legend = Policy::ALL
            .into_iter()
            .filter(|&p| {
                panels
                    .iter()
                    .flat_map(|pa| &pa.curves)
                    .any(|c| c.policy == p)
            })
            .collect();
        figures.push(Figure {
            keep_map: label.to_string(),
            png: png_name(label, &mut taken),
            legend,
            capacities,
            panels,
            resident: resident.remove(&keep).unwrap_or_default(),
        });
    }
    MissRates { figures }
}

/// A capacity ordered by `total_cmp`, for [`distinct`].
#[derive(Clone, Copy, PartialEq)]
struct Capacity(f64);

impl Eq for Capacity {}

impl PartialOrd for Capacity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Capacity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The index of `label` in `labels`, appended when new.
fn index_of<'a>(label: &'a str, labels: &mut Vec<&'a str>) -> usize {
    labels.iter().position(|l| *l == label).unwrap_or_else(|| {
        labels.push(label);
        labels.len() - 1
    })
}

/// Where `item` sits in `items` (it is always there).
fn position<T: PartialEq>(items: &[T], item: &T) -> usize {
    items.iter().position(|i| i == item).unwrap_or(0)
}

/// Distinct values, in order.
fn distinct<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = items.collect();
    out.sort();
    out.dedup();
    out
}

/// Points in capacity order, one per capacity (the first given wins).
fn sorted(mut points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points.dedup_by(|later, first| later.0 == first.0);
    points
}

/// LRU's miss rate at every integer capacity of `c` (within `span`, if
/// any), forced misses counted as in the result rows.
fn lru_line(c: &LruCurve, forced: u64, span: Option<(f64, f64)>) -> Vec<(f64, f64)> {
    c.points
        .iter()
        .filter(|p| p.requests + forced > 0)
        .map(|p| {
            let rate = (p.misses + forced) as f64 / (p.requests + forced) as f64;
            (p.capacity as f64, rate)
        })
        .filter(|&(x, _)| span.is_none_or(|(lo, hi)| x >= lo && x <= hi))
        .collect()
}

/// `miss_rate_<label>.png`, the label made file-safe and unique.
fn png_name(label: &str, taken: &mut Vec<String>) -> String {
    let safe: String = label
        .chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-') {
                ch
            } else {
                '_'
            }
        })
        .collect();
    let mut name = format!("miss_rate_{safe}.png");
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("miss_rate_{safe}_{n}.png");
        n += 1;
    }
    taken.push(name.clone());
    name
}

/// The colour of `policy` in every miss-rate figure (Okabe-Ito, without
/// its yellow, which is unreadable on white; wine for `static`, a colour no
/// other line or its anti-aliasing against white or black makes).
pub fn colour(policy: Policy) -> RGBColor {
    match policy {
        Policy::Lru => RGBColor(0, 114, 178),
        Policy::Lfu => RGBColor(230, 159, 0),
        Policy::Ema => RGBColor(0, 158, 115),
        Policy::NearPickEma => RGBColor(86, 180, 233),
        Policy::RouterEma => RGBColor(213, 94, 0),
        Policy::InverseRouterEma => RGBColor(204, 121, 167),
        Policy::Belady => RGBColor(0, 0, 0),
        Policy::Static => RGBColor(136, 34, 85),
    }
}

/// Draws `figure`: its panels on a grid, one line per policy, one legend.
pub fn draw(figure: &Figure) -> Result<Vec<u8>, StagesError> {
    let legend: Vec<(String, RGBColor)> = figure
        .legend
        .iter()
        .map(|&p| (p.as_str().to_string(), colour(p)))
        .collect();
    let panels: Vec<PanelSpec<'_>> = figure
        .panels
        .iter()
        .map(|p| PanelSpec {
            row: p.row,
            column: p.column,
            title: format!("{} / {} trace / {} steps", p.split, p.trace_mode, p.mode),
            lines: p
                .curves
                .iter()
                .map(|c| Line {
                    colour: colour(c.policy),
                    points: &c.points,
                })
                .collect(),
        })
        .collect();
    let title = format!(
        "Expert cache miss rate by capacity, keep map {}",
        figure.keep_map
    );
    let frame = Frame {
        title: &title,
        x_label: "capacity (experts per layer)",
        y_label: "miss rate",
        legend: &legend,
        markers_at: &figure.capacities,
    };
    small_multiples(&frame, &panels)
}

/// One line naming what each capacity of a figure became: `capacity 0.25:
/// 4 experts per layer, 12.58 MB; ...`.
pub fn resident_line(f: &Figure) -> String {
    let parts: Vec<String> = f
        .resident
        .iter()
        .map(|r| {
            let bytes = r
                .bytes
                .map_or(String::new(), |b| format!(", {:.2} MB", b as f64 / 1e6));
            format!(
                "capacity {}: {} experts per layer{bytes}",
                r.capacity_spec, r.experts
            )
        })
        .collect();
    parts.join("; ")
}
