//! Sums per-layer prefetch and recall cells into `replay/results.json`'s
//! `prefetch` and `accuracy` rows and renders their tables: fit and
//! held-out side by side, the oracle prefetcher beside each predictor.

use super::capacity::Capacity;
use super::inputs::Inputs;
use super::policy::Policy;
use super::predict::{Predictor, Recall};
use super::prefetch::PrefetchCounts;
use super::results::{AccuracyRow, PrefetchRow, ReplayReport, TraceKind};
use numbers::Split;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Identifies a prefetch row; `capacity` indexes the flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PrefetchKey {
    /// Prefill or decode trace.
    pub trace: TraceKind,
    /// Policy.
    pub policy: Policy,
    /// Capacity index.
    pub capacity: usize,
    /// Guess source.
    pub predictor: Predictor,
    /// Experts prefetched per step at most.
    pub m: usize,
    /// Split.
    pub split: Split,
}

/// One layer's prefetch replay.
#[derive(Clone, Debug)]
pub struct PrefetchCell {
    /// The row it belongs to.
    pub key: PrefetchKey,
    /// Block index.
    pub layer: u32,
    /// Resident experts in this layer.
    pub capacity: usize,
    /// Tokens replayed.
    pub tokens: u64,
    /// With prefetch.
    pub counts: PrefetchCounts,
    /// The same policy's misses without prefetch.
    pub base_misses: u64,
}

/// One layer's recall of one (predictor, m).
#[derive(Clone, Debug)]
pub struct AccuracyCell {
    /// Split.
    pub split: Split,
    /// Trace kind.
    pub trace: TraceKind,
    /// Target layer.
    pub layer: u32,
    /// Guess source.
    pub predictor: Predictor,
    /// Guesses counted.
    pub m: usize,
    /// What was counted.
    pub recall: Recall,
}

/// Adds the prefetch and accuracy rows (and their tables) to `report`.
pub fn add(
    report: &mut ReplayReport,
    capacities: &[Capacity],
    inputs: &Inputs,
    cells: Vec<PrefetchCell>,
    accuracy: Vec<AccuracyCell>,
) {
    let mut groups: BTreeMap<PrefetchKey, Vec<PrefetchCell>> = BTreeMap::new();
    for c in cells {
        groups.entry(c.key).or_default().push(c);
    }
    report.prefetch = groups
        .into_iter()
        .map(|(key, cells)| row(key, capacities, inputs, &cells))
        .collect();
    let mut acc: Vec<AccuracyRow> = accuracy
        .into_iter()
        .map(|c| AccuracyRow {
            split: c.split,
            trace_mode: c.trace,
            layer: c.layer,
            predictor: c.predictor,
            m: c.m,
            tokens: c.recall.tokens,
            selected: c.recall.selected,
            hit: c.recall.hit,
            recall: ratio(c.recall.hit as f64, c.recall.selected).unwrap_or(0.0),
        })
        .collect();
    acc.sort_by_key(|r| (r.trace_mode, r.predictor, r.m, r.layer, r.split));
    report.accuracy = acc;
    let tables = markdown(report);
    report.markdown.push_str(&tables);
}

fn ratio(a: f64, b: u64) -> Option<f64> {
    (b != 0).then(|| a / b as f64)
}

fn row(
    key: PrefetchKey,
    capacities: &[Capacity],
    inputs: &Inputs,
    cells: &[PrefetchCell],
) -> PrefetchRow {
    let sum = |f: &dyn Fn(&PrefetchCell) -> u64| cells.iter().map(f).sum::<u64>();
    let requests = sum(&|c| c.counts.demand.requests);
    let misses = sum(&|c| c.counts.demand.misses);
    let base_misses = sum(&|c| c.base_misses);
    let (loads, useful, wasted) = (
        sum(&|c| c.counts.loads),
        sum(&|c| c.counts.useful),
        sum(&|c| c.counts.wasted),
    );
    let tokens = cells.iter().map(|c| c.tokens).max().unwrap_or(0);
    let bytes = |f: &dyn Fn(&PrefetchCell) -> u64| {
        inputs.expert_bytes.as_ref().and_then(|b| {
            cells
                .iter()
                .map(|c| b.get(&c.layer).map(|&x| x * f(c)))
                .sum::<Option<u64>>()
                .and_then(|total| ratio(total as f64, tokens))
        })
    };
    PrefetchRow {
        split: key.split,
        trace_mode: key.trace,
        policy: key.policy,
        capacity_spec: capacities[key.capacity].to_string(),
        capacity: cells.iter().map(|c| c.capacity as f64).sum::<f64>() / cells.len().max(1) as f64,
        predictor: key.predictor,
        m: key.m,
        tokens,
        layers: cells.len(),
        requests,
        misses,
        base_misses,
        loads,
        useful,
        wasted,
        hit_rate: ratio((requests - misses) as f64, requests).unwrap_or(0.0),
        base_hit_rate: ratio(requests.saturating_sub(base_misses) as f64, requests).unwrap_or(0.0),
        misses_covered: ratio(base_misses as f64 - misses as f64, base_misses),
        wasted_per_useful: ratio(wasted as f64, useful),
        bytes_per_token: bytes(&|c| c.counts.demand.misses + c.counts.loads),
        base_bytes_per_token: bytes(&|c| c.base_misses),
    }
}

