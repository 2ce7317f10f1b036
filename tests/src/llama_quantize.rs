//! Quantised models made by llama.cpp's own quantizer (`llama_model_quantize`,
//! what `llama-quantize` runs): k-quant fixtures that this project's GGUF
//! writer cannot encode, so tests see the files users actually prune.

use llama_cpp_sys_2 as sys;
use std::ffi::CString;
use std::path::Path;

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
    crate::llama_logits::init_backend();
    let inp = CString::new(input.to_str().unwrap()).unwrap();
    let out = CString::new(output.to_str().unwrap()).unwrap();
    // SAFETY: plain parameter struct from llama.cpp's defaults; both paths
    // are valid C strings that outlive the call.
    let code = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.nthread = threads;
        params.ftype = ftype;
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
