//! Packing: documents, in schedule order, are cut into `n_ctx`-token chunks.
//! Every token lands in exactly one chunk; only the last chunk may be short.

use common::corpus::{Chunk, Span};
use common::{ChunkId, Split};

/// Packs `(tokens, split, domain)` pieces in order; a document may continue
/// into the next chunk. Adjacent tokens of the same (split, domain) share a span.
pub fn pack<'a>(
    pieces: impl IntoIterator<Item = (&'a [i32], Split, u16)>,
    n_ctx: usize,
) -> Vec<Chunk> {
    assert!(n_ctx > 0, "n_ctx must be positive");
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut cur = Chunk {
        id: ChunkId(0),
        tokens: Vec::with_capacity(n_ctx),
        spans: Vec::new(),
    };
    for (mut tokens, split, domain) in pieces {
        while !tokens.is_empty() {
            let take = tokens.len().min(n_ctx - cur.tokens.len());
            let start = cur.tokens.len() as u32;
            cur.tokens.extend_from_slice(&tokens[..take]);
            match cur.spans.last_mut() {
                Some(s) if s.split == split && s.domain == domain => s.len += take as u32,
                _ => cur.spans.push(Span {
                    start,
                    len: take as u32,
                    split,
                    domain,
                }),
            }
            tokens = &tokens[take..];
            if cur.tokens.len() == n_ctx {
                let id = ChunkId(cur.id.0 + 1);
                chunks.push(std::mem::replace(
                    &mut cur,
                    Chunk {
                        id,
                        tokens: Vec::with_capacity(n_ctx),
                        spans: Vec::new(),
                    },
                ));
            }
        }
    }
    if !cur.tokens.is_empty() {
        chunks.push(cur);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_lands_once_and_only_the_last_chunk_is_short() {
        let docs: Vec<Vec<i32>> = (0..23).map(|i| (0..(i * 7 % 40 + 1)).collect()).collect();
        let total: usize = docs.iter().map(Vec::len).sum();
        let chunks = pack(
            docs.iter().enumerate().map(|(i, d)| {
                (
                    d.as_slice(),
                    if i % 3 == 0 {
                        Split::Heldout
                    } else {
                        Split::Fit
                    },
                    (i % 2) as u16,
                )
            }),
            64,
        );
        assert_eq!(chunks.iter().map(|c| c.tokens.len()).sum::<usize>(), total);
        let flat: Vec<i32> = chunks.iter().flat_map(|c| c.tokens.clone()).collect();
        assert_eq!(flat, docs.concat());
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.id, ChunkId(i as u32));
            c.validate(2).unwrap();
            if i + 1 < chunks.len() {
                assert_eq!(c.tokens.len(), 64);
            }
        }
        let labels: Vec<(Split, u16)> = chunks.iter().flat_map(Chunk::token_labels).collect();
        assert_eq!(labels[0], (Split::Heldout, 0));
        assert_eq!(labels[1], (Split::Fit, 1));
    }
}
