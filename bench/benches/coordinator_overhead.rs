//! Coordinator overhead with 64 simulated workers (`cargo bench -p moe-census-runtime
//! --bench coordinator_overhead`).
//!
//! 1. Merge: each lease returns a partial shaped like a real run's (48 MoE
//!    layers x 512 experts, top-10, statistics for fit/held-out x 2 domains,
//!    and an importance matrix of a 48-layer hidden-2048 model with expert
//!    width 512), its sums shaped like a worker's ([`realistic`]). The
//!    encoded size is compared with the earlier whole-bincode encoding
//!    (format 3: varint i128 sums).
//!    Per lease the coordinator hashes the bytes, decodes them and merges
//!    into the running total (each also on one thread, for comparison):
//!    throughput in GB/s of encoded partials.
//!    The acceptance checks (chunk range, tokens per (split, domain) against
//!    the corpus's spans, `sum(count) == n_tokens * k`) are timed apart.
//!    That is the decoded path (the "before" figures); the coordinator's
//!    ingest is the packed path: hash, acceptance with the importance
//!    matrix's value checks made as its packed bytes are unpacked
//!    (`Acceptance::decode_and_check`), and the add straight from the packed
//!    bytes into the running total (`PackedPartial::add_to`).
//!    `BENCH_LEASES` (default 8) sets how many leases are merged; the partial
//!    is large (~1.8 GB in memory), so the default keeps the bench in minutes.
//! 2. Scheduling: 64 workers take and return 5,000 leases through the
//!    scheduler's state machine: per-lease bookkeeping cost.
//! 3. Checkpoints: 64 workers, each computing a 16,384-token lease in 3 s,
//!    go through a 10M-token plan in simulated time, adding their leases
//!    into checkpoints (every N leases or T seconds, and when out of work):
//!    the partials stored against the bound 64 x (1 + checkpoints per
//!    worker), their bytes at the measured size of a full-size partial (and
//!    of a checkpoint of `BENCH_LEASES` leases), and the coordinator cores
//!    their ingest needs at the measured CPU per partial.
//! 4. Peak memory (`BENCH_RSS_DELIVERIES=K`, default 0: skipped): K
//!    full-size partials delivered at once (written to files first, one per
//!    lease), each read whole, checked and merged through
//!    `BENCH_RSS_SLOTS` ingest slots (default `[run] ingest_slots`'s), in a child process whose peak RSS (`VmHWM`) is
//!    reported against the running total's and the partials' sizes.

use bytes::Bytes;
use gguf::hash::sha256_hex;
use gguf::model_check::MoeFacts;
use numbers::exact::ExactSum;
use numbers::partial::{PackedPartial, Partial};
use numbers::ChunkRange;
use protocol::wire::WorkerId;
use realistic::{CHUNK_TOKENS, EXPERTS, LAYERS, SPAN};
use runfiles::corpus::CorpusIndex;
use runtime::run::accept::Acceptance;
use sched::{plan, Completion, Grant, Identity, SchedConfig, Scheduler};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod realistic;

/// Chunks per lease (of [`CHUNK_TOKENS`] tokens: a lease of 16,384 tokens).
const LEASE_CHUNKS: u32 = 8;

fn realistic_partial(lease: u32) -> Partial {
    let seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(lease);
    let start = lease * LEASE_CHUNKS;
    let experts = realistic::experts(seed, u64::from(SPAN * LEASE_CHUNKS), LEASE_CHUNKS);
    let imatrix = realistic::imatrix(seed, LEASE_CHUNKS, &experts);
    realistic::partial(
        experts,
        imatrix,
        vec![ChunkRange {
            start,
            end: start + LEASE_CHUNKS,
        }],
    )
}

