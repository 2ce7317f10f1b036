//! The file-only stages' one public error type: every stage function
//! returns [`StagesError`], whose variants name the artifact, file or
//! argument at fault; the earlier crates' errors convert into it at the
//! crate boundary. It has no runtime, network or evaluation failures: those
//! are the `measure` crate's error, which wraps this one.

use runfiles::store::StoreError;
use std::path::PathBuf;

/// A store failure stays [`StagesError::Store`]; an invalid file is
/// [`StagesError::File`].
impl From<runfiles::file_error::FileError> for StagesError {
    fn from(e: runfiles::file_error::FileError) -> Self {
        match e {
            runfiles::file_error::FileError::Store(e) => StagesError::Store(e),
            e => StagesError::File(e),
        }
    }
}

/// Errors of the file-only stages (score, verify, prune, report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagesError {
    /// Reading or writing the run location failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A run file (keep map, merge plan, ...) is not valid; the error names it.
    #[error(transparent)]
    File(runfiles::file_error::FileError),
    /// A local file could not be read, written or created.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An artifact of the run (by its URL) is missing, malformed or does not
    /// fit what the stage needs.
    #[error("{url}: {problem}")]
    Artifact {
        /// Full URL of the object.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A command-line argument is unusable.
    #[error("{argument}: {problem}")]
    Argument {
        /// The flag or argument (`--mix`, `--k 7`, ...).
        argument: String,
        /// Why it cannot be used.
        problem: String,
    },
    /// A stage was asked to write the run's own results with options that
    /// are not the run's config's, without `--out NAME`.
    #[error(
        "{differences}: not the options of the run's config, whose results {outputs} hold (left as they are); pass --out NAME to keep this result under explore/NAME/ in the run"
    )]
    Exploring {
        /// The run's own outputs that were protected (`score/ and keep_maps/`).
        outputs: String,
        /// Each option asked for that differs, with the run's value.
        differences: String,
    },
    /// An earlier step failed; `doing` says which (the context the user
    /// reads before the cause).
    #[error("{doing}")]
    While {
        /// What the stage was doing.
        doing: String,
        /// The failure.
        #[source]
        source: Box<StagesError>,
    },
    /// A JSON document does not parse as what the stage expects.
    #[error("{what} is not {expected}")]
    Json {
        /// The document: an artifact's URL, or the part of one at fault.
        what: String,
        /// What it should be ("a keep map", "a score report", ...).
        expected: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A result could not be encoded for writing.
    #[error("encoding {what}")]
    Encode {
        /// What was being encoded (an object name, "the PNG header", ...).
        what: String,
        /// The encoder's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A plot could not be drawn.
    #[error("drawing {plot}: {problem}")]
    Draw {
        /// The plot's title.
        plot: String,
        /// The drawing backend's error.
        problem: String,
    },
    /// The run's manifest could not be read.
    #[error(transparent)]
    Manifest(#[from] runfiles::manifest::ManifestError),
    /// Stored statistics do not merge.
    #[error(transparent)]
    Merge(#[from] numbers::stats::MergeError),
    /// The statistics a scoring source selects are not in `saliency.json`.
    #[error("cannot score {scored}: {problem}")]
    Unscorable {
        /// The source's label (`fit`, `domain:code`, `mix:a=0.5,b=0.5`).
        scored: String,
        /// What is missing.
        problem: String,
    },
    /// A keep-map size is 0 or above a layer's experts.
    #[error("K={k} is not in 1..={n_expert} (experts of layer {layer})")]
    KeepSize {
        /// The size asked for.
        k: u32,
        /// Experts of the layer.
        n_expert: usize,
        /// Model block index of the layer.
        layer: u32,
    },
    /// A keep map names a method `score` does not know.
    #[error("unknown method {method:?}")]
    UnknownMethod {
        /// The method name in the keep map.
        method: String,
    },
    /// A chunk's statistics do not have the model's shape.
    #[error("chunk {chunk} statistics hold {cells} cells, expected {layers} layers x {n_expert} experts")]
    ChunkShape {
        /// Chunk id.
        chunk: u32,
        /// Cells the chunk's statistics hold.
        cells: usize,
        /// MoE layers of the model.
        layers: usize,
        /// Experts per layer.
        n_expert: usize,
    },
    /// The bootstrap was given no chunk statistics or no resamples.
    #[error("no chunk statistics or no resamples to bootstrap")]
    NothingToBootstrap,
    /// A GGUF file (a base or shipped model) could not be read; the error
    /// names the file.
    #[error(transparent)]
    Gguf(#[from] gguf::read::GgufReadError),
    /// A split model's files (llama.cpp's `gguf-split`) do not make one
    /// model: one missing, misnamed or out of place.
    #[error(transparent)]
    SplitModel(#[from] gguf::split::SplitError),
    /// A model or importance matrix could not be sliced to a keep map.
    #[error("slicing {input}")]
    Slice {
        /// The file sliced (a path, or the run's URL of it).
        input: String,
        /// Why.
        #[source]
        source: slicer::PruneError,
    },
    /// No base model was given and the run's manifest names no usable one.
    #[error("{manifest} {problem}: pass --model")]
    NoModel {
        /// The manifest's URL.
        manifest: String,
        /// What it lacks ("is missing", "names no model ...").
        problem: String,
    },
    /// The replay of routing traces failed.
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
}

impl StagesError {
    /// Parses the JSON document `bytes` as `T`; on failure the error names
    /// the document (`what`, built only then) and what it should be.
    pub fn parse_json<T: serde::de::DeserializeOwned>(
        bytes: &[u8],
        what: impl FnOnce() -> String,
        expected: &'static str,
    ) -> Result<T, StagesError> {
        serde_json::from_slice(bytes).map_err(|source| StagesError::Json {
            what: what(),
            expected,
            source,
        })
    }

    /// `value` as pretty JSON; on failure the error names what was being
    /// encoded (`what`: the object or file it is for).
    pub fn encode_json(what: &str, value: &impl serde::Serialize) -> Result<Vec<u8>, StagesError> {
        serde_json::to_vec_pretty(value).map_err(|e| StagesError::Encode {
            what: what.to_string(),
            source: e.into(),
        })
    }

    /// The [`StagesError::Io`] of `action` ("writing", ...) on `path`, for
    /// `map_err`.
    pub fn io(action: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| StagesError::Io {
            action,
            path,
            source,
        }
    }

    /// Wraps `self` with what the stage was doing when it failed, so the
    /// user reads "doing: cause".
    pub fn during(self, doing: impl Into<String>) -> StagesError {
        StagesError::While {
            doing: doing.into(),
            source: Box::new(self),
        }
    }
}

/// Adds [`StagesError::during`] to results whose error converts into
/// [`StagesError`].
pub trait During<T> {
    /// Wraps the error, if any, with what the stage was doing.
    fn during(self, doing: impl Into<String>) -> Result<T, StagesError>;
    /// As [`During::during`], the text built only on failure.
    fn during_with<S: Into<String>>(self, doing: impl FnOnce() -> S) -> Result<T, StagesError>;
}

impl<T, E: Into<StagesError>> During<T> for Result<T, E> {
    fn during(self, doing: impl Into<String>) -> Result<T, StagesError> {
        self.map_err(|e| e.into().during(doing))
    }
    fn during_with<S: Into<String>>(self, doing: impl FnOnce() -> S) -> Result<T, StagesError> {
        self.map_err(|e| e.into().during(doing()))
    }
}
