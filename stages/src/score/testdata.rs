//! Synthetic `saliency.json` documents for tests.

use numbers::saliency::{DomainStats, LayerStats, Saliency, SplitStats};
use numbers::{Gating, Split};
use std::collections::BTreeMap;

/// A layer with consistent statistics: `prob_sum` and `weight_sum` follow
/// `count`, and `reap_l2_sq_sum = sum^2 / count` (the Cauchy-Schwarz bound).
pub fn layer(index: u32, count: &[u64], reap: &[f64]) -> LayerStats {
    let mut l = LayerStats {
        layer: index,
        count: count.to_vec(),
        prob_sum: count.iter().map(|&c| c as f64).collect(),
        weight_sum: count.iter().map(|&c| c as f64 * 0.5).collect(),
        ean_sum: reap.iter().map(|r| r * 2.0).collect(),
        reap_l2_sum: reap.to_vec(),
        reap_l2_sq_sum: count
            .iter()
            .zip(reap)
            .map(|(&c, r)| if c > 0 { r * r / c as f64 * 1.5 } else { 0.0 })
            .collect(),
        // The largest of `count` norms summing to `ean_sum`: twice their
        // mean, at most their sum.
        ean_max: count
            .iter()
            .zip(reap)
            .map(|(&c, r)| {
                if c > 0 {
                    r * 2.0 * (2.0 / c as f64).min(1.0)
                } else {
                    0.0
                }
            })
            .collect(),
        act_max: Vec::new(),
    };
    // The largest element: half the largest norm.
    l.act_max = l.ean_max.iter().map(|m| m / 2.0).collect();
    l
}

/// Layer `layer`'s statistics of `n` experts, every count and sum zero.
pub fn zeros(layer: u32, n: usize) -> LayerStats {
    LayerStats {
        layer,
        count: vec![0; n],
        prob_sum: vec![0.0; n],
        weight_sum: vec![0.0; n],
        ean_sum: vec![0.0; n],
        reap_l2_sum: vec![0.0; n],
        reap_l2_sq_sum: vec![0.0; n],
        ean_max: vec![0.0; n],
        act_max: vec![0.0; n],
    }
}

/// A one-split saliency whose fit split is the sum of the given domains.
/// `prob_sum` is rescaled so each layer's probabilities sum to `n_tokens`.
pub fn saliency_with_domains(domains: &[(&str, u64, LayerStats)]) -> Saliency {
    let n_expert = domains[0].2.count.len();
    let n_tokens: u64 = domains.iter().map(|d| d.1).sum();
    let mut total = zeros(domains[0].2.layer, n_expert);
    for (_, _, l) in domains {
        for e in 0..n_expert {
            total.count[e] += l.count[e];
            total.prob_sum[e] += l.prob_sum[e];
            total.weight_sum[e] += l.weight_sum[e];
            total.ean_sum[e] += l.ean_sum[e];
            total.reap_l2_sum[e] += l.reap_l2_sum[e];
            total.reap_l2_sq_sum[e] += l.reap_l2_sq_sum[e];
            total.ean_max[e] = total.ean_max[e].max(l.ean_max[e]);
            total.act_max[e] = total.act_max[e].max(l.act_max[e]);
        }
    }
    let domains = domains
        .iter()
        .map(|(name, n, l)| {
            (
                name.to_string(),
                DomainStats {
                    n_tokens: *n,
                    layers: vec![l.clone()],
                },
            )
        })
        .collect();
    let mut s = Saliency {
        n_expert: n_expert as u32,
        n_expert_used: 1,
        gating: Gating::Softmax,
        routing: numbers::routing::Routing::default(),
        trace_tokens_written: 0,
        nonfinite_drops: 0,
        nonfinite_drops_by_tensor: BTreeMap::new(),
        n_chunks: 1,
        splits: BTreeMap::new(),
    };
    s.splits.insert(
        Split::Fit,
        SplitStats {
            n_tokens,
            layers: vec![total],
            domains,
            modalities: BTreeMap::new(),
        },
    );
    s
}

/// A consistent saliency over the given layers: fit split only, one domain
/// `all`, `n_tokens = sum(count) / k` and prob sums normalised to it.
pub fn saliency(k: u32, layers: Vec<LayerStats>) -> Saliency {
    let n_tokens = layers[0].count.iter().sum::<u64>() / k as u64;
    let layers: Vec<LayerStats> = layers
        .into_iter()
        .map(|mut l| {
            let total: u64 = l.count.iter().sum();
            assert_eq!(
                total,
                n_tokens * k as u64,
                "layer {} count sum must be n_tokens * k",
                l.layer
            );
            l.prob_sum = l.count.iter().map(|&c| c as f64 / k as f64).collect();
            l
        })
        .collect();
    let mut s = saliency_with_domains(&[("all", n_tokens, layers[0].clone())]);
    s.n_expert_used = k;
    let fit = s.splits.get_mut(&Split::Fit).unwrap();
    fit.layers = layers.clone();
    fit.domains.get_mut("all").unwrap().layers = layers;
    s
}

/// The audit's failure case: 16 experts, top-2. Three heavy hitters with
/// large means, nine live experts with moderate means, four never routed.
/// The count-weighted layer mean is above every moderate expert's mean, so
/// a prior set to it would rank the dead experts above all nine.
pub fn audit_layer(index: u32) -> LayerStats {
    let mut count = vec![3000u64, 2500, 2000];
    let mut reap = vec![3000.0 * 9.0, 2500.0 * 8.0, 2000.0 * 7.0];
    for i in 0..9u64 {
        let c = 100 + 50 * i;
        count.push(c);
        reap.push(c as f64 * (2.0 + 0.25 * i as f64));
    }
    count.extend([0, 0, 0, 0]);
    reap.extend([0.0; 4]);
    // Make the count sum a multiple of k = 2.
    let total: u64 = count.iter().sum();
    count[0] += total % 2;
    reap[0] = count[0] as f64 * 9.0;
    layer(index, &count, &reap)
}

/// A partial with no statistics, to fill in per test.
pub fn empty_partial() -> numbers::partial::Partial {
    numbers::partial::Partial::new(
        "model".into(),
        "corpus".into(),
        "cpu".into(),
        Vec::new(),
        numbers::stats::ExpertAccum::new(numbers::stats::MoeShape {
            n_expert: 4,
            n_expert_used: 1,
            gating: Gating::Softmax,
            moe_layers: vec![0],
            routing: numbers::routing::Routing::default(),
        }),
        Default::default(),
    )
}
