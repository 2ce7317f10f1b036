//! Scoring methods (DESIGN section 6) and the per-layer expert ranking they
//! induce: best first in three tiers (experts at or above the keep floor
//! `c_min`, then live experts below it, then dead experts), ties by expert id.

use super::source::{LayerInput, Source};
use super::super_experts::Statistic;
use config::method::Method;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Where `reap_shrink`'s prior `mu0` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prior {
    /// Median of per-expert means over the prior's experts.
    Median,
    /// Median of per-expert lower confidence bounds `mean - z * sd / sqrt(count)`.
    Lcb,
}

/// Default keep floor, in hits: below ten the standard error of an expert's
/// mean is over a third of the spread of its routed values (`1/sqrt(10)`),
/// so a 3-hit expert never outranks a 300-hit one on a lucky mean.
pub const DEFAULT_C_MIN: u64 = 10;

/// Everything a ranking depends on besides the statistics; written as a keep
/// map's `params` so the map can be recomputed from `saliency.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoreParams {
    /// Statistics the map is fitted on.
    pub source: Source,
    /// Prior of `reap_shrink` (and so `reap_hybrid`).
    pub prior: Prior,
    /// Prior strength in pseudo-tokens.
    pub m: f64,
    /// Width of the lower confidence bound (`prior = lcb`).
    pub z: f64,
    /// The keep floor: an expert with `count < c_min` ranks after every
    /// expert at or above it under every method (its mean is noise), and
    /// only experts at or above it inform the prior. At least 1 (1: no floor
    /// beyond the dead rule).
    pub c_min: u64,
    /// Let dead experts (`count == 0`) and experts below the keep floor
    /// compete with the others on score alone.
    pub allow_dead: bool,
    /// Keep super experts first ([`super::super_experts`]); absent in the
    /// params of maps scored before the guard existed.
    #[serde(default)]
    pub guard_super_experts: bool,
    /// The statistic the guard reads; absent in the params of maps scored
    /// before it could be chosen, which read the largest output norm.
    #[serde(default = "Statistic::before_elements")]
    pub super_expert_statistic: Statistic,
}

impl Default for ScoreParams {
    fn default() -> Self {
        ScoreParams {
            source: Source::Fit,
            prior: Prior::Median,
            m: 10.0,
            z: 1.0,
            c_min: DEFAULT_C_MIN,
            allow_dead: false,
            guard_super_experts: false,
            super_expert_statistic: Statistic::default(),
        }
    }
}

/// The expert ids of one layer, best first.
pub fn ranking(method: Method, p: &ScoreParams, l: &LayerInput) -> Vec<u32> {
    match method {
        Method::ReapHybrid => hybrid(p, l),
        Method::WorstDomain => super::worst::ranking(l, &tiers(p, l)),
        _ => order(&scores(method, p, l), l, p),
    }
}

/// Per-expert scores of a score-based method (not `reap_hybrid`; for
/// `worst_domain`, whose ranking is a greedy selection, the blend's
/// `reap_l2_sum` it falls back to without domains).
pub fn scores(method: Method, p: &ScoreParams, l: &LayerInput) -> Vec<f64> {
    let n = l.n_expert();
    match method {
        Method::Frequency => l.count.clone(),
        Method::ReapMean => (0..n).map(|e| mean(l, e).unwrap_or(0.0)).collect(),
        Method::ReapL2Sum | Method::WorstDomain => l.reap_l2_sum.clone(),
        Method::ReapShrink | Method::ReapHybrid => {
            let mu0 = prior(p, l);
            (0..n)
                .map(|e| (l.reap_l2_sum[e] + p.m * mu0) / (l.count[e] + p.m))
                .collect()
        }
    }
}

/// `reap_shrink`'s prior `mu0` for a layer (0 when no expert qualifies).
pub fn prior(p: &ScoreParams, l: &LayerInput) -> f64 {
    let floor = p.c_min.max(1) as f64;
    let values: Vec<f64> = (0..l.n_expert())
        .filter(|&e| l.raw_count[e] >= floor)
        .filter_map(|e| {
            let mean = mean(l, e)?;
            Some(match p.prior {
                Prior::Median => mean,
                Prior::Lcb => {
                    let var = (l.sq_mean(e) - mean * mean).max(0.0);
                    mean - p.z * var.sqrt() / l.raw_count[e].sqrt()
                }
            })
        })
        .collect();
    median(values).unwrap_or(0.0).max(0.0)
}

/// An expert's mean `reap_l2_sum / count`, `None` when dead.
pub fn mean(l: &LayerInput, e: usize) -> Option<f64> {
    (l.count[e] > 0.0).then(|| l.reap_l2_sum[e] / l.count[e])
}

/// Median of the values (mean of the middle two for an even count).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Sorts experts by score (higher first) within their tier, ties by expert id.
fn order(scores: &[f64], l: &LayerInput, p: &ScoreParams) -> Vec<u32> {
    order_by(l, p, |a, b| scores[b].total_cmp(&scores[a]))
}

