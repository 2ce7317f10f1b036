//! `coordinator eval` over loopback QUIC with real llama.cpp workers (`worker
//! join` processes) on the generated `tiny` model: byte-identical `eval/`
//! results for 1 and 3 workers, a worker killed mid-eval, resume from stored
//! eval partials (no worker started), a keep-all candidate at KL 0, and a
//! worker whose slice differs from the coordinator's refusing the job.

use common::eval::{names, EvalPartial};
use common::keepmap::KeepMap;
use common::store::RunStore;
use coordinator::eval::{evaluate, EvalOutcome, EvalRunError, EvalSettings, EvalSetup};
use coordinator::run::local::LocalWorkers;
use coordinator::run::settings::{ClusterSettings, RunSettings};
use coordinator::run::{read_index, RunError, RunSetup};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::Child;
use worker::synth::Preset;

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
            layers: (0..3).map(|l| (l.to_string(), (0..k).collect())).collect(),
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
    let (model_sha256, job) = coordinator::eval::job(&store, model, &settings)
        .await
        .unwrap();
    EvalSetup {
        base: RunSetup {
            index: read_index(&store).await.unwrap(),
            store,
            model_sha256,
            model_path: model.to_path_buf(),
            run: RunSettings {
                lease_chunks: 2,
                heartbeat_timeout_s: 3,
                lease_timeout_s: 120,
                n_ubatch: 16,
                ..RunSettings::default()
            },
            cluster: ClusterSettings::default(),
        },
        job,
    }
}

/// Evaluates with `count` local worker processes; their pids go to `pids`.
async fn eval(
    s: &EvalSetup,
    count: u32,
    pids: Arc<Mutex<Vec<u32>>>,
) -> Result<EvalOutcome, EvalRunError> {
    let w = LocalWorkers {
        binary: fixtures::bin("worker"),
        count,
        model: s.base.model_path.clone(),
        threads: 1,
        env: Vec::new(),
    };
    tokio::time::timeout(
        Duration::from_secs(300),
        evaluate(s, |l| {
            let children: Vec<Child> = w.spawn(l.addr, &l.pin, &l.secret)?;
            pids.lock()
                .unwrap()
                .extend(children.iter().filter_map(|c| c.id()));
            Ok(children)
        }),
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
    assert_eq!((o1.units, o1.computed, o3.computed), (4, 4, 4));
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
            Some(common::hash::sha256_hex(bytes).as_str()),
            "{name}"
        );
    }
    let s = &o1.summary;
    let (keep_all, pruned) = (&s.candidates[0], &s.candidates[1]);
    assert_eq!((keep_all.k, pruned.k), (16, 8));
    for split in ["fit", "heldout"] {
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
    // Kill one worker with SIGKILL as soon as the first eval lease is stored.
    let killer = tokio::spawn(async move {
        for _ in 0..3000 {
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
        false
    });
    let o = eval(&s, 2, pids).await.unwrap();
    assert!(killer.await.unwrap(), "a worker was killed");
    assert_eq!(o.computed, 4);
    assert_eq!(results(&s.base.store).await, expected);

    // Resume: everything stored is reused; no worker is started or leased to.
    let again = evaluate(&s, |_| -> Result<Vec<Child>, RunError> {
        panic!("nothing is left to lease, yet workers were asked for")
    })
    .await
    .unwrap();
    assert_eq!((again.resumed, again.computed), (4, 0));
    assert!(again.workers.is_empty());
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
    assert_eq!((o.resumed, o.computed), (2, 2));
    assert_eq!(o.rejected.len(), 1, "{:?}", o.rejected);
    assert!(o.rejected[0].1.contains("changed"), "{:?}", o.rejected);
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
