//! Synthetic tokenized chunks for the benchmarks (`bench_collect`,
//! `bench_eval`): deterministic token ids under 600 (inside every preset's
//! vocabulary), one fit span per chunk, one domain.

use common::corpus::{Chunk, CorpusIndex, Span};
use common::{ChunkId, Split};

/// `n` chunks of `n_ctx` tokens and their index.
pub fn bench_chunks(n: u32, n_ctx: u32) -> (CorpusIndex, Vec<Chunk>) {
    let chunks: Vec<Chunk> = (0..n)
        .map(|id| Chunk {
            id: ChunkId(id),
            tokens: (0..n_ctx)
                .map(|i| ((i * 7919 + id * 31) % 600) as i32)
                .collect(),
            spans: vec![Span {
                start: 0,
                len: n_ctx,
                split: Split::Fit,
                domain: 0,
            }],
        })
        .collect();
    let index = CorpusIndex {
        n_chunks: n,
        n_ctx,
        domains: vec!["bench".into()],
        n_tokens: u64::from(n) * u64::from(n_ctx),
        chunks_sha256: "bench".into(),
    };
    (index, chunks)
}
