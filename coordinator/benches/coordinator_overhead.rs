//! Coordinator overhead with 64 simulated workers (`cargo bench -p coordinator
//! --bench coordinator_overhead`).
//!
//! 1. Merge: each lease returns a partial shaped like a real run's (48 MoE
//!    layers x 512 experts, top-10, statistics for fit/held-out x 2 domains,
//!    and an importance matrix of a 48-layer hidden-2048 model with expert
//!    width 512). Per lease the coordinator hashes the bytes, decodes them and
//!    merges into the running total: throughput in GB/s of encoded partials.
//!    The acceptance checks (chunk range, tokens per (split, domain) against
//!    the corpus's spans, `sum(count) == n_tokens * k`) are timed apart.
//!    `BENCH_LEASES` (default 8) sets how many leases are merged; the partial
//!    is large (~1.8 GB in memory), so the default keeps the bench in minutes.
//! 2. Scheduling: 64 workers take and return 5,000 leases through the
//!    scheduler's state machine: per-lease bookkeeping cost.

use common::corpus::{Chunk, CorpusIndex, Span};
use common::exact::ExactSum;
use common::hash::sha256_hex;
use common::imatrix::{Imatrix, ImatrixEntry};
use common::model_check::MoeFacts;
use common::partial::{Partial, PARTIAL_FORMAT_VERSION};
use common::stats::{ExpertAccum, MoeShape};
use common::wire::WorkerId;
use common::ChunkId;
use common::{ChunkRange, Gating, Split};
use coordinator::run::accept::Acceptance;
use coordinator::sched::{plan, Completion, Grant, SchedConfig, Scheduler};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const LAYERS: u32 = 48;
const EXPERTS: u32 = 512;
const HIDDEN: u32 = 2048;
const EXPERT_WIDTH: u32 = 512;

fn value(seed: &mut u64) -> f64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed % 1_000_000) as f64 / 997.0
}

fn realistic_partial(lease: u32, chunks_per_lease: u32) -> Partial {
    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(lease);
    let shape = MoeShape {
        n_expert: EXPERTS,
        n_expert_used: 10,
        gating: Gating::Softmax,
        moe_layers: (0..LAYERS).collect(),
        routing: common::routing::Routing::default(),
    };
    let mut experts = ExpertAccum::new(shape);
    for split in [Split::Fit, Split::Heldout] {
        for domain in ["code", "chat"] {
            let g = experts.group_mut(split, domain);
            g.n_tokens = 1024;
            for l in &mut g.layers {
                for e in 0..EXPERTS as usize {
                    // Pairs around 20 (= 1024 tokens x top-10 / 512 experts),
                    // so every layer's sum(count) is n_tokens x k, as the
                    // acceptance checks demand.
                    let d = (value(&mut seed) as u64) % 20;
                    l.count[e] = if e % 2 == 0 {
                        20 + d
                    } else {
                        40 - l.count[e - 1]
                    };
                    for v in [
                        &mut l.prob_sum,
                        &mut l.weight_sum,
                        &mut l.ean_sum,
                        &mut l.reap_l2_sum,
                        &mut l.reap_l2_sq_sum,
                    ] {
                        v[e] = ExactSum::from_f64(value(&mut seed)).unwrap();
                    }
                }
            }
        }
    }
    let mut entries = BTreeMap::new();
    let mut entry = |name: String, n_in: u32, n_mat: u32, seed: &mut u64| {
        let mut e = ImatrixEntry::new(n_in, n_mat);
        for s in e.in_sum2.iter_mut() {
            *s = ExactSum::from_f64(value(seed)).unwrap();
        }
        e.counts.iter_mut().for_each(|c| *c = 2048);
        entries.insert(name, e);
    };
    for l in 0..LAYERS {
        entry(
            format!("blk.{l}.ffn_gate_exps.weight"),
            HIDDEN,
            EXPERTS,
            &mut seed,
        );
        entry(
            format!("blk.{l}.ffn_up_exps.weight"),
            HIDDEN,
            EXPERTS,
            &mut seed,
        );
        entry(
            format!("blk.{l}.ffn_down_exps.weight"),
            EXPERT_WIDTH,
            EXPERTS,
            &mut seed,
        );
        entry(format!("blk.{l}.ffn_gate_inp.weight"), HIDDEN, 1, &mut seed);
        for t in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            entry(format!("blk.{l}.{t}.weight"), HIDDEN, 1, &mut seed);
        }
    }
    let start = lease * chunks_per_lease;
    Partial {
        format_version: PARTIAL_FORMAT_VERSION,
        model_sha256: "bench-model".into(),
        corpus_sha256: "bench-corpus".into(),
        backends: vec!["cuda:bench".into()],
        chunks: vec![ChunkRange {
            start,
            end: start + chunks_per_lease,
        }],
        experts,
        imatrix: Imatrix {
            entries,
            chunk_count: u64::from(chunks_per_lease),
            chunk_size: 2048,
        },
        nonfinite_drops: BTreeMap::new(),
        trace_tokens: 0,
        trace_rows: 0,
        trace_parts: Vec::new(),
        chunk_stats: Vec::new(),
        backend_to_host: common::partial::BackendToHost::default(),
    }
}

