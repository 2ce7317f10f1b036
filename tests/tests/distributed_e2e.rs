//! End-to-end distributed runs with real llama.cpp workers (`worker join`
//! processes) on the generated `tiny` model over loopback QUIC: byte-identical
//! artifacts for 1 and 3 workers, a worker killed with SIGKILL mid-lease (on
//! text and on an image corpus measured through the mmproj), a
//! coordinator killed and restarted (with new local workers, and with the
//! same `worker join` processes reconnecting), and a whole run on the S3
//! test server.

use config::run::ClusterSettings;
use fixtures::loopback::{artifacts, local_workers, real_setup, spawn_noting_pids};
use runfiles::store::RunStore;
use runtime::run::local::LocalWorkers;
use runtime::run::{execute, Listening, RunSetup, RunSummary};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use synth::Preset;
use tokio::process::Child;

const N_CHUNKS: u32 = 12;
const N_CTX: u32 = 64;

/// Runs with `count` local worker processes; their pids go to `pids`.
async fn run(
    s: &RunSetup,
    count: u32,
    pids: Arc<Mutex<Vec<u32>>>,
) -> Result<RunSummary, runtime::run::RunError> {
    run_with_env(s, count, pids, Vec::new()).await
}

/// [`run`] with extra environment for the worker processes.
async fn run_with_env(
    s: &RunSetup,
    count: u32,
    pids: Arc<Mutex<Vec<u32>>>,
    env: Vec<(&'static str, String)>,
) -> Result<RunSummary, runtime::run::RunError> {
    let w = LocalWorkers {
        env,
        ..local_workers(count, &s.model_path)
    };
    tokio::time::timeout(
        Duration::from_secs(300),
        execute(s, |l| spawn_noting_pids(&w, l, &pids)),
    )
    .await
    .expect("the run finishes in time")
}

/// The tiny model written under `dir` and the artifacts (traces included)
/// of its run with one worker: what every other spread of the work must give.
async fn reference(dir: &Path) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    let model = fixtures::model(dir, Preset::Tiny);
    let s = real_setup(&dir.join("reference"), &model, N_CHUNKS, N_CTX, 3);
    run(&s, 1, Arc::default()).await.unwrap();
    (model, artifacts(&s.store, true).await)
}