/// What the coordinator knows of the bench's corpus: chunks of
/// [`CHUNK_TOKENS`] tokens, [`SPAN`] per (split, domain), as
/// [`realistic_partial`] claims.
fn acceptance(leases: u32, chunks_per_lease: u32) -> Acceptance {
    let n_chunks = leases * chunks_per_lease;
    let chunks = realistic::chunks(n_chunks);
    let index = CorpusIndex {
        n_chunks,
        n_ctx: CHUNK_TOKENS,
        domains: vec!["code".into(), "chat".into()],
        n_tokens: u64::from(n_chunks) * u64::from(CHUNK_TOKENS),
        chunks_sha256: "bench-corpus".into(),
        eval_sets: Vec::new(),
        groups: Vec::new(),
    };
    let facts = MoeFacts {
        n_expert: EXPERTS,
        n_expert_used: realistic::TOP_K,
    };
    let units = plan(n_chunks, chunks_per_lease);
    Acceptance::new("bench-model", &index, &chunks, &units, Some(facts)).unwrap()
}

/// What the merge bench measured, for the checkpoint simulation.
struct Measured {
    /// Encoded bytes of one lease's partial.
    one: usize,
    /// Encoded bytes of the merge of every lease (a checkpoint of them).
    merged: usize,
    /// Coordinator CPU seconds per partial, decoded path (hash, decode,
    /// check, merge): before.
    decoded_cpu: f64,
    /// The same, packed path (hash, check from the packed bytes, add from
    /// them): the coordinator's ingest.
    ingest_cpu: f64,
}

