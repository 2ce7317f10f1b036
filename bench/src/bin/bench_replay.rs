//! Replay benchmark on synthetic traces shaped like the audited run
//! (16,384 tokens x 48 layers, top-64 of 512 experts, top-10).
//!
//! `cargo run --release -p moe-census-bench --bin bench_replay -- --scale 1`
//!
//! Layers are generated, turned into steps and replayed one at a time, as
//! `coordinator replay` streams them; generation is not timed. Prints
//! requests per second per core (by the wall clock and by the thread's
//! time on a CPU, which a shared machine does not inflate) and the miss
//! rate of each policy at each
//! capacity (`--capacity 64,128,256`), the 2-thread scaling over layers (at
//! the first capacity), and the peak resident memory (VmHWM).
//!
//! `--prefetch-m M` times prefetch replay instead: before each token the
//! cache loads up to `M` guessed experts, the token's router top-N from
//! rank `k / 2` on (half its selection, then near picks: about the recall
//! a lookahead guess has).

use clap::Parser;
use rayon::prelude::*;
use replay::keep::requests;
use replay::prefetch::{self, Prefetch};
use replay::synthetic::{raw_layer, Shape};
use replay::{simulate, Cache, Policy, PolicyParams, Steps};
use runfiles::procstat::peak_rss_kib;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Tokens per layer as a multiple of 16,384.
    #[arg(long, default_value_t = 1)]
    scale: usize,
    /// Layers.
    #[arg(long, default_value_t = 48)]
    layers: usize,
    /// Resident experts per layer, comma-separated (`64,128,256`: every
    /// policy is timed at each).
    #[arg(long, value_delimiter = ',', default_values_t = [128])]
    capacity: Vec<usize>,
    /// Layers replayed in the thread-scaling runs.
    #[arg(long, default_value_t = 8)]
    scaling_layers: usize,
    /// Policies to time, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_parser = Policy::parse)]
    policies: Vec<Policy>,
    /// Prefetch up to this many guessed experts per token (0: plain replay).
    #[arg(long, default_value_t = 0)]
    prefetch_m: usize,
}

/// A layer's steps and its prefetch lists (empty unless `m > 0`).
struct Layer {
    steps: Steps,
    pf: Prefetch,
}

fn steps_for(shape: &Shape, layer: usize, m: usize) -> (Layer, Duration) {
    let raw = raw_layer(shape, 1000 + layer as u64);
    let t = Instant::now();
    let steps = Steps::build(&requests(&raw, shape.n_expert, None, 4), 1);
    let elapsed = t.elapsed();
    let from = shape.k / 2;
    let width = shape.n - from;
    let guesses: Vec<u16> = raw
        .topn
        .chunks_exact(shape.n)
        .flat_map(|top| top[from..].iter().copied())
        .collect();
    let pf = match m {
        0 => Prefetch::from_guesses(&vec![replay::steps::NONE; steps.len()], 1, 0),
        m => Prefetch::from_guesses(&guesses, width, m),
    };
    (Layer { steps, pf }, elapsed)
}

/// Demand misses of one replay, with prefetch when the layer has lists.
fn replay(policy: Policy, l: &Layer, capacity: usize, params: &PolicyParams, m: usize) -> u64 {
    match m {
        0 => simulate(policy, &l.steps, capacity, params, &[]).misses,
        _ => {
            let cache = Cache::new(policy, capacity, params, &[]);
            prefetch::simulate(cache, &l.steps, &l.pf).demand.misses
        }
    }
}

/// Time this thread has run on a CPU (`/proc/thread-self/schedstat`, in
/// ns): unlike the wall clock it does not count time spent waiting for a
/// core, so the rates stay per core on a shared machine.
fn on_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("reading /proc/thread-self/schedstat (Linux only)");
    let ns = stat
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("/proc/thread-self/schedstat starts with the run time in ns");
    Duration::from_nanos(ns)
}

