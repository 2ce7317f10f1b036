//! The statistics invariants of DESIGN section 4, each one [`Check`] with its
//! worst case.

use super::{names as inv, Check};
use numbers::partial_check::PROB_SUM_RTOL;
use numbers::saliency::{LayerStats, Saliency};
use numbers::stats::CAUCHY_SCHWARZ_RTOL;
use numbers::stats::SUM_NAMES;

/// A statistics group: a split total, one domain of a split or, in a run
/// that measured images, one modality of a split.
struct Group<'a> {
    name: String,
    n_tokens: u64,
    layers: &'a [LayerStats],
}

fn groups(s: &Saliency) -> Vec<Group<'_>> {
    let mut out = Vec::new();
    for (split, st) in &s.splits {
        out.push(Group {
            name: split.to_string(),
            n_tokens: st.n_tokens,
            layers: &st.layers,
        });
        for (d, ds) in &st.domains {
            out.push(Group {
                name: format!("{split}/{d}"),
                n_tokens: ds.n_tokens,
                layers: &ds.layers,
            });
        }
        for (m, ms) in &st.modalities {
            out.push(Group {
                name: format!("{split}/{m} positions"),
                n_tokens: ms.n_tokens,
                layers: &ms.layers,
            });
        }
    }
    out
}

fn stat_vectors(l: &LayerStats) -> impl Iterator<Item = (&'static str, &[f64])> {
    SUM_NAMES.into_iter().zip(l.sums().map(Vec::as_slice))
}

/// Every statistics check, in DESIGN order; `nonfinite` are JSON paths of
/// values that were not finite numbers in the file.
pub fn check_saliency(s: &Saliency, nonfinite: &[String]) -> Vec<Check> {
    let g = groups(s);
    vec![
        shape(s, &g),
        count_sum(s, &g),
        prob_sum(s, &g),
        weight_sum(s, &g),
        dead_iff_zero(&g),
        finite(&g, nonfinite),
        cauchy_schwarz(&g),
        drops(s),
    ]
}

