//! The numbers of a census: exact sums ([`ExactSum`]) that make every merge
//! exact, the per-expert statistics and importance matrix a worker
//! accumulates ([`stats`], [`imatrix`]), partials and their compact
//! encoding ([`partial`], [`packed`], [`bounded`]), the checks a partial
//! passes before it is accepted ([`partial_check`], [`compare`]), the merged
//! view ([`saliency`]), eval partials and summaries ([`eval`]), how a model
//! routes tokens ([`routing`]), chunk ids and splits ([`split`]), the names
//! of keep maps ([`keep_name`]), projected expert outputs for merge plans
//! ([`projection`]).
//!
//! No I/O and no runtime: it may depend on the GGUF format crate only (the
//! importance matrix is written as GGUF), never on storage or the network.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod bounded;
pub mod compare;
pub mod eval;
pub mod exact;
pub mod imatrix;
pub mod keep_name;
pub mod packed;
pub mod partial;
pub mod partial_check;
pub mod peer_text;
pub mod projection;
pub mod respond;
pub mod routing;
pub mod saliency;
pub mod split;
pub mod splitmix;
pub mod stats;

pub use exact::ExactSum;
pub use split::{ChunkId, ChunkRange, Gating, Modality, Split, Splits};
