//! The lease state machine: which chunk ranges are pending, leased, done or
//! failed, and which workers are alive. No sockets and no clock: every call
//! takes the current time, so tests drive it in simulated time. It depends
//! on the numbers and the protocol's ids only: no storage, no tokio.
//!
//! The work is a fixed list of *units* (chunk ranges of the lease plan). A
//! unit is granted as a lease with a deadline; a lease that fails, expires,
//! or whose worker stops sending heartbeats or disconnects, sends its unit
//! back to the queue, marked as failed on that worker. The first result for a
//! unit is accepted, once; any later one (a duplicate or a late result of an
//! expired lease) is only compared with the kept result's hash.
//!
//! A worker is known by two ids: its connection ([`WorkerId`], fresh for
//! every connection) holds leases and heartbeats; its [`Identity`] (the
//! name its join proof is bound to, the same across reconnects) is what
//! failures, quarantine and redundancy count, so a worker that reconnects
//! is still the same worker.
//!
//! Failures are counted per identity as well as per unit, so one bad node
//! cannot fail the run: a failed unit goes to an identity that has not
//! failed it (the same one only when no other healthy identity could take
//! it); an identity with [`SchedConfig::max_worker_failures`] failures in a
//! row (a failed report, a bad result, an expired lease, a connection lost
//! while it held a lease) is quarantined for [`SchedConfig::quarantine`]
//! (no leases, its results ignored, its reconnects refused); the run fails
//! only when a unit failed on [`SchedConfig::max_attempts`] distinct
//! identities, or when quarantine left no healthy worker for
//! [`SchedConfig::no_worker_grace`].
//!
//! Checkpoints: a worker adds the leases it computes into one running
//! result and ships it later, covering several leases. A lease it reports
//! computed ([`Scheduler::computed`]) is *held*: not done, but no longer
//! what the worker is working on, so it may take the next one. Held leases
//! are done only when a result covering them is accepted
//! ([`Scheduler::complete_set`]), all at once or none: a result that covers
//! a unit already done (a late checkpoint of a worker presumed lost, whose
//! units were recomputed elsewhere) is refused whole ([`Completion::Stale`])
//! and its other units go back to the queue, so no lease is ever counted
//! twice. A worker lost with held leases loses them all to the queue (one
//! failure of its identity, not one per lease).
//!
//! Redundancy: a sample of units ([`sampled`], salted with a secret of the
//! coordinator so workers cannot tell which units are checked) needs
//! results from two distinct identities. The caller compares them (the
//! scheduler sees hashes only) and settles the unit with a [`Verdict`]; a
//! disagreement asks a third identity, and the odd one out is quarantined.
//! When no third identity is there for [`SchedConfig::disagreement_wait`],
//! the unit is decided without it ([`Event::Unresolved`]): the run never
//! waits for a worker that may not come.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use numbers::ChunkRange;
use protocol::wire::{LeaseGrant, LeaseId, WorkerId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
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
    /// Fraction of units (a sample salted by [`SchedConfig::sample_salt`])
    /// also computed by a second identity and compared; 0 turns redundancy off.
    pub verify_fraction: f64,
    /// The coordinator's secret salt of the redundancy sample.
    pub sample_salt: SampleSalt,
    /// How long a quarantine for failures lasts (a worker whose result
    /// two others contradicted stays out for the run).
    pub quarantine: Duration,
    /// How long a disagreement waits for a third identity before it is
    /// decided without one.
    pub disagreement_wait: Duration,
    /// How long the run goes on with every worker quarantined (waiting for
    /// a healthy one to join) before it fails.
    pub no_worker_grace: Duration,
}

/// The secret salt of the redundancy sample: kept by the coordinator (with
/// its identity, never under the run location workers read), so a worker
/// cannot tell a checked lease from an unchecked one, and the same across
/// restarts, so a resumed run samples the same units.
#[derive(Clone, PartialEq, Eq)]
pub struct SampleSalt([u8; 32]);

impl SampleSalt {
    /// A salt of these bytes.
    pub fn new(bytes: [u8; 32]) -> SampleSalt {
        SampleSalt(bytes)
    }

