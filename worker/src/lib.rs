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
//! - [`respond`]: the response phase's batched generation.
//!
//! llama.cpp is reached through the `llama` crate alone, which holds the
//! product's unsafe code; this crate forbids it.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod collect;
pub mod corpus;
pub mod error;
pub mod eval;
pub mod images;
pub mod join;
pub mod quantize;
pub mod respond;

pub use error::WorkerError;
