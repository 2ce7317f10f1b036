//! `manifest.json`, typed: what a run was computed from and what each stage
//! recorded in it. The corpus stage writes it last, so its presence means
//! the tokenized corpus is complete. Every stage reads and writes it through
//! [`RunManifest`] only; each section has a default, so manifests written
//! before a section existed still read (and unknown sections of newer ones
//! are ignored).
//!
//! Sections: the corpus ([`Manifest`], at the top level: model and corpus
//! hashes, config, chunk plan), the model file collection ran with
//! (`model_path`), the accepted per-lease results of each lease kind
//! (`partials`, `eval_partials`), the trace budget (`trace`) and the
//! finished run (`run`).

use crate::layout::MANIFEST_JSON;
use crate::store::{RunStore, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Object name of the per-document table under `corpus/`.
pub use crate::layout::corpus::DOCUMENTS_FILE;

/// Version of the corpus format; part of the inputs fingerprint (2: exact
/// duplicates dropped and the held-out share bounded; 3: every span names
/// its document and group, `index.json` lists the groups; 4:
/// `documents.jsonl` gives each chat document's assistant-turn starts).
pub const CORPUS_FORMAT: u32 = 4;

/// The corpus section of the run's manifest.
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
    /// The images the chunks carry; absent for a text corpus.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<ImagesInfo>,
}

/// The images of a corpus that has some.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImagesInfo {
    /// SHA-256 of the mmproj GGUF that gave them their positions.
    pub mmproj_sha256: String,
    /// Distinct images in the chunks (each stored as `corpus/images/<sha256>`).
    pub images: u64,
    /// Image occurrences in the chunks.
    pub occurrences: u64,
    /// Positions they take, counted as tokens of their records.
    pub positions: u64,
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
    /// Files read, for a directory or glob source (absent for one file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    /// Files of a directory or glob skipped as binary.
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped_binary: u64,
    /// Files of a directory or glob skipped for their size
    /// (`max_file_bytes`).
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped_large: u64,
    /// Records skipped for having no text (their text, or messages, null,
    /// empty or absent); absent in manifests written before it was counted.
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped_no_text: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// Held-out share of the domain's kept tokens (half to twice the
    /// fraction, or the corpus is refused).
    pub heldout_share: f64,
    /// The domain's share of the fit split's tokens, checked against its
    /// target share like the corpus share.
    pub fit_share: f64,
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
    /// Fit documents dropped as exact copies of held-out documents.
    pub dropped_exact_heldout: u64,
    /// Documents dropped as exact copies of evaluation-set documents.
    pub dropped_exact_eval: u64,
    /// Documents dropped as later exact copies of a document of their own
    /// split (the first copy in read order is kept).
    pub dropped_exact_within: u64,
    /// Fit documents left out to reach the target shares (`[corpus] shares
    /// = "sample"`).
    #[serde(skip_serializing_if = "is_zero")]
    pub over_share_docs: u64,
    /// Their tokens.
    #[serde(skip_serializing_if = "is_zero")]
    pub over_share_tokens: u64,
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
    /// The rule: `exact_duplicate_of_eval`, `exact_duplicate_of_heldout`,
    /// `exact_duplicate_within_split`, `near_duplicate_of_eval` or
    /// `near_duplicate_of_heldout`.
    pub rule: String,
    /// The document it duplicates (prefixed with the eval set's name for eval sets).
    pub duplicate_of: String,
    /// Overlap coefficient of their shingle sets (1 for exact copies).
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
    pub split: numbers::Split,
    /// Its tokens.
    pub tokens: u64,
    /// Its characters.
    pub chars: u64,
    /// The rule that dropped it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<String>,
    /// A chat document's assistant-turn starts: token offsets (each at
    /// most `n_ctx`) where the conversation so far, rendered with the
    /// template's generation prompt, ends and an assistant's answer begins
    /// (`corpus::turns`); absent for text. The generation check's chat
    /// prompts end there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant_starts: Option<Vec<u32>>,
}

