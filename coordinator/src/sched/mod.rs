//! The lease state machine: which chunk ranges are pending, leased, done or
//! failed, and which workers are alive. No sockets and no clock: every call
//! takes the current time, so tests drive it in simulated time.
//!
//! The work is a fixed list of *units* (chunk ranges of the lease plan). A
//! unit is granted as a lease with a deadline; a lease that fails, expires,
//! or whose worker stops sending heartbeats or disconnects, sends its unit
//! back to the queue, marked as failed on that worker. The first result for a
//! unit is accepted, once; any later one (a duplicate or a late result of an
//! expired lease) is only compared with the kept result's hash.
//!
//! Failures are counted per worker as well as per unit, so one bad node
//! cannot fail the run: a failed unit goes to a worker that has not failed it
//! (the same worker only when no other healthy worker could take it); a
//! worker with [`SchedConfig::max_worker_failures`] failures in a row is
//! quarantined (no more leases, its results ignored); the run fails only when
//! a unit failed on [`SchedConfig::max_attempts`] distinct workers or a
//! quarantine leaves no healthy worker.
//!
//! Redundancy: a deterministic sample of units ([`SchedConfig::verify_fraction`])
//! needs results from two distinct workers. The caller compares them (the
//! scheduler sees hashes only) and settles the unit with a [`Verdict`]; a
//! disagreement asks a third worker, and the odd one out is quarantined.

use common::wire::{LeaseGrant, LeaseId, WorkerId};
use common::ChunkRange;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

#[cfg(test)]
mod tests;

/// Timeouts and limits of the scheduler.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedConfig {
    /// A lease not finished this long after its grant goes back to the queue.
    pub lease_timeout: Duration,
    /// A worker silent this long is considered gone.
    pub heartbeat_timeout: Duration,
    /// Distinct workers a unit may fail on before the run fails.
    pub max_attempts: u32,
    /// Failures in a row after which a worker is quarantined.
    pub max_worker_failures: u32,
    /// How long an idle worker waits before polling again.
    pub idle_poll: Duration,
    /// Fraction of units (a deterministic sample) also computed by a second
    /// worker and compared; 0 turns redundancy off.
    pub verify_fraction: f64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            lease_timeout: Duration::from_secs(3600),
            heartbeat_timeout: Duration::from_secs(30),
            max_attempts: 3,
            max_worker_failures: 3,
            idle_poll: Duration::from_millis(500),
            verify_fraction: 0.0,
        }
    }
}

/// Why the run cannot finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// A unit failed on too many distinct workers.
    #[error(
        "chunks {range} failed on {workers} distinct workers (limit {max_attempts}); last: {last}"
    )]
    UnitFailed {
        /// The chunks.
        range: ChunkRange,
        /// Distinct workers it failed on.
        workers: u32,
        /// The limit.
        max_attempts: u32,
        /// The last failure.
        last: String,
    },
    /// Every registered worker is quarantined.
    #[error("no healthy worker remains: {worker} was quarantined after {why}")]
    NoHealthyWorker {
        /// The last worker quarantined.
        worker: WorkerId,
        /// Why it was.
        why: String,
    },
    /// A worker id the scheduler does not know (never registered or gone).
    #[error("{0} is not registered")]
    UnknownWorker(WorkerId),
    /// The worker is quarantined: it gets no more work in this run.
    #[error("{worker} is quarantined after {why}")]
    Quarantined {
        /// The worker.
        worker: WorkerId,
        /// Why.
        why: String,
    },
}

/// What an idle worker gets when it polls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// A lease to work on.
    Lease(LeaseGrant),
    /// Nothing now (everything is leased); poll again later.
    Wait(Duration),
    /// Every unit is done.
    Finished,
    /// The run failed.
    Failed(SchedError),
}

/// Outcome of a reported result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// First result for this unit: the caller merges and stores it, once.
    Accepted(ChunkRange),
    /// The unit was already done; `same` tells whether the hashes agree.
    Duplicate {
        /// The unit.
        range: ChunkRange,
        /// Whether the result is bitwise the kept one.
        same: bool,
    },
    /// No lease of that id was ever granted to this worker.
    Unknown,
    /// A result of a unit sampled for redundancy, kept by the caller until
    /// enough workers computed the unit; the unit goes to another worker.
    Opinion {
        /// The unit.
        range: ChunkRange,
        /// Results so far.
        have: usize,
        /// Results needed.
        needed: usize,
    },
    /// A sampled unit has all the results it needs: the caller compares
    /// them and calls [`Scheduler::settle`].
    Decide(ChunkRange),
}

