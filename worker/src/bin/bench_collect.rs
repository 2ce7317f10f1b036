//! Benchmark: collection throughput against a plain forward pass of the same
//! chunks, on the generated `bench` model, another preset (`--preset`) or any
//! GGUF (`--model`) (`cargo run --release -p worker --bin bench_collect`).
//! Each collect mode also prints what crossed from the backend to the host,
//! in bytes per token (the partial's `backend_to_host` figure).
//!
//! Modes, interleaved over `--rounds` rounds (the best round of each is kept):
//! `forward` (an observer that asks for no tensor: llama.cpp's plain decode,
//! one context with its KV cache cleared per chunk, and a fresh context per
//! chunk as the collector does), `collect` (REAP statistics + imatrix),
//! `collect + trace` (and routing traces).

use clap::Parser;
use common::partial::BackendToHost;
use std::time::Instant;
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collector};
use worker::llama::{Context, ContextParams, GraphObserver, Model, TensorRef};
use worker::synth::Preset;

#[derive(Parser)]
struct Args {
    /// GGUF model to measure (token ids are drawn inside its vocabulary);
    /// without it, the `--preset` model is generated in a temporary directory.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Generated model when `--model` is not given.
    #[arg(long, value_enum, default_value = "bench")]
    preset: Preset,
    /// Where the collect modes reduce observed tensors.
    #[arg(long, value_enum, default_value = "host")]
    reduce: Reduce,
    /// Chunks per measurement.
    #[arg(long, default_value_t = 8)]
    chunks: u32,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    n_ctx: u32,
    /// Tokens per micro-batch.
    #[arg(long, default_value_t = 512)]
    n_ubatch: u32,
    /// Rounds of each mode.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Run one mode once and print nothing else (for instruction counts
    /// under `valgrind --tool=callgrind`): forward or collect.
    #[arg(long)]
    only: Option<String>,
}

struct NoTensors;

impl GraphObserver for NoTensors {
    fn wants(&mut self, _: &TensorRef<'_>) -> bool {
        false
    }
    fn observe(&mut self, _: &TensorRef<'_>) {}
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = tempfile_dir()?;
    let path = match &a.model {
        Some(path) => path.clone(),
        None => {
            let path = dir.join("bench.gguf");
            worker::synth::write_model(a.preset, 0, &path)?;
            path
        }
    };
    let n_vocab = Model::load(&path, 0)?.n_vocab();
    let (index, chunks) = worker::synth::chunks::bench_chunks(a.chunks, a.n_ctx, n_vocab);
    let tokens = (a.chunks * a.n_ctx) as f64;
    let params = ContextParams {
        n_ctx: a.n_ctx,
        n_ubatch: a.n_ubatch,
        threads: a.threads,
        f32_kv: false,
        flash_attn: false,
    };
    match a.only.as_deref() {
        Some("forward") => {
            let model = Model::load(&path, 0)?;
            let mut ctx = Context::new(&model, &params, NoTensors)?;
            for c in &chunks {
                ctx.clear();
                for (i, toks) in c.tokens.chunks(a.n_ubatch as usize).enumerate() {
                    ctx.decode(toks, (i * a.n_ubatch as usize) as i32)?;
                }
            }
            return Ok(());
        }
        Some("collect") => {
            let opts = CollectOptions {
                n_ubatch: a.n_ubatch,
                threads: a.threads,
                trace_every: 0,
                reduce: a.reduce,
                ..Default::default()
            };
            Collector::load(&path, opts)?.run(&index, &chunks, &mut |_, _| {})?;
            return Ok(());
        }
        Some(other) => anyhow::bail!("--only {other}: expected forward or collect"),
        None => {}
    }
    let model = Model::load(&path, 0)?;
    let mut best = [f64::MAX; 4];
    let mut crossed = [BackendToHost::default(); 4];
    let mut shape = None;
    for _ in 0..a.rounds {
        let t = Instant::now();
        let mut ctx = Context::new(&model, &params, NoTensors)?;
        for c in &chunks {
            ctx.clear();
            for (i, toks) in c.tokens.chunks(a.n_ubatch as usize).enumerate() {
                ctx.decode(toks, (i * a.n_ubatch as usize) as i32)?;
            }
        }
        best[0] = best[0].min(t.elapsed().as_secs_f64());
        drop(ctx);
        let t = Instant::now();
        for c in &chunks {
            let mut ctx = Context::new(&model, &params, NoTensors)?;
            for (i, toks) in c.tokens.chunks(a.n_ubatch as usize).enumerate() {
                ctx.decode(toks, (i * a.n_ubatch as usize) as i32)?;
            }
        }
        best[3] = best[3].min(t.elapsed().as_secs_f64());
        for (mode, trace_every) in [(1, 0), (2, 1)] {
            let opts = CollectOptions {
                n_ubatch: a.n_ubatch,
                threads: a.threads,
                trace_every,
                reduce: a.reduce,
                ..Default::default()
            };
            let mut collector = Collector::load(&path, opts)?;
            let t = Instant::now();
            let collected = collector.run(&index, &chunks, &mut |_, _| {})?;
            best[mode] = best[mode].min(t.elapsed().as_secs_f64());
            crossed[mode] = collected.partial.backend_to_host;
            shape = Some(collector.shape().clone());
        }
    }
    println!("backend: {}", worker::llama::backend_description());
    let model_name = match &a.model {
        Some(p) => p.display().to_string(),
        None => format!("{:?} preset", a.preset),
    };
    if let Some(s) = shape {
        println!(
            "model: {model_name} ({} MoE layers, {} experts, top-{}), {} chunks x {} tokens, n_ubatch {}, {} threads, best of {} rounds, {} reductions",
            s.moe_layers.len(), s.n_expert, s.n_expert_used, a.chunks, a.n_ctx, a.n_ubatch, a.threads, a.rounds, a.reduce
        );
    }
    println!("| mode | seconds | tokens/s | overhead vs forward | backend-to-host bytes/token |");
    println!("|---|---|---|---|---|");
    let names = [
        "forward (no tensors observed, one context)",
        "collect (stats + imatrix)",
        "collect + trace (top-64)",
        "forward (fresh context per chunk)",
    ];
    for (i, name) in names.iter().enumerate() {
        let bytes = match i {
            1 | 2 => format!("{:.0}", crossed[i].per_token()),
            _ => "0".to_string(),
        };
        println!(
            "| {name} | {:.3} | {:.1} | {:+.2}% | {bytes} |",
            best[i],
            tokens / best[i],
            100.0 * (best[i] / best[0] - 1.0)
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("moe-census-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
