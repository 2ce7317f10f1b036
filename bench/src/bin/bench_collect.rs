//! Benchmark: collection throughput against a plain forward pass of the same
//! chunks, on the generated `bench` model, another preset (`--preset`) or any
//! GGUF (`--model`) (`cargo run --release -p moe-census-bench --bin bench_collect`).
//! Each collect mode also prints what crossed from the backend to the host,
//! in bytes per token (the partial's `backend_to_host` figure).
//!
//! Modes, interleaved over `--rounds` rounds (the best round of each is kept):
//! `forward` (an observer that asks for no tensor: llama.cpp's plain decode
//! with outputs on every token, host logits, what llama-imatrix runs; one
//! context with its KV cache cleared per chunk, and a fresh context per
//! chunk as the collector does), `forward, last token` (an output on the
//! last token of each micro-batch only: the output head on one row, so
//! `forward` minus it is the head's cost), `collect` (REAP statistics +
//! imatrix; the head skipped, issue #22; timed on a worker's first lease,
//! which makes the llama.cpp context, and on its next lease, which reuses
//! it), `collect + trace` (and routing
//! traces, lookahead off), `collect + trace + lookahead` (and the
//! lookahead guesses of issue #56 at d = 1, 2), `collect with the head`
//! (the output head computed and its logits copied, as before issue #22;
//! same statistics bit for bit), `collect + merge_projection 128` (and
//! the projected expert outputs of issue #57; its partial's bytes are
//! printed beside plain `collect`'s).
//!
//! Issue #22's goal: `collect` costs at most `forward - 0.8 x (forward -
//! forward, last token)`; the last lines print both sides, in wall seconds
//! and in process CPU seconds (with `--threads 1` the CPU figure does not
//! depend on what else the machine runs).

use clap::Parser;
use llama::Offload;
use llama::{Context, ContextParams, GraphObserver, Logits, Model, TensorRef};
use numbers::partial::{BackendToHost, Partial};
use runfiles::corpus::Chunk;
use runfiles::procstat::process_cpu_seconds;
use std::time::Instant;
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collector};

mod workload;
use workload::Workload;

