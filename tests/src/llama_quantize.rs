//! Quantised models made by llama.cpp's own quantizer (`llama_model_quantize`,
//! what `llama-quantize` runs): k-quant fixtures that this project's GGUF
//! writer cannot encode, so tests see the files users actually prune.

use llama_cpp_sys_2 as sys;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::Path;

/// llama.cpp's Q8_0 file type: every weight matrix in blocks of 32.
pub const Q8_0: sys::llama_ftype = sys::LLAMA_FTYPE_MOSTLY_Q8_0;

/// llama.cpp's Q4_K_M file type: k-quant experts, Q4_K with Q6_K in part of
/// the down projections, where the rows are whole blocks of 256.
pub const Q4_K_M: sys::llama_ftype = sys::LLAMA_FTYPE_MOSTLY_Q4_K_M;

/// Quantises the GGUF `input` into `output` as `ftype` on `threads` CPU
/// threads, without an importance matrix; `Err` names the file when
/// llama.cpp refuses.
pub fn quantize(
    input: &Path,
    output: &Path,
    ftype: sys::llama_ftype,
    threads: i32,
) -> Result<(), String> {
    quantize_with(input, output, ftype, threads, None, &[])
}

/// A metadata entry llama-quantize adds to the file it writes.
pub enum Kv<'a> {
    /// A string (llama-quantize copies at most 127 bytes).
    Str(&'a str),
    /// An integer (llama.cpp writes it as u32).
    Int(i64),
}

/// [`quantize`] with per-tensor importance weights (`[n_mat][n_in]`, what
/// llama-quantize derives from an imatrix file) handed to llama.cpp as they
/// are, and `metadata` as llama-quantize hands its `quantize.imatrix.*`
/// keys over: a `llama_model_kv_override` each, ended by an empty key.
pub fn quantize_with(
    input: &Path,
    output: &Path,
    ftype: sys::llama_ftype,
    threads: i32,
    imatrix: Option<&BTreeMap<String, Vec<f32>>>,
    metadata: &[(&str, Kv<'_>)],
) -> Result<(), String> {
    crate::llama_logits::init_backend();
    let inp = CString::new(input.to_str().unwrap()).unwrap();
    let out = CString::new(output.to_str().unwrap()).unwrap();
    let names: Vec<(CString, &Vec<f32>)> = imatrix
        .into_iter()
        .flatten()
        .map(|(n, v)| (CString::new(n.as_str()).unwrap(), v))
        .collect();
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
    let text = |t: &str| {
        let mut a = [0 as std::os::raw::c_char; 128];
        for (o, b) in a.iter_mut().zip(t.bytes().take(127)) {
            *o = b as std::os::raw::c_char;
        }
        a
    };
    let mut overrides: Vec<sys::llama_model_kv_override> = metadata
        .iter()
        .map(|(key, value)| {
            let (tag, val) = match value {
                Kv::Str(v) => (
                    sys::LLAMA_KV_OVERRIDE_TYPE_STR,
                    sys::llama_model_kv_override__bindgen_ty_1 { val_str: text(v) },
                ),
                Kv::Int(v) => (
                    sys::LLAMA_KV_OVERRIDE_TYPE_INT,
                    sys::llama_model_kv_override__bindgen_ty_1 { val_i64: *v },
                ),
            };
            sys::llama_model_kv_override {
                tag,
                key: text(key),
                __bindgen_anon_1: val,
            }
        })
        .collect();
    overrides.push(sys::llama_model_kv_override {
        tag: sys::LLAMA_KV_OVERRIDE_TYPE_INT,
        key: [0; 128],
        __bindgen_anon_1: sys::llama_model_kv_override__bindgen_ty_1 { val_i64: 0 },
    });
    // SAFETY: plain parameter struct from llama.cpp's defaults; both paths,
    // the names and values `entries` points to (ended by a null name) and
    // the overrides (ended by an empty key) outlive the call.
    let code = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.nthread = threads;
        params.ftype = ftype;
        if imatrix.is_some() {
            params.imatrix = entries.as_ptr();
        }
        if !metadata.is_empty() {
            params.kv_overrides = overrides.as_ptr();
        }
        sys::llama_model_quantize(inp.as_ptr(), out.as_ptr(), &params)
    };
    if code == 0 {
        Ok(())
    } else {
        Err(format!(
            "llama_model_quantize({}) returned {code}",
            input.display()
        ))
    }
}
