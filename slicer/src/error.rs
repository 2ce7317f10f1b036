//! Why a slice was refused or failed.

use gguf::read::GgufReadError;
use gguf::split::SplitError;
use std::io;

/// Errors of [`super::slice_model`], [`super::make_model`] and [`super::slice_imatrix`]. Refusals
/// name the file, the keep map (`<method>_K<k>`) and the tensor or layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PruneError {
    /// The input is not a readable GGUF file.
    #[error(transparent)]
    Read(#[from] GgufReadError),
    /// Reading the input or writing the output failed.
    #[error("{path}: {source}")]
    Io {
        /// The file being read or written.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The input has no experts to slice (no `{arch}.expert_count`, or an
    /// importance matrix without stacked expert weights).
    #[error("{path}: {reason}")]
    NotMoe {
        /// The input file.
        path: String,
        /// What is missing.
        reason: String,
    },
    /// The model's split files (llama.cpp's `gguf-split`) do not make one
    /// model: one missing, misnamed, or out of place.
    #[error(transparent)]
    Split(#[from] SplitError),
    /// A split output's size per file cannot be kept: a tensor is larger,
    /// or it makes more files than `gguf-split` numbers (65,535).
    #[error("files of at most {max_bytes} bytes: {reason}")]
    SplitSize {
        /// The size asked for.
        max_bytes: u64,
        /// Why it cannot be kept.
        reason: String,
    },
    /// The keep map is malformed on its own (unsorted ids, K differing per
    /// layer, a `k` field that disagrees with the lists).
    #[error("keep map {map}: {reason}")]
    KeepMap {
        /// The map, as `<method>_K<k>`.
        map: String,
        /// What is wrong.
        reason: String,
    },
    /// The keep map does not fit the model: a layer that is not an MoE layer,
    /// a missing MoE layer, an expert id out of range, K below
    /// `expert_used_count`, or uneven groups under grouped routing.
    #[error("{path}: keep map {map}: {reason}")]
    Mismatch {
        /// The input file.
        path: String,
        /// The map, as `<method>_K<k>`.
        map: String,
        /// What does not fit.
        reason: String,
    },
    /// A lowered number of experts per token the model cannot be given.
    #[error("{path}: {reason}")]
    ExpertsUsed {
        /// The input file.
        path: String,
        /// Why.
        reason: String,
    },
    /// An expert tensor whose expert axis is not its outermost dimension (or
    /// that is not of the expert family this slicer knows), so whole
    /// per-expert byte ranges cannot be cut from it.
    #[error("{path}: tensor {tensor}: {reason}")]
    Tensor {
        /// The input file.
        path: String,
        /// The tensor.
        tensor: String,
        /// What is wrong with its layout.
        reason: String,
    },
}
