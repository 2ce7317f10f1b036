//! Per-expert REAP statistics with an exact, serialisable merge.
//!
//! A [`ExpertAccum`] holds one [`GroupAccum`] per (split, domain, modality)
//! ([`GroupKey`]); each holds
//! one [`LayerAccum`] per MoE layer. Integer counts and [`ExactSum`] floats
//! make `merge` associative and commutative, bit for bit.

use crate::exact::{ExactError, ExactSum, FRACTION_BITS};
use crate::routing::Routing;
use crate::split::{Gating, Modality, Split};
use serde::{Deserialize, Serialize};
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

/// The statistics of one MoE layer, one entry per routed expert.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerAccum {
    /// Model block index of this MoE layer.
    pub layer: u32,
    /// Tokens whose top-k contains the expert.
    pub count: Vec<u64>,
    /// Router probability of the expert, over all tokens.
    pub prob_sum: Vec<ExactSum>,
    /// Gate weight that multiplies the expert's output, over routed tokens.
    pub weight_sum: Vec<ExactSum>,
    /// L2 norm of the expert's output, over routed tokens.
    pub ean_sum: Vec<ExactSum>,
    /// `g * ||y||`, over routed tokens.
    pub reap_l2_sum: Vec<ExactSum>,
    /// `(g * ||y||)^2`, over routed tokens.
    pub reap_l2_sq_sum: Vec<ExactSum>,
    /// Largest L2 norm of the expert's output over routed tokens (0 before
    /// any): REAP's max-activation statistic, which finds super experts.
    /// A maximum merges exactly.
    pub ean_max: Vec<f64>,
    /// Largest single element of the expert's output `y` over routed tokens
    /// and hidden dimensions (0 before any, so never negative): REAP's
    /// `max_activations` (`pruning_metrics.py`, a signed maximum from 0),
    /// the statistic its super-expert rule is tuned for. Merges as a maximum.
    pub act_max: Vec<f64>,
}

impl LayerAccum {
    /// An empty accumulator for `n_expert` experts of block `layer`.
    pub fn new(layer: u32, n_expert: usize) -> Self {
        let z = vec![ExactSum::ZERO; n_expert];
        LayerAccum {
            layer,
            count: vec![0; n_expert],
            prob_sum: z.clone(),
            weight_sum: z.clone(),
            ean_sum: z.clone(),
            reap_l2_sum: z.clone(),
            reap_l2_sq_sum: z,
            ean_max: vec![0.0; n_expert],
            act_max: vec![0.0; n_expert],
        }
    }

    /// Adds another layer's statistics (same layer, same expert count).
    pub fn merge(&mut self, other: &LayerAccum) -> Result<(), MergeError> {
        if self.layer != other.layer || self.count.len() != other.count.len() {
            return Err(MergeError::Shape(format!(
                "layer {} with {} experts vs layer {} with {} experts",
                self.layer,
                self.count.len(),
                other.layer,
                other.count.len()
            )));
        }
        for (a, b) in self.count.iter_mut().zip(&other.count) {
            *a = a.checked_add(*b).ok_or(MergeError::CountOverflow)?;
        }
        for (dst, src) in self.sums_mut().into_iter().zip(other.sums()) {
            crate::exact::add_all(dst, src).map_err(|(_, v)| ExactError::Overflow(v))?;
        }
        max_into(&mut self.ean_max, &other.ean_max)?;
        max_into(&mut self.act_max, &other.act_max)
    }
}

/// Raises each of `dst` to the matching value of `src` where that is larger.
pub fn max_into(dst: &mut [f64], src: &[f64]) -> Result<(), MergeError> {
    if dst.len() != src.len() {
        return Err(MergeError::Shape(format!(
            "{} maxima vs {}",
            dst.len(),
            src.len()
        )));
    }
    for (a, b) in dst.iter_mut().zip(src) {
        *a = a.max(*b);
    }
    Ok(())
}

/// The names of the exact per-expert sums, in the order of
/// [`LayerAccum::sums`]: the one list every stage (merge, encoding, checks,
/// `saliency.json` and `saliency.parquet`, verify) walks the sums in.
pub const SUM_NAMES: [&str; N_SUMS] = [
    "prob_sum",
    "weight_sum",
    "ean_sum",
    "reap_l2_sum",
    "reap_l2_sq_sum",
];

/// How many exact sums an expert has.
pub const N_SUMS: usize = 5;

