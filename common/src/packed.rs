//! A compact, exact encoding of [`ExactSum`] runs: blocks of 16 sums that
//! share a shift and a bit width.
//!
//! A sum is an i128 on a 2^-64 grid, but the worker adds per-chunk f64 sums
//! (53-bit mantissas) to it, so a partial's sum holds about 53 + log2(chunks)
//! significant bits, and its low bits are zeros below the smallest chunk's
//! last mantissa bit. A block stores the magnitudes shifted right by their
//! common trailing zeros, at the width of the widest: neighbouring sums of a
//! tensor have similar magnitudes, so little is lost to the shared width.
//!
//! Block layout: byte 0 is the shift (bits 0-6) and a sign flag (bit 7: each
//! value carries a sign bit, lowest); byte 1 the magnitude width in bits
//! (0..=126); then the values, little-endian bit-packed at `width + sign`
//! bits each (a full block is a whole number of bytes; a short last block is
//! padded to a byte with zeros). The encoding is a function of the values,
//! so equal columns encode to equal bytes.
//!
//! Decoding refuses what no [`ExactSum`] can hold (`width + shift > 126`,
//! i.e. `|x| >= 2^62`), non-canonical headers and non-zero padding, and needs
//! at least two bytes per block: `n` sums need `n / 8` bytes, so a length
//! read from a header can be checked against the input before anything is
//! allocated.

use crate::exact::ExactSum;

/// Sums per block.
pub const BLOCK: usize = 16;

/// The fewest bytes `n` sums can take ([`BLOCK`]-sum blocks of 2 header
/// bytes): what a decoder checks before allocating `n` sums.
pub fn min_bytes(n: usize) -> usize {
    n.div_ceil(BLOCK) * 2
}

/// Largest magnitude width (plus shift) a sum on the exact grid can need.
const MAX_BITS: u32 = 126;

/// Appends the encoding of `values` to `out`.
pub fn encode(values: &[ExactSum], out: &mut Vec<u8>) {
    for block in values.chunks(BLOCK) {
        encode_block(block, out);
    }
}

fn encode_block(block: &[ExactSum], out: &mut Vec<u8>) {
    let (mut any, mut signed) = (0u128, false);
    for v in block {
        any |= v.0.unsigned_abs();
        signed |= v.0 < 0;
    }
    if any == 0 {
        out.extend_from_slice(&[0, 0]);
        return;
    }
    let shift = any.trailing_zeros();
    let width = 128 - (any >> shift).leading_zeros();
    out.push(shift as u8 | u8::from(signed) << 7);
    out.push(width as u8);
    // Values outside the exact range (|x| >= 2^62, which no `ExactSum`
    // arithmetic makes) encode to bytes the decoder refuses; a magnitude of
    // 2^127 loses its top bit here, which is no worse.
    let bits = (width + u32::from(signed)).min(128);
    let mut buf = [0u8; BUF];
    for (i, v) in block.iter().enumerate() {
        let m = v.0.unsigned_abs() >> shift;
        let raw = if signed {
            m << 1 | u128::from(v.0 < 0)
        } else {
            m
        };
        let p = i * bits as usize;
        let (b, s) = (p >> 3, (p & 7) as u32);
        let word: &mut [u8; 16] = (&mut buf[b..b + 16]).try_into().expect("16 bytes");
        *word = (u128::from_le_bytes(*word) | raw << s).to_le_bytes();
        if s + bits > 128 {
            buf[b + 16] |= (raw >> (128 - s)) as u8;
        }
    }
    out.extend_from_slice(&buf[..(block.len() * bits as usize).div_ceil(8)]);
}

/// A block's payload with room for 17-byte accesses past its end.
const BUF: usize = 2 * 128 + 24;

/// Why packed bytes were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PackedError {
    /// The bytes end inside a block.
    #[error("packed sums end inside block {0}")]
    Truncated(usize),
    /// A header no encoder writes, or one outside the exact range.
    #[error("block {block}: shift {shift}, width {width}{sign} {why}")]
    Header {
        /// Block index.
        block: usize,
        /// Its shift.
        shift: u32,
        /// Its magnitude width.
        width: u32,
        /// ", signed" when the sign flag is set.
        sign: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Bytes after the last block.
    #[error("{0} bytes after the last packed block")]
    Trailing(usize),
    /// Adding a sum to a total left the exact range.
    #[error("adding sum {index} makes {value:e}, outside the exact range (|x| < 2^62)")]
    Overflow {
        /// The sum's index.
        index: usize,
        /// About what the total would have been.
        value: f64,
    },
}

