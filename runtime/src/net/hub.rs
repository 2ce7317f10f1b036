//! The state of one phase of a run (collection, an evaluation) that the
//! connection tasks share: the scheduler, the job, per-worker figures, and
//! the channel that hands accepted results to the merger; the connections
//! reach it through the run's lobby (`Lobby`), which serves one phase at a
//! time. One hub serves every kind of lease ([`LeaseKind`]): results
//! are checked here (hash, then the kind's checks) before the scheduler
//! accepts them, so a bad result only costs a retry. Results of units
//! sampled for redundancy are held here until a second (or third)
//! identity's result can be compared with them ([`Addend::agree`]).
//! A result may cover several leases (a worker's checkpoint): it is checked
//! as the result of all their units together and accepted for all of them
//! or none (`sched`).
//!
//! A worker's [`Identity`] is the name its join proof is bound to (the
//! proof is keyed by that name's worker key, `protocol::wire::worker_key`):
//! every connection of one name is one identity, so reconnecting neither
//! makes a second opinion nor clears a quarantine.

use crate::lease::{AddendOf, LeaseKind};
use bytes::Bytes;
use gguf::hash::sha256_hex;
use numbers::peer_text::peer_text;
use numbers::ChunkRange;
use protocol::wire::{JobInfo, LeaseId, PartialRef, Refusal, ToWorker, WorkerId};
use runfiles::buffers::BufferPool;
use runfiles::lease::{Addend, LeaseOutput};
use runfiles::store::{RunStore, StoreError};
use sched::{Completion, Event, Identity, Scheduler, Verdict};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// One of the hub's ingest slots (`[run] ingest_slots`: results fetched,
/// checked or waiting to be merged at once; each check and merge is spread
/// over the cores inside). However many workers deliver at once, the
/// coordinator reads at most that many stored results besides its running
/// total; the others wait their turn (heartbeating), holding nothing but an
/// inline result's frame (within the frame budget, `super::frames`). A slot
/// is held by a result from its fetch until it is merged (a result held for
/// a redundancy comparison gives its slot back: those are outside the bound).
#[derive(Debug)]
pub struct IngestSlot {
    _permit: Option<OwnedSemaphorePermit>,
}

/// A finished lease's (`Done`) or a checkpoint's result as its worker sent
/// it, less the worker's own `elapsed_ms` (throughput is timed on the
/// coordinator's clock, [`Hub::note_grant`]).
pub struct LeaseResult {
    /// The leases it covers (one for `Done`), each once.
    pub leases: Vec<LeaseId>,
    /// The encoded result, inline or staged.
    pub partial: PartialRef,
    /// SHA-256 of the encoded result (hex), as the worker states it.
    pub sha256: String,
}

/// An accepted result on its way to the merger.
#[derive(Debug)]
pub struct Delivery<T> {
    /// The worker that computed it.
    pub worker: WorkerId,
    /// The units of the plan it covers, sorted.
    pub units: Vec<ChunkRange>,
    /// The checked result, as it is added to the total.
    pub output: T,
    /// Its encoded bytes (the merger stores them under the final name).
    pub bytes: Bytes,
    /// Their SHA-256.
    pub sha256: String,
    /// The staging object the worker wrote them to, when they did not come
    /// inline (removed once the bytes are stored under the final name).
    pub staged: Option<String>,
    /// Its ingest slot: drop it once the result is merged.
    pub slot: IngestSlot,
}

/// Figures about one worker identity (all its connections), for progress
/// and the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's name (escaped: it came from the peer).
    pub name: String,
    /// Its compute backend (escaped).
    pub backend: String,
    /// Tokens in accepted results.
    pub tokens: u64,
    /// Milliseconds on the coordinator's clock spent on accepted results:
    /// the union of the spans from each result's first lease grant to its
    /// arrival (a worker's own figure is only its word).
    pub busy_ms: u64,
    /// End of the latest span counted in `busy_ms`, so that overlapping
    /// spans (a checkpoint's leases, two connections) count once.
    pub busy_until: Duration,
    /// Leases accepted.
    pub leases: u64,
    /// Connected now (by at least one connection).
    pub connected: bool,
    /// Quarantined during this run (after repeated failures, or a result
    /// two others contradicted).
    pub quarantined: bool,
}