/// `VmHWM` as `/proc/self/status` words it ("52904 kB"), or "n/a".
fn vm_hwm() -> String {
    peak_rss_kib().map_or_else(|| "n/a".into(), |kib| format!("{kib} kB"))
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
    let caps = &args.capacity;
    // time[policy][capacity], misses[policy][capacity]
    let mut time = vec![vec![Duration::ZERO; caps.len()]; policies.len()];
    let mut cpu = vec![vec![Duration::ZERO; caps.len()]; policies.len()];
    let mut misses = vec![vec![0u64; caps.len()]; policies.len()];
    let mut requests_total = 0u64;
    let mut prep = Duration::ZERO;
    for layer in 0..args.layers {
        let (l, p) = steps_for(&shape, layer, args.prefetch_m);
        prep += p;
        requests_total += l.steps.requests();
        for (i, &policy) in policies.iter().enumerate() {
            for (j, &capacity) in caps.iter().enumerate() {
                let (t, c0) = (Instant::now(), on_cpu());
                let c = replay(policy, &l, capacity, &params, args.prefetch_m);
                time[i][j] += t.elapsed();
                cpu[i][j] += on_cpu() - c0;
                misses[i][j] += c;
            }
        }
    }
    let cap_list: Vec<String> = caps.iter().map(|c| c.to_string()).collect();
    println!(
        "shape: {} tokens x {} layers, top-{} of {} experts, top-{}; capacity {}; prefetch m = {}; {} requests per policy and capacity",
        shape.tokens,
        args.layers,
        shape.n,
        shape.n_expert,
        shape.k,
        cap_list.join(", "),
        args.prefetch_m,
        requests_total
    );
    println!(
        "trace -> steps (keep filter, near picks, step build): {:.3} s, {:.1} M tokens*layers/s",
        prep.as_secs_f64(),
        (shape.tokens * args.layers) as f64 / prep.as_secs_f64() / 1e6
    );
    let rate = |t: Duration| requests_total as f64 / t.as_secs_f64() / 1e6;
    let header: String = caps.iter().map(|c| format!(" C = {c} |")).collect();
    let rule: String = caps.iter().map(|_| "---:|").collect();
    for (what, times) in [("wall clock", &time), ("time on a CPU", &cpu)] {
        println!("\nM requests/s/core ({what}):\n\n| policy |{header}\n|---|{rule}");
        for (i, policy) in policies.iter().enumerate() {
            let cells: String = times[i]
                .iter()
                .map(|&t| format!(" {:.1} |", rate(t)))
                .collect();
            println!("| {policy} |{cells}");
        }
    }
    println!("\nmiss rate:\n\n| policy |{header}\n|---|{rule}");
    for (i, policy) in policies.iter().enumerate() {
        let cells: String = misses[i]
            .iter()
            .map(|&m| format!(" {:.4} |", m as f64 / requests_total as f64))
            .collect();
        println!("| {policy} |{cells}");
    }
    let replays = policies.len() * caps.len();
    let all_requests = requests_total * replays as u64;
    for (what, times) in [("wall clock", &time), ("time on a CPU", &cpu)] {
        let all: Duration = times.iter().flatten().sum();
        println!(
            "\nall {replays} replays ({what}): {all_requests} requests in {:.3} s = {:.1} M requests/s/core",
            all.as_secs_f64(),
            all_requests as f64 / all.as_secs_f64() / 1e6
        );
    }
    println!(
        "\npeak memory (VmHWM) after the streaming pass: {}",
        vm_hwm()
    );

    if args.scaling_layers == 0 {
        return;
    }
    let layers: Vec<Layer> = (0..args.scaling_layers)
        .map(|l| steps_for(&shape, l, args.prefetch_m).0)
        .collect();
    let reqs: u64 = layers.iter().map(|l| l.steps.requests()).sum();
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
                    .map(|l| replay(policy, l, caps[0], &params, args.prefetch_m))
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
