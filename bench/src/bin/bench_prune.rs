//! Prune throughput against a plain copy of the same file, and the slicer's
//! peak memory.
//!
//! `worker synth-model --preset bench --out bench.gguf`, then
//! `cargo run --release -p moe-census-bench --bin bench_prune -- --model bench.gguf`
//! (or the first file of a split model: `worker synth-model --preset bench
//! --split 4`; the copies then copy every file, and the slice reads them all)
//!
//! Each figure is the median of `--runs` runs with the base file in the page
//! cache. Copies are timed with the same `fsync` before completion that the
//! slicer does before its rename. Throughput is bytes written per second.
//! Peak memory is the VmHWM of a child process that does one slice and
//! nothing else.

use anyhow::Context;
use clap::Parser;
use moe_census_bench::{median, moe_layers, scratch_dir};
use runfiles::keepmap::KeepMap;
use runfiles::procstat::peak_rss_kib;
use slicer::slice_model;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// The base model (e.g. the `bench` preset).
    #[arg(long)]
    model: PathBuf,
    /// Timed runs per figure (the median is printed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Scratch directory for the outputs (default: the model's directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: slice once keeping K experts to OUT and print VmHWM.
    #[arg(long, num_args = 2, value_names = ["K", "OUT"], hide = true)]
    child_slice: Vec<String>,
}

/// A map keeping `k` evenly spread experts of every MoE layer.
fn keep_map(model: &Path, k: u32) -> anyhow::Result<(KeepMap, u32)> {
    let (moe, n_expert) = moe_layers(model)?;
    let layers: BTreeMap<u32, Vec<u32>> = moe
        .into_iter()
        .map(|l| (l, (0..k).map(|i| i * n_expert / k).collect()))
        .collect();
    let map = KeepMap {
        method: "bench".into(),
        k,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers,
    };
    Ok((map, n_expert))
}

/// Seconds of `f`, median over `runs`.
fn timed(runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut secs = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        secs.push(t.elapsed().as_secs_f64());
    }
    Ok(median(secs))
}

/// A copy of the files `from` into one file `to` through a 4 MiB
/// user-space buffer (what the slicer's hash does), fsynced.
fn buffered_copy(from: &[PathBuf], to: &Path) -> anyhow::Result<()> {
    let mut w = std::fs::File::create(to)?;
    let mut buf = vec![0u8; 4 << 20];
    for file in from {
        let mut r = std::fs::File::open(file)?;
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            w.write_all(&buf[..n])?;
        }
    }
    w.sync_all()?;
    Ok(())
}

/// Plain copies of the files `from`, fsynced: file `i` to `to` with `-i`
/// appended to its stem (one file: to `to`).
fn plain_copy(from: &[PathBuf], to: &Path) -> anyhow::Result<()> {
    for (i, file) in from.iter().enumerate() {
        let dest = match i {
            0 => to.to_path_buf(),
            _ => to.with_extension(format!("{i}.gguf")),
        };
        std::fs::copy(file, &dest)?;
        std::fs::File::open(&dest)?.sync_all()?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let [k, out] = &args.child_slice[..] {
        let (map, _) = keep_map(&args.model, k.parse()?)?;
        slice_model(&args.model, &map, Path::new(out))?;
        println!("{}", peak_rss_kib().unwrap_or(0));
        return Ok(());
    }
    let dir = scratch_dir(args.dir.as_deref(), &args.model);
    let files = gguf::split::model_files(&args.model)?;
    let mut size = 0;
    for file in &files {
        size += std::fs::metadata(file)?.len();
        std::io::copy(&mut std::fs::File::open(file)?, &mut std::io::sink())?;
    }
    let out = dir.join("bench-prune-out.gguf");
    let gb = |bytes: u64, s: f64| bytes as f64 / s / 1e9;
    println!(
        "base {} ({} file(s)): {:.1} MB; median of {} runs\n",
        args.model.display(),
        files.len(),
        size as f64 / 1e6,
        args.runs
    );
    println!("| what | bytes written | seconds | GB/s | vs plain copy |");
    println!("|---|---:|---:|---:|---:|");
    let copy = timed(args.runs, || plain_copy(&files, &out))?;
    println!(
        "| plain copy (std::fs::copy + fsync) | {size} | {copy:.3} | {:.2} | 1.00x |",
        gb(size, copy)
    );
    let buffered = timed(args.runs, || buffered_copy(&files, &out))?;
    println!(
        "| copy through a 4 MiB buffer + fsync | {size} | {buffered:.3} | {:.2} | {:.2}x |",
        gb(size, buffered),
        buffered / copy
    );
    let sha = timed(args.runs, || {
        gguf::hash::model_sha256(&args.model)?;
        Ok(())
    })?;
    println!(
        "| SHA-256 of the base (no write) | 0 | {sha:.3} | {:.2} (read) | |",
        gb(size, sha)
    );
    let (_, n_expert) = keep_map(&args.model, 1)?;
    let mut memory = Vec::new();
    for k in [n_expert, n_expert / 2, n_expert / 4] {
        let (map, _) = keep_map(&args.model, k)?;
        let mut bytes = 0;
        let s = timed(args.runs, || {
            bytes = slice_model(&args.model, &map, &out)?.bytes;
            Ok(())
        })?;
        // The same fixed costs (open, fsync, rename over the last output) at
        // the slice's size: a plain copy of the slice itself.
        let same = dir.join("bench-prune-same-size.gguf");
        let copy_same = timed(args.runs, || plain_copy(std::slice::from_ref(&out), &same))?;
        std::fs::remove_file(&same).ok();
        println!(
            "| prune K={k} of {n_expert} (slice + SHA-256 + fsync) | {bytes} | {s:.3} | {:.2} | {:.2}x (plain copy of a file this size: {copy_same:.3} s, {:.2}x) |",
            gb(bytes, s),
            s / copy * size as f64 / bytes as f64,
            s / copy_same
        );
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["--model", args.model.to_str().context("model path")?])
            .args([
                "--child-slice",
                &k.to_string(),
                out.to_str().context("out path")?,
            ])
            .output()?;
        anyhow::ensure!(
            child.status.success(),
            "child slice failed: {}",
            String::from_utf8_lossy(&child.stderr)
        );
        memory.push((k, String::from_utf8(child.stdout)?.trim().to_string()));
    }
    std::fs::remove_file(&out).ok();
    for i in 1..files.len() {
        std::fs::remove_file(out.with_extension(format!("{i}.gguf"))).ok();
    }
    println!(
        "\nvs plain copy: time per byte written relative to the plain copy's of the whole base (lower is better); in brackets, against a plain copy of a file of the slice's own size (the slice output copied, with the same fsync)."
    );
    for (k, kib) in memory {
        println!("peak resident memory of a process slicing K={k}: {kib} KiB (VmHWM)");
    }
    Ok(())
}