/// The workers known to a hub: identities by name, their figures, and the
/// live connections of each.
#[derive(Debug, Default)]
struct Roster {
    /// Identity of each name (by the name's SHA-256: names are peer text).
    by_name: BTreeMap<String, Identity>,
    info: BTreeMap<Identity, WorkerInfo>,
    live: BTreeMap<WorkerId, Identity>,
}

/// A checked result, held until it is accepted (at once, or once enough
/// workers agree on its unit).
#[derive(Debug)]
struct Candidate<T> {
    worker: WorkerId,
    identity: Identity,
    output: T,
    bytes: Bytes,
    sha256: String,
    staged: Option<String>,
    /// When the coordinator granted the result's first lease and when the
    /// result arrived, on its clock ([`Hub::now`]).
    span: (Duration, Duration),
    slot: IngestSlot,
}

impl<T> Candidate<T> {
    /// The result without its ingest slot: one held for a redundancy
    /// comparison may wait for another worker's result (or a third, after
    /// a disagreement) for minutes, and must not starve the others' ingest.
    fn unslotted(self) -> Candidate<T> {
        Candidate {
            slot: IngestSlot { _permit: None },
            ..self
        }
    }
}

/// Shared state of the coordinator's connections, for leases of kind `K`.
#[derive(Debug)]
pub struct Hub<K: LeaseKind> {
    sched: Mutex<Scheduler>,
    job: JobInfo,
    kind: Arc<K>,
    run: RunStore,
    start: Instant,
    next_worker: AtomicU64,
    roster: Mutex<Roster>,
    /// Disagreements decided without a third identity, described.
    unresolved: Mutex<Vec<String>>,
    /// Results of sampled units waiting for another worker's.
    candidates: Mutex<BTreeMap<ChunkRange, Vec<Candidate<AddendOf<K>>>>>,
    deliveries: mpsc::UnboundedSender<Delivery<AddendOf<K>>>,
    /// The ingest slots ([`IngestSlot`]).
    ingest: Arc<Semaphore>,
    /// Largest staged result read, bytes (`[cluster] max_staged_mib`).
    max_staged: u64,
    /// Leases whose staged result is being delivered in the background.
    on_way: Mutex<BTreeSet<LeaseId>>,
    /// When each live lease was granted ([`Hub::note_grant`]), until its
    /// result arrives.
    granted: Mutex<BTreeMap<LeaseId, Duration>>,
    /// Buffers staged results are read into, one per ingest slot, kept
    /// from one result to the next until every result is stored.
    buffers: Arc<BufferPool>,
    /// Set once every accepted result is stored: only then may a worker
    /// be told the run is finished and leave.
    all_stored: AtomicBool,
}

/// The labels of a hub's results.
const fn labels<K: LeaseKind>() -> runfiles::lease::Labels {
    <K::Output as LeaseOutput>::LABELS
}

impl<K: LeaseKind> Hub<K> {
    /// A hub over a scheduler for leases of `kind`, reading at most
    /// `ingest_slots` results at once, none staged larger than `max_staged`
    /// bytes; accepted results come out of the returned receiver.
    pub fn new(
        sched: Scheduler,
        job: JobInfo,
        kind: Arc<K>,
        run: RunStore,
        ingest_slots: usize,
        max_staged: u64,
    ) -> (Self, mpsc::UnboundedReceiver<Delivery<AddendOf<K>>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = Hub {
            sched: Mutex::new(sched),
            job,
            kind,
            run,
            start: Instant::now(),
            next_worker: AtomicU64::new(1),
            roster: Mutex::new(Roster::default()),
            unresolved: Mutex::new(Vec::new()),
            candidates: Mutex::new(BTreeMap::new()),
            deliveries: tx,
            ingest: Arc::new(Semaphore::new(ingest_slots.max(1))),
            max_staged,
            on_way: Mutex::new(BTreeSet::new()),
            granted: Mutex::new(BTreeMap::new()),
            buffers: BufferPool::new(ingest_slots.max(1)),
            all_stored: AtomicBool::new(false),
        };
        (hub, rx)
    }

