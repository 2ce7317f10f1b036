//! Benchmark: evaluation throughput with 1 and 3 pruned candidates against a
//! plain forward pass of the base model over the same chunks, on the `bench`
//! model or another preset (`--preset vocab-152k` for the real vocabulary)
//! (`cargo run --release -p moe-census-bench --bin bench_eval`), for the device
//! comparison and the f64 host reference (`--compare`), with each mode's
//! host work, backend compute and bytes from the backend per scored
//! position and candidate (issue #22).
//!
//! Candidates are byte copies of the base model: a pruned model routes each
//! token through the same top-k experts, so its forward pass costs the same
//! (the router is a few rows smaller), and a copy keeps the benchmark free
//! of the slicer. The goal: base + n candidates costs at most (1 + n)
//! forward passes of the base model, plus 5%. A first untimed round runs
//! the modes in increasing memory order and reads the peak resident size
//! (`VmHWM`) after each one; every mode's evaluator stays loaded for the
//! timed rounds, so a mode's own memory is the step from the figure before
//! it. In the timed rounds a forward pass runs before and after every
//! evaluation, and the evaluation is compared with their mean: the
//! machine's speed drifts by tens of percent over minutes on a shared host,
//! which a best-of-rounds per mode cannot tell from a real difference.

use clap::Parser;
use llama::Offload;
use llama::{Context, ContextParams, Logits, Model, NoGraph};
use numbers::eval::EvalPartial;
use runfiles::procstat::{peak_rss_kib, process_cpu_seconds};
use std::time::Instant;
use worker::eval::rows::{compare_rows, ScoredRow};
use worker::eval::{candidates, Compare, EvalCost, EvalOptions, Evaluator};

mod workload;
use workload::Workload;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    work: Workload,
    /// Timed rounds: one evaluation with 1 and one with 3 candidates each.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Vocabulary of the host comparison-cost table (the bench model's is
    /// small; real MoE models have about 151,936 tokens); 0 skips it.
    #[arg(long, default_value_t = 151_936)]
    cost_vocab: usize,
    /// Chunks of a tokenized corpus (a run location) instead of generated
    /// ones: all of them, or `--range A..B`.
    #[arg(long)]
    corpus: Option<String>,
    /// Chunk range of `--corpus`.
    #[arg(long)]
    range: Option<String>,
    /// Positions skipped at the start of every chunk (`n_ctx / 2`: the
    /// second half is scored, as llama-perplexity does).
    #[arg(long, default_value_t = 0)]
    skip_first: u32,
    /// `forward`: run `--passes` forward passes of the base model over the
    /// chunks and print this process's CPU time, nothing else (the
    /// reference for `coordinator eval`'s process CPU time).
    #[arg(long)]
    only: Option<String>,
    /// Forward passes of `--only forward`.
    #[arg(long, default_value_t = 1)]
    passes: u32,
    /// Comparison paths measured (comma-separated: device, host).
    #[arg(long, value_parser = coordinator::values::compare(), value_delimiter = ',', default_value = "device,host")]
    compare: Vec<Compare>,
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

