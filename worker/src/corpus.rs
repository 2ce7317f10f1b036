//! Reading a tokenized corpus for the one-process commands (`worker collect`,
//! `worker eval`): the index and one chunk range, with errors naming the
//! location and the range.

use crate::error::WorkerError;
use numbers::ChunkRange;
use runfiles::corpus::{read_chunks, refuse_images, Chunk, CorpusIndex, CHUNKS_FILE, INDEX_FILE};
use runfiles::store::RunStore;

/// Finds the corpus: `LOCATION/index.json` or `LOCATION/corpus/index.json`.
pub async fn open_corpus(location: &str) -> Result<(RunStore, CorpusIndex), WorkerError> {
    let root = RunStore::open(location)?;
    for store in [root.clone(), root.child("corpus")] {
        if let Some(index) = CorpusIndex::read_opt(&store).await? {
            return Ok((store, index));
        }
    }
    Err(WorkerError::Corpus {
        location: location.to_string(),
        reason: format!("no {INDEX_FILE} there or under corpus/ (run `coordinator corpus` first)"),
    })
}

/// The corpus index at `location` and the chunks of `range`, checked
/// against the index.
pub async fn load_chunks(
    location: &str,
    range: ChunkRange,
) -> Result<(CorpusIndex, Vec<Chunk>), WorkerError> {
    let (corpus, index) = open_corpus(location).await?;
    index
        .check_range(range)
        .map_err(|reason| WorkerError::Corpus {
            location: corpus.url().to_string(),
            reason,
        })?;
    let bytes = corpus.get(CHUNKS_FILE).await?;
    let chunks_file = |reason| WorkerError::CorpusFile {
        url: corpus.url_of(CHUNKS_FILE),
        reason,
    };
    let chunks = read_chunks(bytes, Some(range)).map_err(chunks_file)?;
    refuse_images(
        &chunks,
        "a one-process worker command (use `coordinator run`)",
    )
    .map_err(chunks_file)?;
    Ok((index, chunks))
}
