//! The worker: measures a GGUF MoE model through llama.cpp. The library of
//! the `worker` binary (whose command line lives in the coordinator package,
//! `coordinator/src/worker_cli`), of tests and benchmarks; it reads the run's
//! files and speaks the protocol, and may not depend on the coordinator's
//! crates (corpus, runtime, stages).
//!
//! - [`collect`]: the [`collect::Collector`] that runs corpus chunks and
//!   accumulates REAP statistics, the importance matrix and routing traces,
//!   reading observed tensors on the host or reducing them on their own
//!   backend ([`collect::device`], `--reduce`).
//! - [`eval`]: the [`eval::Evaluator`] that compares pruned candidates with
//!   the base model (KL, perplexity, top-1 agreement).
//! - [`corpus`]: a tokenized corpus's index and one chunk range, for the
//!   one-process commands (`worker collect`, `worker eval`).
//! - [`images`]: a lease's images, encoded through the mmproj and fed by
//!   collection and evaluation alike.
//! - [`join`]: `worker join`, the QUIC client that measures leases for a coordinator.
//! - [`quantize`]: `worker quantize`, llama.cpp's quantiser with an
//!   importance matrix, written create-only and hashed.
//! - [`offload`]: where a model's weights live (`--ngl`, `--cpu-moe`).
//! - [`respond`]: the response phase's batched generation.
//! - [`llama`]: the only unsafe code, wrapping llama.cpp, and the run-time
//!   CPU-feature dispatch of a host kernel ([`llama::simd`]); every other
//!   module forbids it.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

// Only `llama` may hold unsafe code (llama.cpp's FFI and the OS calls around it).
#[forbid(unsafe_code)]
pub mod collect;
#[forbid(unsafe_code)]
pub mod corpus;
#[forbid(unsafe_code)]
pub mod error;
#[forbid(unsafe_code)]
pub mod eval;
#[forbid(unsafe_code)]
pub mod images;
#[forbid(unsafe_code)]
pub mod join;
pub mod llama;
#[forbid(unsafe_code)]
pub mod offload;
#[forbid(unsafe_code)]
pub mod quantize;
#[forbid(unsafe_code)]
pub mod respond;

pub use error::WorkerError;
