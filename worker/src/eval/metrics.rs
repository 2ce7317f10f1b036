//! Per-position comparison of two logits rows in f64: KL(p || q) over the
//! whole vocabulary, both negative log likelihoods of the actual next token,
//! top-1 agreement and the next token's probability change.

/// What a base row needs once, however many candidates it is compared with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// `log(sum(exp(logits)))` in f64.
    pub log_sum_exp: f64,
    /// Index of the largest logit (the first one on a tie).
    pub argmax: usize,
}

/// Log-sum-exp and argmax of a logits row, in f64.
pub fn row_stats(logits: &[f32]) -> RowStats {
    let mut argmax = 0;
    let mut max = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            max = v;
            argmax = i;
        }
    }
    let m = f64::from(max);
    let sum: f64 = logits.iter().map(|&v| (f64::from(v) - m).exp()).sum();
    RowStats {
        log_sum_exp: m + sum.ln(),
        argmax,
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

/// Compares a base row (with its [`RowStats`]) and a candidate row at a
/// position whose actual next token is `next`.
pub fn compare(base: &[f32], bs: RowStats, cand: &[f32], next: usize) -> Compared {
    let cs = row_stats(cand);
    let mut kl = 0.0;
    for (&a, &b) in base.iter().zip(cand) {
        let log_p = f64::from(a) - bs.log_sum_exp;
        let log_q = f64::from(b) - cs.log_sum_exp;
        kl += log_p.exp() * (log_p - log_q);
    }
    let log_p_next = f64::from(base[next]) - bs.log_sum_exp;
    let log_q_next = f64::from(cand[next]) - cs.log_sum_exp;
    Compared {
        kl,
        nll_base: -log_p_next,
        nll_candidate: -log_q_next,
        top1_same: bs.argmax == cs.argmax,
        dprob: log_q_next.exp() - log_p_next.exp(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_rows_have_zero_kl_and_agree() {
        let row: Vec<f32> = (0..50)
            .map(|i| ((i * 37) % 11) as f32 * 0.3 - 1.0)
            .collect();
        let c = compare(&row, row_stats(&row), &row, 7);
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
        let c = compare(&base, row_stats(&base), &cand, 0);
        let p = [0.25f64, 0.75];
        let expected = p[0] * (p[0] / 0.5).ln() + p[1] * (p[1] / 0.5).ln();
        assert!((c.kl - expected).abs() < 1e-7, "{} vs {expected}", c.kl);
        assert!((c.nll_base - 4f64.ln()).abs() < 1e-7);
        assert!((c.nll_candidate - 2f64.ln()).abs() < 1e-12);
        assert!(!c.top1_same);
        assert!((c.dprob - 0.25).abs() < 1e-7);
    }
}
