//! The runner's lease loop: the scheduler's
//! configuration and the job every worker is sent, serving leases until
//! every unit is accepted and merged, and the clean-up after it.

use super::progress::Report;
use super::{RunError, RunSetup};
use crate::lease::{AddendOf, LeaseKind};
use crate::net::hub::{Delivery, Hub};
use config::run::{ClusterSettings, RunSettings};
use protocol::wire::{Checkpoint, JobInfo, JobOptions};
use runfiles::layout::CORPUS_DIR;
use runfiles::layout::STAGING_DIR;
use runfiles::store::{RunStore, StoreError};
use sched::{SampleSalt, SchedConfig};
use std::time::Duration;
use tokio::process::Child;
use tokio::sync::mpsc;

/// Silence after which a worker's leases and connection are given up.
pub(crate) fn heartbeat_timeout(run: &RunSettings) -> Duration {
    Duration::from_secs(run.heartbeat_timeout_s.max(1))
}

/// The most bytes one frame of a joined worker may hold.
pub(crate) fn max_frame(cluster: &ClusterSettings) -> u32 {
    cluster.max_frame_mib.clamp(1, 1024) << 20
}

/// The scheduler's configuration for `run`'s leases, with `verify_fraction`
/// of the units (sampled under `sample_salt`) also sent to a second worker.
pub(crate) fn sched_config(
    run: &RunSettings,
    verify_fraction: f64,
    sample_salt: SampleSalt,
) -> SchedConfig {
    SchedConfig {
        lease_timeout: Duration::from_secs(run.lease_timeout_s.max(1)),
        heartbeat_timeout: heartbeat_timeout(run),
        max_attempts: run.max_attempts.max(1),
        max_worker_failures: run.max_worker_failures.max(1),
        idle_poll: Duration::from_millis(200),
        verify_fraction,
        sample_salt,
        quarantine: Duration::from_secs(run.quarantine_s),
        disagreement_wait: Duration::from_secs(run.disagreement_wait_s),
        no_worker_grace: Duration::from_secs(run.no_worker_grace_s),
    }
}

/// The job every worker of `setup` is sent after its proof, evaluating
/// chunks with `options`. With `redundancy`, every lease is shipped alone
/// (a checked lease must be compared with another worker's result of the
/// same lease, and a worker must not tell it from the others).
pub(crate) fn job_info(setup: &RunSetup, options: JobOptions, redundancy: bool) -> JobInfo {
    let store = &setup.store;
    JobInfo {
        run_url: store.url().to_string(),
        corpus_url: store.url_of(CORPUS_DIR),
        model_sha256: setup.model_sha256.clone(),
        model_path: setup.model_path.display().to_string(),
        mmproj: setup.mmproj.clone(),
        options,
        max_inline_bytes: u64::from(max_frame(&setup.cluster) - (1 << 16)),
        heartbeat_ms: (heartbeat_timeout(&setup.run) / 4).as_millis() as u64,
        checkpoint: Checkpoint {
            leases: if redundancy {
                1
            } else {
                setup.run.checkpoint_leases.max(1)
            },
            seconds: setup.run.checkpoint_s,
        },
    }
}

/// Leases being served until every unit has been accepted and merged: the
/// caller takes accepted results one by one with [`Serving::next`] and
/// merges each before asking for the next.
pub(crate) struct Serving<'a, K: LeaseKind> {
    hub: &'a Hub<K>,
    deliveries: mpsc::UnboundedReceiver<Delivery<AddendOf<K>>>,
    children: &'a mut [Child],
    tick: tokio::time::Interval,
    handed_out: usize,
    /// The progress lines, with the tokens resumed from storage (`None`:
    /// a bar shows the progress).
    report: Option<(Report, u64)>,
}

impl<'a, K: LeaseKind> Serving<'a, K> {
    /// Serves `hub`'s leases; accepted results come from `deliveries`,
    /// `children` are the local worker processes, and `report` logs the
    /// progress (with the tokens resumed from storage).
    pub(crate) fn new(
        hub: &'a Hub<K>,
        deliveries: mpsc::UnboundedReceiver<Delivery<AddendOf<K>>>,
        children: &'a mut [Child],
        report: Option<(Report, u64)>,
    ) -> Self {
        Serving {
            hub,
            deliveries,
            children,
            tick: tokio::time::interval(Duration::from_millis(250)),
            handed_out: 0,
            report,
        }
    }

    /// The next accepted result, or `None` once every unit is done and
    /// every accepted result was handed out; the scheduler's clock sends
    /// expired leases back to the queue meanwhile. An error when a unit
    /// failed for good, the delivery channel closed, or the local workers
    /// have all exited with no worker connected.
    pub(crate) async fn next(&mut self) -> Result<Option<Delivery<AddendOf<K>>>, RunError> {
        let hub = self.hub;
        loop {
            tokio::select! {
                d = self.deliveries.recv() => {
                    let d = d.ok_or_else(|| RunError::Setup("the delivery channel closed".into()))?;
                    // Counted in units, as the scheduler counts accepted ones.
                    self.handed_out += d.units.len();
                    return Ok(Some(d));
                }
                _ = self.tick.tick() => {
                    // A coordinator that lost the run's lock stops at once.
                    hub.store().admit(super::lock::LOCK_FILE).await?;
                    hub.tick();
                    if let Some(e) = hub.sched().failure().cloned() {
                        return Err(e.into());
                    }
                    let p = hub.sched().progress();
                    if let Some((report, resumed_tokens)) = &mut self.report {
                        let workers = hub.workers();
                        let tokens = workers.values().map(|w| w.tokens).sum::<u64>();
                        let connected = workers.values().filter(|w| w.connected).count();
                        let items = hub.sched().chunks_done().0;
                        report.tick(p.done, items, *resumed_tokens + tokens, connected);
                    }
                    if p.done == p.units && p.accepted == self.handed_out {
                        // The caller stored each result before asking again.
                        hub.set_all_stored();
                        return Ok(None);
                    }
                    let n_local = self.children.len() as u32;
                    if n_local > 0
                        && all_exited(self.children)
                        && hub.workers().values().all(|w| !w.connected)
                    {
                        return Err(RunError::WorkersGone(n_local));
                    }
                }
            }
        }
    }
}

/// Removes the staged copies of late or duplicate results, which were
/// never promoted to a final name.
pub(crate) async fn clear_staging(store: &RunStore) -> Result<(), StoreError> {
    for name in store.list(STAGING_DIR).await? {
        store.delete(&name).await?;
    }
    Ok(())
}

/// Whether every local worker process has exited.
pub(crate) fn all_exited(children: &mut [Child]) -> bool {
    children
        .iter_mut()
        .all(|c| matches!(c.try_wait(), Ok(Some(_))))
}
