//! The worker's error type: every variant names the input at fault.

use crate::llama::LlamaError;

/// Errors of the worker library.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// llama.cpp refused the model, context or a decode.
    #[error(transparent)]
    Llama(#[from] LlamaError),
    /// The model loads but is not a MoE model we can measure.
    #[error("model {path}: {reason}")]
    Model {
        /// The GGUF file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The corpus or a chunk range is unusable.
    #[error("corpus {location}: {reason}")]
    Corpus {
        /// Where the corpus was read from.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// The graph did not look as the model metadata promised.
    #[error("while measuring chunk {chunk}: {reason}")]
    Graph {
        /// The chunk being decoded.
        chunk: u32,
        /// What was inconsistent.
        reason: String,
    },
    /// An accumulator overflowed or shapes disagreed.
    #[error(transparent)]
    Merge(#[from] common::stats::MergeError),
    /// Artifact storage failed.
    #[error(transparent)]
    Store(#[from] common::store::StoreError),
    /// Local file I/O failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A collection option is out of range.
    #[error("invalid option {option} = {value}: {reason}")]
    Option {
        /// The option's name.
        option: &'static str,
        /// Its value.
        value: String,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// Writing a trace part failed.
    #[error("trace part {name}: {reason}")]
    Trace {
        /// Object name of the part.
        name: String,
        /// Why.
        reason: String,
    },
}
