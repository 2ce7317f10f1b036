//! Integrity of stored and delivered partials (DESIGN section 8): damaged
//! stored partials are detected on resume and recomputed with real llama.cpp
//! workers, giving artifacts byte-identical to an undisturbed run; a worker
//! that fabricates token counts is refused while the run goes on; partials
//! made under other settings are not merged; accepted bytes are never
//! replaced.

use fixtures::fake_engine::FakeEngine;
use fixtures::loopback::{
    self, client, fake_setup, local_workers, real_setup, FAKE_MODEL, FAKE_N_CTX,
};
use numbers::partial::Partial;
use numbers::stats::GroupKey;
use numbers::{ChunkRange, Split};
use protocol::wire::JobInfo;
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::layout;
use runfiles::layout::PARTIALS;
use runfiles::store::RunStore;
use runfiles::trace::TraceRow;
use runtime::run::{execute, RunSetup, RunSummary};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use synth::Preset;
use worker::images::ImageBytes;
use worker::join::engine::{Engine, EngineLoader};
use worker::join::join;

const N_CHUNKS: u32 = 8;
const N_CTX: u32 = 64;

/// Runs with two real `worker join` processes.
async fn run(s: &RunSetup) -> Result<RunSummary, runtime::run::RunError> {
    let w = local_workers(2, &s.model_path);
    tokio::time::timeout(
        Duration::from_secs(300),
        execute(s, |l| w.spawn(l.addr, &l.pin, &l.secret)),
    )
    .await
    .expect("the run finishes in time")
}

/// saliency.json, saliency.parquet, imatrix.gguf, every trace part and every
/// per-lease partial.
async fn artifacts(store: &RunStore) -> Vec<(String, Vec<u8>)> {
    let mut all = loopback::artifacts(store, true).await;
    let partials: Vec<String> = store
        .list("partials")
        .await
        .unwrap()
        .into_iter()
        .filter(|n| PARTIALS.parse(n).is_some())
        .collect();
    all.extend(loopback::objects(store, partials).await);
    all
}

fn unit(i: u32) -> String {
    PARTIALS.object(ChunkRange {
        start: 2 * i,
        end: 2 * i + 2,
    })
}

