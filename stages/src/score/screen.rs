//! Substitution screen: replays traced routing under a keep map. A token's
//! experts become what the pruned model selects ([`KeepMask::predicted`]:
//! llama.cpp's rule, the router's top-N in selection order with the
//! selection bias, re-ranked on renormalised probabilities under softmax
//! gating with a bias, within the allowed groups under grouped routing);
//! the screen measures the mass of pruned selections and how far down the
//! ranking the substitutes came from, per split.
//!
//! Two mass figures: `mean_mass_lost` sums the router probabilities of the
//! pruned selected experts, which under softmax is a share of the token's
//! whole router mass but under sigmoid gating a sum of independent
//! per-expert probabilities (up to k, not a share of anything), so it does
//! not compare across gating functions. `mean_weight_share_lost` divides
//! the gate weights of the pruned selected experts by those of all its
//! selected experts: the share of the layer's expert mix the pruned experts
//! carried, in [0, 1] under every gating function, and what to compare
//! across models.

use numbers::routing::{Candidates, Routing};
use numbers::Gating;
use numbers::Split;
use runfiles::keepmap::KeepMap;
use runfiles::trace::TraceRow;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Screen results of one keep map on one split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScreenRow {
    /// Method name.
    pub method: String,
    /// Experts kept per layer.
    pub k: u32,
    /// `fit` or `heldout`.
    pub split: String,
    /// Trace rows (token x layer) screened.
    pub rows: u64,
    /// Rows where at least one selected expert was pruned.
    pub rows_changed_share: f64,
    /// Mean router probability mass of pruned selected experts per row
    /// (a share of the router mass under softmax only; see the module docs).
    pub mean_mass_lost: f64,
    /// Mean share of a row's gate weight (over its selected experts) that
    /// went to pruned experts: comparable across gating functions.
    #[serde(default)]
    pub mean_weight_share_lost: f64,
    /// Largest such mass in one row.
    pub max_mass_lost: f64,
    /// Substitutes taken from the router top-N.
    pub substitutes: u64,
    /// Mean 1-based router rank of substitutes.
    pub mean_substitute_rank: f64,
    /// Substitutes by router rank bucket: `k+1`, `k+2..=2k`, `2k+1..=4k`, beyond.
    pub substitute_rank_buckets: [u64; 4],
    /// Slots left empty because fewer than k kept experts were in the top-N.
    pub forced_misses: u64,
}

/// Running totals of one (map, split).
#[derive(Clone, Debug, Default)]
pub struct ScreenAccum {
    rows: u64,
    changed: u64,
    mass_lost: f64,
    weight_share_lost: f64,
    max_mass_lost: f64,
    substitutes: u64,
    rank_sum: u64,
    buckets: [u64; 4],
    forced: u64,
}

/// A keep map as a per-layer membership mask, with the model's routing.
#[derive(Clone, Debug)]
pub struct KeepMask {
    /// Method name.
    pub method: String,
    /// Experts kept per layer.
    pub k: u32,
    layers: BTreeMap<u32, Vec<bool>>,
    n_expert: usize,
    routing: Routing,
    gating: Gating,
}

impl KeepMask {
    /// The mask of a keep map for layers of `n_expert` experts routed by
    /// `routing` with the gating function `gating`.
    pub fn new(map: &KeepMap, n_expert: usize, routing: &Routing, gating: Gating) -> KeepMask {
        let layers = map
            .layers
            .iter()
            .map(|(&l, ids)| {
                let mut mask = vec![false; n_expert];
                ids.iter()
                    .filter(|&&e| (e as usize) < n_expert)
                    .for_each(|&e| mask[e as usize] = true);
                (l, mask)
            })
            .collect();
        KeepMask {
            method: map.method.clone(),
            k: map.k,
            layers,
            n_expert,
            routing: routing.clone(),
            gating,
        }
    }

    /// The experts the model pruned to this map selects for the traced
    /// token `row` (at most k; fewer when the top-N runs out of kept
    /// experts), `None` for a layer the map does not cover.
    pub fn predicted(&self, row: &TraceRow) -> Option<Vec<u16>> {
        let kept = self.layers.get(&row.layer)?;
        let is_kept = |e: u16| kept.get(e as usize).copied().unwrap_or(false);
        Some(self.routing.select_kept(
            self.gating,
            row.layer,
            self.n_expert,
            Candidates {
                id: &row.topn_id,
                prob: &row.topn_prob,
            },
            &is_kept,
            row.selected.len(),
        ))
    }
}

