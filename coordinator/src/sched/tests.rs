//! The scheduler in simulated time: virtual workers that answer after a
//! delay, a blackhole worker that never answers, and late duplicates.

use super::*;

const W1: WorkerId = WorkerId(1);
const W2: WorkerId = WorkerId(2);
const W3: WorkerId = WorkerId(3);

fn cfg() -> SchedConfig {
    SchedConfig {
        lease_timeout: Duration::from_secs(10),
        heartbeat_timeout: Duration::from_secs(3),
        max_attempts: 3,
        idle_poll: Duration::from_millis(100),
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

/// Virtual workers that finish each lease after `work` seconds; returns the
/// accepted ranges in acceptance order.
fn simulate(
    s: &mut Scheduler,
    workers: &[WorkerId],
    blackhole: Option<WorkerId>,
    work: u64,
) -> Vec<ChunkRange> {
    let mut accepted = Vec::new();
    let mut running: BTreeMap<WorkerId, (LeaseGrant, Duration)> = BTreeMap::new();
    for &w in workers {
        s.register(w, Duration::ZERO);
    }
    for t in 0..1000u64 {
        let now = secs(t);
        s.tick(now);
        for &w in workers {
            if Some(w) == blackhole {
                // Never finishes; keeps sending heartbeats so only the lease deadline catches it.
                if let std::collections::btree_map::Entry::Vacant(slot) = running.entry(w) {
                    if let Grant::Lease(l) = s.request(w, now) {
                        slot.insert((l, Duration::MAX));
                    }
                }
                let _ = s.heartbeat(w, now);
                continue;
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
    let mut s = Scheduler::new(cfg(), units.clone(), &BTreeMap::new());
    let mut got = simulate(&mut s, &[W1, W2, W3], None, 2);
    got.sort();
    assert_eq!(got, units);
    assert!(s.is_finished());
    assert_eq!(s.progress().retries, 0);
    assert_eq!(s.request(W1, secs(999)), Grant::Finished);
}

#[test]
fn blackhole_worker_lease_expires_and_is_retried_elsewhere() {
    let units = plan(6, 2);
    let mut s = Scheduler::new(cfg(), units.clone(), &BTreeMap::new());
    let mut got = simulate(&mut s, &[W1, W2], Some(W1), 1);
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
    let mut s = Scheduler::new(cfg(), units, &BTreeMap::new());
    s.register(W1, secs(0));
    s.register(W2, secs(0));
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
    s.register(W3, secs(10));
    assert_eq!(lease(s.request(W3, secs(10))).range, l1.range);
}

#[test]
fn silent_worker_is_dropped_and_its_lease_requeued() {
    let mut s = Scheduler::new(cfg(), plan(2, 2), &BTreeMap::new());
    s.register(W1, secs(0));
    let l = lease(s.request(W1, secs(0)));
    assert_eq!(s.tick(secs(3)), vec![Event::WorkerSilent(W1)]);
    assert_eq!(s.progress().retries, 1);
    s.register(W2, secs(3));
    assert_eq!(lease(s.request(W2, secs(3))).range, l.range);
    // The dropped worker is unknown now.
    assert_eq!(s.heartbeat(W1, secs(4)), Err(SchedError::UnknownWorker(W1)));
}

#[test]
fn disconnect_requeues_and_retries_are_bounded_with_a_clear_failure() {
    let mut s = Scheduler::new(cfg(), plan(4, 4), &BTreeMap::new());
    for i in 0..3 {
        let w = WorkerId(10 + i);
        s.register(w, secs(i));
        let l = lease(s.request(w, secs(i)));
        assert_eq!(l.range, ChunkRange { start: 0, end: 4 });
        s.disconnect(w, "connection lost: killed");
    }
    let err = s.failure().cloned().expect("the run failed");
    assert_eq!(
        err.to_string(),
        "chunks 0..4 failed 3 times (limit 3); last: connection lost: killed"
    );
    s.register(W1, secs(5));
    assert_eq!(s.request(W1, secs(5)), Grant::Failed(err));
}

#[test]
fn late_result_of_expired_lease_is_accepted_once_and_the_retry_is_a_duplicate() {
    let mut s = Scheduler::new(cfg(), plan(2, 2), &BTreeMap::new());
    s.register(W1, secs(0));
    s.register(W2, secs(0));
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
    let mut s = Scheduler::new(cfg(), plan(1, 1), &BTreeMap::new());
    s.register(W1, secs(0));
    s.register(W2, secs(0));
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
    let mut s = Scheduler::new(cfg(), plan(2, 1), &BTreeMap::new());
    s.register(W1, secs(0));
    s.register(W2, secs(0));
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
    s.register(W1, secs(0));
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