/// The caller's verdict on the results of a unit sampled for redundancy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The results agree; `keep`'s is accepted.
    Agree {
        /// The worker whose result is kept.
        keep: WorkerId,
    },
    /// Two results disagree: a third worker decides.
    Disagree,
    /// Of three results, two agree: `keep`'s is accepted and `odd` is quarantined.
    Odd {
        /// A worker of the agreeing pair.
        keep: WorkerId,
        /// The worker that disagreed.
        odd: WorkerId,
    },
    /// No two results agree: the run fails.
    NoAgreement(String),
}

/// Something the scheduler did on its own, for logs and counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A lease passed its deadline.
    LeaseExpired {
        /// The lease.
        lease: LeaseId,
        /// Its chunks.
        range: ChunkRange,
        /// Its worker.
        worker: WorkerId,
    },
    /// A worker was silent past the heartbeat timeout.
    WorkerSilent(WorkerId),
    /// A worker failed too often in a row and gets no more work.
    Quarantined {
        /// The worker.
        worker: WorkerId,
        /// Its failures and the last one.
        why: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum UnitState {
    Pending,
    Leased(LeaseId),
    /// All results of a sampled unit are in; waiting for [`Scheduler::settle`].
    Deciding,
    Done {
        sha256: String,
    },
}

#[derive(Clone, Debug)]
struct Unit {
    range: ChunkRange,
    state: UnitState,
    /// Workers this unit failed on (a failed report, a bad result, an
    /// expired lease, a lost connection).
    failed_on: BTreeSet<WorkerId>,
    /// Results of a unit sampled for redundancy: (worker, hash).
    opinions: Vec<(WorkerId, String)>,
    /// Results needed before the unit is decided: 1; 2 when sampled, 3
    /// after a disagreement.
    needed: usize,
}

#[derive(Clone, Debug)]
struct Lease {
    unit: usize,
    worker: WorkerId,
    deadline: Duration,
}

#[derive(Clone, Debug)]
struct Worker {
    last_seen: Duration,
    lease: Option<LeaseId>,
    /// Failures since its last accepted result.
    failures_in_a_row: u32,
}

/// Progress counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Units in the plan.
    pub units: usize,
    /// Units done (including those resumed from storage).
    pub done: usize,
    /// Units done before this process started.
    pub resumed: usize,
    /// Leases live now.
    pub leased: usize,
    /// Results accepted in this process.
    pub accepted: usize,
    /// Leases that expired or lost their worker.
    pub retries: usize,
    /// Duplicate or late results dropped.
    pub duplicates: usize,
    /// Duplicate results whose bytes differed from the kept ones.
    pub mismatches: usize,
    /// Workers quarantined.
    pub quarantined: usize,
    /// Sampled units whose results agreed across workers.
    pub verified: usize,
    /// Sampled units whose first two results disagreed.
    pub disagreements: usize,
}

/// The lease state machine.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    units: Vec<Unit>,
    queue: VecDeque<usize>,
    leases: BTreeMap<LeaseId, Lease>,
    retired: BTreeMap<LeaseId, (usize, WorkerId)>,
    workers: BTreeMap<WorkerId, Worker>,
    /// Quarantined workers (kept after they disconnect) and why.
    quarantined: BTreeMap<WorkerId, String>,
    next_lease: u64,
    failed: Option<SchedError>,
    progress: Progress,
}

/// Whether a unit is in the deterministic redundancy sample of `fraction`
/// (the same units on every run and restart).
pub fn sampled(range: ChunkRange, fraction: f64) -> bool {
    let mut x = u64::from(range.start).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    ((x >> 11) as f64) < fraction * (1u64 << 53) as f64
}

/// Splits `0..n_chunks` into units of `lease_chunks` chunks (the last may be shorter).
pub fn plan(n_chunks: u32, lease_chunks: u32) -> Vec<ChunkRange> {
    let step = lease_chunks.max(1);
    (0..n_chunks)
        .step_by(step as usize)
        .map(|start| ChunkRange {
            start,
            end: start.saturating_add(step).min(n_chunks),
        })
        .collect()
}

