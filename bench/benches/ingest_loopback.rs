//! The coordinator's ingest of real-size partials on the path a cluster run
//! takes (`cargo bench -p moe-census-runtime --bench ingest_loopback`): a
//! real run (`runtime::run::execute`) listening on loopback QUIC, fed by a
//! real `join` client in a child process whose engine returns partials at
//! the real shape ([`realistic`]: 48 MoE layers x 512 experts, hidden
//! 2,048, 0.98 GB encoded). Too large for a frame, each is staged by the
//! worker in the run's storage (a local directory) and named in `Done`; the
//! coordinator reads it back, hashes, checks and merges it, stores it under
//! its final name and records it in the manifest.
//!
//! The coordinator process's CPU seconds (all threads, user + system) are
//! read at every "lease merged" log event: the CPU between two merges is
//! one partial's whole ingest (the worker, in its own process, builds the
//! next partial meanwhile). The first partial becomes the running total
//! (decoded, not added), so partials 2.. are the figure.
//!
//! `BENCH_LEASES` (default 5) sets the number of leases of 8 chunks; each
//! needs 2 GB of disk under `BENCH_DIR` (default the system's temporary
//! directory) while the run lasts. `BENCH_WORKERS` (default 1) sets the
//! number of join clients (each holds a partial of about 3 GB while it
//! builds and stages it); each prints its gaps between leases at its end:
//! the time a worker spends not computing, the coordinator's answer to its
//! staged result included.

use config::run::{ClusterSettings, RunSettings};
use numbers::ChunkRange;
use protocol::secret::{JoinSecret, WorkerKey};
use protocol::wire::JobInfo;
use realistic::{CHUNK_TOKENS, SPAN};
use runfiles::corpus::{write_chunks, Chunk, CorpusIndex, CHUNKS_FILE, INDEX_FILE};
use runfiles::procstat::process_cpu_seconds;
use runfiles::store::RunStore;
use runfiles::trace::TraceRow;
use runtime::run::{execute, Listening, RunSetup};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt;
use worker::join::engine::{Engine, EngineLoader};
use worker::join::tls::Trust;
use worker::join::{join, ClientOptions, Reconnect};

mod realistic;

/// Chunks per lease (of [`CHUNK_TOKENS`] tokens: a lease of 16,384 tokens).
const LEASE_CHUNKS: u32 = 8;

/// The model hash the run and the worker's engine agree on.
const MODEL: &str = "bench-model";

/// The environment variable that makes this binary the worker.
const PEER: &str = "BENCH_INGEST_PEER";

/// Writes the corpus of `n_chunks` chunks under the run directory `dir`.
fn write_corpus(dir: &std::path::Path, n_chunks: u32) -> CorpusIndex {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let bytes = write_chunks(&realistic::chunks(n_chunks)).unwrap();
    let index = CorpusIndex {
        n_chunks,
        n_ctx: CHUNK_TOKENS,
        domains: vec!["code".into(), "chat".into()],
        n_tokens: u64::from(n_chunks) * u64::from(CHUNK_TOKENS),
        chunks_sha256: gguf::hash::sha256_hex(&bytes),
        eval_sets: Vec::new(),
        groups: Vec::new(),
    };
    std::fs::write(corpus.join(CHUNKS_FILE), bytes).unwrap();
    std::fs::write(corpus.join(INDEX_FILE), serde_json::to_vec(&index).unwrap()).unwrap();
    index
}

/// An engine whose partials are [`realistic`] ones of the chunks asked for;
/// it keeps the gaps between one lease's end and the next one's start
/// (staging the result, the coordinator's answer, the next lease).
#[derive(Clone, Default)]
struct Realistic {
    gaps: Arc<Mutex<(Option<Instant>, Vec<f64>)>>,
}

impl Engine for Realistic {
    fn model_sha256(&self) -> String {
        MODEL.into()
    }

    fn trace_shape(&self) -> (usize, usize) {
        (realistic::TOP_K as usize, realistic::EXPERTS as usize)
    }

    fn measure(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        _images: &worker::images::ImageBytes,
    ) -> Result<(numbers::partial::Partial, Vec<TraceRow>), String> {
        if let (Some(end), gaps) = &mut *self.gaps.lock().unwrap() {
            gaps.push(end.elapsed().as_secs_f64());
        }
        let (start, n) = (chunks[0].id.0, chunks.len() as u32);
        let seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(start);
        let experts = realistic::experts(seed, u64::from(SPAN * n), n);
        let imatrix = realistic::imatrix(seed, n, &experts);
        let range = ChunkRange {
            start,
            end: start + n,
        };
        let mut p = realistic::partial(experts, imatrix, vec![range]);
        p.model_sha256 = MODEL.into();
        p.corpus_sha256 = index.chunks_sha256.clone();
        self.gaps.lock().unwrap().0 = Some(Instant::now());
        Ok((p, Vec::new()))
    }
}

impl EngineLoader for Realistic {
    type Engine = Realistic;

    fn backend(&self) -> String {
        "cuda:bench".into()
    }

    fn load(self, _job: &JobInfo) -> Result<Realistic, String> {
        Ok(self)
    }
}