/// The local path of an object of the run that [`setup`] made in `dir`.
fn path_of(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join("run").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_stored_partials_are_named_recomputed_and_give_identical_artifacts() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let s = real_setup(d.path(), &model, N_CHUNKS, N_CTX, 5);
    let first = run(&s).await.unwrap();
    assert_eq!(
        (
            first.leases.units,
            first.leases.computed,
            first.leases.resumed
        ),
        (4, 4, 0)
    );
    let reference = artifacts(&s.store).await;
    let report = stages::verify::verify(&s.store).await.unwrap();
    assert!(report.ok(), "{report}");
    let hashes = report
        .check(stages::verify::names::RECORDED_HASHES)
        .unwrap();
    assert_eq!(hashes.status, stages::verify::Status::Pass, "{hashes}");

    // Unit 0: one bit flipped. Unit 1: 700 bytes appended.
    let p0 = path_of(d.path(), &unit(0));
    let mut b = std::fs::read(&p0).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x10;
    std::fs::write(&p0, b).unwrap();
    let p1 = path_of(d.path(), &unit(1));
    let mut b = std::fs::read(&p1).unwrap();
    b.extend_from_slice(&[0u8; 700]);
    std::fs::write(&p1, b).unwrap();
    // verify notices before any resume.
    let report = stages::verify::verify(&s.store).await.unwrap();
    let hashes = report
        .check(stages::verify::names::RECORDED_HASHES)
        .unwrap();
    assert_eq!(hashes.status, stages::verify::Status::Fail, "{hashes}");
    assert!(
        hashes.figure.contains(&unit(0)) && hashes.figure.contains(&unit(1)),
        "{hashes}"
    );
    // Unit 2: a structural edit (one more fit token, with its k counts, so
    // every per-layer sum still adds up) whose new hash is written into the
    // manifest too: only the acceptance checks can tell.
    let p2 = path_of(d.path(), &unit(2));
    let mut p = Partial::from_bytes(&std::fs::read(&p2).unwrap()).unwrap();
    let k = p.experts.shape.n_expert_used as usize;
    let g = p
        .experts
        .groups
        .get_mut(&GroupKey {
            split: Split::Fit,
            domain: "en".into(),
            modality: numbers::Modality::Text,
        })
        .unwrap();
    g.n_tokens += 1;
    for l in &mut g.layers {
        for c in l.count.iter_mut().take(k) {
            *c += 1;
        }
    }
    let edited = p.to_bytes();
    std::fs::write(&p2, &edited).unwrap();
    let manifest_path = path_of(d.path(), "manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    manifest["partials"][unit(2)]["sha256"] = gguf::hash::sha256_hex(&edited).into();
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();

    let again = run(&s).await.unwrap();
    assert_eq!(
        (
            again.leases.units,
            again.leases.resumed,
            again.leases.computed
        ),
        (4, 1, 3)
    );
    let (rejected, why): (Vec<&str>, Vec<&str>) = again
        .leases
        .rejected
        .iter()
        .map(|(n, w)| (n.as_str(), w.as_str()))
        .unzip();
    assert_eq!(rejected, [unit(0), unit(1), unit(2)]);
    assert!(
        why[0].contains("bytes changed since they were accepted"),
        "{why:?}"
    );
    assert!(
        why[1].contains("bytes changed since they were accepted"),
        "{why:?}"
    );
    assert!(
        why[2].contains("token counts per (split, domain, modality)"),
        "{why:?}"
    );
    assert_eq!(s.store.list("rejected").await.unwrap().len(), 3);
    assert_eq!(artifacts(&s.store).await, reference);
    let report = stages::verify::verify(&s.store).await.unwrap();
    assert!(report.ok(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partials_made_under_other_settings_are_recomputed_not_merged() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let mut s = real_setup(d.path(), &model, N_CHUNKS, N_CTX, 5);
    s.run.n_ubatch = N_CTX / 2;
    let first = run(&s).await.unwrap();
    assert_eq!(first.leases.computed, 4);
    s.run.n_ubatch = N_CTX;
    let again = run(&s).await.unwrap();
    assert_eq!((again.leases.resumed, again.leases.computed), (0, 4));
    assert!(
        again
            .leases
            .rejected
            .iter()
            .all(|(_, why)| why.contains("computed under other settings")),
        "{:?}",
        again.leases.rejected
    );
    // The same as a run made under these settings from the start.
    let fresh = real_setup(&d.path().join("fresh"), &model, N_CHUNKS, N_CTX, 5);
    run(&fresh).await.unwrap();
    assert_eq!(artifacts(&s.store).await, artifacts(&fresh.store).await);
}

/// A worker that adds one token (with its k selections, so every layer's
/// `sum(count) == n_tokens * k` still holds) to the first group of each
/// partial it returns; `measured` is set once it has measured a lease.
#[derive(Clone)]
struct Liar(FakeEngine, Arc<AtomicBool>);

impl Engine for Liar {
    fn model_sha256(&self) -> String {
        self.0.model_sha256()
    }

    fn trace_shape(&self) -> (usize, usize) {
        self.0.trace_shape()
    }

    fn measure(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
    ) -> Result<(Partial, Vec<TraceRow>), String> {
        let (mut p, rows) = self.0.measure(index, chunks, images)?;
        self.1.store(true, Ordering::SeqCst);
        let k = p.experts.shape.n_expert_used as usize;
        let g = p.experts.groups.values_mut().next().expect("a group");
        g.n_tokens += 1;
        for l in &mut g.layers {
            for c in l.count.iter_mut().take(k) {
                *c += 1;
            }
        }
        Ok((p, rows))
    }
}

impl EngineLoader for Liar {
    type Engine = Liar;

    fn backend(&self) -> String {
        "liar".into()
    }

    fn load(self, _job: &JobInfo) -> Result<Liar, String> {
        Ok(self)
    }
}

// Each fabricated result is refused (the message names the token counts);
// after repeated failures the liar is quarantined and the honest worker
// finishes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_fabricating_token_counts_is_refused_and_the_run_goes_on() {
    let d = tempfile::tempdir().unwrap();
    let mut s = fake_setup(d.path(), 9);
    let chunks = fixtures::chunks(9, FAKE_N_CTX);
    s.run.max_attempts = 1000;
    let index = s.index.clone();
    let mut handles = Vec::new();
    let summary = tokio::time::timeout(
        Duration::from_secs(60),
        execute(&s, |l| {
            let opts = |name: &str| client(l, name);
            // As slow as the honest worker: without per-worker quarantine a
            // liar that answers instantly could use up a unit's attempts.
            let mut fake = FakeEngine::new(FAKE_MODEL);
            fake.delay_per_chunk = Duration::from_millis(30);
            let measured = Arc::new(AtomicBool::new(false));
            let liar = Liar(fake, measured.clone());
            let liar_opts = opts("liar");
            handles.push(tokio::spawn(async move {
                join(&liar_opts, liar).await.map(|_| ())
            }));
            let mut honest = FakeEngine::new(FAKE_MODEL);
            honest.delay_per_chunk = Duration::from_millis(30);
            let honest_opts = opts("honest");
            // The honest worker joins once the liar has measured a lease:
            // joining first, on two busy cores, it took every unit before
            // the liar got one.
            handles.push(tokio::spawn(async move {
                while !measured.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                join(&honest_opts, honest).await.map(|_| ())
            }));
            Ok(Vec::new())
        }),
    )
    .await
    .expect("the run finishes in time")
    .expect("the run succeeds despite the liar");
    assert_eq!((summary.leases.units, summary.leases.computed), (3, 3));
    assert!(
        summary.leases.retries >= 1,
        "the liar's results went back to the queue: {summary:?}"
    );
    let liar = summary.leases.worker("liar").unwrap();
    assert_eq!(liar.leases, 0, "no fabricated result was accepted");
    // The merged result is the honest engine's over every chunk.
    let reference = FakeEngine::new(FAKE_MODEL)
        .partial(&index, &chunks)
        .unwrap();
    let merged = Partial::from_bytes(&s.store.get(layout::MERGED_PARTIAL).await.unwrap()).unwrap();
    assert_eq!(merged.experts, reference.experts);
}

/// The tiny model with `qwen3moe.expert_count` patched to 0 in its header.
fn zero_expert_model(dir: &Path) -> std::path::PathBuf {
    let tiny = fixtures::model(dir, Preset::Tiny);
    let mut bytes = std::fs::read(&tiny).unwrap();
    let key = b"qwen3moe.expert_count";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the key is in the header");
    // key bytes, then the u32 value type (4), then the u32 value.
    let ty = at + key.len();
    assert_eq!(&bytes[ty..ty + 4], &4u32.to_le_bytes(), "a u32 value");
    bytes[ty + 4..ty + 8].copy_from_slice(&0u32.to_le_bytes());
    let path = dir.join("zero-experts.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_model_with_zero_experts_is_refused_by_name_not_aborted_on() {
    let d = tempfile::tempdir().unwrap();
    let model = zero_expert_model(d.path());
    let corpus = fixtures::corpus_dir(d.path(), "corpus-run", 2, 32);
    let dest = d.path().join("out");
    let out = fixtures::run(
        "worker",
        &fixtures::worker_args("collect", &model, &corpus, "0..2", &dest, &[]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an error exit, not a signal: {stderr}"
    );
    assert!(
        stderr.contains("zero-experts.gguf")
            && stderr.contains("qwen3moe.expert_count is missing or 0"),
        "{stderr}"
    );

    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/quickstart.toml");
    let out = fixtures::command("coordinator")
        .args([
            "run",
            config.to_str().unwrap(),
            "--local-workers",
            "1",
            "--model",
        ])
        .arg(&model)
        .arg("--out")
        .arg(d.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("qwen3moe.expert_count is missing or 0"),
        "{stderr}"
    );
    assert!(
        !d.path().join("run/corpus").exists(),
        "refused before any corpus work or lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_coordinator_on_one_location_is_refused_and_a_stale_lock_taken_over() {
    use runtime::run::lock::{LockBody, LOCK_FILE};
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 9);
    let first = {
        let s = s.clone();
        tokio::spawn(async move {
            execute(&s, |l| {
                let opts = client(l, "slow");
                let mut engine = FakeEngine::new(FAKE_MODEL);
                engine.delay_per_chunk = Duration::from_millis(150);
                tokio::spawn(async move { join(&opts, engine).await });
                Ok(Vec::new())
            })
            .await
        })
    };
    while !s.store.exists(LOCK_FILE).await.unwrap() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = execute(&s, |_| panic!("the second coordinator must not serve")).await;
    let e = second.unwrap_err().to_string();
    assert!(
        e.contains("run.lock is held by") && e.contains("pid"),
        "{e}"
    );
    let summary = first.await.unwrap().unwrap();
    assert_eq!(summary.leases.computed, 3);
    assert!(
        !s.store.exists(LOCK_FILE).await.unwrap(),
        "released at the end"
    );

    // A lock whose holder stopped refreshing it long ago is taken over.
    let lock = |heartbeat_ms: u64| {
        serde_json::to_vec(&LockBody {
            owner: "gone-host pid 1".into(),
            token: "t".into(),
            heartbeat_ms,
            process: None,
        })
        .unwrap()
    };
    s.store.put(LOCK_FILE, lock(0)).await.unwrap();
    let again = execute(&s, |_| panic!("everything is stored"))
        .await
        .unwrap();
    assert_eq!(again.leases.resumed, 3);
    // A fresh one only with an explicit take-over (stale timeout 0).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    s.store.put(LOCK_FILE, lock(now)).await.unwrap();
    let e = execute(&s, |_| panic!("refused"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("held by gone-host pid 1"), "{e}");
    let mut forced = s.clone();
    forced.run.lock_stale_s = 0;
    assert_eq!(
        execute(&forced, |_| panic!("stored"))
            .await
            .unwrap()
            .leases
            .resumed,
        3
    );
}
