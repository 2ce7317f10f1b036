//! The generation check's decoding ([`numbers::eval::generation`]): a
//! model's greedy continuation of a prompt chunk, in its own context (the
//! KV cache cleared before and after, so the teacher-forced passes never
//! see it).

use crate::error::WorkerError;
use crate::llama::{Context, NoGraph};
use numbers::eval::GenerateJob;
use runfiles::corpus::Chunk;

/// A prompt of the generation check: its chunk, the chunk's domain and
/// its tokens.
pub(super) struct Prompt<'c> {
    pub chunk: u32,
    pub domain: u16,
    pub tokens: &'c [i32],
}

/// The prompts of `chunks` that `job` names, in chunk order. A prompt and
/// its continuation must fit the context of `n_ctx`; a chunk shorter than
/// the prompt, or one with images, is refused: the coordinator picks whole
/// text chunks.
pub(super) fn prompts<'c>(
    job: &GenerateJob,
    chunks: &'c [Chunk],
    n_ctx: u32,
) -> Result<Vec<Prompt<'c>>, WorkerError> {
    if job.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(c) = chunks.first() {
        if u64::from(job.prompt_tokens) + u64::from(job.new_tokens) > u64::from(n_ctx) {
            return Err(WorkerError::Graph {
                chunk: c.id.0,
                reason: format!(
                    "a generation prompt of {} tokens and {} new tokens exceed the context of {n_ctx}",
                    job.prompt_tokens, job.new_tokens
                ),
            });
        }
    }
    let mut out = Vec::new();
    for c in chunks {
        let Some(&domain) = job.prompts.get(&c.id.0) else {
            continue;
        };
        let n = job.prompt_tokens as usize;
        if n == 0 || c.tokens.len() < n || !c.images.is_empty() {
            return Err(WorkerError::Graph {
                chunk: c.id.0,
                reason: format!(
                    "a generation prompt of {n} tokens, but the chunk has {} tokens and {} images",
                    c.tokens.len(),
                    c.images.len()
                ),
            });
        }
        out.push(Prompt {
            chunk: c.id.0,
            domain,
            tokens: &c.tokens[..n],
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
