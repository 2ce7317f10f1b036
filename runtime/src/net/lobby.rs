//! A run's workers across its phases. One QUIC server serves a whole
//! `coordinator run`: collection, the evaluation of `[eval]`, and shipping's
//! evaluation, each a [`Hub`] of its own kind of lease. The lobby holds the
//! join secret (one per run) and the phase being served, if any: a joined
//! worker is welcomed into the current phase, told to wait while there is
//! none (between phases, or before the first), and welcomed into the next
//! phase when the one it served is over. It leaves only when the server
//! closes (the run finished or stopped), so a cluster scheduler starts each
//! worker once. A quarantine outlasts its phase: the lobby keeps every
//! name quarantined when a phase ends, for what is left of its quarantine,
//! and refuses it in the later phases (a worker contradicted in collection
//! gets no eval lease).

use super::hub::{Hub, LeaseResult};
use crate::lease::LeaseKind;
use numbers::peer_text::peer_text;
use protocol::secret::JoinSecret;
use protocol::wire::{LeaseId, Refusal, ToWorker, WorkerId};
use sched::{Grant, Identity, SchedError};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a worker waits when every unit is done but not yet stored, or
/// between phases, before it asks again.
pub const IDLE_POLL: Duration = Duration::from_millis(200);

/// What the connection tasks do with a phase, whatever its lease kind: the
/// hub's operations behind one object-safe trait, so one server serves
/// every phase of a run.
pub trait Phase: Send + Sync + 'static {
    /// Registers a connection that proved the key of `name` (see
    /// [`Hub::register`]).
    fn register(&self, name: &str, backend: &str) -> Result<(WorkerId, Identity), Refusal>;
    /// The message that tells a registered worker this phase's job and task.
    fn welcome(&self, id: WorkerId) -> ToWorker;
    /// The worker's connection left this phase (a lease it held is retried).
    fn disconnect(&self, id: WorkerId, reason: &str);
    /// The worker is alive.
    fn heartbeat(&self, id: WorkerId);
    /// The reply to a poll (`busy`: a heartbeat while it works), or `None`
    /// once this phase needs nothing more from any worker: every unit is
    /// done and every accepted result stored.
    fn poll(&self, id: WorkerId, busy: bool) -> Option<ToWorker>;
    /// Takes a finished lease or checkpoint ([`Hub::deliver`]).
    fn deliver(
        self: Arc<Self>,
        id: WorkerId,
        result: LeaseResult,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    /// A lease computed and held for the worker's next checkpoint.
    fn computed(&self, id: WorkerId, lease: LeaseId) -> bool;
    /// A lease the worker could not finish (`reason` already escaped).
    fn fail(&self, id: WorkerId, lease: LeaseId, reason: &str);
    /// The refusal for a worker whose identity is quarantined now.
    fn quarantine_refusal(&self, id: WorkerId) -> Option<Refusal>;
    /// The names quarantined now, by their SHA-256: why, and for how much
    /// longer (`None`: for the run).
    fn quarantined_names(&self) -> Vec<(String, String, Option<Duration>)>;
}

impl<K: LeaseKind> Phase for Hub<K> {
    fn register(&self, name: &str, backend: &str) -> Result<(WorkerId, Identity), Refusal> {
        Hub::register(self, name, backend)
    }

    fn welcome(&self, id: WorkerId) -> ToWorker {
        Hub::welcome(self, id)
    }

    fn disconnect(&self, id: WorkerId, reason: &str) {
        Hub::disconnect(self, id, reason)
    }

    fn heartbeat(&self, id: WorkerId) {
        let now = self.now();
        let _ = self.sched().heartbeat(id, now);
    }

    fn poll(&self, id: WorkerId, busy: bool) -> Option<ToWorker> {
        let now = self.now();
        let mut sched = self.sched();
        if busy {
            return Some(match sched.heartbeat(id, now) {
                Ok(()) => ToWorker::Ack,
                Err(e) => ToWorker::Refused(sched_refusal(e)),
            });
        }
        Some(match sched.request(id, now) {
            Grant::Lease(l) => {
                tracing::debug!(%id, lease = %l.lease_id, range = %l.range, "lease granted");
                self.note_grant(l.lease_id);
                ToWorker::Lease(l)
            }
            Grant::Wait(d) => ToWorker::Wait {
                retry_ms: d.as_millis() as u64,
            },
            Grant::Finished if self.all_stored() => return None,
            Grant::Finished => ToWorker::Wait {
                retry_ms: IDLE_POLL.as_millis() as u64,
            },
            Grant::Failed(e) => ToWorker::Refused(sched_refusal(e)),
        })
    }

    fn deliver(
        self: Arc<Self>,
        id: WorkerId,
        result: LeaseResult,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            Hub::deliver(&self, id, result).await;
        })
    }

    fn computed(&self, id: WorkerId, lease: LeaseId) -> bool {
        Hub::computed(self, id, lease)
    }

    fn fail(&self, id: WorkerId, lease: LeaseId, reason: &str) {
        Hub::fail(self, id, lease, reason)
    }

    fn quarantine_refusal(&self, id: WorkerId) -> Option<Refusal> {
        Hub::quarantine_refusal(self, id)
    }

    fn quarantined_names(&self) -> Vec<(String, String, Option<Duration>)> {
        Hub::quarantined_names(self)
    }
}

