//! The generation check's prompts ([`numbers::eval::generation`]): per
//! domain, the first `[eval] generate_prompts` chunks (by id) that are
//! wholly that domain's held-out text and full, each chunk's first half the
//! prompt; `generate_tokens` new tokens after it, at most the other half.

use super::EvalRunError;
use crate::StagesError;
use config::eval::EvalSettings;
use numbers::eval::GenerateJob;
use numbers::split::Split;
use runfiles::corpus::{Chunk, CorpusIndex, CHUNKS_FILE};
use runfiles::store::RunStore;

/// The generation job of an evaluation of the run in `store`, whose corpus
/// `index` says.
pub async fn job(
    store: &RunStore,
    settings: &EvalSettings,
    index: &CorpusIndex,
) -> Result<GenerateJob, StagesError> {
    if settings.generate_prompts == 0 || settings.generate_tokens == 0 {
        return Ok(GenerateJob::default());
    }
    // Eval sets are domains after the calibration domains; their chunks,
    // after the calibration chunks, give no prompts.
    let calibration = index.domains.len().saturating_sub(index.eval_sets.len());
    let n_ctx = index.n_ctx;
    let corpus = store.child("corpus");
    let table = corpus.get(CHUNKS_FILE).await?;
    let what = corpus.url_of(CHUNKS_FILE);
    let (per_domain, new_tokens) = (settings.generate_prompts, settings.generate_tokens);
    let picked = tokio::task::spawn_blocking(move || {
        let mut chunks = runfiles::corpus::read_chunks(table, None)?;
        chunks.retain(|c| c.spans.iter().all(|s| usize::from(s.domain) < calibration));
        Ok::<_, String>(pick(&chunks, per_domain, n_ctx, new_tokens))
    })
    .await
    .map_err(|e| EvalRunError::Setup(format!("reading {what} panicked: {e}")))?
    .map_err(|e| EvalRunError::Setup(format!("{what}: {e}")))?;
    Ok(picked)
}

/// Picks the prompts from `chunks`: per domain the first `per_domain`
/// chunks whose every token is that domain's held-out text and that fill
/// the context; the prompt is the first half, the continuation at most
/// the second.
pub fn pick(chunks: &[Chunk], per_domain: u32, n_ctx: u32, new_tokens: u32) -> GenerateJob {
    let prompt_tokens = n_ctx / 2;
    let new_tokens = new_tokens.min(n_ctx - prompt_tokens);
    let mut job = GenerateJob {
        prompt_tokens,
        new_tokens,
        ..GenerateJob::default()
    };
    let mut taken = std::collections::BTreeMap::<u16, u32>::new();
    for c in chunks {
        let Some(first) = c.spans.first() else {
            continue;
        };
        let whole = c.images.is_empty()
            && c.tokens.len() >= n_ctx as usize
            && c.spans
                .iter()
                .all(|s| s.split == Split::Heldout && s.domain == first.domain);
        let n = taken.entry(first.domain).or_default();
        if whole && *n < per_domain && prompt_tokens > 0 {
            *n += 1;
            job.prompts.insert(c.id.0, first.domain);
        }
    }
    job
}

#[cfg(test)]
mod tests {
    use super::pick;
    use numbers::split::ChunkId;
    use numbers::split::Split;
    use runfiles::corpus::{Chunk, Span};

    fn chunk(id: u32, len: usize, spans: &[(u32, Split, u16)]) -> Chunk {
        Chunk {
            id: ChunkId(id),
            tokens: vec![1; len],
            spans: spans
                .iter()
                .map(|&(start, split, domain)| Span {
                    start,
                    len: 0,
                    split,
                    domain,
                    doc: 0,
                    group: 0,
                })
                .collect(),
            images: Vec::new(),
        }
    }

    #[test]
    fn prompts_are_the_first_whole_held_out_chunks_of_each_domain() {
        let (h, f) = (Split::Heldout, Split::Fit);
        let chunks = [
            chunk(0, 16, &[(0, f, 0)]),
            chunk(1, 16, &[(0, h, 0)]),
            chunk(2, 16, &[(0, h, 0), (8, h, 1)]),
            chunk(3, 10, &[(0, h, 1)]),
            chunk(4, 16, &[(0, h, 1)]),
            chunk(5, 16, &[(0, h, 0)]),
            chunk(6, 16, &[(0, h, 0)]),
            chunk(7, 16, &[(0, h, 1)]),
        ];
        let job = pick(&chunks, 2, 16, 100);
        assert_eq!(job.prompts, [(1, 0), (4, 1), (5, 0), (7, 1)].into());
        assert_eq!((job.prompt_tokens, job.new_tokens), (8, 8));
        assert!(pick(&chunks, 0, 16, 8).is_empty());
    }
}
