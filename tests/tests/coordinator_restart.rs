//! The coordinator binary as a cluster runs it (no local workers, a secret
//! file, the default pinned certificate and no fixed port), stopped the
//! hard ways: `kill -9` and a restart with the same command keep the running
//! `worker join` processes (issue 21, failure 7); a coordinator paused past
//! the lock's stale timeout and resumed after another one took the run over
//! writes nothing more (failure 8); 256 logged-in connections that each
//! declare a 64 MiB frame keep it under 1 GiB (failure 9).

use fixtures::peer::Peer;
use fixtures::proc::Proc;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous bound on anything a test waits for (a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(300);

/// Waits until `ready` holds, checking every 20 ms.
fn until(what: &str, ready: impl FnMut() -> bool) {
    fixtures::proc::until(what, DEADLINE, ready)
}

/// A run config in `dir` over `docs` short documents (64-token chunks, two
/// a lease) with the tiny model, a random join secret file, `connect.json`
/// and `extra` appended; returns (config, secret file).
fn cluster_config(dir: &Path, docs: usize, extra: &str) -> (PathBuf, PathBuf) {
    fixtures::model(dir, synth::Preset::Tiny);
    fixtures::numbered_docs(dir, docs);
    let secret = dir.join("join.secret");
    std::fs::write(&secret, protocol::secret::JoinSecret::generate().expose()).unwrap();
    let config = fixtures::docs_config(
        dir,
        "cluster.toml",
        64,
        &format!(
            "[run]\nlease_chunks = 2\nheartbeat_timeout_s = 10\n{extra}\n\
             [cluster]\nsecret_file = \"join.secret\"\nconnect_file = \"connect.json\"\n"
        ),
    );
    (config, secret)
}

/// `coordinator run CONFIG --out RUN [extra...]`, as an operator types it.
fn coordinator(config: &Path, run: &Path, extra: &[&str]) -> Proc {
    let mut cmd = fixtures::command("coordinator");
    cmd.args([
        "run",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ])
    .args(extra);
    Proc::spawn(cmd)
}

/// `connect.json` once a coordinator wrote it after `since` (mtime).
fn connect_info(dir: &Path, since: std::time::SystemTime) -> serde_json::Value {
    let path = dir.join("connect.json");
    let mut info = None;
    until("the coordinator writes connect.json", || {
        info = std::fs::metadata(&path)
            .ok()
            .filter(|m| m.modified().is_ok_and(|t| t >= since))
            .and_then(|_| std::fs::read(&path).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        info.is_some()
    });
    info.unwrap()
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

/// saliency, imatrix and trace parts: what must not depend on restarts.
fn artifacts(run: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    snapshot(run)
        .into_iter()
        .filter(|(p, _)| {
            let s = p.to_string_lossy();
            s.starts_with("saliency.") || s == "imatrix.gguf" || s.starts_with("trace/")
        })
        .collect()
}

fn partials(run: &Path) -> usize {
    std::fs::read_dir(run.join("partials"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn kill_9_and_the_same_command_keep_the_running_workers() {
    let d = tempfile::tempdir().unwrap();
    // Enough leases that one rejoined worker cannot finish the run before
    // the other rejoins (its idle timeout, 5 s, then a reconnect backoff of
    // at most 1 s).
    let (config, secret) = cluster_config(d.path(), 1600, "");
    let model = d.path().join("tiny.gguf");
    // The reference: the same corpus measured in one go.
    let reference = d.path().join("reference");
    let mut clean = coordinator(&config, &reference, &["--local-workers", "2"]);
    assert!(clean.wait(DEADLINE).success(), "{}", clean.log());
    let expected = artifacts(&reference);
    assert!(expected.len() >= 3, "{expected:?}");

    let run = d.path().join("run");
    let started = std::time::SystemTime::now();
    let first = coordinator(&config, &run, &[]);
    let hint = connect_info(d.path(), started);
    let addr = hint["addr"].as_str().unwrap().to_string();
    let pin = hint["pin"].as_str().unwrap().to_string();
    let workers: Vec<Proc> = (0..2)
        .map(|i| {
            let mut cmd = fixtures::command("worker");
            cmd.args(["join", "--coordinator", &addr, "--pin", &pin])
                .arg("--secret-file")
                .arg(&secret)
                .args(["--name", &format!("proc-{i}"), "--threads", "1"])
                .args(["--give-up-after-s", "120", "--model"])
                .arg(&model);
            Proc::spawn(cmd)
        })
        .collect();
    until("two leases stored", || partials(&run) >= 2);
    first.signal("-KILL");
    let mut first = first;
    first.wait(DEADLINE);
    assert!(
        !run.join("saliency.json").exists(),
        "the first coordinator was killed before the end"
    );

    // The same command again: no flag, the lock of the dead process is
    // taken over, the same certificate and port are used again.
    let restarted = std::time::SystemTime::now();
    let again_at = Instant::now();
    let mut again = coordinator(&config, &run, &[]);
    until("both workers rejoin", || {
        again.logged("worker joined").len() >= 2 || again.child.try_wait().unwrap().is_some()
    });
    let hint2 = connect_info(d.path(), restarted);
    assert_eq!(
        (hint2["addr"].as_str(), hint2["pin"].as_str()),
        (Some(addr.as_str()), Some(pin.as_str()))
    );
    let joined = again.logged("worker joined");
    assert!(joined.len() >= 2, "{}", again.log());
    let took = joined[1].duration_since(again_at);
    // How soon is a figure (the worker's idle timeout and reconnect
    // backoff), not a test.
    println!("FIGURE restart: both workers rejoined {took:?} after the restart began");
    let status = again.wait(DEADLINE);
    assert!(
        status.success(),
        "{}\n{}",
        again.log(),
        again.stdout.lock().unwrap()
    );
    assert!(again.stdout.lock().unwrap().contains("run complete"));
    assert!(
        again.log().contains("no longer runs on this machine"),
        "the dead holder's lock was taken over at once:\n{}",
        again.log()
    );
    assert_eq!(artifacts(&run), expected, "byte-identical to the clean run");
    for mut w in workers {
        assert!(w.wait(DEADLINE).success(), "{}", w.log());
    }
}

#[test]
fn a_coordinator_that_lost_its_lock_writes_nothing_more() {
    let d = tempfile::tempdir().unwrap();
    let (config, _) = cluster_config(d.path(), 40, "lock_stale_s = 2");
    let run = d.path().join("run");
    let started = std::time::SystemTime::now();
    let mut paused = coordinator(&config, &run, &[]);
    // It waits for workers; then it is paused past the stale timeout.
    connect_info(d.path(), started);
    paused.signal("-STOP");
    std::thread::sleep(Duration::from_secs(4));
    let mut successor = coordinator(&config, &run, &["--local-workers", "2"]);
    assert!(successor.wait(DEADLINE).success(), "{}", successor.log());
    assert!(successor.stdout.lock().unwrap().contains("run complete"));
    assert!(
        successor.log().contains("taking over"),
        "{}",
        successor.log()
    );
    let finished = snapshot(&run);
    paused.signal("-CONT");
    let status = paused.wait(Duration::from_secs(60));
    assert!(!status.success(), "{status:?}");
    let why = paused.log();
    assert!(why.contains("no longer holds the run"), "{why}");
    assert!(!paused.stdout.lock().unwrap().contains("run complete"));
    assert!(
        snapshot(&run) == finished,
        "the resumed coordinator wrote into the run"
    );
}

#[test]
fn logged_in_connections_declaring_64_mib_frames_keep_the_coordinator_under_1_gib() {
    let d = tempfile::tempdir().unwrap();
    let (config, secret) = cluster_config(d.path(), 20, "");
    std::fs::write(
        &config,
        std::fs::read_to_string(&config).unwrap() + "max_connections = 300\n",
    )
    .unwrap();
    let run = d.path().join("run");
    let started = std::time::SystemTime::now();
    let coord = coordinator(&config, &run, &[]);
    let hint = connect_info(d.path(), started);
    let addr: std::net::SocketAddr = hint["addr"].as_str().unwrap().parse().unwrap();
    let pin = hint["pin"].as_str().unwrap().to_string();
    let secret = std::fs::read(&secret).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    const PEERS: usize = 256;
    const SENT: usize = 4 << 20;
    let rss = rt.block_on(async {
        let logins = Arc::new(tokio::sync::Semaphore::new(8));
        let mut peers = Vec::new();
        for i in 0..PEERS {
            let (pin, secret, logins) = (pin.clone(), secret.clone(), logins.clone());
            peers.push(tokio::spawn(async move {
                let permit = logins.acquire_owned().await.unwrap();
                let (mut p, answer) = Peer::login_at(addr, &pin, &format!("hog-{i}"), &secret)
                    .await
                    .unwrap();
                drop(permit);
                assert!(
                    matches!(answer, protocol::wire::ToWorker::Welcome { .. }),
                    "{answer:?}"
                );
                // A 64 MiB frame declared, 4 MiB of it sent (as far as flow
                // control lets it go), the rest never.
                p.send
                    .write_all(&(64u32 << 20).to_be_bytes())
                    .await
                    .unwrap();
                let body = vec![0xa5u8; SENT];
                let _ = tokio::time::timeout(Duration::from_secs(5), p.send.write_all(&body)).await;
                p
            }));
        }
        let mut held = Vec::new();
        for p in peers {
            held.push(p.await.unwrap());
        }
        // Let whatever the coordinator buffers arrive.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let status = std::fs::read_to_string(format!("/proc/{}/status", coord.pid())).unwrap();
        drop(held);
        status
            .lines()
            .find(|l| l.starts_with("VmHWM"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .unwrap()
    });
    println!(
        "FIGURE memory: {PEERS} connections x 64 MiB declared ({} MiB sent each): coordinator peak RSS {} MiB",
        SENT >> 20,
        rss >> 10
    );
    assert!(rss < 1 << 20, "peak RSS {} MiB", rss >> 10);
}
