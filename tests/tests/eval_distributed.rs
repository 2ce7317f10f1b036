//! `coordinator eval` over loopback QUIC with real llama.cpp workers (`worker
//! join` processes) on the generated `tiny` model: byte-identical `eval/`
//! results for 1 and 3 workers, a worker killed mid-eval, resume from stored
//! eval partials (no worker started), a keep-all candidate at KL 0, a
//! worker whose slice differs from the coordinator's refusing the job, and
//! the coordinator refusing a worker (real join code and engine) that lies
//! about a candidate's SHA-256, re-running its leases on an honest worker.

use config::run::{ClusterSettings, RunSettings};
use fixtures::loopback::{local_workers, spawn_noting_pids};
use measure::eval::{evaluate, EvalOutcome, EvalRunError, EvalSettings, EvalSetup};
use numbers::eval::EvalPartial;
use numbers::ChunkRange;
use numbers::Split;
use protocol::wire::{EvalJob, JobInfo, Refusal};
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::keepmap::KeepMap;
use runfiles::layout::eval as names;
use runfiles::store::RunStore;
use runtime::run::{read_index, RunError, RunSetup};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use synth::Preset;
use tokio::process::Child;
use worker::collect::device::Reduce;
use worker::eval::candidates::Inputs;
use worker::eval::Compare;
use worker::images::ImageBytes;
use worker::join::engine::{CollectorLoader, EngineLoader};
use worker::join::eval_engine::EvalEngine;
use worker::join::{join, JoinError};

const N_CHUNKS: u32 = 8;
const N_CTX: u32 = 48;
const CANDIDATES: [&str; 2] = ["frequency_K16", "frequency_K8"];

/// A run with a corpus, a manifest naming the model and two keep maps of
/// the tiny model (16 experts, MoE blocks 0..3): all experts, and the first 8.
async fn setup(dir: &Path, model: &Path) -> EvalSetup {
    let run_dir = dir.join("run");
    fixtures::write_corpus(&run_dir, &fixtures::chunks(N_CHUNKS, N_CTX), N_CTX);
    let store = RunStore::open(run_dir.to_str().unwrap()).unwrap();
    let sha = worker::collect::sha256_file(model).unwrap();
    store
        .put(
            "manifest.json",
            serde_json::to_vec(&serde_json::json!({ "model_sha256": sha })).unwrap(),
        )
        .await
        .unwrap();
    for k in [16u32, 8] {
        let map = KeepMap {
            method: "frequency".into(),
            k,
            params: serde_json::json!({}),
            saliency_sha256: "test".into(),
            layers: (0..3).map(|l| (l, (0..k).collect())).collect(),
        };
        store
            .put(
                &KeepMap::file_name("frequency", k),
                serde_json::to_vec(&map).unwrap(),
            )
            .await
            .unwrap();
    }
    let settings = EvalSettings {
        keep_maps: CANDIDATES.iter().map(|s| s.to_string()).collect(),
        ..EvalSettings::default()
    };
    let prepared = measure::eval::job(&store, model, &settings).await.unwrap();
    EvalSetup {
        base: RunSetup {
            index: read_index(&store).await.unwrap(),
            store,
            model_sha256: prepared.base_sha256,
            model_path: model.to_path_buf(),
            mmproj: None,
            run: RunSettings {
                lease_chunks: 2,
                heartbeat_timeout_s: 3,
                lease_timeout_s: 120,
                n_ubatch: 16,
                ..RunSettings::default()
            },
            cluster: ClusterSettings::default(),
        },
        job: prepared.job,
        out: runfiles::layout::EVAL,
        choice: measure::eval::Choice {
            sizes: prepared.sizes,
            kl_budget: Some(1.0),
            budget_scope: Default::default(),
        },
    }
}

/// Evaluates with `count` local worker processes; their pids go to `pids`.
async fn eval(
    s: &EvalSetup,
    count: u32,
    pids: Arc<Mutex<Vec<u32>>>,
) -> Result<EvalOutcome, EvalRunError> {
    let w = local_workers(count, &s.base.model_path);
    tokio::time::timeout(
        Duration::from_secs(300),
        evaluate(s, |l| spawn_noting_pids(&w, l, &pids)),
    )
    .await
    .expect("the evaluation finishes in time")
}

