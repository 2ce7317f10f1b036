//! Serving eval leases: the same scheduler, QUIC server, join proof, local
//! workers and lease loop ([`crate::run::serve`]) as collection, with a hub
//! that welcomes workers with the eval job and checks eval partials. Each
//! accepted eval partial is stored create-only under `eval/partials/` (its
//! hash and settings key recorded first in the manifest) as it arrives, and
//! merged into a running total.

use super::{EvalRunError, EvalSetup};
use crate::net::hub::eval::EvalDelivery;
use crate::net::hub::{Hub, WorkerInfo};
use crate::run::record::{PartialRecord, Recorder};
use crate::run::{listen, secret, serve, Listening};
use crate::sched::Scheduler;
use common::eval::{names, EvalPartial};
use common::store::RunStore;
use common::ChunkRange;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    let (cluster, store) = (&base.cluster, &base.store);
    let acceptance = Arc::new(crate::run::acceptance(base, &units).await?);
    // Eval partials are checked against the coordinator's own slices; no
    // unit is sent to a second worker.
    let sched = Scheduler::new(serve::sched_config(&base.run, 0.0), units, done);
    let job = serve::job_info(
        base,
        base.run.job_options(common::wire::TraceStrides::both(0)),
    );
    let (secret, _) = secret(cluster)?;
    let (hub, deliveries) = Hub::new_eval(
        sched,
        secret.clone(),
        job,
        acceptance,
        store.clone(),
        setup.job.clone(),
        base.index.chunks_sha256.clone(),
    );
    let hub = Arc::new(hub);
    let (server, listening) = listen(
        cluster,
        hub.clone(),
        secret,
        serve::max_frame(cluster),
        serve::heartbeat_timeout(&base.run),
    )?;
    let mut children = on_listen(&listening)?;
    let mut running: Option<EvalPartial> = None;
    let mut serving = serve::Serving::new(&hub, deliveries, &mut children);
    let outcome: Result<(), EvalRunError> = async {
        while let Some(d) = serving.next().await? {
            accept(store, &mut storing, d, &mut running).await?;
        }
        Ok(())
    }
    .await;
    serve::wind_down(&server, &mut children, store, outcome).await?;
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
