//! Which positions of each chunk an evaluation scores, and in which group:
//! the chunks' spans and images, read once from the run's chunk table, so
//! eval acceptance bounds every per-position figure by the lease's chunks
//! (a position a worker scored must be one the chunk has, in the group its
//! span says, and every such position must be scored).
//!
//! The rule is the worker's (`worker::eval::scored_positions`): a position
//! is scored when its next token is a text token of the same span, it is
//! not among the first `skip_first`, and its span's split is evaluated; it
//! is image-conditioned from the last position of the chunk's first image.

use super::EvalRunError;
use numbers::eval::{Group, TokenKl};
use numbers::peer_text::peer_text;
use numbers::{Modality, Split};
use runfiles::corpus::{Chunk, CorpusIndex, CHUNKS_FILE};
use runfiles::store::RunStore;

/// One span of a chunk: positions `start..end` of one split and domain.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SpanOf {
    start: u32,
    end: u32,
    split: Split,
    domain: u16,
    /// The corpus group the span's document belongs to: the cluster its
    /// positions' figures are summed in.
    group: u32,
}

/// What decides a chunk's scored positions.
#[derive(Clone, Debug, Default, PartialEq)]
struct Layout {
    spans: Vec<SpanOf>,
    /// Image positions, `start..end` each.
    images: Vec<(u32, u32)>,
}

impl Layout {
    fn of(c: &Chunk) -> Layout {
        Layout {
            spans: c
                .spans
                .iter()
                .map(|s| SpanOf {
                    start: s.start,
                    end: s.start.saturating_add(s.len),
                    split: s.split,
                    domain: s.domain,
                    group: s.group,
                })
                .collect(),
            images: c
                .images
                .iter()
                .map(|im| (im.start, im.start.saturating_add(im.len)))
                .collect(),
        }
    }

    fn is_image(&self, pos: u32) -> bool {
        self.images.iter().any(|&(s, e)| (s..e).contains(&pos))
    }

    /// The group position `pos` is scored in, or why it is not scored.
    fn group_at(&self, pos: u32, skip_first: u32, splits: &[Split]) -> Result<Group, String> {
        let Some(span) = self.spans.iter().find(|s| (s.start..s.end).contains(&pos)) else {
            return Err("past the chunk's last token".into());
        };
        if pos < skip_first {
            return Err(format!(
                "among the first {skip_first}, which are not scored"
            ));
        }
        if pos + 1 >= span.end {
            return Err("the last of its span (its next token is another span's)".into());
        }
        if !splits.contains(&span.split) {
            return Err(format!(
                "in the {} split, which is not evaluated",
                span.split
            ));
        }
        if self.is_image(pos + 1) {
            return Err("followed by an image position".into());
        }
        let first_image = self.images.first().map_or(u32::MAX, |&(s, _)| s);
        Ok(Group {
            split: span.split,
            domain: span.domain,
            modality: match pos >= first_image {
                true => Modality::Image,
                false => Modality::Text,
            },
        })
    }

    /// The cluster (corpus group) of the span holding `pos`.
    fn cluster_at(&self, pos: u32) -> Option<u32> {
        self.spans
            .iter()
            .find(|s| (s.start..s.end).contains(&pos))
            .map(|s| s.group)
    }

    /// How many positions are scored.
    fn n_scored(&self, skip_first: u32, splits: &[Split]) -> u64 {
        self.spans
            .iter()
            .flat_map(|s| s.start..s.end)
            .filter(|&pos| self.group_at(pos, skip_first, splits).is_ok())
            .count() as u64
    }
}

/// The scored positions of every chunk of a corpus.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scoreable {
    /// By chunk id.
    chunks: Vec<Layout>,
    /// The corpus's domain names (errors name them).
    domains: Vec<String>,
}

impl Scoreable {
    /// The layouts of `chunks` (ids `0..`, in order) of a corpus with
    /// `domains`.
    pub fn of(chunks: &[Chunk], domains: &[String]) -> Result<Scoreable, String> {
        if let Some((i, c)) = chunks
            .iter()
            .enumerate()
            .find(|(i, c)| c.id.0 as usize != *i)
        {
            return Err(format!("chunk {} is listed at place {i}", c.id));
        }
        Ok(Scoreable {
            chunks: chunks.iter().map(Layout::of).collect(),
            domains: domains.to_vec(),
        })
    }

    /// The layouts of the run's chunk table (`corpus/chunks.parquet`).
    pub async fn read(store: &RunStore, index: &CorpusIndex) -> Result<Scoreable, EvalRunError> {
        let corpus = store.child("corpus");
        let table = corpus.get(CHUNKS_FILE).await?;
        let what = corpus.url_of(CHUNKS_FILE);
        let domains = index.domains.clone();
        tokio::task::spawn_blocking(move || {
            let chunks = runfiles::corpus::read_chunks(table, None)?;
            Scoreable::of(&chunks, &domains)
        })
        .await
        .map_err(|e| EvalRunError::Setup(format!("reading {what} panicked: {e}")))?
        .map_err(|e| EvalRunError::Setup(format!("{what}: {e}")))
    }

    fn domain(&self, d: u16) -> String {
        match self.domains.get(usize::from(d)) {
            Some(name) => format!("domain {d} ({})", peer_text(name)),
            None => format!("domain {d} (not a domain of the corpus)"),
        }
    }

