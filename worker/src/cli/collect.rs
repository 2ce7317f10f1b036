//! `worker collect`: one process, no network: measure a chunk range of a
//! tokenized corpus and write its partial, trace part and results.

use super::corpus::load_chunks;
use crate::collect::device::Reduce;
use crate::collect::{trace_part_name, write_trace_part, CollectOptions, Collector};
use crate::error::WorkerError;
use common::store::RunStore;
use common::ChunkRange;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// Arguments of `worker collect`.
#[derive(clap::Args, Debug)]
pub struct CollectArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Tokenized corpus: a run location or its `corpus/` (path or URL).
    #[arg(long)]
    corpus: String,
    /// Chunk ids to measure, `A..B` (half-open) or `A..=B`.
    #[arg(long)]
    chunks: String,
    /// Output location (path or URL) for partials/, trace/ and the results.
    #[arg(long)]
    out: String,
    /// Tokens per micro-batch (at least 1).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    n_ubatch: u32,
    /// Layers offloaded to the GPU (`-ngl`).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", default_value_t = 0)]
    n_gpu_layers: u32,
    /// CPU threads (default: all cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Trace every n-th chunk (0: no trace); with `--trace-every-heldout`,
    /// fit tokens only.
    #[arg(long, default_value_t = 1)]
    trace_every: u32,
    /// Trace the held-out tokens of every n-th chunk (0: none; default:
    /// `--trace-every`), so each split can get its own trace budget.
    #[arg(long)]
    trace_every_heldout: Option<u32>,
    /// Router top-N recorded per traced token and layer.
    #[arg(long, default_value_t = 64)]
    trace_top_n: usize,
    /// Decode traces: tokens generated greedily from each held-out prompt of a traced chunk (0: none).
    #[arg(long, default_value_t = 0)]
    decode_tokens: usize,
    /// Decode traces: prompt length taken from each held-out span (at least 1).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    decode_prompt: u64,
    /// f32 KV cache (tight oracle comparisons).
    #[arg(long)]
    f32_kv: bool,
    /// Enable flash attention.
    #[arg(long)]
    flash_attn: bool,
    /// Where observed tensors are reduced: `device` (on their backend; only
    /// results are copied to the host), `host` (the reference path), or
    /// `auto` (device when layers are offloaded to a GPU). Default:
    /// $MOE_CENSUS_REDUCE, else auto.
    #[arg(long, value_enum)]
    reduce: Option<Reduce>,
}

/// Entry point of `worker collect`.
pub fn run(a: CollectArgs) -> Result<(), WorkerError> {
    let range = ChunkRange::parse(&a.chunks).map_err(|reason| WorkerError::Arg {
        flag: "--chunks",
        reason,
    })?;
    let rt = tokio::runtime::Runtime::new().map_err(WorkerError::Runtime)?;
    let (index, chunks) = rt.block_on(load_chunks(&a.corpus, range))?;
    let mut opts = CollectOptions {
        n_ubatch: a.n_ubatch,
        n_gpu_layers: a.n_gpu_layers,
        trace_every: a.trace_every,
        trace_every_heldout: a.trace_every_heldout,
        trace_top_n: a.trace_top_n,
        f32_kv: a.f32_kv,
        flash_attn: a.flash_attn,
        decode_tokens: a.decode_tokens,
        decode_prompt: usize::try_from(a.decode_prompt).map_err(|e| WorkerError::Arg {
            flag: "--decode-prompt",
            reason: e.to_string(),
        })?,
        reduce: Reduce::from_flag_or_env(a.reduce)?,
        ..Default::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    let mut collector = Collector::load(&a.model, opts)?;
    let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tokens {per_sec} eta {eta} {msg}")
            .expect("valid template"),
    );
    let crate::collect::Collected {
        mut partial,
        trace,
        decode_trace,
        ..
    } = collector.run(&index, &chunks, &mut |chunk, n| {
        bar.set_message(format!("chunk {chunk}"));
        bar.inc(n as u64);
    })?;
    bar.finish_and_clear();
    let out = RunStore::open(&a.out)?;
    rt.block_on(async {
        let k = collector.shape().n_expert_used as usize;
        let n = a.trace_top_n.min(collector.shape().n_expert as usize);
        for (rows, decode) in [(trace, false), (decode_trace, true)] {
            if !rows.is_empty() {
                let name = trace_part_name(range, decode);
                partial
                    .trace_parts
                    .push(write_trace_part(&out, name, rows, k, n).await?);
            }
        }
        let name = common::layout::PARTIALS.object(range);
        out.put(&name, partial.to_bytes()).await?;
        let saliency = common::artifacts::write_results(&out, &partial).await?;
        println!(
            "measured chunks {range} ({total} tokens, {} traced rows) with {} -> {}",
            partial.trace_rows,
            partial.backends.join(", "),
            out.url()
        );
        if saliency.nonfinite_drops > 0 {
            eprintln!(
                "WARNING: {} non-finite values were dropped: {:?}",
                saliency.nonfinite_drops, saliency.nonfinite_drops_by_tensor
            );
        }
        Ok(())
    })
}
