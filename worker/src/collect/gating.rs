//! The routing rule applied to one token's router output on the host: the
//! gating function that turns logits into probabilities, and the ranking
//! llama.cpp selects experts by (probability plus selection bias, limited
//! to the best groups). The trace's own top-N and the lookahead guesses
//! (`collect/lookahead.rs`) both rank with it.

use numbers::routing::ExpertGroups;
use numbers::Gating;

/// Turns a row of router logits into the gating function's values in
/// place: the softmax over all experts (softmax gating, and the
/// probabilities of [`Gating::SoftmaxWeight`]), a sigmoid per expert, or
/// `sqrt(softplus(logit))` per expert.
pub fn activate(gating: Gating, row: &mut [f32]) {
    match gating {
        Gating::Softmax | Gating::SoftmaxWeight => softmax_in_place(row),
        Gating::Sigmoid => row
            .iter_mut()
            .for_each(|v| *v = (1.0 / (1.0 + (-f64::from(*v)).exp())) as f32),
        Gating::SqrtSoftplus => row.iter_mut().for_each(|v| {
            let x = f64::from(*v);
            // softplus(x) = max(x, 0) + ln(1 + e^-|x|), stable at both ends.
            *v = (x.max(0.0) + (-x.abs()).exp().ln_1p()).sqrt() as f32
        }),
    }
}

/// Turns a row of router logits into the softmax over all of them (f64
/// inside, rounded once to f32): the probabilities of
/// [`Gating::SoftmaxWeight`] routing. A non-finite logit makes the row
/// non-finite, which the sums count and drop.
pub fn softmax_in_place(row: &mut [f32]) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&l| (l as f64 - m).exp()).sum();
    for v in row.iter_mut() {
        *v = ((*v as f64 - m).exp() / z) as f32;
    }
}

/// The scores llama.cpp selects on: `probs` plus the block's selection
/// bias (added in f32, as ggml does), or `probs` themselves without one.
pub fn selection_scores<'a>(probs: &'a [f32], bias: Option<&[f32]>) -> std::borrow::Cow<'a, [f32]> {
    match bias {
        Some(b) => probs.iter().zip(b).map(|(p, b)| p + b).collect(),
        None => std::borrow::Cow::Borrowed(probs),
    }
}

/// The ids of the `n` best experts under `scores`, best first: with
/// `groups`, the experts of the `n_group_used` groups whose two best scores
/// add up highest come first (what the router may select from, so the
/// first `k` are its selection), then the others; each part by score
/// descending, ties by id.
pub fn ranked(scores: &[f32], groups: Option<ExpertGroups>, n: usize) -> Vec<u16> {
    Ranker::default().ranked(scores, groups, n)
}

/// [`ranked`] with its working memory kept between calls, so ranking the
/// tokens of a micro-batch allocates only the returned ids.
///
/// Each expert becomes one integer key whose ascending order is the
/// ranking: bit 48 set outside the chosen groups, bits 16..48 the score's
/// order bits inverted (descending, as `f32::total_cmp`), bits 0..16 the
/// id. A partial selection of the keys, then a sort of the first `n` (a
/// full sort of 512 experts per (token, layer) was a tenth of a traced run).
#[derive(Default)]
pub struct Ranker {
    keys: Vec<u64>,
    chosen: Vec<bool>,
    group_score: Vec<(f32, usize)>,
}

impl Ranker {
    /// See [`ranked`].
    pub fn ranked(&mut self, scores: &[f32], groups: Option<ExpertGroups>, n: usize) -> Vec<u16> {
        let n = n.min(scores.len());
        if n == 0 {
            return Vec::new();
        }
        let per_group = match groups.filter(|g| g.n_group > 1) {
            Some(g) if scores.len() / g.n_group as usize > 0 => {
                let per_group = scores.len() / g.n_group as usize;
                self.choose_groups(scores, per_group, g.n_group_used as usize);
                per_group
            }
            _ => 0,
        };
        self.keys.clear();
        self.keys.extend(scores.iter().enumerate().map(|(e, &s)| {
            // Experts outside the chosen groups rank after every chosen one.
            let outside =
                per_group > 0 && !self.chosen.get(e / per_group).copied().unwrap_or(false);
            (u64::from(outside) << 48) | (u64::from(!order_bits(s)) << 16) | e as u64
        }));
        if n < self.keys.len() {
            self.keys.select_nth_unstable(n - 1);
        }
        let first = &mut self.keys[..n];
        first.sort_unstable();
        first.iter().map(|&k| k as u16).collect()
    }

