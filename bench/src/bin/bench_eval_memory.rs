//! Benchmark: the peak memory of an evaluating worker by models in memory
//! (DESIGN section 12, "Memory"; issue 41)
//! (`cargo run --release -p moe-census-bench --bin bench_eval_memory`).
//!
//! Generates a base model (default: the `vocab-152k` preset in f16, about
//! 1.2 GB: 3 MoE layers of 512 experts at hidden size 2,048 and the real
//! Qwen3 vocabulary) and slices 4 candidates from it (keep maps of 50% of
//! the experts, each a different half), then evaluates them in one child
//! process per setting of `models_in_memory` (`all`, `2`, `1`): each child
//! reports its peak resident set (`VmHWM`, which counts the weights' file
//! pages it touched through llama.cpp's mmap), its CPU and wall time, and
//! writes the eval partial and summary, which must equal the all-at-once
//! child's byte for byte.
//!
//! The bound checked for `2`: the base file plus the largest candidate file
//! plus the stated buffers: the kept base rows (scored positions x vocabulary
//! x 4 bytes), and per model in memory the context's buffers as a base-only
//! child measures them (its peak less the base file: llama.cpp's KV cache,
//! compute buffer and logits rows, and the process itself).

use clap::Parser;
use numbers::eval::{EvalPartial, EvalSummary, ModelsInMemory};
use runfiles::procstat::{peak_rss_kib, process_cpu_seconds};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use synth::{Overrides, Preset, WeightType};
use worker::eval::{candidates, Compare, EvalOptions, Evaluator};

#[derive(Parser)]
struct Args {
    /// Chunks evaluated.
    #[arg(long, default_value_t = 2)]
    chunks: u32,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 256)]
    n_ctx: u32,
    /// Positions skipped at the start of each chunk (`n_ctx / 2`, as
    /// llama-perplexity scores).
    #[arg(long, default_value_t = 128)]
    skip_first: u32,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Generated base model.
    #[arg(long, value_parser = coordinator::values::preset(), default_value = "vocab-152k")]
    preset: Preset,
    /// Weight encoding of the generated model.
    #[arg(long, value_parser = coordinator::values::weight_type(), default_value = "f16")]
    weights: WeightType,
    /// Candidates sliced from it.
    #[arg(long, default_value_t = 4)]
    candidates: usize,
    /// Settings of models in memory, one child each (the first is the
    /// reference whose results the others must equal).
    #[arg(long, value_delimiter = ',', default_value = "all,2,1")]
    modes: Vec<ModelsInMemory>,
    /// Where the comparison runs.
    #[arg(long, value_parser = coordinator::values::compare(), default_value = "host")]
    compare: Compare,
    /// Working directory (default: under `$TMPDIR`, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: run one evaluation in this process and print its figures.
    #[arg(long, hide = true)]
    child: Option<ModelsInMemory>,
    /// Internal: with `--child`, evaluate the base model alone.
    #[arg(long, hide = true)]
    base_only: bool,
}

