//! Which statistics a method is scored on: the fit split, one domain, or a
//! domain-weighted mix, reduced to the three sums every method needs.

use crate::StagesError;
use numbers::saliency::{LayerStats, Saliency};
use numbers::Split;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The statistics a keep map is fitted on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// The fit split, all domains together.
    Fit,
    /// One domain of the fit split.
    Domain {
        /// Domain name as in `saliency.json`.
        name: String,
    },
    /// Fit-split domains reweighted to the given token shares (normalised to
    /// sum to 1); each domain's sums are scaled by `share * N / n_domain`.
    /// The keep floor and the LCB prior read the unscaled counts
    /// ([`LayerInput::raw_count`]).
    Mix {
        /// Domain name to weight.
        weights: BTreeMap<String, f64>,
    },
}

/// One MoE layer's sums as floats: the input of every method.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerInput {
    /// Model block index.
    pub layer: u32,
    /// Tokens routed to each expert (scaled, for a mix).
    pub count: Vec<f64>,
    /// Tokens routed to each expert, never scaled: the hits actually
    /// observed, which the keep floor (`c_min`) and the LCB prior's
    /// standard error read, so a mix that scales one hit of a small domain
    /// up to 50 does not pass a floor of 10.
    pub raw_count: Vec<f64>,
    /// `sum g * ||y||` per expert.
    pub reap_l2_sum: Vec<f64>,
    /// `sum (g * ||y||)^2` per expert.
    pub reap_l2_sq_sum: Vec<f64>,
    /// Experts the super-expert guard keeps first (`score::super_experts`);
    /// empty without the guard.
    pub guarded: Vec<bool>,
    /// Each domain's `reap_l2_sum` per expert (scaled like the sums), the
    /// domains the source covers (`worst_domain` serves the worst of them);
    /// empty where no per-domain sums exist (a bootstrap resample).
    pub domain_mass: Vec<(String, Vec<f64>)>,
}

impl LayerInput {
    /// The float view of one layer of `saliency.json`, scaled by `w`.
    pub fn scaled(l: &LayerStats, w: f64) -> LayerInput {
        LayerInput {
            layer: l.layer,
            count: l.count.iter().map(|&c| c as f64 * w).collect(),
            raw_count: l.count.iter().map(|&c| c as f64).collect(),
            reap_l2_sum: l.reap_l2_sum.iter().map(|v| v * w).collect(),
            reap_l2_sq_sum: l.reap_l2_sq_sum.iter().map(|v| v * w).collect(),
            guarded: Vec::new(),
            domain_mass: Vec::new(),
        }
    }

    /// Block `layer`'s input from per-expert count, `reap_l2_sum` and
    /// `reap_l2_sq_sum` ([`numbers::stats::ChunkStats::totals`]).
    pub fn from_cells(layer: u32, [count, sum, sq]: [&[f64]; 3]) -> LayerInput {
        LayerInput {
            layer,
            count: count.to_vec(),
            raw_count: count.to_vec(),
            reap_l2_sum: sum.to_vec(),
            reap_l2_sq_sum: sq.to_vec(),
            guarded: Vec::new(),
            domain_mass: Vec::new(),
        }
    }

    /// Experts in the layer.
    pub fn n_expert(&self) -> usize {
        self.count.len()
    }

    /// Expert `e`'s mean of `(g * ||y||)^2` per routed token (its second
    /// moment, which the LCB prior's variance reads).
    pub fn sq_mean(&self, e: usize) -> f64 {
        self.reap_l2_sq_sum[e] / self.count[e]
    }

    fn add(&mut self, other: &LayerInput) {
        for (a, b) in [
            (&mut self.count, &other.count),
            (&mut self.raw_count, &other.raw_count),
            (&mut self.reap_l2_sum, &other.reap_l2_sum),
            (&mut self.reap_l2_sq_sum, &other.reap_l2_sq_sum),
        ] {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        }
    }
}