async fn verify_ok(store: &RunStore) {
    let report = stages::verify::verify(store).await.unwrap();
    assert!(report.ok(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_and_three_real_workers_give_byte_identical_artifacts() {
    let d = tempfile::tempdir().unwrap();
    let (model, one) = reference(d.path()).await;
    let s = real_setup(&d.path().join("three"), &model, N_CHUNKS, N_CTX, 3);
    let summary = run(&s, 3, Arc::default()).await.unwrap();
    assert_eq!(summary.leases.computed, 6);
    assert!(
        one.iter().any(|(n, _)| n.starts_with("trace/")),
        "traces were written"
    );
    assert_eq!(artifacts(&s.store, true).await, one);
    verify_ok(&s.store).await;
}

/// The exact merge with the device path (issue #14): device sums accumulate
/// within a chunk only, so 1 and 3 workers still give the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_and_three_real_workers_give_byte_identical_artifacts_with_device_reductions() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let device = || vec![("MOE_CENSUS_REDUCE", "device".to_string())];
    let mut stores = Vec::new();
    for (name, count) in [("one", 1), ("three", 3)] {
        let s = real_setup(&d.path().join(name), &model, N_CHUNKS, N_CTX, 3);
        run_with_env(&s, count, Arc::default(), device())
            .await
            .unwrap();
        verify_ok(&s.store).await;
        let merged = s.store.get(runfiles::layout::MERGED_PARTIAL).await.unwrap();
        let partial = numbers::partial::Partial::from_bytes(&merged).unwrap();
        assert_eq!(
            partial.backends.len(),
            1,
            "every worker reduced on the device: {:?}",
            partial.backends
        );
        assert!(partial.backends[0].ends_with(", device reductions"));
        stores.push(s.store);
    }
    assert_eq!(
        artifacts(&stores[0], true).await,
        artifacts(&stores[1], true).await
    );
}

/// A `worker join` process named `name` for the coordinator at `l`.
fn named_worker(l: &Listening, model: &Path, name: &str) -> Child {
    let secret = String::from_utf8(l.secret.expose().to_vec()).unwrap();
    tokio::process::Command::new(fixtures::bin("worker"))
        .args([
            "join",
            "--coordinator",
            &l.addr.to_string(),
            "--pin",
            &l.pin,
        ])
        .args(["--name", name, "--threads", "1", "--model"])
        .arg(model)
        .env(runtime::run::local::SECRET_ENV, secret)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_mid_lease_loses_no_chunk_and_counts_none_twice() {
    kill_a_worker_when("lease granted", 1).await;
}

/// A worker that adds its leases into checkpoints of 3 and is killed with
/// SIGKILL once it holds a computed lease (between two checkpoints): its
/// held leases are recomputed elsewhere and the artifacts are those of a
/// per-lease run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_between_checkpoints_loses_no_chunk_and_counts_none_twice() {
    kill_a_worker_when("lease computed, held until its checkpoint", 3).await;
}

/// Runs with a local worker and a victim worker, with checkpoints of
/// `checkpoint_leases`, killing the victim with SIGKILL at the first
/// coordinator log line of its connection that holds `when`: no chunk is
/// lost, none counted twice, and the artifacts are a per-lease single
/// worker's.
async fn kill_a_worker_when(when: &'static str, checkpoint_leases: u32) {
    let d = tempfile::tempdir().unwrap();
    let (model, expected) = reference(d.path()).await;
    let mut s = real_setup(&d.path().join("killed"), &model, N_CHUNKS, N_CTX, 3);
    s.run.checkpoint_leases = checkpoint_leases;
    let summary = run_killing_a_victim(&s, when).await;
    assert_eq!(artifacts(&s.store, true).await, expected);
    assert_eq!(summary.leases.computed, 6, "{summary:?}");
}

/// Runs `s` with a local worker and a victim worker, killing the victim
/// with SIGKILL at the first coordinator log line of its connection that
/// holds `when`: the run verifies, the victim's lease was retried and the
/// victim is gone.
async fn run_killing_a_victim(s: &RunSetup, when: &'static str) -> RunSummary {
    fixtures::log::captured_log();
    let model = s.model_path.clone();
    let victim = format!(
        "victim-{}",
        &gguf::hash::sha256_hex(&protocol::wire::random_bytes(8))[..12]
    );
    let pid: Arc<Mutex<Option<u32>>> = Arc::default();
    // Kill the victim with SIGKILL the moment its connection logs `when`:
    // it dies holding a lease, so that lease must be retried.
    let (name, victim_pid) = (victim.clone(), pid.clone());
    let killer = tokio::task::spawn_blocking(move || {
        let limit = Duration::from_secs(300);
        let joined = fixtures::log::wait_for_line(limit, |l| {
            l.contains("worker joined") && l.contains(&format!("worker={name} "))
        });
        // The connection's span names the victim's address in every line.
        let conn = joined
            .split_whitespace()
            .find(|f| f.starts_with("conn{remote="))
            .expect("a connection span")
            .to_string();
        fixtures::log::wait_for_line(limit, |l| l.contains(&conn) && l.contains(when));
        let pid = victim_pid.lock().unwrap().expect("the victim was started");
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    });
    let other = local_workers(1, &model);
    let summary = tokio::time::timeout(
        Duration::from_secs(300),
        execute(s, |l| {
            let mut children = other.spawn(l.addr, &l.pin, &l.secret)?;
            let v = named_worker(l, &model, &victim);
            *pid.lock().unwrap() = v.id();
            children.push(v);
            Ok(children)
        }),
    )
    .await
    .expect("the run finishes in time")
    .unwrap();
    assert!(killer.await.unwrap(), "the victim was killed");
    verify_ok(&s.store).await;
    assert!(
        summary.leases.retries >= 1,
        "the victim's lease was retried: {summary:?}"
    );
    let v = summary.leases.worker(&victim).unwrap();
    assert!(!v.connected, "{v:?}");
    summary
}

/// An image corpus (the bundled sample through the tiny model and its
/// generated mmproj, prepared by `coordinator corpus`) under `dir`, set up
/// for leases of one chunk.
fn image_setup(dir: &Path) -> RunSetup {
    use synth::mmproj::{write_mmproj, MmprojSpec};
    std::fs::create_dir_all(dir).unwrap();
    let model = fixtures::model(dir, Preset::Tiny);
    let mmproj = dir.join("mmproj.gguf");
    write_mmproj(&MmprojSpec::for_model(&model).unwrap(), 0, &mmproj).unwrap();
    let records = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/sample_images")
        .join(synth::images::RECORDS);
    let config = dir.join("images.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\npath = {model:?}\nmmproj = {mmproj:?}\n\n[corpus]\nn_ctx = 64\n\n\
             [[corpus.domains]]\nname = \"images\"\nsources = [{{ path = {records:?} }}]\n"
        ),
    )
    .unwrap();
    let run = dir.join("run");
    let args = [
        "corpus",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ];
    let out = fixtures::run("coordinator", &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index = runfiles::corpus::CorpusIndex::decode(
        &std::fs::read(run.join("corpus/index.json")).unwrap(),
        "corpus/index.json",
    )
    .unwrap();
    RunSetup {
        store: RunStore::open(run.to_str().unwrap()).unwrap(),
        index,
        model_sha256: worker::collect::sha256_file(&model).unwrap(),
        model_path: model,
        mmproj: Some(protocol::wire::MmprojFile {
            path: mmproj.display().to_string(),
            sha256: worker::collect::sha256_file(&mmproj).unwrap(),
        }),
        run: config::run::RunSettings {
            lease_chunks: 1,
            heartbeat_timeout_s: 3,
            lease_timeout_s: 120,
            n_ubatch: 64,
            ..Default::default()
        },
        cluster: ClusterSettings::default(),
    }
}

/// On an image corpus, a worker killed with SIGKILL mid-lease loses
/// nothing: its lease is recomputed elsewhere and the artifacts (per
/// modality, traces included) are a single worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_mid_lease_on_images_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let reference = image_setup(&d.path().join("reference"));
    run(&reference, 1, Arc::default()).await.unwrap();
    let expected = artifacts(&reference.store, true).await;
    let saliency = String::from_utf8(expected[0].1.clone()).unwrap();
    assert!(saliency.contains("\"image\""), "per-modality statistics");
    let s = image_setup(&d.path().join("killed"));
    let summary = run_killing_a_victim(&s, "lease granted").await;
    assert_eq!(artifacts(&s.store, true).await, expected);
    assert_eq!(
        summary.leases.computed, s.index.n_chunks as usize,
        "{summary:?}"
    );
}

/// Worker-side aggregation (checkpoints of 4 leases) changes no byte of
/// the artifacts, with 1 and 3 workers, and stores fewer partials than
/// leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointed_runs_give_the_artifacts_of_per_lease_runs() {
    use runfiles::layout::{MERGED_PARTIAL, PARTIALS_DIR};
    let d = tempfile::tempdir().unwrap();
    let (model, per_lease) = reference(d.path()).await;
    for count in [1, 3] {
        let dir = d.path().join(format!("checkpoints-{count}"));
        let mut s = real_setup(&dir, &model, N_CHUNKS, N_CTX, 3);
        s.run.checkpoint_leases = 4;
        let summary = run(&s, count, Arc::default()).await.unwrap();
        assert_eq!(summary.leases.computed, 6, "{summary:?}");
        assert_eq!(
            artifacts(&s.store, true).await,
            per_lease,
            "{count} workers"
        );
        verify_ok(&s.store).await;
        let stored: Vec<String> = s.store.list(PARTIALS_DIR).await.unwrap();
        let stored = stored.iter().filter(|n| *n != MERGED_PARTIAL).count();
        if count == 1 {
            assert_eq!(stored, 2, "6 leases in checkpoints of 4: 4, then 2");
        } else {
            assert!(stored < 6, "{stored} partials for 6 leases");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_and_restarted_recomputes_at_most_one_lease_per_worker() {
    let d = tempfile::tempdir().unwrap();
    let (model, expected) = reference(d.path()).await;
    let s = real_setup(&d.path().join("restarted"), &model, N_CHUNKS, N_CTX, 3);
    let workers = 2u32;
    // First coordinator: dropped (with its workers) once 2 leases are stored.
    {
        let first = run(&s, workers, Arc::default());
        tokio::pin!(first);
        loop {
            tokio::select! {
                r = &mut first => panic!("the first run ended before it was killed: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(20)) => {
                    if s.store.list("partials").await.unwrap().len() >= 2 {
                        break;
                    }
                }
            }
        }
    }
    let stored = s.store.list("partials").await.unwrap().len();
    // The killed coordinator left its lock behind: take it over, as
    // `coordinator run --take-over-lock` does.
    let mut s = s;
    s.run.lock_stale_s = 0;
    let summary = run(&s, workers, Arc::default()).await.unwrap();
    assert!(summary.leases.resumed >= stored.min(6), "{summary:?}");
    assert_eq!(summary.leases.resumed + summary.leases.computed, 6);
    // Leases the first coordinator had in flight when it died are recomputed:
    // at most one per worker.
    assert!(
        summary.leases.computed <= 6 - stored + workers as usize,
        "stored {stored}, then computed {}",
        summary.leases.computed
    );
    assert_eq!(artifacts(&s.store, true).await, expected);
    verify_ok(&s.store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_real_run_round_trips_through_s3() {
    let Some(bucket) = fixtures::s3_bucket() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let (model, expected) = reference(d.path()).await;
    let local = real_setup(&d.path().join("for-s3"), &model, N_CHUNKS, N_CTX, 3);
    let s = fixtures::loopback::on_s3(&bucket, "e2e", &local).await;
    let s3 = s.store.clone();
    let summary = run(&s, 2, Arc::default()).await.unwrap();
    assert_eq!(summary.leases.computed, 6);
    assert_eq!(artifacts(&s3, true).await, expected);
    verify_ok(&s3).await;
}

/// Starts `worker join` processes against a fixed address, trusting a CA
/// and reading a secret file, as a cluster launch would.
fn join_processes(
    addr: &str,
    ca_pem: &Path,
    secret: &Path,
    model: &Path,
) -> Vec<std::process::Child> {
    (0..2)
        .map(|i| {
            fixtures::command("worker")
                .args(["join", "--coordinator", addr, "--ca"])
                .arg(ca_pem)
                .arg("--secret-file")
                .arg(secret)
                .args(["--name", &format!("proc-{i}"), "--threads", "1"])
                .args(["--give-up-after-s", "60", "--model"])
                .arg(model)
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Regression: `worker join` exited when its coordinator went away. Two
/// real worker processes outlive a coordinator killed mid-run (its runtime
/// dropped: no goodbye, its socket gone) and finish the run with the
/// coordinator restarted on the same address, CA and secret.
#[test]
fn worker_processes_reconnect_to_a_restarted_coordinator_and_finish_the_run() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let d = tempfile::tempdir().unwrap();
    let (model, expected) = runtime().block_on(reference(d.path()));
    let mut s = real_setup(&d.path().join("restarted"), &model, N_CHUNKS, N_CTX, 3);
    let ca_dir = d.path().join("ca");
    let ca_pem = runtime::net::tls::create_ca(&ca_dir).unwrap();
    let secret = d.path().join("secret");
    std::fs::write(&secret, protocol::secret::JoinSecret::generate().expose()).unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    s.cluster = ClusterSettings {
        listen: addr.clone(),
        ca_dir: Some(ca_dir),
        secret_file: Some(secret.clone()),
        ..ClusterSettings::default()
    };
    let procs: Arc<Mutex<Vec<std::process::Child>>> = Arc::default();
    // First coordinator: killed once a lease is stored (at 2, on an idle
    // machine, the workers had once stored all 6 before the kill landed).
    let first = runtime();
    let (s1, p1) = (s.clone(), procs.clone());
    let (ca1, sec1, model1, addr1) = (ca_pem.clone(), secret.clone(), model.clone(), addr.clone());
    let run1 = first.spawn(async move {
        execute(&s1, |_| {
            p1.lock()
                .unwrap()
                .extend(join_processes(&addr1, &ca1, &sec1, &model1));
            Ok(Vec::new())
        })
        .await
    });
    let start = std::time::Instant::now();
    while first.block_on(s.store.list("partials")).unwrap().is_empty() {
        assert!(
            !run1.is_finished(),
            "the first run ended before it was killed"
        );
        assert!(start.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    if run1.is_finished() {
        panic!(
            "the first run ended before it was killed: {:?}",
            first.block_on(run1)
        );
    }
    first.shutdown_background();
    let second = runtime();
    let stored = second.block_on(s.store.list("partials")).unwrap().len();
    // The killed coordinator left its lock behind: the restarted one takes
    // it over, as `coordinator run --take-over-lock` does.
    let restarted = {
        let mut s = s.clone();
        s.run.lock_stale_s = 0;
        s
    };
    // Second coordinator on the same address (retrying until the old socket is gone).
    let summary = second.block_on(async {
        for _ in 0..100 {
            let restart = tokio::time::timeout(
                Duration::from_secs(300),
                execute(&restarted, |_| Ok(Vec::new())),
            );
            match restart
                .await
                .expect("the workers rejoin and finish in time")
            {
                Err(runtime::run::RunError::Net(runtime::net::NetError::Bind { .. })) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => return other.unwrap(),
            }
        }
        panic!("{addr} never became free");
    });
    assert!(summary.leases.resumed >= stored.min(6), "{summary:?}");
    assert_eq!(summary.leases.resumed + summary.leases.computed, 6);
    assert!(summary.leases.computed >= 1, "{summary:?}");
    assert!(
        summary
            .leases
            .workers
            .iter()
            .all(|w| w.name.starts_with("proc-")),
        "only the original processes worked: {summary:?}"
    );
    second.block_on(async { assert_eq!(artifacts(&s.store, true).await, expected) });
    second.block_on(verify_ok(&s.store));
    let joined: Vec<&str> = summary
        .leases
        .workers
        .iter()
        .map(|w| w.name.as_str())
        .collect();
    // A process that found the run finished before it rejoined keeps
    // reconnecting until it gives up: it is killed, not waited for.
    for (i, mut child) in procs.lock().unwrap().drain(..).enumerate() {
        let name = format!("proc-{i}");
        if !joined.contains(&name.as_str()) {
            let _ = child.kill();
            let _ = child.wait();
            continue;
        }
        let status = (0..900).find_map(|_| {
            let s = child.try_wait().unwrap();
            if s.is_none() {
                std::thread::sleep(Duration::from_millis(100));
            }
            s
        });
        let _ = child.kill();
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} rejoined but did not finish cleanly: {status:?}"
        );
    }
}
