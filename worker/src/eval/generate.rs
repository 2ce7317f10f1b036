//! The generation check's decoding ([`numbers::eval::generation`]): a
//! model's greedy continuation of a prompt, in its own context (the KV
//! cache cleared before and after, so the teacher-forced passes never see
//! it), and the noise floor's second continuation by the base model with
//! the prompt decoded in another micro-batch size.

use crate::error::WorkerError;
use llama::{Context, NoGraph};
use numbers::eval::GenerateJob;
use runfiles::corpus::Chunk;

/// A prompt of the generation check that a lease continues.
pub(super) struct Prompt<'j> {
    /// Its id in the job.
    pub id: u32,
    /// Its document's domain.
    pub domain: u16,
    /// Its tokens.
    pub tokens: &'j [i32],
}

/// The prompts of `job` whose documents start in `chunks`, in id order.
/// A prompt and its continuation must fit the context of `n_ctx`, and a
/// prompt's tokens must be in the vocabulary of `n_vocab`; otherwise the
/// job is refused, naming the prompt.
pub(super) fn prompts<'j>(
    job: &'j GenerateJob,
    chunks: &[Chunk],
    n_ctx: u32,
    n_vocab: usize,
) -> Result<Vec<Prompt<'j>>, WorkerError> {
    let holds = |chunk: u32| chunks.binary_search_by_key(&chunk, |c| c.id.0).is_ok();
    let mut out = Vec::new();
    for (id, p) in job.prompts_of(holds) {
        let len = p.tokens.len() as u64;
        let refuse = |reason: String| WorkerError::Graph {
            chunk: p.chunk,
            reason: format!("generation prompt {id}: {reason}"),
        };
        if len == 0 || len + u64::from(job.new_tokens) > u64::from(n_ctx) {
            return Err(refuse(format!(
                "{len} tokens and {} new tokens do not fit the context of {n_ctx}",
                job.new_tokens
            )));
        }
        if let Some(t) = p.tokens.iter().find(|&&t| t < 0 || t as usize >= n_vocab) {
            return Err(refuse(format!(
                "token {t} is outside the vocabulary of {n_vocab}"
            )));
        }
        out.push(Prompt {
            id,
            domain: p.domain,
            tokens: &p.tokens,
        });
    }
    Ok(out)
}

/// `new_tokens` greedy tokens after `prompt` (decoded in micro-batches of
/// `n_ubatch`), each the argmax of the model's next-token logits.
pub(super) fn continuation(
    ctx: &mut Context<'static, NoGraph>,
    prompt: &[i32],
    new_tokens: u32,
    n_ubatch: usize,
) -> Result<Vec<i32>, WorkerError> {
    ctx.clear();
    let mut out = Vec::with_capacity(new_tokens as usize);
    if new_tokens > 0 {
        let (head, last) = prompt.split_at(prompt.len() - last_batch(prompt.len(), n_ubatch));
        for (i, part) in head.chunks(n_ubatch).enumerate() {
            ctx.decode(part, (i * n_ubatch) as i32)?;
        }
        let mut next = ctx.decode_greedy(last, head.len() as i32)?;
        out.push(next);
        for pos in prompt.len()..prompt.len() + new_tokens as usize - 1 {
            next = ctx.decode_greedy(&[next], pos as i32)?;
            out.push(next);
        }
    }
    ctx.clear();
    Ok(out)
}

/// Tokens of a prompt's last micro-batch: the rest after whole ones.
fn last_batch(len: usize, n_ubatch: usize) -> usize {
    match len % n_ubatch {
        0 => n_ubatch.min(len),
        r => r,
    }
}

/// The continuations of every prompt by one model, in prompt order.
pub(super) fn continue_all(
    ctx: &mut Context<'static, NoGraph>,
    prompts: &[Prompt<'_>],
    new_tokens: u32,
    n_ubatch: usize,
) -> Result<Vec<Vec<i32>>, WorkerError> {
    prompts
        .iter()
        .map(|p| continuation(ctx, p.tokens, new_tokens, n_ubatch))
        .collect()
}

/// The base model's continuations for the noise floor: every prompt
/// decoded in micro-batches of the job's `noise_ubatch` (none without a
/// noise floor).
pub(super) fn noise_all(
    ctx: &mut Context<'static, NoGraph>,
    prompts: &[Prompt<'_>],
    job: &GenerateJob,
) -> Result<Vec<Vec<i32>>, WorkerError> {
    match job.noise_ubatch {
        0 => Ok(Vec::new()),
        n => continue_all(ctx, prompts, job.new_tokens, n as usize),
    }
}

#[cfg(test)]
mod tests {
    use super::last_batch;

    #[test]
    fn the_last_micro_batch_holds_the_rest() {
        assert_eq!(last_batch(10, 4), 2);
        assert_eq!(last_batch(8, 4), 4);
        assert_eq!(last_batch(3, 4), 3);
    }
}
