//! `manifest.json`: what a run was computed from. The corpus stage writes it
//! last, so its presence means the tokenized corpus is complete. Later stages
//! add their own fields; every field has a default so older and newer
//! manifests still read.

use super::shares::ShareRow;
use super::tokenizer::TokenizerInfo;
use serde::{Deserialize, Serialize};

/// Object name of the manifest under the run.
pub const MANIFEST_FILE: &str = common::artifacts::names::MANIFEST_JSON;

/// Object name of the per-document table under `corpus/`.
pub const DOCUMENTS_FILE: &str = "documents.jsonl";

/// Version of the corpus format; part of the inputs fingerprint.
pub const CORPUS_FORMAT: u32 = 1;

/// The run's manifest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Manifest {
    /// [`CORPUS_FORMAT`] of the stored corpus.
    pub corpus_format: u32,
    /// SHA-256 over everything the corpus depends on (model, corpus config,
    /// source contents); equal fingerprints mean the stored corpus is reusable.
    pub inputs_sha256: String,
    /// SHA-256 of the GGUF model file.
    pub model_sha256: String,
    /// The tokenizer the corpus was made with.
    pub tokenizer: TokenizerInfo,
    /// The whole run config as read.
    pub config: serde_json::Value,
    /// Per-domain sources and measured shares.
    pub domains: Vec<DomainInfo>,
    /// Evaluation sets checked against the corpus.
    pub eval_sets: Vec<EvalSetInfo>,
    /// Every document dropped, and why.
    pub dropped: Vec<Dropped>,
    /// How the tokens were cut into chunks and ordered.
    pub chunk_plan: ChunkPlan,
    /// SHA-256 of `corpus/chunks.parquet`.
    pub chunks_sha256: String,
    /// SHA-256 of `corpus/index.json`.
    pub index_sha256: String,
}

/// One source file, by content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceInfo {
    /// Path as the config names it (relative to the config's directory), so
    /// the manifest does not depend on where the command was started.
    pub path: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Records read from it.
    pub records: u64,
}

/// One domain's line of the manifest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DomainInfo {
    /// Shares after splitting and deduplication (what the chunks hold).
    pub shares: ShareRow,
    /// Its source files.
    pub sources: Vec<SourceInfo>,
    /// Configured held-out fraction.
    pub heldout_fraction: f64,
    /// Group key field, if any.
    pub group_key: Option<String>,
    /// Tokens in the fit split.
    pub fit_tokens: u64,
    /// Tokens in the held-out split.
    pub heldout_tokens: u64,
    /// Groups in the fit split.
    pub fit_groups: u64,
    /// Groups in the held-out split.
    pub heldout_groups: u64,
    /// Documents dropped as near-duplicates of held-out documents.
    pub dropped_near_heldout: u64,
    /// Documents dropped as near-duplicates of evaluation-set documents.
    pub dropped_near_eval: u64,
}

/// An evaluation set as checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalSetInfo {
    /// Its name.
    pub name: String,
    /// Its files.
    pub sources: Vec<SourceInfo>,
    /// Its documents.
    pub docs: u64,
    /// Its tokens.
    pub tokens: u64,
}

/// A dropped document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Dropped {
    /// The document (`path:LINE`, ...).
    pub at: String,
    /// Its domain.
    pub domain: String,
    /// The rule: `near_duplicate_of_heldout` or `near_duplicate_of_eval`.
    pub rule: String,
    /// The document it duplicates (prefixed with the eval set's name for eval sets).
    pub duplicate_of: String,
    /// Overlap coefficient of their shingle sets.
    pub overlap: f64,
}

/// How tokens were packed and ordered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChunkPlan {
    /// Tokens per chunk.
    pub n_ctx: u32,
    /// Number of chunks.
    pub n_chunks: u32,
    /// Tokens over all chunks (== tokens of all kept documents).
    pub n_tokens: u64,
    /// Tokens in the last chunk.
    pub last_chunk_tokens: u32,
    /// Fit tokens.
    pub fit_tokens: u64,
    /// Held-out tokens.
    pub heldout_tokens: u64,
    /// Worst absolute difference, over every prefix of the schedule and every
    /// domain, between the prefix's token share and the corpus's measured share.
    pub worst_prefix_deviation: f64,
    /// The same, from the first prefix holding a tenth of the tokens on.
    pub worst_prefix_deviation_after_10pct: f64,
    /// Tokenized documents packed.
    pub docs: u64,
    /// Seed of the split and of the document order.
    pub seed: u64,
}

/// One line of `corpus/documents.jsonl`: where a document went and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocRecord {
    /// The document (`path:LINE`, ...).
    pub at: String,
    /// Its domain.
    pub domain: String,
    /// Its group (the key's value, or `doc:<at>` without one).
    pub group: String,
    /// The split its group was assigned to.
    pub split: common::Split,
    /// Its tokens.
    pub tokens: u64,
    /// Its characters.
    pub chars: u64,
    /// The rule that dropped it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<String>,
}
