//! Exact, order-independent sums.
//!
//! Every statistic that crosses a worker boundary is an [`ExactSum`]: a signed
//! fixed-point integer with [`FRACTION_BITS`] fractional bits. Each addend is
//! rounded to that grid once, deterministically, and from then on additions
//! are integer additions, so the total does not depend on grouping or order.

use serde::{Deserialize, Serialize};

/// Fractional bits of the fixed-point grid (resolution 2^-64, about 5.4e-20).
pub const FRACTION_BITS: i32 = 64;

/// Largest magnitude a sum can reach: 2^62 (about 4.6e18).
pub const MAX_MAGNITUDE: f64 = 4.611_686_018_427_388e18;

/// Bound on a sum's integer representation: [`MAX_MAGNITUDE`] on the grid.
const LIMIT: u128 = 1u128 << (62 + FRACTION_BITS);

/// A fixed-point sum whose addition is associative and commutative.
/// Decoding refuses an integer outside the accumulator's range, which no
/// sum of this type can hold, so a decoded value is always a valid one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "i128", into = "i128")]
pub struct ExactSum(pub i128);

impl TryFrom<i128> for ExactSum {
    type Error = String;

    fn try_from(raw: i128) -> Result<Self, String> {
        if raw.unsigned_abs() < LIMIT {
            Ok(ExactSum(raw))
        } else {
            Err(format!(
                "exact sum {raw} is outside the accumulator range (|x| < 2^{})",
                62 + FRACTION_BITS
            ))
        }
    }
}

impl From<ExactSum> for i128 {
    fn from(s: ExactSum) -> i128 {
        s.0
    }
}

/// Why a value cannot enter an exact sum.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum ExactError {
    /// NaN or infinity: these are counted as drops, never added.
    #[error("value {0} is not finite")]
    NonFinite(f64),
    /// The value (or the running sum) left the representable range.
    #[error("value {0} exceeds the exact accumulator range (|x| < 4.6e18)")]
    Overflow(f64),
}

impl ExactSum {
    /// The empty sum.
    pub const ZERO: ExactSum = ExactSum(0);

    /// Rounds `v` to the fixed-point grid (round half away from zero).
    pub fn from_f64(v: f64) -> Result<Self, ExactError> {
        if !v.is_finite() {
            return Err(ExactError::NonFinite(v));
        }
        if v.abs() >= MAX_MAGNITUDE {
            return Err(ExactError::Overflow(v));
        }
        Ok(ExactSum(scale_to_grid(v)))
    }

    /// Adds a finite float; refuses non-finite and out-of-range values.
    pub fn add_f64(&mut self, v: f64) -> Result<(), ExactError> {
        let x = Self::from_f64(v)?;
        self.add(x).map_err(|_| ExactError::Overflow(v))
    }

    /// Adds another exact sum (the merge operation).
    pub fn add(&mut self, other: ExactSum) -> Result<(), ExactError> {
        self.0 = self
            .0
            .checked_add(other.0)
            .filter(|s| s.unsigned_abs() < LIMIT)
            .ok_or_else(|| ExactError::Overflow(self.to_f64() + other.to_f64()))?;
        Ok(())
    }

    /// The nearest f64 to the exact value (deterministic): the integer is
    /// rounded once to f64, then scaled by a power of two, which is exact.
    pub fn to_f64(self) -> f64 {
        self.0 as f64 * 2f64.powi(-FRACTION_BITS)
    }

    /// True for the empty sum.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whether `|self| <= per_token * tokens` on the grid: the bound that
    /// keeps any merge of disjoint results of one corpus in range
    /// ([`per_token_limit`]).
    pub fn within(self, per_token: u128, tokens: u64) -> bool {
        self.0.unsigned_abs() <= per_token.saturating_mul(u128::from(tokens))
    }
}

/// The largest magnitude per token, on the grid, such that sums over at most
/// `total_tokens` tokens, each bounded by this times its own token count,
/// always add up within the accumulator range: a result that holds to it
/// can be merged with any other results of disjoint tokens of the corpus.
pub fn per_token_limit(total_tokens: u64) -> u128 {
    (LIMIT - 1) / u128::from(total_tokens.max(1))
}

