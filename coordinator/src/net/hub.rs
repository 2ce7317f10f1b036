//! State shared by the connection tasks: the scheduler, the join secret, the
//! job, per-worker figures, and the channel that hands accepted partials to
//! the merger. Results are checked here (hash, then [`Acceptance`]) before
//! the scheduler accepts them, so a bad result only costs a retry.

use crate::run::accept::Acceptance;
use crate::sched::{Completion, Scheduler};
use bytes::Bytes;
use common::hash::sha256_hex;
use common::partial::Partial;
use common::store::RunStore;
use common::wire::{staged_partial_name, JobInfo, LeaseId, PartialRef, WorkerId};
use common::ChunkRange;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// An accepted result on its way to the merger.
#[derive(Debug)]
pub struct Delivery {
    /// The worker that computed it.
    pub worker: WorkerId,
    /// Its chunks (one unit of the plan).
    pub range: ChunkRange,
    /// The decoded partial.
    pub partial: Partial,
    /// Its encoded bytes (the merger stores them under the final name).
    pub bytes: Bytes,
    /// Their SHA-256.
    pub sha256: String,
    /// The staging object the worker wrote them to, when they did not come
    /// inline (removed once the bytes are stored under the final name).
    pub staged: Option<String>,
}

/// Figures about one worker, for progress and the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's name.
    pub name: String,
    /// Its compute backend.
    pub backend: String,
    /// Tokens in accepted results.
    pub tokens: u64,
    /// Worker-side milliseconds spent on accepted results.
    pub busy_ms: u64,
    /// Leases accepted.
    pub leases: u64,
    /// Still connected.
    pub connected: bool,
}

/// Shared state of the coordinator's connections.
#[derive(Debug)]
pub struct Hub {
    sched: Mutex<Scheduler>,
    secret: Vec<u8>,
    job: JobInfo,
    acceptance: Arc<Acceptance>,
    run: RunStore,
    start: Instant,
    next_worker: AtomicU64,
    workers: Mutex<BTreeMap<WorkerId, WorkerInfo>>,
    deliveries: mpsc::UnboundedSender<Delivery>,
}

/// Tokens measured in a partial (all splits and domains).
pub fn partial_tokens(p: &Partial) -> u64 {
    p.experts.groups.values().map(|g| g.n_tokens).sum()
}

impl Hub {
    /// A hub over a scheduler; accepted results come out of the returned receiver.
    pub fn new(
        sched: Scheduler,
        secret: Vec<u8>,
        job: JobInfo,
        acceptance: Arc<Acceptance>,
        run: RunStore,
    ) -> (Hub, mpsc::UnboundedReceiver<Delivery>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = Hub {
            sched: Mutex::new(sched),
            secret,
            job,
            acceptance,
            run,
            start: Instant::now(),
            next_worker: AtomicU64::new(1),
            workers: Mutex::new(BTreeMap::new()),
            deliveries: tx,
        };
        (hub, rx)
    }

    /// Time since the hub started: the scheduler's clock.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The scheduler, locked (never held across an await).
    pub fn sched(&self) -> MutexGuard<'_, Scheduler> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Per-worker figures.
    pub fn workers(&self) -> BTreeMap<WorkerId, WorkerInfo> {
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The join secret.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The job every worker receives after its proof.
    pub fn job(&self) -> &JobInfo {
        &self.job
    }

    /// Registers a worker that proved the secret.
    pub fn register(&self, name: &str, backend: &str) -> WorkerId {
        let id = WorkerId(self.next_worker.fetch_add(1, Ordering::Relaxed));
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                WorkerInfo {
                    name: name.to_string(),
                    backend: backend.to_string(),
                    connected: true,
                    ..WorkerInfo::default()
                },
            );
        let now = self.now();
        self.sched().register(id, now);
        id
    }

    /// A worker's connection ended.
    pub fn disconnect(&self, worker: WorkerId, reason: &str) {
        self.sched().disconnect(worker, reason);
        if let Some(w) = self
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&worker)
        {
            w.connected = false;
        }
    }

    /// Handles a finished lease: fetches and checks the partial, then lets
    /// the scheduler decide. A result that fails a check sends the lease back
    /// to the queue (one attempt used).
    pub async fn deliver(
        &self,
        worker: WorkerId,
        lease: LeaseId,
        partial: PartialRef,
        sha256: String,
        elapsed_ms: u64,
    ) {
        let Some(range) = self.sched().lease_range(lease, worker) else {
            tracing::warn!(%worker, %lease, "result for a lease this worker never held; dropped");
            return;
        };
        let checked = self.fetch_and_check(range, partial, &sha256).await;
        let now = self.now();
        let (partial, bytes, staged) = match checked {
            Ok(ok) => ok,
            Err(reason) => {
                tracing::warn!(%worker, %lease, %range, "bad result: {reason}");
                self.sched().fail(lease, worker, &reason, now);
                return;
            }
        };
        let completion = self.sched().complete(lease, worker, &sha256, now);
        match completion {
            Completion::Accepted(range) => {
                if let Some(w) = self
                    .workers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&worker)
                {
                    w.tokens += partial_tokens(&partial);
                    w.busy_ms += elapsed_ms;
                    w.leases += 1;
                }
                let _ = self.deliveries.send(Delivery {
                    worker,
                    range,
                    partial,
                    bytes,
                    sha256,
                    staged,
                });
            }
            Completion::Duplicate { range, same: true } => {
                tracing::info!(%worker, %range, "duplicate result dropped (bitwise identical to the kept one)");
            }
            Completion::Duplicate { range, same: false } => {
                tracing::warn!(%worker, %range, "duplicate result DIFFERS from the kept one (mixed backends?); kept the first");
            }
            Completion::Unknown => {
                tracing::warn!(%worker, %lease, "result for an unknown lease dropped")
            }
        }
    }

    async fn fetch_and_check(
        &self,
        range: ChunkRange,
        partial: PartialRef,
        sha256: &str,
    ) -> Result<(Partial, Bytes, Option<String>), String> {
        let (bytes, staged) = match partial {
            PartialRef::Inline(b) => (Bytes::from(b), None),
            PartialRef::Stored(name) => {
                let expected = staged_partial_name(sha256);
                if expected.as_deref() != Some(name.as_str()) {
                    return Err(format!(
                        "stored partial \"{}\" is not the staging name of its hash",
                        crate::run::accept::shown(&name)
                    ));
                }
                let bytes = self.run.get(&name).await.map_err(|e| e.to_string())?;
                (bytes, Some(name))
            }
        };
        let claimed = sha256.to_string();
        let acceptance = self.acceptance.clone();
        tokio::task::spawn_blocking(move || {
            let actual = sha256_hex(&bytes);
            if actual != claimed {
                return Err(format!(
                    "partial hashes to {actual}, the worker said \"{}\"",
                    crate::run::accept::shown(&claimed)
                ));
            }
            let p = acceptance.decode_and_check(range, &bytes)?;
            Ok((p, bytes, staged))
        })
        .await
        .map_err(|e| format!("checking the partial panicked: {e}"))?
    }
}