    /// Marks in `chosen` the `used` groups of `per_group` experts whose two
    /// best scores add up highest (ties: the lower group).
    fn choose_groups(&mut self, scores: &[f32], per_group: usize, used: usize) {
        self.group_score.clear();
        for (i, s) in scores.chunks(per_group).enumerate() {
            let (mut best, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for &v in s {
                if v.total_cmp(&best).is_gt() {
                    second = best;
                    best = v;
                } else if v.total_cmp(&second).is_gt() {
                    second = v;
                }
            }
            // Summed as the two best of the group, in order.
            let sum: f32 = [best, second].iter().take(s.len().min(2)).sum();
            self.group_score.push((sum, i));
        }
        self.group_score
            .sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        self.chosen.clear();
        self.chosen.resize(self.group_score.len(), false);
        for &(_, i) in self.group_score.iter().take(used) {
            self.chosen[i] = true;
        }
    }
}

/// `x`'s bits mapped so that unsigned order is `f32::total_cmp` order.
#[inline]
fn order_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | (1 << 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed keys order like `f32::total_cmp`, signs and zeros included.
    #[test]
    fn order_bits_follow_total_cmp() {
        let xs = [
            f32::NEG_INFINITY,
            -2.5,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            0.5,
            3.0,
            f32::INFINITY,
        ];
        for a in xs {
            for b in xs {
                assert_eq!(
                    order_bits(a).cmp(&order_bits(b)),
                    a.total_cmp(&b),
                    "{a} vs {b}"
                );
            }
        }
    }

    /// The partial selection must equal a full sort's prefix, ties included.
    #[test]
    fn top_n_matches_a_full_sort_with_ties() {
        let mut state = 12345u64;
        for round in 0..200 {
            let len = 1 + round % 40;
            let probs: Vec<f32> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Few distinct values, so ties are common.
                    ((state >> 60) as f32) / 16.0
                })
                .collect();
            let mut full: Vec<u16> = (0..len as u16).collect();
            full.sort_by(|&a, &b| {
                probs[b as usize]
                    .total_cmp(&probs[a as usize])
                    .then(a.cmp(&b))
            });
            for n in [0, 1, len / 2, len, len + 3] {
                let want: Vec<u16> = full.iter().copied().take(n).collect();
                assert_eq!(ranked(&probs, None, n), want, "probs {probs:?}, n {n}");
            }
        }
    }

    /// Groups: the best expert overall sits in a group whose second best is
    /// poor, so that group loses and its expert ranks after the chosen ones.
    #[test]
    fn grouped_ranking_puts_the_chosen_groups_first() {
        // 4 groups of 2: sums of the two best: 0.9+0.0, 0.5+0.5, 0.6+0.3, 0.2+0.1.
        let scores = [0.9, 0.0, 0.5, 0.5, 0.6, 0.3, 0.2, 0.1];
        let groups = Some(ExpertGroups {
            n_group: 4,
            n_group_used: 2,
        });
        assert_eq!(ranked(&scores, groups, 5), vec![4, 2, 3, 5, 0]);
        assert_eq!(ranked(&scores, None, 3), vec![0, 4, 2]);
    }

    #[test]
    fn gating_functions_match_their_formulas() {
        let mut row = [0.0f32, 2.0, -3.0];
        activate(Gating::Sigmoid, &mut row);
        assert!((row[1] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
        let mut row = [0.0f32, 2.0, -30.0];
        activate(Gating::SqrtSoftplus, &mut row);
        assert!((row[0] - 2f32.ln().sqrt()).abs() < 1e-6);
        assert!((row[1] - (1.0 + 2f32.exp()).ln().sqrt()).abs() < 1e-6);
        let mut row = [1.0f32, 1.0];
        activate(Gating::Softmax, &mut row);
        assert_eq!(row, [0.5, 0.5]);
    }
}