fn merge_bench(leases: u32) -> Measured {
    let accept = acceptance(leases, LEASE_CHUNKS);
    let t = Instant::now();
    let mut template = realistic_partial(0);
    let built_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let bytes = template.to_bytes();
    let encode_s = t.elapsed().as_secs_f64();
    // The same partial in the earlier whole-bincode encoding (format 3),
    // read as before (the "before" figures).
    let old = bincode::serde::encode_to_vec(&template, bincode::config::standard()).unwrap();
    let bincode_len = old.len();
    let (_, old_hash) = timed(|| sha256_hex(&old));
    let (_, old_decode) = timed(|| {
        bincode::serde::decode_from_slice::<Partial, _>(&old, bincode::config::standard()).unwrap()
    });
    drop(old);
    let sums = exact_sums(&template);
    println!(
        "partial: {:.1}M exact sums ({} expert groups), built in {built_s:.1}s",
        sums as f64 / 1e6,
        template.experts.groups.len(),
    );
    println!(
        "encoded: {} bytes, {:.3} GB ({:.2} bytes per sum) in {encode_s:.2}s; format 3 (bincode, varint i128 sums) {:.3} GB ({:.2} bytes per sum), {:.2}x larger",
        bytes.len(),
        bytes.len() as f64 / 1e9,
        bytes.len() as f64 / sums as f64,
        bincode_len as f64 / 1e9,
        bincode_len as f64 / sums as f64,
        bincode_len as f64 / bytes.len() as f64,
    );
    breakdown(&template, bytes.len());
    let rss_files = rss_files(&mut template, &bytes);
    drop(template);
    println!(
        "format 3, one partial: hash {:.3} CPU s ({:.3} wall), decode {:.3} CPU s ({:.3} wall)",
        old_hash.1, old_hash.0, old_decode.1, old_decode.0
    );
    let mut merged: Option<Partial> = None;
    let mut t = Timings::default();
    for lease in 0..leases {
        // A fresh partial per lease (its own chunk range and values); only the
        // coordinator's work is timed.
        let encoded = Bytes::from(if lease == 0 {
            bytes.clone()
        } else {
            realistic_partial(lease).to_bytes()
        });
        t.hash.add(timed(|| sha256_hex(&encoded)).1);
        // The decoded path: the whole partial in memory, then merged.
        let (p, s) = timed(|| Partial::from_bytes(&encoded).unwrap());
        t.decode.add(s);
        t.accept
            .add(timed(|| accept.check(&p.chunks[..1], &p).unwrap()).1);
        // The packed path: statistics decoded, the importance matrix checked
        // in place (format only, then with acceptance's value checks) and
        // added straight into the total.
        let (packed, s) = timed(|| PackedPartial::parse(encoded.clone()).unwrap());
        t.parse.add(s);
        drop(packed);
        let units = p.chunks[..1].to_vec();
        let (packed, s) = timed(|| accept.decode_and_check(&units, encoded.clone()).unwrap());
        t.checked.add(s);
        match &mut merged {
            None => merged = Some(p),
            Some(m) => {
                let mut total = Some(deep_copy(m));
                t.merge_packed
                    .add(timed(|| packed.add_to(&mut total).unwrap()).1);
                let copy = total.expect("a total");
                t.merge.add(timed(|| m.merge(&p).unwrap()).1);
                assert!(copy == *m, "both paths give the same total");
            }
        }
    }
    let gb = bytes.len() as f64 / 1e9;
    println!(
        "{leases} leases, per lease: CPU seconds (wall seconds); the merges over {} leases",
        leases - 1
    );
    for (name, step) in [
        ("hash (SHA-256)", &t.hash),
        ("acceptance checks", &t.accept),
        ("decoded path: decode", &t.decode),
        ("decoded path: merge", &t.merge),
        (
            "packed path: parse (statistics decoded, importance matrix's format checked)",
            &t.parse,
        ),
        (
            "packed path: acceptance (parse with every check, the importance matrix's values as unpacked)",
            &t.checked,
        ),
        (
            "packed path: merge (importance matrix added from its packed bytes)",
            &t.merge_packed,
        ),
    ] {
        println!("  {name}: {:.3} ({:.3})", step.cpu(), step.wall());
    }
    let packed = t.hash.cpu() + t.checked.cpu() + t.merge_packed.cpu();
    let decoded = t.hash.cpu() + t.decode.cpu() + t.merge.cpu() + t.accept.cpu();
    let merged_len = merged.as_ref().map_or(0, |m| m.to_bytes().len());
    println!(
        "a checkpoint of {leases} leases (their merge) encodes to {merged_len} bytes, {:.3} GB ({:.2}x one lease's)",
        merged_len as f64 / 1e9,
        merged_len as f64 / bytes.len() as f64
    );
    let wall = t.hash.wall() + t.decode.wall() + t.accept.wall() + t.merge.wall();
    println!(
        "before: ingest per partial (decoded path): hash {:.3} + decode {:.3} + acceptance {:.3} + merge {:.3} = {decoded:.2} CPU s, {wall:.2} s wall on {} threads",
        t.hash.cpu(),
        t.decode.cpu(),
        t.accept.cpu(),
        t.merge.cpu(),
        rayon::current_num_threads()
    );
    let wall = t.hash.wall() + t.checked.wall() + t.merge_packed.wall();
    println!(
        "after: coordinator ingest per partial (packed path): hash {:.3} + acceptance from the packed bytes {:.3} + add from them {:.3} = {packed:.2} CPU s ({:.2} GB/s of encoded partials per core, {:.2}x less CPU than before), {wall:.2} s wall",
        t.hash.cpu(),
        t.checked.cpu(),
        t.merge_packed.cpu(),
        gb / packed,
        decoded / packed
    );
    if let Some((dir, k)) = rss_files {
        rss_bench(&dir, k, bytes.len());
    }
    Measured {
        one: bytes.len(),
        merged: merged_len,
        decoded_cpu: decoded,
        ingest_cpu: packed,
    }
}

/// The exact sums a partial holds (statistics and importance matrix).
fn exact_sums(p: &Partial) -> usize {
    p.imatrix
        .entries
        .values()
        .map(|e| e.in_sum2.len() + e.in_sum.len())
        .sum::<usize>()
        + p.experts.groups.len() * (LAYERS * EXPERTS * 5) as usize
}