/// How the device comparison's per-position figures compare with the f64
/// host path's (same chunks, same candidate).
fn agreement(device: &EvalPartial, host: &EvalPartial) -> String {
    let (d, h) = (&device.candidates[0], &host.candidates[0]);
    let mut worst_kl = 0f64;
    for (x, y) in d.tokens.iter().zip(&h.tokens) {
        worst_kl = worst_kl.max((x.kl - y.kl).abs());
    }
    let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE);
    let mut worst_nll = 0f64;
    let mut top1_equal = d.groups.len() == h.groups.len();
    for (g, x) in &d.groups {
        if let Some(y) = h.groups.get(g) {
            worst_nll = worst_nll.max(rel(x.nll.to_f64(), y.nll.to_f64()));
            top1_equal &= x.top1_same == y.top1_same;
        }
    }
    for (g, x) in &device.base {
        if let Some(y) = host.base.get(g) {
            worst_nll = worst_nll.max(rel(x.nll.to_f64(), y.nll.to_f64()));
        }
    }
    format!(
        "device comparison vs f64 host path, base + 1, {} positions: largest |KL difference| per position {worst_kl:.3e} nats; largest relative difference of a group's NLL sum {worst_nll:.3e}; same-top-1 counts {}",
        d.tokens.len(),
        if top1_equal { "equal" } else { "DIFFER" }
    )
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
    match &a.work.model {
        Some(m) => {
            std::fs::copy(m, &base)?;
        }
        None => a.work.generate(&base)?,
    }
    let (index, chunks) = match &a.corpus {
        Some(run) => {
            let range = match &a.range {
                Some(r) => {
                    numbers::ChunkRange::parse(r).map_err(|e| anyhow::anyhow!("--range: {e}"))?
                }
                None => {
                    let rt = tokio::runtime::Runtime::new()?;
                    let (_, index) = rt.block_on(worker::corpus::open_corpus(run))?;
                    numbers::ChunkRange {
                        start: 0,
                        end: index.n_chunks,
                    }
                }
            };
            tokio::runtime::Runtime::new()?.block_on(worker::corpus::load_chunks(run, range))?
        }
        None => synth::chunks::bench_chunks(a.work.chunks, a.work.n_ctx, 600),
    };
    let n_ctx = index.n_ctx;
    let tokens = chunks.iter().map(|c| c.tokens.len() as f64).sum::<f64>();
    let copies = (1..=3)
        .map(|i| {
            let path = dir.join(format!("copy_{i}.gguf"));
            std::fs::copy(&base, &path).map(|_| path)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let cands = candidates::from_files(&copies)?;
    let params = ContextParams {
        n_ctx,
        n_ubatch: a.work.n_ubatch,
        threads: a.work.threads,
        f32_kv: false,
        flash_attn: false,
        logits: Logits::Host,
    };
    let model = Model::load(&base, &Offload::layers(a.work.ngl))?;
    let n_vocab = model.n_vocab();
    let mut ctx = Context::new(&model, &params, NoGraph)?;
    let mut forward_pass = || -> anyhow::Result<f64> {
        let t = Instant::now();
        for c in &chunks {
            ctx.clear();
            for (i, toks) in c.tokens.chunks(a.work.n_ubatch as usize).enumerate() {
                ctx.decode(toks, (i * a.work.n_ubatch as usize) as i32)?;
            }
        }
        Ok(t.elapsed().as_secs_f64())
    };
    if let Some(only) = &a.only {
        anyhow::ensure!(only == "forward", "--only {only}: expected forward");
        for _ in 0..a.passes {
            forward_pass()?;
        }
        println!(
            "{} forward passes over {} chunks ({tokens} tokens): process CPU {:.2} s",
            a.passes,
            chunks.len(),
            process_cpu_seconds()?
        );
        return Ok(());
    }
    // A first, untimed round of each mode, in increasing memory order:
    // warms every context and reads each mode's peak memory.
    forward_pass()?;
    let mut peaks = vec![peak_rss_mib()];
    let mut modes = Vec::new();
    for &compare in &a.compare {
        for n in [1usize, 3] {
            let opts = EvalOptions {
                n_ubatch: a.work.n_ubatch,
                offload: Offload::layers(a.work.ngl),
                threads: a.work.threads,
                skip_first: a.skip_first,
                compare,
                ..EvalOptions::default()
            };
            let mut e = Evaluator::load(&base, &cands[..n], opts)?;
            let first = e.run(&index, &chunks, &mut |_, _| {})?.partial;
            peaks.push(peak_rss_mib());
            modes.push(Mode {
                compare,
                n,
                first,
                evaluator: e,
                ratios: Vec::new(),
                secs: Vec::new(),
                cost: EvalCost::default(),
            });
        }
    }
    // Timed: forward passes bracket every evaluation (F E1 F E3 F E1 ...),
    // and each evaluation is compared with the mean of the two forward
    // passes around it, so a drift of the machine's speed (tens of percent
    // over minutes on a shared host) cancels out of the ratio.
    let mut forwards = vec![forward_pass()?];
    for round in 0..a.rounds as usize {
        for m in &mut modes {
            let t = Instant::now();
            let done = m.evaluator.run(&index, &chunks, &mut |_, _| {})?;
            let secs = t.elapsed().as_secs_f64();
            let before = *forwards.last().expect("a forward pass ran first");
            let after = forward_pass()?;
            forwards.push(after);
            let ratio = secs / ((1.0 + m.n as f64) * 0.5 * (before + after));
            eprintln!(
                "round {round}: {:?}, base + {}: {secs:.3} s between forward passes of {before:.3} and {after:.3} s: {ratio:.4}",
                m.compare, m.n
            );
            m.ratios.push(ratio);
            m.secs.push(secs);
            m.cost = done.cost;
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    let forward = best(&forwards);
    println!(
        "backend: {}",
        llama::backend_description(&Offload::layers(a.work.ngl))
    );
    println!(
        "model: {}, vocabulary {n_vocab}, candidates are copies of it; {} chunks of up to {n_ctx} tokens ({tokens} tokens), skip_first {}, n_ubatch {}, {} threads, ngl {}; {} timed rounds, each evaluation between two forward passes",
        a.work.model.as_ref().map_or_else(|| format!("{:?} preset", a.work.preset), |m| m.display().to_string()),
        chunks.len(), a.skip_first, a.work.n_ubatch, a.work.threads, a.work.ngl, a.rounds
    );
    println!("| mode | best s | tokens/s (best) | vs (1 + n) bracketing forward passes: mean +- s.e. | rounds over +5% | peak RSS (MiB) | host work per position and candidate (us) | backend compute of the comparison per position and candidate (us) | bytes from the backend per position and candidate |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| forward, base model only (host logits) | {forward:.3} | {:.1} | {} passes | | {:.0} | | | |",
        tokens / forward,
        forwards.len(),
        peaks[0]
    );
    for (m, peak) in modes.iter().zip(&peaks[1..]) {
        let r = &m.ratios;
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (r.len().max(2) - 1) as f64;
        let se = (var / r.len() as f64).sqrt();
        let secs = best(&m.secs);
        let per = m.cost.comparisons.max(1) as f64;
        println!(
            "| eval, {}, base + {} | {secs:.3} | {:.1} | {:+.2}% +- {:.2}% | {} of {} | {peak:.0} | {:.2} | {:.2} | {:.1} |",
            Compare::label(m.compare.on_device(a.work.ngl, llama::has_gpu())),
            m.n,
            tokens / secs,
            100.0 * (mean - 1.0),
            100.0 * se,
            r.iter().filter(|&&x| x > 1.05).count(),
            r.len(),
            1e6 * m.cost.host_s / per,
            1e6 * m.cost.backend_s / per,
            m.cost.bytes as f64 / per,
        );
    }
    let one = |c: Compare| modes.iter().find(|m| m.compare == c && m.n == 1);
    if let (Some(d), Some(h)) = (one(Compare::Device), one(Compare::Host)) {
        println!("\n{}", agreement(&d.first, &h.first));
    }
    if a.cost_vocab > 0 {
        let [libm, one, many] = compare_cost(a.cost_vocab, a.work.threads as usize);
        println!(
            "\nhost comparison cost per row with one candidate, vocabulary of {}: libm exp, 3 per entry {:.1} us; vectorised exp, 2 per entry, 1 thread {:.1} us ({:.1}x); {} threads {:.1} us ({:.1}x)",
            a.cost_vocab,
            libm * 1e6,
            one * 1e6,
            libm / one,
            a.work.threads,
            many * 1e6,
            libm / many
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// One evaluation mode and its measurements.
struct Mode {
    compare: Compare,
    n: usize,
    /// The untimed round's partial.
    first: EvalPartial,
    evaluator: Evaluator,
    ratios: Vec<f64>,
    secs: Vec<f64>,
    cost: EvalCost,
}