/// What a token routed to an expert adds to the sums after `prob_sum`
/// (those of [`SUM_NAMES`]`[1..]`): gate weight `g`, output norm `n` and
/// REAP's `r` (`g * n`, or `n` where the gate is inside the expert).
pub fn routed_terms(g: f64, n: f64, r: f64) -> [f64; N_SUMS - 1] {
    [g, n, r, r * r]
}

/// Relative slack of the Cauchy-Schwarz bound: sums are exact, but each
/// `(g * ||y||)^2` term was rounded before it was added.
pub const CAUCHY_SCHWARZ_RTOL: f64 = 1e-6;

/// `(sq - sum^2 / count) / slack` for an expert with `count > 0`: how far
/// `reap_l2_sq_sum` lies above the Cauchy-Schwarz bound, in units of the
/// rounding slack ([`CAUCHY_SCHWARZ_RTOL`] relative, plus 2^-64 per routed
/// token: a term whose square is below the grid adds 0). Below -1 the
/// statistics are impossible.
pub fn cauchy_schwarz_margin(sum: f64, sq: f64, count: u64) -> f64 {
    let bound = sum * sum / count as f64;
    let slack = CAUCHY_SCHWARZ_RTOL * bound + count as f64 * (-f64::from(FRACTION_BITS)).exp2();
    (sq - bound) / slack
}

/// Compact per-chunk statistics of the fit split (bootstrap resampling of
/// keep maps needs them; floats need not be exact here).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChunkStats {
    /// Chunk id.
    pub chunk: u32,
    /// Fit tokens in the chunk.
    pub n_tokens: u32,
    /// `count` per (MoE layer, expert), row-major `[layer][expert]`.
    pub count: Vec<u32>,
    /// `reap_l2_sum` per (MoE layer, expert), same layout.
    pub reap_l2_sum: Vec<f32>,
    /// `reap_l2_sq_sum` per (MoE layer, expert), same layout.
    pub reap_l2_sq_sum: Vec<f32>,
}

impl ChunkStats {
    /// A chunk's statistics from its per-cell counts and f64 sums in
    /// [`SUM_NAMES`] order (each `cells` long), rounded to f32.
    pub fn from_sums(
        chunk: u32,
        n_tokens: u32,
        count: Vec<u32>,
        sums: &[Vec<f64>; N_SUMS],
    ) -> Self {
        let f32s = |v: &[f64]| v.iter().map(|x| *x as f32).collect();
        let [_prob, _weight, _ean, reap_l2, reap_l2_sq] = sums;
        ChunkStats {
            chunk,
            n_tokens,
            count,
            reap_l2_sum: f32s(reap_l2),
            reap_l2_sq_sum: f32s(reap_l2_sq),
        }
    }

    /// Cells (MoE layers x experts) when every per-cell vector has that
    /// length, `None` when they disagree.
    pub fn cells(&self) -> Option<usize> {
        let n = self.count.len();
        (self.reap_l2_sum.len() == n && self.reap_l2_sq_sum.len() == n).then_some(n)
    }

    /// The totals over the chunks `pick` (repeats count again) of count,
    /// `reap_l2_sum` and `reap_l2_sq_sum`, per cell, in f64.
    pub fn totals(chunks: &[ChunkStats], pick: &[usize], cells: usize) -> [Vec<f64>; 3] {
        let [mut count, mut sum, mut sq] = [0, 1, 2].map(|_| vec![0f64; cells]);
        let add = |total: &mut [f64], v: &[f32]| {
            total
                .iter_mut()
                .zip(v)
                .for_each(|(t, x)| *t += f64::from(*x));
        };
        for c in pick.iter().map(|&i| &chunks[i]) {
            count
                .iter_mut()
                .zip(&c.count)
                .for_each(|(t, x)| *t += f64::from(*x));
            add(&mut sum, &c.reap_l2_sum);
            add(&mut sq, &c.reap_l2_sq_sum);
        }
        [count, sum, sq]
    }
}

impl LayerAccum {
    /// The five exact statistics in declaration order (`prob_sum` first):
    /// the order the merge and the partial encoding walk them in.
    pub fn sums(&self) -> [&Vec<ExactSum>; N_SUMS] {
        [
            &self.prob_sum,
            &self.weight_sum,
            &self.ean_sum,
            &self.reap_l2_sum,
            &self.reap_l2_sq_sum,
        ]
    }

