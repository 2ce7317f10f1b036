//! `saliency.json`: the float view of merged expert statistics (DESIGN section 10).
//!
//! Written from an exact [`ExpertAccum`]; read by scoring, verification and
//! reports through the file's one reader (`runfiles::saliency`). Floats are
//! serialised with shortest round-trip formatting.

use crate::routing::Routing;
use crate::split::{Gating, Split};
use crate::stats::{ExpertAccum, GroupAccum, LayerAccum, MergeError, N_SUMS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One MoE layer's statistics as floats.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerStats {
    /// Model block index.
    pub layer: u32,
    /// Tokens routed to each expert.
    pub count: Vec<u64>,
    /// Sum of router probabilities over all tokens.
    pub prob_sum: Vec<f64>,
    /// Sum of gate weights over routed tokens.
    pub weight_sum: Vec<f64>,
    /// Sum of expert output norms over routed tokens.
    pub ean_sum: Vec<f64>,
    /// Sum of `g * ||y||` over routed tokens.
    pub reap_l2_sum: Vec<f64>,
    /// Sum of `(g * ||y||)^2` over routed tokens.
    pub reap_l2_sq_sum: Vec<f64>,
    /// Largest `||y||` over routed tokens (REAP's max activation; empty
    /// in a file written before it was measured).
    #[serde(default)]
    pub ean_max: Vec<f64>,
    /// Largest single element of `y` over routed tokens and dimensions,
    /// from 0 (REAP's `max_activations`, which its super-expert rule reads;
    /// empty in a file written before it was measured).
    #[serde(default)]
    pub act_max: Vec<f64>,
}

impl From<&LayerAccum> for LayerStats {
    fn from(a: &LayerAccum) -> Self {
        let f = |v: &[crate::ExactSum]| v.iter().map(|x| x.to_f64()).collect();
        LayerStats {
            layer: a.layer,
            count: a.count.clone(),
            prob_sum: f(&a.prob_sum),
            weight_sum: f(&a.weight_sum),
            ean_sum: f(&a.ean_sum),
            reap_l2_sum: f(&a.reap_l2_sum),
            reap_l2_sq_sum: f(&a.reap_l2_sq_sum),
            ean_max: a.ean_max.clone(),
            act_max: a.act_max.clone(),
        }
    }
}

impl LayerStats {
    /// The check that `reap_l2_sq_sum` is at least `reap_l2_sum^2 / count`.
    pub const CAUCHY_SCHWARZ: &str = "Cauchy-Schwarz: reap_l2_sq_sum >= reap_l2_sum^2 / count";

    /// The sums in [`crate::stats::SUM_NAMES`] order.
    pub fn sums(&self) -> [&Vec<f64>; N_SUMS] {
        [
            &self.prob_sum,
            &self.weight_sum,
            &self.ean_sum,
            &self.reap_l2_sum,
            &self.reap_l2_sq_sum,
        ]
    }

    /// Expert `e`'s [`Self::CAUCHY_SCHWARZ`] figures: the margin in units of
    /// the allowed slack ([`crate::stats::cauchy_schwarz_margin`],
    /// below -1 fails), its `reap_l2_sq_sum` and the bound; `None` for an
    /// expert no token selected.
    pub fn cauchy_schwarz(&self, e: usize) -> Option<(f64, f64, f64)> {
        let c = self.count[e];
        let (sum, sq) = (self.reap_l2_sum[e], self.reap_l2_sq_sum[e]);
        (c > 0).then(|| {
            let margin = crate::stats::cauchy_schwarz_margin(sum, sq, c);
            (margin, sq, sum * sum / c as f64)
        })
    }
}

/// Statistics of one domain within a split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DomainStats {
    /// Tokens of this domain in the split.
    pub n_tokens: u64,
    /// Per MoE layer.
    pub layers: Vec<LayerStats>,
}

impl From<&GroupAccum> for DomainStats {
    fn from(g: &GroupAccum) -> Self {
        DomainStats {
            n_tokens: g.n_tokens,
            layers: g.layers.iter().map(LayerStats::from).collect(),
        }
    }
}

/// Statistics of one split: the total, each domain and, in a run that
/// measured images, each modality.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitStats {
    /// Tokens of the split.
    pub n_tokens: u64,
    /// Per MoE layer, all domains together.
    pub layers: Vec<LayerStats>,
    /// Per domain, all its modalities together.
    pub domains: BTreeMap<String, DomainStats>,
    /// Per modality (`text`, `image`), all domains together; absent when
    /// the run measured text only (its file keeps its bytes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modalities: BTreeMap<String, DomainStats>,
}

/// The whole `saliency.json` document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Saliency {
    /// Routed experts per layer.
    pub n_expert: u32,
    /// Experts selected per token.
    pub n_expert_used: u32,
    /// Router gating function.
    pub gating: Gating,
    /// The rest of the routing semantics (weights, gate site, selection
    /// bias, groups, NextN blocks), as llama.cpp's graph computes them.
    #[serde(default)]
    pub routing: Routing,
    /// Trace rows' tokens written (token x layer rows / layers).
    pub trace_tokens_written: u64,
    /// Non-finite values seen and not added, all tensors together.
    pub nonfinite_drops: u64,
    /// Non-finite drops per graph tensor name.
    #[serde(default)]
    pub nonfinite_drops_by_tensor: BTreeMap<String, u64>,
    /// Chunks the statistics cover.
    #[serde(default)]
    pub n_chunks: u64,
    /// `fit` and `heldout`.
    pub splits: BTreeMap<Split, SplitStats>,
}

impl Saliency {
    /// Builds the float view of an exact accumulator.
    pub fn from_accum(
        accum: &ExpertAccum,
        trace_tokens_written: u64,
        nonfinite_drops_by_tensor: &BTreeMap<String, u64>,
        n_chunks: u64,
    ) -> Result<Saliency, MergeError> {
        let mut splits = BTreeMap::new();
        for split in Split::ALL {
            let Some(total) = accum.split_total(split)? else {
                continue;
            };
            let stats = |totals: BTreeMap<String, GroupAccum>| {
                let stats = totals.into_iter().map(|(v, g)| (v, DomainStats::from(&g)));
                stats.collect::<BTreeMap<_, _>>()
            };
            let domains = stats(accum.split_totals_by(split, |k| k.domain.clone())?);
            let modalities = match accum.has_images() {
                true => stats(accum.split_totals_by(split, |k| k.modality.as_str().to_string())?),
                false => BTreeMap::new(),
            };
            splits.insert(
                split,
                SplitStats {
                    n_tokens: total.n_tokens,
                    layers: total.layers.iter().map(LayerStats::from).collect(),
                    domains,
                    modalities,
                },
            );
        }
        Ok(Saliency {
            n_expert: accum.shape.n_expert,
            n_expert_used: accum.shape.n_expert_used,
            gating: accum.shape.gating,
            routing: accum.shape.routing.clone(),
            trace_tokens_written,
            nonfinite_drops: nonfinite_drops_by_tensor.values().sum(),
            nonfinite_drops_by_tensor: nonfinite_drops_by_tensor.clone(),
            n_chunks,
            splits,
        })
    }

    /// Serialises with shortest round-trip floats; the bytes are canonical.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("saliency serialises");
        out.push(b'\n');
        out
    }

    /// The split's statistics, if the run has that split.
    pub fn split(&self, split: Split) -> Option<&SplitStats> {
        self.splits.get(&split)
    }
}
