//! The run-location lock: one coordinator writes to a run at a time.
//!
//! The lock is the object `run.lock`, created with a create-only put and
//! holding its owner (host, process, a random token) and a heartbeat
//! timestamp that the holder refreshes. A second coordinator finds it and
//! stops with an error naming the holder, unless the heartbeat is older than
//! the stale timeout (a crashed holder), in which case it takes the lock
//! over. A timeout of 0 takes over any lock (`coordinator run --take-over-lock`).

use common::store::{RunStore, StoreError};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Object name of the lock under the run.
pub use common::layout::LOCK_FILE;

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
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
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

/// A held lock; its heartbeat is refreshed in the background until
/// [`RunLock::release`] (or drop, which stops the heartbeat and leaves the
/// object to go stale).
#[derive(Debug)]
pub struct RunLock {
    store: RunStore,
    token: String,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl RunLock {
    /// Takes the lock of `store`; a lock whose heartbeat is older than
    /// `stale` is taken over (with a warning naming its holder).
    pub async fn acquire(store: &RunStore, stale: Duration) -> Result<RunLock, LockError> {
        let token = hex::encode(common::wire::random_bytes(16));
        let body = |token: &str| LockBody {
            owner: owner(),
            token: token.to_string(),
            heartbeat_ms: now_ms(),
        };
        let encode = |b: &LockBody| serde_json::to_vec(b).expect("the lock encodes");
        for _ in 0..2 {
            match store.put_new(LOCK_FILE, encode(&body(&token))).await {
                Ok(()) => {
                    let heartbeat = tokio::spawn(refresh(store.clone(), token.clone(), stale));
                    return Ok(RunLock {
                        store: store.clone(),
                        token,
                        heartbeat,
                    });
                }
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let held = read(store).await?;
            let age_ms = held
                .as_ref()
                .map_or(u64::MAX, |h| now_ms().saturating_sub(h.heartbeat_ms));
            let shown = held.as_ref().map_or_else(
                || "an unreadable lock".to_string(),
                |h| common::peer_text::peer_text(&h.owner),
            );
            if age_ms < stale.as_millis() as u64 {
                return Err(LockError::Held {
                    url: store.url_of(LOCK_FILE),
                    owner: shown,
                    age_s: age_ms / 1000,
                    stale_s: stale.as_secs(),
                });
            }
            tracing::warn!(
                "taking over {} from {shown} (heartbeat {} s old, stale after {} s)",
                store.url_of(LOCK_FILE),
                age_ms / 1000,
                stale.as_secs()
            );
            store.delete(LOCK_FILE).await?;
        }
        Err(LockError::Held {
            url: store.url_of(LOCK_FILE),
            owner: "another coordinator taking it over at the same time".into(),
            age_s: 0,
            stale_s: stale.as_secs(),
        })
    }

    /// Stops the heartbeat and deletes the lock if it is still this holder's.
    pub async fn release(self) -> Result<(), LockError> {
        self.heartbeat.abort();
        if read(&self.store)
            .await?
            .is_some_and(|b| b.token == self.token)
        {
            self.store.delete(LOCK_FILE).await?;
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

/// Rewrites the heartbeat every quarter of the stale timeout while the lock
/// is ours; stops when another holder took it over.
async fn refresh(store: RunStore, token: String, stale: Duration) {
    let every = (stale / 4).max(Duration::from_millis(250));
    loop {
        tokio::time::sleep(every).await;
        match read(&store).await {
            Ok(Some(b)) if b.token == token => {
                let body = LockBody {
                    heartbeat_ms: now_ms(),
                    ..b
                };
                if let Err(e) = store
                    .put(
                        LOCK_FILE,
                        serde_json::to_vec(&body).expect("the lock encodes"),
                    )
                    .await
                {
                    tracing::warn!("refreshing {}: {e}", store.url_of(LOCK_FILE));
                }
            }
            Ok(_) => {
                tracing::error!(
                    "{} was taken over by another coordinator; this one no longer holds it",
                    store.url_of(LOCK_FILE)
                );
                return;
            }
            Err(e) => tracing::warn!("reading {}: {e}", store.url_of(LOCK_FILE)),
        }
    }
}
