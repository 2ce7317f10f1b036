//! Per-position comparison of two logits rows in f64: KL(p || q) over the
//! whole vocabulary, both negative log likelihoods of the actual next token,
//! top-1 agreement and the next token's probability change.
//!
//! Cost: one exponential per vocabulary entry for the base row (its
//! probabilities are kept for every candidate) and one per entry per
//! candidate (its log-sum-exp), through the vectorised [`exp`]. The KL sum
//! is `sum p_i * ((a_i - b_i) - (lse_p - lse_q))`: the logit difference is
//! exact in f64, identical rows give exactly 0, and no two large sums are
//! subtracted (the algebraically equal `sum p_i (a_i - b_i) - lse_p + lse_q`
//! would, and lose the digits of a small KL).

use super::exp::{exp_shifted_into, sum_lanes};

/// Log-sum-exp and argmax of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// `log(sum(exp(logits)))` in f64.
    pub log_sum_exp: f64,
    /// Index of the largest logit (the first one on a tie).
    pub argmax: usize,
}

/// Fills `exps` with `exp(logit - max)` for every entry and returns the
/// row's [`RowStats`] and the sum of `exps`. Base and candidate rows go
/// through this same function, so equal rows give equal figures bit for bit.
fn softmax_parts(logits: &[f32], exps: &mut Vec<f64>) -> (RowStats, f64) {
    let mut argmax = 0;
    let mut max = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            max = v;
            argmax = i;
        }
    }
    let m = f64::from(max);
    let sum = exp_shifted_into(logits, m, exps);
    let stats = RowStats {
        log_sum_exp: m + sum.ln(),
        argmax,
    };
    (stats, sum)
}

/// A base row ready to be compared with any number of candidate rows: its
/// stats and its probabilities `p_i` in f64, computed once.
pub struct BaseRow<'a> {
    logits: &'a [f32],
    stats: RowStats,
    probs: &'a [f64],
}

impl<'a> BaseRow<'a> {
    /// Prepares `logits`, keeping its probabilities in `probs` (a scratch
    /// buffer reused row after row).
    pub fn new(logits: &'a [f32], probs: &'a mut Vec<f64>) -> BaseRow<'a> {
        let (stats, sum) = softmax_parts(logits, probs);
        probs.iter_mut().for_each(|e| *e /= sum);
        BaseRow {
            logits,
            stats,
            probs,
        }
    }

    /// The row's log-sum-exp and argmax.
    pub fn stats(&self) -> RowStats {
        self.stats
    }

    /// The base model's negative log likelihood of token `next`.
    pub fn nll(&self, next: usize) -> f64 {
        self.stats.log_sum_exp - f64::from(self.logits[next])
    }
}

/// The comparison of one scored position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Compared {
    /// KL(p || q) with p = softmax(base), q = softmax(candidate).
    pub kl: f64,
    /// The base model's negative log likelihood of the next token.
    pub nll_base: f64,
    /// The candidate's.
    pub nll_candidate: f64,
    /// Whether both rows have the same argmax.
    pub top1_same: bool,
    /// q(next) - p(next).
    pub dprob: f64,
}

