//! Which positions of a chunk are scored, and in which group.

use numbers::eval::Group;
use numbers::{Modality, Split};
use runfiles::corpus::Chunk;

/// Per position of `chunk`, the group it is scored in, or `None`: a
/// position is scored when its next token lies in the same span (one split
/// and domain, one document run) and is a text token (an image's positions
/// have no token to predict), it is not among the first `skip_first`
/// positions, and its split is one of `splits`. A position is
/// image-conditioned ([`Modality::Image`]) when its context holds an image
/// of the chunk: the last position of the chunk's first image and every
/// later one.
pub fn scored_positions(chunk: &Chunk, skip_first: u32, splits: &[Split]) -> Vec<Option<Group>> {
    let n = chunk.tokens.len();
    let mut is_image = vec![false; n];
    for im in &chunk.images {
        is_image[im.start as usize..(im.start + im.len) as usize].fill(true);
    }
    let first_image = chunk.images.first().map_or(n, |im| im.start as usize);
    let mut out = vec![None; n];
    for span in &chunk.spans {
        if !splits.contains(&span.split) {
            continue;
        }
        let end = span.start + span.len;
        for pos in span.start.max(skip_first)..end.saturating_sub(1) {
            let pos = pos as usize;
            if is_image[pos + 1] {
                continue;
            }
            let modality = match pos >= first_image {
                true => Modality::Image,
                false => Modality::Text,
            };
            out[pos] = Some(Group {
                split: span.split,
                domain: span.domain,
                modality,
            });
        }
    }
    out
}

/// The cluster of position `pos` of `chunk`: the unit the summary's
/// intervals cluster by ([`numbers::eval::CellKey`]), the corpus group of
/// the span holding it ([`runfiles::corpus::Span::group`]: the unit the
/// held-out split samples; one per document without a group key).
/// `u32::MAX` for a position outside every span, which is never scored.
pub fn cluster_of(chunk: &Chunk, pos: usize) -> u32 {
    chunk
        .spans
        .iter()
        .find(|s| (s.start as usize..(s.start + s.len) as usize).contains(&pos))
        .map_or(u32::MAX, |s| s.group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::ChunkId;
    use runfiles::corpus::Span;

    fn chunk() -> Chunk {
        let span = |start, len, split, domain| Span {
            start,
            len,
            split,
            domain,
            doc: start,
            group: start,
        };
        Chunk {
            id: ChunkId(0),
            tokens: vec![1; 10],
            spans: vec![
                span(0, 4, Split::Fit, 0),
                span(4, 1, Split::Heldout, 1),
                span(5, 5, Split::Fit, 0),
            ],
            images: Vec::new(),
        }
    }

    #[test]
    fn the_last_position_of_each_span_is_not_scored() {
        let fit = Some(Group::text(Split::Fit, 0));
        let s = scored_positions(&chunk(), 0, &Split::ALL);
        assert_eq!(s, vec![fit, fit, fit, None, None, fit, fit, fit, fit, None]);
    }

    #[test]
    fn skip_first_and_splits_filter_positions() {
        let s = scored_positions(&chunk(), 6, &Split::ALL);
        assert_eq!(s.iter().filter(|g| g.is_some()).count(), 3);
        let s = scored_positions(&chunk(), 0, &[Split::Heldout]);
        assert!(s.iter().all(|g| g.is_none()));
    }

    #[test]
    fn positions_after_an_image_are_image_conditioned_and_none_predicts_an_image() {
        let mut c = chunk();
        // Positions 6..8 of the last span are an image.
        c.images.push(runfiles::corpus::ImageSpan {
            start: 6,
            len: 2,
            sha256: "ab".into(),
        });
        let fit = |modality| {
            Some(Group {
                modality,
                ..Group::text(Split::Fit, 0)
            })
        };
        let (t, i) = (fit(Modality::Text), fit(Modality::Image));
        let s = scored_positions(&c, 0, &Split::ALL);
        // 5 predicts the image's first position and 6 its second: unscored;
        // 7 (the image's last) predicts text after it.
        assert_eq!(s, vec![t, t, t, None, None, None, None, i, i, None]);
    }

    #[test]
    fn a_position_clusters_by_its_spans_group() {
        let mut c = chunk();
        for (s, group) in c.spans.iter_mut().zip([7, 3, 7]) {
            s.group = group;
        }
        let got: Vec<u32> = (0..10).map(|p| cluster_of(&c, p)).collect();
        assert_eq!(got, [7, 7, 7, 7, 3, 7, 7, 7, 7, 7]);
        assert_eq!(cluster_of(&c, 10), u32::MAX);
    }
}