    /// [`LayerAccum::sums`], writable.
    pub fn sums_mut(&mut self) -> [&mut Vec<ExactSum>; N_SUMS] {
        [
            &mut self.prob_sum,
            &mut self.weight_sum,
            &mut self.ean_sum,
            &mut self.reap_l2_sum,
            &mut self.reap_l2_sq_sum,
        ]
    }
}

/// Statistics of one (split, domain) group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupAccum {
    /// Tokens of this group that went through the model.
    pub n_tokens: u64,
    /// One entry per MoE layer, in block order.
    pub layers: Vec<LayerAccum>,
}

impl GroupAccum {
    /// An empty group for the given MoE layers.
    pub fn new(moe_layers: &[u32], n_expert: usize) -> Self {
        GroupAccum {
            n_tokens: 0,
            layers: moe_layers
                .iter()
                .map(|&l| LayerAccum::new(l, n_expert))
                .collect(),
        }
    }

    /// Adds another group's statistics.
    pub fn merge(&mut self, other: &GroupAccum) -> Result<(), MergeError> {
        if self.layers.len() != other.layers.len() {
            return Err(MergeError::Shape(format!(
                "{} MoE layers vs {}",
                self.layers.len(),
                other.layers.len()
            )));
        }
        self.n_tokens = self
            .n_tokens
            .checked_add(other.n_tokens)
            .ok_or(MergeError::CountOverflow)?;
        for (a, b) in self.layers.iter_mut().zip(&other.layers) {
            a.merge(b)?;
        }
        Ok(())
    }
}

/// Key of a statistics group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "KeyForm", from = "KeyForm")]
pub struct GroupKey {
    /// Fit or held-out.
    pub split: Split,
    /// Domain name from the corpus config.
    pub domain: String,
    /// Text tokens or image positions.
    pub modality: Modality,
}

impl GroupKey {
    /// The key of `domain`'s text tokens in `split`.
    pub fn text(split: Split, domain: &str) -> GroupKey {
        GroupKey {
            split,
            domain: domain.to_string(),
            modality: Modality::Text,
        }
    }
}

impl std::fmt::Display for GroupKey {
    /// `split/domain`, and `/image` for image positions (the domain is a
    /// peer's text: bounded and escaped).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            self.split,
            crate::peer_text::peer_text(&self.domain)
        )?;
        match self.modality {
            Modality::Text => Ok(()),
            m => write!(f, "/{m}"),
        }
    }
}

/// How a [`GroupKey`] is stored: one tag for split and modality, then the
/// domain. A text key is stored as partials before modalities stored
/// `(split, domain)` (the tags of text are the split's), so those still
/// decode, as text.
#[derive(Serialize, Deserialize)]
struct KeyForm {
    tag: KeyTag,
    domain: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KeyTag {
    Fit,
    Heldout,
    FitImage,
    HeldoutImage,
}

impl From<GroupKey> for KeyForm {
    fn from(k: GroupKey) -> KeyForm {
        let tag = match (k.split, k.modality) {
            (Split::Fit, Modality::Text) => KeyTag::Fit,
            (Split::Heldout, Modality::Text) => KeyTag::Heldout,
            (Split::Fit, Modality::Image) => KeyTag::FitImage,
            (Split::Heldout, Modality::Image) => KeyTag::HeldoutImage,
        };
        KeyForm {
            tag,
            domain: k.domain,
        }
    }
}

impl From<KeyForm> for GroupKey {
    fn from(f: KeyForm) -> GroupKey {
        let (split, modality) = match f.tag {
            KeyTag::Fit => (Split::Fit, Modality::Text),
            KeyTag::Heldout => (Split::Heldout, Modality::Text),
            KeyTag::FitImage => (Split::Fit, Modality::Image),
            KeyTag::HeldoutImage => (Split::Heldout, Modality::Image),
        };
        GroupKey {
            split,
            domain: f.domain,
            modality,
        }
    }
}

/// The model facts every accumulator of a run must agree on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeShape {
    /// Routed experts per MoE layer.
    pub n_expert: u32,
    /// Experts selected per token (k).
    pub n_expert_used: u32,
    /// Router gating function.
    pub gating: Gating,
    /// Block indices of the MoE layers, ascending: the blocks whose graph
    /// emits `ffn_moe_topk` in a decode.
    pub moe_layers: Vec<u32>,
    /// The rest of the routing semantics, as the graph computes them.
    pub routing: Routing,
}

impl std::fmt::Display for MoeShape {
    /// A bounded description: the layer list may come from a peer.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} experts, top-{}, {:?} gating, MoE layers [{}]",
            self.n_expert,
            self.n_expert_used,
            self.gating,
            crate::peer_text::summarise(&self.moe_layers)
        )
    }
}