/// Compares a prepared base row with a candidate row at a position whose
/// actual next token is `next`; `exps` is scratch space (one f64 per entry).
pub fn compare(base: &BaseRow<'_>, cand: &[f32], next: usize, exps: &mut Vec<f64>) -> Compared {
    let (cs, sum_q) = softmax_parts(cand, exps);
    let shift = base.stats.log_sum_exp - cs.log_sum_exp;
    let mut lanes = [0.0f64; 4];
    let (p4, a4, b4) = (
        base.probs.chunks_exact(4),
        base.logits.chunks_exact(4),
        cand.chunks_exact(4),
    );
    let term = |p: f64, a: f32, b: f32| p * ((f64::from(a) - f64::from(b)) - shift);
    let tail: f64 = (p4.remainder().iter())
        .zip(a4.remainder())
        .zip(b4.remainder())
        .map(|((&p, &a), &b)| term(p, a, b))
        .sum();
    for ((p, a), b) in p4.zip(a4).zip(b4) {
        for j in 0..4 {
            lanes[j] += term(p[j], a[j], b[j]);
        }
    }
    let kl = sum_lanes(&lanes) + tail;
    Compared {
        kl,
        nll_base: base.nll(next),
        nll_candidate: cs.log_sum_exp - f64::from(cand[next]),
        top1_same: base.stats.argmax == cs.argmax,
        dprob: exps[next] / sum_q - base.probs[next],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compare_rows(base: &[f32], cand: &[f32], next: usize) -> Compared {
        let (mut probs, mut exps) = (Vec::new(), Vec::new());
        let b = BaseRow::new(base, &mut probs);
        compare(&b, cand, next, &mut exps)
    }

    #[test]
    fn identical_rows_have_zero_kl_and_agree() {
        let row: Vec<f32> = (0..50)
            .map(|i| ((i * 37) % 11) as f32 * 0.3 - 1.0)
            .collect();
        let c = compare_rows(&row, &row, 7);
        assert_eq!(c.kl, 0.0);
        assert!(c.top1_same);
        assert_eq!(c.dprob, 0.0);
        assert_eq!(c.nll_base, c.nll_candidate);
    }

    #[test]
    fn two_token_kl_matches_the_closed_form() {
        // p = softmax(0, ln 3) = (1/4, 3/4); q = softmax(0, 0) = (1/2, 1/2).
        let base = [0.0f32, 3f32.ln()];
        let cand = [0.0f32, 0.0];
        let c = compare_rows(&base, &cand, 0);
        let p = [0.25f64, 0.75];
        let expected = p[0] * (p[0] / 0.5).ln() + p[1] * (p[1] / 0.5).ln();
        assert!((c.kl - expected).abs() < 1e-7, "{} vs {expected}", c.kl);
        assert!((c.nll_base - 4f64.ln()).abs() < 1e-7);
        assert!((c.nll_candidate - 2f64.ln()).abs() < 1e-12);
        assert!(!c.top1_same);
        assert!((c.dprob - 0.25).abs() < 1e-7);
    }

    /// Textbook f64 reference with libm: log-softmax of each row, then
    /// `sum p (log p - log q)` sequentially.
    fn reference_kl(a: &[f32], b: &[f32]) -> f64 {
        let log_softmax = |r: &[f32]| {
            let m = r.iter().map(|&v| f64::from(v)).fold(f64::MIN, f64::max);
            let lse = m + r
                .iter()
                .map(|&v| (f64::from(v) - m).exp())
                .sum::<f64>()
                .ln();
            r.iter().map(|&v| f64::from(v) - lse).collect::<Vec<_>>()
        };
        let (lp, lq) = (log_softmax(a), log_softmax(b));
        lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum()
    }

    #[test]
    fn kl_of_shifted_rows_matches_the_reference() {
        // A large vocabulary, logits far from 0, the candidate shifted by 25
        // and perturbed on a third of the entries.
        let n = 5003;
        let a: Vec<f32> = (0..n)
            .map(|i| 40.0 + ((i * 7919) % 1000) as f32 * 0.013)
            .collect();
        let b: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, &v)| v + if i % 3 == 0 { 0.05 } else { 0.0 } + 25.0)
            .collect();
        let got = compare_rows(&a, &b, 11).kl;
        let want = reference_kl(&a, &b);
        assert!(want > 1e-5 && want < 1e-3, "reference {want}");
        assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");
    }

    #[test]
    fn a_pure_shift_has_kl_zero_up_to_rounding() {
        // Exact in f32: multiples of 1/8 plus 32.
        let a: Vec<f32> = (0..4099).map(|i| ((i * 31) % 200) as f32 * 0.125).collect();
        let b: Vec<f32> = a.iter().map(|&v| v + 32.0).collect();
        let c = compare_rows(&a, &b, 5);
        assert!(c.kl.abs() < 1e-13, "{}", c.kl);
        assert!(c.top1_same);
        assert!(c.dprob.abs() < 1e-15, "{}", c.dprob);
    }
}
