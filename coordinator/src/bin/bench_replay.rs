//! Replay benchmark on synthetic traces shaped like the audited run
//! (16,384 tokens x 48 layers, top-64 of 512 experts, top-10).
//!
//! `cargo run --release -p coordinator --bin bench_replay -- --scale 1`
//!
//! Layers are generated, turned into steps and replayed one at a time, as
//! `coordinator replay` streams them; generation is not timed. Prints
//! requests per second per core for each policy, the 2-thread scaling over
//! layers, and the peak resident memory (VmHWM).

use clap::Parser;
use coordinator::replay::keep::requests;
use coordinator::replay::synthetic::{raw_layer, Shape};
use coordinator::replay::{simulate, Policy, PolicyParams, Steps};
use rayon::prelude::*;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Tokens per layer as a multiple of 16,384.
    #[arg(long, default_value_t = 1)]
    scale: usize,
    /// Layers.
    #[arg(long, default_value_t = 48)]
    layers: usize,
    /// Resident experts per layer.
    #[arg(long, default_value_t = 128)]
    capacity: usize,
    /// Layers replayed in the thread-scaling runs.
    #[arg(long, default_value_t = 8)]
    scaling_layers: usize,
    /// Policies to time, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_parser = Policy::parse)]
    policies: Vec<Policy>,
}

fn steps_for(shape: &Shape, layer: usize) -> (Steps, Duration) {
    let raw = raw_layer(shape, 1000 + layer as u64);
    let t = Instant::now();
    let steps = Steps::build(&requests(&raw, shape.n_expert, None, 4), 1);
    (steps, t.elapsed())
}

fn vm_hwm() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "n/a".into())
}

fn main() {
    let args = Args::parse();
    let policies: Vec<Policy> = if args.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        args.policies.clone()
    };
    let shape = Shape {
        tokens: 16_384 * args.scale,
        ..Shape::audited()
    };
    let params = PolicyParams::default();
    let mut time = vec![Duration::ZERO; policies.len()];
    let mut misses = vec![0u64; policies.len()];
    let mut requests_total = 0u64;
    let mut prep = Duration::ZERO;
    for layer in 0..args.layers {
        let (steps, p) = steps_for(&shape, layer);
        prep += p;
        requests_total += steps.requests();
        for (i, &policy) in policies.iter().enumerate() {
            let t = Instant::now();
            let c = simulate(policy, &steps, args.capacity, &params);
            time[i] += t.elapsed();
            misses[i] += c.misses;
        }
    }
    println!(
        "shape: {} tokens x {} layers, top-{} of {} experts, top-{}; capacity {}; {} requests per policy",
        shape.tokens, args.layers, shape.n, shape.n_expert, shape.k, args.capacity, requests_total
    );
    println!(
        "trace -> steps (keep filter, near picks, step build): {:.3} s, {:.1} M tokens*layers/s",
        prep.as_secs_f64(),
        (shape.tokens * args.layers) as f64 / prep.as_secs_f64() / 1e6
    );
    println!("\n| policy | seconds | M requests/s/core | miss rate |\n|---|---:|---:|---:|");
    for (i, policy) in policies.iter().enumerate() {
        println!(
            "| {policy} | {:.3} | {:.1} | {:.4} |",
            time[i].as_secs_f64(),
            requests_total as f64 / time[i].as_secs_f64() / 1e6,
            misses[i] as f64 / requests_total as f64
        );
    }
    println!(
        "\npeak memory (VmHWM) after the streaming pass: {}",
        vm_hwm()
    );

    if args.scaling_layers == 0 {
        return;
    }
    let layers: Vec<Steps> = (0..args.scaling_layers)
        .map(|l| steps_for(&shape, l).0)
        .collect();
    let reqs: u64 = layers.iter().map(|s| s.requests()).sum();
    println!(
        "\n| policy | 1 thread M req/s | 2 threads M req/s | speed-up |\n|---|---:|---:|---:|"
    );
    let scaled = [Policy::Lru, Policy::Ema, Policy::Belady];
    for policy in scaled.into_iter().filter(|p| policies.contains(p)) {
        let mut rate = [0f64; 2];
        for (i, threads) in [1, 2].into_iter().enumerate() {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            let t = Instant::now();
            let total: u64 = pool.install(|| {
                layers
                    .par_iter()
                    .map(|s| simulate(policy, s, args.capacity, &params).misses)
                    .sum()
            });
            rate[i] = reqs as f64 / t.elapsed().as_secs_f64() / 1e6;
            std::hint::black_box(total);
        }
        println!(
            "| {policy} | {:.1} | {:.1} | {:.2}x |",
            rate[0],
            rate[1],
            rate[1] / rate[0]
        );
    }
    println!("\npeak memory (VmHWM) at exit: {}", vm_hwm());
}
