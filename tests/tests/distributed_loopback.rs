//! The coordinator and workers over loopback QUIC with the deterministic
//! fake engine: exact merge whatever the worker count, resume, lease expiry,
//! and the security checks (secret, pin, garbage and oversized frames).

use fixtures::fake_engine::FakeEngine;
use fixtures::loopback::{
    artifacts, client, fake_setup, fake_workers, run_with, Workers, FAKE_MODEL, FAKE_N_CTX,
};
use runfiles::store::RunStore;
use std::net::SocketAddr;
use std::time::Duration;
use worker::join::tls::{client_config, Trust};
use worker::join::{join, JoinError, JoinSummary};

/// Each fake chunk's delay: enough to spread chunks over the workers.
const DELAY: Duration = Duration::from_millis(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_and_three_fake_workers_give_byte_identical_artifacts() {
    let (d1, d3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (s1, mut s3) = (fake_setup(d1.path(), 10), fake_setup(d3.path(), 10));
    // Three workers' results through one ingest slot: checked and merged
    // one at a time, the others waiting their turn.
    s3.run.ingest_slots = 1;
    let (sum1, _) = run_with(&s1, |l| fake_workers(l, 1, DELAY)).await;
    let (sum3, w3) = run_with(&s3, |l| fake_workers(l, 3, DELAY)).await;
    assert_eq!(
        (sum1.leases.units, sum1.leases.computed, sum1.leases.resumed),
        (4, 4, 0)
    );
    assert_eq!((sum3.leases.units, sum3.leases.computed), (4, 4));
    assert_eq!(
        artifacts(&s1.store, false).await,
        artifacts(&s3.store, false).await
    );
    let chunks: u64 = futures_join(w3)
        .await
        .iter()
        .map(|r| r.as_ref().unwrap().chunks)
        .sum();
    assert_eq!(chunks, 10, "every chunk measured exactly once");
    // The reference: the fake engine over all chunks in one call.
    let all = fixtures::chunks(10, FAKE_N_CTX);
    let reference = FakeEngine::new(FAKE_MODEL)
        .partial(&s1.index, &all)
        .unwrap();
    let rd = tempfile::tempdir().unwrap();
    let rs = RunStore::open(rd.path().to_str().unwrap()).unwrap();
    runfiles::artifacts::write_results(&rs, &reference)
        .await
        .unwrap();
    assert_eq!(
        artifacts(&rs, false).await,
        artifacts(&s1.store, false).await
    );
}

async fn futures_join(hs: Workers) -> Vec<Result<JoinSummary, JoinError>> {
    let mut out = Vec::new();
    for h in hs {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reuses_stored_partials_and_recomputes_only_the_missing() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 10);
    run_with(&s, |l| fake_workers(l, 2, DELAY)).await;
    let before = artifacts(&s.store, false).await;
    s.store
        .delete("partials/part-00000003-00000006.bin")
        .await
        .unwrap();
    let (again, _) = run_with(&s, |l| fake_workers(l, 2, DELAY)).await;
    assert_eq!((again.leases.resumed, again.leases.computed), (3, 1));
    assert_eq!(artifacts(&s.store, false).await, before);
    // Everything stored: nothing to compute, no server started.
    let (third, _) = run_with(&s, |_| panic!("no workers needed")).await;
    assert_eq!((third.leases.resumed, third.leases.computed), (4, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_refused_and_receives_no_lease() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 4);
    let (summary, handles) = run_with(&s, |l| {
        let mut bad = client(l, "intruder");
        bad.key = protocol::secret::WorkerKey::derive(
            &protocol::secret::JoinSecret::generate(),
            "intruder",
        );
        let intruder = tokio::spawn(async move { join(&bad, FakeEngine::new(FAKE_MODEL)).await });
        let mut hs = vec![intruder];
        hs.extend(fake_workers(l, 1, DELAY));
        hs
    })
    .await;
    let results = futures_join(handles).await;
    match &results[0] {
        Err(JoinError::Refused(protocol::wire::Refusal::BadProof)) => {}
        other => panic!("the intruder was not refused: {other:?}"),
    }
    assert!(summary.leases.workers.iter().all(|w| w.name != "intruder"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_certificate_not_matching_the_pin_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 4);
    let (_, handles) = run_with(&s, |l| {
        let mut wrong = client(l, "pinned-elsewhere");
        wrong.trust = Trust::Pin("00".repeat(32));
        let w = tokio::spawn(async move { join(&wrong, FakeEngine::new(FAKE_MODEL)).await });
        let mut hs = vec![w];
        hs.extend(fake_workers(l, 1, DELAY));
        hs
    })
    .await;
    let results = futures_join(handles).await;
    match &results[0] {
        Err(JoinError::Connect { reason, .. }) => {
            assert!(reason.contains("does not match the pinned"), "{reason}")
        }
        other => panic!("the worker accepted a certificate it had not pinned: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_with_another_model_refuses_the_job() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 4);
    let (summary, handles) = run_with(&s, |l| {
        let other = client(l, "other-model");
        let w = tokio::spawn(async move { join(&other, FakeEngine::new("another-model")).await });
        let mut hs = vec![w];
        hs.extend(fake_workers(l, 1, DELAY));
        hs
    })
    .await;
    let results = futures_join(handles).await;
    assert!(
        matches!(results[0], Err(JoinError::ModelMismatch { .. })),
        "{:?}",
        results[0]
    );
    assert_eq!(
        summary.leases.worker("other-model").map(|w| w.leases),
        Some(0)
    );
}

/// Opens a pinned QUIC connection and one stream, then sends raw bytes.
async fn raw_stream(addr: SocketAddr, pin: &str, bytes: &[u8]) -> String {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(client_config(&Trust::Pin(pin.into())).unwrap());
    let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    let reason = tokio::time::timeout(Duration::from_secs(10), conn.closed())
        .await
        .expect("the coordinator closes a connection that sends garbage");
    reason.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_frames_close_only_their_connection() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 6);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (summary, handles) = run_with(&s, |l| {
        let (addr, pin) = (l.addr, l.pin.clone());
        let workers = fake_workers(l, 1, DELAY);
        // Keep the worker slow enough that the attacks land mid-run.
        let attacks = tokio::spawn(async move {
            let garbage = raw_stream(
                addr,
                &pin,
                &[0, 0, 0, 9, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5],
            )
            .await;
            let oversized = raw_stream(addr, &pin, &[0xff, 0xff, 0xff, 0xff, 0]).await;
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            udp.send_to(&[0x42; 1200], addr).unwrap();
            let _ = tx.send((garbage, oversized));
            Ok(JoinSummary::default())
        });
        let mut hs = vec![attacks];
        hs.extend(workers);
        hs
    })
    .await;
    let (garbage, oversized) = rx.await.unwrap();
    assert!(garbage.contains("malformed"), "{garbage}");
    assert!(oversized.contains("exceeds the limit"), "{oversized}");
    assert_eq!(summary.leases.computed, 2);
    for r in futures_join(handles).await {
        r.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_worker_lease_expires_and_another_worker_finishes_it() {
    let d = tempfile::tempdir().unwrap();
    let mut s = fake_setup(d.path(), 6);
    s.run.lease_timeout_s = 1;
    let (summary, handles) = run_with(&s, |l| {
        let hole = client(l, "blackhole");
        let mut engine = FakeEngine::new(FAKE_MODEL);
        engine.hang = true;
        let holds = std::sync::Arc::new(tokio::sync::Notify::new());
        engine.measuring = Some(holds.clone());
        let h = tokio::spawn(async move { join(&hole, engine).await });
        let good = client(l, "good");
        // The good worker joins once the black hole holds a lease.
        let g = tokio::spawn(async move {
            holds.notified().await;
            join(&good, FakeEngine::new(FAKE_MODEL)).await
        });
        vec![h, g]
    })
    .await;
    assert!(summary.leases.retries >= 1, "{summary:?}");
    assert_eq!(summary.leases.computed, 2);
    let good = summary.leases.worker("good").unwrap();
    assert_eq!(good.leases, 2);
    handles[0].abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_fake_run_round_trips_through_s3() {
    let Some(bucket) = fixtures::s3_bucket() else {
        return;
    };
    let local_dir = tempfile::tempdir().unwrap();
    let local = fake_setup(local_dir.path(), 7);
    run_with(&local, |l| fake_workers(l, 2, DELAY)).await;
    let remote = fixtures::loopback::on_s3(&bucket, "loopback", &local).await;
    let s3 = remote.store.clone();
    let (summary, _) = run_with(&remote, |l| fake_workers(l, 2, DELAY)).await;
    assert_eq!(summary.leases.computed, 3);
    assert_eq!(
        artifacts(&s3, false).await,
        artifacts(&local.store, false).await
    );
    assert_eq!(
        s3.list("partials").await.unwrap().len(),
        4,
        "3 lease partials and merged.bin"
    );
}