/// What a child reports, one line of JSON on stdout.
#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    peak_rss_kib: u64,
    cpu_s: f64,
    wall_s: f64,
    models_in_memory: usize,
    scored: u64,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = a.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "moe-census-bench-eval-memory-{}",
            std::process::id()
        ))
    });
    if let Some(mode) = a.child {
        return child(&a, &dir, mode);
    }
    std::fs::create_dir_all(&dir)?;
    let base = dir.join("base.gguf");
    let t = Instant::now();
    let o = Overrides {
        weights: Some(a.weights),
        ..Default::default()
    };
    synth::write_model_with(a.preset, 0, o, &base)?;
    let spec = a.preset.spec();
    let (n_expert, moe_layers) = (
        spec.n_expert as u32,
        (0..spec.n_layer)
            .filter(|&l| spec.is_moe(l))
            .map(|l| l as u32)
            .collect::<Vec<_>>(),
    );
    for i in 0..a.candidates {
        // Half the experts: every other one, shifted per candidate.
        let k = n_expert / 2;
        let layers = moe_layers
            .iter()
            .map(|&l| {
                let mut ids: Vec<u32> = (0..k)
                    .map(|j| (2 * j + (i as u32 + l) % 2 + i as u32 * 2) % n_expert)
                    .collect();
                ids.sort();
                ids.dedup();
                (l, ids)
            })
            .collect();
        let map = runfiles::keepmap::KeepMap {
            method: format!("half{i}"),
            k,
            params: serde_json::Value::Null,
            saliency_sha256: String::new(),
            layers,
        };
        slicer::slice_model(&base, &map, &cand_path(&dir, i))?;
    }
    eprintln!(
        "generated the model and {} candidates in {:.1} s",
        a.candidates,
        t.elapsed().as_secs_f64()
    );
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len());
    let base_bytes = size(&base)?;
    let cand_bytes = (0..a.candidates)
        .map(|i| size(&cand_path(&dir, i)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let largest = cand_bytes.iter().copied().max().unwrap_or(0);
    let base_only = run_child(&a, &dir, ModelsInMemory::All, true)?;
    let mut rows = Vec::new();
    let mut reference: Option<(ModelsInMemory, [Vec<u8>; 2])> = None;
    for &mode in &a.modes {
        let r = run_child(&a, &dir, mode, false)?;
        let got = [
            std::fs::read(out_file(&dir, mode, "partial.bin"))?,
            std::fs::read(out_file(&dir, mode, "summary.json"))?,
        ];
        let same = match &reference {
            None => {
                reference = Some((mode, got));
                "reference".to_string()
            }
            Some((m, want)) => {
                anyhow::ensure!(
                    got[0] == want[0],
                    "{mode}: the eval partial differs from {m}'s"
                );
                anyhow::ensure!(got[1] == want[1], "{mode}: the summary differs from {m}'s");
                format!("byte-identical to {m}'s")
            }
        };
        rows.push((mode, r, same));
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let spec_line = format!(
        "{:?} preset in {:?}: base {:.0} MiB, {} candidates of {} MiB (half the experts each); {} chunks of {} tokens, skip_first {}, {} threads, {} comparison",
        a.preset,
        a.weights,
        mib(base_bytes),
        a.candidates,
        cand_bytes.iter().map(|&b| format!("{:.0}", mib(b))).collect::<Vec<_>>().join("/"),
        a.chunks,
        a.n_ctx,
        a.skip_first,
        a.threads,
        Compare::label(a.compare == Compare::Device),
    );
    println!("{spec_line}");
    // Per model in memory: what a base-only evaluation holds beyond its file.
    let per_model = (base_only.peak_rss_kib * 1024).saturating_sub(base_bytes);
    let scored = rows.first().map_or(0, |r| r.1.scored);
    let n_vocab = llama::Model::load(&base, &Default::default())?.n_vocab() as u64;
    let kept = scored * n_vocab * 4;
    println!(
        "base-only evaluation: peak {:.0} MiB, so {:.0} MiB of context buffers and process per model in memory; kept base rows: {scored} positions x {n_vocab} x 4 B = {:.0} MiB",
        mib(base_only.peak_rss_kib * 1024),
        mib(per_model),
        mib(kept)
    );
    println!("\n| models in memory | held | peak RSS (MiB) | bound: models + buffers (MiB) | within | CPU s | wall s | results |");
    println!("|---|---|---|---|---|---|---|---|");
    for (mode, r, same) in &rows {
        let (models, held) = match r.models_in_memory {
            n if n > a.candidates => (
                base_bytes + cand_bytes.iter().sum::<u64>(),
                1 + a.candidates as u64,
            ),
            1 => (base_bytes.max(largest), 1),
            _ => (base_bytes + largest, 2),
        };
        let in_turn = r.models_in_memory <= a.candidates;
        let bound = models + held * per_model + if in_turn { kept } else { 0 };
        let peak = r.peak_rss_kib * 1024;
        println!(
            "| {mode} | {} | {:.0} | {:.0} = {:.0} + {held} x {:.0}{} | {} | {:.1} | {:.1} | {same} |",
            r.models_in_memory,
            mib(peak),
            mib(bound),
            mib(models),
            mib(per_model),
            if in_turn { format!(" + {:.0}", mib(kept)) } else { String::new() },
            if peak <= bound { "yes" } else { "NO" },
            r.cpu_s,
            r.wall_s
        );
    }
    if a.dir.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

fn cand_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("half{i}_K.gguf"))
}

fn out_file(dir: &Path, mode: ModelsInMemory, name: &str) -> PathBuf {
    dir.join(format!("out-{mode}-{name}"))
}

/// Runs this binary as a child evaluating with `mode` and reads its report.
fn run_child(
    a: &Args,
    dir: &Path,
    mode: ModelsInMemory,
    base_only: bool,
) -> anyhow::Result<Report> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        "--child",
        &mode.to_string(),
        "--dir",
        &dir.display().to_string(),
    ])
    .args([
        "--chunks",
        &a.chunks.to_string(),
        "--n-ctx",
        &a.n_ctx.to_string(),
    ])
    .args([
        "--skip-first",
        &a.skip_first.to_string(),
        "--threads",
        &a.threads.to_string(),
    ])
    .args(["--candidates", &a.candidates.to_string()])
    .args(["--compare", &format!("{:?}", a.compare).to_lowercase()]);
    if base_only {
        cmd.arg("--base-only");
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "child {mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let line = text.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(line)?)
}

/// One evaluation in this process.
fn child(a: &Args, dir: &Path, mode: ModelsInMemory) -> anyhow::Result<()> {
    let started = Instant::now();
    let paths: Vec<PathBuf> = match a.base_only {
        true => Vec::new(),
        false => (0..a.candidates).map(|i| cand_path(dir, i)).collect(),
    };
    let cands = candidates::from_files(&paths)?;
    let (index, chunks) = synth::chunks::bench_chunks(a.chunks, a.n_ctx, 600);
    let opts = EvalOptions {
        n_ubatch: a.n_ctx,
        threads: a.threads,
        skip_first: a.skip_first,
        compare: a.compare,
        models_in_memory: mode,
        scratch_dir: dir.to_path_buf(),
        ..EvalOptions::default()
    };
    let mut e = Evaluator::load(&dir.join("base.gguf"), &cands, opts)?;
    let partial: EvalPartial = e.run(&index, &chunks, &mut |_, _| {})?.partial;
    if !a.base_only {
        let summary = EvalSummary::of(&partial, &index.domains);
        std::fs::write(out_file(dir, mode, "partial.bin"), partial.to_bytes())?;
        std::fs::write(out_file(dir, mode, "summary.json"), summary.to_json_bytes())?;
    }
    let report = Report {
        peak_rss_kib: peak_rss_kib().unwrap_or(0),
        cpu_s: process_cpu_seconds()?,
        wall_s: started.elapsed().as_secs_f64(),
        models_in_memory: e.models_in_memory(),
        scored: partial.n_scored(),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
