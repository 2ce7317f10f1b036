//! Merging experts against pruning the same model to the same K (#57):
//! time and peak memory.
//!
//! `worker synth-model --preset wide --out wide.gguf` (48 MoE layers x 512
//! experts, f16), then
//! `cargo run --release -p moe-census-bench --bin bench_merge -- --model wide.gguf`
//!
//! K is half the experts unless `--k` says otherwise. The merge plan keeps
//! K evenly spread centres per layer and merges every other expert into
//! the centre before it (`n / K` experts per centre, weights `1 + id % 3`):
//! every centre averages, the most work a plan of this K can ask. The
//! pruned model keeps the same centres. Each time is the median of
//! `--runs` runs with the base in the page cache (slice or merge, SHA-256,
//! fsync, rename); peak memory is the VmHWM of a child process that does
//! one merge or one slice and nothing else.

use anyhow::Context;
use clap::Parser;
use moe_census_bench::{median, moe_layers, scratch_dir};
use runfiles::keepmap::KeepMap;
use runfiles::mergeplan::{Centre, Member, MergePlan};
use runfiles::procstat::peak_rss_kib;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// The base model (e.g. the `wide` preset).
    #[arg(long)]
    model: PathBuf,
    /// Centres (kept experts) per layer; default half the experts.
    #[arg(long)]
    k: Option<u32>,
    /// Timed runs per figure (the median is printed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Scratch directory for the outputs (default: the model's directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: merge or prune once to OUT and print VmHWM.
    #[arg(long, num_args = 2, value_names = ["WHAT", "OUT"], hide = true)]
    child: Vec<String>,
}

/// The plan described in the module docs.
fn plan(layers: &[u32], n_expert: u32, k: u32) -> MergePlan {
    let per = n_expert / k;
    let centres: Vec<Centre> = (0..k)
        .map(|c| Centre {
            centre: c * per,
            members: (c * per..(c + 1) * per)
                .map(|e| Member {
                    expert: e,
                    weight: 1.0 + f64::from(e % 3),
                })
                .collect(),
        })
        .collect();
    MergePlan {
        method: "bench".into(),
        k,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers: layers.iter().map(|&l| (l, centres.clone())).collect(),
    }
}

/// One merge (`what` = `merge`) or slice (`prune`) of `model` to `out`;
/// returns the bytes written.
fn make(
    what: &str,
    model: &Path,
    merge: &MergePlan,
    keep: &KeepMap,
    out: &Path,
) -> anyhow::Result<u64> {
    Ok(match what {
        "merge" => {
            let codec = llama::GgmlCodec::new();
            slicer::merge_model(model, merge, Some(&codec), out)?.bytes
        }
        _ => slicer::slice_model(model, keep, out)?.bytes,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (layers, n_expert) = moe_layers(&args.model)?;
    let k = args.k.unwrap_or(n_expert / 2);
    anyhow::ensure!(
        k > 0 && n_expert.is_multiple_of(k),
        "K = {k} must divide the {n_expert} experts"
    );
    let merge = plan(&layers, n_expert, k);
    let keep = merge.keep_map();
    if let [what, out] = &args.child[..] {
        make(what, &args.model, &merge, &keep, Path::new(out))?;
        println!("{}", peak_rss_kib().unwrap_or(0));
        return Ok(());
    }
    let dir = scratch_dir(args.dir.as_deref(), &args.model);
    let size = std::fs::metadata(&args.model)?.len();
    std::io::copy(&mut std::fs::File::open(&args.model)?, &mut std::io::sink())?;
    let out = dir.join("bench-merge-out.gguf");
    println!(
        "base {}: {:.1} MB, {} MoE layers x {n_expert} experts, K = {k}; median of {} runs\n",
        args.model.display(),
        size as f64 / 1e6,
        layers.len(),
        args.runs
    );
    println!("| what | bytes written | seconds | peak RSS (KiB) |");
    println!("|---|---:|---:|---:|");
    for what in ["prune", "merge"] {
        let mut secs = Vec::new();
        let mut bytes = 0;
        for _ in 0..args.runs {
            let t = Instant::now();
            bytes = make(what, &args.model, &merge, &keep, &out)?;
            secs.push(t.elapsed().as_secs_f64());
        }
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["--model", args.model.to_str().context("model path")?])
            .args(["--k", &k.to_string()])
            .args(["--child", what, out.to_str().context("out path")?])
            .output()?;
        anyhow::ensure!(
            child.status.success(),
            "child {what} failed: {}",
            String::from_utf8_lossy(&child.stderr)
        );
        let kib = String::from_utf8(child.stdout)?.trim().to_string();
        println!(
            "| {what} to K={k} of {n_expert} | {bytes} | {:.3} | {kib} |",
            median(secs)
        );
    }
    std::fs::remove_file(&out).ok();
    Ok(())
}