impl ScreenAccum {
    /// Adds one trace row under `mask`; a layer the map does not cover is skipped.
    pub fn add(&mut self, mask: &KeepMask, row: &TraceRow) {
        let (Some(kept), Some(chosen)) = (mask.layers.get(&row.layer), mask.predicted(row)) else {
            return;
        };
        let is_kept = |e: u16| kept.get(e as usize).copied().unwrap_or(false);
        let k = row.selected.len();
        self.rows += 1;
        let lost: f64 = row
            .selected
            .iter()
            .filter(|&&e| !is_kept(e))
            .map(|e| {
                row.topn_id
                    .iter()
                    .position(|x| x == e)
                    .map_or(0.0, |i| row.topn_prob[i] as f64)
            })
            .sum();
        if row.selected.iter().any(|&e| !is_kept(e)) {
            self.changed += 1;
        }
        // Gate weight of the row's selected experts: all, or the pruned ones.
        let weight = |all: bool| -> f64 {
            row.selected
                .iter()
                .zip(&row.selected_weight)
                .filter(|(&e, _)| all || !is_kept(e))
                .map(|(_, &w)| f64::from(w))
                .sum()
        };
        let all = weight(true);
        if all > 0.0 {
            self.weight_share_lost += weight(false) / all;
        }
        self.mass_lost += lost;
        self.max_mass_lost = self.max_mass_lost.max(lost);
        self.forced += (k - chosen.len()) as u64;
        for e in chosen {
            if row.selected.contains(&e) {
                continue;
            }
            let rank = row
                .topn_id
                .iter()
                .position(|&x| x == e)
                .expect("chosen from the top-N")
                + 1;
            self.substitutes += 1;
            self.rank_sum += rank as u64;
            let b = match rank {
                r if r <= k + 1 => 0,
                r if r <= 2 * k => 1,
                r if r <= 4 * k => 2,
                _ => 3,
            };
            self.buckets[b] += 1;
        }
    }

    /// The finished row.
    pub fn finish(&self, method: &str, k: u32, split: Split) -> ScreenRow {
        let per = |x: f64, n: u64| if n > 0 { x / n as f64 } else { 0.0 };
        ScreenRow {
            method: method.to_string(),
            k,
            split: split.as_str().to_string(),
            rows: self.rows,
            rows_changed_share: per(self.changed as f64, self.rows),
            mean_mass_lost: per(self.mass_lost, self.rows),
            mean_weight_share_lost: per(self.weight_share_lost, self.rows),
            max_mass_lost: self.max_mass_lost,
            substitutes: self.substitutes,
            mean_substitute_rank: per(self.rank_sum as f64, self.substitutes),
            substitute_rank_buckets: self.buckets,
            forced_misses: self.forced,
        }
    }
}

/// Screens every map on every row, accumulating per (map index, split).
pub fn screen_rows(
    masks: &[KeepMask],
    rows: &[TraceRow],
    acc: &mut BTreeMap<(usize, Split), ScreenAccum>,
) {
    for row in rows {
        for (i, m) in masks.iter().enumerate() {
            acc.entry((i, row.split)).or_default().add(m, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(selected: &[u16], topn: &[u16], probs: &[f32]) -> TraceRow {
        TraceRow {
            split: Split::Heldout,
            domain: "d".into(),
            chunk: 0,
            pos: 0,
            token_id: 1,
            layer: 4,
            selected: selected.to_vec(),
            selected_weight: vec![0.5; selected.len()],
            topn_id: topn.to_vec(),
            topn_prob: probs.to_vec(),
            lookahead: Vec::new(),
        }
    }

    fn mask(kept: &[u32]) -> KeepMask {
        let map = KeepMap {
            method: "m".into(),
            k: kept.len() as u32,
            params: serde_json::Value::Null,
            saliency_sha256: String::new(),
            layers: [(4, kept.to_vec())].into(),
        };
        KeepMask::new(&map, 8, &Routing::default(), Gating::Softmax)
    }

    #[test]
    fn pruned_selection_loses_its_mass_and_substitutes_come_from_lower_ranks() {
        let mut acc = ScreenAccum::default();
        // Router order 3, 1, 5, 0, 7; selected 3, 1; expert 1 pruned.
        let r = row(&[3, 1], &[3, 1, 5, 0, 7], &[0.5, 0.2, 0.1, 0.1, 0.05]);
        acc.add(&mask(&[3, 0, 7]), &r);
        // Only expert 3 kept among the top-N's first entries: 3 then 0 (rank 4).
        acc.add(&mask(&[3]), &r);
        let out = acc.finish("m", 3, Split::Heldout);
        assert_eq!(out.rows, 2);
        assert!((out.mean_mass_lost - 0.2).abs() < 1e-7);
        // Equal weights 0.5, 0.5: one of two pruned in each row.
        assert!((out.mean_weight_share_lost - 0.5).abs() < 1e-12);
        assert_eq!(out.substitutes, 1);
        assert_eq!(out.mean_substitute_rank, 4.0);
        assert_eq!(out.substitute_rank_buckets, [0, 1, 0, 0]);
        assert_eq!(out.forced_misses, 1);
        assert_eq!(out.rows_changed_share, 1.0);
    }
}
