//! The coordinator against hostile, broken or slow peers, over real loopback
//! QUIC: scripted clients that speak the protocol (or only part of it) next
//! to real `join` clients with the deterministic fake engine. Each test
//! guards one hole found against the release binaries: unbounded frames
//! before login, forged log lines, slot starvation, one flaky worker failing
//! the run, a slow upload losing its lease, short join secrets, and a
//! coordinator stopped by an error sending its workers away as if finished.

use fixtures::fake_engine::FakeEngine;
use fixtures::log::{captured_log, log_text};
use fixtures::loopback::{
    self, artifacts, assert_quarantined_and_honest, client, fake_reference, fake_setup,
    fake_workers, run_beside_fake_workers, FAKE_MODEL,
};
use fixtures::peer::{honest_partial, inflated_partial, Peer};
use protocol::wire::{encode_frame, read_msg, Refusal, ToCoordinator, ToWorker, MAX_CONTROL_FRAME};
use runtime::run::{execute, RunError};
use std::time::Duration;
use worker::join::{join, JoinSummary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_before_login_are_capped_at_a_few_kib() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 6);
    let (tx, rx) = tokio::sync::oneshot::channel();
    loopback::run_logged(&s, |l| {
        let (addr, pin) = (l.addr, l.pin.clone());
        let attack = tokio::spawn(async move {
            let mut p = Peer::open(addr, &pin).await.unwrap();
            // A 60 KiB Hello: well under the 64 MiB limit of joined workers.
            let big = encode_frame(&Peer::hello(&"x".repeat(60 << 10)));
            let _ = p.send.write_all(&big).await;
            let _ = tx.send(p.closed_reason().await);
            Ok(JoinSummary::default())
        });
        let mut hs = vec![attack];
        hs.extend(fake_workers(l, 1, Duration::from_millis(20)));
        hs
    })
    .await;
    let reason = rx.await.unwrap();
    assert!(
        reason.contains("exceeds the limit of 4096 bytes"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_names_and_failure_reasons_cannot_forge_log_lines() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 6);
    let forged_name = "intruder\n2026-11-30T16:00:00.000000Z  INFO coordinator: run complete";
    loopback::run_logged(&s, |l| {
        let l2 = l.clone();
        let script = tokio::spawn(async move {
            let (_, answer) = Peer::login(&l2, forged_name, &[b'w'; 40]).await;
            assert_eq!(answer, ToWorker::Refused(Refusal::BadProof));
            // A joined worker that fails its lease with a multi-line reason.
            let (mut p, _) = Peer::joined(&l2, "scripted").await;
            if let Some(ToWorker::Lease(lease)) = p.poll_idle().await {
                let failed = ToCoordinator::Failed {
                    lease_id: lease.lease_id,
                    reason: "oom\nFORGED-LINE ERROR".into(),
                };
                assert_eq!(p.ask(&failed).await, Some(ToWorker::Ack));
            }
            Ok(JoinSummary::default())
        });
        let mut hs = vec![script];
        hs.extend(fake_workers(l, 1, Duration::from_millis(50)));
        hs
    })
    .await;
    let log = log_text();
    assert!(
        log.contains("intruder\\n2026-11-30T16:00:00.000000Z"),
        "the refused name is logged, escaped:\n{log}"
    );
    for line in log.lines() {
        assert!(
            !line.starts_with("2026-11-30T16:00:00.000000Z") && !line.starts_with("FORGED-LINE"),
            "a peer forged a log line: {line:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_log_in_cannot_starve_a_worker() {
    let d = tempfile::tempdir().unwrap();
    let mut s = fake_setup(d.path(), 6);
    s.cluster.max_connections = 4;
    s.cluster.login_timeout_ms = 1500;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (summary, handles) = loopback::run_logged(&s, |l| {
        assert!(
            !format!("{l:?}").contains(std::str::from_utf8(l.secret.expose()).unwrap()),
            "the secret stays out of Debug"
        );
        let (addr, pin, opts) = (l.addr, l.pin.clone(), client(l, "real"));
        vec![tokio::spawn(async move {
            // Four connections that send 3 bytes and then nothing.
            let mut stalled = Vec::new();
            for _ in 0..4 {
                if let Ok(mut p) = Peer::open(addr, &pin).await {
                    p.send.write_all(&[0, 0, 0]).await.unwrap();
                    stalled.push(p);
                }
            }
            let worker = join(&opts, FakeEngine::new(FAKE_MODEL)).await;
            let mut reasons = Vec::new();
            for p in &stalled {
                reasons.push(p.closed_reason().await);
            }
            let _ = tx.send(reasons);
            worker
        })]
    })
    .await;
    assert_eq!(summary.leases.computed, 2);
    let reasons = rx.await.unwrap();
    assert_eq!(
        reasons.len(),
        2,
        "two connections from one address may be logging in at once (half of 4 slots)"
    );
    for r in &reasons {
        assert!(r.contains("not logged in within 1.5s"), "{r}");
    }
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap().leases, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_worker_is_quarantined_and_the_run_completes_on_the_others() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 30);
    // The good workers register first: one of them measures.
    let delay = Duration::from_millis(40);
    let (summary, (failed, end, again)) = run_beside_fake_workers(&s, 2, delay, |l| async move {
        let (mut p, _) = Peer::joined(&l, "flaky").await;
        let (end, failed) = p
            .fail_every_lease("CUDA error: an illegal memory access")
            .await;
        // Coming back under the same name does not help.
        let (_, again) = Peer::login(&l, "flaky", l.secret.expose()).await;
        (failed, end, again)
    })
    .await;
    assert_eq!(failed, 3, "three failures in a row, then no more leases");
    assert!(
        matches!(again, ToWorker::Refused(Refusal::Quarantined(_))),
        "{again:?}"
    );
    assert_eq!(summary.leases.retries, 3);
    assert_quarantined_and_honest(&s, &summary, "flaky", &end, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_that_keeps_moving_keeps_its_lease() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 3);
    let index = s.index.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (summary, _) = loopback::run_logged(&s, |l| {
        let l2 = l.clone();
        vec![tokio::spawn(async move {
            let (mut p, _) = Peer::joined(&l2, "slow-link").await;
            let Some(ToWorker::Lease(lease)) = p.poll_idle().await else {
                panic!("no lease");
            };
            let done = Peer::done_msg(&lease, honest_partial(&index, &lease).to_bytes());
            // Upload over 5 s, more than twice the 2 s heartbeat timeout.
            let frame = encode_frame(&done);
            let start = std::time::Instant::now();
            for piece in frame.chunks(frame.len().div_ceil(20)) {
                p.send.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let reply = read_msg::<_, ToWorker>(&mut p.recv, MAX_CONTROL_FRAME).await;
            let _ = tx.send((start.elapsed(), format!("{reply:?}")));
            Ok(JoinSummary::default())
        })]
    })
    .await;
    let (took, reply) = rx.await.unwrap();
    assert!(took >= Duration::from_secs(4), "{took:?}");
    assert_eq!(reply, "Ok(Some(Ack))");
    assert_eq!((summary.leases.computed, summary.leases.retries), (1, 0));
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_or_empty_secret_files_are_refused_on_both_sides() {
    let d = tempfile::tempdir().unwrap();
    for content in ["", "short-secret\n"] {
        let file = d.path().join("secret");
        std::fs::write(&file, content).unwrap();
        let mut s = fake_setup(&d.path().join("run"), 3);
        s.cluster.secret_file = Some(file.clone());
        match execute(&s, |_| panic!("never listens")).await {
            Err(RunError::Setup(msg)) => {
                assert!(msg.contains(&file.display().to_string()), "{msg}");
                assert!(msg.contains("at least 32"), "{msg}");
            }
            other => panic!("the coordinator accepted a short secret: {other:?}"),
        }
        let out = fixtures::run(
            "worker",
            &[
                "join",
                "--coordinator",
                "127.0.0.1:9",
                "--pin",
                &"ab".repeat(32),
                "--secret-file",
                file.to_str().unwrap(),
                "--model",
                "/nonexistent.gguf",
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains("at least 32"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_full_redundancy_a_cheating_worker_is_caught_and_the_honest_result_kept() {
    let d = tempfile::tempdir().unwrap();
    let mut s = fake_setup(d.path(), 18);
    s.run.verify_fraction = 1.0;
    let index = s.index.clone();
    // The honest workers register first: one of them measures.
    let delay = Duration::from_millis(30);
    let (summary, (end, cheated)) = run_beside_fake_workers(&s, 2, delay, |l| async move {
        let (mut p, _) = Peer::joined(&l, "cheater").await;
        p.work(|lease| inflated_partial(&index, lease)).await
    })
    .await;
    assert!(cheated >= 1, "the cheater computed at least one lease");
    assert_quarantined_and_honest(&s, &summary, "cheater", &end, 6).await;
}

/// Regression: a coordinator that stopped on an error closed every
/// connection as "run finished", so `worker join` left as if the run were
/// done, and a restarted coordinator then waited for workers forever. Now
/// the close names the error and the worker keeps reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_stopped_by_an_error_leaves_its_workers_reconnecting() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 6);
    captured_log();
    let partials = d.path().join(runfiles::layout::PARTIALS_DIR);
    let mut handles = Vec::new();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        execute(&s, |l| {
            // Storing the first accepted partial fails: `partials` is a file.
            std::fs::write(&partials, b"not a directory").unwrap();
            let mut opts = client(l, "patient");
            opts.reconnect = worker::join::Reconnect::giving_up_after(Duration::from_secs(2));
            handles.push(tokio::spawn(async move {
                join(&opts, FakeEngine::new(FAKE_MODEL)).await
            }));
            Ok(Vec::new())
        }),
    )
    .await
    .expect("the failed run ends in time");
    let err = outcome.expect_err("storing a partial under a file fails the run");
    assert!(err.to_string().contains("partials"), "{err}");
    let left = handles.pop().unwrap().await.unwrap();
    assert!(
        matches!(left, Err(worker::join::JoinError::GaveUp { .. })),
        "the worker must keep reconnecting, not leave: {left:?}"
    );
    let told = log_text()
        .lines()
        .any(|l| l.contains("worker::join") && l.contains("(code 3): coordinator stopped: "));
    assert!(
        told,
        "the worker logs why the coordinator stopped:\n{}",
        log_text()
    );
}
