//! Domain specialisation and rare experts, from a split's per-domain
//! statistics: which expert of each layer a domain leans on most, and which
//! experts hardly any token routes to (and which domain those few come from).
//! On a trained model these are what a user reads a keep map against.

use numbers::peer_text::table_cell;
use numbers::saliency::SplitStats;
use std::fmt::Write;

/// Below this fraction of the uniform routing share (`k / n_expert` of the
/// split's tokens, or of its text tokens for the vision experts), an
/// expert is rare.
pub const RARE: f64 = 0.1;

/// An expert must carry at least this fraction of the uniform share to be
/// called a domain's specialist (fewer tokens make the share noise).
pub const MIN_SPECIALIST: f64 = 0.25;

/// One domain's most concentrated expert in one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Specialist {
    /// Domain name.
    pub domain: String,
    /// Expert id.
    pub expert: usize,
    /// Fraction of the expert's tokens that come from the domain.
    pub share: f64,
    /// The domain's fraction of all routed tokens of the layer.
    pub domain_share: f64,
    /// Tokens routed to the expert.
    pub tokens: u64,
}

impl Specialist {
    /// How many times more of the expert's traffic is the domain's than the
    /// domain's share of all traffic (1: no specialisation).
    pub fn lift(&self) -> f64 {
        self.share / self.domain_share
    }
}

/// One layer's specialists (one per domain) and rare experts
/// (expert, tokens, the domain most of them came from).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerDomains {
    /// Model block index.
    pub layer: u32,
    /// Per domain, in name order, its expert with the highest lift.
    pub specialists: Vec<Specialist>,
    /// Experts under [`RARE`] of the uniform share.
    pub rare: Vec<(usize, u64, Option<String>)>,
}

/// The specialists and rare experts of each layer of `split`, routing `k`
/// of `n_expert` experts per token; `None` with fewer than two domains.
pub fn layer_domains(split: &SplitStats, k: u32, n_expert: u32) -> Option<Vec<LayerDomains>> {
    if split.domains.len() < 2 {
        return None;
    }
    let uniform = split.n_tokens as f64 * f64::from(k) / f64::from(n_expert);
    let out = split
        .layers
        .iter()
        .enumerate()
        .map(|(li, layer)| {
            let total: u64 = layer.count.iter().sum();
            let per_domain: Vec<(&String, &[u64])> = split
                .domains
                .iter()
                .filter_map(|(d, s)| s.layers.get(li).map(|l| (d, l.count.as_slice())))
                .collect();
            let specialists = per_domain
                .iter()
                .filter_map(|(d, counts)| {
                    let domain_share = counts.iter().sum::<u64>() as f64 / total.max(1) as f64;
                    if domain_share == 0.0 {
                        return None;
                    }
                    (0..layer.count.len())
                        .filter(|&e| layer.count[e] as f64 >= MIN_SPECIALIST * uniform)
                        .map(|e| Specialist {
                            domain: (*d).clone(),
                            expert: e,
                            share: counts[e] as f64 / layer.count[e] as f64,
                            domain_share,
                            tokens: layer.count[e],
                        })
                        .max_by(|a, b| a.share.total_cmp(&b.share).then(b.expert.cmp(&a.expert)))
                })
                .collect();
            let rare = (0..layer.count.len())
                .filter(|&e| (layer.count[e] as f64) < RARE * uniform)
                .map(|e| {
                    let top = per_domain
                        .iter()
                        .filter(|(_, c)| c[e] > 0)
                        .max_by_key(|(_, c)| c[e])
                        .map(|(d, _)| (*d).clone());
                    (e, layer.count[e], top)
                })
                .collect();
            LayerDomains {
                layer: layer.layer,
                specialists,
                rare,
            }
        })
        .collect();
    Some(out)
}

/// The Markdown of `layers`: a table of each domain's specialist per layer,
/// then the rare experts per layer.
pub fn markdown(layers: &[LayerDomains]) -> String {
    let Some(first) = layers.first() else {
        return String::new();
    };
    let domains: Vec<&str> = first
        .specialists
        .iter()
        .map(|s| s.domain.as_str())
        .collect();
    let mut md = String::from("| layer |");
    for d in &domains {
        let _ = write!(md, " {} |", table_cell(d));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(domains.len()));
    md.push('\n');
    for l in layers {
        let _ = write!(md, "| {} |", l.layer);
        for s in &l.specialists {
            let _ = write!(
                md,
                " expert {}: {:.0}% of its {} tokens ({:.1}x the domain's {:.0}%) |",
                s.expert,
                100.0 * s.share,
                s.tokens,
                s.lift(),
                100.0 * s.domain_share
            );
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "\nRare experts (routed under {:.0}% of the uniform share; tokens, and the domain most of them came from):\n",
        100.0 * RARE
    );
    for l in layers {
        let list: Vec<String> = l
            .rare
            .iter()
            .map(|(e, n, d)| match d {
                Some(d) => format!("{e} ({n}, {})", table_cell(d)),
                None => format!("{e} (dead)"),
            })
            .collect();
        let text = if list.is_empty() {
            "none".to_string()
        } else {
            list.join(", ")
        };
        let _ = writeln!(md, "- layer {}: {text}", l.layer);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_stats::layer_with_counts;
    use numbers::saliency::{DomainStats, LayerStats};

    fn layer(count: Vec<u64>) -> LayerStats {
        layer_with_counts(2, count)
    }

    #[test]
    fn specialists_are_the_most_concentrated_experts_and_rare_ones_are_listed() {
        // 4 experts, top-1, 100 tokens: uniform 25, rare under 2.5, a
        // specialist needs 6.25 tokens.
        let en = DomainStats {
            n_tokens: 60,
            layers: vec![layer(vec![40, 18, 2, 0])],
        };
        let ja = DomainStats {
            n_tokens: 40,
            layers: vec![layer(vec![2, 37, 1, 0])],
        };
        let split = SplitStats {
            n_tokens: 100,
            layers: vec![layer(vec![42, 55, 3, 0])],
            domains: [("en".to_string(), en), ("ja".to_string(), ja)].into(),
            modalities: Default::default(),
        };
        let l = &layer_domains(&split, 1, 4).unwrap()[0];
        assert_eq!(l.specialists[0].expert, 0);
        assert!((l.specialists[0].share - 40.0 / 42.0).abs() < 1e-12);
        assert!((l.specialists[0].domain_share - 0.6).abs() < 1e-12);
        assert_eq!(l.specialists[1].expert, 1);
        assert!((l.specialists[1].lift() - (37.0 / 55.0) / 0.4).abs() < 1e-12);
        // Expert 2 has 3 tokens, above the rare line (2.5): only 3 is rare.
        assert_eq!(l.rare, vec![(3, 0, None)]);
        let md = markdown(std::slice::from_ref(l));
        assert!(
            md.contains("| 2 | expert 0: 95% of its 42 tokens (1.6x the domain's 60%) |"),
            "{md}"
        );
        assert!(md.contains("- layer 2: 3 (dead)"), "{md}");
    }
}