/// Every object under `eval/`, by name.
async fn results(store: &RunStore) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for n in store.list("eval").await.unwrap() {
        out.insert(n.clone(), store.get(&n).await.unwrap().to_vec());
    }
    out
}

/// The manifest's records of accepted eval partials.
async fn eval_records(store: &RunStore) -> serde_json::Value {
    let m: serde_json::Value =
        serde_json::from_slice(&store.get("manifest.json").await.unwrap()).unwrap();
    m["eval_partials"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_and_three_workers_give_byte_identical_results_and_keep_all_costs_nothing() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let one = setup(&d.path().join("one"), &model).await;
    let three = setup(&d.path().join("three"), &model).await;
    let o1 = eval(&one, 1, Arc::default()).await.unwrap();
    let o3 = eval(&three, 3, Arc::default()).await.unwrap();
    assert_eq!(
        (o1.leases.units, o1.leases.computed, o3.leases.computed),
        (4, 4, 4)
    );
    let (r1, r3) = (
        results(&one.base.store).await,
        results(&three.base.store).await,
    );
    assert!(r1.contains_key(names::SUMMARY_PARQUET) && r1.contains_key(names::MERGED));
    assert_eq!(r1.len(), 3 + 4, "{:?}", r1.keys());
    assert_eq!(r1, r3, "eval/ differs between 1 and 3 workers");
    // Every stored eval partial has its SHA-256 recorded in the manifest.
    let records = eval_records(&one.base.store).await;
    for (name, bytes) in r1.iter().filter(|(n, _)| n.starts_with("eval/partials/")) {
        assert_eq!(
            records[name]["sha256"].as_str(),
            Some(gguf::hash::sha256_hex(bytes).as_str()),
            "{name}"
        );
    }
    let s = &o1.summary;
    let (keep_all, pruned) = (&s.candidates[0], &s.candidates[1]);
    assert_eq!((keep_all.k, pruned.k), (16, 8));
    for split in &Split::ALL {
        let a = &keep_all.splits[split].all;
        assert_eq!(
            (a.kl.mean, a.kl.max, a.top1_same),
            (0.0, 0.0, 1.0),
            "{split}"
        );
        assert_eq!(a.ppl_ratio, 1.0, "{split}");
        let p = &pruned.splits[split].all;
        assert!(p.kl.mean > 1e-4 && p.top1_same < 1.0, "{split}: {p:?}");
        assert_eq!(a.n, p.n);
    }
    let merged = EvalPartial::from_bytes(&r1[names::MERGED]).unwrap();
    assert_eq!(merged.n_chunks(), u64::from(N_CHUNKS));
    // Positions: the second half of each chunk by default (llama-perplexity's).
    assert_eq!(s.skip_first, N_CTX / 2);
    assert!(merged.candidates[1]
        .tokens
        .iter()
        .all(|t| t.pos >= N_CTX / 2));
    // The keep-all candidate is the best; the pruned one is paired with it,
    // and with KL exactly 0 on one side the paired difference is its mean.
    let held = &pruned.splits[&Split::Heldout];
    let pair = held.paired.as_ref().unwrap();
    assert_eq!(pair.against, "frequency_K16");
    assert!((pair.diff - held.all.kl.mean).abs() < 1e-12, "{pair:?}");
    // Intervals are by held-out group: n/a (NaN ends) below two groups.
    if pair.ci.clusters >= 2 {
        assert!(
            pair.ci.lo <= pair.diff && pair.diff <= pair.ci.hi,
            "{pair:?}"
        );
        assert!(held.all.kl.hi > held.all.kl.mean, "{:?}", held.all);
    } else {
        assert!(pair.ci.lo.is_nan() && pair.ci.hi.is_nan(), "{pair:?}");
        assert!(held.all.kl.hi.is_nan(), "{:?}", held.all);
    }
    assert!(held.all.chunks >= 2, "{:?}", held.all);
    // Sizes come from the coordinator's slices; the budget picks per method.
    let bytes = |c: &numbers::eval::summary::CandidateSummary| c.bytes.unwrap();
    assert!(bytes(pruned) < bytes(keep_all));
    let budget = s.budget.as_ref().unwrap();
    // No interval below two held-out groups: then no K can be shown to fit.
    let want = if pair.ci.clusters < 2 {
        None
    } else if held.all.kl.hi <= 1.0 {
        Some("frequency_K8")
    } else {
        Some("frequency_K16")
    };
    assert_eq!(budget.picks["frequency"].as_deref(), want);
}

/// Worker-side aggregation changes no bit of an evaluation: with
/// checkpoints of 3 leases, 1 and 3 workers give the per-lease run's summary
/// and merged partial, and one worker stores fewer partials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointed_evaluations_give_the_results_of_per_lease_ones() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let per_lease = setup(&d.path().join("per-lease"), &model).await;
    assert_eq!(
        per_lease.base.run.checkpoint_leases, 1,
        "the default ships every lease"
    );
    eval(&per_lease, 1, Arc::default()).await.unwrap();
    let is_partial = |n: &str| n.starts_with("eval/partials/");
    let merged = |r: BTreeMap<String, Vec<u8>>| -> BTreeMap<String, Vec<u8>> {
        r.into_iter().filter(|(n, _)| !is_partial(n)).collect()
    };
    let expected = merged(results(&per_lease.base.store).await);
    assert!(expected.contains_key(names::SUMMARY_PARQUET) && expected.contains_key(names::MERGED));
    for count in [1, 3] {
        let mut s = setup(&d.path().join(format!("checkpoints-{count}")), &model).await;
        s.base.run.checkpoint_leases = 3;
        let o = eval(&s, count, Arc::default()).await.unwrap();
        assert_eq!(
            (o.leases.units, o.leases.computed),
            (4, 4),
            "{count} workers"
        );
        let got = results(&s.base.store).await;
        let partials = got.keys().filter(|n| is_partial(n)).count();
        if count == 1 {
            assert_eq!(partials, 2, "4 leases in checkpoints of 3: 3, then 1");
        }
        assert_eq!(merged(got), expected, "{count} workers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_eval_loses_nothing_and_resume_reuses_stored_partials() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let reference = setup(&d.path().join("reference"), &model).await;
    eval(&reference, 1, Arc::default()).await.unwrap();
    let expected = results(&reference.base.store).await;

    let s = setup(&d.path().join("killed"), &model).await;
    let pids: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (store, victim) = (s.base.store.clone(), pids.clone());
    // Kill one worker with SIGKILL as soon as the first eval lease is
    // stored, however long that takes (the evaluation's own timeout bounds it).
    let killer = tokio::spawn(async move {
        loop {
            let stored = store.list("eval/partials").await.unwrap_or_default();
            if !stored.is_empty() {
                if let Some(pid) = victim.lock().unwrap().first().copied() {
                    let _ = std::process::Command::new("kill")
                        .args(["-9", &pid.to_string()])
                        .status();
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let o = eval(&s, 2, pids).await.unwrap();
    assert!(killer.await.unwrap(), "a worker was killed");
    assert_eq!(o.leases.computed, 4);
    assert_eq!(results(&s.base.store).await, expected);

    // Resume: everything stored is reused; no worker is started or leased to.
    let again = evaluate(&s, |_| -> Result<Vec<Child>, RunError> {
        panic!("nothing is left to lease, yet workers were asked for")
    })
    .await
    .unwrap();
    assert_eq!((again.leases.resumed, again.leases.computed), (4, 0));
    assert!(again.leases.workers.is_empty());
    assert_eq!(results(&s.base.store).await, expected);

    // One stored partial lost, one changed on storage: only those two leases
    // are recomputed, the changed one set aside under rejected/.
    let run = d.path().join("killed/run");
    std::fs::remove_file(run.join("eval/partials/part-00000002-00000004.bin")).unwrap();
    let changed = run.join("eval/partials/part-00000004-00000006.bin");
    let mut bytes = std::fs::read(&changed).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&changed, bytes).unwrap();
    let o = eval(&s, 1, Arc::default()).await.unwrap();
    assert_eq!((o.leases.resumed, o.leases.computed), (2, 2));
    assert_eq!(o.leases.rejected.len(), 1, "{:?}", o.leases.rejected);
    assert!(
        o.leases.rejected[0].1.contains("changed"),
        "{:?}",
        o.leases.rejected
    );
    assert_eq!(results(&s.base.store).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_slice_differs_refuses_and_no_result_is_written() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let mut s = setup(&d.path().join("run"), &model).await;
    s.job.candidates[1].sha256 = "0".repeat(64);
    let err = eval(&s, 1, Arc::default()).await.unwrap_err();
    assert!(
        matches!(err, EvalRunError::Run(RunError::WorkersGone(1))),
        "{err}"
    );
    assert!(results(&s.base.store).await.is_empty());
}

/// The SHA-256 the lying worker claims for the pruned candidate.
const FORGED_SHA256: &str = "f00d";

/// A worker that evaluates with the real engine and then claims another
/// SHA-256 for the `frequency_K8` slice: every other field of its eval
/// partial is what an honest worker computes.
#[derive(Clone)]
struct LyingLoader {
    honest: CollectorLoader,
    /// Chunk ranges it lied about, in order.
    lies: Arc<Mutex<Vec<ChunkRange>>>,
    /// Told after each lie.
    lied: Arc<tokio::sync::Notify>,
}

struct LyingEngine {
    honest: Box<dyn EvalEngine>,
    lies: Arc<Mutex<Vec<ChunkRange>>>,
    lied: Arc<tokio::sync::Notify>,
}

impl EngineLoader for LyingLoader {
    type Engine = <CollectorLoader as EngineLoader>::Engine;

    fn backend(&self) -> String {
        self.honest.backend()
    }

    fn load(self, job: &JobInfo) -> Result<Self::Engine, String> {
        self.honest.load(job)
    }

    fn load_eval(
        self,
        job: &JobInfo,
        eval: &EvalJob,
        inputs: &Inputs,
    ) -> Result<Box<dyn EvalEngine>, String> {
        Ok(Box::new(LyingEngine {
            honest: self.honest.load_eval(job, eval, inputs)?,
            lies: self.lies,
            lied: self.lied,
        }))
    }
}

impl EvalEngine for LyingEngine {
    fn base_sha256(&self) -> String {
        self.honest.base_sha256()
    }

    fn evaluate(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
    ) -> Result<EvalPartial, String> {
        let mut p = self.honest.evaluate(index, chunks, images)?;
        let c = p
            .candidates
            .iter_mut()
            .find(|c| c.name == "frequency_K8")
            .expect("the job's pruned candidate");
        c.sha256 = FORGED_SHA256.repeat(16);
        self.lies.lock().unwrap().extend(p.chunks.iter().copied());
        self.lied.notify_one();
        Ok(p)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lying_about_a_candidate_sha256_is_refused_and_its_lease_rerun() {
    fixtures::log::captured_log();
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let reference = setup(&d.path().join("reference"), &model).await;
    eval(&reference, 1, Arc::default()).await.unwrap();
    let expected = results(&reference.base.store).await;

    let s = setup(&d.path().join("lied"), &model).await;
    let liar = LyingLoader {
        honest: CollectorLoader {
            model: Some(model.clone()),
            mmproj: None,
            offload: llama::Offload::default(),
            threads: Some(1),
            reduce: Reduce::Host,
            compare: Compare::Device,
            models_in_memory: None,
            scratch_dir: None,
        },
        lies: Arc::default(),
        lied: Arc::default(),
    };
    let (lies, lied) = (liar.lies.clone(), liar.lied.clone());
    let honest = local_workers(1, &model);
    let mut liar_run = None;
    let mut honest_run = None;
    let outcome = tokio::time::timeout(
        Duration::from_secs(300),
        evaluate(&s, |l| {
            // The liar joins alone; the honest `worker join` process starts
            // once it has lied, so the liar holds the first lease for sure.
            let opts = fixtures::loopback::client(l, "liar");
            liar_run = Some(tokio::spawn(async move { join(&opts, liar).await }));
            let (addr, pin, secret) = (l.addr, l.pin.clone(), l.secret.clone());
            honest_run = Some(tokio::spawn(async move {
                lied.notified().await;
                let mut children = honest.spawn(addr, &pin, &secret).unwrap();
                for c in &mut children {
                    assert!(
                        c.wait().await.unwrap().success(),
                        "the honest worker exits cleanly"
                    );
                }
            }));
            Ok(Vec::new())
        }),
    )
    .await
    .expect("the evaluation finishes in time")
    .expect("the evaluation succeeds on the honest worker");
    honest_run.unwrap().await.unwrap();
    let liar_end = liar_run.unwrap().await.unwrap();
    assert!(
        matches!(
            liar_end,
            Ok(_) | Err(JoinError::Refused(Refusal::Quarantined(_)))
        ),
        "{liar_end:?}"
    );
    let lies = lies.lock().unwrap().clone();
    assert!(!lies.is_empty(), "the liar evaluated at least one lease");

    // The coordinator refused each lie, naming the candidate, both hashes
    // and the worker.
    let log = fixtures::log::log_text();
    let joined = log
        .lines()
        // Its id in the evaluation: on its join line when it joined into
        // the phase, else on the line that welcomed it into it.
        .find(|l| {
            (l.contains("worker joined") || l.contains("worker welcomed into the phase"))
                && l.contains("worker=liar ")
                && l.contains(" id=")
        })
        .unwrap_or_else(|| panic!("no join line of the liar:\n{log}"));
    let id = joined
        .split_whitespace()
        .find_map(|f| f.strip_prefix("id="))
        .unwrap();
    let sha = s.job.candidates[1].sha256.clone();
    let refusals = log
        .lines()
        .filter(|l| {
            l.contains("bad eval result")
                && l.contains(&format!("worker={id}"))
                && l.contains(&format!(
                    "candidate frequency_K8: the worker's slice has SHA-256 \"{}\", the coordinator's {sha}",
                    FORGED_SHA256.repeat(16)
                ))
        })
        .count();
    assert_eq!(refusals, lies.len(), "one refusal per lie:\n{log}");
    println!(
        "the liar lied about {lies:?} and ended with {liar_end:?}; {refusals} refusals logged"
    );

    // Nothing of the liar's was stored: each of its leases was re-run by the
    // honest worker, and eval/ is byte for byte the one-worker reference.
    let by_name = |name: &str| outcome.leases.worker(name);
    let liar_info = by_name("liar").expect("the liar joined");
    assert_eq!(liar_info.leases, 0, "{liar_info:?}");
    let honest_info = outcome
        .leases
        .workers
        .iter()
        .find(|w| w.name != "liar")
        .unwrap();
    assert_eq!(honest_info.leases, 4, "{honest_info:?}");
    assert_eq!((outcome.leases.units, outcome.leases.computed), (4, 4));
    assert!(outcome.leases.retries >= lies.len(), "{outcome:?}");
    let got = results(&s.base.store).await;
    for range in &lies {
        assert!(
            got.contains_key(&runfiles::layout::EVAL_PARTIALS.object(*range)),
            "{range} stored"
        );
    }
    assert_eq!(got, expected, "eval/ differs from the one-worker reference");
    let forged = FORGED_SHA256.repeat(16);
    for name in s.base.store.list("").await.unwrap() {
        let bytes = s.base.store.get(&name).await.unwrap();
        assert!(
            !bytes.windows(forged.len()).any(|w| w == forged.as_bytes()),
            "{name} holds the liar's forged SHA-256"
        );
    }
}
