//! Benchmark: evaluation throughput with 1 and 3 pruned candidates against a
//! plain forward pass of the base model over the same chunks, on the `bench`
//! model (`cargo run --release -p worker --bin bench_eval`).
//!
//! Candidates are byte copies of the base model: a pruned model routes each
//! token through the same top-k experts, so its forward pass costs the same
//! (the router is a few rows smaller), and a copy keeps the benchmark free
//! of the slicer. The goal: base + n candidates costs at most (1 + n)
//! forward passes of the base model, plus 5%. A first untimed round runs
//! the modes in increasing memory order, so the peak resident size read
//! after each one (`VmHWM`) is that mode's peak. In the timed rounds a
//! forward pass runs before and after every evaluation, and the evaluation
//! is compared with their mean: the machine's speed drifts by tens of
//! percent over minutes on a shared host, which a best-of-rounds per mode
//! cannot tell from a real difference.

use clap::Parser;
use common::procstat::peak_rss_kib;
use std::time::Instant;
use worker::eval::rows::{compare_rows, ScoredRow};
use worker::eval::{candidates, EvalOptions, Evaluator};
use worker::llama::{Context, ContextParams, Model, NoGraph};
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
    /// Timed rounds: one evaluation with 1 and one with 3 candidates each.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Vocabulary of the comparison-cost table (the bench model's is
    /// small; real MoE models have about 151,936 tokens).
    #[arg(long, default_value_t = 151_936)]
    cost_vocab: usize,
}

/// The comparison as it was before the vectorised rewrite, for the cost
/// table: libm `exp` for the base row's log-sum-exp (once per row), the
/// candidate's, then `exp(log p)` again in the KL loop (two per entry per
/// candidate), on one thread.
fn libm_kl(base: &[f32], cand: &[f32]) -> f64 {
    let lse = |row: &[f32]| {
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        m + row
            .iter()
            .map(|&v| (f64::from(v) - m).exp())
            .sum::<f64>()
            .ln()
    };
    let (lp, lq) = (lse(base), lse(cand));
    base.iter()
        .zip(cand)
        .map(|(&a, &b)| {
            let log_p = f64::from(a) - lp;
            log_p.exp() * (log_p - (f64::from(b) - lq))
        })
        .sum()
}

/// Seconds per row compared with one candidate (the base row's own work
/// included) at `n_vocab` entries: the libm loop above, and `compare_rows`
/// on 1 and on `threads` threads (64 rows, best of 3).
fn compare_cost(n_vocab: usize, threads: usize) -> [f64; 3] {
    let n_rows = 64;
    let logits = |seed: usize| -> Vec<f32> {
        (0..n_rows * n_vocab)
            .map(|i| ((i * 7919 + seed * 104_729) % 100_003) as f32 * 2e-4 - 10.0)
            .collect()
    };
    let (base, cand) = (logits(0), logits(1));
    let rows: Vec<ScoredRow> = (0..n_rows)
        .map(|row| ScoredRow { row, next: row })
        .collect();
    let best = |f: &mut dyn FnMut() -> f64| {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_secs_f64() / n_rows as f64
            })
            .fold(f64::MAX, f64::min)
    };
    let range = |r: usize| r * n_vocab..(r + 1) * n_vocab;
    let libm = best(&mut || {
        (0..n_rows)
            .map(|r| libm_kl(&base[range(r)], &cand[range(r)]))
            .sum()
    });
    let ours = |t: usize| {
        best(&mut || {
            compare_rows(&base, &[&cand], &rows, n_vocab, t)
                .iter()
                .map(|r| r.candidates[0].kl)
                .sum()
        })
    };
    [libm, ours(1), ours(threads)]
}

