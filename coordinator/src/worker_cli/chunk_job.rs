//! What the one-process commands (`worker collect`, `worker eval`) share:
//! their flags for the model, the corpus, the chunk range, the output and
//! how llama.cpp runs, and opening the range they name.

use super::offload::OffloadArgs;
use numbers::ChunkRange;
use runfiles::corpus::{Chunk, CorpusIndex};
use std::path::PathBuf;
use tokio::runtime::Runtime;
use worker::corpus::load_chunks;
use worker::WorkerError;

/// The flags of one chunk range run in this process.
#[derive(clap::Args, Debug)]
pub struct ChunkJobArgs {
    /// GGUF model file (for `eval`, the base model).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Tokenized corpus: a run location or its `corpus/` (path or URL).
    #[arg(long)]
    pub corpus: String,
    /// Chunk ids, `A..B` (half-open) or `A..=B`.
    #[arg(long)]
    pub chunks: String,
    /// Output location (path or URL): `partials/`, `trace/` and the
    /// results for `collect`, `eval/` for `eval`.
    #[arg(long)]
    pub out: String,
    /// Tokens per micro-batch (at least 1).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_ubatch: u32,
    /// Where the model's weights live (`--ngl`, `--cpu-moe`, `--n-cpu-moe`).
    #[command(flatten)]
    pub offload: OffloadArgs,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// f32 KV cache (tight oracle comparisons).
    #[arg(long)]
    pub f32_kv: bool,
    /// Enable flash attention.
    #[arg(long)]
    pub flash_attn: bool,
}

impl ChunkJobArgs {
    /// Parses `--chunks` and reads its chunks from `--corpus`: the async
    /// runtime that reads the store, the range, the corpus index and the
    /// range's chunks (checked against the index).
    pub fn open(&self) -> Result<(Runtime, ChunkRange, CorpusIndex, Vec<Chunk>), WorkerError> {
        let range = ChunkRange::parse(&self.chunks).map_err(|reason| WorkerError::Arg {
            flag: "--chunks",
            reason,
        })?;
        let rt = Runtime::new().map_err(WorkerError::Runtime)?;
        let (index, chunks) = rt.block_on(load_chunks(&self.corpus, range))?;
        Ok((rt, range, index, chunks))
    }
}