/// `round(v * 2^FRACTION_BITS)` (half away from zero) for a finite `v` with
/// `|v| < MAX_MAGNITUDE`, taken from the float's bits: the worker folds
/// hundreds of thousands of sums per chunk, and this integer path costs a few
/// instructions where a float round and an i128 conversion cost about seventy.
#[inline]
fn scale_to_grid(v: f64) -> i128 {
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1u64 << 52) - 1);
    // v = ±mantissa * 2^exponent with an integer mantissa below 2^53.
    let (mantissa, exponent) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased - 1075)
    };
    let shift = exponent + FRACTION_BITS;
    let magnitude = if shift >= 0 {
        // |v| < 2^62 keeps this below 2^126.
        u128::from(mantissa) << shift
    } else if shift > -64 {
        let right = (-shift) as u32;
        (u128::from(mantissa) + (1u128 << (right - 1))) >> right
    } else {
        // mantissa / 2^64 < 2^-11 rounds to zero.
        0
    };
    if bits >> 63 == 1 {
        -(magnitude as i128)
    } else {
        magnitude as i128
    }
}

/// Adds `values` into `totals` element by element, as [`ExactSum::add`]
/// does one (the merge's inner loop, in one branch-free pass). All or
/// nothing: when a sum would leave the exact range, `totals` is left as it
/// was and the error gives the first such sum's index and about its value.
pub fn add_all(totals: &mut [ExactSum], values: &[ExactSum]) -> Result<(), (usize, f64)> {
    let mut outside = false;
    for (t, v) in totals.iter_mut().zip(values) {
        let (sum, wrapped) = t.0.overflowing_add(v.0);
        outside |= wrapped | (sum.unsigned_abs() >= LIMIT);
        t.0 = sum;
    }
    if !outside {
        return Ok(());
    }
    // Undo every add (wrapping arithmetic is exact both ways), naming the
    // first sum that left the range.
    let mut first = None;
    for (i, (t, v)) in totals.iter_mut().zip(values).enumerate() {
        t.0 = t.0.wrapping_sub(v.0);
        let outside =
            t.0.checked_add(v.0)
                .is_none_or(|s| s.unsigned_abs() >= LIMIT);
        if outside && first.is_none() {
            first = Some((i, t.to_f64() + v.to_f64()));
        }
    }
    Err(first.expect("a sum left the range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_all_adds_as_add_does_and_leaves_the_totals_on_overflow() {
        let top = (LIMIT - 1) as i128;
        let totals = vec![ExactSum(5), ExactSum(-top), ExactSum(top - 1), ExactSum(0)];
        let fine = [ExactSum(-7), ExactSum(top), ExactSum(1), ExactSum(-top)];
        let mut by_one = totals.clone();
        for (t, v) in by_one.iter_mut().zip(&fine) {
            t.add(*v).unwrap();
        }
        let mut all = totals.clone();
        add_all(&mut all, &fine).unwrap();
        assert_eq!(all, by_one);
        // The third sum reaches the limit: nothing is added, it is named.
        let over = [ExactSum(1), ExactSum(1), ExactSum(2), ExactSum(top)];
        let mut all = totals.clone();
        let (index, value) = add_all(&mut all, &over).unwrap_err();
        assert_eq!((all, index), (totals.clone(), 2));
        assert_eq!(value, ExactSum(top).to_f64());
        let mut third = totals[2];
        assert!(third.add(over[2]).is_err());
        // Past i128 itself (values no decoder makes): refused the same way.
        let mut wide = vec![ExactSum(i128::MAX)];
        assert_eq!(add_all(&mut wide, &[ExactSum(1)]).unwrap_err().0, 0);
        assert_eq!(wide, vec![ExactSum(i128::MAX)]);
    }

    #[test]
    fn grouping_does_not_change_the_sum() {
        let values: Vec<f64> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f64 * 1e-3 + 1e8 * ((i % 3) as f64 - 1.0))
            .collect();
        let mut forward = ExactSum::ZERO;
        for v in &values {
            forward.add_f64(*v).unwrap();
        }
        let mut halves = [ExactSum::ZERO; 2];
        for (i, v) in values.iter().rev().enumerate() {
            halves[i % 2].add_f64(*v).unwrap();
        }
        let mut merged = halves[1];
        merged.add(halves[0]).unwrap();
        assert_eq!(forward, merged);
        // A float sum in the same two orders differs; the exact one does not.
        assert!((forward.to_f64() - values.iter().sum::<f64>()).abs() < 1e-3);
    }

    #[test]
    fn non_finite_and_huge_values_are_refused() {
        let mut s = ExactSum::ZERO;
        assert_eq!(
            s.add_f64(f64::NAN).unwrap_err().to_string(),
            "value NaN is not finite"
        );
        assert!(matches!(s.add_f64(1e19), Err(ExactError::Overflow(_))));
        assert!(s.is_zero());
    }

    /// The definition: scale by a power of two (exact), round half away from
    /// zero, convert.
    fn by_float_rounding(v: f64) -> i128 {
        (v * 2f64.powi(FRACTION_BITS)).round() as i128
    }

    #[test]
    fn grid_rounding_matches_the_float_definition() {
        let ulp = 2f64.powi(-FRACTION_BITS);
        let mut values = vec![
            0.0,
            -0.0,
            ulp,
            0.5 * ulp,
            -0.5 * ulp,
            1.5 * ulp,
            2.5 * ulp,
            -2.5 * ulp,
            0.49999999999999994 * ulp,
            f64::MIN_POSITIVE,
            -f64::from_bits(1),
            1.0,
            -1.0 / 3.0,
            MAX_MAGNITUDE.next_down(),
            -MAX_MAGNITUDE.next_down(),
        ];
        // A deterministic spread over every exponent that can occur.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let exponent = (x % 140) as i32 - 76;
            let v = f64::from_bits(x >> 12 | 0x3ff0_0000_0000_0000) - 1.0;
            let v = (v + 1.0) * 2f64.powi(exponent);
            values.push(if x & 1 == 1 { -v } else { v });
            // Exact halves of the grid: the round-half-away case.
            values.push(((x >> 20) as f64 + 0.5) * ulp * if x & 2 == 2 { -1.0 } else { 1.0 });
        }
        for v in values.into_iter().filter(|v| v.abs() < MAX_MAGNITUDE) {
            assert_eq!(scale_to_grid(v), by_float_rounding(v), "{v:e}");
        }
    }

    #[test]
    fn decoding_refuses_integers_no_sum_can_hold() {
        let cfg = bincode::config::standard();
        let encode = |raw: i128| bincode::serde::encode_to_vec(raw, cfg).unwrap();
        let decode = |bytes: &[u8]| {
            bincode::serde::decode_from_slice::<ExactSum, _>(bytes, cfg).map(|(s, _)| s)
        };
        let top = (LIMIT - 1) as i128;
        assert_eq!(decode(&encode(top)).unwrap(), ExactSum(top));
        assert_eq!(decode(&encode(-top)).unwrap(), ExactSum(-top));
        for raw in [LIMIT as i128, -(LIMIT as i128), i128::MAX, i128::MIN] {
            let e = decode(&encode(raw)).unwrap_err().to_string();
            assert!(e.contains("outside the accumulator range"), "{e}");
        }
    }

    #[test]
    fn sums_within_the_per_token_limit_always_merge() {
        // Three results of 1, 2 and 3 tokens of a 6-token corpus, each at
        // its bound, with the same sign: the worst case still adds up.
        let per = per_token_limit(6);
        let mut total = ExactSum::ZERO;
        for n in [1u64, 2, 3] {
            let s = ExactSum((per * u128::from(n)) as i128);
            assert!(s.within(per, n) && !ExactSum(s.0 + 1).within(per, n));
            total.add(s).unwrap();
        }
        assert!(total.0.unsigned_abs() < LIMIT);
        assert!(!ExactSum(1).within(per, 0), "no tokens, no sum");
    }

    #[test]
    fn round_trips_representable_values() {
        for v in [0.0, 1.0, -2.5, 0.1f32 as f64, 12345.678, -1e-9] {
            let s = ExactSum::from_f64(v).unwrap();
            assert!((s.to_f64() - v).abs() <= v.abs() * 1e-15 + 1e-19, "{v}");
        }
    }
}