/// The most bytes of `manifest.json` read back (it holds the config, the
/// domain table, dropped documents and one record per lease).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// The run's manifest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    /// What the corpus stage wrote: hashes, config, domains, chunk plan.
    #[serde(flatten)]
    pub corpus: Manifest,
    /// The model file collection ran with (absolute), so later stages
    /// (replay, eval, prune) find it without `--model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_path: Option<PathBuf>,
    /// The mmproj collection fed the corpus's images with (absolute path
    /// and SHA-256), so evaluation feeds them alike; absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<protocol::wire::MmprojFile>,
    /// Accepted collection partials by object name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partials: Records,
    /// Accepted eval partials by object name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eval_partials: Records,
    /// Accepted response partials (the response phase, before the corpus)
    /// by object name; kept when the corpus is prepared from them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub response_partials: Records,
    /// The trace budget and what it became.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceRecord>,
    /// The finished run; `complete` only when verification passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunRecord>,
}

impl RunManifest {
    /// The config the run recorded (as the corpus stage read it), read as
    /// `T` (the config crate's `Config`, which comes after this crate).
    pub fn config<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_value(self.corpus.config.clone()).map_err(|e| e.to_string())
    }
}

/// What the coordinator knew about an accepted result when it stored it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialRecord {
    /// SHA-256 of the stored bytes.
    pub sha256: String,
    /// Settings key of the run that accepted it (`runtime::run::record::settings_key`).
    pub settings: String,
    /// The units of the lease plan it covers when more than one (a worker's
    /// checkpoint); empty: the one unit its name gives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<numbers::ChunkRange>,
}

/// Records of accepted results by object name (`partials/part-...bin`).
pub type Records = BTreeMap<String, PartialRecord>;

/// The manifest's `trace` section: the budget, the stride it became, the
/// tokens traced and the bytes per traced token of the prefill parts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceRecord {
    /// `[run] trace_tokens_per_split`.
    pub tokens_per_split: u64,
    /// Every n-th chunk's fit tokens are traced.
    pub every_nth_chunk_fit: u32,
    /// Every n-th chunk's held-out tokens are traced.
    pub every_nth_chunk_heldout: u32,
    /// Tokens traced.
    pub tokens_written: u64,
    /// Prefill trace parts.
    pub parts: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes per traced token.
    pub bytes_per_traced_token: f64,
}

/// The manifest's `run` section, written when the run finished.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunRecord {
    /// Every invariant held: the run's artifacts are complete.
    pub complete: bool,
    /// Verification passed.
    pub verify_passed: bool,
    /// Units of the lease plan.
    pub units: usize,
    /// Units reused from stored partials.
    pub leases_resumed: usize,
    /// Units computed by the last process.
    pub leases_computed: usize,
    /// Leases retried.
    pub retries: usize,
    /// Duplicate or late results dropped.
    pub duplicates_dropped: usize,
    /// Per-worker figures.
    pub workers: Vec<WorkerRecord>,
}

/// One worker's line of the `run` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerRecord {
    /// Its name (escaped).
    pub name: String,
    /// Its backend (escaped).
    pub backend: String,
    /// Leases accepted.
    pub leases: u64,
    /// Tokens in accepted results.
    pub tokens: u64,
    /// Tokens per second of busy time on the coordinator's clock (from
    /// each lease's grant to its result's arrival), never the worker's word.
    pub tokens_per_s: f64,
}

/// Why the manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored bytes are not a manifest; they are left as they are.
    #[error("{url} is {reason}")]
    Corrupt {
        /// The manifest's URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Reads the run's manifest (`None` when there is none), at most
/// [`MAX_MANIFEST_BYTES`].
pub async fn read(store: &RunStore) -> Result<Option<RunManifest>, ManifestError> {
    let Some(bytes) = store
        .get_opt_limited(MANIFEST_JSON, MAX_MANIFEST_BYTES)
        .await?
    else {
        return Ok(None);
    };
    parse(&bytes)
        .map(Some)
        .map_err(|reason| ManifestError::Corrupt {
            url: store.url_of(MANIFEST_JSON),
            reason,
        })
}

/// Reads the run's manifest, an empty one when there is none.
pub async fn read_or_default(store: &RunStore) -> Result<RunManifest, ManifestError> {
    Ok(read(store).await?.unwrap_or_default())
}

/// Why `bytes` are not a manifest, if they are not.
fn parse(bytes: &[u8]) -> Result<RunManifest, String> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    match serde_json::from_slice(bytes) {
        Ok(m) => Ok(m),
        Err(e) if e.is_syntax() || e.is_eof() => Err(format!("not JSON ({e})")),
        Err(_) if first != Some(&b'{') => Err("not a JSON object".into()),
        Err(e) => Err(format!("not a run manifest ({e})")),
    }
}

