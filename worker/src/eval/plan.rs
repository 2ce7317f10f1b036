//! The micro-batches of an evaluation run, with their scored rows, and the
//! groups of consecutive micro-batches that every model decodes in turn.

use super::positions::scored_positions;
use super::rows::ScoredRow;
use crate::images::{self, Embeddings};
use llama::Input;
use numbers::eval::Group;
use numbers::Split;
use runfiles::corpus::{Chunk, ImageSpan};
use std::ops::Range;

/// One micro-batch of a chunk and the rows of it that are scored.
pub(super) struct Ubatch<'c> {
    /// Index of its chunk in the run's chunks.
    pub chunk_index: usize,
    /// Its chunk.
    pub chunk: &'c Chunk,
    /// Position of its first token in the chunk.
    pub pos0: usize,
    /// Its tokens (an image's marker tokens in an image micro-batch).
    pub tokens: &'c [i32],
    /// The image whose positions it decodes, or `None` for text.
    pub image: Option<&'c ImageSpan>,
    /// Its scored rows, in row order.
    pub rows: Vec<ScoredRow>,
    /// The group of each scored row.
    pub groups: Vec<Group>,
}

impl<'c> Ubatch<'c> {
    /// Whether it is the last micro-batch of its chunk.
    pub fn ends_chunk(&self) -> bool {
        self.pos0 + self.tokens.len() == self.chunk.tokens.len()
    }

    /// What a model decodes for it: its tokens, or its image's embedding
    /// rows from `embeddings`.
    pub fn input<'a>(&self, embeddings: &'a Embeddings) -> Input<'a>
    where
        'c: 'a,
    {
        let range = self.pos0..self.pos0 + self.tokens.len();
        images::input(self.chunk, range, self.image, embeddings)
    }
}

/// The micro-batches of `chunks`, `step` tokens each (at least 1), in chunk
/// and position order; a chunk is first cut at its images' edges
/// ([`images::pieces`]: a text chunk is one piece), so a micro-batch is
/// text or one image's positions. A scored position whose next token is
/// outside the vocabulary is refused by `outside` (chunk, position of that
/// token).
pub(super) fn ubatches<'c, E>(
    chunks: &'c [Chunk],
    step: usize,
    skip_first: u32,
    splits: &[Split],
    n_vocab: usize,
    outside: impl Fn(&Chunk, usize) -> E,
) -> Result<Vec<Ubatch<'c>>, E> {
    let mut out = Vec::new();
    for (chunk_index, chunk) in chunks.iter().enumerate() {
        let scored = scored_positions(chunk, skip_first, splits);
        let runs = images::pieces(chunk).into_iter().flat_map(|piece| {
            let piece_tokens = &chunk.tokens[piece.start..piece.start + piece.len];
            piece_tokens
                .chunks(step)
                .enumerate()
                .map(move |(u, tokens)| (piece.start + u * step, tokens, piece.image))
        });
        for (pos0, tokens, image) in runs {
            let mut rows = Vec::new();
            let mut groups = Vec::new();
            for r in 0..tokens.len() {
                let Some(group) = scored[pos0 + r] else {
                    continue;
                };
                let next = usize::try_from(chunk.tokens[pos0 + r + 1])
                    .ok()
                    .filter(|&n| n < n_vocab)
                    .ok_or_else(|| outside(chunk, pos0 + r + 1))?;
                rows.push(ScoredRow { row: r, next });
                groups.push(group);
            }
            out.push(Ubatch {
                chunk_index,
                chunk,
                pos0,
                tokens,
                image,
                rows,
                groups,
            });
        }
    }
    Ok(out)
}

