//! The coordinator-worker protocol: messages and frames ([`wire`]) and the
//! join secret with per-worker keys ([`secret`]).
//!
//! It may depend on the numbers and the GGUF format only. Reading and
//! writing frames on async streams is behind the `io` feature, so the
//! scheduler, which decides on messages without I/O, builds without tokio.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod secret;
pub mod wire;

/// The most blocks whose routed experts `--n-cpu-moe` (and `[run]
/// local_worker_n_cpu_moe`) may keep in host memory: one llama.cpp tensor
/// buffer-type override a block, and llama.cpp takes at most 4,096.
pub const MAX_CPU_MOE_LAYERS: u32 = 4096;
