//! ggml's own conversions between tensor types and f32, for merged experts
//! ([`slicer::RowCodec`]): `ggml_get_type_traits(t)->to_float` decodes and
//! `ggml_get_type_traits_cpu(t)->from_float` encodes, the functions
//! llama.cpp itself runs (never a quantiser written here); [`to_f32`] the
//! same decoding for weights read whole (the lookahead's routers).

use super::init_backend;
use llama_cpp_sys_2 as sys;

/// [`slicer::RowCodec`] on ggml's type traits.
pub struct GgmlCodec(());

impl GgmlCodec {
    /// The codec, with llama.cpp's backend (and ggml's CPU tables) set up.
    pub fn new() -> GgmlCodec {
        init_backend();
        // SAFETY: idempotent initialisation of ggml's CPU lookup tables.
        unsafe { sys::ggml_cpu_init() };
        GgmlCodec(())
    }

    /// `(block size, bytes per block)` of `ty` as ggml knows it, when ggml
    /// knows it.
    fn layout(ty: u32) -> Option<(usize, usize)> {
        if ty >= sys::GGML_TYPE_COUNT {
            return None;
        }
        // SAFETY: `ty` is below GGML_TYPE_COUNT; both are plain lookups.
        let (block, size) = unsafe { (sys::ggml_blck_size(ty), sys::ggml_type_size(ty)) };
        (block > 0 && size > 0).then_some((block as usize, size))
    }

    /// Checks that `n` values of `ty` take exactly `bytes` bytes in whole
    /// blocks; a caller's broken promise panics rather than letting ggml
    /// read or write out of bounds.
    fn check_len(ty: u32, n: usize, bytes: usize) {
        let (block, size) = Self::layout(ty).expect("checked type");
        assert!(
            n.is_multiple_of(block) && n / block * size == bytes,
            "{n} values of ggml type {ty} are not {bytes} bytes of whole blocks"
        );
    }

    fn to_float(ty: u32) -> sys::ggml_to_float_t {
        // SAFETY: `ty` is a known type; ggml returns a static table entry.
        unsafe { (*sys::ggml_get_type_traits(ty)).to_float }
    }

    fn from_float(ty: u32) -> sys::ggml_from_float_t {
        // SAFETY: as in `to_float`.
        unsafe { (*sys::ggml_get_type_traits_cpu(ty)).from_float }
    }
}

/// `n` values of ggml type `ggml_type` stored in `bytes`, as f32 by ggml's
/// `to_float` (the conversion llama.cpp's CPU backend uses); an error names
/// the type when ggml cannot convert it or `bytes` has the wrong size.
pub fn to_f32(ggml_type: u32, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let name = || gguf::quant::ggml_type_name(ggml_type);
    let Some((block, block_bytes)) = GgmlCodec::layout(ggml_type) else {
        return Err(format!("ggml type {} is unknown to this ggml", name()));
    };
    if !n.is_multiple_of(block) || bytes.len() != n / block * block_bytes {
        return Err(format!(
            "{} bytes do not hold {n} values of type {}",
            bytes.len(),
            name()
        ));
    }
    let mut out = vec![0f32; n];
    if ggml_type == sys::GGML_TYPE_F32 {
        // ggml has no `to_float` for f32 itself.
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
        }
        return Ok(out);
    }
    if GgmlCodec::to_float(ggml_type).is_none() {
        return Err(format!("ggml cannot convert type {} to f32", name()));
    }
    slicer::RowCodec::decode(&GgmlCodec::new(), ggml_type, bytes, &mut out);
    Ok(out)
}

impl Default for GgmlCodec {
    fn default() -> Self {
        GgmlCodec::new()
    }
}

impl slicer::RowCodec for GgmlCodec {
    fn check(&self, ty: u32) -> Result<(), String> {
        if Self::layout(ty).is_none() {
            return Err(format!("ggml does not know type {ty}"));
        }
        // SAFETY: a known type.
        if unsafe { sys::ggml_quantize_requires_imatrix(ty) } {
            return Err("ggml quantises this type only with an importance matrix".into());
        }
        match (Self::to_float(ty), Self::from_float(ty)) {
            (Some(_), Some(_)) => Ok(()),
            _ => Err("ggml has no conversion from and to f32 for this type".into()),
        }
    }

    fn decode(&self, ty: u32, bytes: &[u8], out: &mut [f32]) {
        Self::check_len(ty, out.len(), bytes.len());
        let f = Self::to_float(ty).expect("checked type");
        // SAFETY: `bytes` holds exactly `out.len()` values of `ty` in whole
        // blocks (checked above); ggml writes `out.len()` floats.
        unsafe { f(bytes.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
    }

    fn encode(&self, ty: u32, values: &[f32], out: &mut [u8]) {
        Self::check_len(ty, values.len(), out.len());
        let f = Self::from_float(ty).expect("checked type");
        // SAFETY: `out` holds exactly the bytes of `values.len()` values of
        // `ty` in whole blocks (checked above); ggml reads `values.len()`
        // floats.
        unsafe {
            f(
                values.as_ptr(),
                out.as_mut_ptr().cast(),
                values.len() as i64,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slicer::RowCodec;

    #[test]
    fn f16_round_trips_exactly_and_q8_0_within_half_a_step() {
        let c = GgmlCodec::new();
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
        let mut f16 = vec![0u8; 128];
        c.encode(sys::GGML_TYPE_F16, &values, &mut f16);
        let mut back = vec![0f32; 64];
        c.decode(sys::GGML_TYPE_F16, &f16, &mut back);
        assert_eq!(back, values); // multiples of 1/16 below 4 are exact in f16
        let mut q8 = vec![0u8; 2 * 34];
        c.encode(sys::GGML_TYPE_Q8_0, &values, &mut q8);
        c.decode(sys::GGML_TYPE_Q8_0, &q8, &mut back);
        for block in 0..2 {
            let range = block * 32..block * 32 + 32;
            let amax = values[range.clone()]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            for i in range {
                assert!((back[i] - values[i]).abs() <= 0.6 * amax / 127.0, "{i}");
            }
        }
        assert!(c.check(sys::GGML_TYPE_Q4_K).is_ok());
        assert!(c.check(sys::GGML_TYPE_IQ2_XXS).is_err());
        assert!(c.check(10_000).is_err());
    }

    #[test]
    fn f16_and_f32_convert_and_wrong_sizes_are_refused() {
        let halves: Vec<u8> = [1.5f32, -2.0, 0.25]
            .iter()
            .flat_map(|&v| half_bits(v).to_le_bytes())
            .collect();
        assert_eq!(super::to_f32(1, &halves, 3).unwrap(), vec![1.5, -2.0, 0.25]);
        let floats: Vec<u8> = [3.0f32, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(super::to_f32(0, &floats, 2).unwrap(), vec![3.0, 4.0]);
        let e = super::to_f32(0, &floats, 3).unwrap_err();
        assert!(e.contains("do not hold 3 values"), "{e}");
    }

    /// IEEE half bits of a value exact in half precision.
    fn half_bits(v: f32) -> u16 {
        let b = v.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        let mant = ((b >> 13) & 0x3ff) as u16;
        sign | ((exp as u16) << 10) | mant
    }
}
