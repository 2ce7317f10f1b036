//! Packing: documents, in schedule order, are cut into `n_ctx`-token chunks.
//! Every token lands in exactly one chunk. An image is never cut: a chunk
//! that an image would overflow is closed early, so a chunk is short only
//! when it is the last or the next one starts with an image.

use numbers::{ChunkId, Split};
use runfiles::corpus::{Chunk, ImageSpan, Span};

/// One document to pack: its tokens and images, and the labels every span
/// of it carries.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    /// Token ids.
    pub tokens: &'a [i32],
    /// Its images' positions in `tokens`, in order.
    pub images: &'a [ImageSpan],
    /// Fit or held-out.
    pub split: Split,
    /// Index of its domain.
    pub domain: u16,
    /// Its index in `documents.jsonl` order.
    pub doc: u32,
    /// Index of its group in the corpus index's groups.
    pub group: u32,
}

/// Packs pieces in order; a document may continue into the next chunk (as
/// a span there naming the same document), but never inside one of its
/// images (each at most `n_ctx` positions: the caller refuses longer ones
/// by name). Adjacent tokens of one document share a span.
pub fn pack<'a>(pieces: impl IntoIterator<Item = Piece<'a>>, n_ctx: usize) -> Vec<Chunk> {
    assert!(n_ctx > 0, "n_ctx must be positive");
    let empty = |id| Chunk {
        id: ChunkId(id),
        tokens: Vec::with_capacity(n_ctx),
        spans: Vec::new(),
        images: Vec::new(),
    };
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut cur = empty(0);
    for piece in pieces {
        let Piece {
            tokens,
            images,
            split,
            domain,
            doc,
            group,
        } = piece;
        assert!(
            images.iter().all(|im| im.len as usize <= n_ctx),
            "an image longer than n_ctx reached packing"
        );
        let (mut offset, mut placed) = (0usize, 0usize);
        while offset < tokens.len() {
            let mut end = tokens.len().min(offset + n_ctx - cur.tokens.len());
            // The last image starting before the cut is the only one it can split.
            let last = images[placed..]
                .iter()
                .take_while(|im| (im.start as usize) < end)
                .last();
            if let Some(im) = last.filter(|im| end < (im.start + im.len) as usize) {
                end = im.start as usize;
            }
            let start = cur.tokens.len() as u32;
            if end > offset {
                let take = (end - offset) as u32;
                cur.tokens.extend_from_slice(&tokens[offset..end]);
                match cur.spans.last_mut() {
                    Some(s)
                        if (s.split, s.domain, s.doc, s.group) == (split, domain, doc, group) =>
                    {
                        s.len += take
                    }
                    _ => cur.spans.push(Span {
                        start,
                        len: take,
                        split,
                        domain,
                        doc,
                        group,
                    }),
                }
                while let Some(im) = images
                    .get(placed)
                    .filter(|im| (im.start + im.len) as usize <= end)
                {
                    cur.images.push(ImageSpan {
                        start: start + (im.start as usize - offset) as u32,
                        len: im.len,
                        sha256: im.sha256.clone(),
                    });
                    placed += 1;
                }
            }
            offset = end;
            // Full, or stopped before an image that does not fit.
            if cur.tokens.len() == n_ctx || offset < tokens.len() {
                let next = empty(cur.id.0 + 1);
                chunks.push(std::mem::replace(&mut cur, next));
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
            docs.iter().enumerate().map(|(i, d)| Piece {
                tokens: d.as_slice(),
                images: &[],
                split: if i % 3 == 0 {
                    Split::Heldout
                } else {
                    Split::Fit
                },
                domain: (i % 2) as u16,
                doc: i as u32,
                group: (i / 2) as u32,
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
        // Every position names its document (a document cut at a chunk's
        // end goes on as a span of the same document) and its group.
        let owners: Vec<(u32, u32)> = chunks
            .iter()
            .flat_map(|c| c.spans.iter())
            .flat_map(|s| std::iter::repeat_n((s.doc, s.group), s.len as usize))
            .collect();
        let expected: Vec<(u32, u32)> = docs
            .iter()
            .enumerate()
            .flat_map(|(i, d)| std::iter::repeat_n((i as u32, (i / 2) as u32), d.len()))
            .collect();
        assert_eq!(owners, expected);
        let ends: Vec<usize> = docs
            .iter()
            .scan(0, |at, d| {
                *at += d.len();
                Some(*at)
            })
            .collect();
        let cuts_inside = (1..chunks.len())
            .filter(|k| !ends.contains(&(k * 64)))
            .count();
        let spans: usize = chunks.iter().map(|c| c.spans.len()).sum();
        assert_eq!(
            spans,
            docs.len() + cuts_inside,
            "one span per document per chunk"
        );
    }

    #[test]
    fn an_image_is_never_cut_and_closes_the_chunk_early() {
        let sha = |i: u64| format!("{:08x}{}", i + 1, "0".repeat(56));
        let marker = |i| runfiles::corpus::image_token(&sha(i));
        // Documents of text with images of 6 positions at various offsets.
        let mut docs: Vec<(Vec<i32>, Vec<ImageSpan>)> = Vec::new();
        for d in 0..9u64 {
            let mut tokens: Vec<i32> = (0..(d as i32 * 3 % 7 + 1)).collect();
            let mut images = Vec::new();
            for k in 0..(d % 3 + 1) {
                images.push(ImageSpan {
                    start: tokens.len() as u32,
                    len: 6,
                    sha256: sha(d * 10 + k),
                });
                tokens.extend(std::iter::repeat_n(marker(d * 10 + k), 6));
                tokens.extend(0..(k as i32 + 2));
            }
            docs.push((tokens, images));
        }
        let n_ctx = 10;
        let chunks = pack(
            docs.iter().enumerate().map(|(i, (t, im))| Piece {
                tokens: t.as_slice(),
                images: im.as_slice(),
                split: Split::Fit,
                domain: 0,
                doc: i as u32,
                group: i as u32,
            }),
            n_ctx,
        );
        let flat: Vec<i32> = chunks.iter().flat_map(|c| c.tokens.clone()).collect();
        assert_eq!(
            flat,
            docs.iter().flat_map(|(t, _)| t.clone()).collect::<Vec<_>>()
        );
        let n_images: usize = docs.iter().map(|(_, im)| im.len()).sum();
        assert_eq!(
            chunks.iter().map(|c| c.images.len()).sum::<usize>(),
            n_images
        );
        let mut early = 0;
        for (i, c) in chunks.iter().enumerate() {
            c.validate(1).unwrap();
            assert!(c.images.iter().all(|im| im.len == 6), "no image is cut");
            if i + 1 < chunks.len() && c.tokens.len() < n_ctx {
                early += 1;
                let next = &chunks[i + 1];
                assert!(
                    next.images.first().is_some_and(|im| im.start == 0)
                        && c.tokens.len() + 6 > n_ctx,
                    "chunk {i} is short only because the next image did not fit"
                );
            }
        }
        assert!(early > 0, "the fixture makes some chunk close early");
    }
}
