//! A compact, exact encoding of [`ExactSum`] runs: blocks of 16 sums that
//! share a shift and a bit width, zeros marked apart.
//!
//! A sum is an i128 on a 2^-64 grid, but the worker adds per-chunk f64 sums
//! (53-bit mantissas) to it, so a partial's sum holds about 53 + log2(chunks)
//! significant bits, and its low bits are zeros below the smallest chunk's
//! last mantissa bit. A block stores the magnitudes shifted right by their
//! common trailing zeros, at the width of the widest: neighbouring sums of a
//! tensor have similar magnitudes, so little is lost to the shared width.
//! An expert no token of a chunk reached has zero sums, so small leases hold
//! many zeros among non-zero sums: a block holding both lists which of its
//! sums are non-zero and packs only those.
//!
//! Block layout: byte 0 is the shift (bits 0-6) and a sign flag (bit 7: each
//! value carries a sign bit, lowest); byte 1 the magnitude width in bits
//! (bits 0-6, 0..=126) and a mask flag (bit 7): then
//! a little-endian u16 whose bit `i` says sum `i` of the block is non-zero,
//! and only those sums are packed; then the values, little-endian
//! bit-packed at `width + sign` bits each, the last byte padded with zeros.
//! The encoding is a function of the values, so equal columns encode to
//! equal bytes.
//!
//! Decoding refuses what no [`ExactSum`] can hold (`width + shift > 126`,
//! i.e. `|x| >= 2^62`), non-canonical headers, masks and zeros, and
//! non-zero padding, and needs at least two bytes per block: `n` sums need
//! `n / 8` bytes, so a length read from a header can be checked against the
//! input before anything is allocated.

use crate::exact::ExactSum;

/// Sums per block.
pub const BLOCK: usize = 16;

/// What a block's header says of every sum in it: no magnitude is above
/// `max_magnitude`, and none is negative unless `signed`; a reader checks
/// a rule on a whole block by these before looking at its sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockBounds {
    /// `(2^width - 1) << shift`: 0 for a block of zeros.
    pub max_magnitude: u128,
    /// The sign flag: each sum carries a sign (some may be negative).
    pub signed: bool,
}

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
    let (mut any, mut signed, mut mask) = (0u128, false, 0u16);
    for (i, v) in block.iter().enumerate() {
        any |= v.0.unsigned_abs();
        signed |= v.0 < 0;
        mask |= u16::from(v.0 != 0) << i;
    }
    if any == 0 {
        out.extend_from_slice(&[0, 0]);
        return;
    }
    let masked = u32::from(mask) != full_mask(block.len());
    let shift = any.trailing_zeros();
    let width = 128 - (any >> shift).leading_zeros();
    out.push(shift as u8 | u8::from(signed) << 7);
    // Values outside the exact range (|x| >= 2^62, which no `ExactSum`
    // arithmetic makes) encode to a width the decoder refuses; a magnitude
    // of 2^127 loses its top bit here, which is no worse.
    out.push(width.min(127) as u8 | u8::from(masked) << 7);
    if masked {
        out.extend_from_slice(&mask.to_le_bytes());
    }
    let bits = (width + u32::from(signed)).min(128);
    let mut buf = [0u8; BUF];
    let mut n = 0;
    for v in block.iter().filter(|v| v.0 != 0) {
        let m = v.0.unsigned_abs() >> shift;
        let raw = if signed {
            m << 1 | u128::from(v.0 < 0)
        } else {
            m
        };
        let p = n * bits as usize;
        let (b, s) = (p >> 3, (p & 7) as u32);
        let word: &mut [u8; 16] = (&mut buf[b..b + 16]).try_into().expect("16 bytes");
        *word = (u128::from_le_bytes(*word) | raw << s).to_le_bytes();
        if s + bits > 128 {
            buf[b + 16] |= (raw >> (128 - s)) as u8;
        }
        n += 1;
    }
    out.extend_from_slice(&buf[..(n * bits as usize).div_ceil(8)]);
}

