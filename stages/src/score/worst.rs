//! `worst_domain`: per layer, the experts that serve the worst-served
//! calibration domain best.
//!
//! The objective, per layer and keep-map size K: choose the kept set S,
//! `|S| = K`, maximising
//!
//! ```text
//! min over domains d of  share_d(S) = sum_{e in S} r[d][e] / sum_e r[d][e]
//! ```
//!
//! where `r[d][e]` is domain `d`'s routed REAP mass (`reap_l2_sum`) of
//! expert `e` on the fit split, over the domains with routed mass in the
//! layer. This max-min selection is NP-hard in general, so it is solved
//! heuristically, not exactly: a greedy ranking adds, one expert at a time,
//! the expert whose addition leaves the ascending vector of domain shares
//! lexicographically largest (first the smallest share, then the next;
//! ties by expert id), within the tiers every method keeps (super experts,
//! the keep floor, dead experts last); then at each K ([`kept_sets`]) the
//! best of that ranking's first K and every other method's map of that K
//! is improved by single swaps while one raises the leximin vector. So the
//! map is at least as good on the objective as every other method's at the
//! same K, and the maps are not nested across K. [`bound`] gives an upper
//! bound on the optimum by Lagrangian duality, which `score` reports beside
//! the value reached.

use super::source::LayerInput;
use numbers::routing::ExpertGroups;
use std::collections::BTreeMap;

/// Each domain's shares of its routed mass per expert (`share[d][e]`),
/// over the domains with mass in the layer; without per-domain sums, the
/// blend's `reap_l2_sum` as one domain (named `fit`).
pub fn shares(l: &LayerInput) -> Vec<Vec<f64>> {
    named_shares(l).into_iter().map(|(_, s)| s).collect()
}

/// [`shares`] with each domain's name.
pub fn named_shares(l: &LayerInput) -> Vec<(&str, Vec<f64>)> {
    let normalise = |mass: &[f64]| -> Option<Vec<f64>> {
        let total: f64 = mass.iter().sum();
        (total > 0.0 && total.is_finite()).then(|| mass.iter().map(|m| m / total).collect())
    };
    let per_domain: Vec<(&str, Vec<f64>)> = l
        .domain_mass
        .iter()
        .filter_map(|(name, mass)| Some((name.as_str(), normalise(mass)?)))
        .collect();
    if per_domain.is_empty() {
        normalise(&l.reap_l2_sum)
            .map(|s| ("fit", s))
            .into_iter()
            .collect()
    } else {
        per_domain
    }
}

/// The retained share of each domain's mass (`shares` rows) under `kept`.
pub fn retained(shares: &[Vec<f64>], kept: &[u32]) -> Vec<f64> {
    shares
        .iter()
        .map(|s| kept.iter().map(|&e| s[e as usize]).sum())
        .collect()
}

/// The smallest of `retained`'s values (1 when there is no domain: nothing
/// routed, nothing lost).
pub fn smallest(retained: &[f64]) -> f64 {
    retained.iter().copied().fold(1.0, f64::min)
}

/// The experts of one layer, best first, by the greedy leximin rule of the
/// module's objective; `tiers[e]` is expert `e`'s tier (lower first: the
/// score stage's super-expert, keep-floor and dead rule).
pub fn ranking(l: &LayerInput, tiers: &[u8]) -> Vec<u32> {
    let shares = shares(l);
    let n = l.n_expert();
    let mut current = vec![0.0; shares.len()];
    let mut left: Vec<usize> = (0..n).collect();
    let mut order = Vec::with_capacity(n);
    while !left.is_empty() {
        let first_tier = left.iter().map(|&e| tiers[e]).min().unwrap_or(0);
        let mut best: Option<(usize, Vec<f64>)> = None;
        for &e in left.iter().filter(|&&e| tiers[e] == first_tier) {
            let mut after: Vec<f64> = current.iter().zip(&shares).map(|(c, s)| c + s[e]).collect();
            after.sort_by(f64::total_cmp);
            // Strictly better only: ties keep the lower expert id.
            if best.as_ref().is_none_or(|(_, b)| leximin_better(&after, b)) {
                best = Some((e, after));
            }
        }
        let (e, _) = best.expect("a candidate in the first tier");
        for (c, s) in current.iter_mut().zip(&shares) {
            *c += s[e];
        }
        left.retain(|&x| x != e);
        order.push(e as u32);
    }
    order
}

