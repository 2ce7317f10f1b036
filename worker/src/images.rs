//! The images of a lease's chunks, fed alike by collection and evaluation:
//! their bytes as fetched ([`ImageBytes`]), their embeddings through the
//! model's mmproj (each image encoded once per lease, [`encode`]), and a
//! chunk cut at their edges into runs decoded alike ([`pieces`]).

use crate::error::WorkerError;
use llama::{ImageEmbedding, Input, Vision};
use runfiles::corpus::{Chunk, CorpusIndex, ImageSpan};
use std::collections::BTreeMap;

/// The bytes of the images a lease's chunks carry, by SHA-256 (hex).
pub type ImageBytes = BTreeMap<String, bytes::Bytes>;

/// The embeddings of a lease's images, by SHA-256 (hex).
pub type Embeddings = BTreeMap<String, ImageEmbedding>;

/// The embeddings of every image `chunks` carry, each image encoded once
/// with `vision` from its bytes in `images` (whose hash is checked): an
/// image must take the positions its span says. Text chunks need no
/// `vision`.
pub fn encode(
    mut vision: Option<&mut Vision>,
    index: &CorpusIndex,
    chunks: &[Chunk],
    images: &ImageBytes,
) -> Result<Embeddings, WorkerError> {
    let mut out = Embeddings::new();
    for (chunk, im) in chunks
        .iter()
        .flat_map(|c| c.images.iter().map(move |im| (c, im)))
    {
        let fail = |reason: String| WorkerError::Corpus {
            location: format!("chunks of {}", index.chunks_sha256),
            reason: format!("chunk {}: image {}: {reason}", chunk.id, im.sha256),
        };
        if !out.contains_key(&im.sha256) {
            let vision = vision.as_deref_mut().ok_or_else(|| {
                fail("the worker has no mmproj loaded, so it cannot read images".into())
            })?;
            let bytes = images
                .get(&im.sha256)
                .ok_or_else(|| fail("its bytes were not fetched".into()))?;
            if gguf::hash::sha256_hex(bytes) != im.sha256 {
                return Err(fail("its bytes have another SHA-256".into()));
            }
            out.insert(im.sha256.clone(), vision.encode(bytes)?);
        }
        let n = out[&im.sha256].n_tokens;
        if n != im.len as usize {
            return Err(fail(format!(
                "the mmproj encodes it into {n} positions, but the chunk gives it {} (was \
                 the corpus prepared with another mmproj?)",
                im.len
            )));
        }
    }
    Ok(out)
}

/// A run of a chunk's positions decoded alike: text tokens, or one image.
pub struct Piece<'a> {
    /// Its first position in the chunk.
    pub start: usize,
    /// Its positions.
    pub len: usize,
    /// The image it is, or `None` for text.
    pub image: Option<&'a ImageSpan>,
}

/// The chunk cut at its images' edges: text runs and images in position
/// order (a text chunk is one piece, so its micro-batches are unchanged).
pub fn pieces(chunk: &Chunk) -> Vec<Piece<'_>> {
    let mut out = Vec::with_capacity(2 * chunk.images.len() + 1);
    let mut at = 0;
    for im in &chunk.images {
        let (start, len) = (im.start as usize, im.len as usize);
        if start > at {
            out.push(Piece {
                start: at,
                len: start - at,
                image: None,
            });
        }
        out.push(Piece {
            start,
            len,
            image: Some(im),
        });
        at = start + len;
    }
    if at < chunk.tokens.len() || out.is_empty() {
        out.push(Piece {
            start: at,
            len: chunk.tokens.len() - at,
            image: None,
        });
    }
    out
}

/// What the positions `range` of `chunk` decode: its tokens, or the rows of
/// its image's embedding when the range lies in image `image` (from
/// `embeddings`, which [`encode`] filled for the chunk).
pub fn input<'a>(
    chunk: &'a Chunk,
    range: std::ops::Range<usize>,
    image: Option<&ImageSpan>,
    embeddings: &'a Embeddings,
) -> Input<'a> {
    match image {
        None => Input::Tokens(&chunk.tokens[range]),
        Some(im) => {
            let e = &embeddings[&im.sha256];
            let offset = range.start - im.start as usize;
            let rows = &e.values[offset * e.n_embd..(offset + range.len()) * e.n_embd];
            Input::Embd(rows, e.n_embd)
        }
    }
}