/// What the coordinator knows of the bench's corpus: chunks of 512 tokens,
/// 128 per (split, domain), so a lease of 8 chunks holds the 1,024 tokens
/// per group that [`realistic_partial`] claims.
fn acceptance(leases: u32, chunks_per_lease: u32) -> Acceptance {
    let n_chunks = leases * chunks_per_lease;
    let span = |start: u32, split: Split, domain: u16| Span {
        start,
        len: 128,
        split,
        domain,
    };
    let chunks: Vec<Chunk> = (0..n_chunks)
        .map(|id| Chunk {
            id: ChunkId(id),
            tokens: vec![0; 512],
            spans: vec![
                span(0, Split::Fit, 0),
                span(128, Split::Fit, 1),
                span(256, Split::Heldout, 0),
                span(384, Split::Heldout, 1),
            ],
        })
        .collect();
    let index = CorpusIndex {
        n_chunks,
        n_ctx: 512,
        domains: vec!["code".into(), "chat".into()],
        n_tokens: u64::from(n_chunks) * 512,
        chunks_sha256: "bench-corpus".into(),
    };
    let facts = MoeFacts {
        n_expert: EXPERTS,
        n_expert_used: 10,
    };
    let units = plan(n_chunks, chunks_per_lease);
    Acceptance::new("bench-model", &index, &chunks, &units, Some(facts)).unwrap()
}

fn merge_bench(leases: u32) {
    let accept = acceptance(leases, 8);
    let t = Instant::now();
    let template = realistic_partial(0, 8);
    let bytes = template.to_bytes();
    let sums: usize = template
        .imatrix
        .entries
        .values()
        .map(|e| e.in_sum2.len())
        .sum();
    println!(
        "partial: {:.1}M imatrix sums + {} expert groups, {:.2} GB encoded (built in {:.1}s)",
        sums as f64 / 1e6,
        template.experts.groups.len(),
        bytes.len() as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    drop(template);
    let mut merged: Option<Partial> = None;
    let (mut hash_s, mut decode_s, mut merge_s, mut accept_s) = (0.0, 0.0, 0.0, 0.0);
    for lease in 0..leases {
        // A fresh partial per lease (its own chunk range and values); only the
        // coordinator's work (hash, decode, merge) is timed.
        let encoded = if lease == 0 {
            bytes.clone()
        } else {
            realistic_partial(lease, 8).to_bytes()
        };
        let t = Instant::now();
        let _ = sha256_hex(&encoded);
        hash_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let p = Partial::from_bytes(&encoded).unwrap();
        decode_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        accept.check(p.chunks[0], &p).unwrap();
        accept_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        match &mut merged {
            None => merged = Some(p),
            Some(m) => m.merge(&p).unwrap(),
        }
        merge_s += t.elapsed().as_secs_f64();
    }
    let n = f64::from(leases);
    let gb = bytes.len() as f64 * n / 1e9;
    drop(bytes);
    let total = hash_s + decode_s + merge_s + accept_s;
    println!(
        "{leases} leases: hash {:.2}s, decode {:.2}s, merge {:.2}s; per lease {:.2}s; {:.2} GB/s of encoded partials (merge alone {:.2} GB/s)",
        hash_s,
        decode_s,
        merge_s,
        total / n,
        gb / total,
        gb / merge_s.max(1e-9)
    );
    println!(
        "acceptance checks: {:.2} ms per lease, {:.3}% of merge time, {:.3}% of hash + decode + merge",
        accept_s * 1e3 / n,
        100.0 * accept_s / merge_s.max(1e-9),
        100.0 * accept_s / (hash_s + decode_s + merge_s).max(1e-9)
    );
}

fn sched_bench() {
    let units = plan(5000 * 8, 8);
    let n_units = units.len();
    let mut s = Scheduler::new(
        SchedConfig {
            lease_timeout: Duration::from_secs(3600),
            heartbeat_timeout: Duration::from_secs(60),
            max_attempts: 3,
            idle_poll: Duration::from_millis(100),
            ..SchedConfig::default()
        },
        units,
        &BTreeMap::new(),
    );
    let workers: Vec<WorkerId> = (0..64).map(WorkerId).collect();
    for &w in &workers {
        s.register(w, Duration::ZERO);
    }
    let t = Instant::now();
    let mut now = Duration::ZERO;
    let mut accepted = 0;
    while !s.is_finished() {
        now += Duration::from_millis(10);
        for &w in &workers {
            if let Grant::Lease(l) = s.request(w, now) {
                s.heartbeat(w, now).unwrap();
                if let Completion::Accepted(_) = s.complete(l.lease_id, w, "h", now) {
                    accepted += 1;
                }
            }
        }
        s.tick(now);
    }
    let el = t.elapsed();
    println!(
        "scheduler: {accepted}/{n_units} leases by 64 workers in {:.1} ms: {:.2} us per lease (grant + heartbeat + complete + tick)",
        el.as_secs_f64() * 1e3,
        el.as_secs_f64() * 1e6 / accepted as f64
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let leases: u32 = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    sched_bench();
    merge_bench(leases);
}