/// All REAP statistics of a partial or merged result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertAccum {
    /// The model's MoE shape.
    pub shape: MoeShape,
    /// Statistics per (split, domain, modality).
    pub groups: BTreeMap<GroupKey, GroupAccum>,
}

impl ExpertAccum {
    /// An empty accumulator.
    pub fn new(shape: MoeShape) -> Self {
        ExpertAccum {
            shape,
            groups: BTreeMap::new(),
        }
    }

    /// The group of `domain`'s text tokens in `split`, created empty on
    /// first use.
    pub fn group_mut(&mut self, split: Split, domain: &str) -> &mut GroupAccum {
        self.group_of(GroupKey::text(split, domain))
    }

    /// The group of `key`, created empty on first use.
    pub fn group_of(&mut self, key: GroupKey) -> &mut GroupAccum {
        let shape = &self.shape;
        self.groups
            .entry(key)
            .or_insert_with(|| GroupAccum::new(&shape.moe_layers, shape.n_expert as usize))
    }

    /// Adds another accumulator of the same model.
    pub fn merge(&mut self, other: &ExpertAccum) -> Result<(), MergeError> {
        if self.shape != other.shape {
            return Err(MergeError::Shape(format!(
                "MoE shape {:?} vs {:?}",
                self.shape, other.shape
            )));
        }
        for (key, group) in &other.groups {
            self.group_of(key.clone()).merge(group)?;
        }
        Ok(())
    }

    /// The exact sum of every group of `split` (None if it has none).
    pub fn split_total(&self, split: Split) -> Result<Option<GroupAccum>, MergeError> {
        let mut total: Option<GroupAccum> = None;
        for group in self
            .groups
            .iter()
            .filter(|(k, _)| k.split == split)
            .map(|(_, g)| g)
        {
            match total.as_mut() {
                Some(t) => t.merge(group)?,
                None => total = Some(group.clone()),
            }
        }
        Ok(total)
    }

    /// The exact sums of the groups of `split` that `by` gives one value
    /// (a domain, a modality), in one pass.
    pub fn split_totals_by<V: Ord>(
        &self,
        split: Split,
        by: impl Fn(&GroupKey) -> V,
    ) -> Result<BTreeMap<V, GroupAccum>, MergeError> {
        let mut totals: BTreeMap<V, GroupAccum> = BTreeMap::new();
        for (key, group) in self.groups.iter().filter(|(k, _)| k.split == split) {
            match totals.entry(by(key)) {
                Entry::Occupied(mut t) => t.get_mut().merge(group)?,
                Entry::Vacant(t) => {
                    t.insert(group.clone());
                }
            }
        }
        Ok(totals)
    }

    /// Whether some group holds image positions.
    pub fn has_images(&self) -> bool {
        self.groups.keys().any(|k| k.modality == Modality::Image)
    }
}

/// Why two accumulators cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// They describe different models or layouts.
    #[error("accumulators do not match: {0}")]
    Shape(String),
    /// A 64-bit counter would wrap.
    #[error("a count overflowed 64 bits")]
    CountOverflow,
    /// A float sum left the exact range.
    #[error(transparent)]
    Exact(#[from] ExactError),
    /// Both sides cover the same chunk: merging would count it twice.
    #[error("chunk {0} is in both partials; merging would count it twice")]
    Overlap(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Serialize>(v: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap()
    }

    #[test]
    fn a_text_key_is_stored_as_the_split_and_domain_keys_before_modalities() {
        /// The key as partials stored it before modalities.
        #[derive(Serialize)]
        struct Before {
            split: Split,
            domain: String,
        }
        for split in Split::ALL {
            let before = Before {
                split,
                domain: "en".into(),
            };
            assert_eq!(bytes(&GroupKey::text(split, "en")), bytes(&before));
            for modality in Modality::ALL {
                let key = GroupKey {
                    modality,
                    ..GroupKey::text(split, "en")
                };
                let (back, _): (GroupKey, usize) =
                    bincode::serde::decode_from_slice(&bytes(&key), bincode::config::standard())
                        .unwrap();
                assert_eq!(back, key);
            }
        }
        let image = GroupKey {
            modality: Modality::Image,
            ..GroupKey::text(Split::Heldout, "en")
        };
        assert_eq!(image.to_string(), "heldout/en/image");
    }
}
