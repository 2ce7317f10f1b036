//! `worker eval`: one process, no network: evaluate pruned candidates
//! against the base model on a chunk range and write the eval partial and
//! `eval/summary.json`.

use super::chunk_job::ChunkJobArgs;
use numbers::eval::{EvalSummary, ModelsInMemory};
use numbers::Splits;
use runfiles::store::RunStore;
use std::path::PathBuf;
use worker::eval::{candidates, Compare, EvalOptions, Evaluator, KEPT_ROWS_MEMORY};
use worker::WorkerError;

/// Arguments of `worker eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    job: ChunkJobArgs,
    /// A pruned candidate GGUF, named after its file stem (repeatable).
    #[arg(long = "candidate", required = true)]
    candidates: Vec<PathBuf>,
    /// Splits scored: fit, heldout or both.
    #[arg(long, default_value_t = Splits::Both, value_parser = Splits::parse)]
    split: Splits,
    /// Positions skipped at the start of every chunk; default: half the
    /// chunk (`n_ctx / 2`: the second half is scored, like
    /// llama-perplexity); 0 scores every position.
    #[arg(long)]
    skip_first: Option<u32>,
    /// Where logits are compared: `device` (on the backend that holds
    /// them, f32; only per-position figures are copied to the host),
    /// `host` (f64 after llama.cpp copies every row: the reference), or
    /// `auto`: device with layers offloaded to a GPU, else host.
    #[arg(long, value_parser = crate::values::compare(), default_value = "auto")]
    compare: Compare,
    /// Models held in memory at once: `auto` (every model when they fit in
    /// the free memory where the weights go, else the base and one
    /// candidate, else one), `all`, or a number (2: the base and one
    /// candidate, 1: one model at a time). Fewer than 1 + n run the models
    /// in turn with the same figures.
    #[arg(long, default_value = "auto")]
    models_in_memory: ModelsInMemory,
    /// MiB of a lease's base logits kept in host memory when models run in
    /// turn; a lease with more keeps them in a file in `--scratch-dir`.
    #[arg(long, default_value_t = KEPT_ROWS_MEMORY >> 20)]
    kept_rows_memory_mib: u64,
    /// Scratch directory for a lease's base logits (default: `$TMPDIR`).
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
    /// Debugging and oracle tests: write every model's raw logits per chunk
    /// (`chunk-<id>-model-<m>.f32`, little-endian, model 0 the base) here.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
}

/// Entry point of `worker eval`.
pub fn run(a: EvalArgs) -> Result<(), WorkerError> {
    let splits = a.split.splits();
    let (rt, range, index, chunks) = a.job.open()?;
    let mut opts = EvalOptions {
        n_ubatch: a.job.n_ubatch,
        offload: a.job.offload.offload(),
        f32_kv: a.job.f32_kv,
        flash_attn: a.job.flash_attn,
        skip_first: a.skip_first.unwrap_or(index.n_ctx / 2),
        splits,
        dump_logits: a.dump_logits.is_some(),
        compare: a.compare,
        models_in_memory: a.models_in_memory,
        kept_rows_memory: a.kept_rows_memory_mib << 20,
        ..EvalOptions::default()
    };
    if let Some(dir) = a.scratch_dir {
        opts.scratch_dir = dir;
    }
    if let Some(t) = a.job.threads {
        opts.threads = t;
    }
    let cands = candidates::from_files(&a.candidates)?;
    let mut evaluator = Evaluator::load(&a.job.model, &cands, opts)?;
    let evaluated = evaluator.run(&index, &chunks, &mut |_, _| {})?;
    if let Some(dir) = &a.dump_logits {
        std::fs::create_dir_all(dir).map_err(|source| WorkerError::ArgDir {
            flag: "--dump-logits",
            path: dir.display().to_string(),
            source,
        })?;
        for ((m, chunk), logits) in &evaluated.dumps {
            let path = dir.join(format!("chunk-{chunk}-model-{m}.f32"));
            let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&path, bytes).map_err(|source| WorkerError::LogitsDump {
                path: path.display().to_string(),
                source,
            })?;
        }
    }
    let partial = evaluated.partial;
    let out = RunStore::open(&a.job.out)?;
    let summary = EvalSummary::of_run(&partial, &index.domains, &index.eval_sets);
    rt.block_on(async {
        out.put(
            &runfiles::layout::EVAL_PARTIALS.object(range),
            partial.to_bytes(),
        )
        .await?;
        runfiles::eval_summary::replace(&out, &runfiles::layout::EVAL, &summary).await?;
        Ok::<_, WorkerError>(())
    })?;
    println!(
        "evaluated chunks {range} ({} scored positions, {} candidates) -> {}",
        partial.n_scored(),
        partial.candidates.len(),
        out.url()
    );
    for c in &summary.candidates {
        for (split, f) in &c.splits {
            println!(
                "  {} {split}: KL {:.6} [{:.6}, {:.6}], same top-1 {:.2}%, ppl ratio {:.4}",
                c.name,
                f.all.kl.mean,
                f.all.kl.lo,
                f.all.kl.hi,
                100.0 * f.all.top1_same,
                f.all.ppl_ratio
            );
        }
    }
    Ok(())
}
