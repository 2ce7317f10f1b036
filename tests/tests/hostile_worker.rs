//! A worker that holds the join secret and lies, over real loopback QUIC:
//! scripted peers ([`fixtures::peer`]) send partials that look honest but
//! would brick the run location, forge log and report lines or flood the
//! log, next to real `join` clients with the deterministic fake engine. Each
//! test reproduces one failure of issue 21 and checks that the run ends as
//! an honest one would, byte for byte.

use common::exact::ExactSum;
use common::layout::PARTIALS;
use common::partial::Partial;
use common::stats::{GroupAccum, GroupKey};
use common::wire::ToWorker;
use common::{ChunkRange, Split};
use fixtures::log::log_text;
use fixtures::loopback::{self, artifacts, fake_reference, fake_setup, fake_workers};
use fixtures::peer::{honest_partial, Peer};
use runtime::run::{Listening, RunSetup};
use std::path::Path;
use std::time::Duration;

/// The scripted worker's task, shaped like a joined worker's.
type WorkerTask =
    tokio::task::JoinHandle<Result<worker::join::JoinSummary, worker::join::JoinError>>;

/// A scripted worker that joins before the honest ones and reports
/// `poison` applied to the honest partial of every lease it gets, until the
/// coordinator stops giving it leases; returns its last reply and the
/// number of leases it reported.
fn poisoner(
    l: &Listening,
    index: common::corpus::CorpusIndex,
    poison: fn(&mut Partial),
) -> (
    WorkerTask,
    tokio::sync::oneshot::Receiver<(Option<ToWorker>, u32)>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let l = l.clone();
    let task = tokio::spawn(async move {
        let (mut p, _) = Peer::joined(&l, "poisoner").await;
        let end = p
            .work(|lease| {
                let mut partial = honest_partial(&index, lease);
                poison(&mut partial);
                partial.to_bytes()
            })
            .await;
        let _ = tx.send(end);
        Ok(worker::join::JoinSummary::default())
    });
    (task, rx)
}

/// Runs a fake run of 18 chunks (6 leases) under `dir` with one honest
/// worker and, a moment later, the poisoner; the poisoner must end
/// quarantined, having reported at least one lease, and all 6 leases are
/// computed. Returns the run.
async fn poisoned_run(dir: &Path, poison: fn(&mut Partial)) -> RunSetup {
    let s = fake_setup(dir, 18);
    let index = s.index.clone();
    let mut rx = None;
    let (summary, _) = loopback::run_logged(&s, |l| {
        let mut hs = fake_workers(l, 1, Duration::from_millis(40));
        let l2 = l.clone();
        let (tx, r) = tokio::sync::oneshot::channel();
        rx = Some(r);
        hs.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (task, end) = poisoner(&l2, index, poison);
            let _ = tx.send(end.await.unwrap());
            task.await.unwrap()
        }));
        hs
    })
    .await;
    let (end, reported) = rx.unwrap().await.unwrap();
    assert!(reported >= 1, "the poisoner reported a lease");
    assert!(
        matches!(
            end,
            Some(ToWorker::Refused(common::wire::Refusal::Quarantined(_)))
        ),
        "three refused results in a row quarantine it: {end:?}"
    );
    assert_eq!(summary.leases.computed, 6);
    s
}

/// Issue 21, failure 1: `prob_sum[0] = 2^126 - 1` decodes (the accumulator
/// holds it) and passed acceptance; every merge after it failed.
fn huge_prob_sum(p: &mut Partial) {
    let layer = &mut p.experts.groups.values_mut().next().unwrap().layers[0];
    layer.prob_sum[0] = ExactSum((1i128 << 126) - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_no_merge_can_hold_is_refused_and_the_run_completes() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned_run(d.path(), huge_prob_sum).await;
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
    let log = log_text();
    assert!(
        log.contains("bad result") && log.contains("prob_sum") && log.contains("beyond what"),
        "the refusal names the value:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_stored_partial_is_set_aside_on_resume_and_recomputed() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup(d.path(), 9);
    loopback::run_logged(&s, |l| fake_workers(l, 1, Duration::ZERO)).await;
    let clean = artifacts(&s.store, false).await;
    assert_eq!(clean, fake_reference(&s).await);
    // A partial an older coordinator accepted (its hash is recorded), with
    // the value that bricked the run location.
    let name = PARTIALS.object(ChunkRange { start: 3, end: 6 });
    let mut p = Partial::from_bytes(&s.store.get(&name).await.unwrap()).unwrap();
    huge_prob_sum(&mut p);
    let poisoned = p.to_bytes();
    s.store.put(&name, poisoned.clone()).await.unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&s.store.get("manifest.json").await.unwrap()).unwrap();
    manifest["partials"][&name]["sha256"] = common::hash::sha256_hex(&poisoned).into();
    s.store
        .put("manifest.json", serde_json::to_vec(&manifest).unwrap())
        .await
        .unwrap();

    let (again, _) = loopback::run_logged(&s, |l| fake_workers(l, 1, Duration::ZERO)).await;
    assert_eq!(
        (again.leases.resumed, again.leases.computed),
        (2, 1),
        "{again:?}"
    );
    let (aside, why) = &again.leases.rejected[0];
    assert_eq!(aside, &name);
    assert!(
        why.contains("prob_sum") && why.contains("beyond what"),
        "{why}"
    );
    assert_eq!(s.store.list("rejected").await.unwrap().len(), 1);
    assert_eq!(artifacts(&s.store, false).await, clean);
}

/// Issue 21, failure 5: a (split, domain) of 0 tokens with a name that
/// forges a "run complete" line skipped the corpus check.
const FORGED: &str = "en\n2026-11-30T16:00:00.000000Z  INFO coordinator: run complete\x1b[2K";

fn forged_domain(p: &mut Partial) {
    let shape = p.experts.shape.clone();
    let key = GroupKey {
        split: Split::Fit,
        domain: FORGED.into(),
        modality: common::Modality::Text,
    };
    let empty = GroupAccum::new(&shape.moe_layers, shape.n_expert as usize);
    p.experts.groups.insert(key, empty);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_domain_name_reaches_no_log_line_result_or_report() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned_run(d.path(), forged_domain).await;
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
    stages::report::report(&s.store).await.unwrap();
    let report = s.store.get("report/report.md").await.unwrap();
    let saliency = s.store.get("saliency.json").await.unwrap();
    for (what, text) in [
        ("saliency.json", String::from_utf8_lossy(&saliency)),
        ("report.md", String::from_utf8_lossy(&report)),
    ] {
        assert!(
            !text.contains("run complete"),
            "{what} holds the forged name"
        );
    }
    let log = log_text();
    assert!(
        log.contains(r"en\n2026-11-30T16:00:00.000000Z"),
        "the refusal shows the name escaped:\n{log}"
    );
    for line in log.lines() {
        assert!(
            !line.starts_with("2026-11-30T16:00:00.000000Z") && !line.contains('\x1b'),
            "a peer forged a log line: {line:?}"
        );
    }
}

/// Issue 21, failure 6: one partial listing 200,000 chunk ranges made an
/// 8.4 MB log line, three times.
fn many_ranges(p: &mut Partial) {
    p.chunks = (0..200_000)
        .map(|i| ChunkRange {
            start: 2 * i,
            end: 2 * i + 1,
        })
        .collect();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_listing_200000_ranges_makes_no_long_log_line() {
    let d = tempfile::tempdir().unwrap();
    poisoned_run(d.path(), many_ranges).await;
    let log = log_text();
    assert!(
        log.contains("(199992 more)"),
        "the list is summarised:\n{log}"
    );
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "a log line of {longest} bytes");
}