/// The kept set of every size `k` in `1..=n_expert`, sorted: the
/// best (leximin) of the first `k` of each ranking in `pool` (every
/// method's, group-balanced), then improved by single swaps (an expert
/// out, one of the same routing group and no lower tier in) while a swap
/// raises the ascending vector of domain shares. So at every K the map is
/// at least as good on the objective as every other method's map of that
/// K; the sets are not nested across K.
pub fn kept_sets(
    l: &LayerInput,
    tiers: &[u8],
    groups: Option<ExpertGroups>,
    pool: &[Vec<u32>],
) -> BTreeMap<u32, Vec<u32>> {
    let shares = shares(l);
    let n = l.n_expert() as u32;
    let group_of = |e: u32| match groups.filter(|g| g.n_group > 1 && n.is_multiple_of(g.n_group)) {
        Some(g) => e / (n / g.n_group),
        None => 0,
    };
    let value = |kept: &[u32]| {
        let mut v = retained(&shares, kept);
        v.sort_by(f64::total_cmp);
        v
    };
    let mut out = BTreeMap::new();
    for k in 1..=n {
        let mut best = prefix(&pool[0], k);
        let mut best_value = value(&best);
        for order in &pool[1..] {
            let kept = prefix(order, k);
            let v = value(&kept);
            if leximin_better(&v, &best_value) {
                (best, best_value) = (kept, v);
            }
        }
        // Single swaps, first improvement, until none improves (each step
        // raises the leximin vector, so this ends; capped for safety).
        for _ in 0..(4 * n) {
            let mut improved = false;
            'search: for i in 0..best.len() {
                for e in 0..n {
                    let out_e = best[i];
                    if best.contains(&e)
                        || group_of(e) != group_of(out_e)
                        || tiers[e as usize] > tiers[out_e as usize]
                    {
                        continue;
                    }
                    let mut kept = best.clone();
                    kept[i] = e;
                    let v = value(&kept);
                    if leximin_better(&v, &best_value) {
                        kept.sort_unstable();
                        (best, best_value) = (kept, v);
                        improved = true;
                        break 'search;
                    }
                }
            }
            if !improved {
                break;
            }
        }
        out.insert(k, best);
    }
    out
}

/// The first `k` of `order`, sorted.
fn prefix(order: &[u32], k: u32) -> Vec<u32> {
    let mut kept = order[..(k as usize).min(order.len())].to_vec();
    kept.sort_unstable();
    kept
}

/// Whether ascending vector `a` is lexicographically larger than `b`.
fn leximin_better(a: &[f64], b: &[f64]) -> bool {
    for (x, y) in a.iter().zip(b) {
        match x.total_cmp(y) {
            std::cmp::Ordering::Greater => return true,
            std::cmp::Ordering::Less => return false,
            std::cmp::Ordering::Equal => {}
        }
    }
    false
}

