//! Benchmark: the host cost of collection at the real shape (issue #12):
//! the `wide` model (48 MoE layers x 512 experts, top-10, hidden 64), a plain
//! forward pass against `worker collect`'s statistics + importance matrix
//! (no trace), at 1 and 2 ggml threads.
//!
//! `cargo run --release -p moe-census-bench --bin bench_host -- --chunks 2 --n-ctx 512`
//!
//! Prints, per thread count, the least of `--rounds` interleaved rounds: wall
//! seconds and process CPU seconds (user + system, all threads, in ticks of
//! 10 ms, so use enough tokens) of each mode,
//! host us/token = (collect - forward) / tokens for both, and collection's
//! overhead against the forward pass. Each figure is given twice: over the
//! whole run, and in the steady state after the first `--warm-chunks` chunks
//! (collection touches its per-process scratches and exact accumulators for
//! the first time in its first two chunks; a million-token run pays that once).

use clap::Parser;
use llama::Offload;
use llama::{Context, ContextParams, Logits, Model, NoGraph};
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::procstat::process_cpu_seconds;
use std::path::PathBuf;
use std::time::Instant;
use synth::chunks::token_chunks;
use synth::Preset;
use worker::collect::{CollectOptions, Collector};

#[derive(Parser)]
struct Args {
    /// Chunks per measurement.
    #[arg(long, default_value_t = 6)]
    chunks: u32,
    /// Chunks left out of the steady-state figures (at least 2: the two
    /// scratches that alternate between decoding and folding are first
    /// touched in chunks 0 and 1).
    #[arg(long, default_value_t = 2)]
    warm_chunks: u32,
    /// Tokens per chunk (DESIGN section 11's real shape uses 2,048).
    #[arg(long, default_value_t = 512)]
    n_ctx: u32,
    /// Tokens per micro-batch (at most `--n-ctx`).
    #[arg(long, default_value_t = 512)]
    n_ubatch: u32,
    /// Rounds of each mode (the best is kept).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Thread counts to measure, comma-separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<u32>,
    /// An existing `wide` model (else one is generated in a temporary directory).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Run one mode once and print nothing else (for `perf record`): forward or collect.
    #[arg(long)]
    only: Option<String>,
}

/// Wall and CPU seconds of one measurement.
#[derive(Clone, Copy)]
struct Cost {
    wall: f64,
    cpu: f64,
}

impl Cost {
    /// The least wall time and the least CPU time, each over the rounds.
    fn best(self, other: Cost) -> Cost {
        Cost {
            wall: self.wall.min(other.wall),
            cpu: self.cpu.min(other.cpu),
        }
    }
}

/// Wall clock and process CPU seconds at one moment.
#[derive(Clone, Copy)]
struct Mark {
    wall: Instant,
    cpu: f64,
}

impl Mark {
    fn now() -> anyhow::Result<Mark> {
        Ok(Mark {
            wall: Instant::now(),
            cpu: process_cpu_seconds()?,
        })
    }

    /// The cost from `self` to `later`.
    fn until(self, later: Mark) -> Cost {
        Cost {
            wall: later.wall.duration_since(self.wall).as_secs_f64(),
            cpu: later.cpu - self.cpu,
        }
    }
}

/// The cost of one run: all of it, and its steady state (from the end of
/// the warm-up chunks to the end of the last chunk).
#[derive(Clone, Copy)]
struct Costs {
    all: Cost,
    steady: Cost,
}

impl Costs {
    fn best(self, other: Costs) -> Costs {
        Costs {
            all: self.all.best(other.all),
            steady: self.steady.best(other.steady),
        }
    }
}

/// Runs `f`, which calls its argument at the end of every chunk, and
/// measures it whole and after chunk `warm - 1`.
fn timed(
    warm: usize,
    f: impl FnOnce(&mut dyn FnMut()) -> anyhow::Result<()>,
) -> anyhow::Result<Costs> {
    let start = Mark::now()?;
    let mut ends = Vec::new();
    f(&mut || ends.push(Mark::now()))?;
    let end = Mark::now()?;
    let ends: Vec<Mark> = ends.into_iter().collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        ends.len() > warm,
        "{} chunks leave nothing after {warm} warm-up chunks",
        ends.len()
    );
    Ok(Costs {
        all: start.until(end),
        steady: ends[warm - 1].until(ends[ends.len() - 1]),
    })
}