impl Source {
    /// Builds a source from `--domain` and `--mix a=0.5,b=0.5` (at most one).
    pub fn from_flags(domain: Option<&str>, mix: Option<&str>) -> Result<Source, StagesError> {
        match (domain, mix) {
            (Some(_), Some(_)) => Err(mix_error("excludes --domain")),
            (Some(d), None) => Ok(Source::Domain {
                name: d.to_string(),
            }),
            (None, Some(m)) => Ok(Source::Mix {
                weights: parse_mix(m)?,
            }),
            (None, None) => Ok(Source::Fit),
        }
    }

    /// A short label for tables: `fit`, `domain:code`, `mix:a=0.5,b=0.5`.
    pub fn label(&self) -> String {
        match self {
            Source::Fit => Split::Fit.as_str().into(),
            Source::Domain { name } => format!("domain:{name}"),
            Source::Mix { weights } => {
                let parts: Vec<String> = weights.iter().map(|(d, w)| format!("{d}={w}")).collect();
                format!("mix:{}", parts.join(","))
            }
        }
    }

    /// The per-layer sums this source selects from `s`.
    pub fn layers(&self, s: &Saliency) -> Result<Vec<LayerInput>, StagesError> {
        let unscorable = |problem: String| StagesError::Unscorable {
            scored: self.label(),
            problem,
        };
        let fit = s
            .split(Split::Fit)
            .ok_or_else(|| unscorable("saliency.json has no fit split".into()))?;
        let domain = |name: &str| {
            fit.domains.get(name).ok_or_else(|| {
                let known: Vec<&String> = fit.domains.keys().collect();
                unscorable(format!(
                    "domain {name:?} is not in saliency.json (fit domains: {known:?})"
                ))
            })
        };
        // Each covered domain's reap_l2_sum, matched to the layer by block.
        let with_domains = |mut layers: Vec<LayerInput>, covered: Vec<(&str, f64)>| {
            for l in &mut layers {
                for &(name, scale) in &covered {
                    let d = fit
                        .domains
                        .get(name)
                        .and_then(|d| d.layers.iter().find(|x| x.layer == l.layer));
                    if let Some(d) = d {
                        let mass = d.reap_l2_sum.iter().map(|v| v * scale).collect();
                        l.domain_mass.push((name.to_string(), mass));
                    }
                }
            }
            layers
        };
        match self {
            Source::Fit => Ok(with_domains(
                fit.layers
                    .iter()
                    .map(|l| LayerInput::scaled(l, 1.0))
                    .collect(),
                fit.domains.keys().map(|d| (d.as_str(), 1.0)).collect(),
            )),
            Source::Domain { name } => Ok(with_domains(
                domain(name)?
                    .layers
                    .iter()
                    .map(|l| LayerInput::scaled(l, 1.0))
                    .collect(),
                vec![(name.as_str(), 1.0)],
            )),
            Source::Mix { weights } => {
                let total: u64 = weights
                    .keys()
                    .map(|d| domain(d).map(|x| x.n_tokens))
                    .sum::<Result<u64, StagesError>>()?;
                let wsum: f64 = weights.values().sum();
                let mut out: Option<Vec<LayerInput>> = None;
                let mut covered = Vec::new();
                for (name, w) in weights {
                    let d = domain(name)?;
                    if d.n_tokens == 0 {
                        return Err(unscorable(format!(
                            "domain {name:?} has no fit tokens; it cannot be weighted in a mix"
                        )));
                    }
                    let scale = w / wsum * total as f64 / d.n_tokens as f64;
                    covered.push((name.as_str(), scale));
                    let layers: Vec<LayerInput> = d
                        .layers
                        .iter()
                        .map(|l| LayerInput::scaled(l, scale))
                        .collect();
                    match &mut out {
                        None => out = Some(layers),
                        Some(acc) => acc.iter_mut().zip(&layers).for_each(|(a, b)| a.add(b)),
                    }
                }
                out.map(|layers| with_domains(layers, covered))
                    .ok_or_else(|| unscorable("the mix names no domain".into()))
            }
        }
    }
}

