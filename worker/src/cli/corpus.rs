//! Reading a tokenized corpus for the one-process commands (`worker collect`,
//! `worker eval`): the index and one chunk range, with errors naming the
//! location and the range.

use anyhow::Context;
use common::corpus::{read_chunks, refuse_images, Chunk, CorpusIndex, CHUNKS_FILE, INDEX_FILE};
use common::store::RunStore;
use common::ChunkRange;

/// Finds the corpus: `LOCATION/index.json` or `LOCATION/corpus/index.json`.
pub async fn open_corpus(location: &str) -> anyhow::Result<(RunStore, CorpusIndex)> {
    let root = RunStore::open(location)?;
    for store in [root.clone(), root.child("corpus")] {
        if let Some(bytes) = store.get_opt(INDEX_FILE).await? {
            let index: CorpusIndex = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not a corpus index", store.url_of(INDEX_FILE)))?;
            return Ok((store, index));
        }
    }
    anyhow::bail!("corpus {location}: no {INDEX_FILE} there or under corpus/ (run `coordinator corpus` first)")
}

/// The corpus index at `location` and the chunks of `range`, checked
/// against the index.
pub async fn load_chunks(
    location: &str,
    range: ChunkRange,
) -> anyhow::Result<(CorpusIndex, Vec<Chunk>)> {
    let (corpus, index) = open_corpus(location).await?;
    index
        .check_range(range)
        .map_err(|e| anyhow::anyhow!("corpus {}: {e}", corpus.url()))?;
    let bytes = corpus.get(CHUNKS_FILE).await?;
    let chunks = read_chunks(bytes, Some(range))
        .map_err(|e| anyhow::anyhow!("{}: {e}", corpus.url_of(CHUNKS_FILE)))?;
    refuse_images(
        &chunks,
        "a one-process worker command (use `coordinator run`)",
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", corpus.url_of(CHUNKS_FILE)))?;
    Ok((index, chunks))
}
