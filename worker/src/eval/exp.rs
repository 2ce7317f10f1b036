//! `exp(x)` for `x <= 0` in f64, written so that a loop over a slice
//! compiles to SIMD code: a softmax over a whole vocabulary needs one
//! exponential per entry (every logit minus the row's max), and libm's
//! `exp` is a call per element that LLVM cannot vectorise.
//!
//! Method: Cody-Waite range reduction `x = k ln 2 + r`, `|r| <= ln 2 / 2`,
//! with `ln 2` split in two so that `k * LN2_HI` is exact; `exp(r)` by its
//! Taylor polynomial of degree 13 (truncation error below 5e-18 relative),
//! evaluated by Estrin's scheme;
//! `2^k` built from its exponent bits. Only plain multiplies and adds
//! (`f64::mul_add` is a libm call without the `fma` target feature) and a
//! branch-free select for very negative `x`.

/// `log2(e)`: `x * LOG2_E` rounded to an integer is `k`.
const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// High part of `ln 2` (its low 21 mantissa bits are zero, so `k * LN2_HI`
/// is exact for `|k| < 2^11`).
const LN2_HI: f64 = 0.693_147_180_369_123_8;
/// `ln 2 - LN2_HI`.
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// `1.5 * 2^52`: adding it rounds a small f64 to an integer held in the
/// low mantissa bits.
const ROUND: f64 = 6_755_399_441_055_744.0;
/// Below this, `exp(x)` is under the smallest normal f64 (2.2e-308) and the
/// result is flushed to 0.
const FLUSH_BELOW: f64 = -708.0;

/// `1 / n!` for n = 0 to 13 (each the f64 nearest to it).
const TAYLOR: [f64; 14] = [
    1.0,
    1.0,
    0.5,
    0.166_666_666_666_666_66,
    4.166_666_666_666_666_4e-2,
    8.333_333_333_333_333e-3,
    1.388_888_888_888_889e-3,
    1.984_126_984_126_984e-4,
    2.480_158_730_158_73e-5,
    2.755_731_922_398_589_3e-6,
    2.755_731_922_398_589e-7,
    2.505_210_838_544_172e-8,
    2.087_675_698_786_81e-9,
    1.605_904_383_682_161_3e-10,
];

/// The Taylor polynomial at `r` by Estrin's scheme: pairs, then powers
/// r^2, r^4, r^8, so the longest chain of dependent operations is about 8
/// instead of Horner's 26, and a loop over a slice is not latency-bound.
#[inline(always)]
fn taylor(r: f64) -> f64 {
    let c = &TAYLOR;
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pair = |i: usize| c[i] + c[i + 1] * r;
    let q0 = pair(0) + pair(2) * r2;
    let q1 = pair(4) + pair(6) * r2;
    let q2 = pair(8) + pair(10) * r2;
    let q3 = pair(12);
    (q0 + q1 * r4) + (q2 + q3 * r4) * r8
}

/// `exp(x)` for `x <= 0`: within 2 ulp of the exact value for
/// `-708 <= x <= 0` (measured against libm over 4M points in the tests),
/// `exp(0) == 1` exactly, 0 for `x < -708` (where the true value is below
/// 2.2e-308: subnormal or 0) and for `-inf`; NaN stays NaN. Positive `x`
/// is outside its contract (the result is wrong, never UB).
#[inline(always)]
pub fn exp_nonpositive(x: f64) -> f64 {
    let clamped = if x < FLUSH_BELOW { FLUSH_BELOW } else { x };
    let shifted = clamped * LOG2_E + ROUND;
    let k = shifted - ROUND;
    let r = (clamped - k * LN2_HI) - k * LN2_LO;
    let p = taylor(r);
    // The low bits of `shifted` hold k (two's complement); k + 1023 is the
    // biased exponent of 2^k, in 1..=1023 for clamped inputs.
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(1023);
    let scale = f64::from_bits(biased << 52);
    if x < FLUSH_BELOW {
        0.0
    } else {
        p * scale
    }
}

/// `out[i] = exp(f64(row[i]) - shift)` for every entry (each argument must
/// be <= 0: `shift` is the row's max), and the sum of `out`, added in four
/// interleaved lanes so that the sum vectorises too and is the same on
/// every call with the same row.
pub fn exp_shifted_into(row: &[f32], shift: f64, out: &mut Vec<f64>) -> f64 {
    // A plain loop over equal-length slices (not `extend`, whose capacity
    // checks keep LLVM from vectorising the body).
    out.resize(row.len(), 0.0);
    for (o, &v) in out.iter_mut().zip(row) {
        *o = exp_nonpositive(f64::from(v) - shift);
    }
    sum_lanes(out)
}

/// Sum of `v` in four interleaved lanes, then the lanes pairwise: a fixed
/// order that LLVM vectorises (a sequential f64 sum it may not reorder).
pub fn sum_lanes(v: &[f64]) -> f64 {
    let mut lanes = [0.0f64; 4];
    let quads = v.chunks_exact(4);
    let tail: f64 = quads.remainder().iter().sum();
    for q in quads {
        for (l, &x) in lanes.iter_mut().zip(q) {
            *l += x;
        }
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two positive finite f64.
    fn ulps(a: f64, b: f64) -> u64 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn within_two_ulp_of_libm_over_the_whole_range() {
        let n = 4_000_000u32;
        let mut worst = (0u64, 0.0f64);
        for i in 0..=n {
            // Dense and irregular: every point gets a different fraction.
            let x = -708.0 * f64::from(i) / f64::from(n) - 1e-7 * f64::from(i % 7);
            let x = x.max(-708.0);
            let u = ulps(exp_nonpositive(x), x.exp());
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 2, "{} ulp at x = {:e}", worst.0, worst.1);
    }

    #[test]
    fn within_two_ulp_near_zero_and_at_reduction_boundaries() {
        let ln2 = std::f64::consts::LN_2;
        let mut xs = vec![-f64::MIN_POSITIVE, -1e-300, -1e-17, -1e-9, -0.5 * ln2];
        for k in 1..1021 {
            let edge = -(f64::from(k) + 0.5) * ln2;
            xs.extend([edge, edge.next_up(), edge.next_down(), -f64::from(k) * ln2]);
        }
        for x in xs {
            let u = ulps(exp_nonpositive(x), x.exp());
            assert!(u <= 2, "{u} ulp at x = {x:e}");
        }
    }

    #[test]
    fn extremes() {
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert!(ulps(exp_nonpositive(-708.0), (-708.0f64).exp()) <= 2);
        assert_eq!(exp_nonpositive(-708.5), 0.0);
        assert_eq!(exp_nonpositive(-1e10), 0.0);
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f64::NAN).is_nan());
    }

    #[test]
    fn a_shifted_row_sums_like_a_plain_sum() {
        let row: Vec<f32> = (0..1001).map(|i| ((i * 53) % 97) as f32 * -0.25).collect();
        let mut out = Vec::new();
        let s = exp_shifted_into(&row, 0.0, &mut out);
        let libm: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        assert_eq!(out.len(), row.len());
        assert!((s - libm).abs() <= 1e-14 * libm, "{s} vs {libm}");
    }
}
