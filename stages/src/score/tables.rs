//! Tables of section 6: what each keep map keeps, per layer and for the whole
//! model; overlaps between methods; the prior diagnostic.

use super::keep::LayerRanking;
use super::method::{mean, median};
use super::source::LayerInput;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Experts kept with fewer hits than this are flagged.
pub const FEW_HITS: f64 = 100.0;

/// One layer of a (method, K) table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerRow {
    /// Model block index.
    pub layer: u32,
    /// Share of `count` on kept experts.
    pub count_share_kept: f64,
    /// Share of `reap_l2_sum` on kept experts.
    pub reap_share_kept: f64,
    /// Smallest `count` among kept experts.
    pub min_kept_count: f64,
    /// Kept experts with `count == 0`.
    pub dead_kept: u32,
    /// Kept experts with `count < 100`.
    pub kept_under_100: u32,
    /// Top-k slot replacement rate: `1 - count_share_kept`.
    pub slot_replacement: f64,
}

/// The table of one keep map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MapTable {
    /// Method name.
    pub method: String,
    /// Experts kept per layer.
    pub k: u32,
    /// Per layer.
    pub rows: Vec<LayerRow>,
    /// Mean slot replacement over layers.
    pub slot_replacement_mean: f64,
    /// Worst layer's slot replacement.
    pub slot_replacement_worst: f64,
    /// The worst layer.
    pub worst_layer: u32,
    /// Dead experts kept, all layers.
    pub dead_kept: u32,
    /// Experts kept with under 100 hits, all layers.
    pub kept_under_100: u32,
}

/// Overlap of two methods' keep sets at one K.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overlap {
    /// Experts kept per layer.
    pub k: u32,
    /// First method.
    pub a: String,
    /// Second method.
    pub b: String,
    /// Mean over layers of `|A & B| / K`.
    pub mean_shared: f64,
    /// Smallest per-layer share and its layer.
    pub min_shared: f64,
    /// Layer of `min_shared`.
    pub min_layer: u32,
}

/// Count-weighted layer mean against the median expert mean (the audit's
/// biased prior against the default one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriorRow {
    /// Model block index.
    pub layer: u32,
    /// `sum reap_l2_sum / sum count`.
    pub count_weighted_mean: f64,
    /// Median of live experts' `reap_l2_sum / count`.
    pub median_expert_mean: f64,
    /// Live experts whose mean is below the count-weighted mean.
    pub live_below_weighted: u32,
    /// Live experts.
    pub live: u32,
    /// Dead experts.
    pub dead: u32,
}

/// Table of one keep map evaluated on `layers`.
pub fn map_table(
    method: &str,
    k: u32,
    layers: &[LayerInput],
    rankings: &[LayerRanking],
) -> MapTable {
    let rows: Vec<LayerRow> = layers
        .iter()
        .zip(rankings)
        .map(|(l, r)| layer_row(l, &r.kept(k)))
        .collect();
    let (worst_layer, slot_replacement_worst) = rows
        .iter()
        .map(|r| (r.layer, r.slot_replacement))
        .fold((0, f64::NEG_INFINITY), |a, b| if b.1 > a.1 { b } else { a });
    MapTable {
        method: method.to_string(),
        k,
        slot_replacement_mean: rows.iter().map(|r| r.slot_replacement).sum::<f64>()
            / rows.len().max(1) as f64,
        slot_replacement_worst,
        worst_layer,
        dead_kept: rows.iter().map(|r| r.dead_kept).sum(),
        kept_under_100: rows.iter().map(|r| r.kept_under_100).sum(),
        rows,
    }
}

fn share(v: &[f64], kept: &[u32]) -> f64 {
    let total: f64 = v.iter().sum();
    if total > 0.0 {
        kept.iter().map(|&e| v[e as usize]).sum::<f64>() / total
    } else {
        1.0
    }
}

