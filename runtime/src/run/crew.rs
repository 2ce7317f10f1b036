//! The workers of one coordinator command across its phases: one QUIC
//! server ([`super::listen`]), opened when the first phase needs workers
//! and serving every later phase through its [`Lobby`], and the local
//! worker processes started then. Workers joined for collection stay for
//! the evaluation and shipping's evaluation, and leave when the crew is
//! closed: told the run is finished, or that it stopped (then they keep
//! reconnecting, for a restarted coordinator to resume). Every phase
//! samples its units for a second opinion under the crew's one salt
//! ([`sched::SampleSalt`]: the kept identity's, else one drawn when the
//! crew opens), so evaluation checks the same sample of units as collection.

use super::serve::{heartbeat_timeout, max_frame};
use super::{kept_identity, listen, secret, Listening, RunError, RunSetup};
use crate::net::lobby::Lobby;
use crate::net::server::Server;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Child;

/// Starts local workers once the server listens (the runner does not call
/// it when every unit was already stored); `Send`, so a run may be spawned.
pub trait OnListen:
    FnOnce(&super::Listening) -> Result<Vec<tokio::process::Child>, RunError> + Send
{
}

impl<F> OnListen for F where
    F: FnOnce(&super::Listening) -> Result<Vec<tokio::process::Child>, RunError> + Send
{
}

/// Starts local workers once the server listens (and prints how others
/// join): called once, when the first phase needs workers.
pub type StartWorkers<'a> = Box<dyn FnOnce(&Listening) -> Result<Vec<Child>, RunError> + Send + 'a>;

/// A command's workers, across its phases.
pub struct Crew<'a> {
    start: Option<StartWorkers<'a>>,
    open: Option<Open>,
}

/// A listening crew.
pub(crate) struct Open {
    server: Server,
    /// The phase being served, for the connections.
    pub(crate) lobby: Arc<Lobby>,
    /// The local worker processes.
    pub(crate) children: Vec<Child>,
    /// The salt of every phase's redundancy sample.
    pub(crate) salt: sched::SampleSalt,
}

impl<'a> Crew<'a> {
    /// A crew that starts its workers with `start` once it listens.
    pub fn new(start: impl OnListen + 'a) -> Crew<'a> {
        Crew {
            start: Some(Box::new(start)),
            open: None,
        }
    }

    /// The listening crew: the server is started with `setup`'s `[cluster]`
    /// and `[run]` settings at the first call, and the workers with it.
    pub(crate) fn open(&mut self, setup: &RunSetup) -> Result<&mut Open, RunError> {
        if self.open.is_none() {
            let Some(start) = self.start.take() else {
                return Err(RunError::Setup(
                    "the run's workers were already let go".into(),
                ));
            };
            let cluster = &setup.cluster;
            let (secret, shared) = secret(cluster)?;
            if !shared {
                tracing::info!("no join secret configured: only local workers can join");
            }
            let lobby = Arc::new(Lobby::new(secret.clone()));
            let (server, listening) = listen(
                cluster,
                kept_identity(cluster)?,
                lobby.clone(),
                secret,
                max_frame(cluster),
                heartbeat_timeout(&setup.run),
            )?;
            // The kept identity holds the sample's salt: a restart samples
            // the same units. (Read after `listen` saved the address.)
            let salt = match kept_identity(cluster)? {
                Some(mut k) => k.sample_salt()?,
                None => sched::SampleSalt::random(),
            };
            let children = start(&listening)?;
            self.open = Some(Open {
                server,
                lobby,
                children,
                salt,
            });
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    /// Lets the workers go: told the run is finished when `outcome` is
    /// `Ok` (the local workers leave by themselves, or are killed after
    /// 5 s), else that the coordinator stopped, naming the error (workers
    /// elsewhere keep reconnecting for a restarted coordinator; the local
    /// ones are killed at once). Nothing is left to serve afterwards.
    pub async fn close<E: std::fmt::Display>(&mut self, outcome: &Result<(), E>) {
        self.start = None;
        let Some(mut open) = self.open.take() else {
            return;
        };
        if outcome.is_err() && !open.children.is_empty() {
            tracing::info!("stopping {} local workers", open.children.len());
            for c in open.children.iter_mut() {
                let _ = c.start_kill();
            }
        }
        open.server.shutdown(outcome).await;
        for c in open.children.iter_mut() {
            if tokio::time::timeout(Duration::from_secs(5), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}