/// Decodes `out.len()` sums from the whole of `bytes` into `out`.
pub fn decode_into(bytes: &[u8], out: &mut [ExactSum]) -> Result<(), PackedError> {
    decode_blocks(bytes, out.len(), |block, values| {
        out[block * BLOCK..][..values.len()].copy_from_slice(values);
        Ok(())
    })
}

/// Adds the decoded sums from the whole of `bytes` into each of `outs`
/// (all of one length, the number of sums; [`ExactSum::add`]: a sum leaving
/// the exact range is an error), so a column is merged without being
/// materialised, and decoded once for every total it goes into.
pub fn decode_add(bytes: &[u8], outs: &mut [&mut [ExactSum]]) -> Result<(), PackedError> {
    let n = outs.first().map_or(0, |o| o.len());
    assert!(outs.iter().all(|o| o.len() == n), "totals of one length");
    decode_blocks(bytes, n, |block, values| {
        for out in outs.iter_mut() {
            let slots = &mut out[block * BLOCK..][..values.len()];
            for (i, (a, b)) in slots.iter_mut().zip(values).enumerate() {
                let before = *a;
                a.add(*b).map_err(|_| PackedError::Overflow {
                    index: block * BLOCK + i,
                    value: before.to_f64() + b.to_f64(),
                })?;
            }
        }
        Ok(())
    })
}

/// Checks that `bytes` are exactly `n` packed sums, without keeping them.
pub fn check(bytes: &[u8], n: usize) -> Result<(), PackedError> {
    decode_blocks(bytes, n, |_, _| Ok(()))
}

