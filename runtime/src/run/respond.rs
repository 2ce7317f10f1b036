//! The response phase (before the corpus is packed): the prompts the
//! coordinator rendered (`corpus/responses/prompts.json`) are leased in
//! index ranges to the run's workers by the same runner as collection and
//! evaluation ([`super::runner`]); each worker generates every
//! response of a lease in one batch and returns token ids
//! ([`numbers::respond::ResponsePartial`]), checked here against the job
//! before they are stored (`corpus/responses/partials/`, recorded in the
//! manifest) and merged. A resumed run reuses every stored result made
//! under the same settings key (model, prompts, sampling, lease size) and
//! regenerates, saying which and why, those made under another.

use super::crew::Crew;
use super::runner::{lease_all, LeaseFigures, Leasing};
use super::{RunError, RunSetup};
use crate::lease::{check_covers, LeaseKind};
use gguf::hash::sha256_hex;
use numbers::respond::ResponsePartial;
use numbers::ChunkRange;
use protocol::wire::{RespondJob, Task};
use runfiles::corpus::CorpusIndex;
use runfiles::manifest::{Records, RunManifest};
use std::sync::Arc;

/// What the response phase needs besides the run's setup.
#[derive(Clone, Debug)]
pub struct RespondSetup {
    /// The run: store, model (hash and path sent to workers), `[run]` and
    /// `[cluster]`; its corpus index is the prompts' ([`prompt_index`]).
    pub base: RunSetup,
    /// What workers generate.
    pub job: RespondJob,
    /// Vocabulary size of the model (token ids are below it).
    pub n_vocab: u32,
    /// Prompts per lease.
    pub lease_prompts: u32,
}

/// The stand-in corpus index of the response phase: its units are the
/// `n_prompts` prompts, its tokens the most the phase can generate (the
/// progress total), its table hash the prompt file's.
pub fn prompt_index(n_prompts: u32, most_tokens: u64, prompts_sha256: &str) -> CorpusIndex {
    CorpusIndex {
        n_chunks: n_prompts,
        n_ctx: 0,
        domains: Vec::new(),
        n_tokens: most_tokens,
        chunks_sha256: prompts_sha256.to_string(),
        eval_sets: Vec::new(),
        groups: Vec::new(),
    }
}

/// Response leases: a result covers exactly its leases' prompts with the
/// job's `n` responses each, within `max_tokens` and the vocabulary.
#[derive(Clone, Debug)]
pub struct RespondAcceptance {
    /// The job.
    pub job: RespondJob,
    /// Vocabulary size.
    pub n_vocab: u32,
}

impl LeaseKind for RespondAcceptance {
    type Output = ResponsePartial;

    fn task(&self) -> Task {
        Task::Respond(self.job.clone())
    }

    fn table(m: &mut RunManifest) -> &mut Records {
        &mut m.response_partials
    }

    fn items(&self) -> Option<&'static str> {
        Some("prompts")
    }

    fn decode_and_check(
        &self,
        units: &[ChunkRange],
        bytes: bytes::Bytes,
    ) -> Result<ResponsePartial, String> {
        let p = ResponsePartial::from_bytes(&bytes)?;
        check_covers("response partial", units, &p.chunks)?;
        let s = &self.job.sampling;
        p.check(s.n, s.max_tokens, self.n_vocab)?;
        Ok(p)
    }
}

/// Fingerprint of everything that changes a response: the model, the
/// prompts, sampling and lengths, and the lease size (a lease's sequences
/// are decoded together).
pub fn settings_key(setup: &RespondSetup) -> String {
    let canonical = serde_json::json!({
        "model_sha256": setup.base.model_sha256,
        "job": setup.job,
        "lease_prompts": setup.lease_prompts,
    });
    sha256_hex(canonical.to_string().as_bytes())
}

/// What the phase did.
#[derive(Debug)]
pub struct Responded {
    /// Every prompt's responses.
    pub merged: ResponsePartial,
    /// Leases resumed, computed, retried, by whom (tokens are generated ones).
    pub leases: LeaseFigures,
}

/// Generates every response not already stored, with the run's `crew`
/// (which stays for the later phases); the caller holds the run's lock
/// (`setup.base.store` is its fenced store).
pub async fn generate_locked(
    setup: &RespondSetup,
    crew: &mut Crew<'_>,
) -> Result<Responded, RunError> {
    let base = &setup.base;
    let n_prompts = base.index.n_chunks;
    let units = sched::plan(n_prompts, setup.lease_prompts.max(1));
    let leasing = Leasing::untraced(base, settings_key(setup), "responses", true);
    let kind = Arc::new(RespondAcceptance {
        job: setup.job.clone(),
        n_vocab: setup.n_vocab,
    });
    let leased = lease_all(&leasing, units, kind, crew).await?;
    let merged = leased
        .merged
        .ok_or_else(|| RunError::Setup("the response phase has no prompts".into()))?;
    let want = ChunkRange {
        start: 0,
        end: n_prompts,
    };
    if merged.chunks != [want] {
        return Err(RunError::Setup(format!(
            "the merged responses cover {}, not every prompt ({want})",
            numbers::peer_text::summarise(&merged.chunks)
        )));
    }
    Ok(Responded {
        merged,
        leases: leased.leases,
    })
}
