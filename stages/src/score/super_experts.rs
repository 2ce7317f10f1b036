//! The super-expert guard (REAP's `preserve_super_experts`): a few experts
//! produce rare but extreme outputs that the model relies on (attention
//! sinks, massive activations); pruning even three of them breaks a model,
//! yet their mean contribution can rank them low. Their signature is the
//! largest single element of their output over the routed tokens (REAP's
//! `max_activations`, `act_max` in `saliency.json`, measured on the fit
//! split), which is what REAP's `get_super_expert_indices` reads and what
//! its thresholds are tuned for; the largest output norm (`ean_max`) is kept
//! as an optional rule ([`Statistic::Norm`]).
//!
//! The rule is REAP's: over every (MoE layer, expert) of the first 75% of
//! MoE layers, an expert is guarded when its statistic exceeds both the
//! 99.5th percentile of all experts' (every layer's; linear interpolation
//! at rank q (n - 1), as `torch.quantile` and llama-perplexity interpolate)
//! and a tenth of the largest. Guarded experts rank before every other
//! expert of their layer under every method, so every keep map keeps them
//! (in the method's order, if a layer has more than K).

use super::source::LayerInput;
use crate::StagesError;
use numbers::eval::stats::percentile;
use numbers::saliency::{LayerStats, Saliency};
use numbers::split::Split;
use serde::{Deserialize, Serialize};

/// Percentile of all experts' statistics an expert must exceed.
pub const PERCENTILE: f64 = 99.5;

/// Share of the largest statistic an expert must exceed.
pub const SHARE_OF_MAX: f64 = 0.1;

/// Share of the MoE layers (the first ones) whose experts may be guarded.
pub const LAYER_SHARE: f64 = 0.75;

/// The per-expert statistic the guard's rule reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    /// The largest single output element (`act_max`): REAP's.
    #[default]
    Element,
    /// The largest output norm (`ean_max`): the guard's rule before REAP's
    /// statistic was measured.
    Norm,
}

impl Statistic {
    /// What `score/score.json` params without the field were guarded on.
    pub fn before_elements() -> Statistic {
        Statistic::Norm
    }

    /// The field of `saliency.json` this statistic is.
    pub fn field(self) -> &'static str {
        match self {
            Statistic::Element => "act_max",
            Statistic::Norm => "ean_max",
        }
    }

    /// In words, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Statistic::Element => "largest single output element",
            Statistic::Norm => "largest output norm",
        }
    }

    fn of(self, l: &LayerStats) -> &[f64] {
        match self {
            Statistic::Element => &l.act_max,
            Statistic::Norm => &l.ean_max,
        }
    }
}

/// Per MoE layer (in `saliency.json`'s order), which experts the guard
/// keeps on `statistic`; refused when the file lacks it (written before it
/// was measured).
pub fn guarded(s: &Saliency, statistic: Statistic) -> Result<Vec<Vec<bool>>, StagesError> {
    let unscorable = |problem: String| StagesError::Unscorable {
        scored: "super-expert guard".into(),
        problem,
    };
    let fit = s
        .split(Split::Fit)
        .ok_or_else(|| unscorable("saliency.json has no fit split".into()))?;
    if let Some(l) = fit
        .layers
        .iter()
        .find(|l| statistic.of(l).len() != l.count.len())
    {
        return Err(unscorable(format!(
            "layer {} of saliency.json has {} values of {} ({}) for {} experts; \
             runs collected before it was measured need collecting again",
            l.layer,
            statistic.of(l).len(),
            statistic.field(),
            statistic.describe(),
            l.count.len()
        )));
    }
    let maxima: Vec<&[f64]> = fit.layers.iter().map(|l| statistic.of(l)).collect();
    Ok(rule(&maxima))
}

/// REAP's rule on per-layer maxima (of either statistic).
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

    /// The guard reads the statistic it is asked for: an expert with an
    /// extreme element but an ordinary norm (one massive activation) is
    /// guarded by REAP's statistic, the default, and not by the norm; a
    /// file without the element maxima is refused, naming the field.
    #[test]
    fn the_guard_reads_the_chosen_statistic() {
        let layers: Vec<LayerStats> = (0..4)
            .map(|i| {
                let mut l = crate::score::testdata::layer(i, &[10; 256], &[5.0; 256]);
                l.ean_max = (0..256).map(|e| 10.0 + (e % 5) as f64 / 10.0).collect();
                l.act_max = (0..256).map(|e| 1.0 + (e % 3) as f64 / 10.0).collect();
                l
            })
            .collect();
        let mut s = crate::score::testdata::saliency(2, layers);
        let fit = &mut s.splits.get_mut(&Split::Fit).unwrap().layers;
        // Layer 0 expert 5: one element of 9.5 within a norm of 10.
        fit[0].act_max[5] = 9.5;
        // Layer 1 expert 7: a norm of 200 spread over many small elements.
        fit[1].ean_max[7] = 200.0;
        let ids = |g: &[Vec<bool>]| -> Vec<(usize, usize)> {
            (0..g.len())
                .flat_map(|l| (0..g[l].len()).map(move |e| (l, e)))
                .filter(|&(l, e)| g[l][e])
                .collect()
        };
        assert_eq!(Statistic::default(), Statistic::Element);
        assert_eq!(ids(&guarded(&s, Statistic::Element).unwrap()), [(0, 5)]);
        assert_eq!(ids(&guarded(&s, Statistic::Norm).unwrap()), [(1, 7)]);
        for l in &mut s.splits.get_mut(&Split::Fit).unwrap().layers {
            l.act_max.clear();
        }
        let e = guarded(&s, Statistic::Element).unwrap_err().to_string();
        assert!(e.contains("0 values of act_max"), "{e}");
        assert_eq!(ids(&guarded(&s, Statistic::Norm).unwrap()), [(1, 7)]);
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