fn layer_row(l: &LayerInput, kept: &[u32]) -> LayerRow {
    let counts: Vec<f64> = kept.iter().map(|&e| l.count[e as usize]).collect();
    let count_share_kept = share(&l.count, kept);
    LayerRow {
        layer: l.layer,
        count_share_kept,
        reap_share_kept: share(&l.reap_l2_sum, kept),
        min_kept_count: counts.iter().copied().fold(f64::INFINITY, f64::min),
        dead_kept: counts.iter().filter(|&&c| c <= 0.0).count() as u32,
        kept_under_100: counts.iter().filter(|&&c| c < FEW_HITS).count() as u32,
        slot_replacement: 1.0 - count_share_kept,
    }
}

/// Overlap between two methods' maps at size `k`.
pub fn overlap(k: u32, a: (&str, &[LayerRanking]), b: (&str, &[LayerRanking])) -> Overlap {
    let per_layer: Vec<(u32, f64)> =
        a.1.iter()
            .zip(b.1)
            .map(|(x, y)| {
                let sx: BTreeSet<u32> = x.kept(k).into_iter().collect();
                let shared = y.kept(k).iter().filter(|e| sx.contains(e)).count();
                (x.layer, shared as f64 / k as f64)
            })
            .collect();
    let (min_layer, min_shared) =
        per_layer
            .iter()
            .copied()
            .fold((0, f64::INFINITY), |m, x| if x.1 < m.1 { x } else { m });
    Overlap {
        k,
        a: a.0.to_string(),
        b: b.0.to_string(),
        mean_shared: per_layer.iter().map(|x| x.1).sum::<f64>() / per_layer.len().max(1) as f64,
        min_shared,
        min_layer,
    }
}

/// The prior diagnostic of one layer.
pub fn prior_row(l: &LayerInput) -> PriorRow {
    let means: Vec<f64> = (0..l.n_expert()).filter_map(|e| mean(l, e)).collect();
    let total: f64 = l.count.iter().sum();
    let weighted = if total > 0.0 {
        l.reap_l2_sum.iter().sum::<f64>() / total
    } else {
        0.0
    };
    PriorRow {
        layer: l.layer,
        count_weighted_mean: weighted,
        median_expert_mean: median(means.clone()).unwrap_or(0.0),
        live_below_weighted: means.iter().filter(|&&m| m < weighted).count() as u32,
        live: means.len() as u32,
        dead: (l.n_expert() - means.len()) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(count: &[f64], sum: &[f64]) -> LayerInput {
        LayerInput {
            layer: 2,
            count: count.to_vec(),
            raw_count: count.to_vec(),
            reap_l2_sum: sum.to_vec(),
            reap_l2_sq_sum: vec![0.0; count.len()],
            guarded: Vec::new(),
            domain_mass: Vec::new(),
        }
    }

    #[test]
    fn table_counts_shares_dead_and_rare_experts() {
        let l = input(
            &[600.0, 300.0, 50.0, 50.0, 0.0],
            &[60.0, 30.0, 5.0, 5.0, 0.0],
        );
        let r = LayerRanking {
            layer: 2,
            order: vec![0, 2, 4, 1, 3],
            kept_at: Default::default(),
        };
        let t = map_table("x", 3, std::slice::from_ref(&l), std::slice::from_ref(&r));
        let row = &t.rows[0];
        assert_eq!(row.count_share_kept, 650.0 / 1000.0);
        assert_eq!(row.reap_share_kept, 65.0 / 100.0);
        assert_eq!(row.min_kept_count, 0.0);
        assert_eq!((row.dead_kept, row.kept_under_100), (1, 2));
        assert!((t.slot_replacement_worst - 0.35).abs() < 1e-12 && t.worst_layer == 2);
        let other = LayerRanking {
            layer: 2,
            order: vec![0, 1, 2, 3, 4],
            kept_at: Default::default(),
        };
        let o = overlap(
            3,
            ("x", std::slice::from_ref(&r)),
            ("y", std::slice::from_ref(&other)),
        );
        assert!((o.mean_shared - 2.0 / 3.0).abs() < 1e-12);
        let p = prior_row(&l);
        assert_eq!(
            (p.count_weighted_mean, p.median_expert_mean, p.live, p.dead),
            (0.1, 0.1, 4, 1)
        );
    }
}