/// An expert's tier: 0 guarded as a super expert, 1 at or above the keep
/// floor, 2 live below it, 3 dead. Lower tiers rank first. With
/// `allow_dead` every unguarded expert is in tier 1: the user asked for
/// scores alone, with neither the dead rule nor the floor.
fn tier(p: &ScoreParams, l: &LayerInput, e: usize) -> u8 {
    // The floor reads real hits, never a mix's scaled counts.
    let count = l.raw_count[e];
    if l.guarded.get(e) == Some(&true) {
        0
    } else if p.allow_dead || count >= p.c_min.max(1) as f64 {
        1
    } else if count > 0.0 {
        2
    } else {
        3
    }
}

/// Every expert's tier ([`tier`]) in the layer.
pub fn tiers(p: &ScoreParams, l: &LayerInput) -> Vec<u8> {
    (0..l.n_expert()).map(|e| tier(p, l, e)).collect()
}

fn order_by(
    l: &LayerInput,
    p: &ScoreParams,
    better: impl Fn(usize, usize) -> Ordering,
) -> Vec<u32> {
    let mut ids: Vec<usize> = (0..l.n_expert()).collect();
    ids.sort_by(|&a, &b| {
        tier(p, l, a)
            .cmp(&tier(p, l, b))
            .then_with(|| better(a, b))
            .then(a.cmp(&b))
    });
    ids.into_iter().map(|e| e as u32).collect()
}

/// Rank averaging of `reap_l2_sum` and `reap_shrink` (ranks, never
/// max-normalised scores, so one outlier cannot compress the others).
fn hybrid(p: &ScoreParams, l: &LayerInput) -> Vec<u32> {
    let n = l.n_expert();
    let mut rank_sum = vec![0usize; n];
    for m in [Method::ReapL2Sum, Method::ReapShrink] {
        for (r, e) in ranking(m, p, l).into_iter().enumerate() {
            rank_sum[e as usize] += r;
        }
    }
    order_by(l, p, |a, b| rank_sum[a].cmp(&rank_sum[b]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(count: &[f64], sum: &[f64]) -> LayerInput {
        LayerInput {
            layer: 0,
            count: count.to_vec(),
            raw_count: count.to_vec(),
            reap_l2_sum: sum.to_vec(),
            reap_l2_sq_sum: count
                .iter()
                .zip(sum)
                .map(|(c, s)| if *c > 0.0 { s * s / c } else { 0.0 })
                .collect(),
            guarded: Vec::new(),
            domain_mass: Vec::new(),
        }
    }

    #[test]
    fn simple_methods_rank_by_their_score_with_ties_by_id() {
        let l = input(&[5.0, 10.0, 10.0, 0.0], &[10.0, 10.0, 30.0, 0.0]);
        // No floor: the scores alone (expert 0's 5 hits are below the default).
        let p = ScoreParams {
            c_min: 1,
            ..Default::default()
        };
        assert_eq!(ranking(Method::Frequency, &p, &l), vec![1, 2, 0, 3]);
        assert_eq!(ranking(Method::ReapMean, &p, &l), vec![2, 0, 1, 3]);
        assert_eq!(ranking(Method::ReapL2Sum, &p, &l), vec![2, 0, 1, 3]);
    }

    #[test]
    fn shrink_uses_the_median_of_live_means_and_the_lcb_lowers_it() {
        // Means 1, 2, 3, 10; dead expert 4.
        let l = input(
            &[10.0, 10.0, 10.0, 1000.0, 0.0],
            &[10.0, 20.0, 30.0, 10000.0, 0.0],
        );
        let p = ScoreParams::default();
        assert_eq!(prior(&p, &l), 2.5);
        let s = scores(Method::ReapShrink, &p, &l);
        assert_eq!(s[0], (10.0 + 10.0 * 2.5) / 20.0);
        assert_eq!(s[4], 2.5);
        let floor = ScoreParams {
            c_min: 100,
            ..p.clone()
        };
        assert_eq!(prior(&floor, &l), 10.0);
        let mut noisy = l.clone();
        noisy.reap_l2_sq_sum = vec![40.0, 80.0, 120.0, 200000.0, 0.0];
        let lcb = ScoreParams {
            prior: Prior::Lcb,
            ..p
        };
        assert!(prior(&lcb, &noisy) < 2.5);
    }

    #[test]
    fn dead_experts_never_outrank_live_ones_unless_allowed() {
        // Expert 1 is dead; live experts have tiny means, so the prior-only
        // score of the dead one beats them all.
        let l = input(&[100.0, 0.0, 100.0, 100.0], &[1.0, 0.0, 2.0, 3.0]);
        let p = ScoreParams {
            m: 1e6,
            ..Default::default()
        };
        for m in Method::ALL {
            assert_eq!(*ranking(m, &p, &l).last().unwrap(), 1, "{m:?}");
        }
        let allow = ScoreParams {
            allow_dead: true,
            ..ScoreParams::default()
        };
        assert_eq!(ranking(Method::ReapMean, &allow, &l), vec![3, 2, 0, 1]);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
    }
}
