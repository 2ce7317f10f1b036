//! Worker identity across reconnects (issue 21, failures 2 and 4), over real
//! loopback QUIC with scripted peers ([`fixtures::peer`]) next to real
//! `join` clients on the deterministic fake engine: a worker is the name its
//! join proof is bound to, so reconnecting neither makes a second opinion
//! nor clears a failure count or a quarantine; a disagreement with no third
//! worker is decided after a bounded wait, and a worker that fails first
//! does not fail a run an honest worker joins in the grace period.

use fixtures::fake_engine::FakeEngine;
use fixtures::log::log_text;
use fixtures::loopback::{
    self, artifacts, assert_quarantined_and_honest, client, fake_reference, fake_setup,
    fake_workers, run_beside_fake_workers, FAKE_MODEL,
};
use fixtures::peer::{inflated_partial, Peer};
use protocol::secret::WorkerKey;
use protocol::wire::{Refusal, ToWorker};
use runtime::run::Listening;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use worker::join::{join, JoinSummary};

/// The key `coordinator worker-key` writes for `name` under the run's secret.
fn issued_key(l: &Listening, dir: &std::path::Path, name: &str) -> WorkerKey {
    let secret = dir.join("join.secret");
    std::fs::write(&secret, l.secret.expose()).unwrap();
    let out = dir.join(format!("{name}.key"));
    let _ = std::fs::remove_file(&out);
    fixtures::run_ok(
        "coordinator",
        &[
            "worker-key",
            "--secret-file",
            secret.to_str().unwrap(),
            "--name",
            name,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    WorkerKey::from_file(&out).unwrap()
}

/// What the reconnecting liar saw: leases it reported, connections it made,
/// its last answer, and its login under another name.
type LiarEnd = (u32, u32, Option<ToWorker>, ToWorker);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reconnects_after_every_result_cannot_verify_itself() {
    let d = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let mut s = fake_setup(d.path(), 6);
    s.run.verify_fraction = 1.0;
    let index = s.index.clone();
    let store = s.store.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<LiarEnd>();
    let (summary, _) = loopback::run_logged(&s, |l| {
        let key = issued_key(l, keys.path(), "liar");
        let honest_may_join = Arc::new(Notify::new());
        let (l2, go) = (l.clone(), honest_may_join.clone());
        let liar = tokio::spawn(async move {
            // Its key proves "liar" and no other name.
            let (_, as_other) = Peer::login_with_key(l2.addr, &l2.pin, "liar2", key.expose())
                .await
                .unwrap();
            let (mut reported, mut connections) = (0, 0);
            // Alone, a new connection after every result: never a second opinion.
            while connections < 8 {
                connections += 1;
                let (mut p, welcome) = Peer::login_with_key(l2.addr, &l2.pin, "liar", key.expose())
                    .await
                    .unwrap();
                // Protocol 8: the proof may be answered with `Wait` (no
                // phase open to this worker now); it then gets no lease.
                assert!(
                    matches!(welcome, ToWorker::Welcome { .. } | ToWorker::Wait { .. }),
                    "{welcome:?}"
                );
                if let ToWorker::Welcome { .. } = welcome {
                    if let Some(ToWorker::Lease(lease)) = p.poll_idle().await {
                        reported += 1;
                        p.done(&lease, inflated_partial(&index, &lease)).await;
                    }
                }
                p.conn.close(0u32.into(), b"reconnecting");
            }
            assert_eq!(reported, 2, "alone, it answered each unit once");
            let stored = store.list("partials").await.unwrap_or_default();
            assert!(stored.is_empty(), "a lie was accepted: {stored:?}");
            go.notify_one();
            // Then two honest workers join; it keeps reconnecting until it is
            // refused or the run is over.
            let mut last = None;
            loop {
                connections += 1;
                let Ok((mut p, welcome)) =
                    Peer::login_with_key(l2.addr, &l2.pin, "liar", key.expose()).await
                else {
                    break;
                };
                if !matches!(welcome, ToWorker::Welcome { .. }) {
                    last = Some(welcome);
                    break;
                }
                match p.poll_idle().await {
                    Some(ToWorker::Lease(lease)) => {
                        reported += 1;
                        p.done(&lease, inflated_partial(&index, &lease)).await;
                    }
                    Some(ToWorker::Wait { retry_ms }) => {
                        tokio::time::sleep(Duration::from_millis(retry_ms)).await
                    }
                    other => {
                        last = other;
                        break;
                    }
                }
                p.conn.close(0u32.into(), b"reconnecting");
            }
            let _ = tx.send((reported, connections, last, as_other));
            Ok(JoinSummary::default())
        });
        let l3 = l.clone();
        let honest = tokio::spawn(async move {
            honest_may_join.notified().await;
            let mut hs = fake_workers(&l3, 2, Duration::from_millis(20));
            let first = hs.remove(0).await.unwrap();
            hs.remove(0).await.unwrap()?;
            first
        });
        vec![liar, honest]
    })
    .await;
    let (reported, connections, last, as_other) = rx.await.unwrap();
    assert_eq!(as_other, ToWorker::Refused(Refusal::BadProof));
    assert_eq!(
        reported, 2,
        "one opinion per unit in {connections} connections, never its own second"
    );
    assert!(
        matches!(
            last,
            Some(ToWorker::Refused(Refusal::Quarantined(_))) | None
        ),
        "the liar ends refused, or when the run is over: {last:?}"
    );
    let liar = summary.leases.worker("liar").unwrap();
    assert!(liar.quarantined && liar.leases == 0, "{liar:?}");
    assert_eq!(
        summary
            .leases
            .workers
            .iter()
            .filter(|w| w.name == "liar")
            .count(),
        1,
        "one identity for all its connections"
    );
    assert!(
        summary.leases.unresolved.is_empty(),
        "{:?}",
        summary.leases.unresolved
    );
    assert_eq!(summary.leases.computed, 2);
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_liar_and_one_honest_worker_finish_in_bounded_time_with_the_disagreement_reported() {
    let d = tempfile::tempdir().unwrap();
    let mut s = fake_setup(d.path(), 6);
    s.run.verify_fraction = 1.0;
    s.run.disagreement_wait_s = 1;
    let index = s.index.clone();
    let start = std::time::Instant::now();
    let (summary, _) = loopback::run_logged(&s, |l| {
        let l2 = l.clone();
        let liar = tokio::spawn(async move {
            let (mut p, _) = Peer::joined(&l2, "liar").await;
            p.work(|lease| inflated_partial(&index, lease)).await;
            Ok(JoinSummary::default())
        });
        let mut hs = vec![liar];
        hs.extend(fake_workers(l, 1, Duration::from_millis(20)));
        hs
    })
    .await;
    println!(
        "FIGURE one liar, one honest worker, verify_fraction = 1: run finished in {:?}",
        start.elapsed()
    );
    assert_eq!(
        summary.leases.unresolved.len(),
        2,
        "{:?}",
        summary.leases.unresolved
    );
    for what in &summary.leases.unresolved {
        assert!(
            what.contains("liar") && what.contains("no third worker"),
            "{what}"
        );
    }
    assert!(log_text().contains("UNRESOLVED disagreement"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_node_that_reconnects_is_quarantined_and_the_run_completes() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 30);
    let delay = Duration::from_millis(40);
    let (summary, (dropped, end)) = run_beside_fake_workers(&s, 1, delay, |l| async move {
        // Takes a lease, then its connection drops; it comes back at once.
        let mut dropped = 0;
        let end = loop {
            let (mut p, welcome) = Peer::login(&l, "faulty", l.secret.expose()).await;
            if !matches!(welcome, ToWorker::Welcome { .. }) {
                break Some(welcome);
            }
            match p.poll_idle().await {
                Some(ToWorker::Lease(_)) => dropped += 1,
                Some(ToWorker::Wait { retry_ms }) => {
                    tokio::time::sleep(Duration::from_millis(retry_ms)).await
                }
                other => break other,
            }
            p.conn.close(0u32.into(), b"crashed");
            assert!(dropped <= 12, "never quarantined");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        (dropped, end)
    })
    .await;
    assert!(dropped >= 3, "{dropped}");
    assert_quarantined_and_honest(&s, &summary, "faulty", &end, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_joins_first_and_fails_every_lease_does_not_fail_the_run() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 9);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (summary, _) = loopback::run_logged(&s, |l| {
        let l2 = l.clone();
        let broken = tokio::spawn(async move {
            let (mut p, _) = Peer::joined(&l2, "broken").await;
            let (end, failed) = p.fail_every_lease("CUDA error: out of memory").await;
            let _ = tx.send((failed, end));
            // The honest worker joins a second after the quarantine.
            tokio::time::sleep(Duration::from_secs(1)).await;
            join(&client(&l2, "honest"), FakeEngine::new(FAKE_MODEL)).await
        });
        vec![broken]
    })
    .await;
    let (failed, end) = rx.await.unwrap();
    assert_eq!(failed, 3);
    assert!(
        matches!(end, Some(ToWorker::Refused(Refusal::Quarantined(_)))),
        "{end:?}"
    );
    assert_eq!(summary.leases.computed, 3);
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
}
