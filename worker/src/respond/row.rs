//! One pass figures of a logits row for the response sampler: its maximum,
//! the first index holding it, and its log-sum-exp. Every generated token
//! needs all three over the whole vocabulary, so they are written to
//! vectorize: 16 independent lanes (max and sum), and `exp` of the
//! non-positive `l - max` as a range reduction to `2^k e^r` with a degree-6
//! polynomial in f32 (relative error below 4e-7 where `exp` is a normal
//! f32; an f64 `exp` per logit cost about a fifth of a generation step on
//! the quickstart model). The lanes' sums are added in f64, in a fixed
//! order, so a row gives the same figures on every run and worker.

/// Lanes summed independently (two AVX registers, four SSE ones).
const LANES: usize = 16;

/// The figures of a logits row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowFigures {
    /// The largest logit.
    pub max: f32,
    /// The first index holding it.
    pub argmax: usize,
    /// `ln sum_i exp(l_i)`.
    pub log_sum_exp: f64,
}

/// The figures of `row` (not empty; NaN logits are not expected).
pub fn figures(row: &[f32]) -> RowFigures {
    assert!(!row.is_empty(), "an empty logits row");
    let max = max_of(row);
    let argmax = row.iter().position(|&v| v == max).unwrap_or(0);
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += exp_non_positive(v - max);
        }
    }
    let mut sum: f64 = acc.iter().map(|&a| f64::from(a)).sum();
    sum += tail
        .iter()
        .map(|&v| f64::from(exp_non_positive(v - max)))
        .sum::<f64>();
    RowFigures {
        max,
        argmax,
        log_sum_exp: f64::from(max) + sum.ln(),
    }
}

/// The largest value of `row` (not empty).
fn max_of(row: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    m.iter()
        .chain(tail)
        .copied()
        .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
}

/// `e^x` for `x <= 0`, flushed to 0 below -87 (where it leaves the normal
/// range of f32): `x = k ln 2 + r` with `|r| <= ln 2 / 2`, `e^r` by its
/// Taylor polynomial of degree 6 (remainder below 1.3e-7), `2^k` built in
/// the exponent bits.
#[inline(always)]
fn exp_non_positive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that k * LN2_HI is exact for |k| < 2^8.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer kept in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let below = x < -87.0;
    let x = if below { -87.0 } else { x };
    let kr = x * LOG2E + ROUND;
    let k = kr.to_bits() as i32 - ROUND.to_bits() as i32;
    let kf = kr - ROUND;
    let r = x - kf * LN2_HI - kf * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((k + 127) as u32) << 23);
    if below {
        0.0
    } else {
        p * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn exp_matches_f64_exp_over_its_range() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let want = (x as f64).exp();
            let got = exp_non_positive(x) as f64;
            assert!(((got - want) / want).abs() < 4e-7, "e^{x}: {got} vs {want}");
            x -= 0.013;
        }
        assert_eq!(exp_non_positive(0.0), 1.0);
        assert_eq!(exp_non_positive(-200.0), 0.0);
        assert_eq!(exp_non_positive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn figures_match_an_f64_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for (len, spread) in [(1usize, 1.0f32), (15, 3.0), (8192, 30.0), (8203, 0.5)] {
            let row: Vec<f32> = (0..len)
                .map(|_| ((rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * spread)
                .collect();
            let f = figures(&row);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == max).unwrap();
            let lse = max as f64
                + row
                    .iter()
                    .map(|&v| (v as f64 - max as f64).exp())
                    .sum::<f64>()
                    .ln();
            assert_eq!((f.max, f.argmax), (max, first), "len {len}");
            assert!(
                (f.log_sum_exp - lse).abs() < 1e-5,
                "len {len}: {f:?} vs {lse}"
            );
        }
    }

    #[test]
    fn argmax_is_the_first_of_equal_maxima() {
        let mut row = vec![0.0f32; 40];
        row[33] = 2.0;
        row[17] = 2.0;
        row[39] = 1.0;
        assert_eq!(figures(&row).argmax, 17);
    }
}
