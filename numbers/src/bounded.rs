//! Bounded bincode decoding of bytes that come from peers or storage.
//!
//! bincode allocates a string's or byte buffer's length before it reads the
//! bytes, so a length prefix claiming 2^40 bytes in a 160 KB input would make
//! it allocate 1 TiB and abort the process. Here every decode runs under a
//! limit sized from the input itself: bincode counts at most
//! [`CLAIM_PER_INPUT_BYTE`] bytes of claims per input byte for valid data (a
//! varint-encoded `i128` claims 16 bytes and takes at least one), so the limit
//! is the next power of four at or above `CLAIM_PER_INPUT_BYTE * len`, and no
//! input can make the decoder allocate more than about 64 times its length.
//! Bytes left over after the value are refused too.

use serde::de::DeserializeOwned;

/// The most bytes bincode's limit counts per encoded byte of valid input
/// (the in-memory size of its largest primitive, `i128`/`u128`).
pub const CLAIM_PER_INPUT_BYTE: usize = 16;

/// Why bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not an encoding of the expected type, or claim more
    /// memory than their length allows.
    #[error("malformed ({0})")]
    Malformed(String),
    /// A valid value is followed by more bytes.
    #[error("{0} trailing bytes after the encoded value")]
    Trailing(usize),
}

/// The limit exponent for an input: the smallest even `e >= 12` with
/// `2^e >= CLAIM_PER_INPUT_BYTE * len + 64`.
fn limit_exponent(len: usize) -> u32 {
    let need = len.saturating_mul(CLAIM_PER_INPUT_BYTE).saturating_add(64);
    let e = usize::BITS - (need - 1).leading_zeros();
    (e.max(12) + 1) & !1
}

fn decode_limited<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard().with_limit::<LIMIT>())
}

/// Decodes one value (bincode 2, standard config) from the whole of `bytes`
/// under a limit sized from `bytes.len()`; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (value, used) = decode_prefix::<T>(bytes)?;
    if used != bytes.len() {
        return Err(DecodeError::Trailing(bytes.len() - used));
    }
    Ok(value)
}

/// Decodes one value from the start of `bytes` under the same limit as
/// [`decode`], returning it with the bytes it used (for headers such as a
/// format version read before the whole value).
pub fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), DecodeError> {
    macro_rules! tiers {
        ($($e:literal)*) => {
            match limit_exponent(bytes.len()) {
                $($e => decode_limited::<T, { 1usize << $e }>(bytes),)*
                _ => return Err(DecodeError::Malformed(format!(
                    "{} bytes is more than any decoder here accepts",
                    bytes.len()
                ))),
            }
        };
    }
    let r = tiers!(12 14 16 18 20 22 24 26 28 30 32 34 36 38 40 42 44 46);
    r.map_err(|e| DecodeError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_grow_with_the_input_in_powers_of_four() {
        assert_eq!(limit_exponent(0), 12);
        assert_eq!(limit_exponent(250), 12);
        assert_eq!(limit_exponent(253), 14);
        assert_eq!(limit_exponent(160_000), 22);
        for len in [1usize, 999, 1 << 20, 3 << 30] {
            let e = limit_exponent(len);
            assert!(1usize << e >= len * CLAIM_PER_INPUT_BYTE + 64);
            assert!(1usize << e <= (len * CLAIM_PER_INPUT_BYTE + 64).max(1 << 12) * 4);
        }
    }

    #[test]
    fn a_huge_string_length_is_refused_without_allocating_it() {
        // A varint length prefix of 2^40 (0xfd, then 8 little-endian bytes).
        let mut bytes = vec![0xfd];
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        bytes.extend_from_slice(&[b'x'; 100]);
        let e = decode::<String>(&bytes).unwrap_err();
        assert!(matches!(e, DecodeError::Malformed(_)), "{e}");
    }

    #[test]
    fn values_round_trip_and_trailing_bytes_are_refused() {
        let v: (u32, String, Vec<i128>) = (7, "abc".into(), vec![i128::MAX, -1, 0]);
        let mut bytes = bincode::serde::encode_to_vec(&v, bincode::config::standard()).unwrap();
        assert_eq!(decode::<(u32, String, Vec<i128>)>(&bytes).unwrap(), v);
        bytes.extend_from_slice(&[0; 700]);
        assert_eq!(
            decode::<(u32, String, Vec<i128>)>(&bytes),
            Err(DecodeError::Trailing(700))
        );
    }

    #[test]
    fn small_varints_of_wide_types_fit_the_limit() {
        // Each i128 zero is one byte but claims 16: the worst valid ratio.
        let v = vec![0i128; 100_000];
        let bytes = bincode::serde::encode_to_vec(&v, bincode::config::standard()).unwrap();
        assert!(bytes.len() < 100_010);
        assert_eq!(decode::<Vec<i128>>(&bytes).unwrap(), v);
    }
}