#[derive(Parser)]
struct Args {
    /// Where the collect modes reduce observed tensors.
    #[arg(long, value_parser = coordinator::values::reduce(), default_value = "host")]
    reduce: Reduce,
    #[command(flatten)]
    work: Workload,
    /// Rounds of each mode.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Run one mode once and print nothing else (for instruction counts
    /// under `valgrind --tool=callgrind`): forward, collect, trace
    /// (collect + trace, no lookahead) or lookahead (collect + trace +
    /// lookahead d = 1, 2); or
    /// `reductions`: collect with host and with device reductions and print
    /// how the device statistics compare with the host path's.
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
    let path = match &a.work.model {
        Some(path) => path.clone(),
        None => {
            let path = dir.join("bench.gguf");
            a.work.generate(&path)?;
            path
        }
    };
    let n_vocab = Model::load(&path, &Offload::layers(a.work.ngl))?.n_vocab();
    let (index, chunks) = synth::chunks::bench_chunks(a.work.chunks, a.work.n_ctx, n_vocab);
    let tokens = (a.work.chunks * a.work.n_ctx) as f64;
    let params = ContextParams {
        n_ctx: a.work.n_ctx,
        n_ubatch: a.work.n_ubatch,
        threads: a.work.threads,
        f32_kv: false,
        flash_attn: false,
        logits: Logits::Host,
    };
    match a.only.as_deref() {
        Some("forward") => {
            let model = Model::load(&path, &Offload::layers(a.work.ngl))?;
            let mut ctx = Context::new(&model, &params, NoTensors)?;
            for c in &chunks {
                ctx.clear();
                for (i, toks) in c.tokens.chunks(a.work.n_ubatch as usize).enumerate() {
                    ctx.decode(toks, (i * a.work.n_ubatch as usize) as i32)?;
                }
            }
            return Ok(());
        }
        Some(mode @ ("collect" | "trace" | "lookahead")) => {
            let opts = CollectOptions {
                n_ubatch: a.work.n_ubatch,
                offload: Offload::layers(a.work.ngl),
                threads: a.work.threads,
                trace_every: u32::from(mode != "collect"),
                trace_lookahead: match mode {
                    "lookahead" => vec![1, 2],
                    _ => Vec::new(),
                },
                reduce: a.reduce,
                ..Default::default()
            };
            Collector::load(&path, opts)?.run(&index, &chunks, &mut |_, _| {})?;
            return Ok(());
        }
        Some("reductions") => {
            let run = |reduce| {
                let opts = CollectOptions {
                    n_ubatch: a.work.n_ubatch,
                    offload: Offload::layers(a.work.ngl),
                    threads: a.work.threads,
                    trace_every: 0,
                    reduce,
                    ..Default::default()
                };
                Collector::load(&path, opts)?
                    .run(&index, &chunks, &mut |_, _| {})
                    .map(|c| c.partial)
                    .map_err(anyhow::Error::from)
            };
            let (host, device) = (run(Reduce::Host)?, run(Reduce::Device)?);
            println!(
                "backend: {}",
                llama::backend_description(&Offload::layers(a.work.ngl))
            );
            println!("{}", compare_reductions(&host, &device));
            return Ok(());
        }
        Some(other) => anyhow::bail!(
            "--only {other}: expected forward, collect, trace, lookahead or reductions"
        ),
        None => {}
    }
    let model = Model::load(&path, &Offload::layers(a.work.ngl))?;
    let mut best = [f64::MAX; MODES.len()];
    let mut best_cpu = [f64::MAX; MODES.len()];
    let mut partial_bytes = [0usize; MODES.len()];
    let cpu = || process_cpu_seconds().unwrap_or(f64::NAN);
    let mut crossed = [BackendToHost::default(); MODES.len()];
    let mut shape = None;
    let forward = |ctx: &mut Context<'_, NoTensors>, c: &Chunk, last: bool| {
        for (i, toks) in c.tokens.chunks(a.work.n_ubatch as usize).enumerate() {
            let pos0 = (i * a.work.n_ubatch as usize) as i32;
            if last {
                ctx.decode_last_output(toks, pos0)?;
            } else {
                ctx.decode(toks, pos0)?;
            }
        }
        anyhow::Ok(())
    };
    for _ in 0..a.rounds {
        for (mode, last) in [(FORWARD, false), (FORWARD_LAST, true)] {
            let (t, c0) = (Instant::now(), cpu());
            let mut ctx = Context::new(&model, &params, NoTensors)?;
            for c in &chunks {
                ctx.clear();
                forward(&mut ctx, c, last)?;
            }
            best[mode] = best[mode].min(t.elapsed().as_secs_f64());
            best_cpu[mode] = best_cpu[mode].min(cpu() - c0);
            crossed[mode] = BackendToHost {
                tokens: ctx.tokens_decoded(),
                bytes: ctx.bytes_read(),
            };
        }
        let (t, c0) = (Instant::now(), cpu());
        for c in &chunks {
            let mut ctx = Context::new(&model, &params, NoTensors)?;
            forward(&mut ctx, c, false)?;
        }
        best[FRESH] = best[FRESH].min(t.elapsed().as_secs_f64());
        best_cpu[FRESH] = best_cpu[FRESH].min(cpu() - c0);
        for (mode, trace_every, output_head, lookahead) in [
            (COLLECT, 0, false, false),
            (TRACE, 1, false, false),
            (LOOKAHEAD, 1, false, true),
            (WITH_HEAD, 0, true, false),
            (PROJECTED, 0, false, false),
        ] {
            let opts = CollectOptions {
                n_ubatch: a.work.n_ubatch,
                offload: Offload::layers(a.work.ngl),
                threads: a.work.threads,
                trace_every,
                trace_lookahead: match lookahead {
                    true => vec![1, 2],
                    false => Vec::new(),
                },
                reduce: a.reduce,
                output_head,
                merge_projection: if mode == PROJECTED { 128 } else { 0 },
                ..Default::default()
            };
            let mut collector = Collector::load(&path, opts)?;
            // `collect` runs twice on one collector: a worker's first lease
            // makes the llama.cpp context, its next lease reuses it.
            let leases: &[usize] = if mode == COLLECT {
                &[COLLECT, COLLECT_NEXT]
            } else {
                &[mode]
            };
            for &lease in leases {
                let (t, c0) = (Instant::now(), cpu());
                let collected = collector.run(&index, &chunks, &mut |_, _| {})?;
                best[lease] = best[lease].min(t.elapsed().as_secs_f64());
                best_cpu[lease] = best_cpu[lease].min(cpu() - c0);
                crossed[lease] = collected.partial.backend_to_host;
                partial_bytes[lease] = collected.partial.to_bytes().len();
            }
            shape = Some(collector.shape().clone());
        }
    }
    println!(
        "backend: {}",
        llama::backend_description(&Offload::layers(a.work.ngl))
    );
    let model_name = match &a.work.model {
        Some(p) => p.display().to_string(),
        None => format!("{:?} preset", a.work.preset),
    };
    if let Some(s) = shape {
        println!(
            "model: {model_name} ({} MoE layers, {} experts, top-{}, vocabulary {n_vocab}), {} chunks x {} tokens, n_ubatch {}, {} threads, best of {} rounds, {} reductions",
            s.moe_layers.len(), s.n_expert, s.n_expert_used, a.work.chunks, a.work.n_ctx, a.work.n_ubatch, a.work.threads, a.rounds, a.reduce
        );
    }
    println!("| mode | seconds | tokens/s | vs forward | CPU seconds | CPU vs forward | backend-to-host bytes/token (llama.cpp's logits copies included) |");
    println!("|---|---|---|---|---|---|---|");
    for (i, name) in MODES.iter().enumerate() {
        let bytes = match i {
            FRESH => "as forward".to_string(),
            _ => format!("{:.0}", crossed[i].per_token()),
        };
        println!(
            "| {name} | {:.3} | {:.1} | {:+.2}% | {:.3} | {:+.2}% | {bytes} |",
            best[i],
            tokens / best[i],
            100.0 * (best[i] / best[FORWARD] - 1.0),
            best_cpu[i],
            100.0 * (best_cpu[i] / best_cpu[FORWARD] - 1.0)
        );
    }
    for (what, b) in [("wall", &best), ("process CPU", &best_cpu)] {
        println!("\n{what}: {}", head_goal(b));
    }
    println!(
        "\npartial bytes ({} chunks): collect {}, collect + merge_projection 128 {} ({:+}); \
         wall {:+.2}%, process CPU {:+.2}% of collect",
        a.work.chunks,
        partial_bytes[COLLECT],
        partial_bytes[PROJECTED],
        partial_bytes[PROJECTED] as i64 - partial_bytes[COLLECT] as i64,
        100.0 * (best[PROJECTED] / best[COLLECT] - 1.0),
        100.0 * (best_cpu[PROJECTED] / best_cpu[COLLECT] - 1.0),
    );
    for (what, b) in [("wall", &best), ("process CPU", &best_cpu)] {
        println!(
            "\n{what}: lookahead d = 1, 2 costs {:+.2}% of collect + trace (issue #56's goal: at most 5%: {})",
            100.0 * (b[LOOKAHEAD] / b[TRACE] - 1.0),
            if b[LOOKAHEAD] <= 1.05 * b[TRACE] { "met" } else { "NOT met" }
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The output head's share of a forward pass and issue #22's goal against
/// it (for a first lease and a next one), from one column of best seconds
/// per mode.
fn head_goal(best: &[f64; MODES.len()]) -> String {
    let head = best[FORWARD] - best[FORWARD_LAST];
    let goal = best[FORWARD] - 0.8 * head;
    let against = |mode: usize| {
        format!(
            "{:.3} s ({}, saves {:.0}% of the head's cost against forward)",
            best[mode],
            if best[mode] <= goal { "met" } else { "NOT met" },
            100.0 * (best[FORWARD] - best[mode]) / head,
        )
    };
    format!(
        "output head's share of a forward pass: (forward - forward, last token) / forward = {:.1}%; goal: collect <= forward - 0.8 x head = {goal:.3} s; collect, first lease {}; next lease {}; collect with the head costs {:.0}% of the head more than a first lease",
        100.0 * head / best[FORWARD],
        against(COLLECT),
        against(COLLECT_NEXT),
        100.0 * (best[WITH_HEAD] - best[COLLECT]) / head,
    )
}

/// The measured modes, in table order.
const MODES: [&str; 9] = [
    "forward (outputs on every token, host logits: llama-imatrix's decode)",
    "forward, output on the last token only",
    "collect (stats + imatrix, output head skipped), first lease: context made",
    "collect, the worker's next lease: context kept",
    "collect + trace (top-64, no lookahead)",
    "collect with the output head (before issue #22)",
    "forward (fresh context per chunk)",
    "collect + trace + lookahead d = 1, 2 (issue #56)",
    "collect + merge_projection 128 (issue #57), first lease",
];
const FORWARD: usize = 0;
const FORWARD_LAST: usize = 1;
const COLLECT: usize = 2;
const COLLECT_NEXT: usize = 3;
const TRACE: usize = 4;
const WITH_HEAD: usize = 5;
const FRESH: usize = 6;
const LOOKAHEAD: usize = 7;
const PROJECTED: usize = 8;

/// How device-reduced statistics compare with the host path's: counts
/// (which must be equal), the largest relative difference of any expert
/// sum, and the bytes per token each path copied.
fn compare_reductions(host: &Partial, device: &Partial) -> String {
    let mut counts_equal = host.experts.groups.len() == device.experts.groups.len();
    let mut worst = 0f64;
    for (key, h) in &host.experts.groups {
        let Some(d) = device.experts.groups.get(key) else {
            counts_equal = false;
            continue;
        };
        for (hl, dl) in h.layers.iter().zip(&d.layers) {
            counts_equal &= hl.count == dl.count;
            for (hs, ds) in hl.sums().into_iter().zip(dl.sums()) {
                for (x, y) in hs.iter().zip(ds) {
                    let (x, y) = (x.to_f64(), y.to_f64());
                    let scale = x.abs().max(y.abs());
                    if scale > 0.0 {
                        worst = worst.max((x - y).abs() / scale);
                    }
                }
            }
        }
    }
    format!(
        "device reductions vs host: counts {}; largest relative difference of an expert sum {worst:.3e} (tolerance 1e-5: {}); backend-to-host bytes/token host {:.0}, device {:.0}",
        if counts_equal { "equal" } else { "DIFFER" },
        if worst <= 1e-5 { "within" } else { "OUTSIDE" },
        host.backend_to_host.per_token(),
        device.backend_to_host.per_token()
    )
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("moe-census-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
