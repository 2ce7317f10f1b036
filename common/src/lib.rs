//! The data model every moe-census process shares.
//!
//! - [`exact`]: [`ExactSum`], the fixed-point sum that makes merges exact.
//! - [`stats`] and [`imatrix`]: the worker's accumulators and their merge.
//! - [`partial`]: what a worker returns for a set of chunks (its exact sums
//!   [`packed`] compactly); [`compare`]: whether two workers' partials of
//!   the same chunks agree; [`partial_check`]: the values a partial may hold
//!   before it is accepted.
//! - [`eval`]: pruned candidates against the base model: partials, exact
//!   merge, the summary.
//! - [`saliency`], [`keepmap`], [`trace`], [`corpus`]: the run's files.
//! - [`gguf`]: a GGUF writer for `imatrix.gguf` and generated test models;
//!   [`gguf_read`]: a GGUF reader (metadata, tensor infos, tensor bytes).
//! - [`prune`]: a base model and its importance matrix sliced to a keep map;
//!   [`quant`]: the quantisation types a shipped file is written in.
//! - [`store`]: run locations in object storage; [`layout`]: every object
//!   name under one.
//! - [`lease`]: [`lease::LeaseOutput`], what a lease produces (a partial or
//!   an eval partial), so one runner and one worker loop serve every kind.
//! - [`splitmix`]: the seedable generator of deterministic test data.
//! - [`wire`]: the coordinator-worker protocol (messages, frames, join proof);
//!   [`secret`]: the join secret; [`peer_text`]: peer strings made safe to log.
//! - [`bounded`]: bincode decoding with a limit sized from the input.
//! - [`routing`]: how a model routes tokens (gating aside), as llama.cpp's
//!   graph computes it, and the selection rule of a pruned model.
//! - [`room`]: free disk space and available memory, checked before large writes.
//! - [`model_check`]: a model's MoE facts from its GGUF header, before llama.cpp loads it;
//!   [`vocab_check`]: its vocabulary, which llama.cpp would abort on;
//!   [`model_weights`]: the importance-matrix entries a model defines.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod artifacts;
pub mod bounded;
pub mod buffers;
pub mod compare;
pub mod corpus;
pub mod error_text;
pub mod eval;
pub mod exact;
pub mod gguf;
pub mod gguf_read;
pub mod gguf_split;
pub mod hash;
pub mod imatrix;
pub mod keepmap;
pub mod layout;
pub mod lease;
pub mod model_check;
pub mod model_weights;
pub mod packed;
pub mod parquet_out;
pub mod partial;
pub mod partial_check;
pub mod peer_text;
pub mod procstat;
pub mod prune;
pub mod quant;
pub mod room;
pub mod routing;
pub mod saliency;
pub mod secret;
pub mod split;
pub mod splitmix;
pub mod stats;
pub mod store;
pub mod trace;
pub mod vocab_check;
pub mod wire;

/// The most blocks whose routed experts `--n-cpu-moe` (and `[run]
/// local_worker_n_cpu_moe`) may keep in host memory: one llama.cpp tensor
/// buffer-type override a block, and llama.cpp takes at most 4,096.
pub const MAX_CPU_MOE_LAYERS: u32 = 4096;

pub use exact::ExactSum;
pub use split::{ChunkId, ChunkRange, Gating, Modality, Split};