/// The prefetch table (fit and held-out side by side) and the mean recall
/// over layers per (trace, predictor, m, split).
pub fn markdown(r: &ReplayReport) -> String {
    let mut out = String::new();
    if r.prefetch.is_empty() && r.accuracy.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\n## Prefetch replay\n\nToken steps, no keep map. Before each step the cache loads at most \
         `m` guessed experts (evicting by the policy's own rule), then serves the step. \
         `covered`: share of the policy's own misses (without prefetch, same layers) that \
         prefetch removed; `waste`: wasted loads per useful load; MB/token counts demand and \
         prefetch loads. `oracle` knows the actual selection.\n"
    );
    let _ = writeln!(
        out,
        "| trace | policy | capacity | predictor | m | fit hit rate (base) | fit covered | fit waste | fit MB/token | \
         heldout hit rate (base) | heldout covered | heldout waste | heldout MB/token |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    type Line = (TraceKind, Policy, String, Predictor, usize);
    let mut lines: BTreeMap<Line, [Option<&PrefetchRow>; 2]> = BTreeMap::new();
    let mut order = Vec::new();
    for row in &r.prefetch {
        let k = (
            row.trace_mode,
            row.policy,
            row.capacity_spec.clone(),
            row.predictor,
            row.m,
        );
        let slot = lines.entry(k.clone()).or_insert_with(|| {
            order.push(k);
            [None, None]
        });
        slot[usize::from(row.split == Split::Heldout)] = Some(row);
    }
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
    let num =
        |x: Option<f64>, scale: f64| x.map_or("-".to_string(), |x| format!("{:.3}", x / scale));
    for k in order {
        let cols = |row: Option<&PrefetchRow>| match row {
            None => "- | - | - | -".to_string(),
            Some(p) => format!(
                "{:.2}% ({:.2}%) | {} | {} | {}",
                100.0 * p.hit_rate,
                100.0 * p.base_hit_rate,
                pct(p.misses_covered),
                num(p.wasted_per_useful, 1.0),
                num(p.bytes_per_token, 1e6)
            ),
        };
        let [fit, held] = lines[&k];
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            k.0,
            k.1,
            k.2,
            k.3,
            k.4,
            cols(fit),
            cols(held)
        );
    }
    let _ = writeln!(
        out,
        "\n### Predictor recall\n\nShare of the actual top-k found among the first `m` guesses, \
         over the layers with a guess (per layer in `results.json`).\n"
    );
    let _ = writeln!(
        out,
        "| trace | predictor | m | fit recall | heldout recall |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|");
    type Acc = (TraceKind, Predictor, usize);
    let mut sums: BTreeMap<Acc, [(u64, u64); 2]> = BTreeMap::new();
    for a in &r.accuracy {
        let s = &mut sums.entry((a.trace_mode, a.predictor, a.m)).or_default()
            [usize::from(a.split == Split::Heldout)];
        s.0 += a.hit;
        s.1 += a.selected;
    }
    for ((trace, predictor, m), [fit, held]) in sums {
        let _ = writeln!(
            out,
            "| {trace} | {predictor} | {m} | {} | {} |",
            pct(ratio(fit.0 as f64, fit.1)),
            pct(ratio(held.0 as f64, held.1))
        );
    }
    out
}
