//! Why a generated model, corpus or image sample could not be written.

use std::path::Path;

/// A generation error, naming the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A GGUF file (the model an mmproj is made for) cannot be read.
    #[error(transparent)]
    Gguf(#[from] gguf::read::GgufReadError),
    /// A GGUF file lacks a metadata key it needs.
    #[error("{path}: no {key}")]
    MissingKey {
        /// The GGUF file.
        path: String,
        /// The key.
        key: String,
    },
    /// More vision experts were asked of a generated model than it can
    /// route to on image positions alone.
    #[error(
        "{requested} vision experts: a {preset} model has {n_expert} experts, {n_expert_used} \
         per token, so at most {} can serve images alone",
        .n_expert - .n_expert_used
    )]
    VisionExperts {
        /// Vision experts asked for.
        requested: usize,
        /// The model preset's name (`Tiny`, `Wide`, ...).
        preset: String,
        /// Experts per MoE layer of the preset.
        n_expert: usize,
        /// Experts routed to per token.
        n_expert_used: usize,
    },
    /// Encoding a generated picture as PNG failed.
    #[error(transparent)]
    Png(#[from] png::EncodingError),
    /// Creating, writing or renaming a generated file failed.
    #[error("{action} {path}")]
    File {
        /// What was done: `creating`, `writing` or `renaming to`.
        action: &'static str,
        /// The directory or file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl SynthError {
    /// The [`SynthError::File`] of `action` on `path`, for `map_err`.
    fn file(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SynthError {
        let path = path.display().to_string();
        move |source| SynthError::File {
            action,
            path,
            source,
        }
    }

    /// Creating the directory or file `path` failed.
    pub fn creating(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError {
        SynthError::file("creating", path)
    }

    /// Writing the file `path` failed.
    pub fn writing(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError {
        SynthError::file("writing", path)
    }

    /// Renaming a finished temporary file to `path` failed.
    pub fn renaming_to(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError {
        SynthError::file("renaming to", path)
    }
}
