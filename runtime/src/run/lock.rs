//! The run-location lock: one coordinator writes to a run at a time.
//!
//! The lock is the object `run.lock`, created with a create-only put and
//! holding its owner (host, process, a random token) and a heartbeat
//! timestamp that the holder refreshes. A second coordinator finds it and
//! stops with an error naming the holder, unless
//! - the holder ran on this machine (same boot, same pid namespace) and that
//!   process is gone (a crash, `kill -9`): the lock is taken over at once;
//! - the heartbeat is older than the stale timeout (a holder elsewhere that
//!   stopped): it is taken over;
//! - the timeout is 0 (`coordinator run --take-over-lock`): any lock is.
//!
//! The holder writes only through [`RunLock::store`], a store fenced by the
//! lock ([`runfiles::store::Fence`]): a write is admitted while the lock was
//! confirmed as ours within half the stale timeout (the heartbeat does that
//! every quarter); past that the write first reads the lock again, and once
//! another holder has it every write fails. A coordinator paused past the
//! stale timeout and resumed after another took over therefore writes
//! nothing (this relies on clocks agreeing within half the stale timeout).
//! [`RunLock::confirm`] reads the lock before a final write whatever the
//! time.

use runfiles::store::{Fence, RunStore, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Object name of the lock under the run.
pub use runfiles::layout::LOCK_FILE;

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another coordinator holds it and its heartbeat is fresh.
    #[error(
        "{url} is held by {owner} (heartbeat {age_s} s ago, stale after {stale_s} s): \
         another coordinator writes to this run; wait for it, or take the lock over \
         with --take-over-lock if it is gone"
    )]
    Held {
        /// The lock's URL.
        url: String,
        /// The holder, as it wrote itself (escaped).
        owner: String,
        /// Seconds since its last heartbeat.
        age_s: u64,
        /// The stale timeout.
        stale_s: u64,
    },
    /// This coordinator held the lock and lost it to another.
    #[error("{0}")]
    Lost(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The holder's process, so a coordinator on the same machine can tell
/// that it is gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderProcess {
    /// `/proc/sys/kernel/random/boot_id`: the same machine since its boot.
    pub boot_id: String,
    /// The pid namespace (`/proc/self/ns/pid` link), so a pid means the
    /// same process to both.
    pub pid_ns: String,
    /// Process id.
    pub pid: u32,
    /// Its start time in clock ticks since boot (a recycled pid differs).
    pub start_ticks: u64,
}

/// The lock object's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockBody {
    /// Who holds it: `host pid N`.
    pub owner: String,
    /// Random token of this holder, to tell its lock from a successor's.
    pub token: String,
    /// Milliseconds since the Unix epoch of the last heartbeat.
    pub heartbeat_ms: u64,
    /// The holder's process, when it could read it (Linux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<HolderProcess>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host} pid {}", std::process::id())
}

/// The machine and pid namespace this process runs in.
fn machine() -> Option<(String, String)> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some((boot.trim().to_string(), ns.display().to_string()))
}

fn this_process() -> Option<HolderProcess> {
    let (boot_id, pid_ns) = machine()?;
    Some(HolderProcess {
        boot_id,
        pid_ns,
        pid: std::process::id(),
        start_ticks: runfiles::procstat::own_start_ticks()?,
    })
}

/// Whether the holder ran on this machine, in this pid namespace, and its
/// process no longer runs.
fn holder_gone(h: &HolderProcess) -> bool {
    match machine() {
        Some((boot, ns)) if boot == h.boot_id && ns == h.pid_ns => {
            runfiles::procstat::start_ticks(h.pid) != Some(h.start_ticks)
        }
        _ => false,
    }
}

/// A held lock; its heartbeat is refreshed in the background until
/// [`RunLock::release`] (or drop, which stops the heartbeat and leaves the
/// object to go stale).
#[derive(Debug)]
pub struct RunLock {
    fence: Arc<LockFence>,
    fenced: RunStore,
    heartbeat: tokio::task::JoinHandle<()>,
}

/// The lock as a write fence: see the module doc.
#[derive(Debug)]
struct LockFence {
    /// The run, unfenced: the lock's own reads and writes.
    store: RunStore,
    token: String,
    /// How long a confirmation admits writes: half the stale timeout.
    window: Duration,
    state: tokio::sync::Mutex<FenceState>,
}

#[derive(Debug)]
enum FenceState {
    /// Ours as of this instant (taken before the read that confirmed it).
    Confirmed(Instant),
    /// Another holder has it: why.
    Lost(String),
}

