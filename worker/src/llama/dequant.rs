//! Weights read from a GGUF file, converted to f32 by ggml's own `to_float`
//! for their type (the conversion llama.cpp's CPU backend uses).

use llama_cpp_sys_2 as sys;

/// `n` values of ggml type `ggml_type` stored in `bytes`, as f32; an error
/// names the type when ggml cannot convert it or `bytes` has the wrong size.
pub fn to_f32(ggml_type: u32, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let Some((block, block_bytes)) = gguf::read::ggml_type_size(ggml_type) else {
        return Err(format!(
            "ggml type {} has no known block size",
            gguf::quant::ggml_type_name(ggml_type)
        ));
    };
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    if !n.is_multiple_of(block) || bytes.len() != n / block * block_bytes {
        return Err(format!(
            "{} bytes do not hold {n} values of type {}",
            bytes.len(),
            gguf::quant::ggml_type_name(ggml_type)
        ));
    }
    let mut out = vec![0f32; n];
    if ggml_type == sys::GGML_TYPE_F32 {
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
        }
        return Ok(out);
    }
    // SAFETY: ggml returns its static traits table entry for any type id
    // below GGML_TYPE_COUNT (a known block size implies one); `to_float`
    // reads exactly `n / block` blocks, the size checked above, and writes
    // `n` floats.
    unsafe {
        if ggml_type >= sys::GGML_TYPE_COUNT {
            return Err(format!("ggml type id {ggml_type} is unknown to this ggml"));
        }
        let traits = sys::ggml_get_type_traits(ggml_type);
        let Some(to_float) = traits.as_ref().and_then(|t| t.to_float) else {
            return Err(format!(
                "ggml cannot convert type {} to f32",
                gguf::quant::ggml_type_name(ggml_type)
            ));
        };
        to_float(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::to_f32;

    #[test]
    fn f16_and_f32_convert_and_wrong_sizes_are_refused() {
        let halves: Vec<u8> = [1.5f32, -2.0, 0.25]
            .iter()
            .flat_map(|&v| half_bits(v).to_le_bytes())
            .collect();
        assert_eq!(to_f32(1, &halves, 3).unwrap(), vec![1.5, -2.0, 0.25]);
        let floats: Vec<u8> = [3.0f32, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(to_f32(0, &floats, 2).unwrap(), vec![3.0, 4.0]);
        let e = to_f32(0, &floats, 3).unwrap_err();
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
