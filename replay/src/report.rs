//! Sums per-layer cells into the rows of `replay/results.json` (one per
//! split, trace, mode, policy, capacity and keep map; the schema is in
//! `results`) and renders them as a Markdown table with the fit and
//! held-out splits side by side.

use super::capacity::Capacity;
use super::inputs::Inputs;
use super::policy::{Policy, PolicyParams};
use super::results::{CurvePoint, LayerResult, LruCurve, Mode, ReplayReport, ResultRow, TraceKind};
use super::Counts;
use numbers::Split;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Identifies a result row; `keep` and `capacity` index the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    /// Keep map index.
    pub keep: usize,
    /// Prefill or decode trace.
    pub trace: TraceKind,
    /// Step mode.
    pub mode: Mode,
    /// Policy.
    pub policy: Policy,
    /// Capacity index.
    pub capacity: usize,
    /// Split.
    pub split: Split,
}

/// One layer's replay under one row key.
#[derive(Clone, Debug)]
pub struct Cell {
    /// The row it belongs to.
    pub key: RowKey,
    /// Block index.
    pub layer: u32,
    /// Resident experts in this layer.
    pub capacity: usize,
    /// Tokens replayed.
    pub tokens: u64,
    /// Steps replayed.
    pub steps: u64,
    /// Forced misses.
    pub forced: u64,
    /// What the cache counted.
    pub counts: Counts,
}

/// One layer's LRU misses at every capacity.
#[derive(Clone, Debug)]
pub struct CurveCell {
    /// The row group it belongs to (policy LRU, capacity index 0).
    pub key: RowKey,
    /// Requests of the layer.
    pub requests: u64,
    /// Misses at capacity `0..=n_expert`.
    pub misses: Vec<u64>,
}

/// What every row of one replay shares: the policy parameters, the ubatch
/// of ubatch mode and the capacities as given (a row's key indexes them).
#[derive(Clone, Copy, Debug)]
pub struct Setup<'a> {
    /// Policy parameters.
    pub params: PolicyParams,
    /// Tokens per step in ubatch mode.
    pub ubatch: usize,
    /// Capacities in flag order.
    pub capacities: &'a [Capacity],
}

/// Sums cells over layers into rows and renders the table.
pub fn build(
    setup: Setup<'_>,
    inputs: &Inputs,
    cells: Vec<Cell>,
    curves: Vec<CurveCell>,
) -> ReplayReport {
    let mut groups: BTreeMap<RowKey, Vec<Cell>> = BTreeMap::new();
    for c in cells {
        groups.entry(c.key).or_default().push(c);
    }
    let rows = groups
        .into_iter()
        .map(|(key, mut cells)| {
            cells.sort_by_key(|c| c.layer);
            row(setup, inputs, key, &cells)
        })
        .collect::<Vec<_>>();
    let mut curve_groups: BTreeMap<RowKey, LruCurve> = BTreeMap::new();
    for c in curves {
        let e = curve_groups.entry(c.key).or_insert_with(|| LruCurve {
            policy: LruCurve::POLICY.to_string(),
            split: c.key.split,
            trace_mode: c.key.trace,
            mode: c.key.mode,
            keep_map: inputs.keep[c.key.keep].label.clone(),
            points: (1..c.misses.len())
                .map(|capacity| CurvePoint {
                    capacity,
                    requests: 0,
                    misses: 0,
                })
                .collect(),
        });
        for (p, &m) in e.points.iter_mut().zip(&c.misses[1..]) {
            p.requests += c.requests;
            p.misses += m;
        }
    }
    let mut report = ReplayReport {
        n_expert: inputs.n_expert,
        params: setup.params,
        ubatch: setup.ubatch,
        model: inputs.model.as_ref().map(|m| m.display().to_string()),
        rows,
        lru_curves: curve_groups.into_values().collect(),
        prefetch: Vec::new(),
        accuracy: Vec::new(),
        markdown: String::new(),
    };
    report.markdown = markdown(&report);
    report
}

