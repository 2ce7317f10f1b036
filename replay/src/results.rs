//! `replay/results.json`: the schema of replay results, one set of types
//! shared by the writer (`replay::report`) and every reader (the run
//! report's miss-rate plots), so a renamed field fails to compile instead of
//! silently dropping a plot.

use super::policy::{Policy, PolicyParams};
use super::predict::Predictor;
use crate::ReplayError;
use numbers::Split;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What one cache step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One token (decode-like).
    Token,
    /// One ubatch of a chunk (prefill-like): the union of its experts.
    Ubatch,
}

/// Where a trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceKind {
    /// Teacher-forced prefill of corpus chunks: `trace/*.parquet`.
    Prefill,
    /// Tokens the model generated itself: `trace/decode/*.parquet`.
    Decode,
}

impl Mode {
    /// Parses `token` or `ubatch`.
    pub fn parse(s: &str) -> Option<Mode> {
        [Mode::Token, Mode::Ubatch]
            .into_iter()
            .find(|m| m.to_string() == s)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Token => "token",
            Mode::Ubatch => "ubatch",
        })
    }
}

impl fmt::Display for TraceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceKind::Prefill => "prefill",
            TraceKind::Decode => "decode",
        })
    }
}

/// One layer of a result row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Bytes of the resident experts over all layers (experts per layer
    /// times the layer's expert size), when the model is known: the memory
    /// this capacity is under this keep map.
    #[serde(default)]
    pub resident_bytes: Option<u64>,
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LruCurve {
    /// [`LruCurve::POLICY`], naming the curve for plots.
    pub policy: String,
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
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Resident experts in every layer.
    pub capacity: usize,
    /// Requests, summed over layers.
    pub requests: u64,
    /// Misses, summed over layers.
    pub misses: u64,
}

/// Everything `replay` produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Prefetch replay rows (token steps, no keep map); empty in results
    /// written before prefetch replay.
    #[serde(default)]
    pub prefetch: Vec<PrefetchRow>,
    /// Predictor recall per layer; empty in results written before it.
    #[serde(default)]
    pub accuracy: Vec<AccuracyRow>,
    /// The Markdown table (`replay/report.md`, not part of the JSON).
    #[serde(skip)]
    pub markdown: String,
}

/// Prefetch replay of one (split, trace, policy, capacity, predictor, m),
/// token steps, no keep map, summed over the layers the predictor covers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefetchRow {
    /// `fit` or `heldout`.
    pub split: Split,
    /// `prefill` or `decode`.
    pub trace_mode: TraceKind,
    /// Policy (its own eviction rule for prefetch loads too).
    pub policy: Policy,
    /// Capacity as given.
    pub capacity_spec: String,
    /// Resident experts per layer (the mean over layers).
    pub capacity: f64,
    /// Where the guesses came from.
    pub predictor: Predictor,
    /// Experts prefetched per step at most (also at most the capacity).
    pub m: usize,
    /// Tokens of the split (per layer).
    pub tokens: u64,
    /// Layers replayed (those `d` or more past the first traced layer).
    pub layers: usize,
    /// Demand requests, summed over layers.
    pub requests: u64,
    /// Misses left with prefetch.
    pub misses: u64,
    /// The same policy's misses without prefetch on the same layers.
    pub base_misses: u64,
    /// Prefetch loads.
    pub loads: u64,
    /// Prefetch loads requested before eviction.
    pub useful: u64,
    /// Prefetch loads never used.
    pub wasted: u64,
    /// `(requests - misses) / requests`.
    pub hit_rate: f64,
    /// The policy's hit rate without prefetch on the same layers.
    pub base_hit_rate: f64,
    /// `(base_misses - misses) / base_misses`: the share of the policy's
    /// misses prefetch covered (negative: it evicted more than it saved).
    pub misses_covered: Option<f64>,
    /// `wasted / useful`.
    pub wasted_per_useful: Option<f64>,
    /// `(misses + loads) x expert bytes / tokens`, all layers replayed.
    pub bytes_per_token: Option<f64>,
    /// `base_misses x expert bytes / tokens`.
    pub base_bytes_per_token: Option<f64>,
}

/// Recall of one layer's actual top-k by a predictor's first `m` guesses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccuracyRow {
    /// `fit` or `heldout`.
    pub split: Split,
    /// `prefill` or `decode`.
    pub trace_mode: TraceKind,
    /// Target layer (the guess was made `d` layers earlier).
    pub layer: u32,
    /// Where the guesses came from.
    pub predictor: Predictor,
    /// Guesses counted (at most the predictor's width).
    pub m: usize,
    /// Tokens with a guess.
    pub tokens: u64,
    /// Selected experts of those tokens.
    pub selected: u64,
    /// Of those, among the first `m` guesses.
    pub hit: u64,
    /// `hit / selected`.
    pub recall: f64,
}

impl LruCurve {
    /// The `policy` of every one-pass LRU curve.
    pub const POLICY: &'static str = "lru_all_capacities";
}

impl ReplayReport {
    /// `replay/results.json`.
    pub fn json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("replay results serialise")
    }

    /// Reads `replay/results.json`; `url` names it in the error.
    pub fn from_json(bytes: &[u8], url: &str) -> Result<ReplayReport, ReplayError> {
        serde_json::from_slice(bytes).map_err(|source| ReplayError::Results {
            url: url.to_string(),
            source,
        })
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