/// The mask of a block of `count` sums all non-zero.
fn full_mask(count: usize) -> u32 {
    (1u32 << count) - 1
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

/// Decodes `n` sums from the whole of `bytes`. `bytes` must be at least
/// [`min_bytes`] of `n` (checked before anything is allocated), so the
/// sums take at most 128 bytes per input byte.
pub fn decode_vec(bytes: &[u8], n: usize) -> Result<Vec<ExactSum>, PackedError> {
    if bytes.len() < min_bytes(n) {
        return Err(PackedError::Truncated(bytes.len() / 2));
    }
    let mut out = Vec::with_capacity(n);
    decode_blocks(
        bytes,
        n,
        |_, _, _| true,
        |_, values| {
            out.extend_from_slice(values);
            Ok(())
        },
    )?;
    Ok(out)
}

/// Adds the decoded sums from the whole of `bytes` into each of `outs`
/// (all of one length, the number of sums; [`ExactSum::add`]: a sum leaving
/// the exact range is an error), so a column is merged without being
/// materialised, and decoded once for every total it goes into.
pub fn decode_add(bytes: &[u8], outs: &mut [&mut [ExactSum]]) -> Result<(), PackedError> {
    let n = outs.first().map_or(0, |o| o.len());
    assert!(outs.iter().all(|o| o.len() == n), "totals of one length");
    decode_blocks(
        bytes,
        n,
        |_, _, _| true,
        |block, values| {
            for out in outs.iter_mut() {
                let slots = &mut out[block * BLOCK..][..values.len()];
                crate::exact::add_all(slots, values).map_err(|(i, value)| {
                    PackedError::Overflow {
                        index: block * BLOCK + i,
                        value,
                    }
                })?;
            }
            Ok(())
        },
    )
}

/// Checks that `bytes` are exactly `n` packed sums, without keeping them.
pub fn check(bytes: &[u8], n: usize) -> Result<(), PackedError> {
    visit(bytes, n, |_, _, _| false, |_, _| Ok(()))
}

/// Checks that `bytes` are exactly `n` packed sums and hands each block
/// that `needs` (block index, its number of sums, its header's bounds) to
/// `each` (block index,
/// its sums) as it is unpacked, keeping nothing: a caller
/// checks values without materialising the column, and the sums of a block
/// it does not need are scanned for the format's checks, never built. The
/// first error (of the bytes, or of `each`) stops the walk.
pub fn visit<E: From<PackedError>>(
    bytes: &[u8],
    n: usize,
    needs: impl FnMut(usize, usize, BlockBounds) -> bool,
    each: impl FnMut(usize, &[ExactSum]) -> Result<(), E>,
) -> Result<(), E> {
    decode_blocks(bytes, n, needs, each)
}

const ZEROS: [ExactSum; BLOCK] = [ExactSum::ZERO; BLOCK];

/// The decoder loop: `n` sums from the whole of `bytes`, handed to `each`
/// a block at a time (block index, its sums) where `needs` (block index,
/// its number of sums, the header's bounds) wants them; the others are
/// only scanned.
fn decode_blocks<E: From<PackedError>>(
    bytes: &[u8],
    n: usize,
    mut needs: impl FnMut(usize, usize, BlockBounds) -> bool,
    mut each: impl FnMut(usize, &[ExactSum]) -> Result<(), E>,
) -> Result<(), E> {
    let mut at = 0usize;
    let mut tail = [0u8; BUF];
    let mut values = ZEROS;
    let mut packed = ZEROS;
    for block in 0..n.div_ceil(BLOCK) {
        let count = (n - block * BLOCK).min(BLOCK);
        let header = bytes.get(at..at + 2).ok_or(PackedError::Truncated(block))?;
        at += 2;
        let (shift, signed) = (u32::from(header[0] & 0x7f), header[0] >> 7 == 1);
        let (width, masked) = (u32::from(header[1] & 0x7f), header[1] >> 7 == 1);
        let bad = |why| PackedError::Header {
            block,
            shift,
            width,
            sign: if signed { ", signed" } else { "" },
            why,
        };
        if width == 0 {
            if shift != 0 || signed || masked {
                return Err(bad("is not how zeros are written").into());
            }
            let zeros = BlockBounds {
                max_magnitude: 0,
                signed: false,
            };
            if needs(block, count, zeros) {
                each(block, &ZEROS[..count])?;
            }
            continue;
        }
        if width + shift > MAX_BITS {
            return Err(bad("is outside the exact range (|x| < 2^62)").into());
        }
        let mask = if masked {
            let m = bytes.get(at..at + 2).ok_or(PackedError::Truncated(block))?;
            at += 2;
            let m = u32::from(u16::from_le_bytes([m[0], m[1]]));
            if m == 0 || m == full_mask(count) || m >> count != 0 {
                return Err(bad("has a mask no encoder writes").into());
            }
            m
        } else {
            full_mask(count)
        };
        let nonzero = mask.count_ones() as usize;
        let bits = width + u32::from(signed);
        let used = nonzero * bits as usize;
        let len = used.div_ceil(8);
        let start = at;
        let payload = bytes
            .get(start..start + len)
            .ok_or(PackedError::Truncated(block))?;
        at += len;
        if !used.is_multiple_of(8) && payload[len - 1] >> (used % 8) != 0 {
            return Err(bad("has non-zero padding").into());
        }
        // The unpacker reads up to 17 bytes past a value's first byte: from
        // the input itself where it goes on that far, else from a copy.
        let src = match bytes.get(start..start + len + 17) {
            Some(s) => s,
            None => {
                tail[..len].copy_from_slice(payload);
                tail[len..len + 17].fill(0);
                &tail[..len + 17]
            }
        };
        let bounds = BlockBounds {
            max_magnitude: (u128::MAX >> (128 - width)) << shift,
            signed,
        };
        let wanted = needs(block, count, bounds);
        let out = if masked {
            &mut packed[..nonzero]
        } else {
            &mut values[..count]
        };
        let seen = unpack(src, bits, shift, signed, out, wanted);
        if seen.any >> (width - 1) != 1 || seen.odd != 1 {
            return Err(bad("is not the block's own (too wide or shifted too little)").into());
        }
        if seen.negative_zero {
            return Err(bad("holds a negative zero").into());
        }
        if seen.zero {
            return Err(bad("holds a zero outside its mask").into());
        }
        if !wanted {
            continue;
        }
        if masked {
            let mut next = packed.iter();
            for (i, slot) in values[..count].iter_mut().enumerate() {
                *slot = if mask >> i & 1 == 1 {
                    *next.next().expect("one packed sum per mask bit")
                } else {
                    ExactSum::ZERO
                };
            }
        }
        each(block, &values[..count])?;
    }
    if at != bytes.len() {
        return Err(PackedError::Trailing(bytes.len() - at).into());
    }
    Ok(())
}

/// What [`unpack`] saw of a block's magnitudes: their union and the union
/// of their lowest bits (a canonical block has its top bit set in one and
/// bit 0 in one), whether one is zero, and whether a zero carries a sign.
#[derive(Default)]
struct Seen {
    any: u128,
    odd: u128,
    zero: bool,
    negative_zero: bool,
}

/// Unpacks `out.len()` values of `bits` bits each from `src` (which holds
/// 17 bytes past the last value's first byte), shifted left by `shift`
/// into `out` (when `write`; else only what [`Seen`] records is taken);
/// values of at most 64 bits (sign included) are unpacked as u64, wider
/// ones as u128.
#[inline]
fn unpack(
    src: &[u8],
    bits: u32,
    shift: u32,
    signed: bool,
    out: &mut [ExactSum],
    write: bool,
) -> Seen {
    match (bits <= 64, signed, write) {
        (true, false, true) => unpack_narrow::<false, true>(src, bits, shift, out),
        (true, true, true) => unpack_narrow::<true, true>(src, bits, shift, out),
        (true, false, false) => unpack_narrow::<false, false>(src, bits, shift, out),
        (true, true, false) => unpack_narrow::<true, false>(src, bits, shift, out),
        (false, _, _) => unpack_wide(src, bits, shift, signed, out),
    }
}

/// [`unpack`] for values of at most 64 bits (the f64-born sums of up to a
/// few thousand chunks: about 53 + log2(chunks) significant bits, a few
/// more for a block's shared width): magnitudes stay u64 until they are
/// shifted into place, and signs are applied without branches (they are
/// random); `WRITE` false scans them for [`Seen`] alone.
#[inline]
fn unpack_narrow<const SIGNED: bool, const WRITE: bool>(
    src: &[u8],
    bits: u32,
    shift: u32,
    out: &mut [ExactSum],
) -> Seen {
    let mask = u64::MAX >> (64 - bits);
    let (mut any, mut odd, mut zero, mut negative_zero) = (0u64, 0u64, false, false);
    for (i, slot) in out.iter_mut().enumerate() {
        let p = i * bits as usize;
        let b = p >> 3;
        // A value starts within its first byte and spans at most 9 bytes.
        let word = u128::from_le_bytes(src[b..b + 16].try_into().expect("16 bytes"));
        let raw = (word >> (p & 7)) as u64 & mask;
        let (m, negative) = if SIGNED {
            (raw >> 1, raw & 1)
        } else {
            (raw, 0)
        };
        any |= m;
        odd |= m & 1;
        zero |= m == 0;
        negative_zero |= (negative == 1) & (m == 0);
        if WRITE {
            // -v when negative (sign all ones), else v: (v ^ sign) - sign.
            let sign = (negative as i128).wrapping_neg();
            let v = (u128::from(m) << shift) as i128;
            *slot = ExactSum((v ^ sign) - sign);
        }
    }
    Seen {
        any: u128::from(any),
        odd: u128::from(odd),
        zero,
        negative_zero,
    }
}

/// [`unpack`] for values of 65 bits or more, read as u128 words.
fn unpack_wide(src: &[u8], bits: u32, shift: u32, signed: bool, out: &mut [ExactSum]) -> Seen {
    let mut seen = Seen::default();
    let mask = u128::MAX >> (128 - bits);
    for (i, slot) in out.iter_mut().enumerate() {
        let p = i * bits as usize;
        let (b, s) = (p >> 3, (p & 7) as u32);
        let mut x = u128::from_le_bytes(src[b..b + 16].try_into().expect("16 bytes")) >> s;
        if s + bits > 128 {
            x |= u128::from(src[b + 16]) << (128 - s);
        }
        let raw = x & mask;
        let (m, negative) = if signed {
            (raw >> 1, raw & 1 == 1)
        } else {
            (raw, false)
        };
        seen.any |= m;
        seen.odd |= m & 1;
        seen.zero |= m == 0;
        seen.negative_zero |= negative && m == 0;
        let v = (m << shift) as i128;
        *slot = ExactSum(if negative { -v } else { v });
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::FRACTION_BITS;

    /// [`decode_vec`], asserting that the scan of [`check`] (which builds
    /// no sums) accepts and refuses the same bytes alike.
    fn decoded(bytes: &[u8], n: usize) -> Result<Vec<ExactSum>, PackedError> {
        let out = decode_vec(bytes, n);
        assert_eq!(
            check(bytes, n),
            out.as_ref().map(|_| ()).map_err(Clone::clone)
        );
        out
    }

    fn round_trip(values: &[ExactSum]) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode(values, &mut bytes);
        let back = decode_vec(&bytes, values.len()).unwrap();
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
    /// magnitudes and signs (a fifth of them none: zeros), plus the grid's
    /// extremes.
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
        // Widths on both sides of the unpacker's u64 / u128 switch (64 bits,
        // a signed block's sign bit included), signed and not.
        for bits in [55, 56, 57, 58, 59, 62, 63, 64, 65, 66, 100] {
            let magnitude = |i: i128| (1i128 << (bits - 1)) | (i * 7919 + 1);
            let signed: Vec<ExactSum> = (0..40i128)
                .map(|i| ExactSum(magnitude(i) * (1 - 2 * (i % 2))))
                .collect();
            round_trip(&signed);
            let unsigned: Vec<ExactSum> = (0..40i128).map(|i| ExactSum(magnitude(i))).collect();
            round_trip(&unsigned);
        }
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
    fn zeros_among_sums_take_a_mask_not_their_width() {
        // Three of four sums zero (experts no token of the chunk reached):
        // a block of 4 non-zero sums of 53 bits, 2 + 2 + 27 bytes, not 108.
        let values: Vec<ExactSum> = (0..1600u64)
            .map(|i| match i % 4 {
                0 => ExactSum::from_f64(1.0 + i as f64 * std::f64::consts::PI).unwrap(),
                _ => ExactSum::ZERO,
            })
            .collect();
        let bytes = round_trip(&values);
        assert!(bytes.len() <= 100 * 34, "{} bytes", bytes.len());
        // A zero packed in place (not under a mask) is refused.
        let unmasked = [0, 3, 0b1100_0101, 0b0000_0001];
        let e = decoded(&unmasked, 3).unwrap_err();
        assert!(e.to_string().contains("zero outside its mask"), "{e}");
        let sums = [ExactSum(5), ExactSum(0), ExactSum(7)];
        let mut masked = Vec::new();
        encode(&sums, &mut masked);
        assert_eq!(masked, [0, 0x83, 0b101, 0, 0b11_1101]);
        assert_eq!(decoded(&masked, 3).unwrap(), sums);
        // A mask no encoder writes: empty, full, or past the block's end.
        for mask in [0u16, 0b111, 0b1001] {
            let mut bad = vec![0, 0x83];
            bad.extend_from_slice(&mask.to_le_bytes());
            bad.push(0b11_1101);
            let e = decoded(&bad, 3).unwrap_err();
            assert!(
                e.to_string().contains("mask no encoder writes"),
                "{mask:b}: {e}"
            );
        }
    }

    #[test]
    fn bad_bytes_are_refused_with_the_block_named() {
        let values = spread(40, 11);
        let mut bytes = Vec::new();
        encode(&values, &mut bytes);
        assert_eq!(
            decoded(&bytes[..bytes.len() - 1], 40),
            Err(PackedError::Truncated(2))
        );
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decoded(&long, 40), Err(PackedError::Trailing(1)));
        assert!(matches!(decoded(&bytes, 16), Err(PackedError::Trailing(_))));
        // A claimed length the bytes cannot hold is refused before allocating.
        assert_eq!(decoded(&[0, 0], 1 << 40), Err(PackedError::Truncated(1)));
        // Out of range: width 100 at shift 30.
        let e = decoded(&[30, 100], 1).unwrap_err();
        assert!(e.to_string().contains("outside the exact range"), "{e}");
        // A zero block with a shift, and a block wider than its values.
        let e = decoded(&[3, 0], 16).unwrap_err();
        assert!(e.to_string().contains("how zeros are written"), "{e}");
        // One value of width 3 in a short block: 3 bits used, 5 padding.
        assert!(decoded(&[0, 3, 0b101], 1).is_ok());
        let e = decoded(&[0, 3, 0b1101], 1).unwrap_err();
        assert!(e.to_string().contains("padding"), "{e}");
        // Signed, width 1: 1, then a zero carrying a sign.
        let e = decoded(&[0x80, 1, 0b0110], 2).unwrap_err();
        assert!(e.to_string().contains("negative zero"), "{e}");
        // Width 2 for values of at most 1 bit: wider than the block's own.
        let mut wide = vec![0, 0x82];
        wide.extend_from_slice(&1u16.to_le_bytes());
        wide.push(1);
        let e = decoded(&wide, 16).unwrap_err();
        assert!(e.to_string().contains("not the block's own"), "{e}");
        assert_eq!(min_bytes(17), 4);
    }
}
