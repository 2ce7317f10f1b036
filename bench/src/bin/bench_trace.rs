//! Writes a synthetic trace of the real shape (48 MoE layers x 512 experts,
//! top-10, router top-64) as Parquet parts under a run location, for sizing
//! and for timing `coordinator replay` on it (`/usr/bin/time -v`).
//!
//! `cargo run --release -p moe-census-bench --bin bench_trace -- --out runs/bench-trace --tokens 65536`
//!
//! Parts hold `--part-tokens` tokens each (a lease's worth), every layer of
//! them, like the parts workers write. Prints bytes per traced token.

use clap::Parser;
use numbers::Split;
use replay::synthetic::{raw_layer, Shape};
use runfiles::procstat::process_cpu_seconds;
use runfiles::store::RunStore;
use runfiles::trace::{write_part_as, Encoding, TraceRow};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Run location (path or URL) that receives `trace/` and `saliency.json`.
    #[arg(long)]
    out: String,
    /// Traced tokens in all (every fifth part is held out).
    #[arg(long, default_value_t = 65_536)]
    tokens: usize,
    /// Tokens per part.
    #[arg(long, default_value_t = 4096)]
    part_tokens: usize,
    /// MoE layers.
    #[arg(long, default_value_t = 48)]
    layers: u32,
    /// Write the f32 layout of the first trace parts instead of the compact one.
    #[arg(long)]
    full: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shape = Shape {
        tokens: args.part_tokens,
        ..Shape::audited()
    };
    let encoding = if args.full {
        Encoding::Full
    } else {
        Encoding::Compact
    };
    let store = RunStore::open(&args.out)?;
    let rt = tokio::runtime::Runtime::new()?;
    let parts = args.tokens.div_ceil(args.part_tokens);
    let (mut bytes, mut encode_s, mut encode_cpu) = (0usize, 0f64, 0f64);
    for p in 0..parts {
        let split = if p % 5 == 4 {
            Split::Heldout
        } else {
            Split::Fit
        };
        let mut rows = Vec::with_capacity(args.part_tokens * args.layers as usize);
        for layer in 0..args.layers {
            let raw = raw_layer(&shape, (p as u64) << 16 | u64::from(layer));
            let (k, n) = (raw.k, raw.n);
            for t in 0..raw.tokens() {
                let topn = &raw.topn[t * n..(t + 1) * n];
                let probs = &raw.topn_prob[t * n..(t + 1) * n];
                let mass: f32 = probs[..k].iter().sum();
                rows.push(TraceRow {
                    split,
                    domain: ["prose", "code", "chat"][t * 3 / raw.tokens()].into(),
                    chunk: (p * args.part_tokens + t) as u32 / 2048,
                    pos: ((p * args.part_tokens + t) % 2048) as u32,
                    token_id: (t * 7919 % 6000) as i32,
                    layer,
                    selected: raw.selected[t * k..(t + 1) * k].to_vec(),
                    selected_weight: probs[..k].iter().map(|p| p / mass).collect(),
                    topn_id: topn.to_vec(),
                    topn_prob: probs.to_vec(),
                    lookahead: Vec::new(),
                });
            }
        }
        let (t, cpu0) = (Instant::now(), process_cpu_seconds()?);
        let part = write_part_as(&mut rows, shape.k, shape.n, encoding)
            .map_err(|e| anyhow::anyhow!("encoding part {p}: {e}"))?;
        encode_s += t.elapsed().as_secs_f64();
        encode_cpu += process_cpu_seconds()? - cpu0;
        bytes += part.len();
        rt.block_on(store.put(&format!("trace/part-{p:05}.parquet"), part))?;
    }
    let saliency = serde_json::json!({
        "n_expert": shape.n_expert,
        "n_expert_used": shape.k,
        "gating": "softmax",
        "trace_tokens_written": 0,
        "nonfinite_drops": 0,
        "splits": {},
    });
    rt.block_on(store.put("saliency.json", saliency.to_string()))?;
    let tokens = parts * args.part_tokens;
    println!(
        "{:?} trace: {tokens} tokens x {} layers in {parts} parts, {bytes} bytes, {:.0} bytes per traced token, encoding {:.2} s wall ({:.0} tokens/s), {:.2} s CPU ({:.2} s CPU per part)",
        encoding,
        args.layers,
        bytes as f64 / tokens as f64,
        encode_s,
        tokens as f64 / encode_s,
        encode_cpu,
        encode_cpu / parts as f64
    );
    Ok(())
}