/// The manifest as stored (pretty JSON).
fn encode(m: &RunManifest) -> Vec<u8> {
    serde_json::to_vec_pretty(m).expect("a manifest encodes")
}

/// Writes the manifest (replacing the stored one).
pub async fn write(store: &RunStore, m: &RunManifest) -> Result<(), StoreError> {
    store.put(MANIFEST_JSON, encode(m)).await
}

/// What the manifest records about the tokenizer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenizerInfo {
    /// Implementation (`llama.cpp`).
    pub kind: String,
    /// Vocabulary type (`BPE`, `SPM`, ...).
    pub vocab_type: String,
    /// Number of tokens in the vocabulary.
    pub n_vocab: u32,
    /// Beginning-of-sequence token id.
    pub bos: i32,
    /// End-of-sequence token id.
    pub eos: i32,
    /// Whether the model's metadata asks for BOS at the start of a text.
    pub add_bos: bool,
    /// Whether the model's metadata asks for EOS at the end of a text.
    pub add_eos: bool,
    /// SHA-256 of the chat template, if the model has one.
    pub chat_template_sha256: Option<String>,
    /// SHA-256 of the mmproj GGUF that tokenized images, when one was loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmproj_sha256: Option<String>,
}

/// One domain's line of the share table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShareRow {
    /// Domain name.
    pub domain: String,
    /// Configured target share of tokens, if any.
    pub target: Option<f64>,
    /// Documents kept.
    pub docs: u64,
    /// Characters kept.
    pub chars: u64,
    /// Tokens kept.
    pub tokens: u64,
    /// Share of the corpus's characters.
    pub char_share: f64,
    /// Share of the corpus's tokens: what is checked.
    pub token_share: f64,
}

impl ShareRow {
    /// Whether the measured token share is within `tolerance` of the target.
    pub fn within(&self, tolerance: f64) -> bool {
        self.target
            .is_none_or(|t| (self.token_share - t).abs() <= tolerance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_manifests_read_and_unknown_or_missing_sections_default() {
        let old = br#"{"model_sha256": "ab", "corpus_format": 1,
                       "partials": {"partials/part-00000000-00000002.bin": {"sha256": "s", "settings": "k"}},
                       "run": {"complete": true, "workers": [{"name": "w", "tokens": 3}]},
                       "trace": {"tokens_per_split": 5}, "from_the_future": 1}"#;
        let m = parse(old).unwrap();
        assert_eq!(m.corpus.model_sha256, "ab");
        assert_eq!(m.model_path, None);
        assert_eq!(
            m.partials["partials/part-00000000-00000002.bin"].sha256,
            "s"
        );
        assert!(m.eval_partials.is_empty());
        assert_eq!(m.run.as_ref().unwrap().workers[0].tokens, 3);
        assert_eq!(m.trace.as_ref().unwrap().tokens_per_split, 5);
        let again = parse(&serde_json::to_vec(&m).unwrap()).unwrap();
        assert_eq!(again, m);
        assert_eq!(parse(b"{}").unwrap(), RunManifest::default());
    }

    #[test]
    fn what_is_not_a_manifest_is_named() {
        assert!(parse(b"{\"model_sha256\": \"ab")
            .unwrap_err()
            .starts_with("not JSON"));
        assert_eq!(parse(b"[1, 2]").unwrap_err(), "not a JSON object");
        let e = parse(br#"{"partials": 3}"#).unwrap_err();
        assert!(e.starts_with("not a run manifest"), "{e}");
    }
}
