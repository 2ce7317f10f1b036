//! The super-expert guard (REAP's `preserve_super_experts`): a few experts
//! produce rare but extreme outputs that the model relies on (attention
//! sinks, massive activations); pruning even three of them breaks a model,
//! yet their mean contribution can rank them low. Their signature is the
//! largest output norm over the routed tokens, `ean_max` in
//! `saliency.json` (measured on the fit split).
//!
//! The rule is REAP's: over every (MoE layer, expert) of the first 75% of
//! MoE layers, an expert is guarded when its largest output norm exceeds
//! both the 99.5th percentile of all experts' (every layer's; linear
//! interpolation at rank q (n - 1), as `torch.quantile` and llama-perplexity
//! interpolate) and a tenth of the largest. Guarded
//! experts rank before every other expert of their layer under every
//! method, so every keep map keeps them (in the method's order, if a layer
//! has more than K).

use super::source::LayerInput;
use crate::StagesError;
use numbers::eval::stats::percentile;
use numbers::saliency::Saliency;
use numbers::split::Split;

/// Percentile of all experts' largest output norms an expert must exceed.
pub const PERCENTILE: f64 = 99.5;

/// Share of the largest output norm an expert must exceed.
pub const SHARE_OF_MAX: f64 = 0.1;

/// Share of the MoE layers (the first ones) whose experts may be guarded.
pub const LAYER_SHARE: f64 = 0.75;

/// Per MoE layer (in `saliency.json`'s order), which experts the guard
/// keeps; refused when the file has no `ean_max` (written before it was
/// measured).
pub fn guarded(s: &Saliency) -> Result<Vec<Vec<bool>>, StagesError> {
    let unscorable = |problem: String| StagesError::Unscorable {
        scored: "super-expert guard".into(),
        problem,
    };
    let fit = s
        .split(Split::Fit)
        .ok_or_else(|| unscorable("saliency.json has no fit split".into()))?;
    let maxima: Vec<&[f64]> = fit.layers.iter().map(|l| l.ean_max.as_slice()).collect();
    if let Some(l) = fit.layers.iter().find(|l| l.ean_max.len() != l.count.len()) {
        return Err(unscorable(format!(
            "layer {} of saliency.json has {} largest output norms (ean_max) for {} experts; \
             runs collected before ean_max was measured need collecting again",
            l.layer,
            l.ean_max.len(),
            l.count.len()
        )));
    }
    Ok(rule(&maxima))
}

/// REAP's rule on per-layer largest output norms.
pub fn rule(maxima: &[&[f64]]) -> Vec<Vec<bool>> {
    let mut all: Vec<f64> = maxima.iter().flat_map(|m| m.iter().copied()).collect();
    all.sort_by(f64::total_cmp);
    let none = || maxima.iter().map(|m| vec![false; m.len()]).collect();
    let Some(&largest) = all.last() else {
        return none();
    };
    let threshold = percentile(&all, PERCENTILE / 100.0).max(largest * SHARE_OF_MAX);
    let guarded_layers = (maxima.len() as f64 * LAYER_SHARE) as usize;
    maxima
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.iter()
                .map(|&v| i < guarded_layers && v > threshold)
                .collect()
        })
        .collect()
}

/// Marks the guarded experts of `layers` (the source's layers, in the
/// order of `saliency.json`'s fit split).
pub fn mark(layers: &mut [LayerInput], guard: &[Vec<bool>]) {
    for (l, g) in layers.iter_mut().zip(guard) {
        l.guarded = g.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outliers_of_the_first_three_quarters_of_layers_are_guarded() {
        // Four layers of 256 experts: norms about 1, one expert at 50 in
        // layer 0, one at 20 in layer 1 and one at 60 in layer 3 (past the
        // first 75% of layers), one at 3 in layer 2 (above the percentile
        // of norms near 1, below a tenth of the largest).
        let mut layers: Vec<Vec<f64>> = (0..4)
            .map(|l| {
                (0..256)
                    .map(|e| 1.0 + ((l * 256 + e) % 7) as f64 / 100.0)
                    .collect()
            })
            .collect();
        layers[0][17] = 50.0;
        layers[1][3] = 20.0;
        layers[2][9] = 3.0;
        layers[3][40] = 60.0;
        let views: Vec<&[f64]> = layers.iter().map(Vec::as_slice).collect();
        let g = rule(&views);
        let ids = |l: usize| -> Vec<usize> { (0..256).filter(|&e| g[l][e]).collect() };
        assert_eq!(
            (ids(0), ids(1), ids(2), ids(3)),
            (vec![17], vec![3], vec![], vec![])
        );
    }

    #[test]
    fn the_percentile_interpolates_like_torch() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.5);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert!((percentile(&v, 0.995) - 3.985).abs() < 1e-12);
        assert!(rule(&[]).is_empty());
    }
}