    /// A fresh random salt.
    pub fn random() -> SampleSalt {
        let mut b = [0u8; 32];
        b.copy_from_slice(&protocol::wire::random_bytes(32));
        SampleSalt(b)
    }
}

impl Default for SampleSalt {
    /// A random salt: an unknown one is the safe default.
    fn default() -> Self {
        SampleSalt::random()
    }
}

impl fmt::Debug for SampleSalt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SampleSalt(<redacted>)")
    }
}

/// Who a worker is across its connections (numbered by the caller, one per
/// name its join proof is bound to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Identity(pub u64);

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "identity#{}", self.0)
    }
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
            sample_salt: SampleSalt::default(),
            quarantine: Duration::from_secs(3600),
            disagreement_wait: Duration::from_secs(30),
            no_worker_grace: Duration::from_secs(60),
        }
    }
}

/// Why the run cannot finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// A unit failed on too many distinct identities.
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
    /// Every connected worker was quarantined, for longer than the grace period.
    #[error("no healthy worker remains: {worker} was quarantined after {why}")]
    NoHealthyWorker {
        /// The last identity quarantined.
        worker: Identity,
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
    /// First result for every unit of a set of several leases (a
    /// checkpoint): the caller merges and stores it, once.
    AcceptedSet(Vec<ChunkRange>),
    /// A result for several leases that cannot be accepted whole (a unit
    /// is already done, or is sampled for redundancy and must come alone):
    /// dropped; its units that were not done go back to the queue.
    Stale(Vec<ChunkRange>),
}

/// The caller's verdict on the results of a unit sampled for redundancy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The results agree; `keep`'s is accepted.
    Agree {
        /// The identity whose result is kept.
        keep: Identity,
    },
    /// Two results disagree: a third identity decides.
    Disagree,
    /// Of three results, two agree: `keep`'s is accepted and `odd` is quarantined.
    Odd {
        /// An identity of the agreeing pair.
        keep: Identity,
        /// The identity that disagreed.
        odd: Identity,
    },
    /// No two results agree: the run fails.
    NoAgreement(String),
}

impl Verdict {
    /// The verdict on the results of one sampled unit, made by `workers`
    /// (connection and identity, in arrival order), where `agree(i, j)`
    /// says whether results `i` and `j` agree: two that agree settle it (the
    /// first is kept), two that disagree ask a third; of three, the one that
    /// agrees with neither other is the odd one (and with no agreeing pair
    /// the run fails).
    pub fn of(
        workers: &[(WorkerId, Identity)],
        mut agree: impl FnMut(usize, usize) -> bool,
    ) -> Verdict {
        match workers {
            [(_, a), _] => match agree(0, 1) {
                true => Verdict::Agree { keep: *a },
                false => Verdict::Disagree,
            },
            [(wa, a), (wb, b), (wc, _)] => {
                if agree(0, 2) {
                    Verdict::Odd { keep: *a, odd: *b }
                } else if agree(1, 2) {
                    Verdict::Odd { keep: *b, odd: *a }
                } else {
                    Verdict::NoAgreement(format!("{wa}, {wb} and {wc} all differ"))
                }
            }
            _ => Verdict::NoAgreement(format!("{} results", workers.len())),
        }
    }
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
        /// The identity.
        worker: Identity,
        /// Its failures and the last one.
        why: String,
    },
    /// A quarantine for failures ran out: the identity may join again.
    Released(Identity),
    /// Two results of a sampled unit disagreed and no third identity came
    /// within the wait: `kept`'s result is accepted unverified (the one
    /// whose results agreed with others more often, else the first).
    Unresolved {
        /// The chunks.
        range: ChunkRange,
        /// The identity whose result is kept.
        kept: Identity,
        /// The identity whose result is discarded.
        other: Identity,
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
    /// Identities this unit failed on (a failed report, a bad result, an
    /// expired lease, a lost connection).
    failed_on: BTreeSet<Identity>,
    /// Results of a unit sampled for redundancy: (identity, hash).
    opinions: Vec<(Identity, String)>,
    /// Results needed before the unit is decided: 1; 2 when sampled, 3
    /// after a disagreement.
    needed: usize,
    /// Since when a disagreement waits with no third identity available.
    waiting_since: Option<Duration>,
}