/// An upper bound on the best smallest retained share any `k` experts of
/// the layer reach: for domain weights `w` on the simplex, no set beats the
/// `k` largest weighted shares `sum_d w[d] * share[d][e]` (the weighted sum
/// is at least the minimum), so the least such value over the unit
/// weights, the uniform weights and a multiplicative-weights search
/// (weights raised on the domains the current weighted top-k serves
/// least) bounds the optimum.
pub fn bound(shares: &[Vec<f64>], k: u32) -> f64 {
    let d = shares.len();
    if d == 0 {
        return 1.0;
    }
    let value = |w: &[f64]| -> (f64, Vec<f64>) {
        let n = shares[0].len();
        let mut weighted: Vec<(f64, usize)> = (0..n)
            .map(|e| (w.iter().zip(shares).map(|(w, s)| w * s[e]).sum(), e))
            .collect();
        weighted.sort_by(|a, b| b.0.total_cmp(&a.0));
        let top: Vec<u32> = weighted
            .iter()
            .take(k as usize)
            .map(|&(_, e)| e as u32)
            .collect();
        let v = weighted.iter().take(k as usize).map(|(v, _)| v).sum();
        (v, retained(shares, &top))
    };
    let mut best = f64::INFINITY;
    for i in 0..d {
        let mut w = vec![0.0; d];
        w[i] = 1.0;
        best = best.min(value(&w).0);
    }
    let mut w = vec![1.0 / d as f64; d];
    for _ in 0..200 {
        let (v, got) = value(&w);
        best = best.min(v);
        // Raise the weight of the domains the weighted top-k serves least.
        for (wi, g) in w.iter_mut().zip(&got) {
            *wi *= (-4.0 * g).exp();
        }
        let total: f64 = w.iter().sum();
        w.iter_mut().for_each(|x| *x /= total);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer of `n` live experts (100 hits each) with per-domain masses.
    fn layer(domains: &[(&str, &[f64])]) -> LayerInput {
        let n = domains[0].1.len();
        let sum: Vec<f64> = (0..n)
            .map(|e| domains.iter().map(|d| d.1[e]).sum())
            .collect();
        LayerInput {
            layer: 0,
            count: vec![100.0; n],
            raw_count: vec![100.0; n],
            reap_l2_sq_sum: sum.iter().map(|s| s * s / 100.0).collect(),
            reap_l2_sum: sum,
            guarded: Vec::new(),
            domain_mass: domains
                .iter()
                .map(|(d, m)| (d.to_string(), m.to_vec()))
                .collect(),
        }
    }

    /// Every `k`-subset's smallest share, the best of them (the oracle).
    fn exhaustive(shares: &[Vec<f64>], k: usize) -> f64 {
        let n = shares[0].len();
        let mut best = 0.0f64;
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize == k {
                let kept: Vec<u32> = (0..n as u32).filter(|e| mask >> e & 1 == 1).collect();
                best = best.max(smallest(&retained(shares, &kept)));
            }
        }
        best
    }

    #[test]
    fn the_greedy_serves_the_small_domain_and_stays_under_the_bound() {
        // Prose is large and lives on experts 0-3; code is small and lives
        // on experts 4-5: the blend's top 4 is all prose.
        let l = layer(&[
            ("prose", &[40.0, 30.0, 20.0, 10.0, 0.0, 0.0, 1.0, 1.0]),
            ("code", &[0.0, 0.0, 0.0, 0.0, 3.0, 2.0, 0.0, 0.0]),
        ]);
        let order = ranking(&l, &[1; 8]);
        let s = shares(&l);
        for k in 1..=8u32 {
            let mut kept = order[..k as usize].to_vec();
            kept.sort_unstable();
            let got = smallest(&retained(&s, &kept));
            let best = exhaustive(&s, k as usize);
            let b = bound(&s, k);
            assert!(
                got <= best + 1e-12 && best <= b + 1e-12,
                "k {k}: {got} {best} {b}"
            );
        }
        // Code's best expert first (every single expert leaves a domain at
        // 0, and it serves code most), then prose's: 0.6 and 0.39 at K = 2.
        assert_eq!(&order[..2], &[4, 0]);
        // At K = 4 the greedy reaches the optimum here.
        let mut kept = order[..4].to_vec();
        kept.sort_unstable();
        assert!((smallest(&retained(&s, &kept)) - exhaustive(&s, 4)).abs() < 1e-12);
    }

    #[test]
    fn without_domains_it_ranks_by_the_blend_and_keeps_the_tiers() {
        let mut l = layer(&[("only", &[1.0, 5.0, 3.0, 0.0])]);
        l.domain_mass.clear();
        // Tiers as the score stage gives them: 1 at or above the floor, 2
        // below it, 3 dead.
        assert_eq!(ranking(&l, &[1, 2, 1, 3]), vec![2, 0, 1, 3]);
        assert!((bound(&shares(&l), 2) - 8.0 / 9.0).abs() < 1e-12);
    }
}
