//! Results too large to travel inline (every partial at a real model's
//! shape: about 1 GB against a 64 MiB frame) are staged by the worker in
//! the run's storage and named in `Done`; the coordinator reads them from
//! there. Over real loopback QUIC with scripted peers that share the run's
//! directory, as workers share a bucket.

use fixtures::log::log_text;
use fixtures::loopback::{
    self, artifacts, assert_quarantined_and_honest, client, fake_reference, fake_reference_of,
    fake_setup, run_beside_fake_workers, FAKE_MODEL,
};
use fixtures::peer::{honest_partial, Peer};
use protocol::wire::{LeaseGrant, PartialRef, ToCoordinator, ToWorker};
use runfiles::layout::{staged, PARTIALS, STAGING_DIR};
use runtime::run::RunSetup;
use std::path::Path;
use std::time::Duration;

/// Writes `bytes` where a worker stages the result of SHA-256 `sha256`
/// under the run directory `run`; the `Done` naming it for `lease`.
fn staged_done(
    run: &Path,
    lease: &LeaseGrant,
    sha256: String,
    write: impl FnOnce(&Path),
) -> ToCoordinator {
    let name = staged(&sha256).expect("a SHA-256 in hex");
    let path = run.join(&name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    write(&path);
    ToCoordinator::Done {
        lease_id: lease.lease_id,
        partial: PartialRef::Stored(name),
        sha256,
        elapsed_ms: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_partials_are_read_from_storage_merged_and_cleared() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 18);
    let (run, index) = (d.path().to_path_buf(), s.index.clone());
    let (summary, mut workers) = loopback::run_logged(&s, |l| {
        let l = l.clone();
        vec![tokio::spawn(async move {
            let (mut p, _) = Peer::joined(&l, "stager").await;
            let (end, answered) = p
                .answer_leases(|lease| {
                    let bytes = honest_partial(&index, lease).to_bytes();
                    let sha256 = gguf::hash::sha256_hex(&bytes);
                    staged_done(&run, lease, sha256, |path| {
                        std::fs::write(path, &bytes).unwrap()
                    })
                })
                .await;
            assert_eq!(answered, 6, "every lease went through storage ({end:?})");
            Ok(worker::join::JoinSummary::default())
        })]
    })
    .await;
    workers.pop().unwrap().await.unwrap().unwrap();
    assert_eq!(summary.leases.computed, 6);
    assert_eq!(summary.leases.worker("stager").unwrap().leases, 6);
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
    assert!(s.store.list(STAGING_DIR).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_object_larger_than_max_staged_mib_is_refused_unread() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 18);
    let run = d.path().to_path_buf();
    // 64 GiB, sparse: reading it whole would take the machine's memory.
    let huge = 64u64 << 30;
    let (summary, end) =
        run_beside_fake_workers(&s, 1, Duration::from_millis(40), |l| async move {
            let (mut p, _) = Peer::joined(&l, "hoarder").await;
            let mut n = 0u8;
            let (end, _) = p
                .answer_leases(|lease| {
                    n += 1;
                    let sha256 = gguf::hash::sha256_hex(&[n]);
                    staged_done(&run, lease, sha256, |path| {
                        std::fs::File::create(path).unwrap().set_len(huge).unwrap()
                    })
                })
                .await;
            end
        })
        .await;
    assert_quarantined_and_honest(&s, &summary, "hoarder", &end, 6).await;
    let log = log_text();
    assert!(
        log.contains(&format!(
            "is {huge} bytes, over [cluster] max_staged_mib = 8192"
        )),
        "the refusal names the size and the limit:\n{log}"
    );
    assert!(s.store.list(STAGING_DIR).await.unwrap().is_empty());
}

/// A staged result does not hold its worker: the coordinator answers `Done`
/// and grants the next lease while it is still reading the staged object
/// (a FIFO nobody writes to yet, so that read cannot end before the
/// worker's next lease is in hand). The FIFO is then refused as unreadable
/// (it cannot be read from an offset), its lease computed again, the run
/// honest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_computes_on_while_its_staged_result_waits_to_be_read() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 18);
    let run = d.path().to_path_buf();
    let sha256 = gguf::hash::sha256_hex(b"never written");
    let name = staged(&sha256).unwrap();
    let fifo = run.join(&name);
    let (_, replies) = run_beside_fake_workers(&s, 1, Duration::from_secs(1), |l| async move {
        let (mut p, _) = Peer::joined(&l, "streamer").await;
        let Some(ToWorker::Lease(lease)) = p.poll_idle().await else {
            panic!("no lease for the streamer")
        };
        let done = staged_done(&run, &lease, sha256, |path| {
            let made = std::process::Command::new("mkfifo").arg(path).status();
            assert!(made.unwrap().success(), "mkfifo {}", path.display());
        });
        let wait = Duration::from_secs(60);
        let answered = tokio::time::timeout(wait, p.ask(&done)).await;
        let next = tokio::time::timeout(wait, p.poll_idle()).await;
        // A writer that writes nothing ends the coordinator's read (opening
        // the FIFO waits for that reader).
        tokio::task::spawn_blocking(move || {
            drop(std::fs::OpenOptions::new().write(true).open(fifo).unwrap())
        })
        .await
        .unwrap();
        (answered, next)
    })
    .await;
    let (answered, next) = replies;
    assert!(
        matches!(answered, Ok(Some(ToWorker::Ack))),
        "Done answered before the staged object was read: {answered:?}"
    );
    assert!(
        matches!(next, Ok(Some(ToWorker::Lease(_)))),
        "the next lease granted meanwhile: {next:?}"
    );
    let log = log_text();
    assert!(
        log.contains("bad result") && log.contains(&name),
        "the unreadable object is refused, named:\n{log}"
    );
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
}

