//! llama-cpp-2's backend for the oracles that call llama.cpp through that
//! binding rather than the product's `llama` crate: initialised once per
//! process; llama.cpp's and mtmd's log lines go to `tracing`, shown only
//! with `RUST_LOG`.

use llama_cpp_2::llama_backend::LlamaBackend;
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