/// Peak resident set size of this process so far, MiB.
fn peak_rss_mib() -> f64 {
    peak_rss_kib().map_or(f64::NAN, |kib| kib as f64 / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = std::env::temp_dir().join(format!("moe-census-bench-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let base = dir.join("bench.gguf");
    worker::synth::write_model(Preset::Bench, 0, &base)?;
    let (index, chunks) = worker::synth::chunks::bench_chunks(a.chunks, a.n_ctx, 600);
    let tokens = f64::from(a.chunks * a.n_ctx);
    let copies = (1..=3)
        .map(|i| {
            let path = dir.join(format!("copy_{i}.gguf"));
            std::fs::copy(&base, &path).map(|_| path)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let cands = candidates::from_files(&copies)?;
    let params = ContextParams {
        n_ctx: a.n_ctx,
        n_ubatch: a.n_ubatch,
        threads: a.threads,
        f32_kv: false,
        flash_attn: false,
    };
    let model = Model::load(&base, 0)?;
    let mut ctx = Context::new(&model, &params, NoGraph)?;
    let mut forward_pass = || -> anyhow::Result<f64> {
        let t = Instant::now();
        for c in &chunks {
            ctx.clear();
            for (i, toks) in c.tokens.chunks(a.n_ubatch as usize).enumerate() {
                ctx.decode(toks, (i * a.n_ubatch as usize) as i32)?;
            }
        }
        Ok(t.elapsed().as_secs_f64())
    };
    // A first, untimed round of each mode, in increasing memory order:
    // warms every context and reads each mode's peak memory.
    forward_pass()?;
    let mut peaks = vec![peak_rss_mib()];
    let mut evaluators = Vec::new();
    for n in [1usize, 3] {
        let opts = EvalOptions {
            n_ubatch: a.n_ubatch,
            threads: a.threads,
            ..EvalOptions::default()
        };
        let mut e = Evaluator::load(&base, &cands[..n], opts)?;
        e.run(&index, &chunks, &mut |_, _| {})?;
        peaks.push(peak_rss_mib());
        evaluators.push(e);
    }
    // Timed: forward passes bracket every evaluation (F E1 F E3 F E1 ...),
    // and each evaluation is compared with the mean of the two forward
    // passes around it, so a drift of the machine's speed (tens of percent
    // over minutes on a shared host) cancels out of the ratio.
    let mut forwards = vec![forward_pass()?];
    let mut ratios: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut evals: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..a.rounds as usize {
        for (m, n) in [(0usize, 1.0), (1, 3.0)] {
            let t = Instant::now();
            evaluators[m].run(&index, &chunks, &mut |_, _| {})?;
            let secs = t.elapsed().as_secs_f64();
            let before = *forwards.last().expect("a forward pass ran first");
            let after = forward_pass()?;
            forwards.push(after);
            let ratio = secs / ((1.0 + n) * 0.5 * (before + after));
            eprintln!(
                "round {round}: base + {n}: {secs:.3} s between forward passes of {before:.3} and {after:.3} s: {ratio:.4}"
            );
            ratios[m].push(ratio);
            evals[m].push(secs);
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    let forward = best(&forwards);
    println!("backend: {}", worker::llama::backend_description());
    println!(
        "model: bench preset (qwen3moe, 8 MoE layers, 64 experts, top-8, hidden 512, Q8_0), candidates are copies of it; {} chunks x {} tokens, n_ubatch {}, {} threads; {} timed rounds, each evaluation between two forward passes",
        a.chunks, a.n_ctx, a.n_ubatch, a.threads, a.rounds
    );
    println!("| mode | best s | tokens/s (best) | vs (1 + n) bracketing forward passes: mean +- s.e. | rounds over +5% | peak RSS (MiB) |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| forward, base model only | {forward:.3} | {:.1} | {} passes | | {:.0} |",
        tokens / forward,
        forwards.len(),
        peaks[0]
    );
    for (m, name) in ["eval, base + 1 candidate", "eval, base + 3 candidates"]
        .iter()
        .enumerate()
    {
        let r = &ratios[m];
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (r.len().max(2) - 1) as f64;
        let se = (var / r.len() as f64).sqrt();
        let secs = best(&evals[m]);
        println!(
            "| {name} | {secs:.3} | {:.1} | {:+.2}% +- {:.2}% | {} of {} | {:.0} |",
            tokens / secs,
            100.0 * (mean - 1.0),
            100.0 * se,
            r.iter().filter(|&&x| x > 1.05).count(),
            r.len(),
            peaks[m + 1]
        );
    }
    let [libm, one, many] = compare_cost(a.cost_vocab, a.threads as usize);
    println!(
        "\ncomparison cost per row with one candidate, vocabulary of {}: libm exp, 3 per entry (before) {:.1} us; vectorised exp, 2 per entry, 1 thread {:.1} us ({:.1}x); {} threads {:.1} us ({:.1}x)",
        a.cost_vocab,
        libm * 1e6,
        one * 1e6,
        libm / one,
        a.threads,
        many * 1e6,
        libm / many
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
