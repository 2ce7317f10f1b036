//! Benchmark: collection throughput against a plain forward pass of the same
//! chunks on the `bench` model (`cargo run --release -p worker --bin bench_collect`).
//!
//! Modes, interleaved over `--rounds` rounds (the best round of each is kept):
//! `forward` (an observer that asks for no tensor: llama.cpp's plain decode,
//! one context with its KV cache cleared per chunk, and a fresh context per
//! chunk as the collector does), `collect` (REAP statistics + imatrix),
//! `collect + trace` (and routing traces).

use clap::Parser;
use std::time::Instant;
use worker::collect::{CollectOptions, Collector};
use worker::llama::{Context, ContextParams, GraphObserver, Model, TensorRef};
use worker::synth::Preset;

#[derive(Parser)]
struct Args {
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
    let path = dir.join("bench.gguf");
    worker::synth::write_model(Preset::Bench, 0, &path)?;
    let (index, chunks) = worker::synth::chunks::bench_chunks(a.chunks, a.n_ctx);
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
                ..Default::default()
            };
            let mut collector = Collector::load(&path, opts)?;
            let t = Instant::now();
            collector.run(&index, &chunks, &mut |_, _| {})?;
            best[mode] = best[mode].min(t.elapsed().as_secs_f64());
        }
    }
    println!("backend: {}", worker::llama::backend_description());
    println!("model: bench preset (qwen3moe, 8 MoE layers, 64 experts, top-8, hidden 512, Q8_0), {} chunks x {} tokens, n_ubatch {}, {} threads, best of {} rounds", a.chunks, a.n_ctx, a.n_ubatch, a.threads, a.rounds);
    println!("| mode | seconds | tokens/s | overhead vs forward |");
    println!("|---|---|---|---|");
    let names = [
        "forward (no tensors observed, one context)",
        "collect (stats + imatrix)",
        "collect + trace (top-64)",
        "forward (fresh context per chunk)",
    ];
    for (i, name) in names.iter().enumerate() {
        println!(
            "| {name} | {:.3} | {:.1} | {:+.2}% |",
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
