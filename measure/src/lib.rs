//! The stages that lease work to workers over the runtime: [`eval`]
//! measures pruned candidates against the base model through the lease
//! pipeline, and [`ship`] makes the files users deploy (sliced, merged,
//! quantised) and measures them the same way. Both read what the file-only
//! stages (the `stages` crate: score, prune, report) wrote, and call into
//! them; nothing upstream depends on this crate. Command-line parsing and
//! the async runtime are the coordinator binary's.
//!
//! Every function reports through one error type, [`MeasureError`], which
//! wraps the file-only stages' [`stages::StagesError`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;
pub mod eval;
pub mod ship;

pub use error::MeasureError;