/// The worker: joins the coordinator at `peer` (`ADDR PIN SECRET-HEX
/// NAME`), measures until the run ends, and prints its gaps between leases.
fn worker_main(peer: &str) {
    let [addr, pin, secret, name] = peer.split(' ').collect::<Vec<_>>()[..] else {
        panic!("{PEER}: expected ADDR PIN SECRET NAME");
    };
    let secret = JoinSecret::new(&hex::decode(secret).unwrap(), PEER).unwrap();
    let opts = ClientOptions {
        addr: addr.parse().unwrap(),
        server_name: "localhost".into(),
        trust: Trust::Pin(pin.into()),
        key: WorkerKey::derive(&secret, name),
        name: name.into(),
        reconnect: Reconnect::giving_up_after(Duration::from_secs(30)),
    };
    let engine = Realistic::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(join(&opts, engine.clone())).unwrap();
    let gaps = engine.gaps.lock().unwrap().1.clone();
    if !gaps.is_empty() {
        println!(
            "  {name}: {} leases after its first; between a lease's end and the next one's start (staging, the coordinator's answer, the next lease): mean {:.2} s, max {:.2} s",
            gaps.len(),
            gaps.iter().sum::<f64>() / gaps.len() as f64,
            gaps.iter().copied().fold(0.0, f64::max)
        );
    }
}

/// The coordinator's CPU seconds, the time and its peak RSS (GB) at each
/// "lease merged" event.
#[derive(Clone, Default)]
struct Merges(Arc<Mutex<Vec<(f64, Instant, f64)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Merges {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 |= format!("{v:?}").ends_with("merged");
                }
            }
        }
        let mut m = Message(false);
        event.record(&mut m);
        if m.0 {
            let cpu = process_cpu_seconds().unwrap();
            let peak = runfiles::procstat::peak_rss_kib().unwrap_or(0) as f64 * 1024.0 / 1e9;
            self.0.lock().unwrap().push((cpu, Instant::now(), peak));
        }
    }
}

fn main() {
    if let Ok(peer) = std::env::var(PEER) {
        return worker_main(&peer);
    }
    let leases: u32 = std::env::var("BENCH_LEASES")
        .map(|v| v.parse().expect("BENCH_LEASES: a number"))
        .unwrap_or(5);
    let workers: u32 = std::env::var("BENCH_WORKERS")
        .map(|v| v.parse().expect("BENCH_WORKERS: a number"))
        .unwrap_or(1);
    assert!(
        leases >= 3,
        "BENCH_LEASES: at least 3 (the first partial is not added)"
    );
    let base =
        std::env::var("BENCH_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let dir = tempfile::tempdir_in(base).unwrap();
    let index = write_corpus(dir.path(), leases * LEASE_CHUNKS);
    let setup = RunSetup {
        store: RunStore::open(dir.path().to_str().unwrap()).unwrap(),
        index,
        model_sha256: MODEL.into(),
        model_path: dir.path().join("absent.gguf"),
        mmproj: None,
        run: RunSettings {
            lease_chunks: LEASE_CHUNKS,
            checkpoint_leases: 1,
            trace_tokens_per_split: 0,
            lease_timeout_s: 3600,
            heartbeat_timeout_s: 120,
            ..RunSettings::default()
        },
        cluster: ClusterSettings::default(),
    };
    let merges = Merges::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(merges.clone()))
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cpu0, t0) = (process_cpu_seconds().unwrap(), Instant::now());
    let summary = rt
        .block_on(execute(&setup, |l: &Listening| {
            let secret = hex::encode(l.secret.expose());
            (0..workers)
                .map(|i| {
                    let peer = format!("{} {} {secret} bench-worker-{i}", l.addr, l.pin);
                    tokio::process::Command::new(&exe)
                        .env(PEER, peer)
                        .kill_on_drop(true)
                        .spawn()
                        .map_err(|e| {
                            runtime::run::RunError::Setup(format!("the bench worker: {e}"))
                        })
                })
                .collect()
        }))
        .unwrap();
    let (cpu_end, wall_end) = (process_cpu_seconds().unwrap() - cpu0, t0.elapsed());
    assert_eq!(summary.leases.computed, leases as usize);
    let merged = merges.0.lock().unwrap().clone();
    assert_eq!(merged.len(), leases as usize, "one merge per lease");
    let stored = std::fs::metadata(dir.path().join("partials"))
        .map(|_| du(&dir.path().join("partials")))
        .unwrap_or(0);
    println!(
        "{leases} real-size partials staged by {workers} join client(s) and ingested by a real run over loopback QUIC ({} cores)",
        std::thread::available_parallelism().unwrap()
    );
    let per: Vec<f64> = merged.windows(2).map(|w| w[1].0 - w[0].0).collect();
    for (i, cpu) in per.iter().enumerate() {
        println!(
            "  partial {}: {cpu:.2} CPU s from the previous merge to its own (peak RSS so far {:.2} GB)",
            i + 2,
            merged[i + 1].2
        );
    }
    let mean = per.iter().sum::<f64>() / per.len() as f64;
    println!(
        "coordinator ingest per added partial (read from storage, hash, check, add, store, record): {mean:.2} CPU s (mean of {})",
        per.len()
    );
    println!(
        "whole run: {cpu_end:.1} CPU s, {:.1} s wall (first partial decoded into the total: {:.2} CPU s from the start; after the last merge: {:.1} CPU s writing the results); partials stored: {stored} bytes; coordinator peak RSS {:.2} GB",
        wall_end.as_secs_f64(),
        merged[0].0 - cpu0,
        cpu_end - (merged[merged.len() - 1].0 - cpu0),
        runfiles::procstat::peak_rss_kib().unwrap_or(0) as f64 * 1024.0 / 1e9,
    );
}

/// Bytes of the files under `dir`.
fn du(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                du(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}
