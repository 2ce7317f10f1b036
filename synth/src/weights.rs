//! Deterministic random weights and their GGUF encodings (f32, f16, Q8_0).

use gguf::write::TensorType;
use numbers::splitmix::SplitMix64;

/// The values of the stream of `(seed, name)`: uniform in `[-scale, scale)`,
/// one after the other. Every generated tensor draws from it, so its values
/// depend on the seed and its name only.
pub fn random_stream(seed: u64, name: &str, scale: f32) -> impl Iterator<Item = f32> {
    let mut rng = SplitMix64::for_stream(seed, name);
    std::iter::repeat_with(move || rng.symmetric_f32() * scale)
}

/// The encoding in `ty` of a tensor of `dims` elements from
/// [`random_stream`], encoded a piece at a time (a real-vocabulary
/// embedding is 300-500M values: 1-2 GB as f32).
pub fn random_matrix(seed: u64, name: &str, dims: &[usize], scale: f32, ty: TensorType) -> Vec<u8> {
    const PIECE: usize = 32 * 1024;
    let n: usize = dims.iter().product();
    let mut values = random_stream(seed, name, scale);
    let mut data = Vec::with_capacity(ty.bytes_for(n));
    let mut piece = Vec::with_capacity(PIECE);
    for start in (0..n).step_by(PIECE) {
        piece.clear();
        piece.extend(values.by_ref().take(PIECE.min(n - start)));
        encode_into(&piece, ty, &mut data);
    }
    data
}

/// `n` values `center + spread * u`, `u` uniform in [-1, 1), from the
/// stream of `(seed, name)`: biases, norms, per-head constants.
pub fn random_vector(seed: u64, name: &str, n: usize, center: f32, spread: f32) -> Vec<f32> {
    random_stream(seed, name, spread)
        .take(n)
        .map(|v| center + v)
        .collect()
}

/// Converts an f32 to IEEE half precision bits (round to nearest even).
pub fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rounded = (m + half - 1 + ((m >> shift) & 1)) >> shift;
        return sign | rounded as u16;
    }
    let half_mant = mant >> 13;
    let rest = mant & 0x1fff;
    let mut out = ((e as u32) << 10) | half_mant;
    if rest > 0x1000 || (rest == 0x1000 && (half_mant & 1) == 1) {
        out += 1;
    }
    sign | out as u16
}

/// Appends the encoding of `values` in `ty` to `out` (Q8_0 needs a
/// multiple of 32); encoding a tensor piece by piece (pieces of whole Q8_0
/// blocks) gives the same bytes as all at once.
pub fn encode_into(values: &[f32], ty: TensorType, out: &mut Vec<u8>) {
    match ty {
        TensorType::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
        TensorType::F16 => out.extend(values.iter().flat_map(|v| f32_to_f16(*v).to_le_bytes())),
        TensorType::Q8_0 => {
            assert_eq!(values.len() % 32, 0, "Q8_0 needs blocks of 32 values");
            for block in values.chunks(32) {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                out.extend(block.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_in_pieces_gives_the_same_bytes() {
        let values: Vec<f32> = (0..32 * 7).map(|i| (i as f32 * 0.37).sin()).collect();
        for ty in [TensorType::F32, TensorType::F16, TensorType::Q8_0] {
            let (mut whole, mut pieces) = (Vec::new(), Vec::new());
            encode_into(&values, ty, &mut whole);
            for piece in values.chunks(64) {
                encode_into(piece, ty, &mut pieces);
            }
            assert_eq!(pieces, whole, "{ty:?}");
            assert_eq!(whole.len(), ty.bytes_for(values.len()), "{ty:?}");
        }
    }

    #[test]
    fn half_conversion_matches_known_values() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(0.0), 0);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e-7), 0x0002);
        assert_eq!(f32_to_f16(0.333_333_34), 0x3555);
    }
}