    /// Whether the per-position figure `t` is of a position its chunk
    /// scores (with `skip_first` and `splits`), in the group it names.
    pub fn check_position(
        &self,
        t: &TokenKl,
        skip_first: u32,
        splits: &[Split],
    ) -> Result<(), String> {
        let at = format!("position {} of chunk {}", t.pos, t.chunk);
        let layout = self
            .chunks
            .get(t.chunk as usize)
            .ok_or_else(|| format!("{at}: the corpus has {} chunks", self.chunks.len()))?;
        let want = layout
            .group_at(t.pos, skip_first, splits)
            .map_err(|why| format!("{at} is not scored: it is {why}"))?;
        if (t.group.split, t.group.domain) != (want.split, want.domain) {
            return Err(format!(
                "{at} is scored in {} {}, the chunk holds {} {} there",
                t.group.split,
                self.domain(t.group.domain),
                want.split,
                self.domain(want.domain)
            ));
        }
        if t.group.modality != want.modality {
            return Err(format!(
                "{at} is scored as {:?}, it is {:?}",
                t.group.modality, want.modality
            ));
        }
        // The cluster decides the intervals' width: a worker may not move a
        // position into another group's cluster.
        let cluster = layout.cluster_at(t.pos);
        if cluster != Some(t.cluster) {
            return Err(format!(
                "{at} is summed in cluster {}, its span's corpus group is {}",
                t.cluster,
                cluster.map_or("none".to_string(), |g| g.to_string())
            ));
        }
        Ok(())
    }

    /// A corpus of text chunks of `lens` tokens, each one fit span of
    /// domain 0 (tests of acceptance).
    #[cfg(test)]
    pub(crate) fn one_span_each(lens: &[u32], domains: &[String]) -> Scoreable {
        let layout = |&len: &u32| Layout {
            spans: vec![SpanOf {
                start: 0,
                end: len,
                split: Split::Fit,
                domain: 0,
                group: 0,
            }],
            images: Vec::new(),
        };
        Scoreable {
            chunks: lens.iter().map(layout).collect(),
            domains: domains.to_vec(),
        }
    }

    /// Positions of `chunk` scored with `skip_first` and `splits`.
    pub fn n_scored(&self, chunk: u32, skip_first: u32, splits: &[Split]) -> u64 {
        self.chunks
            .get(chunk as usize)
            .map_or(0, |l| l.n_scored(skip_first, splits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::ChunkId;

    /// A chunk of 10 tokens: fit domain 0 (0..4), held-out domain 1 (4..5),
    /// fit domain 0 (5..10) with an image at 7..8.
    fn scoreable() -> Scoreable {
        Scoreable {
            chunks: vec![Layout {
                spans: vec![
                    SpanOf {
                        start: 0,
                        end: 4,
                        split: Split::Fit,
                        domain: 0,
                        group: 0,
                    },
                    SpanOf {
                        start: 4,
                        end: 5,
                        split: Split::Heldout,
                        domain: 1,
                        group: 1,
                    },
                    SpanOf {
                        start: 5,
                        end: 10,
                        split: Split::Fit,
                        domain: 0,
                        group: 0,
                    },
                ],
                images: vec![(7, 8)],
            }],
            domains: vec!["en".into(), "code".into()],
        }
    }

    fn token(pos: u32, domain: u16, modality: Modality) -> TokenKl {
        TokenKl {
            chunk: 0,
            pos,
            cluster: 0,
            group: Group {
                split: Split::Fit,
                domain,
                modality,
            },
            kl: 0.1,
        }
    }

    #[test]
    fn a_position_summed_in_another_groups_cluster_is_refused() {
        let mut t = token(2, 0, Modality::Text);
        t.cluster = 1;
        let e = scoreable().check_position(&t, 0, &Split::ALL).unwrap_err();
        assert!(e.contains("cluster 1, its span's corpus group is 0"), "{e}");
    }

    #[test]
    fn the_workers_positions_pass_and_are_counted() {
        let s = scoreable();
        // Scored: 0, 1, 2 (text), 5 (text; 6 is followed by the image),
        // 7 and 8 (image-conditioned); not 3, 4, 6, 9.
        for (pos, m) in [
            (0, Modality::Text),
            (2, Modality::Text),
            (5, Modality::Text),
            (7, Modality::Image),
            (8, Modality::Image),
        ] {
            s.check_position(&token(pos, 0, m), 0, &Split::ALL).unwrap();
        }
        assert_eq!(s.n_scored(0, 0, &Split::ALL), 6);
        assert_eq!(s.n_scored(0, 2, &[Split::Fit]), 4);
        assert_eq!(s.n_scored(1, 0, &Split::ALL), 0);
    }

    #[test]
    fn positions_the_chunk_does_not_score_are_refused_by_name() {
        let s = scoreable();
        let cases = [
            (token(3, 0, Modality::Text), "the last of its span"),
            (token(6, 0, Modality::Text), "followed by an image"),
            (token(40, 0, Modality::Text), "past the chunk's last token"),
            (token(1, 0, Modality::Text), "among the first 2"),
            (
                token(2, 7, Modality::Text),
                "domain 7 (not a domain of the corpus), the chunk holds",
            ),
            (token(2, 0, Modality::Image), "scored as Image"),
            (
                TokenKl {
                    chunk: 5,
                    ..token(1, 0, Modality::Text)
                },
                "the corpus has 1 chunks",
            ),
        ];
        for (t, what) in cases {
            let e = s.check_position(&t, 2, &Split::ALL).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let held = TokenKl {
            group: Group::text(Split::Heldout, 1),
            ..token(4, 1, Modality::Text)
        };
        let e = s.check_position(&held, 0, &[Split::Fit]).unwrap_err();
        assert!(e.contains("the last of its span"), "{e}");
    }

    #[test]
    fn chunks_out_of_order_are_refused() {
        let c = Chunk {
            id: ChunkId(1),
            tokens: vec![1; 4],
            spans: Vec::new(),
            images: Vec::new(),
        };
        assert!(Scoreable::of(&[c], &[]).unwrap_err().contains("chunk 1"));
    }
}
