//! Replay's error type: every variant names the flag, file, object, column or
//! keep map at fault. A variant that wraps a cause keeps it as its source, so
//! `{:#}` prints "what failed: why".

use gguf::read::GgufReadError;
use runfiles::store::StoreError;
use std::path::PathBuf;

/// Why a replay, or reading one of its inputs or results, failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A command-line flag is out of range or names nothing.
    #[error("{flag}{} {reason}", value.as_deref().map_or(String::new(), |v| format!(" {v}")))]
    Flag {
        /// The flag (`--ema-decay`).
        flag: &'static str,
        /// Its value, when the message shows it.
        value: Option<String>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An async runtime for the run's I/O could not be started.
    #[error("starting the {runtime}")]
    Runtime {
        /// Which runtime (`I/O runtime`, `trace I/O runtime`).
        runtime: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The replay thread pool could not be started.
    #[error("starting replay threads")]
    Threads {
        /// Rayon's error.
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    /// Reading or writing the run's objects failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A remote object is shorter than a Parquet footer.
    #[error("{name} is too short for a Parquet file")]
    FooterTooShort {
        /// The object, relative to the run.
        name: String,
    },
    /// A remote object's Parquet footer claims more bytes than the object has.
    #[error("{name}: footer length {footer_len} exceeds the file size {size}")]
    FooterTooLong {
        /// The object, relative to the run.
        name: String,
        /// The footer length the file's tail states.
        footer_len: u64,
        /// The object's size.
        size: u64,
    },

    /// A local trace part could not be opened.
    #[error("opening trace part {url}")]
    TraceOpen {
        /// The part.
        url: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A trace part's Parquet footer could not be decoded.
    #[error("reading the footer of trace part {url}")]
    TraceFooter {
        /// The part.
        url: String,
        /// Parquet's error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// A remote trace part's footer could not be fetched.
    #[error("reading the footer of trace part {url}")]
    TraceFooterFetch {
        /// The part.
        url: String,
        /// Why the fetch failed.
        #[source]
        source: Box<ReplayError>,
    },
    /// The task reading remote trace footers failed (it panicked or was
    /// cancelled).
    #[error("trace footer reader")]
    FooterTask {
        /// Tokio's error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A Parquet reader over a trace part's row groups could not be built.
    #[error("reading trace part {url}")]
    TraceReader {
        /// The part.
        url: String,
        /// Parquet's error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// A remote trace part's row groups could not be fetched.
    #[error("reading trace part {url}")]
    TraceFetch {
        /// The part.
        url: String,
        /// Why the fetch failed.
        #[source]
        source: Box<ReplayError>,
    },
    /// A record batch of a trace part could not be decoded.
    #[error("decoding trace part {url}")]
    TraceDecode {
        /// The part.
        url: String,
        /// Arrow's error.
        #[source]
        source: arrow::error::ArrowError,
    },
    /// A trace part's schema lacks a column replay reads.
    #[error("trace part {url} has no {column:?} column")]
    TraceColumn {
        /// The part.
        url: String,
        /// The column.
        column: String,
        /// Arrow's error.
        #[source]
        source: arrow::error::ArrowError,
    },
    /// A trace part's Parquet schema has no `layer` leaf column.
    #[error("trace part {url} has no layer column")]
    NoLayerColumn {
        /// The part.
        url: String,
    },
    /// A trace part's `layer` column does not decode as `u32`.
    #[error("trace part {url}: layer column is not u32")]
    LayerColumnType {
        /// The part.
        url: String,
    },
    /// A trace part lacks a fixed-size list column (`selected`, `topn_id`).
    #[error("trace part {url} has no fixed-size list column {column:?}")]
    ListColumn {
        /// The part.
        url: String,
        /// The column.
        column: String,
    },
    /// Trace parts of one kind disagree on the number of selected or top-N
    /// experts per token.
    #[error(
        "trace part {url} has {k} selected and top-{n} experts, other parts {other_k} and top-{other_n}"
    )]
    TraceShape {
        /// The part that differs.
        url: String,
        /// Its selected experts per token.
        k: usize,
        /// Its router top-N width.
        n: usize,
        /// Selected experts per token of the parts before it.
        other_k: usize,
        /// Router top-N width of the parts before it.
        other_n: usize,
    },
    /// A layer's rows of a trace part are unusable.
    #[error("trace part {url} layer {layer}")]
    TraceLayer {
        /// The part.
        url: String,
        /// The layer being decoded.
        layer: u32,
        /// What is wrong with the rows.
        #[source]
        source: Box<ReplayError>,
    },
    /// A column of a trace batch is missing or has the wrong type.
    #[error("column {column:?} {reason}")]
    Column {
        /// The column.
        column: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A float column of a trace batch holds values replay cannot read.
    #[error("column {column:?}: {reason}")]
    ColumnValues {
        /// The column.
        column: String,
        /// What is wrong with its values.
        reason: String,
    },
    /// A trace row names a split other than `fit` and `heldout`.
    #[error("unknown split {split:?}")]
    UnknownSplit {
        /// The split as stored.
        split: String,
    },
    /// A trace row names an expert id at or above the number of experts.
    #[error("chunk {chunk} pos {pos}: expert id {expert} is not below n_expert = {n_expert}")]
    ExpertId {
        /// The token's chunk.
        chunk: u32,
        /// The token's position in its chunk.
        pos: u32,
        /// The expert id.
        expert: u16,
        /// Routed experts per layer.
        n_expert: usize,
    },
    /// The run holds no trace parts.
    #[error("{url} holds no trace parts")]
    NoTraces {
        /// The run's trace directory.
        url: String,
    },

    /// The model GGUF could not be read (the reader's error names the file).
    #[error("model {source}")]
    ModelRead {
        /// The reader's error.
        source: GgufReadError,
    },
    /// The model's split files do not make one model (one missing,
    /// misnamed or out of place).
    #[error(transparent)]
    ModelFiles {
        /// What is wrong, naming the file.
        source: gguf::split::SplitError,
    },
    /// An expert tensor's name has no block number (`blk.N.`).
    #[error("model {}: tensor {tensor} has no block number", model.display())]
    TensorBlock {
        /// The GGUF file.
        model: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Why the block number did not parse.
        #[source]
        source: std::num::ParseIntError,
    },
    /// An expert tensor is not three-dimensional with experts last.
    #[error("model {}: tensor {tensor} is not [in, out, n_expert]", model.display())]
    TensorShape {
        /// The GGUF file.
        model: PathBuf,
        /// The tensor's name.
        tensor: String,
    },
    /// The model has no expert tensors.
    #[error("model {} has no blk.N.ffn_*_exps.weight tensors", model.display())]
    NoExpertTensors {
        /// The GGUF file.
        model: PathBuf,
    },
    /// The model's metadata has no `{arch}.expert_count`.
    #[error("model {} has no expert_count", model.display())]
    NoExpertCount {
        /// The GGUF file.
        model: PathBuf,
    },
    /// Neither `saliency.json` nor a model tells the number of experts.
    #[error(
        "{saliency} is missing and no model is known (--model): cannot tell the number of experts"
    )]
    UnknownExpertCount {
        /// URL of the run's `saliency.json`.
        saliency: String,
    },
    /// The number of experts is 0 or too large for the trace's `u16` ids.
    #[error("n_expert = {n_expert} is out of range")]
    ExpertCount {
        /// Routed experts per layer, as read.
        n_expert: usize,
    },
    /// The run's `saliency.json` is not a saliency file.
    #[error("parsing {url}: {problem}")]
    Saliency {
        /// The object's URL.
        url: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A local keep map file could not be read.
    #[error("reading keep map {path}")]
    KeepMapRead {
        /// The file, as given to `--keep-map`.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A run file (a keep map) could not be read or is not valid; the
    /// error names it.
    #[error(transparent)]
    File(#[from] runfiles::file_error::FileError),
    /// A keep map keeps an expert id at or above the number of experts.
    #[error("keep map {keep_map}: layer {layer} keeps expert {expert}, but n_expert = {n_expert}")]
    KeepMapExpert {
        /// The file or object URL.
        keep_map: String,
        /// The layer.
        layer: u32,
        /// The expert id.
        expert: u32,
        /// Routed experts per layer.
        n_expert: usize,
    },
    /// A keep map has no entry for a layer the trace holds.
    #[error("keep map {keep_map} has no layer {layer}")]
    KeepMapLayer {
        /// The keep map's label.
        keep_map: String,
        /// The trace layer.
        layer: u32,
    },

    /// Stored `replay/results.json` could not be decoded.
    #[error("{url} is not replay results")]
    Results {
        /// The object's URL.
        url: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}
