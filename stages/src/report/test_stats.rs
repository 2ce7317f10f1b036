//! Statistics for the report's unit tests: routing counts and zeros.

use numbers::saliency::LayerStats;

/// Layer `layer`'s statistics with `count` per expert and every sum zero.
pub fn layer_with_counts(layer: u32, count: Vec<u64>) -> LayerStats {
    let n = count.len();
    LayerStats {
        count,
        ..crate::score::testdata::zeros(layer, n)
    }
}
