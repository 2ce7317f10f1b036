//! The corpus stage's error type: every variant names the file, line or
//! domain at fault, so a user can fix the input without reading code.

use runfiles::store::StoreError;
use std::path::PathBuf;

/// Why a corpus could not be prepared. No manifest is written on any of them.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The `[corpus]` or `[model]` section is inconsistent.
    #[error("invalid corpus config: {0}")]
    Config(String),
    /// A source file or the model is missing or unreadable.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// One record of a source is malformed; `at` is `path:LINE` for JSONL,
    /// `path (row N)` for Parquet and `path (document N)` for text.
    #[error("{at}: {message}")]
    Record {
        /// Where the record is.
        at: String,
        /// What is wrong with it.
        message: String,
    },
    /// A whole source file is unusable (not Parquet, lacks a column, ...).
    #[error("{}: {message}", path.display())]
    Source {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A domain has no documents or no tokens.
    #[error("domain {domain:?} is empty: {reason}")]
    EmptyDomain {
        /// The domain.
        domain: String,
        /// Why it is empty.
        reason: String,
    },
    /// The model could not be loaded or lacks what the corpus needs.
    #[error("model {}: {message}", path.display())]
    Model {
        /// The GGUF file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The model's vocabulary would abort llama.cpp's loader (the error
    /// names the model and the token).
    #[error(transparent)]
    Vocab(#[from] gguf::vocab_check::VocabError),
    /// Some domain's token share misses its target by more than the tolerance.
    #[error("token shares miss their targets by more than the tolerance {tolerance} for {}:\n{table}", domains.join(", "))]
    ShareMiss {
        /// The domains that missed.
        domains: Vec<String>,
        /// The configured tolerance.
        tolerance: f64,
        /// The full share table.
        table: String,
    },
    /// A domain with a positive held-out fraction has fewer than two
    /// document groups: nothing can be held out with a group left to fit on.
    #[error(
        "domain {domain:?} has {} document group(s) ({}), so heldout_fraction {fraction} cannot \
         hold a group out and keep one to fit on: give it a group key with more values \
         (group_key), more data, or set heldout_fraction = 0 for this domain explicitly \
         ([[corpus.domains]] heldout_fraction = 0: it then has no held-out text)",
        groups.len(),
        groups.join(", ")
    )]
    HeldoutOneGroup {
        /// The domain.
        domain: String,
        /// Its held-out fraction.
        fraction: f64,
        /// Its groups (at most one).
        groups: Vec<String>,
    },
    /// A domain's held-out share is outside half to twice its fraction.
    #[error(
        "domain {domain:?}: the held-out share {when} is {:.2}% of the domain's {total} tokens, \
         outside [{:.2}%, {:.2}%] (half to twice heldout_fraction {fraction}); {groups}. Split \
         the large groups \
         (another group_key), add data, change heldout_fraction (or set it to 0 for this \
         domain) or the seed",
        100.0 * share,
        100.0 * bounds.0,
        100.0 * bounds.1
    )]
    HeldoutShare {
        /// The domain.
        domain: String,
        /// Its held-out fraction.
        fraction: f64,
        /// When the share was measured: by the split, or after duplicate removal.
        when: &'static str,
        /// The held-out share measured.
        share: f64,
        /// The shares allowed: half to twice the fraction.
        bounds: (f64, f64),
        /// The domain's tokens.
        total: u64,
        /// The held-out groups and every group, with their tokens.
        groups: String,
    },
    /// The run already holds a corpus prepared from other inputs.
    #[error(
        "{url} already holds a corpus prepared from other inputs (inputs sha256 {stored}, now {now}); \
         choose another --out or pass --force to replace it"
    )]
    Exists {
        /// The manifest's URL.
        url: String,
        /// Fingerprint of the stored corpus's inputs.
        stored: String,
        /// Fingerprint of the inputs now.
        now: String,
    },
    /// The stored manifest or corpus could not be decoded.
    #[error("{url}: {message}")]
    Stored {
        /// The object.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// Reading or writing the run's objects failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