impl LockFence {
    /// Reads the lock: ours, its heartbeat is rewritten and writes are
    /// admitted for another window; another's (or none), the lock is lost
    /// for good. A storage error leaves the state as it is.
    async fn confirm(&self, state: &mut FenceState) -> Result<(), String> {
        if let FenceState::Lost(why) = state {
            return Err(why.clone());
        }
        let asked = Instant::now();
        let url = self.store.url_of(LOCK_FILE);
        match read(&self.store).await {
            Ok(Some(b)) if b.token == self.token => {
                let body = LockBody {
                    heartbeat_ms: now_ms(),
                    ..b
                };
                let bytes = serde_json::to_vec(&body).expect("the lock encodes");
                self.store
                    .put(LOCK_FILE, bytes)
                    .await
                    .map_err(|e| format!("refreshing {url}: {e}"))?;
                *state = FenceState::Confirmed(asked);
                Ok(())
            }
            Ok(other) => {
                let by = other.map_or_else(
                    || "nobody (it was removed)".to_string(),
                    |b| numbers::peer_text::peer_text(&b.owner),
                );
                let why = format!(
                    "{url} was taken over by {by}; this coordinator no longer holds the run \
                     and stopped writing to it"
                );
                *state = FenceState::Lost(why.clone());
                Err(why)
            }
            Err(e) => Err(format!("reading {url}: {e}")),
        }
    }

    async fn admit_now(&self) -> Result<(), String> {
        let mut state = self.state.lock().await;
        match &*state {
            FenceState::Confirmed(at) if at.elapsed() < self.window => Ok(()),
            _ => self.confirm(&mut state).await,
        }
    }
}

impl Fence for LockFence {
    fn admit(&self) -> futures::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(self.admit_now())
    }
}