/// `ubatches` without each chunk's micro-batches after its last scored row
/// (a chunk with none loses them all): a causal model's logits at a scored
/// row do not depend on later positions, so the figures are the same and
/// the forward passes nothing reads are not made (llama-perplexity decodes
/// no chunk it does not score either).
pub(super) fn without_unscored_tails(ubatches: Vec<Ubatch<'_>>) -> Vec<Ubatch<'_>> {
    let mut keep = vec![false; ubatches.len()];
    let mut live = None;
    for (i, u) in ubatches.iter().enumerate().rev() {
        if !u.rows.is_empty() {
            live = Some(u.chunk_index);
        }
        keep[i] = live == Some(u.chunk_index);
    }
    ubatches
        .into_iter()
        .zip(keep)
        .filter_map(|(u, k)| k.then_some(u))
        .collect()
}

/// Cuts `ubatches` into runs of consecutive micro-batches with at most
/// `max_rows` scored rows in all; a micro-batch with more is a run alone.
pub(super) fn groups(ubatches: &[Ubatch<'_>], max_rows: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut rows) = (0, 0);
    for (i, u) in ubatches.iter().enumerate() {
        if i > start && rows + u.rows.len() > max_rows {
            out.push(start..i);
            (start, rows) = (i, 0);
        }
        rows += u.rows.len();
    }
    if start < ubatches.len() {
        out.push(start..ubatches.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::ChunkId;
    use runfiles::corpus::Span;

    fn chunk(id: u32, len: u32) -> Chunk {
        Chunk {
            id: ChunkId(id),
            tokens: (0..len as i32).collect(),
            spans: vec![Span {
                start: 0,
                len,
                split: Split::Fit,
                domain: 0,
                doc: id,
                group: id,
            }],
            images: Vec::new(),
        }
    }

    #[test]
    fn micro_batches_cover_every_chunk_in_order_with_their_scored_rows() {
        let chunks = [chunk(3, 10), chunk(5, 4)];
        let u = ubatches(&chunks, 4, 2, &Split::ALL, 100, |_, p| p).unwrap();
        let shape: Vec<_> = u
            .iter()
            .map(|u| {
                (
                    u.chunk_index,
                    u.pos0,
                    u.tokens.len(),
                    u.rows.len(),
                    u.ends_chunk(),
                )
            })
            .collect();
        // Chunk 3: rows 2..9 scored (the span's last position is not);
        // chunk 5: rows 2..3.
        assert_eq!(
            shape,
            [
                (0, 0, 4, 2, false),
                (0, 4, 4, 4, false),
                (0, 8, 2, 1, true),
                (1, 0, 4, 1, true)
            ]
        );
        assert_eq!(u[1].rows[0].row, 0);
        assert_eq!(u[1].rows[0].next, 5);
        let refused = ubatches(&chunks, 4, 0, &Split::ALL, 5, |c, p| (c.id.0, p));
        assert_eq!(refused.err(), Some((3, 5)));
    }

    #[test]
    fn micro_batches_stop_at_image_edges() {
        let mut c = chunk(3, 10);
        c.images.push(ImageSpan {
            start: 3,
            len: 4,
            sha256: "ab".into(),
        });
        let chunks = [c];
        let u = ubatches(&chunks, 3, 0, &Split::ALL, 100, |_, p| p).unwrap();
        let shape: Vec<_> = u
            .iter()
            .map(|u| (u.pos0, u.tokens.len(), u.image.is_some(), u.rows.len()))
            .collect();
        // Text 0..3 (row 2 predicts the image: unscored), the image 3..7 in
        // two micro-batches (only its last position is scored), text 7..10.
        assert_eq!(
            shape,
            [
                (0, 3, false, 2),
                (3, 3, true, 0),
                (6, 1, true, 1),
                (7, 3, false, 2)
            ]
        );
        assert_eq!(u[2].groups[0].modality, numbers::Modality::Image);
        assert_eq!(u[0].groups[0].modality, numbers::Modality::Text);
    }

    #[test]
    fn micro_batches_after_a_chunks_last_scored_row_are_not_decoded() {
        let mut held = chunk(0, 8);
        held.spans[0].split = Split::Heldout;
        let mut mixed = chunk(1, 12);
        mixed.spans = vec![
            Span {
                start: 0,
                len: 6,
                split: Split::Fit,
                domain: 0,
                doc: 0,
                group: 0,
            },
            Span {
                start: 6,
                len: 6,
                split: Split::Heldout,
                domain: 0,
                doc: 1,
                group: 1,
            },
        ];
        let chunks = [held, mixed, chunk(2, 4)];
        let all = ubatches(&chunks, 4, 0, &[Split::Fit], 100, |_, p| p).unwrap();
        let shape = |u: &[Ubatch<'_>]| -> Vec<(usize, usize, usize)> {
            u.iter()
                .map(|u| (u.chunk_index, u.pos0, u.rows.len()))
                .collect()
        };
        assert_eq!(
            shape(&all),
            [
                (0, 0, 0),
                (0, 4, 0),
                (1, 0, 4),
                (1, 4, 1),
                (1, 8, 0),
                (2, 0, 3)
            ]
        );
        // The held-out chunk goes whole, the mixed one after its fit rows;
        // every scored row stays, each chunk still starts at position 0.
        let kept = without_unscored_tails(all);
        assert_eq!(shape(&kept), [(1, 0, 4), (1, 4, 1), (2, 0, 3)]);
    }

    #[test]
    fn groups_hold_at_most_max_rows_or_one_micro_batch() {
        let chunks = [chunk(0, 10), chunk(1, 4)];
        let u = ubatches(&chunks, 4, 2, &Split::ALL, 100, |_, p| p).unwrap();
        // Scored rows per micro-batch: 2, 4, 1, 1.
        assert_eq!(groups(&u, 100), vec![Range { start: 0, end: 4 }]);
        assert_eq!(groups(&u, 6), [0..2, 2..4]);
        assert_eq!(groups(&u, 3), [0..1, 1..2, 2..4]);
        assert_eq!(groups(&u, 0), [0..1, 1..2, 2..3, 3..4]);
        assert!(groups(&[], 5).is_empty());
    }
}