    /// Records that every accepted result is stored (called by the merger),
    /// and frees the read buffers: no large read is to come.
    pub fn set_all_stored(&self) {
        self.all_stored.store(true, Ordering::SeqCst);
        self.buffers.close();
    }

    /// Whether every accepted result is stored; until then a worker asking
    /// for work after the last unit is told to wait, not that the run is
    /// finished, so a coordinator that fails to store still has its workers.
    pub fn all_stored(&self) -> bool {
        self.all_stored.load(Ordering::SeqCst)
    }

    /// Time since the hub started: the scheduler's clock.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The scheduler, locked (never held across an await).
    pub fn sched(&self) -> MutexGuard<'_, Scheduler> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn roster(&self) -> MutexGuard<'_, Roster> {
        self.roster.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Per-identity figures.
    pub fn workers(&self) -> BTreeMap<Identity, WorkerInfo> {
        self.roster().info.clone()
    }

    /// The disagreements decided without a third identity, described.
    pub fn unresolved(&self) -> Vec<String> {
        self.unresolved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The run location (fenced by the run's lock when the caller holds it).
    pub fn store(&self) -> &RunStore {
        &self.run
    }

    /// The job every worker receives after its proof.
    pub fn job(&self) -> &JobInfo {
        &self.job
    }

    /// The message that tells a joined worker its job and task.
    pub fn welcome(&self, worker_id: WorkerId) -> ToWorker {
        ToWorker::Welcome {
            worker_id,
            job: Box::new(self.job.clone()),
            task: self.kind.task(),
        }
    }

    /// Registers a connection that proved the key of `name`: the name's
    /// identity (the same for every connection of that name) and a fresh
    /// connection id. A quarantined identity is refused.
    pub fn register(&self, name: &str, backend: &str) -> Result<(WorkerId, Identity), Refusal> {
        let shown = peer_text(name);
        let mut roster = self.roster();
        let next = Identity(roster.by_name.len() as u64 + 1);
        let identity = *roster
            .by_name
            .entry(sha256_hex(name.as_bytes()))
            .or_insert(next);
        let now = self.now();
        let mut sched = self.sched();
        for released in sched.release_expired(now) {
            tracing::info!("{released:?}: its quarantine ran out");
        }
        if let Some(why) = sched.quarantine_reason(identity) {
            return Err(Refusal::Quarantined(format!(
                "a worker named {shown:?} was quarantined earlier in this run: {why}"
            )));
        }
        let id = WorkerId(self.next_worker.fetch_add(1, Ordering::Relaxed));
        sched.register(id, identity, now);
        drop(sched);
        roster.live.insert(id, identity);
        let info = roster.info.entry(identity).or_default();
        info.name = shown;
        info.backend = peer_text(backend);
        info.connected = true;
        Ok((id, identity))
    }

    /// The names quarantined now, by their SHA-256 (names are peer text):
    /// why, and for how much longer (`None`: for the run).
    pub fn quarantined_names(&self) -> Vec<(String, String, Option<Duration>)> {
        let roster = self.roster();
        let quarantines = self.sched().quarantines();
        roster
            .by_name
            .iter()
            .filter_map(|(name, identity)| {
                let (_, why, left) = quarantines.iter().find(|(i, _, _)| i == identity)?;
                Some((name.clone(), why.clone(), *left))
            })
            .collect()
    }

    /// The refusal for a connection whose identity is quarantined now.
    pub fn quarantine_refusal(&self, worker: WorkerId) -> Option<Refusal> {
        let sched = self.sched();
        let why = sched.quarantine_reason(sched.identity_of(worker)?)?;
        Some(Refusal::Quarantined(why.to_string()))
    }

    /// Marks the identity quarantined in its figures.
    fn note_quarantine(&self, identity: Identity) {
        if let Some(w) = self.roster().info.get_mut(&identity) {
            w.quarantined = true;
        }
    }

    /// Logs what the scheduler did on its own, and accepts the kept result
    /// of a disagreement decided without a third identity.
    fn handle(&self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Quarantined { worker, why } => {
                    tracing::warn!(identity = %worker, "quarantined: {why}");
                    self.note_quarantine(worker);
                }
                Event::Unresolved { range, kept, other } => {
                    let name = |i| self.roster().info.get(&i).map(|w| w.name.clone());
                    let (kept_name, other_name) = (name(kept), name(other));
                    let what = format!(
                        "chunks {range}: the results of {} and {} disagree and no third worker came; kept {}'s, unverified",
                        other_name.as_deref().unwrap_or("?"),
                        kept_name.as_deref().unwrap_or("?"),
                        kept_name.as_deref().unwrap_or("?"),
                    );
                    tracing::warn!("UNRESOLVED disagreement: {what}");
                    self.unresolved
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(what);
                    let results = self.candidates().remove(&range).unwrap_or_default();
                    if let Some(r) = results.into_iter().find(|r| r.identity == kept) {
                        self.accept(vec![range], r);
                    }
                }
                Event::Released(identity) => {
                    tracing::info!(%identity, "its quarantine ran out: it may join again")
                }
                other => tracing::warn!("{other:?}; the chunks go back to the queue"),
            }
        }
    }

    /// The scheduler's clock: expired leases and silent workers, lifted
    /// quarantines, disagreements that waited too long.
    pub fn tick(&self) {
        let now = self.now();
        let events = self.sched().tick(now);
        self.handle(events);
    }

    /// A worker reports it could not finish a lease (`reason` already escaped).
    pub fn fail(&self, worker: WorkerId, lease: LeaseId, reason: &str) {
        self.fail_set(worker, &[lease], reason);
    }

    /// The leases of a result that failed its checks go back to the queue
    /// (one failure of the worker).
    fn fail_set(&self, worker: WorkerId, leases: &[LeaseId], reason: &str) {
        let now = self.now();
        let event = self.sched().fail_set(leases, worker, reason, now);
        self.handle(event.into_iter().collect());
    }

    /// A worker computed a lease and holds it for its next checkpoint;
    /// false (logged) when it was not computing that lease.
    pub fn computed(&self, worker: WorkerId, lease: LeaseId) -> bool {
        let now = self.now();
        let held = self.sched().computed(lease, worker, now);
        if !held {
            tracing::warn!(%worker, %lease, "computed a lease it is not computing (expired?); its checkpoint may be refused");
        }
        held
    }

    /// A worker's connection ended (a lease it held is a failure of its
    /// identity).
    pub fn disconnect(&self, worker: WorkerId, reason: &str) {
        let mut roster = self.roster();
        let Some(identity) = roster.live.remove(&worker) else {
            self.sched().disconnect(worker, reason);
            return;
        };
        let quarantined = {
            let mut sched = self.sched();
            sched.disconnect(worker, reason);
            sched.quarantine_reason(identity).is_some()
        };
        let connected = roster.live.values().any(|i| *i == identity);
        if let Some(w) = roster.info.get_mut(&identity) {
            w.connected = connected;
            w.quarantined |= quarantined;
        }
    }

    /// Takes a finished lease, or a checkpoint's result covering several
    /// `leases`. An inline result is checked before this returns (its bytes
    /// are held in the frame budget meanwhile). A staged one does not make
    /// its worker wait: the worker's current lease among `leases` is held
    /// for the result (as a checkpoint's computed leases are), so its next
    /// poll takes new work, and the result is fetched, checked and handed on
    /// by a task of its own, waiting for an ingest slot in storage, not in
    /// memory. A staged result naming a lease the worker does not hold, or
    /// one already on its way, is handled in line (and dropped there), so a
    /// worker has at most one task per lease it was granted.
    pub async fn deliver(self: &Arc<Self>, worker: WorkerId, result: LeaseResult) {
        let LeaseResult {
            leases,
            partial,
            sha256,
        } = result;
        let span = self.span_of(&leases);
        let staged = matches!(partial, PartialRef::Stored(_));
        let fresh = staged && self.sched().lease_ranges(&leases, worker).is_some() && {
            let mut on_way = self.on_way();
            let fresh = !leases.iter().any(|l| on_way.contains(l));
            if fresh {
                on_way.extend(leases.iter().copied());
            }
            fresh
        };
        if !fresh {
            return self.settle(worker, &leases, partial, sha256, span).await;
        }
        {
            let now = self.now();
            let mut sched = self.sched();
            for &lease in &leases {
                sched.computed(lease, worker, now);
            }
        }
        let hub = Arc::clone(self);
        tokio::spawn(async move {
            hub.settle(worker, &leases, partial, sha256, span).await;
            hub.on_way().retain(|l| !leases.contains(l));
        });
    }

    fn on_way(&self) -> MutexGuard<'_, BTreeSet<LeaseId>> {
        self.on_way.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn granted(&self) -> MutexGuard<'_, BTreeMap<LeaseId, Duration>> {
        self.granted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that `lease` was granted now: the start of the span its result
    /// is credited with ([`WorkerInfo::busy_ms`]).
    pub fn note_grant(&self, lease: LeaseId) {
        let now = self.now();
        self.granted().insert(lease, now);
    }

    /// The span of a result of `leases` arriving now: from the first grant
    /// among them (now, for leases with no grant noted) to now. Their grant
    /// times are forgotten: a lease's result arrives once.
    fn span_of(&self, leases: &[LeaseId]) -> (Duration, Duration) {
        let now = self.now();
        let mut granted = self.granted();
        let first = leases.iter().filter_map(|l| granted.remove(l)).min();
        (first.unwrap_or(now).min(now), now)
    }

    /// Settles a finished lease, or a checkpoint's result covering several
    /// `leases`: fetches and checks the result, then lets the scheduler
    /// decide. A result that fails a check sends its leases back to the
    /// queue (one attempt used).
    async fn settle(
        &self,
        worker: WorkerId,
        leases: &[LeaseId],
        partial: PartialRef,
        sha256: String,
        span: (Duration, Duration),
    ) {
        let what = labels::<K>().result;
        let slot = self.ingest_slot(worker).await;
        let check = |units| self.fetch_and_check(units, partial, &sha256);
        let Some((output, bytes, staged)) = self.checked(worker, leases, what, check).await else {
            return;
        };
        let now = self.now();
        let (completion, identity) = {
            let mut sched = self.sched();
            let identity = sched.identity_of(worker);
            (sched.complete_set(leases, worker, &sha256, now), identity)
        };
        let Some(identity) = identity else {
            return;
        };
        let result = Candidate {
            worker,
            identity,
            output,
            bytes,
            sha256,
            staged,
            span,
            slot,
        };
        match completion {
            Completion::Accepted(range) => self.accept(vec![range], result),
            Completion::AcceptedSet(mut units) => {
                units.sort();
                self.accept(units, result)
            }
            Completion::Stale(units) => {
                tracing::warn!(%worker, leases = units.len(), "{what} covers a unit already done or one that must come alone: dropped, its other units go back to the queue");
            }
            Completion::Opinion {
                range,
                have,
                needed,
            } => {
                tracing::info!(%worker, %range, "{what} {have} of {needed} (redundant verification): the chunks go to another worker");
                self.candidates()
                    .entry(range)
                    .or_default()
                    .push(result.unslotted());
            }
            Completion::Decide(range) => {
                self.candidates()
                    .entry(range)
                    .or_default()
                    .push(result.unslotted());
                self.decide(range);
            }
            Completion::Duplicate { range, same: true } => {
                tracing::info!(%worker, %range, "duplicate {what} dropped (bitwise identical to the kept one)");
            }
            Completion::Duplicate { range, same: false } => {
                tracing::warn!(%worker, %range, "duplicate {what} DIFFERS from the kept one (mixed backends?); kept the first");
            }
            Completion::Unknown => {
                tracing::warn!(%worker, leases = leases.len(), "{what} for an unknown lease dropped")
            }
        }
    }

    /// The first steps of handling a finished lease or checkpoint (`what`:
    /// a result or an eval result): the result, `check`ed for the leases'
    /// units (sorted). A lease this worker never held (or one named twice)
    /// drops the result; a result that fails its check sends its leases back
    /// to the queue (one attempt used). `None` when nothing more is to be done.
    async fn checked<T, F, Fut>(
        &self,
        worker: WorkerId,
        leases: &[LeaseId],
        what: &str,
        check: F,
    ) -> Option<T>
    where
        F: FnOnce(Vec<ChunkRange>) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let Some(mut units) = self.sched().lease_ranges(leases, worker) else {
            tracing::warn!(%worker, leases = leases.len(), "{what} for a lease this worker never held; dropped");
            return None;
        };
        units.sort();
        let first = units.first().copied();
        match check(units).await {
            Ok(ok) => Some(ok),
            Err(reason) => {
                tracing::warn!(%worker, leases = leases.len(), first = ?first, "bad {what}: {reason}");
                self.fail_set(worker, leases, &reason);
                None
            }
        }
    }

