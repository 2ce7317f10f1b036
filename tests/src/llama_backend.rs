//! llama-cpp-2's backend and mtmd parameters for the oracles that call
//! llama.cpp through that binding rather than the product's `llama` crate:
//! initialised once per process; llama.cpp's and mtmd's log lines go to
//! `tracing`, shown only with `RUST_LOG`.

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::mtmd::{mtmd_default_marker, MtmdContextParams};
use std::ffi::CString;
use std::sync::OnceLock;

/// The process's llama-cpp-2 backend.
pub fn backend() -> &'static LlamaBackend {
    static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let logs = std::env::var_os("RUST_LOG").is_some();
        llama_cpp_2::send_logs_to_tracing(
            llama_cpp_2::LogOptions::default().with_logs_enabled(logs),
        );
        LlamaBackend::init().expect("llama-cpp-2's backend initialises once")
    })
}

/// mtmd on the CPU with two threads, its default media marker and no limits
/// on an image's tokens.
pub fn mtmd_params() -> MtmdContextParams {
    MtmdContextParams {
        use_gpu: false,
        print_timings: false,
        n_threads: 2,
        media_marker: CString::new(mtmd_default_marker()).unwrap(),
        image_min_tokens: -1,
        image_max_tokens: -1,
    }
}
