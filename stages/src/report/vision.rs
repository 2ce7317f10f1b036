//! Vision experts: per layer, the experts that text rarely or never routes
//! to but images do (DESIGN section 13), from a split's per-modality
//! statistics. A text-only calibration would report them dead or rare and
//! prune them first.

use numbers::saliency::{DomainStats, SplitStats};
use std::fmt::Write;

/// At least the uniform routing share on images: live on images.
pub const LIVE_ON_IMAGES: f64 = 1.0;

/// One layer's experts that are dead or rare on text and live on images.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerVision {
    /// Model block index.
    pub layer: u32,
    /// Experts no text token routes to.
    pub dead_on_text: usize,
    /// The vision experts: (expert, text share, image share), the share
    /// being the fraction of the modality's positions routed to it.
    pub experts: Vec<(usize, f64, f64)>,
}

/// The vision experts of each layer of `split` (routing `k` of `n_expert`
/// experts per position); `None` when the split did not measure both
/// modalities.
pub fn vision_experts(split: &SplitStats, k: u32, n_expert: u32) -> Option<Vec<LayerVision>> {
    let text = measured(split.modalities.get("text")?)?;
    let image = measured(split.modalities.get("image")?)?;
    let uniform = f64::from(k) / f64::from(n_expert);
    let share = |count: u64, m: &DomainStats| count as f64 / m.n_tokens as f64;
    let layers = text
        .layers
        .iter()
        .zip(&image.layers)
        .map(|(t, i)| LayerVision {
            layer: t.layer,
            dead_on_text: t.count.iter().filter(|&&c| c == 0).count(),
            experts: t
                .count
                .iter()
                .zip(&i.count)
                .enumerate()
                .map(|(e, (&ct, &ci))| (e, share(ct, text), share(ci, image)))
                .filter(|&(_, st, si)| {
                    st < super::domains::RARE * uniform && si >= LIVE_ON_IMAGES * uniform
                })
                .collect(),
        })
        .collect();
    Some(layers)
}

fn measured(m: &DomainStats) -> Option<&DomainStats> {
    (m.n_tokens > 0).then_some(m)
}

/// The Markdown table of `layers`: per layer the experts dead on text, the
/// vision experts and the first `shown` of them with their shares.
pub fn markdown(layers: &[LayerVision], shown: usize) -> String {
    let mut md = String::from(
        "| layer | dead on text | vision experts | first ones (expert: text share / image share) |\n|---|---|---|---|\n",
    );
    for l in layers {
        let first: Vec<String> = l
            .experts
            .iter()
            .take(shown)
            .map(|(e, t, i)| format!("{e}: {:.2}% / {:.2}%", 100.0 * t, 100.0 * i))
            .collect();
        let more = match l.experts.len() > shown {
            true => format!(", +{}", l.experts.len() - shown),
            false => String::new(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}{more} |",
            l.layer,
            l.dead_on_text,
            l.experts.len(),
            first.join(", ")
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_stats::layer_with_counts;
    use std::collections::BTreeMap;

    fn stats(n_tokens: u64, count: Vec<u64>) -> DomainStats {
        DomainStats {
            n_tokens,
            layers: vec![layer_with_counts(3, count)],
        }
    }

    #[test]
    fn experts_rare_on_text_and_live_on_images_are_vision_experts() {
        // 4 experts, top-1: uniform share 25%. Text: 100 tokens; image: 40.
        let text = stats(100, vec![60, 38, 2, 0]);
        let image = stats(40, vec![10, 0, 20, 10]);
        let split = SplitStats {
            n_tokens: 140,
            layers: Vec::new(),
            domains: BTreeMap::new(),
            modalities: [("text".to_string(), text), ("image".to_string(), image)].into(),
        };
        let layers = vision_experts(&split, 1, 4).unwrap();
        assert_eq!(layers[0].dead_on_text, 1);
        // Expert 2: 2% of text (< 2.5%), 50% of images; expert 3: dead on
        // text, 25% of images (the uniform share).
        assert_eq!(layers[0].experts, vec![(2, 0.02, 0.5), (3, 0.0, 0.25)]);
        let md = markdown(&layers, 1);
        assert!(md.contains("| 3 | 1 | 2 | 2: 2.00% / 50.00%, +1 |"), "{md}");

        let text_only = SplitStats {
            modalities: BTreeMap::new(),
            ..split
        };
        assert_eq!(vision_experts(&text_only, 1, 4), None);
    }
}
