//! A run's location and every file in it: the object store ([`store`]),
//! one layout of object names ([`layout`]), and the typed read and write of
//! the run's files, each decoded in one function that names the file on
//! error ([`file_error`]): `manifest.json` ([`manifest`]), the merged statistics
//! ([`artifacts`], `saliency.json` in [`saliency`]), keep maps ([`keepmap`]),
//! merge plans ([`mergeplan`]), routing traces ([`trace`]), the corpus index
//! and chunk table ([`corpus`]), an evaluation's summary ([`eval_summary`]),
//! and where lease outputs go ([`lease`]). Also the host checks made before large writes ([`room`],
//! [`procstat`]) and how errors are printed ([`error_text`]).
//!
//! It may depend on the numbers, the GGUF format and the protocol's message
//! types; never on a stage, the tokenizer or llama.cpp.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod artifacts;
pub mod buffers;
pub mod corpus;
pub mod error_text;
pub mod eval_summary;
pub mod file_error;
pub mod keepmap;
pub mod layout;
pub mod lease;
pub mod manifest;
pub mod mergeplan;
pub mod parquet_out;
pub mod procstat;
pub mod respond;
pub mod room;
pub mod saliency;
pub mod store;
pub mod trace;
