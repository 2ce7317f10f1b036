//! Logits of every position of a token sequence, straight from llama.cpp's C
//! API (f32 KV cache, flash attention off, one decode): the model under test
//! as llama.cpp runs it, with no project code in between.

use llama_cpp_sys_2 as sys;
use std::ffi::CString;
use std::path::Path;
use std::sync::Once;

/// Initialises llama.cpp's backend once per process, before any other call
/// of the fixtures into llama.cpp.
pub fn init_backend() {
    static INIT: Once = Once::new();
    // SAFETY: llama_backend_init is called once per process, first.
    INIT.call_once(|| unsafe { sys::llama_backend_init() });
}

/// The context parameters of the oracles: `n_ctx` positions, batches of
/// `n_batch` (one micro-batch), one sequence, `threads` CPU threads, flash
/// attention off, and an f32 KV cache when `f32_kv` (llama.cpp's default
/// f16 otherwise).
pub fn oracle_context_params(
    n_ctx: u32,
    n_batch: u32,
    threads: i32,
    f32_kv: bool,
) -> sys::llama_context_params {
    // SAFETY: returns a plain parameter struct.
    let mut c = unsafe { sys::llama_context_default_params() };
    c.n_ctx = n_ctx;
    c.n_batch = n_batch;
    c.n_ubatch = n_batch;
    c.n_seq_max = 1;
    c.n_threads = threads;
    c.n_threads_batch = threads;
    if f32_kv {
        c.type_k = sys::GGML_TYPE_F32;
        c.type_v = sys::GGML_TYPE_F32;
    }
    c.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_DISABLED;
    c
}

/// Runs `tokens` (positions 0..) through `model` on `threads` CPU threads
/// and returns `n_vocab` logits per position; `Err` if llama.cpp cannot load
/// or run the model.
pub fn logits(model: &Path, tokens: &[i32], threads: i32) -> Result<Vec<Vec<f32>>, String> {
    init_backend();
    let c_path = CString::new(model.to_str().unwrap()).unwrap();
    // SAFETY: plain parameter structs; every handle is null-checked and
    // freed below; the batch holds tokens.len() entries for one sequence.
    unsafe {
        let m = sys::llama_model_load_from_file(c_path.as_ptr(), sys::llama_model_default_params());
        if m.is_null() {
            return Err(format!("llama.cpp could not load {}", model.display()));
        }
        let n = tokens.len() as u32;
        let mut c = oracle_context_params(n.next_multiple_of(256), n, threads, true);
        c.no_perf = true;
        let ctx = sys::llama_init_from_model(m, c);
        if ctx.is_null() {
            sys::llama_model_free(m);
            return Err("llama.cpp could not create a context".into());
        }
        let b = sys::llama_batch_init(n as i32, 0, 1);
        let mut batch = b;
        batch.n_tokens = n as i32;
        for (i, &t) in tokens.iter().enumerate() {
            *batch.token.add(i) = t;
            *batch.pos.add(i) = i as i32;
            *batch.n_seq_id.add(i) = 1;
            *(*batch.seq_id.add(i)) = 0;
            *batch.logits.add(i) = 1;
        }
        let code = sys::llama_decode(ctx, batch);
        let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(m)) as usize;
        let out = if code == 0 {
            Ok((0..n as i32)
                .map(|i| {
                    std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx, i), n_vocab).to_vec()
                })
                .collect())
        } else {
            Err(format!("llama_decode returned {code}"))
        };
        sys::llama_batch_free(b);
        sys::llama_free(ctx);
        sys::llama_model_free(m);
        out
    }
}
