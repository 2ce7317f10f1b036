//! Synthetic tokenized chunks for the benchmarks (`bench_collect`,
//! `bench_eval`, `bench_host`): deterministic token ids under 600 (inside
//! every preset's vocabulary), under a smaller model's vocabulary, or over a
//! whole vocabulary; one fit span per chunk, one domain.

use numbers::{ChunkId, Split};
use runfiles::corpus::{Chunk, CorpusIndex, GroupInfo, Span};

/// `n` chunks of `n_ctx` token ids below `n_vocab.min(600)` and their index
/// (600: the generated models' vocabulary, so figures stay comparable).
pub fn bench_chunks(n: u32, n_ctx: u32, n_vocab: usize) -> (CorpusIndex, Vec<Chunk>) {
    token_chunks(n, n_ctx, n_vocab.clamp(1, 600) as u64)
}

/// `n` chunks of `n_ctx` tokens, id `(i * 7919 + chunk * 31) % modulus` at
/// position `i`, and their index; `bench_host` spans a whole vocabulary.
pub fn token_chunks(n: u32, n_ctx: u32, modulus: u64) -> (CorpusIndex, Vec<Chunk>) {
    let modulus = modulus.max(1);
    let chunks: Vec<Chunk> = (0..n)
        .map(|id| Chunk {
            id: ChunkId(id),
            tokens: (0..n_ctx)
                .map(|i| ((u64::from(i) * 7919 + u64::from(id) * 31) % modulus) as i32)
                .collect(),
            spans: vec![Span {
                start: 0,
                len: n_ctx,
                split: Split::Fit,
                domain: 0,
                doc: id,
                group: 0,
            }],
            images: Vec::new(),
        })
        .collect();
    let index = CorpusIndex {
        n_chunks: n,
        n_ctx,
        domains: vec!["bench".into()],
        n_tokens: u64::from(n) * u64::from(n_ctx),
        chunks_sha256: "bench".into(),
        eval_sets: Vec::new(),
        groups: vec![GroupInfo {
            domain: 0,
            split: Split::Fit,
            key: "bench".into(),
        }],
    };
    (index, chunks)
}