#[derive(Clone, Debug)]
struct Lease {
    unit: usize,
    worker: WorkerId,
    identity: Identity,
    deadline: Duration,
}

/// A connection.
#[derive(Clone, Debug)]
struct Worker {
    identity: Identity,
    last_seen: Duration,
    /// The lease it is computing.
    lease: Option<LeaseId>,
    /// Leases it computed and holds for its next checkpoint.
    held: BTreeSet<LeaseId>,
}

/// What the scheduler knows of an identity across its connections.
#[derive(Clone, Debug, Default)]
struct Standing {
    /// Failures since its last accepted result.
    failures_in_a_row: u32,
    /// Sampled units where its result agreed with another identity's.
    agreed: u32,
    /// Why it is quarantined, and until when (`None`: for the run).
    quarantine: Option<(String, Option<Duration>)>,
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
    /// Disagreements decided without a third identity ([`Event::Unresolved`]).
    pub unresolved: usize,
}

/// The lease state machine.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    units: Vec<Unit>,
    queue: VecDeque<usize>,
    leases: BTreeMap<LeaseId, Lease>,
    retired: BTreeMap<LeaseId, (usize, WorkerId, Identity)>,
    workers: BTreeMap<WorkerId, Worker>,
    /// Every identity seen (kept after its connections end).
    identities: BTreeMap<Identity, Standing>,
    /// The last quarantine (for the failure when no healthy worker joins).
    last_quarantine: Option<(Identity, String)>,
    /// Since when every connected worker is quarantined.
    unhealthy_since: Option<Duration>,
    /// The latest time a call gave (quarantines are timed from it).
    now: Duration,
    next_lease: u64,
    failed: Option<SchedError>,
    progress: Progress,
}