impl RunLock {
    /// Takes the lock of `store`; a lock whose holder is gone (see the
    /// module doc) or whose heartbeat is older than `stale` is taken over
    /// (with a warning naming its holder).
    pub async fn acquire(store: &RunStore, stale: Duration) -> Result<RunLock, LockError> {
        let store = store.unfenced();
        let token = hex::encode(protocol::wire::random_bytes(16));
        let body = LockBody {
            owner: owner(),
            token: token.clone(),
            heartbeat_ms: 0,
            process: this_process(),
        };
        for _ in 0..2 {
            let fresh = LockBody {
                heartbeat_ms: now_ms(),
                ..body.clone()
            };
            let asked = Instant::now();
            let encoded = serde_json::to_vec(&fresh).expect("the lock encodes");
            match store.put_new(LOCK_FILE, encoded).await {
                Ok(()) => return Ok(RunLock::held(store, token, stale, asked)),
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let held = read(&store).await?;
            let age_ms = held
                .as_ref()
                .map_or(u64::MAX, |h| now_ms().saturating_sub(h.heartbeat_ms));
            let shown = held.as_ref().map_or_else(
                || "an unreadable lock".to_string(),
                |h| numbers::peer_text::peer_text(&h.owner),
            );
            let gone = held
                .as_ref()
                .and_then(|h| h.process.as_ref())
                .is_some_and(holder_gone);
            if gone {
                tracing::warn!(
                    "taking over {} from {shown}: that process no longer runs on this machine",
                    store.url_of(LOCK_FILE)
                );
            } else if age_ms < stale.as_millis() as u64 {
                return Err(LockError::Held {
                    url: store.url_of(LOCK_FILE),
                    owner: shown,
                    age_s: age_ms / 1000,
                    stale_s: stale.as_secs(),
                });
            } else {
                tracing::warn!(
                    "taking over {} from {shown} (heartbeat {} s old, stale after {} s)",
                    store.url_of(LOCK_FILE),
                    age_ms / 1000,
                    stale.as_secs()
                );
            }
            store.delete(LOCK_FILE).await?;
        }
        Err(LockError::Held {
            url: store.url_of(LOCK_FILE),
            owner: "another coordinator taking it over at the same time".into(),
            age_s: 0,
            stale_s: stale.as_secs(),
        })
    }

    fn held(store: RunStore, token: String, stale: Duration, asked: Instant) -> RunLock {
        let fence = Arc::new(LockFence {
            store: store.clone(),
            token,
            window: stale / 2,
            state: tokio::sync::Mutex::new(FenceState::Confirmed(asked)),
        });
        let heartbeat = tokio::spawn(refresh(fence.clone(), stale));
        RunLock {
            fenced: store.fenced(fence.clone()),
            fence,
            heartbeat,
        }
    }

    /// The run location, fenced by this lock: write through this only.
    pub fn store(&self) -> RunStore {
        self.fenced.clone()
    }

    /// Reads the lock now: `Ok` when it is still this coordinator's (call
    /// it before a final write, such as marking the run complete).
    pub async fn confirm(&self) -> Result<(), LockError> {
        let mut state = self.fence.state.lock().await;
        self.fence
            .confirm(&mut state)
            .await
            .map_err(LockError::Lost)
    }

    /// Stops the heartbeat and deletes the lock if it is still this holder's.
    pub async fn release(self) -> Result<(), LockError> {
        self.heartbeat.abort();
        let store = &self.fence.store;
        if read(store)
            .await?
            .is_some_and(|b| b.token == self.fence.token)
        {
            store.delete(LOCK_FILE).await?;
        }
        Ok(())
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// The lock's content; `None` when it is missing or does not parse.
pub async fn read(store: &RunStore) -> Result<Option<LockBody>, StoreError> {
    Ok(store
        .get_opt_limited(LOCK_FILE, 64 << 10)
        .await
        .or_else(|e| match e {
            StoreError::TooLarge { .. } => Ok(None),
            e => Err(e),
        })?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

/// Confirms the lock (rewriting its heartbeat) every quarter of the stale
/// timeout; stops when another holder took it over.
async fn refresh(fence: Arc<LockFence>, stale: Duration) {
    let every = (stale / 4).max(Duration::from_millis(250));
    loop {
        tokio::time::sleep(every).await;
        let mut state = fence.state.lock().await;
        match fence.confirm(&mut state).await {
            Ok(()) => {}
            Err(why) if matches!(*state, FenceState::Lost(_)) => {
                tracing::error!("{why}");
                return;
            }
            Err(why) => tracing::warn!("{why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &tempfile::TempDir) -> RunStore {
        RunStore::open(dir.path().to_str().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_lock_whose_process_is_gone_is_taken_over_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir);
        // A child process that has exited: its pid no longer names it.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = runfiles::procstat::start_ticks(pid);
        child.wait().unwrap();
        let (boot_id, pid_ns) = machine().unwrap();
        let dead = LockBody {
            owner: "here pid gone".into(),
            token: "t".into(),
            heartbeat_ms: now_ms(),
            process: Some(HolderProcess {
                boot_id,
                pid_ns,
                pid,
                start_ticks: start.unwrap_or(1),
            }),
        };
        s.put(LOCK_FILE, serde_json::to_vec(&dead).unwrap())
            .await
            .unwrap();
        let lock = RunLock::acquire(&s, Duration::from_secs(120))
            .await
            .unwrap();
        // A fresh lock of a live process on this machine is not.
        let e = RunLock::acquire(&s, Duration::from_secs(120))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Held { .. }), "{e}");
        lock.release().await.unwrap();
        assert!(!s.exists(LOCK_FILE).await.unwrap());
    }

    #[tokio::test]
    async fn once_another_holds_the_lock_no_write_is_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir);
        // A stale timeout of 0: every write reads the lock first (a pause of
        // any length is past the window).
        let lock = RunLock::acquire(&s, Duration::ZERO).await.unwrap();
        let fenced = lock.store();
        fenced.put("before", b"1".to_vec()).await.unwrap();
        // The holder stopped (its heartbeat too) and another coordinator
        // took the lock over.
        lock.heartbeat.abort();
        let other = LockBody {
            owner: "successor".into(),
            token: "other".into(),
            heartbeat_ms: now_ms(),
            process: None,
        };
        s.put(LOCK_FILE, serde_json::to_vec(&other).unwrap())
            .await
            .unwrap();
        let e = fenced.put("after", b"2".to_vec()).await.unwrap_err();
        assert!(e.to_string().contains("taken over by successor"), "{e}");
        assert!(!s.exists("after").await.unwrap());
        assert!(fenced.delete("before").await.is_err(), "deletes too");
        assert!(matches!(lock.confirm().await, Err(LockError::Lost(_))));
        lock.release().await.unwrap();
        assert!(
            s.exists(LOCK_FILE).await.unwrap(),
            "the successor's lock stays"
        );
    }

    #[tokio::test]
    async fn a_confirmation_admits_writes_for_half_the_stale_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir);
        let lock = RunLock::acquire(&s, Duration::from_secs(600))
            .await
            .unwrap();
        s.delete(LOCK_FILE).await.unwrap();
        // Within the window nothing is read: a successor could only take a
        // lock this fresh over by force (`--take-over-lock`).
        lock.store().put("within", b"1".to_vec()).await.unwrap();
        // A final write confirms first, whatever the time.
        let e = lock.confirm().await.unwrap_err().to_string();
        assert!(e.contains("taken over by nobody"), "{e}");
        assert!(lock.store().put("after", b"2".to_vec()).await.is_err());
    }
}
