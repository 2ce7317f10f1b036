//! Replay results: one row per (split, trace, mode, policy, capacity, keep
//! map), summed over layers, as JSON and as a Markdown table with the fit and
//! held-out splits side by side.

use super::policy::{Policy, PolicyParams};
use super::run::{Inputs, Mode, ReplayArgs, TraceKind};
use super::Counts;
use common::Split;
use serde::Serialize;
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

/// One layer of a result row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerResult {
    /// Block index.
    pub layer: u32,
    /// Resident experts.
    pub layer_capacity: usize,
    /// Cache requests.
    pub requests: u64,
    /// Cache misses.
    pub misses: u64,
    /// Forced misses.
    pub forced_misses: u64,
}

/// Results of one (split, trace, mode, policy, capacity, keep map), all layers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResultRow {
    /// `fit` or `heldout`.
    pub split: Split,
    /// `prefill` or `decode`.
    pub trace_mode: TraceKind,
    /// `token` or `ubatch`.
    pub mode: Mode,
    /// Tokens per step.
    pub ubatch: usize,
    /// Policy.
    pub policy: Policy,
    /// Capacity as given (`0.25` or `64`).
    pub capacity_spec: String,
    /// Resident experts per layer (the mean over layers, if they differ).
    pub capacity: f64,
    /// Keep map label (`none` or the map's name).
    pub keep_map: String,
    /// Tokens of the split (per layer).
    pub tokens: u64,
    /// Layers replayed.
    pub layers: usize,
    /// Steps, summed over layers.
    pub steps: u64,
    /// Cache requests (distinct experts per step), summed over layers.
    pub requests: u64,
    /// Cache misses, summed over layers.
    pub misses: u64,
    /// Token slots with no kept expert in the router top-N, summed over layers.
    pub forced_misses: u64,
    /// Steps that needed more experts than the capacity.
    pub overflow_steps: u64,
    /// `(requests - misses) / (requests + forced_misses)`.
    pub hit_rate: f64,
    /// `(misses + forced_misses) / tokens`: expert loads per token, all layers.
    pub misses_per_token: f64,
    /// Bytes loaded: every miss and forced miss moves one expert.
    pub bytes_moved: Option<u64>,
    /// `bytes_moved / tokens`.
    pub bytes_per_token: Option<f64>,
    /// Per layer.
    pub per_layer: Vec<LayerResult>,
}

/// LRU misses at every per-layer capacity, summed over layers (one pass).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LruCurve {
    /// `lru_all_capacities`, naming the curve for plots.
    pub policy: &'static str,
    /// Split.
    pub split: Split,
    /// Trace kind.
    pub trace_mode: TraceKind,
    /// Step mode.
    pub mode: Mode,
    /// Keep map label.
    pub keep_map: String,
    /// Misses at each capacity `1..=n_expert`.
    pub points: Vec<CurvePoint>,
}

/// One capacity of an [`LruCurve`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Resident experts in every layer.
    pub capacity: usize,
    /// Requests, summed over layers.
    pub requests: u64,
    /// Misses, summed over layers.
    pub misses: u64,
}

/// Everything `replay` produced.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// Routed experts per layer.
    pub n_expert: usize,
    /// Policy parameters.
    pub params: PolicyParams,
    /// Tokens per ubatch in ubatch mode.
    pub ubatch: usize,
    /// The model the expert sizes came from.
    pub model: Option<String>,
    /// Result rows, grouped by keep map, trace, mode, policy and capacity.
    pub rows: Vec<ResultRow>,
    /// One-pass LRU curves.
    pub lru_curves: Vec<LruCurve>,
    /// The Markdown table.
    #[serde(skip)]
    pub markdown: String,
}

impl ReplayReport {
    /// `replay/results.json`.
    pub fn json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("replay results serialise")
    }

    /// The row for a (split, trace, mode, policy, capacity, keep map), if any.
    pub fn row(
        &self,
        split: Split,
        trace: TraceKind,
        mode: Mode,
        policy: Policy,
        capacity: &str,
        keep_map: &str,
    ) -> Option<&ResultRow> {
        self.rows.iter().find(|r| {
            (r.split, r.trace_mode, r.mode, r.policy) == (split, trace, mode, policy)
                && r.capacity_spec == capacity
                && r.keep_map == keep_map
        })
    }
}

/// Sums cells over layers into rows and renders the table.
pub fn build(
    args: &ReplayArgs,
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
            row(args, inputs, key, &cells)
        })
        .collect::<Vec<_>>();
    let mut curve_groups: BTreeMap<RowKey, LruCurve> = BTreeMap::new();
    for c in curves {
        let e = curve_groups.entry(c.key).or_insert_with(|| LruCurve {
            policy: "lru_all_capacities",
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
        params: PolicyParams {
            ema_decay: args.ema_decay,
            near_pick_n: args.near_pick_n,
            near_pick_credit: args.near_pick_credit,
        },
        ubatch: args.ubatch,
        model: inputs.model.as_ref().map(|m| m.display().to_string()),
        rows,
        lru_curves: curve_groups.into_values().collect(),
        markdown: String::new(),
    };
    report.markdown = markdown(&report);
    report
}

fn row(args: &ReplayArgs, inputs: &Inputs, key: RowKey, cells: &[Cell]) -> ResultRow {
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
    let ratio = |a: f64, b: u64| if b == 0 { 0.0 } else { a / b as f64 };
    ResultRow {
        split: key.split,
        trace_mode: key.trace,
        mode: key.mode,
        ubatch: if key.mode == Mode::Token {
            1
        } else {
            args.ubatch
        },
        policy: key.policy,
        capacity_spec: args.capacity[key.capacity].to_string(),
        capacity: cells.iter().map(|c| c.capacity as f64).sum::<f64>() / cells.len().max(1) as f64,
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
         misses/token counts every layer and includes forced misses.\n",
        r.n_expert, r.ubatch, r.params.ema_decay, r.params.near_pick_n, r.params.near_pick_credit
    );
    let _ = writeln!(
        out,
        "| keep map | trace | mode | policy | capacity | fit misses/token | fit hit rate | fit forced/token | \
         heldout misses/token | heldout hit rate | heldout forced/token | fit MB/token | heldout MB/token |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
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
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.0,
            serde_plain(&k.1),
            serde_plain(&k.2),
            k.3,
            k.4,
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

fn serde_plain(v: &impl Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