fn sched_refusal(e: SchedError) -> Refusal {
    match e {
        SchedError::Quarantined { why, .. } => Refusal::Quarantined(why),
        other => Refusal::RunFailed(other.to_string()),
    }
}

/// The phase being served, numbered so that a connection knows whether
/// the phase it is in is still the current one.
#[derive(Clone)]
struct Current {
    serial: u64,
    phase: Option<Arc<dyn Phase>>,
    /// The run is finished: no phase is to come.
    finished: bool,
}

/// The run-wide state of the server: the join secret and the phase being
/// served.
pub struct Lobby {
    secret: JoinSecret,
    current: Mutex<Current>,
    /// Names quarantined in an ended phase, by their SHA-256: why, and
    /// until when (`None`: for the run).
    quarantined: Mutex<BTreeMap<String, (String, Option<Instant>)>>,
}

impl std::fmt::Debug for Lobby {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lobby")
            .field("serial", &self.current().serial)
            .finish_non_exhaustive()
    }
}

/// A connection's place in a phase: the phase, its number in the lobby,
/// and the connection's id there.
pub struct Seat {
    /// The phase.
    pub phase: Arc<dyn Phase>,
    serial: u64,
    /// The connection's id in that phase.
    pub id: WorkerId,
}

impl Lobby {
    /// A lobby admitting workers that prove `secret`, serving no phase yet.
    pub fn new(secret: JoinSecret) -> Lobby {
        Lobby {
            secret,
            current: Mutex::new(Current {
                serial: 0,
                phase: None,
                finished: false,
            }),
            quarantined: Mutex::new(BTreeMap::new()),
        }
    }

    /// The join secret.
    pub fn secret(&self) -> &[u8] {
        self.secret.expose()
    }

    fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set(&self, phase: Option<Arc<dyn Phase>>, finished: bool) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ended) = current.phase.as_ref() {
            self.keep_quarantines(ended.as_ref());
        }
        current.serial += 1;
        current.phase = phase;
        current.finished = finished;
    }

    /// Keeps the quarantines of a phase that ends, for what is left of them
    /// (a longer one already kept stays).
    fn keep_quarantines(&self, ended: &dyn Phase) {
        let now = Instant::now();
        let mut kept = self.quarantined.lock().unwrap_or_else(|e| e.into_inner());
        for (name, why, left) in ended.quarantined_names() {
            let until = left.map(|d| now + d);
            let longer = match kept.get(&name) {
                Some((_, None)) => false,
                Some((_, Some(t))) => until.is_none_or(|u| u > *t),
                None => true,
            };
            if longer {
                kept.insert(name, (why, until));
            }
        }
    }

    /// Why the worker called `name` is quarantined from an ended phase, if
    /// it still is.
    fn quarantine_of(&self, name: &str) -> Option<String> {
        let key = gguf::hash::sha256_hex(name.as_bytes());
        let kept = self.quarantined.lock().unwrap_or_else(|e| e.into_inner());
        match kept.get(&key)? {
            (why, None) => Some(why.clone()),
            (why, Some(until)) if Instant::now() < *until => Some(why.clone()),
            _ => None,
        }
    }

    /// Starts serving `phase`: idle workers are welcomed into it.
    pub fn begin(&self, phase: Arc<dyn Phase>) {
        self.set(Some(phase), false);
    }

    /// Ends the current phase: workers wait for the next one.
    pub fn end(&self) {
        self.set(None, false);
    }

    /// The run is finished: idle workers are told so, and leave.
    pub fn finish(&self) {
        self.set(None, true);
    }

    /// The reply to a worker called `name` (on `backend`) that asks for
    /// work from `seat` (none: it is in no phase) when that phase needs
    /// nothing more of it, or it has just joined: a welcome into the current
    /// phase (updating `seat`), a wait when no phase is being served or the
    /// worker's phase is still the current one, a refusal (quarantined), or
    /// `Finished` once the run is.
    pub fn next_phase(&self, seat: &mut Option<Seat>, name: &str, backend: &str) -> ToWorker {
        let wait = ToWorker::Wait {
            retry_ms: IDLE_POLL.as_millis() as u64,
        };
        let current = self.current();
        if let Some(s) = seat.as_ref() {
            if s.serial == current.serial {
                return wait;
            }
            s.phase.disconnect(s.id, "its phase is over");
            *seat = None;
        }
        let Some(phase) = current.phase else {
            return if current.finished {
                ToWorker::Finished
            } else {
                wait
            };
        };
        if let Some(why) = self.quarantine_of(name) {
            return ToWorker::Refused(Refusal::Quarantined(format!(
                "a worker named {:?} was quarantined in an earlier phase of this run: {why}",
                peer_text(name)
            )));
        }
        match phase.register(name, backend) {
            Ok((id, identity)) => {
                tracing::info!(worker = %peer_text(name), %id, %identity, "worker welcomed into the phase");
                let welcome = phase.welcome(id);
                *seat = Some(Seat {
                    phase,
                    serial: current.serial,
                    id,
                });
                welcome
            }
            Err(refusal) => ToWorker::Refused(refusal),
        }
    }
}
