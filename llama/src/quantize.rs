//! llama.cpp's quantiser (`llama_model_quantize`, what `llama-quantize`
//! runs), with an importance matrix passed as its C array of
//! `llama_model_imatrix_data` and metadata as its C array of
//! `llama_model_kv_override` (what llama-quantize's `--override-kv` and
//! its `quantize.imatrix.*` keys go through).

use super::{init_backend, LlamaError};
use gguf::quant::QuantType;
use llama_cpp_sys_2 as sys;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::Path;

/// How [`quantize_model`] quantises.
pub struct QuantizeParams<'a> {
    /// The file type written.
    pub quant: QuantType,
    /// CPU threads (at least 1).
    pub threads: i32,
    /// Quantise tensors that are already quantised (llama-quantize's
    /// `--allow-requantize`).
    pub allow_requantize: bool,
    /// Per weight tensor, the values llama.cpp weighs each column's
    /// quantisation error by (`[n_mat][n_in]`, as llama-quantize derives
    /// them from an imatrix file).
    pub imatrix: Option<&'a BTreeMap<String, Vec<f32>>>,
    /// Metadata written into the quantised file, as llama-quantize writes
    /// its overrides (integers as u32).
    pub metadata: &'a [(String, MetaValue)],
}

/// The value of a metadata entry of [`QuantizeParams::metadata`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaValue {
    /// A string (at most 127 bytes, as llama-quantize copies it: longer
    /// ones are cut at a character boundary).
    Str(String),
    /// An integer (llama.cpp writes it as u32).
    Int(u32),
}

/// Bytes a key or string value of a `llama_model_kv_override` holds, less
/// its terminating NUL.
const KV_TEXT_MAX: usize = 127;

