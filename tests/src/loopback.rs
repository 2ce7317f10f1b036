//! Coordinator runs on loopback for the distributed tests: run settings over
//! a written corpus, QUIC client options, fake join workers, and the
//! artifacts that byte-identity tests compare.

use crate::fake_engine::FakeEngine;
use config::run::{ClusterSettings, RunSettings};
use protocol::wire::{Refusal, ToWorker};
use runfiles::layout;
use runfiles::store::RunStore;
use runtime::run::local::LocalWorkers;
use runtime::run::{execute, Listening, RunError, RunSetup, RunSummary};
use std::path::Path;
use std::time::Duration;
use tokio::task::JoinHandle;
use worker::join::tls::Trust;
use worker::join::{join, ClientOptions, JoinError, JoinSummary, Reconnect};

/// The model hash the fake engine claims unless a test says otherwise.
pub const FAKE_MODEL: &str = "fake-model-sha";

/// Tokens per chunk of the fake runs.
pub const FAKE_N_CTX: u32 = 32;

/// A run for fake workers over `n_chunks` chunks of [`FAKE_N_CTX`] tokens
/// written under `dir`, with short leases and heartbeats so failures show fast.
pub fn fake_setup(dir: &Path, n_chunks: u32) -> RunSetup {
    let chunks = crate::chunks(n_chunks, FAKE_N_CTX);
    let index = crate::write_corpus(dir, &chunks, FAKE_N_CTX);
    RunSetup {
        store: RunStore::open(dir.to_str().unwrap()).unwrap(),
        index,
        model_sha256: FAKE_MODEL.into(),
        model_path: "unused.gguf".into(),
        mmproj: None,
        run: RunSettings {
            lease_chunks: 3,
            heartbeat_timeout_s: 2,
            lease_timeout_s: 30,
            ..RunSettings::default()
        },
        cluster: ClusterSettings::default(),
    }
}

/// [`fake_setup`] whose model file is the fake engine's
/// ([`FakeEngine::model_gguf`], written as `dir/fake-model.gguf`): the
/// coordinator reads its header and checks every partial against the
/// model's expert facts and importance-matrix entries, as a real run does.
pub fn fake_setup_with_model(dir: &Path, n_chunks: u32) -> RunSetup {
    let model = dir.join("fake-model.gguf");
    std::fs::write(&model, FakeEngine::new(FAKE_MODEL).model_gguf()).unwrap();
    RunSetup {
        model_path: model,
        ..fake_setup(dir, n_chunks)
    }
}

/// A run for real llama.cpp workers on `model` over `n_chunks` chunks of
/// `n_ctx` tokens written under `dir/run`: two chunks a lease, one
/// micro-batch a chunk, half of the tokens traced (top 8).
pub fn real_setup(
    dir: &Path,
    model: &Path,
    n_chunks: u32,
    n_ctx: u32,
    heartbeat_timeout_s: u64,
) -> RunSetup {
    let run_dir = dir.join("run");
    let index = crate::write_corpus(&run_dir, &crate::chunks(n_chunks, n_ctx), n_ctx);
    RunSetup {
        store: RunStore::open(run_dir.to_str().unwrap()).unwrap(),
        index,
        model_sha256: worker::collect::sha256_file(model).unwrap(),
        model_path: model.to_path_buf(),
        mmproj: None,
        run: RunSettings {
            lease_chunks: 2,
            heartbeat_timeout_s,
            lease_timeout_s: 120,
            n_ubatch: n_ctx,
            // Without a manifest the corpus counts as one split.
            trace_tokens_per_split: u64::from(n_chunks * n_ctx / 2),
            trace_top_n: 8,
            ..RunSettings::default()
        },
        cluster: ClusterSettings::default(),
    }
}

/// `count` local `worker join` processes of this build on `model`, one
/// thread each.
pub fn local_workers(count: u32, model: &Path) -> LocalWorkers {
    let run = RunSettings {
        local_worker_threads: Some(1),
        ..RunSettings::default()
    };
    LocalWorkers::new(
        crate::bin("worker"),
        &run,
        Vec::new(),
        model.to_path_buf(),
        count,
    )
}

/// Starts `w` for the listening coordinator `l` and adds their pids to
/// `pids` (for a test that kills one): a run's `on_listen`.
pub fn spawn_noting_pids(
    w: &LocalWorkers,
    l: &Listening,
    pids: &std::sync::Mutex<Vec<u32>>,
) -> Result<Vec<tokio::process::Child>, RunError> {
    let children = w.spawn(l.addr, &l.pin, &l.secret)?;
    pids.lock()
        .unwrap()
        .extend(children.iter().filter_map(|c| c.id()));
    Ok(children)
}

/// `local` moved to a fresh prefix `s3://BUCKET/TAG-RANDOM` of the S3 test
/// bucket, with its corpus copied there.
pub async fn on_s3(bucket: &str, tag: &str, local: &RunSetup) -> RunSetup {
    let prefix = format!(
        "s3://{bucket}/{tag}-{}",
        gguf::hash::sha256_hex(&protocol::wire::random_bytes(8))
    );
    let s3 = RunStore::open(&prefix).unwrap();
    crate::copy_corpus(&local.store, &s3).await;
    RunSetup {
        store: s3,
        ..local.clone()
    }
}