/// `p` with its own copy of every sum column (a clone shares them, and
/// writing a shared column copies it first: the timed merge would time
/// that copy), the columns `p`'s tensors share shared alike.
fn deep_copy(p: &Partial) -> Partial {
    let mut copy = p.clone();
    let mut done: Vec<(numbers::imatrix::Sums, numbers::imatrix::Sums)> = Vec::new();
    for e in copy.imatrix.entries.values_mut() {
        for column in e.sums_mut() {
            let own = match done.iter().find(|(old, _)| old.is_shared_with(column)) {
                Some((_, own)) => own.clone(),
                None => {
                    let own = numbers::imatrix::Sums::from(column.to_vec());
                    done.push((column.clone(), own.clone()));
                    own
                }
            };
            *column = own;
        }
    }
    copy
}

/// [`exact_sums`] as held in memory: a column that tensors share
/// (`numbers::imatrix::Sums`) counts once.
fn held_sums(p: &Partial) -> usize {
    let columns: Vec<&numbers::imatrix::Sums> =
        p.imatrix.entries.values().flat_map(|e| e.sums()).collect();
    let mut held = 0;
    for (i, c) in columns.iter().enumerate() {
        if !columns[..i].iter().any(|d| d.is_shared_with(c)) {
            held += c.len();
        }
    }
    held + p.experts.groups.len() * (LAYERS * EXPERTS * 5) as usize
}

