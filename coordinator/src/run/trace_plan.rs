//! The trace budget: `[run] trace_tokens_per_split` traced tokens per split,
//! spread evenly over the corpus as a chunk stride that workers trace with,
//! and what the written traces cost (the manifest's `trace` section).

use common::store::RunStore;

/// The chunk stride that gives every split with tokens at least `budget`
/// traced tokens (chunks interleave the splits, so every n-th chunk holds
/// about 1/n of each split): the smallest split sets it, so the held-out
/// split always gets its share. 0 disables tracing; 1 traces every chunk.
pub fn trace_stride(budget: u64, split_tokens: &[u64]) -> u32 {
    if budget == 0 {
        return 0;
    }
    let smallest = split_tokens
        .iter()
        .copied()
        .filter(|&t| t > 0)
        .min()
        .unwrap_or(0);
    u32::try_from(smallest / budget).unwrap_or(u32::MAX).max(1)
}

/// Total bytes of the objects `names` of `store`: file sizes for local
/// runs, object sizes (HEAD requests) for remote ones.
pub async fn stored_bytes(store: &RunStore, names: &[String]) -> anyhow::Result<u64> {
    let local = url::Url::parse(store.url())
        .ok()
        .filter(|u| u.scheme() == "file")
        .and_then(|u| u.to_file_path().ok());
    if let Some(dir) = local {
        let mut total = 0;
        for name in names {
            total += std::fs::metadata(dir.join(name))?.len();
        }
        return Ok(total);
    }
    if let Some(remote) = crate::replay::remote::Remote::open(store.url())? {
        let names = names.to_vec();
        return tokio::task::spawn_blocking(move || {
            names
                .iter()
                .map(|n| remote.size(n))
                .sum::<anyhow::Result<u64>>()
        })
        .await?;
    }
    let mut total = 0;
    for name in names {
        total += store.get(name).await?.len() as u64;
    }
    Ok(total)
}

/// The manifest's `trace` section: the budget, the stride it became, the
/// tokens traced and the bytes per traced token of the prefill parts.
pub async fn manifest_entry(
    store: &RunStore,
    budget: u64,
    stride: u32,
    tokens: u64,
) -> anyhow::Result<serde_json::Value> {
    let parts = crate::score::trace_parts(store).await?;
    let bytes = stored_bytes(store, &parts).await?;
    Ok(serde_json::json!({
        "tokens_per_split": budget,
        "every_nth_chunk": stride,
        "tokens_written": tokens,
        "parts": parts.len(),
        "bytes": bytes,
        "bytes_per_traced_token": if tokens > 0 { bytes as f64 / tokens as f64 } else { 0.0 },
    }))
}

#[cfg(test)]
mod tests {
    use super::trace_stride;

    #[test]
    fn the_smallest_split_gets_at_least_its_budget() {
        // 1M tokens, 20% held out, 64K per split: every 3rd chunk, so
        // 200K / 3 = 66.7K held-out tokens are traced.
        let stride = trace_stride(65_536, &[800_000, 200_000]);
        assert_eq!(stride, 3);
        assert!(200_000 / u64::from(stride) >= 65_536);
        assert_eq!(trace_stride(65_536, &[10_000, 2_000]), 1);
        assert_eq!(trace_stride(0, &[800_000, 200_000]), 0);
        assert_eq!(trace_stride(1_000, &[5_000, 0]), 5);
        assert_eq!(trace_stride(1_000, &[]), 1);
    }
}
