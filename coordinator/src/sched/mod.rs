//! The lease state machine: which chunk ranges are pending, leased, done or
//! failed, and which workers are alive. No sockets and no clock: every call
//! takes the current time, so tests drive it in simulated time.
//!
//! The work is a fixed list of *units* (chunk ranges of the lease plan). A
//! unit is granted as a lease with a deadline; a lease that expires, or whose
//! worker stops sending heartbeats or disconnects, sends its unit back to the
//! queue and counts one attempt. A unit that used up its attempts fails the
//! run with an error naming it. The first result for a unit is accepted, once;
//! any later one (a duplicate or a late result of an expired lease) is only
//! compared with the kept result's hash.

use common::wire::{LeaseGrant, LeaseId, WorkerId};
use common::ChunkRange;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

#[cfg(test)]
mod tests;

/// Timeouts and limits of the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// A lease not finished this long after its grant goes back to the queue.
    pub lease_timeout: Duration,
    /// A worker silent this long is considered gone.
    pub heartbeat_timeout: Duration,
    /// Attempts per unit before the run fails.
    pub max_attempts: u32,
    /// How long an idle worker waits before polling again.
    pub idle_poll: Duration,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            lease_timeout: Duration::from_secs(3600),
            heartbeat_timeout: Duration::from_secs(30),
            max_attempts: 3,
            idle_poll: Duration::from_millis(500),
        }
    }
}

/// Why the run cannot finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// A unit used up its attempts.
    #[error("chunks {range} failed {attempts} times (limit {max_attempts}); last: {last}")]
    UnitFailed {
        /// The chunks.
        range: ChunkRange,
        /// Attempts made.
        attempts: u32,
        /// The limit.
        max_attempts: u32,
        /// The last failure.
        last: String,
    },
    /// A worker id the scheduler does not know (never registered or gone).
    #[error("{0} is not registered")]
    UnknownWorker(WorkerId),
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum UnitState {
    Pending,
    Leased(LeaseId),
    Done { sha256: String },
}

#[derive(Clone, Debug)]
struct Unit {
    range: ChunkRange,
    state: UnitState,
    attempts: u32,
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
    next_lease: u64,
    failed: Option<SchedError>,
    progress: Progress,
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
                attempts: 0,
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
            },
        );
    }

    /// A heartbeat (any message) from a worker.
    pub fn heartbeat(&mut self, worker: WorkerId, now: Duration) -> Result<(), SchedError> {
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
        }
        let Some(unit) = self.next_pending() else {
            return Grant::Wait(self.cfg.idle_poll);
        };
        let lease_id = LeaseId(self.next_lease);
        self.next_lease += 1;
        self.units[unit].state = UnitState::Leased(lease_id);
        self.units[unit].attempts += 1;
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

    fn next_pending(&mut self) -> Option<usize> {
        while let Some(unit) = self.queue.pop_front() {
            if self.units[unit].state == UnitState::Pending {
                return Some(unit);
            }
        }
        None
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
        let _ = self.heartbeat(worker, now);
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

    /// A worker reports it could not finish a lease.
    pub fn fail(&mut self, lease: LeaseId, worker: WorkerId, reason: &str, now: Duration) {
        let _ = self.heartbeat(worker, now);
        if self.leases.get(&lease).is_some_and(|l| l.worker == worker) {
            self.retire(lease, reason);
        }
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
            self.retire(lease, "the lease passed its deadline");
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

    /// Takes a live lease away from its worker: the unit goes back to the
    /// front of the queue, or fails the run when out of attempts. A late
    /// result for it is still matched through `retired`.
    fn retire(&mut self, lease: LeaseId, reason: &str) {
        let Some(l) = self.leases.remove(&lease) else {
            return;
        };
        self.retired.insert(lease, (l.unit, l.worker));
        if let Some(w) = self.workers.get_mut(&l.worker) {
            if w.lease == Some(lease) {
                w.lease = None;
            }
        }
        let u = &mut self.units[l.unit];
        if u.state != UnitState::Leased(lease) {
            return;
        }
        self.progress.retries += 1;
        if u.attempts >= self.cfg.max_attempts {
            u.state = UnitState::Pending;
            self.failed.get_or_insert(SchedError::UnitFailed {
                range: u.range,
                attempts: u.attempts,
                max_attempts: self.cfg.max_attempts,
                last: reason.to_string(),
            });
        } else {
            u.state = UnitState::Pending;
            self.queue.push_front(l.unit);
        }
    }
}