/// Deliveries at once in the peak-memory simulation (0: none).
fn rss_deliveries() -> u32 {
    std::env::var("BENCH_RSS_DELIVERIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The partials of the peak-memory simulation: `template`'s values under
/// the chunks of leases 0.., one file each (the directory is removed after
/// the run); `None` when it is not asked for.
fn rss_files(template: &mut Partial, bytes: &[u8]) -> Option<(tempfile::TempDir, u32)> {
    let k = rss_deliveries();
    if k == 0 {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let chunks = template.chunks.clone();
    for lease in 0..k {
        let start = lease * LEASE_CHUNKS;
        template.chunks = vec![ChunkRange {
            start,
            end: start + LEASE_CHUNKS,
        }];
        let encoded = if template.chunks == chunks {
            bytes.to_vec()
        } else {
            template.to_bytes()
        };
        std::fs::write(dir.path().join(format!("{lease}.bin")), encoded).unwrap();
    }
    template.chunks = chunks;
    Some((dir, k))
}

/// Runs the peak-memory simulation in a child process (this binary with
/// `BENCH_RSS_CHILD` set), so its peak RSS is the ingest's alone.
fn rss_bench(dir: &tempfile::TempDir, k: u32, partial_bytes: usize) {
    let slots: usize = std::env::var("BENCH_RSS_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(config::run::RunSettings::default().ingest_slots as usize);
    // This binary: as the kernel names it, or as it was invoked when that
    // file was replaced meanwhile (a rebuild).
    let exe = std::env::current_exe()
        .ok()
        .filter(|p| p.exists())
        .unwrap_or_else(|| std::env::args().next().unwrap().into());
    let out = std::process::Command::new(&exe)
        .env("BENCH_RSS_CHILD", dir.path())
        .env("BENCH_RSS_SLOTS", slots.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    println!(
        "peak memory: {k} full-size partials ({:.3} GB each) delivered at once, {slots} ingest slots: {}",
        partial_bytes as f64 / 1e9,
        text.trim()
    );
}

/// The child of [`rss_bench`]: every partial of `dir` delivered at once,
/// one thread each, read whole, checked and handed to the merger through
/// `slots` ingest slots; prints the peak RSS and the total's size.
fn rss_child(dir: &std::path::Path, slots: usize) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let k = files.len() as u32;
    let accept = std::sync::Arc::new(acceptance(k, LEASE_CHUNKS));
    let free = std::sync::Arc::new((std::sync::Mutex::new(slots), std::sync::Condvar::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    let cpu = runfiles::procstat::process_cpu_seconds().unwrap();
    for (lease, file) in files.into_iter().enumerate() {
        let (accept, free, tx) = (accept.clone(), free.clone(), tx.clone());
        std::thread::spawn(move || {
            let (lock, cv) = &*free;
            let mut n = cv.wait_while(lock.lock().unwrap(), |n| *n == 0).unwrap();
            *n -= 1;
            drop(n);
            let bytes = Bytes::from(std::fs::read(&file).unwrap());
            sha256_hex(&bytes);
            let start = lease as u32 * LEASE_CHUNKS;
            let unit = ChunkRange {
                start,
                end: start + LEASE_CHUNKS,
            };
            let packed = accept.decode_and_check(&[unit], bytes).unwrap();
            tx.send(packed).unwrap();
        });
    }
    drop(tx);
    let mut total: Option<Partial> = None;
    for packed in rx {
        packed.add_to(&mut total).unwrap();
        let (lock, cv) = &*free;
        *lock.lock().unwrap() += 1;
        cv.notify_one();
    }
    let total = total.expect("a total");
    let (sums, held) = (exact_sums(&total), held_sums(&total));
    let peak = runfiles::procstat::peak_rss_kib().unwrap() as f64 * 1024.0;
    println!(
        "peak RSS {:.2} GB; the running total holds {:.1}M sums in {:.1}M held ({:.2} GB; tensors with equal sums share them); {} chunks merged in {:.1} s wall, {:.1} CPU s",
        peak / 1e9,
        sums as f64 / 1e6,
        held as f64 / 1e6,
        (held * 16) as f64 / 1e9,
        total.n_chunks(),
        t.elapsed().as_secs_f64(),
        runfiles::procstat::process_cpu_seconds().unwrap() - cpu
    );
}

/// What one kind of exact-sum column costs in the encoding.
#[derive(Default)]
struct Cost {
    sums: usize,
    bytes: usize,
    zeros: usize,
    /// Significant bits of the non-zero sums (`|x|` without its trailing
    /// zeros), plus a sign bit each in a column with negative sums.
    bits: u64,
}

impl Cost {
    fn add(&mut self, column: &[ExactSum], stored: bool) {
        self.sums += column.len();
        if !stored {
            self.bytes += 5;
            return;
        }
        let mut packed = Vec::new();
        numbers::packed::encode(column, &mut packed);
        self.bytes += packed.len() + 9;
        let signed = column.iter().any(|v| v.0 < 0);
        for v in column {
            let m = v.0.unsigned_abs();
            if m == 0 {
                self.zeros += 1;
            } else {
                self.bits +=
                    u64::from(128 - (m >> m.trailing_zeros()).leading_zeros()) + u64::from(signed);
            }
        }
    }
}

/// Where the encoded bytes of `p` go, per statistic and tensor kind, and the
/// significant bits its sums hold: what any encoding that stores each sum's
/// significant bits (and nothing less) needs at least.
fn breakdown(p: &Partial, total: usize) {
    let mut costs: BTreeMap<String, Cost> = BTreeMap::new();
    const STATS: [&str; 5] = [
        "prob_sum",
        "weight_sum",
        "ean_sum",
        "reap_l2_sum",
        "reap_l2_sq_sum",
    ];
    for g in p.experts.groups.values() {
        for l in &g.layers {
            for (name, column) in STATS.iter().zip(l.sums()) {
                costs
                    .entry(format!("statistics {name}"))
                    .or_default()
                    .add(column, true);
            }
        }
    }
    // A tensor equal to an earlier one of its layer is stored as a copy,
    // as the encoder finds (gate/up, attn q/k/v).
    let mut seen: Vec<&numbers::imatrix::ImatrixEntry> = Vec::new();
    for (name, e) in &p.imatrix.entries {
        let kind = name.splitn(3, '.').nth(2).unwrap_or(name);
        let stored = !seen.contains(&e);
        seen.push(e);
        for (stat, column) in ["in_sum2", "in_sum"].iter().zip(e.sums()) {
            let label = if stored {
                format!("imatrix {stat} {kind}")
            } else {
                format!("imatrix {stat} copies")
            };
            costs.entry(label).or_default().add(column, stored);
        }
    }
    let columns: usize = costs.values().map(|c| c.bytes).sum();
    let floor: u64 = costs.values().map(|c| c.bits.div_ceil(8)).sum();
    println!(
        "where the bytes go: header {} bytes, columns {columns} bytes; significant bits of the stored sums {floor} bytes ({:.3} GB: the least an encoding storing each sum's significant bits needs)",
        total - columns,
        (total - columns) as f64 / 1e9 + floor as f64 / 1e9
    );
    for (kind, c) in &costs {
        let nonzero = (c.sums - c.zeros).max(1);
        println!(
            "  {kind}: {} sums, {} bytes ({:.1}%), {:.2} bytes per sum; zeros {:.1}%, {:.1} significant bits per non-zero sum",
            c.sums,
            c.bytes,
            100.0 * c.bytes as f64 / total as f64,
            c.bytes as f64 / c.sums.max(1) as f64,
            100.0 * c.zeros as f64 / c.sums.max(1) as f64,
            c.bits as f64 / nonzero as f64
        );
    }
}

/// Seconds a simulated worker takes for one lease of 16,384 tokens.
const LEASE_SECONDS: u64 = 3;

/// The checkpoint simulation (see the module doc) for checkpoints of
/// `every` leases or `seconds`: returns (partials stored, the most
/// checkpoints a worker shipped before running out of work, simulated
/// seconds to the last acceptance).
fn checkpoint_run(every: usize, seconds: u64) -> (usize, usize, f64) {
    let units = plan(10_000_000 / CHUNK_TOKENS, LEASE_CHUNKS);
    let mut s = Scheduler::new(
        SchedConfig {
            lease_timeout: Duration::from_secs(3600),
            heartbeat_timeout: Duration::from_secs(60),
            ..SchedConfig::default()
        },
        units,
        &BTreeMap::new(),
    );
    struct W {
        id: WorkerId,
        computing: Option<(protocol::wire::LeaseId, Duration)>,
        held: Vec<protocol::wire::LeaseId>,
        since: Duration,
        due_checkpoints: usize,
    }
    let mut workers: Vec<W> = (0..64)
        .map(|i| W {
            id: WorkerId(i),
            computing: None,
            held: Vec::new(),
            since: Duration::ZERO,
            due_checkpoints: 0,
        })
        .collect();
    for w in &workers {
        s.register(w.id, Identity(w.id.0), Duration::ZERO);
    }
    let mut stored = 0;
    let mut ship = |s: &mut Scheduler, w: &mut W, now: Duration| {
        let held = std::mem::take(&mut w.held);
        match s.complete_set(&held, w.id, "h", now) {
            Completion::Accepted(_) | Completion::AcceptedSet(_) => stored += 1,
            other => panic!("a checkpoint was refused: {other:?}"),
        }
    };
    let mut now = Duration::ZERO;
    while !s.is_finished() {
        now += Duration::from_millis(100);
        for w in &mut workers {
            s.heartbeat(w.id, now).unwrap();
            match w.computing {
                Some((lease, done)) if done <= now => {
                    w.computing = None;
                    assert!(s.computed(lease, w.id, now));
                    if w.held.is_empty() {
                        w.since = now;
                    }
                    w.held.push(lease);
                    if w.held.len() >= every || now - w.since >= Duration::from_secs(seconds) {
                        w.due_checkpoints += 1;
                        ship(&mut s, w, now);
                    }
                }
                Some(_) => continue,
                None => {}
            }
            match s.request(w.id, now) {
                Grant::Lease(l) => {
                    w.computing = Some((l.lease_id, now + Duration::from_secs(LEASE_SECONDS)))
                }
                Grant::Wait(_) if !w.held.is_empty() => ship(&mut s, w, now),
                _ => {}
            }
        }
        s.tick(now);
    }
    let most = workers.iter().map(|w| w.due_checkpoints).max().unwrap_or(0);
    (stored, most, now.as_secs_f64())
}

fn checkpoint_bench(m: &Measured) {
    let leases = plan(10_000_000 / CHUNK_TOKENS, LEASE_CHUNKS).len();
    println!(
        "checkpoints: 64 workers, {leases} leases of 16,384 tokens (10M tokens), {LEASE_SECONDS} s a lease; one partial {:.3} GB, ingest {:.2} CPU s a partial (before: {:.2})",
        m.one as f64 / 1e9,
        m.ingest_cpu,
        m.decoded_cpu
    );
    for (every, seconds) in [(1, 3600), (4, 3600), (16, 3600), (1000, 60), (1000, 300)] {
        let (stored, most, wall) = checkpoint_run(every, seconds);
        let bound = 64 * (1 + most);
        let cores = stored as f64 * m.ingest_cpu / wall;
        println!(
            "  every {every} leases or {seconds} s: {stored} partials stored (bound 64 x (1 + {most}) = {bound}: {}), {:.1} GB at one lease's size ({:.1} GB at the checkpoint size measured above); run {wall:.0} s; ingest needs {stored} x {:.2} / {wall:.0} = {cores:.2} cores ({:.2} per core of 2; before {:.2} cores)",
            if stored <= bound { "holds" } else { "EXCEEDED" },
            stored as f64 * m.one as f64 / 1e9,
            stored as f64 * m.merged.max(m.one) as f64 / 1e9,
            m.ingest_cpu,
            cores / 2.0,
            stored as f64 * m.decoded_cpu / wall
        );
    }
    println!(
        "  the last checkpoints (one per worker, shipped when the work runs out) take 64 x {:.2} / 2 = {:.0} s to ingest on 2 cores after the last lease (before {:.0} s)",
        m.ingest_cpu,
        64.0 * m.ingest_cpu / 2.0,
        64.0 * m.decoded_cpu / 2.0
    );
}

/// One step's wall and CPU seconds, summed over the times it ran.
#[derive(Default)]
struct Step {
    n: u32,
    wall: f64,
    cpu: f64,
}

impl Step {
    fn add(&mut self, (wall, cpu): (f64, f64)) {
        self.n += 1;
        self.wall += wall;
        self.cpu += cpu;
    }

    fn wall(&self) -> f64 {
        self.wall / f64::from(self.n.max(1))
    }

    fn cpu(&self) -> f64 {
        self.cpu / f64::from(self.n.max(1))
    }
}

/// The coordinator's steps per lease.
#[derive(Default)]
struct Timings {
    hash: Step,
    accept: Step,
    decode: Step,
    merge: Step,
    parse: Step,
    checked: Step,
    merge_packed: Step,
}

/// `f`'s value, with its wall and CPU (this process, all threads) seconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, (f64, f64)) {
    let cpu = runfiles::procstat::process_cpu_seconds().unwrap();
    let t = Instant::now();
    let v = f();
    let wall = t.elapsed().as_secs_f64();
    (
        v,
        (
            wall,
            runfiles::procstat::process_cpu_seconds().unwrap() - cpu,
        ),
    )
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
        s.register(w, Identity(w.0), Duration::ZERO);
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
    if let Ok(dir) = std::env::var("BENCH_RSS_CHILD") {
        let slots = std::env::var("BENCH_RSS_SLOTS").unwrap().parse().unwrap();
        rss_child(std::path::Path::new(&dir), slots);
        return;
    }
    let leases: u32 = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    sched_bench();
    let measured = merge_bench(leases);
    checkpoint_bench(&measured);
}
