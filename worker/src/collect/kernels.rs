//! Host reductions of f32 tensor data into f64 sums, written as straight
//! loops over slices (no per-element branch, no per-element bounds check) so
//! that LLVM turns them into SIMD code. Each keeps the order in which every
//! single sum receives its addends, so results are bit-identical to a plain
//! loop over tokens.

use llama::{f32_at, f32s};

/// Adds the finite `values` into `sums` element-wise (`sums[e] += values[e]`
/// in f64) and returns how many were not finite: those are never added.
///
/// A non-finite value adds `0.0` instead, which leaves every sum unchanged
/// except that a sum of `-0.0` becomes `+0.0` (the same exact value).
#[inline]
pub fn add_finite(sums: &mut [f64], values: &[f32]) -> u64 {
    let mut dropped = 0u64;
    for (s, &v) in sums.iter_mut().zip(values) {
        let finite = v.is_finite();
        *s += if finite { f64::from(v) } else { 0.0 };
        dropped += u64::from(!finite);
    }
    dropped
}

/// Appends the f32 values of a `[cols, rows]` tensor (bytes with strides `nb`)
/// to `out`, row after row: one bulk copy per row when the row is contiguous.
pub fn extend_rows(out: &mut Vec<f32>, bytes: &[u8], nb: [usize; 4], cols: usize, rows: usize) {
    out.reserve(cols * rows);
    if nb[0] == 4 && nb[1] == 4 * cols {
        out.extend(f32s(&bytes[..4 * cols * rows]));
        return;
    }
    for r in 0..rows {
        let row = r * nb[1];
        if nb[0] == 4 {
            out.extend(f32s(&bytes[row..row + 4 * cols]));
        } else {
            out.extend((0..cols).map(|c| f32_at(bytes, row + c * nb[0])));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_finite_counts_and_skips_non_finite_values() {
        let mut sums = vec![1.0, 2.0, 3.0, 4.0, -0.5];
        let values = [0.5, f32::NAN, f32::INFINITY, -2.0, f32::NEG_INFINITY];
        assert_eq!(add_finite(&mut sums, &values), 3);
        assert_eq!(sums, vec![1.5, 2.0, 3.0, 2.0, -0.5]);
    }

    /// The result must equal a plain scalar loop bit for bit, on lengths
    /// that are not a multiple of any vector width.
    #[test]
    fn add_finite_matches_a_scalar_loop_bitwise() {
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            f32::from_bits(0x3000_0000 + ((state >> 40) as u32 & 0x0fff_ffff))
        };
        for len in [1usize, 7, 8, 9, 63, 512, 517] {
            let rows: Vec<Vec<f32>> = (0..5).map(|_| (0..len).map(|_| next()).collect()).collect();
            let mut fast = vec![0f64; len];
            let mut slow = vec![0f64; len];
            for row in &rows {
                add_finite(&mut fast, row);
                for (s, v) in slow.iter_mut().zip(row) {
                    *s += f64::from(*v);
                }
            }
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "length {len}");
        }
    }

    #[test]
    fn rows_are_read_with_their_strides() {
        // 3 columns x 2 rows stored with a row stride of 4 values.
        let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        extend_rows(&mut out, &bytes, [4, 16, 32, 32], 3, 2);
        assert_eq!(out, vec![0.0, 1.0, 2.0, 4.0, 5.0, 6.0]);
        // Contiguous: one copy.
        out.clear();
        extend_rows(&mut out, &bytes, [4, 8, 32, 32], 2, 4);
        assert_eq!(out, values);
        // Column stride of 2 values.
        out.clear();
        extend_rows(&mut out, &bytes, [8, 16, 32, 32], 2, 2);
        assert_eq!(out, vec![0.0, 2.0, 4.0, 6.0]);
    }
}
