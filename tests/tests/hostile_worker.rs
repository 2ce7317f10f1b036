//! A worker that holds the join secret and lies, over real loopback QUIC:
//! scripted peers ([`fixtures::peer`]) send partials that look honest but
//! would brick the run location, forge log and report lines or flood the
//! log, next to real `join` clients with the deterministic fake engine. Each
//! test reproduces one failure of issue 21 and checks that the run ends as
//! an honest one would, byte for byte.

use fixtures::log::log_text;
use fixtures::loopback::{
    self, artifacts, fake_reference, fake_setup, fake_setup_with_model, fake_workers,
};
use fixtures::peer::{honest_partial, Peer};
use numbers::exact::ExactSum;
use numbers::imatrix::ImatrixEntry;
use numbers::partial::Partial;
use numbers::stats::{GroupAccum, GroupKey};
use numbers::{ChunkRange, Split};
use protocol::wire::ToWorker;
use runfiles::layout::PARTIALS;
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
    index: runfiles::corpus::CorpusIndex,
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
    poisoned(fake_setup(dir, 18), poison).await
}

/// [`poisoned_run`] of the run `s`.
async fn poisoned(s: RunSetup, poison: fn(&mut Partial)) -> RunSetup {
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
            Some(ToWorker::Refused(protocol::wire::Refusal::Quarantined(_)))
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
    manifest["partials"][&name]["sha256"] = gguf::hash::sha256_hex(&poisoned).into();
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
        modality: numbers::Modality::Text,
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

// Issue 42: one worker key, one crafted partial. The coordinator reads the
// fake engine's model header (`fake_setup_with_model`), as `coordinator run`
// reads the real model's.

/// The run's artifacts equal an honest run's, `verify` passes every
/// invariant (the importance-matrix ones against the model), and the log
/// refused the poisoned partial saying `needle`.
async fn assert_refused_and_clean(s: &RunSetup, needle: &str) {
    assert_eq!(artifacts(&s.store, false).await, fake_reference(s).await);
    let log = log_text();
    assert!(
        log.contains("bad result") && log.contains(needle),
        "the refusal says {needle:?}:\n{log}"
    );
    // `verify` reads the model the manifest records.
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&s.store.get("manifest.json").await.unwrap()).unwrap();
    manifest["model_path"] = s.model_path.to_str().unwrap().into();
    let bytes = serde_json::to_vec(&manifest).unwrap();
    s.store.put("manifest.json", bytes).await.unwrap();
    let report = stages::verify::verify(&s.store).await.unwrap();
    assert!(report.ok(), "{report}");
    for name in [
        stages::verify::names::IMATRIX_ENTRIES,
        stages::verify::names::IMATRIX_SHAPES,
        stages::verify::names::IMATRIX_COUNTS,
        stages::verify::names::IMATRIX_VALUES,
    ] {
        let check = report.check(name).unwrap();
        assert_eq!(check.status, stages::verify::Status::Pass, "{report}");
    }
}