/// The decoder loop: `n` sums from the whole of `bytes`, handed to `each`
/// a block at a time (block index, its sums).
fn decode_blocks(
    bytes: &[u8],
    n: usize,
    mut each: impl FnMut(usize, &[ExactSum]) -> Result<(), PackedError>,
) -> Result<(), PackedError> {
    let mut at = 0usize;
    let mut buf = [0u8; BUF];
    let mut values = [ExactSum::ZERO; BLOCK];
    for block in 0..n.div_ceil(BLOCK) {
        let count = (n - block * BLOCK).min(BLOCK);
        let header = bytes.get(at..at + 2).ok_or(PackedError::Truncated(block))?;
        at += 2;
        let (shift, signed, width) = (
            u32::from(header[0] & 0x7f),
            header[0] >> 7 == 1,
            u32::from(header[1]),
        );
        let bad = |why| PackedError::Header {
            block,
            shift,
            width,
            sign: if signed { ", signed" } else { "" },
            why,
        };
        if width == 0 {
            if shift != 0 || signed {
                return Err(bad("is not how zeros are written"));
            }
            each(block, &[ExactSum::ZERO; BLOCK][..count])?;
            continue;
        }
        if width + shift > MAX_BITS {
            return Err(bad("is outside the exact range (|x| < 2^62)"));
        }
        let bits = width + u32::from(signed);
        let used = count * bits as usize;
        let len = used.div_ceil(8);
        let payload = bytes
            .get(at..at + len)
            .ok_or(PackedError::Truncated(block))?;
        at += len;
        buf[..len].copy_from_slice(payload);
        buf[len..len + 17].fill(0);
        if !used.is_multiple_of(8) && payload[len - 1] >> (used % 8) != 0 {
            return Err(bad("has non-zero padding"));
        }
        let mask = u128::MAX >> (128 - bits);
        let (mut any, mut odd, mut negative_zero) = (0u128, 0u128, false);
        for (i, slot) in values[..count].iter_mut().enumerate() {
            let p = i * bits as usize;
            let (b, s) = (p >> 3, (p & 7) as u32);
            let mut x = u128::from_le_bytes(buf[b..b + 16].try_into().expect("16 bytes")) >> s;
            if s + bits > 128 {
                x |= u128::from(buf[b + 16]) << (128 - s);
            }
            let raw = x & mask;
            let (m, negative) = if signed {
                (raw >> 1, raw & 1 == 1)
            } else {
                (raw, false)
            };
            any |= m;
            odd |= m & 1;
            negative_zero |= negative && m == 0;
            let v = (m << shift) as i128;
            *slot = ExactSum(if negative { -v } else { v });
        }
        if any >> (width - 1) != 1 || odd != 1 {
            return Err(bad(
                "is not the block's own (too wide or shifted too little)",
            ));
        }
        if negative_zero {
            return Err(bad("holds a negative zero"));
        }
        each(block, &values[..count])?;
    }
    if at != bytes.len() {
        return Err(PackedError::Trailing(bytes.len() - at));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::FRACTION_BITS;

    fn round_trip(values: &[ExactSum]) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode(values, &mut bytes);
        let mut back = vec![ExactSum(7); values.len()];
        decode_into(&bytes, &mut back).unwrap();
        assert_eq!(back, values);
        check(&bytes, values.len()).unwrap();
        let (mut a, mut b) = (
            vec![ExactSum::ZERO; values.len()],
            vec![ExactSum::ZERO; values.len()],
        );
        decode_add(&bytes, &mut [&mut a[..], &mut b[..]]).unwrap();
        assert_eq!((&a[..], &b[..]), (values, values));
        bytes
    }

    /// A deterministic spread of sums: f64 sums of a few "chunks" at mixed
    /// magnitudes and signs, plus the grid's extremes.
    fn spread(n: usize, seed: u64) -> Vec<ExactSum> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|i| {
                let mut s = ExactSum::ZERO;
                for _ in 0..(i % 5) {
                    let r = next();
                    let v = (f64::from_bits(r >> 12 | 0x3ff0_0000_0000_0000) - 1.0)
                        * 2f64.powi((r % 90) as i32 - 60);
                    s.add_f64(if r & 1 == 1 { -v } else { v }).unwrap();
                }
                s
            })
            .collect()
    }

    #[test]
    fn sums_round_trip_bit_for_bit() {
        let limit = (1i128 << (62 + FRACTION_BITS)) - 1;
        let mut values = vec![
            ExactSum(0),
            ExactSum(1),
            ExactSum(-1),
            ExactSum(limit),
            ExactSum(-limit),
            ExactSum(1 << 100),
        ];
        values.extend(spread(10_007, 0x9e37_79b9_7f4a_7c15));
        round_trip(&values);
        for n in [0, 1, 15, 16, 17, 33] {
            round_trip(&spread(n, n as u64 + 3));
        }
        round_trip(&vec![ExactSum::ZERO; 100]);
        round_trip(&[ExactSum(limit); 16]);
        // Adding past the range is an error naming the sum.
        let mut bytes = Vec::new();
        encode(&[ExactSum(1), ExactSum(limit)], &mut bytes);
        let mut total = [ExactSum(5), ExactSum(1)];
        let e = decode_add(&bytes, &mut [&mut total[..]]).unwrap_err();
        assert!(matches!(e, PackedError::Overflow { index: 1, .. }), "{e}");
    }

    #[test]
    fn f64_sums_take_about_their_mantissa() {
        // One chunk's f64 sum per value, magnitudes within 8x of each other:
        // 53 significant bits plus the spread, about 7 bytes, not bincode's 17.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let values: Vec<ExactSum> = (0..16_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v = f64::from_bits(x >> 12 | 0x3ff0_0000_0000_0000) * (1 + x % 8) as f64;
                ExactSum::from_f64(v * 100.0).unwrap()
            })
            .collect();
        let bytes = round_trip(&values);
        let per_sum = bytes.len() as f64 / values.len() as f64;
        assert!((7.0..7.6).contains(&per_sum), "{per_sum} bytes per sum");
    }

    #[test]
    fn bad_bytes_are_refused_with_the_block_named() {
        let values = spread(40, 11);
        let mut bytes = Vec::new();
        encode(&values, &mut bytes);
        let mut out = vec![ExactSum::ZERO; 40];
        assert_eq!(
            decode_into(&bytes[..bytes.len() - 1], &mut out),
            Err(PackedError::Truncated(2))
        );
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode_into(&long, &mut out), Err(PackedError::Trailing(1)));
        assert!(matches!(
            decode_into(&bytes, &mut out[..16]),
            Err(PackedError::Trailing(_))
        ));
        // Out of range: width 100 at shift 30.
        let e = decode_into(&[30, 100], &mut out[..1]).unwrap_err();
        assert!(e.to_string().contains("outside the exact range"), "{e}");
        // A zero block with a shift, and a block wider than its values.
        let e = decode_into(&[3, 0], &mut out[..16]).unwrap_err();
        assert!(e.to_string().contains("how zeros are written"), "{e}");
        let e = decode_into(&[0, 2, 1, 0, 0, 0], &mut out[..16]).unwrap_err();
        assert!(e.to_string().contains("not the block's own"), "{e}");
        // One value of width 3 in a short block: 3 bits used, 5 padding.
        assert!(decode_into(&[0, 3, 0b101], &mut out[..1]).is_ok());
        let e = decode_into(&[0, 3, 0b1101], &mut out[..1]).unwrap_err();
        assert!(e.to_string().contains("padding"), "{e}");
        assert_eq!(min_bytes(17), 4);
    }
}