impl Scheduler {
    /// A scheduler over `units`; those in `done` (with their partial hash) were
    /// finished by an earlier process and are not leased again.
    pub fn new(
        cfg: SchedConfig,
        units: Vec<ChunkRange>,
        done: &BTreeMap<ChunkRange, String>,
    ) -> Scheduler {
        let units: Vec<Unit> = units
            .into_iter()
            .map(|range| Unit {
                range,
                state: match done.get(&range) {
                    Some(sha) => UnitState::Done {
                        sha256: sha.clone(),
                    },
                    None => UnitState::Pending,
                },
                failed_on: BTreeSet::new(),
                opinions: Vec::new(),
                needed: if sampled(range, cfg.verify_fraction) {
                    2
                } else {
                    1
                },
            })
            .collect();
        let queue = (0..units.len())
            .filter(|&i| units[i].state == UnitState::Pending)
            .collect();
        let resumed = units.len()
            - units
                .iter()
                .filter(|u| u.state == UnitState::Pending)
                .count();
        Scheduler {
            progress: Progress {
                units: units.len(),
                done: resumed,
                resumed,
                ..Progress::default()
            },
            cfg,
            units,
            queue,
            leases: BTreeMap::new(),
            retired: BTreeMap::new(),
            workers: BTreeMap::new(),
            quarantined: BTreeMap::new(),
            next_lease: 1,
            failed: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Counters for progress reporting.
    pub fn progress(&self) -> Progress {
        Progress {
            leased: self.leases.len(),
            ..self.progress
        }
    }

    /// True when every unit is done.
    pub fn is_finished(&self) -> bool {
        self.progress.done == self.units.len()
    }

    /// The failure that ended the run, if any.
    pub fn failure(&self) -> Option<&SchedError> {
        self.failed.as_ref()
    }

    /// A worker proved the join secret.
    pub fn register(&mut self, worker: WorkerId, now: Duration) {
        self.workers.insert(
            worker,
            Worker {
                last_seen: now,
                lease: None,
                failures_in_a_row: 0,
            },
        );
    }

    /// Why a worker is quarantined, or `None` when it is not.
    pub fn quarantine_reason(&self, worker: WorkerId) -> Option<&str> {
        self.quarantined.get(&worker).map(String::as_str)
    }

    /// A heartbeat (any message) from a worker.
    pub fn heartbeat(&mut self, worker: WorkerId, now: Duration) -> Result<(), SchedError> {
        if let Some(why) = self.quarantined.get(&worker) {
            return Err(SchedError::Quarantined {
                worker,
                why: why.clone(),
            });
        }
        let w = self
            .workers
            .get_mut(&worker)
            .ok_or(SchedError::UnknownWorker(worker))?;
        w.last_seen = now;
        Ok(())
    }

    /// An idle worker asks for work.
    pub fn request(&mut self, worker: WorkerId, now: Duration) -> Grant {
        if let Err(e) = self.heartbeat(worker, now) {
            return Grant::Failed(e);
        }
        if let Some(e) = &self.failed {
            return Grant::Failed(e.clone());
        }
        if self.is_finished() {
            return Grant::Finished;
        }
        // An idle poll means the worker dropped whatever it held.
        if let Some(old) = self.workers[&worker].lease {
            self.retire(old, "the worker polled for new work without a result");
            if let Some(why) = self.quarantined.get(&worker) {
                return Grant::Failed(SchedError::Quarantined {
                    worker,
                    why: why.clone(),
                });
            }
        }
        if let Some(e) = &self.failed {
            return Grant::Failed(e.clone());
        }
        let Some(unit) = self.next_unit_for(worker) else {
            return Grant::Wait(self.cfg.idle_poll);
        };
        let lease_id = LeaseId(self.next_lease);
        self.next_lease += 1;
        self.units[unit].state = UnitState::Leased(lease_id);
        self.leases.insert(
            lease_id,
            Lease {
                unit,
                worker,
                deadline: now + self.cfg.lease_timeout,
            },
        );
        if let Some(w) = self.workers.get_mut(&worker) {
            w.lease = Some(lease_id);
        }
        Grant::Lease(LeaseGrant {
            lease_id,
            range: self.units[unit].range,
            deadline_ms: self.cfg.lease_timeout.as_millis() as u64,
        })
    }

    /// The first queued unit `worker` may take: one it has not failed, or
    /// one that no other healthy worker could take either.
    fn next_unit_for(&mut self, worker: WorkerId) -> Option<usize> {
        // Entries of units finished meanwhile (a late result) are skipped.
        let pos = self.queue.iter().position(|&u| {
            let unit = &self.units[u];
            let failed = &unit.failed_on;
            unit.state == UnitState::Pending
                && unit.opinions.iter().all(|(w, _)| *w != worker)
                && (!failed.contains(&worker)
                    || self.healthy().all(|w| w == worker || failed.contains(&w)))
        })?;
        self.queue.remove(pos)
    }

    /// Registered workers that are not quarantined.
    fn healthy(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.workers
            .keys()
            .copied()
            .filter(|w| !self.quarantined.contains_key(w))
    }

    /// The chunks of a lease this worker holds or held.
    pub fn lease_range(&self, lease: LeaseId, worker: WorkerId) -> Option<ChunkRange> {
        match (self.leases.get(&lease), self.retired.get(&lease)) {
            (Some(l), _) if l.worker == worker => Some(self.units[l.unit].range),
            (_, Some(&(unit, w))) if w == worker => Some(self.units[unit].range),
            _ => None,
        }
    }

    /// A worker reports a finished lease whose partial (already checked to
    /// cover exactly the lease's chunks) hashes to `sha256`. Late results of
    /// expired leases are accepted when their unit is not done yet.
    pub fn complete(
        &mut self,
        lease: LeaseId,
        worker: WorkerId,
        sha256: &str,
        now: Duration,
    ) -> Completion {
        if self.heartbeat(worker, now).is_err() && self.quarantined.contains_key(&worker) {
            return Completion::Unknown;
        }
        let unit = match (self.leases.get(&lease), self.retired.get(&lease)) {
            (Some(l), _) if l.worker == worker => l.unit,
            (_, Some(&(unit, w))) if w == worker => unit,
            _ => return Completion::Unknown,
        };
        self.leases.remove(&lease);
        self.retired.remove(&lease);
        if let Some(w) = self.workers.get_mut(&worker) {
            if w.lease == Some(lease) {
                w.lease = None;
            }
            w.failures_in_a_row = 0;
        }
        let u = &mut self.units[unit];
        match &u.state {
            UnitState::Done { sha256: kept } => {
                let same = kept == sha256;
                self.progress.duplicates += 1;
                self.progress.mismatches += usize::from(!same);
                Completion::Duplicate {
                    range: u.range,
                    same,
                }
            }
            _ if u.needed > 1 => {
                if u.opinions.iter().any(|(w, _)| *w == worker) {
                    return Completion::Unknown;
                }
                u.opinions.push((worker, sha256.to_string()));
                if u.opinions.len() < u.needed {
                    u.state = UnitState::Pending;
                    self.queue.push_front(unit);
                    Completion::Opinion {
                        range: u.range,
                        have: u.opinions.len(),
                        needed: u.needed,
                    }
                } else {
                    u.state = UnitState::Deciding;
                    Completion::Decide(u.range)
                }
            }
            _ => {
                u.state = UnitState::Done {
                    sha256: sha256.to_string(),
                };
                self.progress.done += 1;
                self.progress.accepted += 1;
                Completion::Accepted(u.range)
            }
        }
    }

    /// Settles a unit that returned [`Completion::Decide`]. Returns the
    /// quarantine of the odd worker, if any.
    pub fn settle(&mut self, range: ChunkRange, verdict: Verdict) -> Option<Event> {
        let unit = self.units.iter().position(|u| u.range == range)?;
        if self.units[unit].state != UnitState::Deciding {
            return None;
        }
        let u = &mut self.units[unit];
        let keep = match verdict {
            Verdict::Agree { keep } | Verdict::Odd { keep, .. } => keep,
            Verdict::Disagree => {
                u.needed = u.opinions.len() + 1;
                u.state = UnitState::Pending;
                self.queue.push_front(unit);
                self.progress.disagreements += 1;
                return None;
            }
            Verdict::NoAgreement(why) => {
                u.state = UnitState::Pending;
                self.failed.get_or_insert(SchedError::UnitFailed {
                    range,
                    workers: u.opinions.len() as u32,
                    max_attempts: self.cfg.max_attempts,
                    last: format!("no two results agree: {why}"),
                });
                return None;
            }
        };
        let sha256 = u
            .opinions
            .iter()
            .find(|(w, _)| *w == keep)
            .map(|(_, h)| h.clone())
            .unwrap_or_default();
        u.state = UnitState::Done { sha256 };
        self.progress.done += 1;
        self.progress.accepted += 1;
        self.progress.verified += 1;
        match verdict {
            Verdict::Odd { odd, .. } => self.quarantine(
                odd,
                format!("its result for chunks {range} disagreed with two other workers'"),
            ),
            _ => None,
        }
    }

    /// A worker reports it could not finish a lease, or its result failed a
    /// check: the unit goes back to the queue and the worker's failure is
    /// counted. Returns the quarantine event when this failure was one too many.
    pub fn fail(
        &mut self,
        lease: LeaseId,
        worker: WorkerId,
        reason: &str,
        now: Duration,
    ) -> Option<Event> {
        let _ = self.heartbeat(worker, now);
        if self.leases.get(&lease).is_some_and(|l| l.worker == worker) {
            return self.retire(lease, reason);
        }
        None
    }

    /// A worker's connection ended: its lease goes back to the queue.
    pub fn disconnect(&mut self, worker: WorkerId, reason: &str) {
        if let Some(w) = self.workers.remove(&worker) {
            if let Some(lease) = w.lease {
                self.retire(lease, reason);
            }
        }
    }

    /// Expires leases past their deadline and workers past the heartbeat timeout.
    pub fn tick(&mut self, now: Duration) -> Vec<Event> {
        let mut events = Vec::new();
        let expired: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        // Newest first: each goes to the queue's front, so the oldest is retried first.
        for lease in expired.into_iter().rev() {
            let l = &self.leases[&lease];
            events.push(Event::LeaseExpired {
                lease,
                range: self.units[l.unit].range,
                worker: l.worker,
            });
            events.extend(self.retire(lease, "the lease passed its deadline"));
        }
        let silent: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.last_seen + self.cfg.heartbeat_timeout <= now)
            .map(|(&id, _)| id)
            .collect();
        for worker in silent {
            events.push(Event::WorkerSilent(worker));
            self.disconnect(worker, "the worker stopped sending heartbeats");
        }
        events
    }

    /// Takes a live lease away from its worker: the unit, marked as failed
    /// on that worker, goes back to the front of the queue, or fails the run
    /// when it failed on too many distinct workers; the worker's failure is
    /// counted (see [`Scheduler::count_failure`]). A late result for it is
    /// still matched through `retired`.
    fn retire(&mut self, lease: LeaseId, reason: &str) -> Option<Event> {
        let l = self.leases.remove(&lease)?;
        self.retired.insert(lease, (l.unit, l.worker));
        if let Some(w) = self.workers.get_mut(&l.worker) {
            if w.lease == Some(lease) {
                w.lease = None;
            }
        }
        let u = &mut self.units[l.unit];
        if u.state != UnitState::Leased(lease) {
            return None;
        }
        self.progress.retries += 1;
        u.state = UnitState::Pending;
        u.failed_on.insert(l.worker);
        let distinct = u.failed_on.len() as u32;
        if distinct >= self.cfg.max_attempts {
            self.failed.get_or_insert(SchedError::UnitFailed {
                range: u.range,
                workers: distinct,
                max_attempts: self.cfg.max_attempts,
                last: reason.to_string(),
            });
        } else {
            self.queue.push_front(l.unit);
        }
        self.count_failure(l.worker, reason)
    }

    /// One more failure in a row for a registered worker; at the limit it is
    /// quarantined, and when that leaves no healthy worker the run fails.
    fn count_failure(&mut self, worker: WorkerId, reason: &str) -> Option<Event> {
        let w = self.workers.get_mut(&worker)?;
        w.failures_in_a_row += 1;
        if w.failures_in_a_row < self.cfg.max_worker_failures.max(1)
            || self.quarantined.contains_key(&worker)
        {
            return None;
        }
        let why = format!("{} failures in a row; last: {reason}", w.failures_in_a_row);
        self.quarantine(worker, why)
    }

    /// Keeps `worker` out of the run; when that leaves no healthy worker the
    /// run fails.
    fn quarantine(&mut self, worker: WorkerId, why: String) -> Option<Event> {
        if self.quarantined.contains_key(&worker) {
            return None;
        }
        self.quarantined.insert(worker, why.clone());
        self.progress.quarantined += 1;
        if let Some(lease) = self.workers.get(&worker).and_then(|w| w.lease) {
            self.retire(lease, "its worker was quarantined");
        }
        if self.healthy().next().is_none() {
            self.failed.get_or_insert(SchedError::NoHealthyWorker {
                worker,
                why: why.clone(),
            });
        }
        Some(Event::Quarantined { worker, why })
    }
}
