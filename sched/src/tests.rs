//! The scheduler in simulated time: virtual workers that answer after a
//! delay, a blackhole worker that never answers, a flaky worker that fails
//! every lease, and late duplicates.

use super::*;

const W1: WorkerId = WorkerId(1);
const W2: WorkerId = WorkerId(2);
const W3: WorkerId = WorkerId(3);
const I1: Identity = Identity(1);
const I2: Identity = Identity(2);

/// The identity of a connection in these tests: one per connection,
/// except where a test reconnects a worker.
fn id(w: WorkerId) -> Identity {
    Identity(w.0)
}

fn cfg() -> SchedConfig {
    SchedConfig {
        lease_timeout: Duration::from_secs(10),
        heartbeat_timeout: Duration::from_secs(3),
        max_attempts: 3,
        max_worker_failures: 3,
        idle_poll: Duration::from_millis(100),
        verify_fraction: 0.0,
        sample_salt: SampleSalt::new([7; 32]),
        quarantine: Duration::from_secs(100),
        disagreement_wait: Duration::from_secs(5),
        no_worker_grace: Duration::from_secs(20),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn lease(g: Grant) -> LeaseGrant {
    match g {
        Grant::Lease(l) => l,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn sha(range: ChunkRange) -> String {
    format!("sha-of-{range}")
}

#[test]
fn plan_covers_every_chunk_once() {
    let p = plan(10, 4);
    assert_eq!(
        p,
        vec![
            ChunkRange { start: 0, end: 4 },
            ChunkRange { start: 4, end: 8 },
            ChunkRange { start: 8, end: 10 }
        ]
    );
    assert!(plan(0, 4).is_empty());
    assert_eq!(plan(3, 0).len(), 3);
}

/// A scheduler over `units` (nothing resumed) with `workers` registered at
/// time zero, each under its own identity.
fn started(config: SchedConfig, units: Vec<ChunkRange>, workers: &[WorkerId]) -> Scheduler {
    let mut s = Scheduler::new(config, units, &BTreeMap::new());
    for &w in workers {
        s.register(w, id(w), Duration::ZERO);
    }
    s
}

/// How the odd worker of a [`simulate`]d run behaves.
#[derive(Clone, Copy)]
enum Odd {
    /// Never finishes a lease; keeps sending heartbeats so only the lease
    /// deadline catches it.
    Blackhole,
    /// Fails every lease at once, until it is quarantined.
    Flaky,
}

/// Virtual workers (registered already) that finish each lease after `work`
/// seconds, one of them possibly `odd`; returns the accepted ranges in
/// acceptance order.
fn simulate(
    s: &mut Scheduler,
    workers: &[WorkerId],
    odd: Option<(WorkerId, Odd)>,
    work: u64,
) -> Vec<ChunkRange> {
    let mut accepted = Vec::new();
    let mut running: BTreeMap<WorkerId, (LeaseGrant, Duration)> = BTreeMap::new();
    for t in 0..1000u64 {
        let now = secs(t);
        s.tick(now);
        for &w in workers {
            match odd {
                Some((o, Odd::Blackhole)) if o == w => {
                    if let std::collections::btree_map::Entry::Vacant(slot) = running.entry(w) {
                        if let Grant::Lease(l) = s.request(w, now) {
                            slot.insert((l, Duration::MAX));
                        }
                    }
                    let _ = s.heartbeat(w, now);
                    continue;
                }
                Some((o, Odd::Flaky)) if o == w => {
                    if s.quarantine_reason(id(w)).is_none() {
                        if let Grant::Lease(l) = s.request(w, now) {
                            s.fail(l.lease_id, w, "CUDA error", now);
                        }
                    }
                    continue;
                }
                _ => {}
            }
            match running.get(&w) {
                Some((l, end)) if *end <= now => {
                    if let Completion::Accepted(r) = s.complete(l.lease_id, w, &sha(l.range), now) {
                        accepted.push(r);
                    }
                    running.remove(&w);
                }
                Some(_) => s.heartbeat(w, now).unwrap(),
                None => {}
            }
            if let std::collections::btree_map::Entry::Vacant(slot) = running.entry(w) {
                if let Grant::Lease(l) = s.request(w, now) {
                    slot.insert((l, now + secs(work)));
                }
            }
        }
        if s.is_finished() || s.failure().is_some() {
            break;
        }
    }
    accepted
}

#[test]
fn every_unit_is_accepted_exactly_once_with_three_workers() {
    let units = plan(20, 3);
    let mut s = started(cfg(), units.clone(), &[W1, W2, W3]);
    let mut got = simulate(&mut s, &[W1, W2, W3], None, 2);
    got.sort();
    assert_eq!(got, units);
    assert!(s.is_finished());
    assert_eq!(s.progress().retries, 0);
    assert_eq!(s.request(W1, secs(999)), Grant::Finished);
}

#[test]
fn chunks_done_counts_the_chunks_of_done_units_the_short_last_one_included() {
    // 20 chunks in leases of 3: six of 3 and a last one of 2.
    let units = plan(20, 3);
    let mut s = started(cfg(), units.clone(), &[W1]);
    assert_eq!(s.chunks_done(), (0, 20));
    let mut done = 0;
    while let Grant::Lease(l) = s.request(W1, secs(1)) {
        let r = l.range;
        assert!(matches!(
            s.complete(l.lease_id, W1, &sha(r), secs(1)),
            Completion::Accepted(_)
        ));
        done += u64::from(r.end - r.start);
        assert_eq!(s.chunks_done(), (done, 20), "after {r}");
    }
    assert_eq!(done, 20);
}

#[test]
fn blackhole_worker_lease_expires_and_is_retried_elsewhere() {
    let units = plan(6, 2);
    let mut s = started(cfg(), units.clone(), &[W1, W2]);
    let mut got = simulate(&mut s, &[W1, W2], Some((W1, Odd::Blackhole)), 1);
    got.sort();
    assert_eq!(
        got, units,
        "the blackholed unit was re-leased and finished by W2"
    );
    assert!(s.progress().retries >= 1);
    assert!(s.failure().is_none());
}

#[test]
fn expiry_reports_an_event_and_requeues_the_unit_first() {
    let units = plan(4, 2);
    let mut s = started(cfg(), units, &[W1, W2]);
    let l1 = lease(s.request(W1, secs(0)));
    let _l2 = lease(s.request(W2, secs(0)));
    s.heartbeat(W1, secs(9)).unwrap();
    s.heartbeat(W2, secs(9)).unwrap();
    let ev = s.tick(secs(10));
    assert!(
        ev.contains(&Event::LeaseExpired {
            lease: l1.lease_id,
            range: l1.range,
            worker: W1
        }),
        "{ev:?}"
    );
    // W2's lease expired too; a fresh worker gets W1's unit back first.
    s.register(W3, id(W3), secs(10));
    assert_eq!(lease(s.request(W3, secs(10))).range, l1.range);
}

#[test]
fn silent_worker_is_dropped_and_its_lease_requeued() {
    let mut s = started(cfg(), plan(2, 2), &[W1]);
    let l = lease(s.request(W1, secs(0)));
    assert_eq!(s.tick(secs(3)), vec![Event::WorkerSilent(W1)]);
    assert_eq!(s.progress().retries, 1);
    s.register(W2, id(W2), secs(3));
    assert_eq!(lease(s.request(W2, secs(3))).range, l.range);
    // The dropped worker is unknown now.
    assert_eq!(s.heartbeat(W1, secs(4)), Err(SchedError::UnknownWorker(W1)));
}

#[test]
fn disconnect_requeues_and_retries_are_bounded_with_a_clear_failure() {
    let mut s = started(cfg(), plan(4, 4), &[]);
    for i in 0..3 {
        let w = WorkerId(10 + i);
        s.register(w, id(w), secs(i));
        let l = lease(s.request(w, secs(i)));
        assert_eq!(l.range, ChunkRange { start: 0, end: 4 });
        s.disconnect(w, "connection lost: killed");
    }
    let err = s.failure().cloned().expect("the run failed");
    assert_eq!(
        err.to_string(),
        "chunks 0..4 failed on 3 distinct workers (limit 3); last: connection lost: killed"
    );
    s.register(W1, id(W1), secs(5));
    assert_eq!(s.request(W1, secs(5)), Grant::Failed(err));
}

#[test]
fn late_result_of_expired_lease_is_accepted_once_and_the_retry_is_a_duplicate() {
    let mut s = started(cfg(), plan(2, 2), &[W1, W2]);
    let l1 = lease(s.request(W1, secs(0)));
    s.heartbeat(W1, secs(10)).unwrap();
    s.heartbeat(W2, secs(10)).unwrap();
    s.tick(secs(10));
    let l2 = lease(s.request(W2, secs(10)));
    assert_eq!(l1.range, l2.range);
    assert_eq!(
        s.complete(l1.lease_id, W1, "aaa", secs(11)),
        Completion::Accepted(l1.range)
    );
    assert!(s.is_finished());
    assert_eq!(
        s.complete(l2.lease_id, W2, "aaa", secs(12)),
        Completion::Duplicate {
            range: l2.range,
            same: true
        }
    );
    // A second copy of the same report is unknown now.
    assert_eq!(
        s.complete(l2.lease_id, W2, "aaa", secs(12)),
        Completion::Unknown
    );
    let p = s.progress();
    assert_eq!((p.accepted, p.duplicates, p.mismatches), (1, 1, 0));
}

#[test]
fn differing_duplicate_is_counted_as_a_mismatch() {
    let mut s = started(cfg(), plan(1, 1), &[W1, W2]);
    let l1 = lease(s.request(W1, secs(0)));
    s.disconnect(W1, "gone");
    let l2 = lease(s.request(W2, secs(1)));
    assert_eq!(
        s.complete(l2.lease_id, W2, "bbb", secs(2)),
        Completion::Accepted(l2.range)
    );
    // W1 reconnects under a new id; its old lease id means nothing for the new id.
    assert_eq!(
        s.complete(l1.lease_id, W3, "ccc", secs(3)),
        Completion::Unknown
    );
}

#[test]
fn results_from_a_worker_that_does_not_hold_the_lease_are_unknown() {
    let mut s = started(cfg(), plan(2, 1), &[W1, W2]);
    let l1 = lease(s.request(W1, secs(0)));
    assert_eq!(
        s.complete(l1.lease_id, W2, "x", secs(1)),
        Completion::Unknown
    );
    assert_eq!(s.lease_range(l1.lease_id, W2), None);
    assert_eq!(s.lease_range(l1.lease_id, W1), Some(l1.range));
}

#[test]
fn resumed_units_are_not_leased_again() {
    let units = plan(6, 2);
    let done: BTreeMap<ChunkRange, String> =
        [(units[0], "h0".to_string()), (units[2], "h2".to_string())].into();
    let mut s = Scheduler::new(cfg(), units.clone(), &done);
    assert_eq!(s.progress().resumed, 2);
    s.register(W1, id(W1), secs(0));
    let l = lease(s.request(W1, secs(0)));
    assert_eq!(l.range, units[1]);
    let again = lease(s.request(W1, secs(0)));
    assert_eq!(
        (again.range, s.progress().retries),
        (units[1], 1),
        "an idle poll gives the held lease up"
    );
    assert_ne!(again.lease_id, l.lease_id);
}

#[test]
fn failures_reported_in_a_burst_do_not_fail_the_run() {
    // Regression: three `Failed` reports for one worker's leases within
    // milliseconds used to fail the run ("chunks 0..4 failed 3 times").
    let mut s = started(cfg(), plan(16, 4), &[W1, W2]);
    let first = lease(s.request(W1, secs(0)));
    let mut quarantine = None;
    for _ in 0..3 {
        match s.request(W1, secs(0)) {
            Grant::Lease(l) => quarantine = s.fail(l.lease_id, W1, "boom", secs(0)),
            Grant::Failed(SchedError::Quarantined { worker, .. }) => assert_eq!(worker, W1),
            other => panic!("unexpected {other:?}"),
        }
    }
    let _ = first;
    assert!(
        matches!(quarantine, Some(Event::Quarantined { worker: I1, .. })),
        "{quarantine:?}"
    );
    assert!(s.failure().is_none(), "{:?}", s.failure());
    assert!(s
        .quarantine_reason(id(W1))
        .unwrap()
        .contains("3 failures in a row"));
    // W2 finishes everything.
    while !s.is_finished() {
        let l = lease(s.request(W2, secs(1)));
        assert_eq!(
            s.complete(l.lease_id, W2, &sha(l.range), secs(1)),
            Completion::Accepted(l.range)
        );
    }
    assert_eq!(s.progress().quarantined, 1);
}

#[test]
fn a_failed_unit_goes_to_another_worker_not_straight_back() {
    let mut s = started(cfg(), plan(4, 2), &[W1, W2]);
    let l = lease(s.request(W1, secs(0)));
    assert_eq!(s.fail(l.lease_id, W1, "oom", secs(1)), None);
    let again = lease(s.request(W1, secs(1)));
    assert_ne!(again.range, l.range, "W1 gets the other unit");
    assert_eq!(lease(s.request(W2, secs(1))).range, l.range);
}

#[test]
fn a_lone_worker_may_retry_its_own_failure_until_quarantined() {
    let mut s = started(cfg(), plan(2, 2), &[W1]);
    let l = lease(s.request(W1, secs(0)));
    s.fail(l.lease_id, W1, "transient", secs(0));
    // No other worker could take it: W1 may try again, and succeed.
    let l = lease(s.request(W1, secs(1)));
    s.complete(l.lease_id, W1, "h", secs(2));
    assert!(s.is_finished());
    assert!(s.failure().is_none());
}

#[test]
fn quarantine_that_leaves_no_healthy_worker_fails_the_run_clearly_after_the_grace_period() {
    let mut s = started(cfg(), plan(8, 2), &[W1]);
    for t in 0..3 {
        let l = lease(s.request(W1, secs(t)));
        s.fail(l.lease_id, W1, "corpus unreadable", secs(t));
    }
    s.tick(secs(3));
    s.tick(secs(22));
    assert!(s.failure().is_none(), "within the 20 s grace period");
    s.tick(secs(23));
    let e = s.failure().cloned().expect("the run failed");
    assert_eq!(
        e.to_string(),
        "no healthy worker remains: identity#1 was quarantined after 3 failures in a row; last: corpus unreadable"
    );
}

#[test]
fn a_worker_that_fails_first_does_not_fail_a_run_an_honest_one_joins_within_the_grace() {
    let mut s = started(cfg(), plan(4, 2), &[W1]);
    for t in 0..3 {
        let l = lease(s.request(W1, secs(t)));
        s.fail(l.lease_id, W1, "CUDA error", secs(t));
        s.tick(secs(t));
    }
    assert!(s.quarantine_reason(I1).is_some());
    s.tick(secs(10));
    s.register(W2, id(W2), secs(15));
    while !s.is_finished() {
        s.tick(secs(16));
        let l = lease(s.request(W2, secs(16)));
        s.complete(l.lease_id, W2, &sha(l.range), secs(16));
    }
    s.tick(secs(60));
    assert!(s.failure().is_none(), "{:?}", s.failure());
}

#[test]
fn identity_not_connection_counts_failures_quarantine_and_opinions() {
    // One identity, a new connection for each lease: its failures add up,
    // it is never its own second opinion, and its quarantine outlives the
    // connection and times out.
    let mut s = started(verifying(), plan(4, 2), &[]);
    s.register(WorkerId(10), I1, secs(0));
    let l = lease(s.request(WorkerId(10), secs(0)));
    assert!(matches!(
        s.complete(l.lease_id, WorkerId(10), "h", secs(0)),
        Completion::Opinion { have: 1, .. }
    ));
    s.disconnect(WorkerId(10), "reconnecting");
    for n in 11..14u64 {
        let w = WorkerId(n);
        s.register(w, I1, secs(n - 10));
        let other = lease(s.request(w, secs(n - 10)));
        assert_ne!(other.range, l.range, "never the unit it already answered");
        s.disconnect(w, "connection lost");
    }
    let why = s.quarantine_reason(I1).expect("quarantined by identity");
    assert!(why.contains("3 failures in a row"), "{why}");
    // What a later phase keeps of it: its 100 s, from the quarantine at 3 s.
    assert_eq!(
        s.quarantines(),
        vec![(I1, why.to_string(), Some(secs(100)))]
    );
    s.register(WorkerId(14), I1, secs(4));
    assert!(matches!(
        s.request(WorkerId(14), secs(4)),
        Grant::Failed(SchedError::Quarantined { .. })
    ));
    s.disconnect(WorkerId(14), "refused");
    assert!(
        s.failure().is_none(),
        "one identity's failures are one worker's"
    );
    assert_eq!(s.tick(secs(104)), vec![Event::Released(I1)]);
    assert!(s.quarantine_reason(I1).is_none());
}

#[test]
fn a_disagreement_with_no_third_identity_is_decided_after_the_wait() {
    let mut s = started(verifying(), plan(2, 2), &[W1, W2]);
    let a = lease(s.request(W1, secs(0)));
    s.complete(a.lease_id, W1, "h1", secs(1));
    let b = lease(s.request(W2, secs(1)));
    assert_eq!(
        s.complete(b.lease_id, W2, "h2", secs(2)),
        Completion::Decide(a.range)
    );
    s.settle(a.range, Verdict::Disagree, secs(2));
    for w in [W1, W2] {
        s.heartbeat(w, secs(6)).unwrap();
    }
    assert!(s.tick(secs(6)).is_empty(), "still waiting");
    assert_eq!(
        s.tick(secs(7)),
        vec![Event::Unresolved {
            range: a.range,
            kept: I1,
            other: I2
        }]
    );
    assert!(s.is_finished());
    let p = s.progress();
    assert_eq!((p.disagreements, p.unresolved, p.verified), (1, 1, 0));
}

#[test]
fn a_quarantined_worker_gets_no_work_and_its_results_are_ignored() {
    let mut s = started(cfg(), plan(8, 2), &[W1, W2]);
    let mut last = None;
    for t in 0..3 {
        let l = lease(s.request(W1, secs(t)));
        s.fail(l.lease_id, W1, "bad", secs(t));
        last = Some(l);
    }
    assert!(matches!(
        s.request(W1, secs(4)),
        Grant::Failed(SchedError::Quarantined { worker: W1, .. })
    ));
    assert!(matches!(
        s.heartbeat(W1, secs(4)),
        Err(SchedError::Quarantined { .. })
    ));
    let l = last.unwrap();
    assert_eq!(
        s.complete(l.lease_id, W1, "x", secs(5)),
        Completion::Unknown
    );
    // Still quarantined after it disconnects (a reconnect is refused by name upstream).
    s.disconnect(W1, "bye");
    assert!(s.quarantine_reason(id(W1)).is_some());
}

#[test]
fn a_unit_fails_the_run_only_after_distinct_workers_failed_it() {
    let mut s = started(cfg(), plan(2, 2), &[W1, W2, W3]);
    for (i, w) in [W1, W2].into_iter().enumerate() {
        let l = lease(s.request(w, secs(i as u64)));
        s.fail(l.lease_id, w, "nan", secs(i as u64));
        assert!(s.failure().is_none());
    }
    let l = lease(s.request(W3, secs(3)));
    s.fail(l.lease_id, W3, "nan", secs(3));
    assert!(matches!(
        s.failure(),
        Some(SchedError::UnitFailed { workers: 3, .. })
    ));
}

#[test]
fn flaky_worker_is_quarantined_and_the_others_finish_in_simulated_time() {
    let units = plan(30, 2);
    let mut s = started(cfg(), units.clone(), &[W1, W2, W3]);
    let mut accepted = simulate(&mut s, &[W1, W2, W3], Some((W1, Odd::Flaky)), 2);
    assert!(s.failure().is_none(), "{:?}", s.failure());
    accepted.sort();
    assert_eq!(accepted, units);
    assert!(s.quarantine_reason(id(W1)).is_some());
    assert_eq!(s.progress().quarantined, 1);
    assert_eq!(
        s.progress().retries,
        3,
        "W1 failed three leases, then got none"
    );
}

fn verifying() -> SchedConfig {
    SchedConfig {
        verify_fraction: 1.0,
        ..cfg()
    }
}

#[test]
fn sampled_units_need_results_from_two_workers() {
    let mut s = started(verifying(), plan(2, 2), &[W1, W2]);
    let l1 = lease(s.request(W1, secs(0)));
    assert_eq!(
        s.complete(l1.lease_id, W1, "h", secs(1)),
        Completion::Opinion {
            range: l1.range,
            have: 1,
            needed: 2
        }
    );
    assert!(!s.is_finished());
    assert!(
        matches!(s.request(W1, secs(1)), Grant::Wait(_)),
        "a worker is never its own second opinion"
    );
    let l2 = lease(s.request(W2, secs(1)));
    assert_eq!(l2.range, l1.range);
    assert_eq!(
        s.complete(l2.lease_id, W2, "h", secs(2)),
        Completion::Decide(l1.range)
    );
    assert_eq!(
        s.settle(l1.range, Verdict::Agree { keep: I1 }, secs(2)),
        None
    );
    assert!(s.is_finished());
    assert_eq!((s.progress().verified, s.progress().accepted), (1, 1));
}

/// The second opinion of a sampled unit falls to the identity that failed
/// it when the only other healthy identity already gave the first: it used
/// to wait for an identity that could never take it (found by the random
/// interleavings).
#[test]
fn a_second_opinion_goes_to_a_worker_that_failed_the_unit_when_no_other_can_give_it() {
    let mut s = started(verifying(), plan(2, 2), &[W1, W2]);
    let failed = lease(s.request(W2, secs(0)));
    s.fail(failed.lease_id, W2, "CUDA error", secs(0));
    let first = lease(s.request(W1, secs(1)));
    assert!(matches!(
        s.complete(first.lease_id, W1, "h", secs(2)),
        Completion::Opinion { have: 1, .. }
    ));
    assert!(matches!(s.request(W1, secs(2)), Grant::Wait(_)));
    let second = lease(s.request(W2, secs(2)));
    assert_eq!(second.range, first.range);
    assert_eq!(
        s.complete(second.lease_id, W2, "h", secs(3)),
        Completion::Decide(first.range)
    );
}

#[test]
fn a_disagreement_asks_a_third_worker_and_quarantines_the_odd_one() {
    let mut s = started(verifying(), plan(2, 2), &[W1, W2, W3]);
    let cheat = lease(s.request(W2, secs(0)));
    s.complete(cheat.lease_id, W2, "forged", secs(1));
    let honest = lease(s.request(W1, secs(1)));
    let range = honest.range;
    assert_eq!(
        s.complete(honest.lease_id, W1, "h", secs(2)),
        Completion::Decide(range)
    );
    assert_eq!(s.settle(range, Verdict::Disagree, secs(2)), None);
    assert!(!s.is_finished());
    assert!(matches!(s.request(W1, secs(2)), Grant::Wait(_)));
    assert!(matches!(s.request(W2, secs(2)), Grant::Wait(_)));
    let third = lease(s.request(W3, secs(2)));
    assert_eq!(
        s.complete(third.lease_id, W3, "h", secs(3)),
        Completion::Decide(range)
    );
    let event = s.settle(range, Verdict::Odd { keep: I1, odd: I2 }, secs(3));
    assert!(
        matches!(event, Some(Event::Quarantined { worker: I2, .. })),
        "{event:?}"
    );
    assert!(s.is_finished());
    assert!(s.quarantine_reason(id(W2)).is_some());
    let kept = s.quarantines();
    assert!(
        matches!(kept.as_slice(), [(I2, _, None)]),
        "contradicted: out for the run, {kept:?}"
    );
    let p = s.progress();
    assert_eq!((p.disagreements, p.verified, p.quarantined), (1, 1, 1));
}

#[test]
fn no_two_agreeing_results_fail_the_run() {
    let mut s = started(verifying(), plan(2, 2), &[W1, W2, W3]);
    for (t, w) in [W1, W2].into_iter().enumerate() {
        let l = lease(s.request(w, secs(t as u64)));
        s.complete(l.lease_id, w, &format!("h{t}"), secs(t as u64));
    }
    s.settle(plan(2, 2)[0], Verdict::Disagree, secs(2));
    let l = lease(s.request(W3, secs(3)));
    s.complete(l.lease_id, W3, "h3", secs(3));
    s.settle(l.range, Verdict::NoAgreement("all differ".into()), secs(3));
    assert!(
        s.failure()
            .unwrap()
            .to_string()
            .contains("no two results agree"),
        "{:?}",
        s.failure()
    );
}

#[test]
fn the_redundancy_sample_is_salted_deterministic_and_near_its_fraction() {
    let units = plan(100_000, 1);
    let salt = SampleSalt::new([1; 32]);
    let picked = |salt: &SampleSalt| -> Vec<bool> {
        units.iter().map(|r| sampled(*r, 0.25, salt)).collect()
    };
    let n = picked(&salt).iter().filter(|s| **s).count();
    assert!((23_000..27_000).contains(&n), "{n}");
    assert!(units.iter().all(|r| sampled(*r, 1.0, &salt)));
    assert!(!units.iter().any(|r| sampled(*r, 0.0, &salt)));
    assert_eq!(
        picked(&salt),
        picked(&SampleSalt::new([1; 32])),
        "one salt, one sample"
    );
    let other = picked(&SampleSalt::new([2; 32]));
    let same = picked(&salt)
        .iter()
        .zip(&other)
        .filter(|(a, b)| a == b)
        .count();
    assert!(
        same < 70_000,
        "another salt picks other units ({same} alike)"
    );
}

/// `w` computes its next lease and holds it for its checkpoint.
fn hold(s: &mut Scheduler, w: WorkerId, now: Duration) -> LeaseGrant {
    let l = lease(s.request(w, now));
    assert!(s.computed(l.lease_id, w, now));
    l
}

#[test]
fn held_leases_are_done_only_when_their_checkpoint_is_accepted() {
    let mut s = started(cfg(), plan(8, 2), &[W1]);
    let a = hold(&mut s, W1, secs(0));
    // The idle poll for the next lease does not give up the held one.
    let b = hold(&mut s, W1, secs(1));
    assert_eq!((s.progress().retries, s.progress().done), (0, 0));
    assert_eq!(s.lease_ranges(&[a.lease_id, a.lease_id], W1), None);
    assert_eq!(s.lease_ranges(&[b.lease_id, a.lease_id], W2), None);
    assert_eq!(
        s.complete_set(&[b.lease_id, a.lease_id], W1, "sha", secs(2)),
        Completion::AcceptedSet(vec![b.range, a.range])
    );
    assert_eq!(s.progress().done, 2);
    assert_eq!(
        s.complete_set(&[a.lease_id, b.lease_id], W1, "sha", secs(2)),
        Completion::Unknown,
        "a checkpoint counts once"
    );
    // A held lease keeps a deadline: a checkpoint that never comes frees it.
    let c = hold(&mut s, W1, secs(3));
    s.heartbeat(W1, secs(12)).unwrap();
    s.tick(secs(13));
    assert_eq!(s.lease_range(c.lease_id, W1), Some(c.range));
    assert_eq!(s.progress().retries, 1);
}

#[test]
fn a_worker_lost_between_checkpoints_loses_its_held_leases_with_one_failure() {
    let mut s = started(cfg(), plan(8, 2), &[W1, W2]);
    let lost: BTreeSet<ChunkRange> = [
        hold(&mut s, W1, secs(0)).range,
        hold(&mut s, W1, secs(1)).range,
        lease(s.request(W1, secs(2))).range,
    ]
    .into();
    s.disconnect(W1, "killed");
    assert_eq!(s.progress().retries, 3);
    assert_eq!(
        s.quarantine_reason(id(W1)),
        None,
        "one failure, not one per lease (the limit is 3)"
    );
    let redone: Vec<LeaseGrant> = (3..7).map(|t| hold(&mut s, W2, secs(t))).collect();
    let ranges: BTreeSet<ChunkRange> = redone.iter().map(|l| l.range).collect();
    assert!(lost.is_subset(&ranges), "{lost:?} {ranges:?}");
    let ids: Vec<LeaseId> = redone.iter().map(|l| l.lease_id).collect();
    assert!(matches!(
        s.complete_set(&ids, W2, "sha", secs(7)),
        Completion::AcceptedSet(r) if r.len() == 4
    ));
    assert!(s.is_finished());
}

#[test]
fn a_late_checkpoint_is_accepted_whole_or_refused_whole() {
    // W1 holds two leases and goes silent; its checkpoint comes late.
    let presumed_lost = || {
        let mut s = started(cfg(), plan(6, 2), &[W1, W2]);
        let held = [hold(&mut s, W1, secs(0)), hold(&mut s, W1, secs(1))];
        s.heartbeat(W2, secs(5)).unwrap();
        s.tick(secs(5));
        assert_eq!(s.progress().retries, 2);
        (s, held.clone().map(|l| l.lease_id), held.map(|l| l.range))
    };
    // Nothing was recomputed yet: accepted for both units, and only the
    // third unit is left.
    let (mut s, ids, ranges) = presumed_lost();
    assert!(matches!(
        s.complete_set(&ids, W1, "late", secs(6)),
        Completion::AcceptedSet(_)
    ));
    let rest = lease(s.request(W2, secs(6)));
    assert!(!ranges.contains(&rest.range));
    assert_eq!(
        s.complete(rest.lease_id, W2, "x", secs(6)),
        Completion::Accepted(rest.range)
    );
    assert!(s.is_finished());
    assert_eq!(s.progress().done, 3);
    // One of its units was recomputed meanwhile: refused whole, and the
    // other goes (back) to the queue, so no unit counts twice.
    let (mut s, ids, _) = presumed_lost();
    let again = lease(s.request(W2, secs(6)));
    assert!(s.computed(again.lease_id, W2, secs(6)));
    assert!(matches!(
        s.complete_set(&[again.lease_id], W2, "x", secs(6)),
        Completion::Accepted(_)
    ));
    assert!(matches!(
        s.complete_set(&ids, W1, "late", secs(7)),
        Completion::Stale(r) if r.len() == 2
    ));
    assert_eq!(s.progress().done, 1);
    for t in 8..10 {
        let l = lease(s.request(W2, secs(t)));
        assert!(matches!(
            s.complete(l.lease_id, W2, "x", secs(t)),
            Completion::Accepted(_)
        ));
    }
    assert!(s.is_finished());
    assert_eq!(s.progress().done, 3);
}

#[test]
fn a_checkpoint_holding_a_sampled_unit_is_refused() {
    let mut s = started(verifying(), plan(4, 2), &[W1]);
    let ids = [
        hold(&mut s, W1, secs(0)).lease_id,
        hold(&mut s, W1, secs(1)).lease_id,
    ];
    assert!(matches!(
        s.complete_set(&ids, W1, "sha", secs(2)),
        Completion::Stale(_)
    ));
    assert_eq!(s.progress().done, 0);
}

#[test]
fn a_worker_hoarding_four_computed_leases_is_quarantined_without_a_panic() {
    // W1 reports `Computed` for four leases and never ships them: all four
    // expire in one tick, the third expiry quarantines W1, which retires the
    // fourth while the expiry loop still had it listed.
    let mut s = started(cfg(), plan(12, 2), &[W1, W2]);
    let hoarded: Vec<LeaseGrant> = (0..4).map(|_| hold(&mut s, W1, secs(0))).collect();
    s.heartbeat(W2, secs(10)).unwrap();
    let events = s.tick(secs(10));
    let expired = events
        .iter()
        .filter(|e| matches!(e, Event::LeaseExpired { .. }))
        .count();
    assert_eq!(
        expired, 3,
        "the fourth was retired by the quarantine: {events:?}"
    );
    assert!(s.quarantine_reason(id(W1)).is_some(), "{events:?}");
    assert_eq!(s.progress().retries, 4);
    assert_eq!(s.progress().leased, 0);
    // W2 finishes every unit, the hoarded ones included.
    let mut done = BTreeSet::new();
    for t in 11..30 {
        match s.request(W2, secs(t)) {
            Grant::Lease(l) => {
                assert_eq!(
                    s.complete(l.lease_id, W2, &sha(l.range), secs(t)),
                    Completion::Accepted(l.range)
                );
                done.insert(l.range);
            }
            Grant::Finished => break,
            other => panic!("{other:?}"),
        }
    }
    assert!(s.is_finished());
    assert!(hoarded.iter().all(|l| done.contains(&l.range)));
}

mod interleavings;

#[test]
fn a_sampled_units_verdict_keeps_an_agreeing_result_and_names_the_odd_one() {
    let w = |i: u64| (WorkerId(i), Identity(10 + i));
    let same = |groups: [u8; 3]| move |i: usize, j: usize| groups[i] == groups[j];
    assert_eq!(
        Verdict::of(&[w(1), w(2)], same([0, 0, 9])),
        Verdict::Agree { keep: Identity(11) }
    );
    assert_eq!(
        Verdict::of(&[w(1), w(2)], same([0, 1, 9])),
        Verdict::Disagree
    );
    assert_eq!(
        Verdict::of(&[w(1), w(2), w(3)], same([0, 1, 0])),
        Verdict::Odd {
            keep: Identity(11),
            odd: Identity(12)
        }
    );
    assert_eq!(
        Verdict::of(&[w(1), w(2), w(3)], same([0, 1, 1])),
        Verdict::Odd {
            keep: Identity(12),
            odd: Identity(11)
        }
    );
    assert!(matches!(
        Verdict::of(&[w(1), w(2), w(3)], same([0, 1, 2])),
        Verdict::NoAgreement(why) if why.contains("all differ")
    ));
    assert!(matches!(
        Verdict::of(&[w(1)], same([0, 0, 0])),
        Verdict::NoAgreement(_)
    ));
}