/// A run of `s` (18 chunks of the fake setup) by two real join clients
/// whose partials are larger than a frame of 1 MiB (16 layers x 16,384
/// experts: every expert's prob_sum is non-zero), so they stage every one;
/// it must end as the engine's one-call reference, its staging emptied.
async fn run_staging_every_partial(mut s: RunSetup) {
    s.cluster.max_frame_mib = 1;
    let mut engine = fixtures::fake_engine::FakeEngine::new(FAKE_MODEL);
    (engine.n_expert, engine.layers) = (16384, (0..16).collect());
    let (summary, workers) = loopback::run_with(&s, |l| {
        (0..2)
            .map(|i| {
                let (opts, engine) = (client(l, &format!("stager-{i}")), engine.clone());
                tokio::spawn(async move { worker::join::join(&opts, engine).await })
            })
            .collect()
    })
    .await;
    for w in workers {
        w.await.unwrap().unwrap();
    }
    assert_eq!(summary.leases.computed, 6);
    let mut sizes = Vec::new();
    for name in s.store.list(PARTIALS.dir).await.unwrap() {
        sizes.push(s.store.size(&name).await.unwrap());
    }
    assert!(
        sizes.len() == 7 && sizes.iter().all(|&n| n > 1 << 20),
        "6 partials and merged.bin, each too large for a frame: {sizes:?}"
    );
    assert_eq!(
        artifacts(&s.store, false).await,
        fake_reference_of(&s, &engine).await
    );
    assert!(s.store.list(STAGING_DIR).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_clients_stage_partials_larger_than_a_frame_and_the_run_is_unchanged() {
    let d = tempfile::tempdir().unwrap();
    run_staging_every_partial(fake_setup(d.path(), 18)).await;
}

/// On S3 the staged partials are moved by a conditional copy where the
/// store allows it (`AWS_COPY_IF_NOT_EXISTS`), else written again: either
/// way the same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partials_staged_on_s3_make_the_same_run() {
    let Some(bucket) = fixtures::s3_bucket() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let local = fake_setup(d.path(), 18);
    run_staging_every_partial(loopback::on_s3(&bucket, "staged", &local).await).await;
}
