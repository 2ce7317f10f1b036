//! Serving eval leases: the same scheduler, QUIC server, join proof and
//! local workers as collection, with a hub that welcomes workers with the
//! eval job and checks eval partials. Each accepted eval partial is stored
//! create-only under `eval/partials/` (its hash and settings key recorded
//! first in the manifest) as it arrives, and merged into a running total.

use super::{EvalRunError, EvalSetup};
use crate::net::hub::eval::EvalDelivery;
use crate::net::hub::{Hub, WorkerInfo};
use crate::run::record::{PartialRecord, Recorder};
use crate::run::{all_exited, listen, secret, stop_children, Listening};
use crate::sched::{SchedConfig, Scheduler};
use common::artifacts::names::CORPUS_DIR;
use common::eval::{names, EvalPartial};
use common::store::RunStore;
use common::wire::{JobInfo, STAGING_DIR};
use common::ChunkRange;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// What the session did.
#[derive(Debug, Default)]
pub struct SessionStats {
    /// Units accepted in this process.
    pub accepted: usize,
    /// Leases retried.
    pub retries: usize,
    /// Per-worker figures (tokens are scored positions).
    pub workers: Vec<WorkerInfo>,
}

/// How accepted eval partials are stored and recorded.
pub struct Storing {
    /// The manifest's `eval_partials` table.
    pub recorder: Recorder,
    /// The settings key recorded with each.
    pub settings: String,
}

/// Serves the units not in `done` until each has an accepted eval partial;
/// returns their merge.
pub async fn serve<F>(
    setup: &EvalSetup,
    units: Vec<ChunkRange>,
    done: &BTreeMap<ChunkRange, String>,
    mut storing: Storing,
    on_listen: F,
) -> Result<(Option<EvalPartial>, SessionStats), EvalRunError>
where
    F: FnOnce(&Listening) -> Result<Vec<tokio::process::Child>, crate::run::RunError>,
{
    let base = &setup.base;
    let (run, cluster, store) = (&base.run, &base.cluster, &base.store);
    let heartbeat_timeout = Duration::from_secs(run.heartbeat_timeout_s.max(1));
    let acceptance = Arc::new(crate::run::acceptance(base, &units).await?);
    let sched = Scheduler::new(
        SchedConfig {
            lease_timeout: Duration::from_secs(run.lease_timeout_s.max(1)),
            heartbeat_timeout,
            max_attempts: run.max_attempts.max(1),
            max_worker_failures: run.max_worker_failures.max(1),
            idle_poll: Duration::from_millis(200),
            // Eval partials are checked against the coordinator's own slices;
            // no unit is sent to a second worker.
            verify_fraction: 0.0,
        },
        units,
        done,
    );
    let max_frame = cluster.max_frame_mib.clamp(1, 1024) << 20;
    let job = JobInfo {
        run_url: store.url().to_string(),
        corpus_url: store.url_of(CORPUS_DIR),
        model_sha256: base.model_sha256.clone(),
        model_path: base.model_path.display().to_string(),
        options: run.job_options(common::wire::TraceStrides::both(0)),
        max_inline_bytes: u64::from(max_frame - (1 << 16)),
        heartbeat_ms: (heartbeat_timeout / 4).as_millis() as u64,
    };
    let (secret, _) = secret(cluster)?;
    let (hub, mut deliveries) = Hub::new_eval(
        sched,
        secret.clone(),
        job,
        acceptance,
        store.clone(),
        setup.job.clone(),
        base.index.chunks_sha256.clone(),
    );
    let hub = Arc::new(hub);
    let (server, listening) = listen(cluster, hub.clone(), secret, max_frame, heartbeat_timeout)?;
    let mut children = on_listen(&listening)?;
    let n_local = children.len() as u32;
    let mut running: Option<EvalPartial> = None;
    let mut merged_units = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let outcome = loop {
        tokio::select! {
            d = deliveries.recv() => {
                let Some(d) = d else { break Err(EvalRunError::Setup("the delivery channel closed".into())) };
                if let Err(e) = accept(store, &mut storing, d, &mut running).await {
                    break Err(e);
                }
                merged_units += 1;
            }
            _ = tick.tick() => {
                let now = hub.now();
                for e in hub.sched().tick(now) {
                    tracing::warn!("{e:?}; the chunks go back to the queue");
                }
                if let Some(e) = hub.sched().failure().cloned() {
                    break Err(crate::run::RunError::from(e).into());
                }
                let p = hub.sched().progress();
                if p.done == p.units && p.accepted == merged_units {
                    break Ok(());
                }
                if n_local > 0 && all_exited(&mut children) && hub.workers().values().all(|w| !w.connected) {
                    break Err(crate::run::RunError::WorkersGone(n_local).into());
                }
            }
        }
    };
    server.shutdown().await;
    stop_children(&mut children).await;
    outcome?;
    // Staged copies of late or duplicate results were never promoted.
    for name in store.list(STAGING_DIR).await? {
        store.delete(&name).await?;
    }
    let p = hub.sched().progress();
    Ok((
        running,
        SessionStats {
            accepted: p.accepted,
            retries: p.retries,
            workers: hub.workers().into_values().collect(),
        },
    ))
}

/// Records and stores an accepted eval partial create-only under its final
/// name, removes its staged copy, and merges it.
async fn accept(
    store: &RunStore,
    storing: &mut Storing,
    d: EvalDelivery,
    running: &mut Option<EvalPartial>,
) -> Result<(), EvalRunError> {
    let name = names::partial(d.range);
    let rec = PartialRecord {
        sha256: d.sha256.clone(),
        settings: storing.settings.clone(),
    };
    storing.recorder.accept(&name, &d.bytes, rec).await?;
    if let Some(staged) = &d.staged {
        store.delete(staged).await?;
    }
    tracing::info!(worker = %d.worker, range = %d.range, "eval lease merged");
    match running {
        None => *running = Some(d.partial),
        Some(m) => m
            .merge(&d.partial)
            .map_err(|source| EvalRunError::Merge { what: name, source })?,
    }
    Ok(())
}
