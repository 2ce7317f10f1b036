//! Keep maps from rankings: the first K experts of each layer's ranking,
//! sorted, so maps of one ranking are nested across K by construction.
//! Under grouped routing the ranking is group-balanced first
//! ([`numbers::routing::balanced_order`]), so the first K keep K / n_group
//! per group, as llama.cpp needs.

use super::method::{ranking, ScoreParams};
use super::source::LayerInput;
use crate::StagesError;
use config::method::Method;
use numbers::routing::{balanced_order, ExpertGroups};
use runfiles::keepmap::KeepMap;
use std::collections::BTreeMap;

/// One layer's full ranking, best first.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRanking {
    /// Model block index.
    pub layer: u32,
    /// Expert ids, best first.
    pub order: Vec<u32>,
    /// Kept sets chosen per size instead of the ranking's prefix (sorted;
    /// `worst_domain`'s, [`super::worst::kept_sets`]); empty for the
    /// ranking methods, whose maps are nested across K.
    pub kept_at: BTreeMap<u32, Vec<u32>>,
}

impl LayerRanking {
    /// The sorted experts kept at size `k`: the set chosen for `k`, else
    /// the first `k` of the ranking.
    pub fn kept(&self, k: u32) -> Vec<u32> {
        self.kept_at
            .get(&k)
            .cloned()
            .unwrap_or_else(|| top_k(&self.order, k))
    }
}

/// Rankings of every layer under one method, group-balanced under `groups`.
pub fn rank_layers(
    method: Method,
    p: &ScoreParams,
    layers: &[LayerInput],
    groups: Option<ExpertGroups>,
) -> Vec<LayerRanking> {
    let n = |l: &LayerInput| l.count.len() as u32;
    layers
        .iter()
        .map(|l| LayerRanking {
            layer: l.layer,
            order: balanced_order(&ranking(method, p, l), groups, n(l)),
            kept_at: if method == Method::WorstDomain {
                // Every method's map of each size is a starting point.
                let pool: Vec<Vec<u32>> = Method::ALL
                    .iter()
                    .map(|&m| balanced_order(&ranking(m, p, l), groups, n(l)))
                    .collect();
                super::worst::kept_sets(l, &super::method::tiers(p, l), groups, &pool)
            } else {
                BTreeMap::new()
            },
        })
        .collect()
}

/// The sorted top-`k` of a ranking.
pub fn top_k(order: &[u32], k: u32) -> Vec<u32> {
    let mut kept = order[..(k as usize).min(order.len())].to_vec();
    kept.sort_unstable();
    kept
}

/// Builds the keep map of `method` at size `k`; refuses `k` above the
/// layer's expert count.
pub fn keep_map(
    method: Method,
    k: u32,
    p: &ScoreParams,
    saliency_sha256: &str,
    rankings: &[LayerRanking],
) -> Result<KeepMap, StagesError> {
    let mut layers = BTreeMap::new();
    for r in rankings {
        if k as usize > r.order.len() || k == 0 {
            return Err(StagesError::KeepSize {
                k,
                n_expert: r.order.len(),
                layer: r.layer,
            });
        }
        layers.insert(r.layer, r.kept(k));
    }
    Ok(KeepMap {
        method: method.as_str().to_string(),
        k,
        params: KeepMap::params_of(p),
        saliency_sha256: saliency_sha256.to_string(),
        layers,
    })
}

/// The method and parameters a keep map says it was computed with.
pub fn map_recipe(map: &KeepMap) -> Result<(Method, ScoreParams), StagesError> {
    let method = Method::parse(&map.method).ok_or_else(|| StagesError::UnknownMethod {
        method: map.method.clone(),
    })?;
    let params: ScoreParams = map.params_as().map_err(|source| StagesError::Json {
        what: format!("the {} keep map's params object", map.method),
        expected: "moe-census score parameters",
        source,
    })?;
    Ok((method, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_sorted_prefixes_of_the_ranking_and_refuse_bad_k() {
        let r = vec![LayerRanking {
            layer: 7,
            order: vec![3, 0, 2, 1],
            kept_at: BTreeMap::new(),
        }];
        let p = ScoreParams::default();
        let m2 = keep_map(Method::Frequency, 2, &p, "abc", &r).unwrap();
        assert_eq!(m2.kept(7), Some(&[0u32, 3][..]));
        assert_eq!(map_recipe(&m2).unwrap(), (Method::Frequency, p.clone()));
        assert!(keep_map(Method::Frequency, 5, &p, "abc", &r)
            .unwrap_err()
            .to_string()
            .contains("layer 7"));
        assert!(keep_map(Method::Frequency, 0, &p, "abc", &r).is_err());
    }
}
