//! The GGUF file format as moe-census reads and writes it: a reader of
//! metadata, tensor infos and bytes ([`read`]), a writer for `imatrix.gguf`
//! and generated models ([`write`]), models split across files ([`split`]),
//! the quantisation types ([`quant`]), file hashes ([`hash`]) and the checks
//! run on a model's header before llama.cpp loads it ([`model_check`],
//! [`vocab_check`], [`model_weights`]).
//!
//! It knows files, not runs: it may not depend on any other moe-census crate.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod hash;
pub mod model_check;
pub mod model_weights;
pub mod quant;
pub mod read;
pub mod split;
pub mod vocab_check;
pub mod write;