    fn candidates(&self) -> MutexGuard<'_, BTreeMap<ChunkRange, Vec<Candidate<AddendOf<K>>>>> {
        self.candidates.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an accepted result of `units` and hands it to the merger,
    /// which stores its bytes under the final name (create-only).
    fn accept(&self, units: Vec<ChunkRange>, r: Candidate<AddendOf<K>>) {
        self.credit(r.identity, r.output.measured(), r.span, units.len());
        let _ = self.deliveries.send(Delivery {
            worker: r.worker,
            units,
            output: r.output,
            bytes: r.bytes,
            sha256: r.sha256,
            staged: r.staged,
            slot: r.slot,
        });
    }

    /// Compares the results of a sampled unit, settles it with the
    /// scheduler and accepts the kept result.
    fn decide(&self, range: ChunkRange) {
        let mut candidates = self.candidates();
        let Some(results) = candidates.get(&range) else {
            return;
        };
        let verdict = judge::<K>(range, results);
        let now = self.now();
        let event = self.sched().settle(range, verdict.clone(), now);
        let keep = match verdict {
            Verdict::Agree { keep } => keep,
            Verdict::Odd { keep, odd } => {
                tracing::warn!(%range, "{odd}'s result disagreed with two others: discarded");
                keep
            }
            Verdict::Disagree | Verdict::NoAgreement(_) => return,
        };
        let results = candidates.remove(&range).unwrap_or_default();
        drop(candidates);
        self.handle(event.into_iter().collect());
        if let Some(kept) = results.into_iter().find(|r| r.identity == keep) {
            tracing::info!(%range, "verified: results of distinct workers agree");
            self.accept(vec![range], kept);
        }
    }

