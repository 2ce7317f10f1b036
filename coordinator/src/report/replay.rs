//! Miss-rate curves from `replay/results.json`, read through the replay
//! schema (`ReplayReport`): one curve per (policy, split, trace, mode, keep
//! map) over the replayed capacities, and each one-pass LRU curve.

use super::plots::Series;
use crate::replay::results::{LruCurve, Mode, ReplayReport, ResultRow, TraceKind};
use common::Split;
use std::collections::BTreeMap;

fn label(policy: &str, split: Split, trace: TraceKind, mode: Mode, keep_map: &str) -> String {
    format!("{policy} / {split} / {trace} / {mode} / {keep_map}")
}

fn row_label(r: &ResultRow) -> String {
    label(
        r.policy.as_str(),
        r.split,
        r.trace_mode,
        r.mode,
        &r.keep_map,
    )
}

fn curve_label(c: &LruCurve) -> String {
    label(&c.policy, c.split, c.trace_mode, c.mode, &c.keep_map)
}

/// Curves with two or more capacities: the miss rate `1 - hit_rate` of each
/// row (forced misses count as misses) by its mean per-layer capacity, and
/// `misses / requests` of each one-pass LRU curve.
pub fn curves(r: &ReplayReport) -> Vec<Series> {
    let mut found: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for row in &r.rows {
        found
            .entry(row_label(row))
            .or_default()
            .push((row.capacity, 1.0 - row.hit_rate));
    }
    for c in &r.lru_curves {
        let points = c
            .points
            .iter()
            .filter(|p| p.requests > 0)
            .map(|p| (p.capacity as f64, p.misses as f64 / p.requests as f64));
        found.entry(curve_label(c)).or_default().extend(points);
    }
    found
        .into_iter()
        .filter_map(|(label, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points.dedup_by(|a, b| a.0 == b.0);
            (points.len() >= 2).then_some(Series { label, points })
        })
        .collect()
}