fn row(setup: Setup<'_>, inputs: &Inputs, key: RowKey, cells: &[Cell]) -> ResultRow {
    let sum = |f: &dyn Fn(&Cell) -> u64| cells.iter().map(f).sum::<u64>();
    let (requests, misses, forced) = (
        sum(&|c| c.counts.requests),
        sum(&|c| c.counts.misses),
        sum(&|c| c.forced),
    );
    let tokens = cells.iter().map(|c| c.tokens).max().unwrap_or(0);
    let bytes_moved = inputs.expert_bytes.as_ref().and_then(|b| {
        cells
            .iter()
            .map(|c| b.get(&c.layer).map(|&x| x * (c.counts.misses + c.forced)))
            .sum::<Option<u64>>()
    });
    let resident_bytes = inputs.expert_bytes.as_ref().and_then(|b| {
        cells
            .iter()
            .map(|c| b.get(&c.layer).map(|&x| x * c.capacity as u64))
            .sum::<Option<u64>>()
    });
    let ratio = |a: f64, b: u64| if b == 0 { 0.0 } else { a / b as f64 };
    ResultRow {
        split: key.split,
        trace_mode: key.trace,
        mode: key.mode,
        ubatch: if key.mode == Mode::Token {
            1
        } else {
            setup.ubatch
        },
        policy: key.policy,
        capacity_spec: setup.capacities[key.capacity].to_string(),
        capacity: cells.iter().map(|c| c.capacity as f64).sum::<f64>() / cells.len().max(1) as f64,
        resident_bytes,
        keep_map: inputs.keep[key.keep].label.clone(),
        tokens,
        layers: cells.len(),
        steps: sum(&|c| c.steps),
        requests,
        misses,
        forced_misses: forced,
        overflow_steps: sum(&|c| c.counts.overflow_steps),
        hit_rate: ratio((requests - misses) as f64, requests + forced),
        misses_per_token: ratio((misses + forced) as f64, tokens),
        bytes_moved,
        bytes_per_token: bytes_moved.map(|b| ratio(b as f64, tokens)),
        per_layer: cells
            .iter()
            .map(|c| LayerResult {
                layer: c.layer,
                layer_capacity: c.capacity,
                requests: c.counts.requests,
                misses: c.counts.misses,
                forced_misses: c.forced,
            })
            .collect(),
    }
}

/// The table: one line per (keep map, trace, mode, policy, capacity), fit and
/// held-out side by side.
pub fn markdown(r: &ReplayReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Cache replay\n\n{} experts per layer, ubatch {}, EMA decay {}, near picks {} (credit {}); \
         misses/token counts every layer and includes forced misses. A capacity is resolved \
         per keep map: `resident` gives the experts per layer it became and their bytes over \
         all layers (the memory compared).\n",
        r.n_expert, r.ubatch, r.params.ema_decay, r.params.near_pick_n, r.params.near_pick_credit
    );
    let _ = writeln!(
        out,
        "| keep map | trace | mode | policy | capacity | resident | fit misses/token | fit hit rate | fit forced/token | \
         heldout misses/token | heldout hit rate | heldout forced/token | fit MB/token | heldout MB/token |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    type Line = (String, TraceKind, Mode, Policy, String);
    let mut lines: BTreeMap<Line, [Option<&ResultRow>; 2]> = BTreeMap::new();
    let mut order = Vec::new();
    for row in &r.rows {
        let k = (
            row.keep_map.clone(),
            row.trace_mode,
            row.mode,
            row.policy,
            row.capacity_spec.clone(),
        );
        let slot = lines.entry(k.clone()).or_insert_with(|| {
            order.push(k);
            [None, None]
        });
        slot[usize::from(row.split == Split::Heldout)] = Some(row);
    }
    for k in order {
        let [fit, held] = lines[&k];
        let f = |row: Option<&ResultRow>, g: &dyn Fn(&ResultRow) -> String| {
            row.map_or("-".to_string(), g)
        };
        let mpt = |r: &ResultRow| format!("{:.3}", r.misses_per_token);
        let hit = |r: &ResultRow| format!("{:.2}%", 100.0 * r.hit_rate);
        let forced =
            |r: &ResultRow| format!("{:.3}", r.forced_misses as f64 / r.tokens.max(1) as f64);
        let mb = |r: &ResultRow| {
            r.bytes_per_token
                .map_or("-".into(), |b| format!("{:.3}", b / 1e6))
        };
        let resident = fit.or(held).map_or("-".to_string(), resident);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.0,
            k.1,
            k.2,
            k.3,
            k.4,
            resident,
            f(fit, &mpt),
            f(fit, &hit),
            f(fit, &forced),
            f(held, &mpt),
            f(held, &hit),
            f(held, &forced),
            f(fit, &mb),
            f(held, &mb),
        );
    }
    out
}

/// A row's resident experts per layer and their bytes: `4 experts, 12.58 MB`
/// (`4 experts` without expert sizes).
pub fn resident(r: &ResultRow) -> String {
    let experts = if r.capacity.fract() == 0.0 {
        format!("{}", r.capacity)
    } else {
        format!("{:.2}", r.capacity)
    };
    match r.resident_bytes {
        Some(b) => format!("{experts} experts, {:.2} MB", b as f64 / 1e6),
        None => format!("{experts} experts"),
    }
}
