//! The worker's error type: every variant names the input at fault.

use llama::LlamaError;
use std::path::Path;

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
    Merge(#[from] numbers::stats::MergeError),
    /// Artifact storage failed.
    #[error(transparent)]
    Store(#[from] runfiles::store::StoreError),
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
    /// A command-line argument does not parse.
    #[error("{flag}: {reason}")]
    Arg {
        /// The flag, `--chunks`.
        flag: &'static str,
        /// Why its value is unusable.
        reason: String,
    },
    /// A command-line argument is not one of the values it accepts.
    #[error("{flag} {value:?}: expected {expected}")]
    ArgValue {
        /// The flag, `--split`.
        flag: &'static str,
        /// The value given.
        value: String,
        /// The values accepted.
        expected: &'static str,
    },
    /// A directory named by a command-line flag could not be created.
    #[error("{flag} {path}")]
    ArgDir {
        /// The flag, `--dump-logits`.
        flag: &'static str,
        /// The directory.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An environment variable is not one of the values it accepts.
    #[error("{var}={value:?}: expected {expected}")]
    EnvValue {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The values accepted.
        expected: &'static str,
    },
    /// An environment variable could not be read (not Unicode).
    #[error("{var}: {error}")]
    EnvUnreadable {
        /// The variable.
        var: &'static str,
        /// Why it could not be read.
        error: std::env::VarError,
    },
    /// A run file (the corpus index) could not be read or is not valid;
    /// the error names it.
    #[error(transparent)]
    File(#[from] runfiles::file_error::FileError),
    /// A file of the corpus (its chunks) is unusable.
    #[error("{url}: {reason}")]
    CorpusFile {
        /// URL of the file.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] gguf::read::GgufReadError),
    /// A GGUF file of a given role (`model`, `imatrix`) could not be read
    /// (the reader's error names the file).
    #[error("{role} {source}")]
    GgufFile {
        /// What the file is to the command.
        role: &'static str,
        /// The reader's error.
        source: gguf::read::GgufReadError,
    },
    /// A split model's files (llama.cpp's `gguf-split`) do not make one
    /// model: one missing, misnamed or out of place.
    #[error(transparent)]
    SplitModel(#[from] gguf::split::SplitError),
    /// A generated model, corpus or image sample could not be written.
    #[error(transparent)]
    Synth(#[from] synth::SynthError),
    /// Creating a scratch file or directory failed.
    #[error("creating {path}")]
    Create {
        /// The directory or file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a scratch file failed.
    #[error("writing {path}")]
    WriteFile {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The scratch directory (sliced candidates, a lease's base logits)
    /// cannot take what is about to be written.
    #[error("{reason}")]
    Scratch {
        /// The directory.
        path: String,
        /// What does not fit, with the sizes.
        reason: String,
    },
    /// Writing a raw logits dump file (`--dump-logits`) failed.
    #[error("{path}")]
    LogitsDump {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime could not start.
    #[error(transparent)]
    Runtime(std::io::Error),
    /// Writing a partial's results (`saliency.json`, `imatrix.gguf`) failed.
    #[error(transparent)]
    Artifact(#[from] runfiles::artifacts::ArtifactError),
    /// A result could not be encoded as JSON.
    #[error(transparent)]
    Json(serde_json::Error),
}

impl WorkerError {
    /// The [`WorkerError::Create`] of `path`, for `map_err`.
    pub fn creating(path: &Path) -> impl FnOnce(std::io::Error) -> WorkerError {
        let path = path.display().to_string();
        move |source| WorkerError::Create { path, source }
    }

    /// The [`WorkerError::WriteFile`] of `path`, for `map_err`.
    pub fn writing(path: &Path) -> impl FnOnce(std::io::Error) -> WorkerError {
        let path = path.display().to_string();
        move |source| WorkerError::WriteFile { path, source }
    }
}
