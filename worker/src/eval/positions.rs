//! Which positions of a chunk are scored.

use common::corpus::Chunk;
use common::eval::Group;
use common::Split;

/// Per position of `chunk`, the group it is scored in, or `None`: a
/// position is scored when its next token lies in the same span (one split
/// and domain, one document run), it is not among the first `skip_first`
/// positions, and its split is one of `splits`.
pub fn scored_positions(chunk: &Chunk, skip_first: u32, splits: &[Split]) -> Vec<Option<Group>> {
    let mut out = vec![None; chunk.tokens.len()];
    for span in &chunk.spans {
        if !splits.contains(&span.split) {
            continue;
        }
        let group = Group {
            split: span.split,
            domain: span.domain,
        };
        let end = span.start + span.len;
        for pos in span.start.max(skip_first)..end.saturating_sub(1) {
            out[pos as usize] = Some(group);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::corpus::Span;
    use common::ChunkId;

    fn chunk() -> Chunk {
        let span = |start, len, split, domain| Span {
            start,
            len,
            split,
            domain,
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
        let fit = Some(Group {
            split: Split::Fit,
            domain: 0,
        });
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
}
