//! The worker: measures a GGUF MoE model through llama.cpp. A binary with a
//! library for tests and benchmarks; it reads the run's files and speaks the
//! protocol, and may not depend on the coordinator's crates (corpus,
//! runtime, stages).
//!
//! - [`cli`]: the command line (`collect`, `join`, and `synth-*`, the front of
//!   the `synth` crate's test models and data).
//! - [`collect`]: the [`collect::Collector`] that runs corpus chunks and
//!   accumulates REAP statistics, the importance matrix and routing traces,
//!   reading observed tensors on the host or reducing them on their own
//!   backend ([`collect::device`], `--reduce`).
//! - [`eval`]: the [`eval::Evaluator`] that compares pruned candidates with
//!   the base model (KL, perplexity, top-1 agreement).
//! - [`images`]: a lease's images, encoded through the mmproj and fed by
//!   collection and evaluation alike.
//! - [`join`]: `worker join`, the QUIC client that measures leases for a coordinator.
//! - [`quantize`]: `worker quantize`, llama.cpp's quantiser with an
//!   importance matrix, written create-only and hashed.
//! - [`offload`]: the placement flags (`--ngl`, `--cpu-moe`), read into
//!   [`llama::Offload`].
//! - [`respond`]: the response phase's batched generation.
//!
//! llama.cpp is reached through the `llama` crate alone, which holds the
//! product's unsafe code; this crate forbids it.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod collect;
pub mod error;
pub mod eval;
pub mod images;
pub mod join;
pub mod offload;
pub mod quantize;
pub mod respond;

pub use error::WorkerError;
