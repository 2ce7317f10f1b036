//! The trace budget: `[run] trace_tokens_per_split` traced tokens per split,
//! spread evenly over the corpus as one chunk stride per split that workers
//! trace with, and what the written traces cost (the manifest's `trace`
//! section).

use protocol::wire::TraceStrides;
use runfiles::store::{RunStore, StoreError};

/// The chunk stride that gives a split of `split_tokens` tokens at least
/// `budget` traced tokens (chunks interleave the splits, so every n-th chunk
/// holds about 1/n of each split). 0 disables tracing; 1 traces every chunk.
pub fn trace_stride(budget: u64, split_tokens: u64) -> u32 {
    if budget == 0 {
        return 0;
    }
    u32::try_from(split_tokens / budget)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// One stride per split, each from that split's own size, so every split
/// gets about `budget` traced tokens: a single stride set by the smaller
/// held-out split gave the fit split about four times its budget.
pub fn trace_strides(budget: u64, fit_tokens: u64, heldout_tokens: u64) -> TraceStrides {
    TraceStrides {
        fit: trace_stride(budget, fit_tokens),
        heldout: trace_stride(budget, heldout_tokens),
    }
}

/// Total bytes of the objects `names` of `store` (HEAD requests on remote
/// stores).
pub async fn stored_bytes(store: &RunStore, names: &[String]) -> Result<u64, StoreError> {
    let mut total = 0;
    for name in names {
        total += store.size(name).await?;
    }
    Ok(total)
}

/// The manifest's `trace` section: the budget, the stride it became, the
/// tokens traced and the bytes per traced token of the prefill parts.
pub async fn manifest_entry(
    store: &RunStore,
    budget: u64,
    strides: TraceStrides,
    tokens: u64,
) -> Result<runfiles::manifest::TraceRecord, StoreError> {
    let (parts, _decode) = runfiles::trace::stored_parts(store).await?;
    let bytes = stored_bytes(store, &parts).await?;
    Ok(runfiles::manifest::TraceRecord {
        tokens_per_split: budget,
        every_nth_chunk_fit: strides.fit,
        every_nth_chunk_heldout: strides.heldout,
        tokens_written: tokens,
        parts: parts.len() as u64,
        bytes,
        bytes_per_traced_token: if tokens > 0 {
            bytes as f64 / tokens as f64
        } else {
            0.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::trace_strides;

    #[test]
    fn each_split_gets_its_own_budget() {
        // 1M tokens, 20% held out, 64K per split: every 12th chunk for fit
        // (66.7K of 800K traced) and every 3rd for held-out (66.7K of 200K).
        let s = trace_strides(65_536, 800_000, 200_000);
        assert_eq!((s.fit, s.heldout), (12, 3));
        for (tokens, stride) in [(800_000u64, s.fit), (200_000, s.heldout)] {
            let traced = tokens / u64::from(stride);
            assert!(
                (65_536..2 * 65_536).contains(&traced),
                "{traced} of {tokens} traced"
            );
        }
        let small = trace_strides(65_536, 10_000, 2_000);
        assert_eq!((small.fit, small.heldout), (1, 1));
        let off = trace_strides(0, 800_000, 200_000);
        assert_eq!((off.fit, off.heldout), (0, 0));
        let no_heldout = trace_strides(1_000, 5_000, 0);
        assert_eq!((no_heldout.fit, no_heldout.heldout), (5, 1));
    }
}