    /// Counts an accepted result of `leases` leases and `tokens` tokens (or
    /// scored positions) that the coordinator saw take `span` (grant to
    /// arrival); the part of it already counted is not counted again.
    fn credit(&self, identity: Identity, tokens: u64, span: (Duration, Duration), leases: usize) {
        if let Some(w) = self.roster().info.get_mut(&identity) {
            let (from, to) = (span.0.max(w.busy_until), span.1);
            w.tokens += tokens;
            w.busy_ms += to.saturating_sub(from).as_millis() as u64;
            w.busy_until = w.busy_until.max(to);
            w.leases += leases as u64;
        }
    }

    /// An ingest slot for a result of `worker`, heartbeating the worker
    /// about once a second while it waits (its connection reads nothing
    /// meanwhile, and the worker is not silent: the coordinator is busy).
    async fn ingest_slot(&self, worker: WorkerId) -> IngestSlot {
        let acquire = self.ingest.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                permit = &mut acquire => {
                    let permit = permit.expect("the ingest semaphore is never closed");
                    return IngestSlot { _permit: Some(permit) };
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    let now = self.now();
                    let _ = self.sched().heartbeat(worker, now);
                }
            }
        }
    }

    /// The bytes of a reported result: inline, or read from the staging
    /// name of its claimed hash (any other name, or an object larger than
    /// `[cluster] max_staged_mib`, is refused unread); with that staging
    /// name.
    async fn fetch(
        &self,
        partial: PartialRef,
        sha256: &str,
    ) -> Result<(Bytes, Option<String>), String> {
        match partial {
            PartialRef::Inline(b) => Ok((Bytes::from(b), None)),
            PartialRef::Stored(name) => {
                if runfiles::layout::staged(sha256).as_deref() != Some(name.as_str()) {
                    return Err(format!(
                        "stored {} \"{}\" is not the staging name of its hash",
                        labels::<K>().output,
                        peer_text(&name)
                    ));
                }
                let buf = self.buffers.take();
                let bytes = match self.run.get_limited_into(&name, self.max_staged, buf).await {
                    Ok(buf) => self.buffers.lend(buf),
                    Err(StoreError::TooLarge { url, size, .. }) => {
                        return Err(format!(
                            "staged {} {url} is {size} bytes, over [cluster] max_staged_mib = {}",
                            labels::<K>().output,
                            self.max_staged >> 20
                        ))
                    }
                    Err(e) => return Err(e.to_string()),
                };
                Ok((bytes, Some(name)))
            }
        }
    }

    async fn fetch_and_check(
        &self,
        units: Vec<ChunkRange>,
        partial: PartialRef,
        sha256: &str,
    ) -> Result<(AddendOf<K>, Bytes, Option<String>), String> {
        let (bytes, staged) = self.fetch(partial, sha256).await?;
        let claimed = sha256.to_string();
        let kind = self.kind.clone();
        let what = labels::<K>().output;
        tokio::task::spawn_blocking(move || {
            // The hash runs on one core beside the decode (spread over the
            // others): a partial of a bad hash is refused all the same, the
            // decode being bounded and its result dropped.
            let (hash, output) = rayon::join(
                || check_hash(&bytes, &claimed, what),
                || kind.decode_and_check(&units, bytes.clone()),
            );
            hash?;
            Ok((output?, bytes, staged))
        })
        .await
        .map_err(|e| format!("checking the {what} panicked: {e}"))?
    }
}

/// Whether `bytes` hash to the SHA-256 the worker `claimed` for its `what`.
fn check_hash(bytes: &[u8], claimed: &str, what: &str) -> Result<(), String> {
    let actual = sha256_hex(bytes);
    if actual != claimed {
        return Err(format!(
            "{what} hashes to {actual}, the worker said \"{}\"",
            peer_text(claimed)
        ));
    }
    Ok(())
}

/// The verdict on two or three results of one unit: two that agree settle
/// it; with three, the one that agrees with neither other is the odd one.
fn judge<K: LeaseKind>(range: ChunkRange, results: &[Candidate<AddendOf<K>>]) -> Verdict {
    let workers: Vec<_> = results.iter().map(|r| (r.worker, r.identity)).collect();
    Verdict::of(&workers, |i, j| {
        let (a, b) = (&results[i], &results[j]);
        match a.output.agree(&b.output) {
            Ok(()) => true,
            Err(why) => {
                if results.len() == 2 {
                    tracing::warn!(%range, "results of {} and {} disagree ({why}): asking a third worker", a.worker, b.worker);
                }
                false
            }
        }
    })
}