/// Whether a unit is in the redundancy sample of `fraction` under `salt`:
/// HMAC-SHA256 of the unit's first chunk, keyed by the salt, as a fraction
/// of 2^64. The same units for the same salt (a resumed run); unknown
/// ones to whoever lacks the salt.
pub fn sampled(range: ChunkRange, fraction: f64, salt: &SampleSalt) -> bool {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &salt.0);
    let tag = ring::hmac::sign(&key, &range.start.to_be_bytes());
    let mut x = [0u8; 8];
    x.copy_from_slice(&tag.as_ref()[..8]);
    ((u64::from_be_bytes(x) >> 11) as f64) < fraction * (1u64 << 53) as f64
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
                needed: if sampled(range, cfg.verify_fraction, &cfg.sample_salt) {
                    2
                } else {
                    1
                },
                waiting_since: None,
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
            identities: BTreeMap::new(),
            last_quarantine: None,
            unhealthy_since: None,
            now: Duration::ZERO,
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

    /// Chunks (the items units cover: chunks, prompts) done and in the
    /// plan, for progress counted in them rather than in units.
    pub fn chunks_done(&self) -> (u64, u64) {
        let len = |u: &Unit| u64::from(u.range.end - u.range.start);
        let done = self
            .units
            .iter()
            .filter(|u| matches!(u.state, UnitState::Done { .. }))
            .map(len)
            .sum();
        (done, self.units.iter().map(len).sum())
    }

    /// True when every unit is done.
    pub fn is_finished(&self) -> bool {
        self.progress.done == self.units.len()
    }

    /// The failure that ended the run, if any.
    pub fn failure(&self) -> Option<&SchedError> {
        self.failed.as_ref()
    }

    /// A connection of `identity` proved the join secret.
    pub fn register(&mut self, worker: WorkerId, identity: Identity, now: Duration) {
        self.now = self.now.max(now);
        self.identities.entry(identity).or_default();
        self.workers.insert(
            worker,
            Worker {
                identity,
                last_seen: now,
                lease: None,
                held: BTreeSet::new(),
            },
        );
    }

    /// Every identity quarantined now: why, and for how much longer from
    /// the latest time a call gave (`None`: for the run). A later phase of
    /// the run keeps them out too.
    pub fn quarantines(&self) -> Vec<(Identity, String, Option<Duration>)> {
        self.identities
            .iter()
            .filter_map(|(i, s)| {
                let (why, until) = s.quarantine.as_ref()?;
                let left = until.map(|u| u.saturating_sub(self.now));
                Some((*i, why.clone(), left))
            })
            .collect()
    }

    /// Why an identity is quarantined, or `None` when it is not.
    pub fn quarantine_reason(&self, identity: Identity) -> Option<&str> {
        let standing = self.identities.get(&identity)?;
        standing.quarantine.as_ref().map(|(why, _)| why.as_str())
    }

    /// The identity of a connection.
    pub fn identity_of(&self, worker: WorkerId) -> Option<Identity> {
        self.workers.get(&worker).map(|w| w.identity)
    }

    /// A heartbeat (any message) from a worker.
    pub fn heartbeat(&mut self, worker: WorkerId, now: Duration) -> Result<(), SchedError> {
        self.now = self.now.max(now);
        let w = self
            .workers
            .get_mut(&worker)
            .ok_or(SchedError::UnknownWorker(worker))?;
        w.last_seen = now;
        let identity = w.identity;
        if let Some(why) = self.quarantine_reason(identity) {
            return Err(SchedError::Quarantined {
                worker,
                why: why.to_string(),
            });
        }
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
            self.retire(old, "the worker polled for new work without a result", true);
            if let Err(e) = self.heartbeat(worker, now) {
                return Grant::Failed(e);
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
        let identity = self.workers[&worker].identity;
        self.leases.insert(
            lease_id,
            Lease {
                unit,
                worker,
                identity,
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

    /// The first queued unit `worker` may take: one its identity has not
    /// failed nor given its result for, or a failed one that no other
    /// healthy identity could take either (an identity that gave its result
    /// for the unit cannot: without that, a sampled unit whose one result
    /// came from A and which failed on every other identity waited forever).
    fn next_unit_for(&mut self, worker: WorkerId) -> Option<usize> {
        let me = self.workers.get(&worker)?.identity;
        let healthy: BTreeSet<Identity> = self.healthy().collect();
        // Entries of units finished meanwhile (a late result) are skipped.
        let pos = self.queue.iter().position(|&u| {
            let unit = &self.units[u];
            let failed = &unit.failed_on;
            let gave = |i: &Identity| unit.opinions.iter().any(|(o, _)| o == i);
            unit.state == UnitState::Pending
                && !gave(&me)
                && (!failed.contains(&me)
                    || healthy
                        .iter()
                        .all(|i| *i == me || failed.contains(i) || gave(i)))
        })?;
        self.queue.remove(pos)
    }

    /// Identities with a connection that are not quarantined.
    fn healthy(&self) -> impl Iterator<Item = Identity> + '_ {
        self.workers
            .values()
            .map(|w| w.identity)
            .filter(|i| self.quarantine_reason(*i).is_none())
    }

    /// The chunks of a lease this worker holds or held.
    pub fn lease_range(&self, lease: LeaseId, worker: WorkerId) -> Option<ChunkRange> {
        self.lease_of(lease, worker)
            .map(|(unit, _)| self.units[unit].range)
    }

    /// The unit and identity of `lease` when `worker` holds or held it.
    fn lease_of(&self, lease: LeaseId, worker: WorkerId) -> Option<(usize, Identity)> {
        match (self.leases.get(&lease), self.retired.get(&lease)) {
            (Some(l), _) if l.worker == worker => Some((l.unit, l.identity)),
            (_, Some(&(unit, w, identity))) if w == worker => Some((unit, identity)),
            _ => None,
        }
    }

    /// The chunks of each of `leases`, which this worker holds or held; `None`
    /// when one is not, or one is named twice.
    pub fn lease_ranges(&self, leases: &[LeaseId], worker: WorkerId) -> Option<Vec<ChunkRange>> {
        let distinct: BTreeSet<&LeaseId> = leases.iter().collect();
        if distinct.len() != leases.len() {
            return None;
        }
        leases
            .iter()
            .map(|&l| self.lease_range(l, worker))
            .collect()
    }

    /// A worker computed its lease and holds it for its next checkpoint:
    /// the lease stays live (not done) with a fresh deadline, and the
    /// worker may take another one. False when the worker is not computing
    /// that lease (it expired, or was never its).
    pub fn computed(&mut self, lease: LeaseId, worker: WorkerId, now: Duration) -> bool {
        if self.heartbeat(worker, now).is_err() {
            return false;
        }
        let Some(w) = self.workers.get_mut(&worker) else {
            return false;
        };
        let Some(l) = self.leases.get_mut(&lease) else {
            return false;
        };
        if w.lease != Some(lease) || l.worker != worker {
            return false;
        }
        w.lease = None;
        w.held.insert(lease);
        l.deadline = now + self.cfg.lease_timeout;
        true
    }

    /// A worker reports one result covering several leases (a checkpoint),
    /// already checked to cover exactly their chunks and hashing to
    /// `sha256`: accepted for all of them at once ([`Completion::AcceptedSet`]),
    /// or refused whole ([`Completion::Stale`], see the module doc). One
    /// lease is [`Scheduler::complete`].
    pub fn complete_set(
        &mut self,
        leases: &[LeaseId],
        worker: WorkerId,
        sha256: &str,
        now: Duration,
    ) -> Completion {
        if let [lease] = leases {
            return self.complete(*lease, worker, sha256, now);
        }
        let Some(ranges) = self.lease_ranges(leases, worker).filter(|r| !r.is_empty()) else {
            return Completion::Unknown;
        };
        if let Err(SchedError::Quarantined { .. }) = self.heartbeat(worker, now) {
            return Completion::Unknown;
        }
        let mut taken = Vec::with_capacity(leases.len());
        for &lease in leases {
            let Some((unit, identity)) = self.lease_of(lease, worker) else {
                return Completion::Unknown;
            };
            if self.quarantine_reason(identity).is_some() {
                return Completion::Unknown;
            }
            taken.push((lease, unit, identity));
        }
        for &(lease, _, identity) in &taken {
            self.take(lease, worker, identity);
        }
        let whole = taken.iter().all(|t| {
            let u = &self.units[t.1];
            u.needed == 1 && matches!(u.state, UnitState::Pending | UnitState::Leased(_))
        });
        if !whole {
            self.progress.duplicates += 1;
            for &(lease, unit, _) in &taken {
                if self.units[unit].state == UnitState::Leased(lease) {
                    self.units[unit].state = UnitState::Pending;
                    self.queue.push_front(unit);
                }
            }
            return Completion::Stale(ranges);
        }
        for &(_, unit, _) in &taken {
            self.units[unit].state = UnitState::Done {
                sha256: sha256.to_string(),
            };
        }
        self.progress.done += taken.len();
        self.progress.accepted += taken.len();
        Completion::AcceptedSet(ranges)
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
        if let Err(SchedError::Quarantined { .. }) = self.heartbeat(worker, now) {
            return Completion::Unknown;
        }
        let (unit, identity) = match (self.leases.get(&lease), self.retired.get(&lease)) {
            (Some(l), _) if l.worker == worker => (l.unit, l.identity),
            (_, Some(&(unit, w, i))) if w == worker => (unit, i),
            _ => return Completion::Unknown,
        };
        if self.quarantine_reason(identity).is_some() {
            return Completion::Unknown;
        }
        self.take(lease, worker, identity);
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
                if u.opinions.iter().any(|(i, _)| *i == identity) {
                    return Completion::Unknown;
                }
                u.opinions.push((identity, sha256.to_string()));
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

    /// Takes a reported lease off the books (live, held or retired): its
    /// result came, so its identity's failures in a row end.
    fn take(&mut self, lease: LeaseId, worker: WorkerId, identity: Identity) {
        self.leases.remove(&lease);
        self.retired.remove(&lease);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.held.remove(&lease);
            if w.lease == Some(lease) {
                w.lease = None;
            }
        }
        if let Some(standing) = self.identities.get_mut(&identity) {
            standing.failures_in_a_row = 0;
        }
    }

    /// Settles a unit that returned [`Completion::Decide`] at `now`.
    /// Returns the quarantine of the odd identity, if any.
    pub fn settle(&mut self, range: ChunkRange, verdict: Verdict, now: Duration) -> Option<Event> {
        self.now = self.now.max(now);
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
                u.waiting_since = Some(now);
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
        let odd = match verdict {
            Verdict::Odd { odd, .. } => Some(odd),
            _ => None,
        };
        for (i, _) in &u.opinions {
            if Some(*i) != odd {
                self.identities.entry(*i).or_default().agreed += 1;
            }
        }
        self.finish_unit(unit, keep);
        self.progress.verified += 1;
        let why = format!("its result for chunks {range} disagreed with two other workers'");
        odd.and_then(|odd| self.quarantine(odd, why, None))
    }

    /// Marks a sampled unit done with `keep`'s result.
    fn finish_unit(&mut self, unit: usize, keep: Identity) {
        let u = &mut self.units[unit];
        let sha256 = u
            .opinions
            .iter()
            .find(|(i, _)| *i == keep)
            .map(|(_, h)| h.clone())
            .unwrap_or_default();
        u.state = UnitState::Done { sha256 };
        u.waiting_since = None;
        self.progress.done += 1;
        self.progress.accepted += 1;
    }

    /// Decides the disagreements that waited past
    /// [`SchedConfig::disagreement_wait`] with no third identity available
    /// (a healthy connected one without a result for the unit): the result
    /// of the identity that agreed with others more often is kept, else the
    /// first one.
    fn decide_waiting(&mut self, now: Duration) -> Vec<Event> {
        let healthy: BTreeSet<Identity> = self.healthy().collect();
        let agreed: BTreeMap<Identity, u32> = self
            .identities
            .iter()
            .map(|(i, s)| (*i, s.agreed))
            .collect();
        let mut events = Vec::new();
        for unit in 0..self.units.len() {
            let u = &mut self.units[unit];
            let Some(since) = u.waiting_since else {
                continue;
            };
            if u.state != UnitState::Pending {
                continue;
            }
            if healthy
                .iter()
                .any(|i| u.opinions.iter().all(|(o, _)| o != i))
            {
                // A third identity could take it: keep waiting for it.
                u.waiting_since = Some(now);
                continue;
            }
            if now < since + self.cfg.disagreement_wait {
                continue;
            }
            // Of equals, the first result (`max_by_key` keeps the last).
            let Some(&(kept, _)) = u
                .opinions
                .iter()
                .rev()
                .max_by_key(|(i, _)| agreed.get(i).copied().unwrap_or(0))
            else {
                continue;
            };
            let other = u
                .opinions
                .iter()
                .map(|(i, _)| *i)
                .find(|i| *i != kept)
                .unwrap_or(kept);
            let range = u.range;
            self.finish_unit(unit, kept);
            self.progress.unresolved += 1;
            events.push(Event::Unresolved { range, kept, other });
        }
        events
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
        self.fail_set(&[lease], worker, reason, now)
    }

    /// [`Scheduler::fail`] for the leases of one result (a checkpoint that
    /// failed a check): their units go back to the queue, and the worker's
    /// failure is counted once.
    pub fn fail_set(
        &mut self,
        leases: &[LeaseId],
        worker: WorkerId,
        reason: &str,
        now: Duration,
    ) -> Option<Event> {
        let _ = self.heartbeat(worker, now);
        let live: Vec<LeaseId> = leases
            .iter()
            .copied()
            .filter(|l| self.leases.get(l).is_some_and(|l| l.worker == worker))
            .collect();
        self.retire_all(&live, reason)
    }

    /// Retires `leases`, counting one failure of their identity (at the first).
    fn retire_all(&mut self, leases: &[LeaseId], reason: &str) -> Option<Event> {
        let mut event = None;
        for (i, &lease) in leases.iter().enumerate() {
            event = event.or(self.retire(lease, reason, i == 0));
        }
        event
    }

    /// A worker's connection ended: the lease it was computing and those it
    /// held for its checkpoint go back to the queue (one failure of its
    /// identity).
    pub fn disconnect(&mut self, worker: WorkerId, reason: &str) {
        let leases: Vec<LeaseId> = self
            .workers
            .get(&worker)
            .map(|w| w.lease.iter().chain(&w.held).copied().collect())
            .unwrap_or_default();
        self.retire_all(&leases, reason);
        self.workers.remove(&worker);
    }

    /// Expires leases past their deadline and workers past the heartbeat
    /// timeout, ends quarantines that ran out, decides disagreements that
    /// waited too long for a third identity, and fails the run when
    /// quarantine left no healthy worker for the grace period.
    pub fn tick(&mut self, now: Duration) -> Vec<Event> {
        self.now = self.now.max(now);
        let mut events = self.release_expired(now);
        let expired: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        // Newest first: each goes to the queue's front, so the oldest is retried first.
        for lease in expired.into_iter().rev() {
            // An earlier expiry of this loop may have quarantined the
            // lease's worker, which retired its other leases already.
            let Some(l) = self.leases.get(&lease) else {
                continue;
            };
            events.push(Event::LeaseExpired {
                lease,
                range: self.units[l.unit].range,
                worker: l.worker,
            });
            events.extend(self.retire(lease, "the lease passed its deadline", true));
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
        events.extend(self.decide_waiting(now));
        self.check_health(now);
        events
    }

    /// Ends the quarantines for failures that ran out by `now` (also done
    /// by [`Scheduler::tick`]; called before a connection is checked).
    pub fn release_expired(&mut self, now: Duration) -> Vec<Event> {
        let mut events = Vec::new();
        for (&identity, standing) in &mut self.identities {
            if let Some((_, Some(until))) = &standing.quarantine {
                if *until <= now {
                    standing.quarantine = None;
                    standing.failures_in_a_row = 0;
                    events.push(Event::Released(identity));
                }
            }
        }
        events
    }

    /// Fails the run when, since a quarantine, no healthy worker has been
    /// connected for [`SchedConfig::no_worker_grace`].
    fn check_health(&mut self, now: Duration) {
        let Some((worker, why)) = self.last_quarantine.clone() else {
            return;
        };
        if self.is_finished() {
            return;
        }
        if self.healthy().next().is_some() {
            self.unhealthy_since = None;
            return;
        }
        let since = *self.unhealthy_since.get_or_insert(now);
        if now >= since + self.cfg.no_worker_grace {
            self.failed
                .get_or_insert(SchedError::NoHealthyWorker { worker, why });
        }
    }

    /// Takes a live lease away from its worker: the unit, marked as failed
    /// on that worker, goes back to the front of the queue, or fails the run
    /// when it failed on too many distinct workers; the worker's failure is
    /// counted when `count` (see [`Scheduler::count_failure`]). A late
    /// result for it is still matched through `retired`.
    fn retire(&mut self, lease: LeaseId, reason: &str, count: bool) -> Option<Event> {
        let l = self.leases.remove(&lease)?;
        self.retired.insert(lease, (l.unit, l.worker, l.identity));
        if let Some(w) = self.workers.get_mut(&l.worker) {
            w.held.remove(&lease);
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
        u.failed_on.insert(l.identity);
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
        if count {
            self.count_failure(l.identity, reason)
        } else {
            None
        }
    }

    /// One more failure in a row for an identity; at the limit it is
    /// quarantined for [`SchedConfig::quarantine`].
    fn count_failure(&mut self, identity: Identity, reason: &str) -> Option<Event> {
        let s = self.identities.entry(identity).or_default();
        s.failures_in_a_row += 1;
        if s.failures_in_a_row < self.cfg.max_worker_failures.max(1) || s.quarantine.is_some() {
            return None;
        }
        let why = format!("{} failures in a row; last: {reason}", s.failures_in_a_row);
        self.quarantine(identity, why, Some(self.cfg.quarantine))
    }

    /// Keeps `identity` out of the run (for `lasting`, else for the run):
    /// its connections' leases go back to the queue; when that leaves no
    /// healthy worker the run fails after the grace period ([`Scheduler::tick`]).
    fn quarantine(
        &mut self,
        identity: Identity,
        why: String,
        lasting: Option<Duration>,
    ) -> Option<Event> {
        if self.quarantine_reason(identity).is_some() {
            return None;
        }
        let until = lasting.map(|d| self.now + d);
        self.identities.entry(identity).or_default().quarantine = Some((why.clone(), until));
        self.progress.quarantined += 1;
        self.last_quarantine = Some((identity, why.clone()));
        let held: Vec<LeaseId> = self
            .workers
            .values()
            .filter(|w| w.identity == identity)
            .flat_map(|w| w.lease.iter().chain(&w.held).copied())
            .collect();
        for lease in held {
            self.retire(lease, "its worker was quarantined", true);
        }
        Some(Event::Quarantined {
            worker: identity,
            why,
        })
    }
}
