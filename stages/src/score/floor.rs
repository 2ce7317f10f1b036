//! The worst-served domain of each keep map: the smallest, over the
//! domains with routed mass, of a domain's retained share of its
//! `reap_l2_sum` (what `worst_domain`, [`super::worst`], maximises).

use super::keep::LayerRanking;
use super::source::LayerInput;
use super::worst::{bound, named_shares, retained, smallest};
use config::method::Method;
use serde::{Deserialize, Serialize};

/// How well one keep map serves its worst domain: the smallest, over the
/// domains with routed mass, of the domain's retained share of its
/// `reap_l2_sum`, over the layers (one row per method and K of `score`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FloorRow {
    /// Method.
    pub method: String,
    /// Experts kept per layer.
    pub k: u32,
    /// The smallest retained share over layers and domains.
    pub min_share: f64,
    /// Mean over layers of each layer's smallest retained share.
    pub mean_min_share: f64,
    /// The domain and block where the smallest share is.
    pub worst_domain: String,
    /// Block index of the smallest share.
    pub worst_layer: u32,
    /// Mean over layers of [`super::worst::bound`] (worst_domain's rows only): the
    /// optimum's mean is at most this, so worst_domain's `mean_min_share` is at most
    /// this far below it.
    pub bound_mean: Option<f64>,
}

/// The floor row of `method`'s keep map of `k` experts from its
/// per-layer rankings `ranked` over `layers` (same order).
pub fn floor_row(
    method: Method,
    k: u32,
    layers: &[LayerInput],
    ranked: &[LayerRanking],
) -> FloorRow {
    let mut row = FloorRow {
        method: method.as_str().to_string(),
        k,
        min_share: 1.0,
        mean_min_share: 0.0,
        worst_domain: String::new(),
        worst_layer: 0,
        bound_mean: (method == Method::WorstDomain).then_some(0.0),
    };
    for (l, r) in layers.iter().zip(ranked) {
        let named = named_shares(l);
        let rows: Vec<Vec<f64>> = named.iter().map(|(_, s)| s.clone()).collect();
        let got = retained(&rows, &r.kept(k));
        let least = smallest(&got);
        row.mean_min_share += least / layers.len() as f64;
        if let Some(b) = &mut row.bound_mean {
            *b += bound(&rows, k) / layers.len() as f64;
        }
        if row.worst_domain.is_empty() || least < row.min_share {
            row.min_share = least;
            row.worst_layer = l.layer;
            row.worst_domain = named
                .iter()
                .zip(&got)
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map_or_else(String::new, |((name, _), _)| name.to_string());
        }
    }
    row
}