fn shape(s: &Saliency, groups: &[Group<'_>]) -> Check {
    let n = s.n_expert as usize;
    let blocks: Vec<u32> = groups
        .first()
        .map(|g| g.layers.iter().map(|l| l.layer).collect())
        .unwrap_or_default();
    for g in groups {
        let these: Vec<u32> = g.layers.iter().map(|l| l.layer).collect();
        if these != blocks {
            return Check::fail(
                inv::SHAPE,
                format!(
                    "{} has layers {these:?}, {} has {blocks:?}",
                    g.name, groups[0].name
                ),
            );
        }
        for l in g.layers {
            let lens = std::iter::once(("count", l.count.len()))
                .chain(stat_vectors(l).map(|(k, v)| (k, v.len())));
            for (name, len) in lens {
                if len != n {
                    return Check::fail(
                        inv::SHAPE,
                        format!(
                            "{} layer {} {name} has {len} values, n_expert is {n}",
                            g.name, l.layer
                        ),
                    );
                }
            }
        }
    }
    if groups.is_empty() || blocks.is_empty() {
        return Check::fail(inv::SHAPE, "saliency.json has no split with layers".into());
    }
    Check::pass(
        inv::SHAPE,
        format!(
            "{} groups x {} layers x {n} experts",
            groups.len(),
            blocks.len()
        ),
    )
}

fn count_sum(s: &Saliency, groups: &[Group<'_>]) -> Check {
    let k = s.n_expert_used as i128;
    let mut worst: Option<(i128, String)> = None;
    let mut n = 0;
    for g in groups {
        for l in g.layers {
            n += 1;
            let sum: i128 = l.count.iter().map(|&c| c as i128).sum();
            let expected = g.n_tokens as i128 * k;
            let dev = sum - expected;
            if dev != 0 && worst.as_ref().is_none_or(|w| dev.abs() > w.0.abs()) {
                worst = Some((
                    dev,
                    format!(
                        "{} layer {}: sum {sum} vs {} x {k} = {expected} ({dev:+})",
                        g.name, l.layer, g.n_tokens
                    ),
                ));
            }
        }
    }
    match worst {
        Some((_, what)) => Check::fail(inv::COUNT_SUM, format!("worst {what}")),
        None => Check::pass(
            inv::COUNT_SUM,
            format!("all {n} layer sums exact; worst deviation 0"),
        ),
    }
}

fn prob_sum(s: &Saliency, groups: &[Group<'_>]) -> Check {
    let gating = s.gating.describe();
    if !s.gating.probabilities_sum_to_one() {
        return prob_range(s, groups);
    }
    let mut worst = (0.0f64, String::from("none"));
    for g in groups {
        for l in g.layers {
            let sum: f64 = l.prob_sum.iter().sum();
            let rel = (sum - g.n_tokens as f64).abs() / (g.n_tokens as f64).max(1.0);
            if rel > worst.0 || worst.1 == "none" {
                worst = (
                    rel,
                    format!("{} layer {}: {sum} vs {}", g.name, l.layer, g.n_tokens),
                );
            }
        }
    }
    let figure = format!(
        "{gating}: worst relative deviation of the sum from n_tokens {:.3e} at {} (tolerance {PROB_SUM_RTOL:e})",
        worst.0, worst.1
    );
    if worst.0 > PROB_SUM_RTOL {
        Check::fail(inv::PROB_SUM, figure)
    } else {
        Check::pass(inv::PROB_SUM, figure)
    }
}

/// Gatings whose per-token values are bounded but do not sum to 1: every
/// expert's sum lies in `[lo, hi] * n_tokens`.
fn prob_range(s: &Saliency, groups: &[Group<'_>]) -> Check {
    let (lo, hi) = s.gating.value_range();
    let mut outside = Vec::new();
    let mut widest = (f64::INFINITY, f64::NEG_INFINITY);
    for g in groups {
        let n = g.n_tokens as f64;
        for l in g.layers {
            for (e, &p) in l.prob_sum.iter().enumerate() {
                let per_token = p / n.max(1.0);
                widest = (widest.0.min(per_token), widest.1.max(per_token));
                let slack = PROB_SUM_RTOL * n.max(1.0);
                if p < lo * n - slack || p > hi * n + slack {
                    outside.push(format!(
                        "{} layer {} expert {e}: {p} over {n} tokens",
                        g.name, l.layer
                    ));
                }
            }
        }
    }
    let figure = format!(
        "{}: every value in [{lo}, {hi}], so each prob_sum in [{lo}, {hi}] x n_tokens; mean per token from {:.4} to {:.4}",
        s.gating.describe(),
        widest.0,
        widest.1
    );
    match outside.first() {
        Some(first) => Check::fail(
            inv::PROB_SUM,
            format!("{figure}; {} outside, first {first}", outside.len()),
        ),
        None => Check::pass(inv::PROB_SUM, figure),
    }
}

/// Relative tolerance of `sum(weight_sum) == n_tokens * scale`: each
/// token's k weights were normalised and scaled in f32.
pub const WEIGHT_SUM_RTOL: f64 = 1e-5;

fn weight_sum(s: &Saliency, groups: &[Group<'_>]) -> Check {
    let r = &s.routing;
    let normalised = r.weights_norm || s.gating == numbers::Gating::SoftmaxWeight;
    let scale = f64::from(r.weights_scale);
    let mut worst = (0.0f64, String::from("none"));
    for g in groups {
        let want = g.n_tokens as f64 * scale;
        for l in g.layers {
            let sum: f64 = l.weight_sum.iter().sum();
            let rel = (sum - want).abs() / want.max(1.0);
            if rel > worst.0 || worst.1 == "none" {
                worst = (
                    rel,
                    format!("{} layer {}: {sum} vs {want}", g.name, l.layer),
                );
            }
        }
    }
    let figure = format!(
        "worst relative deviation {:.3e} at {} (scale {scale}, tolerance {WEIGHT_SUM_RTOL:e})",
        worst.0, worst.1
    );
    if !normalised {
        Check::info(
            inv::WEIGHT_SUM,
            format!("top-k weights not normalised, not asserted; {figure}"),
        )
    } else if worst.0 > WEIGHT_SUM_RTOL && s.nonfinite_drops == 0 {
        Check::fail(inv::WEIGHT_SUM, figure)
    } else {
        Check::pass(inv::WEIGHT_SUM, figure)
    }
}

fn dead_iff_zero(groups: &[Group<'_>]) -> Check {
    let mut bad = Vec::new();
    for g in groups {
        for l in g.layers {
            for (e, &c) in l.count.iter().enumerate() {
                if (c == 0) != (l.reap_l2_sum[e] == 0.0) {
                    bad.push(format!(
                        "{} layer {} expert {e}: count {c}, reap_l2_sum {}",
                        g.name, l.layer, l.reap_l2_sum[e]
                    ));
                }
            }
        }
    }
    match bad.first() {
        Some(first) => Check::fail(
            inv::DEAD_IFF_ZERO,
            format!("{} violations; first {first}", bad.len()),
        ),
        None => Check::pass(inv::DEAD_IFF_ZERO, "0 violations".into()),
    }
}

fn finite(groups: &[Group<'_>], nonfinite: &[String]) -> Check {
    let mut bad: Vec<String> = nonfinite.to_vec();
    for g in groups {
        for l in g.layers {
            for (name, v) in stat_vectors(l) {
                if let Some(e) = v.iter().position(|x| !x.is_finite()) {
                    bad.push(format!("{} layer {} {name}[{e}]", g.name, l.layer));
                }
            }
        }
    }
    match bad.first() {
        Some(first) => Check::fail(
            inv::FINITE,
            format!("{} non-finite values; first at {first}", bad.len()),
        ),
        None => Check::pass(inv::FINITE, "0 non-finite values".into()),
    }
}

fn cauchy_schwarz(groups: &[Group<'_>]) -> Check {
    // Worst (sq - bound) in units of the allowed slack: below -1 fails.
    let mut worst: Option<(f64, String)> = None;
    for g in groups {
        for l in g.layers {
            for e in 0..l.count.len() {
                let Some((margin, sq, bound)) = l.cauchy_schwarz(e) else {
                    continue;
                };
                if worst.as_ref().is_none_or(|w| margin < w.0) {
                    worst = Some((
                        margin,
                        format!(
                            "{} layer {} expert {e}: sq {sq} vs bound {bound}",
                            g.name, l.layer
                        ),
                    ));
                }
            }
        }
    }
    let figure = |m: f64, what: &str| {
        format!(
            "worst margin {m:.3e} x the slack ({CAUCHY_SCHWARZ_RTOL:e} relative + 2^-64 per token) at {what}"
        )
    };
    match worst {
        Some((m, what)) if m < -1.0 => Check::fail(inv::CAUCHY_SCHWARZ, figure(m, &what)),
        Some((m, what)) => Check::pass(inv::CAUCHY_SCHWARZ, figure(m, &what)),
        None => Check::pass(inv::CAUCHY_SCHWARZ, "no live expert".into()),
    }
}

fn drops(s: &Saliency) -> Check {
    if s.nonfinite_drops == 0 {
        return Check::pass(inv::DROPS, "0 dropped".into());
    }
    let by: Vec<String> = s
        .nonfinite_drops_by_tensor
        .iter()
        .map(|(t, n)| format!("{t}: {n}"))
        .collect();
    Check::warn(
        inv::DROPS,
        format!(
            "{} NON-FINITE VALUES DROPPED during measurement ({})",
            s.nonfinite_drops,
            by.join(", ")
        ),
    )
}