fn forward(
    model: &Model,
    params: &ContextParams,
    chunks: &[Chunk],
    chunk_done: &mut dyn FnMut(),
) -> anyhow::Result<()> {
    let mut ctx = Context::new(model, params, NoGraph)?;
    for c in chunks {
        ctx.clear();
        for (i, toks) in c.tokens.chunks(params.n_ubatch as usize).enumerate() {
            ctx.decode(toks, (i * params.n_ubatch as usize) as i32)?;
        }
        chunk_done();
    }
    Ok(())
}

fn collect(
    path: &std::path::Path,
    threads: u32,
    n_ubatch: u32,
    index: &CorpusIndex,
    chunks: &[Chunk],
    warm: usize,
) -> anyhow::Result<Costs> {
    let opts = CollectOptions {
        n_ubatch,
        threads,
        trace_every: 0,
        ..Default::default()
    };
    let mut collector = Collector::load(path, opts)?;
    timed(warm, |chunk_done| {
        collector.run(index, chunks, &mut |_, _| chunk_done())?;
        Ok(())
    })
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = std::env::temp_dir().join(format!("moe-census-bench-host-{}", std::process::id()));
    let path = match &a.model {
        Some(p) => p.clone(),
        None => {
            std::fs::create_dir_all(&dir)?;
            let p = dir.join("wide.gguf");
            synth::write_model(Preset::Wide, 0, &p)?;
            p
        }
    };
    let model = Model::load(&path, &Offload::default())?;
    let (index, chunks) = token_chunks(a.chunks, a.n_ctx, model.n_vocab() as u64);
    let warm = a.warm_chunks.max(2) as usize;
    let tokens = f64::from(a.chunks * a.n_ctx);
    let steady_tokens = f64::from(a.chunks.saturating_sub(warm as u32) * a.n_ctx);
    let params = |threads| ContextParams {
        n_ctx: a.n_ctx,
        n_ubatch: a.n_ubatch.min(a.n_ctx),
        threads,
        f32_kv: false,
        flash_attn: false,
        logits: Logits::Host,
    };
    let collect_with = |threads| {
        collect(
            &path,
            threads,
            a.n_ubatch.min(a.n_ctx),
            &index,
            &chunks,
            warm,
        )
    };
    if let Some(mode) = a.only.as_deref() {
        let threads = a.threads.first().copied().unwrap_or(1);
        match mode {
            "forward" => forward(&model, &params(threads), &chunks, &mut || {})?,
            "collect" => {
                collect_with(threads)?;
            }
            other => anyhow::bail!("--only {other}: expected forward or collect"),
        }
        return Ok(());
    }
    println!(
        "backend: {}",
        llama::backend_description(&Offload::default())
    );
    println!(
        "model: wide preset (qwen3moe, 48 MoE layers x 512 experts, top-10, hidden 64, f16); \
         {} chunks x {} tokens, n_ubatch {}, least wall and least CPU time of {} rounds each; \
         steady state = chunks {warm}..{} ({steady_tokens} tokens)",
        a.chunks,
        a.n_ctx,
        a.n_ubatch.min(a.n_ctx),
        a.rounds,
        a.chunks - 1
    );
    println!(
        "| threads | over | forward wall s | forward CPU s | collect wall s | collect CPU s \
         | host us/token (wall) | host us/token (CPU) | overhead (wall) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for &threads in &a.threads {
        let none = Cost {
            wall: f64::MAX,
            cpu: f64::MAX,
        };
        let none = Costs {
            all: none,
            steady: none,
        };
        let (mut fwd, mut col) = (none, none);
        for _ in 0..a.rounds {
            let f = timed(warm, |done| {
                forward(&model, &params(threads), &chunks, done)
            })?;
            fwd = fwd.best(f);
            col = col.best(collect_with(threads)?);
        }
        let rows = [
            ("whole run", fwd.all, col.all, tokens),
            ("steady state", fwd.steady, col.steady, steady_tokens),
        ];
        for (over, fwd, col, tokens) in rows {
            println!(
                "| {threads} | {over} | {:.3} | {:.2} | {:.3} | {:.2} | {:.1} | {:.1} | {:+.2}% |",
                fwd.wall,
                fwd.cpu,
                col.wall,
                col.cpu,
                1e6 * (col.wall - fwd.wall) / tokens,
                1e6 * (col.cpu - fwd.cpu) / tokens,
                100.0 * (col.wall / fwd.wall - 1.0)
            );
        }
    }
    if a.model.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}
