//! `worker collect`: one process, no network: measure a chunk range of a
//! tokenized corpus and write its partial, trace part and results.

use super::chunk_job::ChunkJobArgs;
use indicatif::{ProgressBar, ProgressStyle};
use runfiles::layout::trace_part;
use runfiles::store::RunStore;
use worker::collect::device::Reduce;
use worker::collect::{write_trace_part, CollectOptions, Collector};
use worker::WorkerError;

/// Arguments of `worker collect`.
#[derive(clap::Args, Debug)]
pub struct CollectArgs {
    #[command(flatten)]
    job: ChunkJobArgs,
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
    /// Lookahead distances: each traced row of layer L also records layer
    /// L+d's router top-N on the residual stream after layer L, for each d
    /// listed (`0`: none).
    #[arg(long, value_delimiter = ',', default_values_t = [1u8, 2])]
    trace_lookahead: Vec<u8>,
    /// Decode traces: tokens generated greedily from each held-out prompt of a traced chunk (0: none).
    #[arg(long, default_value_t = 0)]
    decode_tokens: usize,
    /// Decode traces: prompt length taken from each held-out span (at least 1).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    decode_prompt: u64,
    /// Where observed tensors are reduced: `device` (on their backend; only
    /// results are copied to the host), `host` (the reference path), or
    /// `auto` (device when layers are offloaded to a GPU). Default:
    /// $MOE_CENSUS_REDUCE, else auto.
    #[arg(long, value_parser = crate::values::reduce())]
    reduce: Option<Reduce>,
    /// Dimensions each routed expert output is projected to for merge
    /// plans (0: off).
    #[arg(long, default_value_t = 0)]
    merge_projection: u32,
}

/// Entry point of `worker collect`.
pub fn run(a: CollectArgs) -> Result<(), WorkerError> {
    let (rt, range, index, chunks) = a.job.open()?;
    let mut opts = CollectOptions {
        n_ubatch: a.job.n_ubatch,
        offload: a.job.offload.offload(),
        trace_every: a.trace_every,
        trace_every_heldout: a.trace_every_heldout,
        trace_top_n: a.trace_top_n,
        trace_lookahead: match a.trace_lookahead.as_slice() {
            [0] => Vec::new(),
            d => d.to_vec(),
        },
        f32_kv: a.job.f32_kv,
        flash_attn: a.job.flash_attn,
        decode_tokens: a.decode_tokens,
        decode_prompt: usize::try_from(a.decode_prompt).map_err(|e| WorkerError::Arg {
            flag: "--decode-prompt",
            reason: e.to_string(),
        })?,
        reduce: Reduce::from_flag_or_env(a.reduce)?,
        merge_projection: a.merge_projection,
        ..Default::default()
    };
    if let Some(t) = a.job.threads {
        opts.threads = t;
    }
    let mut collector = Collector::load(&a.job.model, opts)?;
    let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tokens {per_sec} eta {eta} {msg}")
            .expect("valid template"),
    );
    let worker::collect::Collected {
        mut partial,
        trace,
        decode_trace,
        ..
    } = collector.run(&index, &chunks, &mut |chunk, n| {
        bar.set_message(format!("chunk {chunk}"));
        bar.inc(n as u64);
    })?;
    bar.finish_and_clear();
    let out = RunStore::open(&a.job.out)?;
    rt.block_on(async {
        let k = collector.shape().n_expert_used as usize;
        let n = a.trace_top_n.min(collector.shape().n_expert as usize);
        for (rows, decode) in [(trace, false), (decode_trace, true)] {
            if !rows.is_empty() {
                let name = trace_part(range, decode);
                partial
                    .trace_parts
                    .push(write_trace_part(&out, name, rows, k, n).await?);
            }
        }
        let name = runfiles::layout::PARTIALS.object(range);
        out.put(&name, partial.to_bytes()).await?;
        let saliency = runfiles::artifacts::write_results(&out, &partial).await?;
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

#[cfg(test)]
mod tests {
    use super::super::{llama_flags, Cli, Command};
    use clap::Parser;

    /// llama.cpp's short flags mean what they mean there: `-m` the model,
    /// `-t` the threads, `-ngl` the layers on the GPU.
    #[test]
    fn llama_cpp_short_flags_are_understood() {
        let args = [
            "worker", "collect", "-m", "m.gguf", "-t", "3", "-ngl", "7", "--corpus", "c",
            "--chunks", "0..1", "--out", "o",
        ];
        let cli = Cli::try_parse_from(llama_flags(args.iter().map(Into::into))).unwrap();
        let Command::Collect(a) = cli.command else {
            panic!("not collect");
        };
        assert_eq!(a.job.model, std::path::PathBuf::from("m.gguf"));
        assert_eq!(a.job.threads, Some(3));
        assert_eq!(a.job.offload.n_gpu_layers, 7);
        let join = [
            "worker",
            "join",
            "--coordinator",
            "h:1",
            "--pin",
            "p",
            "-ngl=2",
            "-m",
            "x.gguf",
        ];
        let cli = Cli::try_parse_from(llama_flags(join.iter().map(Into::into))).unwrap();
        let Command::Join(j) = cli.command else {
            panic!("not join");
        };
        assert_eq!(
            (j.offload.n_gpu_layers, j.model),
            (2, Some("x.gguf".into()))
        );
    }
}