/// `text` as a NUL-terminated C array of 128, cut at a character boundary
/// within [`KV_TEXT_MAX`] bytes.
fn kv_text(text: &str) -> [std::os::raw::c_char; 128] {
    let mut end = text.len().min(KV_TEXT_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = [0; 128];
    for (o, b) in out.iter_mut().zip(&text.as_bytes()[..end]) {
        *o = *b as std::os::raw::c_char;
    }
    out
}

/// The C array llama.cpp walks until an entry whose key is empty.
fn kv_overrides(
    metadata: &[(String, MetaValue)],
) -> Result<Vec<sys::llama_model_kv_override>, String> {
    let mut out = Vec::with_capacity(metadata.len() + 1);
    for (key, value) in metadata {
        if key.is_empty() || key.len() > KV_TEXT_MAX || key.contains('\0') {
            return Err(format!(
                "metadata key {key:?} is not 1 to {KV_TEXT_MAX} bytes without NUL"
            ));
        }
        let (tag, val) = match value {
            MetaValue::Str(v) => (
                sys::LLAMA_KV_OVERRIDE_TYPE_STR,
                sys::llama_model_kv_override__bindgen_ty_1 {
                    val_str: kv_text(v),
                },
            ),
            MetaValue::Int(v) => (
                sys::LLAMA_KV_OVERRIDE_TYPE_INT,
                sys::llama_model_kv_override__bindgen_ty_1 {
                    val_i64: i64::from(*v),
                },
            ),
        };
        out.push(sys::llama_model_kv_override {
            tag,
            key: kv_text(key),
            __bindgen_anon_1: val,
        });
    }
    out.push(sys::llama_model_kv_override {
        tag: sys::LLAMA_KV_OVERRIDE_TYPE_INT,
        key: [0; 128],
        __bindgen_anon_1: sys::llama_model_kv_override__bindgen_ty_1 { val_i64: 0 },
    });
    Ok(out)
}

/// Quantises the GGUF `input` into `output`. llama.cpp streams tensor by
/// tensor into `output` (which it creates or truncates); the caller decides
/// where that file goes. `Err` names both files when llama.cpp refuses (its
/// log, at warn level, says why).
pub fn quantize_model(
    input: &Path,
    output: &Path,
    params: &QuantizeParams<'_>,
) -> Result<(), LlamaError> {
    init_backend();
    let failed = |reason: String| LlamaError::Quantize {
        input: input.display().to_string(),
        output: output.display().to_string(),
        reason,
    };
    let c = |p: &Path| {
        CString::new(p.to_string_lossy().as_bytes())
            .map_err(|_| failed("a path holds a NUL byte".into()))
    };
    let (inp, out) = (c(input)?, c(output)?);
    let names: Vec<(CString, &Vec<f32>)> = match params.imatrix {
        None => Vec::new(),
        Some(m) => m
            .iter()
            .map(|(name, values)| {
                CString::new(name.as_str())
                    .map(|n| (n, values))
                    .map_err(|_| failed(format!("imatrix entry {name:?} holds a NUL byte")))
            })
            .collect::<Result<_, _>>()?,
    };
    // The C array llama.cpp walks until an entry with a null name.
    let mut entries: Vec<sys::llama_model_imatrix_data> = names
        .iter()
        .map(|(name, values)| sys::llama_model_imatrix_data {
            name: name.as_ptr(),
            data: values.as_ptr(),
            size: values.len(),
        })
        .collect();
    entries.push(sys::llama_model_imatrix_data {
        name: std::ptr::null(),
        data: std::ptr::null(),
        size: 0,
    });
    let overrides = kv_overrides(params.metadata).map_err(failed)?;
    // SAFETY: llama.cpp's default parameters are plain data; the paths, the
    // imatrix names and values (borrowed by `entries`, terminated by a null
    // name) and the metadata (`overrides`, terminated by an empty key) all
    // outlive the call, which copies what it keeps. llama.cpp
    // catches its own exceptions and returns non-zero.
    let code = unsafe {
        let mut p = sys::llama_model_quantize_default_params();
        p.nthread = params.threads.max(1);
        p.ftype = ftype(params.quant);
        p.allow_requantize = params.allow_requantize;
        if params.imatrix.is_some() {
            p.imatrix = entries.as_ptr();
        }
        if !params.metadata.is_empty() {
            p.kv_overrides = overrides.as_ptr();
        }
        sys::llama_model_quantize(inp.as_ptr(), out.as_ptr(), &p)
    };
    if code == 0 {
        Ok(())
    } else {
        Err(failed(format!("llama_model_quantize returned {code}")))
    }
}

/// llama.cpp's file type of a quantisation type.
fn ftype(t: QuantType) -> sys::llama_ftype {
    match t {
        QuantType::F16 => sys::LLAMA_FTYPE_MOSTLY_F16,
        QuantType::BF16 => sys::LLAMA_FTYPE_MOSTLY_BF16,
        QuantType::Q8_0 => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
        QuantType::Q6_K => sys::LLAMA_FTYPE_MOSTLY_Q6_K,
        QuantType::Q5_K_M => sys::LLAMA_FTYPE_MOSTLY_Q5_K_M,
        QuantType::Q5_K_S => sys::LLAMA_FTYPE_MOSTLY_Q5_K_S,
        QuantType::Q5_0 => sys::LLAMA_FTYPE_MOSTLY_Q5_0,
        QuantType::Q4_K_M => sys::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        QuantType::Q4_K_S => sys::LLAMA_FTYPE_MOSTLY_Q4_K_S,
        QuantType::Q4_0 => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
        QuantType::Q3_K_M => sys::LLAMA_FTYPE_MOSTLY_Q3_K_M,
        QuantType::Q2_K => sys::LLAMA_FTYPE_MOSTLY_Q2_K,
        QuantType::IQ4_XS => sys::LLAMA_FTYPE_MOSTLY_IQ4_XS,
        QuantType::F32 => sys::LLAMA_FTYPE_ALL_F32,
        QuantType::Q4_1 => sys::LLAMA_FTYPE_MOSTLY_Q4_1,
        QuantType::Q5_1 => sys::LLAMA_FTYPE_MOSTLY_Q5_1,
        QuantType::Q3_K_S => sys::LLAMA_FTYPE_MOSTLY_Q3_K_S,
        QuantType::Q3_K_L => sys::LLAMA_FTYPE_MOSTLY_Q3_K_L,
        QuantType::Q2_K_S => sys::LLAMA_FTYPE_MOSTLY_Q2_K_S,
        QuantType::IQ4_NL => sys::LLAMA_FTYPE_MOSTLY_IQ4_NL,
        QuantType::IQ3_M => sys::LLAMA_FTYPE_MOSTLY_IQ3_M,
        QuantType::IQ3_S => sys::LLAMA_FTYPE_MOSTLY_IQ3_S,
        QuantType::IQ3_XS => sys::LLAMA_FTYPE_MOSTLY_IQ3_XS,
        QuantType::IQ3_XXS => sys::LLAMA_FTYPE_MOSTLY_IQ3_XXS,
        QuantType::IQ2_M => sys::LLAMA_FTYPE_MOSTLY_IQ2_M,
        QuantType::IQ2_S => sys::LLAMA_FTYPE_MOSTLY_IQ2_S,
        QuantType::IQ2_XS => sys::LLAMA_FTYPE_MOSTLY_IQ2_XS,
        QuantType::IQ2_XXS => sys::LLAMA_FTYPE_MOSTLY_IQ2_XXS,
        QuantType::IQ1_M => sys::LLAMA_FTYPE_MOSTLY_IQ1_M,
        QuantType::IQ1_S => sys::LLAMA_FTYPE_MOSTLY_IQ1_S,
        QuantType::TQ2_0 => sys::LLAMA_FTYPE_MOSTLY_TQ2_0,
        QuantType::TQ1_0 => sys::LLAMA_FTYPE_MOSTLY_TQ1_0,
        QuantType::MXFP4_MOE => sys::LLAMA_FTYPE_MOSTLY_MXFP4_MOE,
    }
}