/// Finding 1: an entry under a name the model lacks, of any size (here
/// 2^20 sums a column), was added into the running total. It is refused on
/// the partial's header, before any sum is unpacked.
fn foreign_entry(p: &mut Partial) {
    let e = ImatrixEntry::new(1 << 12, 1 << 8);
    p.imatrix.entries.insert("blk.0.ffn_hoard.weight".into(), e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_the_model_lacks_is_refused_before_it_is_added() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned(fake_setup_with_model(d.path(), 18), foreign_entry).await;
    assert_refused_and_clean(&s, "blk.0.ffn_hoard.weight is not a weight of the model").await;
}

/// Finding 1: a model weight under another shape than the model's.
fn reshaped_entry(p: &mut Partial) {
    let e = ImatrixEntry::new(1 << 12, 1);
    p.imatrix
        .entries
        .insert("blk.0.ffn_gate_inp.weight".into(), e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_weight_of_another_shape_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned(fake_setup_with_model(d.path(), 18), reshaped_entry).await;
    assert_refused_and_clean(&s, "is [4096, 1], the model's weight is [4, 1]").await;
}

/// Finding 3: `in_sum2` of 7.2e16 where honest values are near 1 per row.
fn huge_square(p: &mut Partial) {
    let e = p.imatrix.entries.values_mut().next().unwrap();
    e.in_sum2[0] = ExactSum::from_f64(7.2e16).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_importance_sum_beyond_what_its_rows_allow_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned(fake_setup_with_model(d.path(), 18), huge_square).await;
    assert_refused_and_clean(&s, "sum of squares 72000000000000000").await;
}

/// Finding 3: a partial without one of the entries every MoE layer has.
fn missing_entry(p: &mut Partial) {
    p.imatrix.entries.remove("blk.1.ffn_gate_inp.weight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_missing_an_entry_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned(fake_setup_with_model(d.path(), 18), missing_entry).await;
    assert_refused_and_clean(&s, "importance matrix lacks blk.1.ffn_gate_inp.weight").await;
}

/// Issue 53, finding 4: a partial without a dense weight's entry (block
/// 0's key projection, which every token of the lease passes through) was
/// accepted, and `verify` then failed on the merged counts. It is refused
/// at acceptance, and the run completes as an honest one.
fn missing_dense_entry(p: &mut Partial) {
    assert!(p.imatrix.entries.remove("blk.0.attn_k.weight").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_missing_a_dense_weights_entry_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned(fake_setup_with_model(d.path(), 18), missing_dense_entry).await;
    assert_refused_and_clean(
        &s,
        "importance matrix lacks blk.0.attn_k.weight, a dense weight",
    )
    .await;
}

/// Finding 3: a 126-character tensor name, which llama.cpp's imatrix
/// loader refuses (its names stop at 64 bytes with the NUL).
fn long_name(p: &mut Partial) {
    let e = p.imatrix.entries.values().next().unwrap().clone();
    let name = format!("blk.0.{}.weight", "x".repeat(113));
    p.imatrix.entries.insert(name, e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_llama_cpp_cannot_read_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let s = poisoned(fake_setup_with_model(d.path(), 18), long_name).await;
    assert_refused_and_clean(&s, "has 126 characters").await;
}

/// Finding 2: a worker that reports `Computed` for four leases and never
/// ships them. They expire in one tick; the third expiry quarantines it,
/// which retired the fourth while the expiry loop still listed it: the
/// coordinator panicked. Now the hoarder is quarantined, an honest worker
/// computes everything, and the results are an honest run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_hoarding_computed_leases_is_quarantined_and_the_run_completes() {
    let d = tempfile::tempdir().unwrap();
    let mut s = fake_setup_with_model(d.path(), 18);
    (s.run.lease_timeout_s, s.run.heartbeat_timeout_s) = (2, 30);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (summary, _) = loopback::run_logged(&s, |l| {
        let (l2, honest_joins) = (l.clone(), std::sync::Arc::new(tokio::sync::Notify::new()));
        let go = honest_joins.clone();
        let hoarder = tokio::spawn(async move {
            let (mut p, _) = Peer::joined(&l2, "hoarder").await;
            let mut held = Vec::new();
            while held.len() < 4 {
                match p.poll_idle().await {
                    Some(ToWorker::Lease(lease)) => {
                        let computed = protocol::wire::ToCoordinator::Computed {
                            lease_id: lease.lease_id,
                        };
                        assert_eq!(p.ask(&computed).await, Some(ToWorker::Ack));
                        held.push(lease.lease_id);
                    }
                    other => panic!("a lease for the hoarder: {other:?}"),
                }
            }
            go.notify_one();
            // Heartbeats only, until the coordinator refuses it.
            let end = loop {
                let busy = protocol::wire::ToCoordinator::Poll {
                    protocol_version: protocol::wire::PROTOCOL_VERSION,
                    state: protocol::wire::WorkerState::Busy(held[3]),
                };
                match p.ask(&busy).await {
                    Some(ToWorker::Ack) => tokio::time::sleep(Duration::from_millis(200)).await,
                    other => break other,
                }
            };
            let _ = tx.send(end);
            Ok(worker::join::JoinSummary::default())
        });
        let l3 = l.clone();
        let honest = tokio::spawn(async move {
            honest_joins.notified().await;
            let mut hs = fake_workers(&l3, 1, Duration::ZERO);
            hs.pop().unwrap().await.unwrap()
        });
        vec![hoarder, honest]
    })
    .await;
    let end = rx.await.unwrap();
    assert!(
        matches!(
            end,
            Some(ToWorker::Refused(protocol::wire::Refusal::Quarantined(_)))
        ),
        "{end:?}"
    );
    let hoarder = summary.leases.worker("hoarder").unwrap();
    assert!(hoarder.quarantined && hoarder.leases == 0, "{hoarder:?}");
    assert_eq!(summary.leases.computed, 6);
    assert_eq!(artifacts(&s.store, false).await, fake_reference(&s).await);
}

/// Finding 8: `tokens_per_s` in manifest.json came from the worker's own
/// `elapsed_ms` (a fake worker showed 1,024,000 tokens/s). A worker that
/// takes 600 ms a lease and claims 1 ms is credited with what the
/// coordinator's clock saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_comes_from_the_coordinators_clock_not_the_workers_word() {
    let d = tempfile::tempdir().unwrap();
    let s = fake_setup_with_model(d.path(), 9);
    let index = s.index.clone();
    let (summary, _) = loopback::run_logged(&s, |l| {
        let l = l.clone();
        vec![tokio::spawn(async move {
            let (mut p, _) = Peer::joined(&l, "boaster").await;
            loop {
                match p.poll_idle().await {
                    Some(ToWorker::Lease(lease)) => {
                        tokio::time::sleep(Duration::from_millis(600)).await;
                        let bytes = honest_partial(&index, &lease).to_bytes();
                        // `done_msg` claims 1 ms of work.
                        let done = Peer::done_msg(&lease, bytes);
                        assert_eq!(p.ask(&done).await, Some(ToWorker::Ack));
                    }
                    Some(ToWorker::Wait { retry_ms }) => {
                        tokio::time::sleep(Duration::from_millis(retry_ms)).await
                    }
                    _ => break,
                }
            }
            Ok(worker::join::JoinSummary::default())
        })]
    })
    .await;
    assert_eq!(summary.leases.computed, 3);
    runtime::run::mark_finished(&s.store, &summary, true)
        .await
        .unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&s.store.get("manifest.json").await.unwrap()).unwrap();
    let w = &manifest["run"]["workers"][0];
    assert_eq!(w["name"], "boaster", "{manifest}");
    let (tokens, rate) = (
        w["tokens"].as_f64().unwrap(),
        w["tokens_per_s"].as_f64().unwrap(),
    );
    assert!(tokens > 0.0, "{w}");
    // Three leases of at least 600 ms each on the coordinator's clock.
    assert!(
        rate > 0.0 && rate <= tokens / 1.8,
        "{rate} tokens/s for {tokens} tokens: {w}"
    );
}