/// Parses `a=0.5,b=0.5` into positive finite weights.
fn parse_mix(s: &str) -> Result<BTreeMap<String, f64>, StagesError> {
    let mut out = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, w) = part
            .split_once('=')
            .ok_or_else(|| mix_error(format!("entry {part:?} is not DOMAIN=WEIGHT")))?;
        let w: f64 = w
            .trim()
            .parse()
            .map_err(|e| mix_error(format!("weight {w:?} of {name:?} is not a number: {e}")))?;
        if !(w.is_finite() && w > 0.0) {
            return Err(mix_error(format!(
                "weight of {name:?} must be positive and finite, got {w}"
            )));
        }
        if out.insert(name.trim().to_string(), w).is_some() {
            return Err(mix_error(format!("names domain {name:?} twice")));
        }
    }
    if out.is_empty() {
        return Err(mix_error(format!("{s:?} names no domain")));
    }
    Ok(out)
}

/// An unusable `--mix`, and why.
fn mix_error(problem: impl Into<String>) -> StagesError {
    StagesError::Argument {
        argument: "--mix".into(),
        problem: problem.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::method::{ranking, Prior, ScoreParams};
    use crate::score::testdata::{layer, saliency_with_domains};
    use config::method::Method;

    #[test]
    fn mix_reweights_domains_to_the_requested_shares() {
        // Domain a: 100 tokens, expert 0 routed 100 times; b: 300 tokens, expert 1.
        let s = saliency_with_domains(&[
            ("a", 100, layer(0, &[100, 0], &[10.0, 0.0])),
            ("b", 300, layer(0, &[0, 300], &[0.0, 30.0])),
        ]);
        let mixed = Source::from_flags(None, Some("a=1,b=1"))
            .unwrap()
            .layers(&s)
            .unwrap();
        // 400 tokens shared 50/50: each domain scaled to 200 tokens.
        assert_eq!(mixed[0].count, vec![200.0, 200.0]);
        assert_eq!(mixed[0].raw_count, vec![100.0, 300.0]);
        assert_eq!(mixed[0].reap_l2_sum, vec![20.0, 20.0]);
        let one = Source::from_flags(Some("b"), None)
            .unwrap()
            .layers(&s)
            .unwrap();
        assert_eq!(one[0].count, vec![0.0, 300.0]);
        let err = Source::from_flags(Some("zz"), None)
            .unwrap()
            .layers(&s)
            .unwrap_err();
        assert!(err.to_string().contains("\"zz\""), "{err}");
        assert!(
            parse_mix("a=0").is_err() && parse_mix("a").is_err() && parse_mix("a=1,a=2").is_err()
        );
    }

    #[test]
    fn a_mix_keeps_a_5000_hit_expert_over_a_1_hit_one() {
        // A 1k-token domain where expert 0 is routed once, with a large
        // output; a 99k-token domain where expert 1 is routed 5,000 times.
        let s = saliency_with_domains(&[
            ("small", 1_000, layer(0, &[1, 0], &[100.0, 0.0])),
            ("big", 99_000, layer(0, &[0, 5_000], &[0.0, 5_000.0])),
        ]);
        let mixed = Source::from_flags(None, Some("small=0.5,big=0.5"))
            .unwrap()
            .layers(&s)
            .unwrap();
        // The one hit scales to 0.5 * 100k / 1k = 50 tokens, above the
        // default floor of 10 were the floor read from scaled counts.
        assert_eq!(mixed[0].count[0], 50.0);
        assert_eq!(mixed[0].raw_count, vec![1.0, 5_000.0]);
        let p = ScoreParams::default();
        assert!(p.c_min > 1 && 50.0 >= p.c_min as f64);
        for prior in [Prior::Median, Prior::Lcb] {
            let p = ScoreParams {
                prior,
                ..ScoreParams::default()
            };
            for method in Method::ALL {
                let order = ranking(method, &p, &mixed[0]);
                assert_eq!(
                    order[0], 1,
                    "{method:?} with the {prior:?} prior: {order:?}"
                );
            }
        }
    }
}
