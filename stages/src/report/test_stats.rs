//! Statistics for the report's unit tests: routing counts and zeros.

use numbers::saliency::LayerStats;

/// Layer `layer`'s statistics with `count` per expert and every sum zero.
pub fn layer_with_counts(layer: u32, count: Vec<u64>) -> LayerStats {
    let n = count.len();
    LayerStats {
        layer,
        count,
        prob_sum: vec![0.0; n],
        weight_sum: vec![0.0; n],
        ean_sum: vec![0.0; n],
        reap_l2_sum: vec![0.0; n],
        reap_l2_sq_sum: vec![0.0; n],
        ean_max: vec![0.0; n],
        act_max: vec![0.0; n],
    }
}