/// Client options that trust the listening coordinator by its pin and give
/// up reconnecting after 8 s.
pub fn client(l: &Listening, name: &str) -> ClientOptions {
    ClientOptions {
        addr: l.addr,
        server_name: "localhost".into(),
        trust: Trust::Pin(l.pin.clone()),
        key: protocol::secret::WorkerKey::derive(&l.secret, name),
        name: name.into(),
        reconnect: Reconnect::giving_up_after(Duration::from_secs(8)),
    }
}

/// In-process join workers of one run.
pub type Workers = Vec<JoinHandle<Result<JoinSummary, JoinError>>>;

/// Runs `execute` with workers made by `make` once the server listens; the
/// run must succeed within a minute.
pub async fn run_with(
    setup: &RunSetup,
    make: impl FnOnce(&Listening) -> Workers + Send,
) -> (RunSummary, Workers) {
    let mut handles = Vec::new();
    let summary = tokio::time::timeout(
        Duration::from_secs(60),
        execute(setup, |l| {
            handles = make(l);
            Ok(Vec::new())
        }),
    )
    .await
    .expect("the run finishes in time")
    .expect("the run succeeds");
    (summary, handles)
}

/// [`run_with`] with the log captured first, for tests that read it
/// ([`crate::log::log_text`]).
pub async fn run_logged(
    setup: &RunSetup,
    make: impl FnOnce(&Listening) -> Workers + Send,
) -> (RunSummary, Workers) {
    crate::log::captured_log();
    run_with(setup, make).await
}

/// `n` fake workers named `fake-0..`, each taking `delay` per chunk.
pub fn fake_workers(l: &Listening, n: usize, delay: Duration) -> Workers {
    fake_workers_telling(l, n, delay, None)
}

/// [`fake_workers`] whose engines tell `measuring` each time they start a
/// lease (so a test knows they joined and hold work).
pub fn fake_workers_telling(
    l: &Listening,
    n: usize,
    delay: Duration,
    measuring: Option<std::sync::Arc<tokio::sync::Notify>>,
) -> Workers {
    (0..n)
        .map(|i| {
            let opts = client(l, &format!("fake-{i}"));
            let mut engine = FakeEngine::new(FAKE_MODEL);
            engine.delay_per_chunk = delay;
            engine.measuring = measuring.clone();
            tokio::spawn(async move { join(&opts, engine).await })
        })
        .collect()
}

/// [`run_logged`] with `n` fake workers taking `delay` per chunk and one
/// scripted worker, the future `script` makes of the listening coordinator,
/// started once a fake worker holds a lease (so an honest one measures
/// first); the run's summary and what the script returned.
pub async fn run_beside_fake_workers<T, F>(
    setup: &RunSetup,
    n: usize,
    delay: Duration,
    script: impl FnOnce(Listening) -> F + Send,
) -> (RunSummary, T)
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (summary, _) = run_logged(setup, |l| {
        let at_work = std::sync::Arc::new(tokio::sync::Notify::new());
        let (go, scripted) = (at_work.clone(), script(l.clone()));
        let mut hs = vec![tokio::spawn(async move {
            go.notified().await;
            let _ = tx.send(scripted.await);
            Ok(JoinSummary::default())
        })];
        hs.extend(fake_workers_telling(l, n, delay, Some(at_work)));
        hs
    })
    .await;
    (summary, rx.await.expect("the scripted worker finished"))
}

/// Asserts how a run of `s` with one misbehaving scripted worker `name` must
/// end: `end`, the last answer that worker got, refuses it as quarantined;
/// the summary lists it quarantined with no lease counted; `computed` units
/// were computed; and the artifacts are the fake engine's honest ones.
pub async fn assert_quarantined_and_honest(
    s: &RunSetup,
    summary: &RunSummary,
    name: &str,
    end: &Option<ToWorker>,
    computed: usize,
) {
    assert!(
        matches!(end, Some(ToWorker::Refused(Refusal::Quarantined(_)))),
        "{end:?}"
    );
    let w = summary.leases.worker(name).unwrap();
    assert!(w.quarantined && w.leases == 0, "{w:?}");
    assert_eq!(summary.leases.computed, computed);
    assert_eq!(artifacts(&s.store, false).await, fake_reference(s).await);
}

/// The artifacts of the fake engine over all chunks of `s` in one call:
/// what an honest run must produce, computed without the coordinator.
pub async fn fake_reference(s: &RunSetup) -> Vec<(String, Vec<u8>)> {
    fake_reference_of(s, &FakeEngine::new(FAKE_MODEL)).await
}

/// [`fake_reference`] for a fake engine of another shape.
pub async fn fake_reference_of(s: &RunSetup, engine: &FakeEngine) -> Vec<(String, Vec<u8>)> {
    let all = crate::chunks(s.index.n_chunks, FAKE_N_CTX);
    let partial = engine.partial(&s.index, &all).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    runfiles::artifacts::write_results(&store, &partial)
        .await
        .unwrap();
    artifacts(&store, false).await
}

/// The named objects with their bytes, in the order given.
pub async fn objects(store: &RunStore, names: Vec<String>) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in names {
        let bytes = store.get(&n).await.unwrap().to_vec();
        out.push((n, bytes));
    }
    out
}

/// saliency.json, saliency.parquet and imatrix.gguf, then every trace part
/// when `traces` is set: what must not depend on how work was spread.
pub async fn artifacts(store: &RunStore, traces: bool) -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<String> = vec![
        layout::SALIENCY_JSON.into(),
        layout::SALIENCY_PARQUET.into(),
        layout::IMATRIX_GGUF.into(),
    ];
    if traces {
        names.extend(store.list("trace").await.unwrap());
    }
    objects(store, names).await
}
