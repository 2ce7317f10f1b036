//! The lease runner, one for every kind of lease ([`LeaseKind`]): resume
//! from stored results ([`super::resume`]), then serve the remaining units
//! over QUIC (scheduler, hub, local workers, quarantine, redundancy), store
//! each accepted result create-only under the kind's prefix with its record
//! in the manifest, and merge it into a running total, so memory holds one
//! result at a time. Collection ([`super::execute`]) and evaluation
//! (`eval::evaluate`) are this runner with their own kind, run
//! under the run location's lock ([`locked`]).

use super::crew::Crew;
use super::record::{PartialRecord, Recorder};
use super::resume::{self, add_into, merge_into};
use super::{progress, serve, RunError, RunSetup};
use crate::lease::LeaseKind;
use crate::net::hub::{Hub, WorkerInfo};
use numbers::ChunkRange;
use protocol::wire::JobOptions;
use runfiles::lease::{Addend, LeaseOutput};
use sched::Scheduler;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

/// How one kind's leases are run.
#[derive(Clone, Debug)]
pub struct Leasing<'a> {
    /// The run: store, corpus index, model, `[run]` and `[cluster]`.
    pub setup: &'a RunSetup,
    /// How workers evaluate chunks (sent in the job).
    pub options: JobOptions,
    /// Fingerprint of everything that changes a result's numbers, recorded
    /// with each accepted result; stored results of another key are redone.
    pub settings: String,
    /// Fraction of units also computed by a second worker and compared.
    pub verify_fraction: f64,
    /// Show a progress bar over the corpus's tokens (on a terminal).
    pub progress: bool,
    /// The phase's name in progress lines (`collection`, `evaluation`).
    pub phase: &'static str,
}

impl<'a> Leasing<'a> {
    /// The leases of a phase that traces no routing (evaluation,
    /// responses) over `setup`, their results recorded under `settings`:
    /// the run's job options without traces, and the same share and salted
    /// sample of units as collection get a second worker's opinion.
    pub fn untraced(
        setup: &'a RunSetup,
        settings: String,
        phase: &'static str,
        progress: bool,
    ) -> Leasing<'a> {
        Leasing {
            setup,
            options: setup.run.job_options(protocol::wire::TraceStrides::both(0)),
            settings,
            verify_fraction: setup.run.verify_fraction,
            progress,
            phase,
        }
    }
}

/// What the runner did with a kind's leases, in figures: collection's
/// [`super::RunSummary`] and evaluation's outcome carry them as they are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaseFigures {
    /// Units in the lease plan.
    pub units: usize,
    /// Units reused from stored results.
    pub resumed: usize,
    /// Stored results that could not be reused and were recomputed:
    /// `(object name, why)`.
    pub rejected: Vec<(String, String)>,
    /// Units computed by this process.
    pub computed: usize,
    /// Leases retried (expired, failed or lost with their worker).
    pub retries: usize,
    /// Duplicate or late results dropped.
    pub duplicates: usize,
    /// Disagreements decided without a third worker (kept result
    /// unverified), described.
    pub unresolved: Vec<String>,
    /// Per-worker figures.
    pub workers: Vec<WorkerInfo>,
}

impl LeaseFigures {
    /// The figures of the worker called `name`, if it joined.
    pub fn worker(&self, name: &str) -> Option<&WorkerInfo> {
        self.workers.iter().find(|w| w.name == name)
    }
}

/// What the runner did, with the merge of every unit's result.
#[derive(Debug)]
pub struct Leased<T> {
    /// The merge of every unit's result (`None` without units).
    pub merged: Option<T>,
    /// What was resumed, computed, retried and by whom.
    pub leases: LeaseFigures,
}

/// Runs `work` holding the run location's lock ([`super::lock`]): a second
/// coordinator on the same location fails instead of writing beside it.
/// `work` gets `setup` with the lock's fenced store, so it writes only while
/// the lock is this coordinator's.
pub async fn locked<T, E, W, Fut>(setup: &RunSetup, work: W) -> Result<T, E>
where
    W: FnOnce(RunSetup) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<RunError>,
{
    let lock = super::lock::RunLock::acquire(&setup.store, setup.run.lock_stale())
        .await
        .map_err(RunError::from)?;
    let fenced = RunSetup {
        store: lock.store(),
        ..setup.clone()
    };
    let outcome = work(fenced).await;
    lock.release().await.map_err(RunError::from)?;
    outcome
}

/// Resumes what is stored of `units`, leases the rest to the `crew`'s
/// workers and returns the merge of them all.
pub async fn lease_all<K: LeaseKind>(
    l: &Leasing<'_>,
    units: Vec<ChunkRange>,
    kind: Arc<K>,
    crew: &mut Crew<'_>,
) -> Result<Leased<K::Output>, RunError> {
    let store = &l.setup.store;
    let what = K::Output::LABELS.output;
    let mut recorder = Recorder::open_table(store, K::table).await?;
    let resumed = resume::load(store, &units, &*kind, &mut recorder, &l.settings).await?;
    for (name, why) in &resumed.skipped {
        tracing::warn!("stored {what} {name} not reused: {why}");
    }
    for (name, why) in &resumed.rejected {
        tracing::warn!(
            "stored {what} {} REJECTED, recomputing it (moved under {}/): {why}",
            store.url_of(name),
            runfiles::layout::REJECTED_DIR
        );
    }
    let mut out = Leased {
        merged: resumed.merged,
        leases: LeaseFigures {
            units: units.len(),
            resumed: resumed.done.len(),
            rejected: resumed.rejected,
            ..LeaseFigures::default()
        },
    };
    if out.leases.resumed < out.leases.units {
        let resumed_measured = out.merged.as_ref().map_or(0, LeaseOutput::measured);
        let serving = Served {
            done: &resumed.done,
            recorder,
            resumed_measured,
        };
        let (more, hub) = serve_units(l, units, kind, serving, crew).await?;
        if let Some(p) = more {
            merge_into(&mut out.merged, p, || format!("this process's {what}s"))?;
        }
        let p = hub.sched().progress();
        out.leases.computed = p.accepted;
        out.leases.retries = p.retries;
        out.leases.duplicates = p.duplicates;
        out.leases.unresolved = hub.unresolved();
        out.leases.workers = hub.workers().into_values().collect();
    }
    Ok(out)
}

/// What serving starts from.
struct Served<'a> {
    done: &'a BTreeMap<ChunkRange, String>,
    recorder: Recorder,
    resumed_measured: u64,
}

/// Serves leases to the `crew` as a phase of its own until every unit is
/// done; returns the merge of the accepted results and the hub (for its
/// figures). On an error the crew is let go, told the coordinator stopped.
async fn serve_units<K: LeaseKind>(
    l: &Leasing<'_>,
    units: Vec<ChunkRange>,
    kind: Arc<K>,
    from: Served<'_>,
    crew: &mut Crew<'_>,
) -> Result<(Option<K::Output>, Arc<Hub<K>>), RunError> {
    let outcome = serve_phase(l, units, kind, from, crew).await;
    if let Err(e) = &outcome {
        crew.close(&Err::<(), _>(e)).await;
    }
    outcome
}

async fn serve_phase<K: LeaseKind>(
    l: &Leasing<'_>,
    units: Vec<ChunkRange>,
    kind: Arc<K>,
    mut from: Served<'_>,
    crew: &mut Crew<'_>,
) -> Result<(Option<K::Output>, Arc<Hub<K>>), RunError> {
    let (run, cluster, store) = (&l.setup.run, &l.setup.cluster, &l.setup.store);
    if !(0.0..=1.0).contains(&l.verify_fraction) {
        return Err(RunError::Setup(format!(
            "[run] verify_fraction = {} is not between 0 and 1",
            l.verify_fraction
        )));
    }
    let open = crew.open(l.setup)?;
    let sched = Scheduler::new(
        serve::sched_config(run, l.verify_fraction, open.salt.clone()),
        units,
        from.done,
    );
    let job = serve::job_info(l.setup, l.options.clone(), l.verify_fraction > 0.0);
    let layout = kind.layout();
    let items = kind.items();
    let (hub, deliveries) = Hub::new(
        sched,
        job,
        kind,
        store.clone(),
        run.ingest_slots as usize,
        cluster.max_staged_mib.saturating_mul(1 << 20),
    );
    let hub = Arc::new(hub);
    open.lobby.begin(hub.clone());
    let (items_resumed, items_total) = hub.sched().chunks_done();
    let mut bar = (l.progress && progress::on_terminal()).then(|| match items {
        Some(label) => {
            progress::Progress::over_items(label, items_total, items_resumed, from.resumed_measured)
        }
        None => progress::Progress::new(l.setup.index.n_tokens, from.resumed_measured),
    });
    let report = bar.is_none().then(|| {
        let p = hub.sched().progress();
        let report = progress::Report::new(
            l.phase,
            p.units,
            (l.progress && items.is_none()).then_some(l.setup.index.n_tokens),
            (p.done, from.resumed_measured),
            std::time::Duration::from_secs(run.progress_interval_s.max(1)),
        );
        let report = match items {
            Some(label) => report.with_items(label, items_total, items_resumed),
            None => report,
        };
        (report, from.resumed_measured)
    });
    tracing::info!(
        phase = l.phase,
        units = hub.sched().progress().units,
        resumed = from.done.len(),
        "serving the phase's leases to the run's workers"
    );
    let mut running: Option<K::Output> = None;
    let mut serving = serve::Serving::new(&hub, deliveries, &mut open.children, report);
    let outcome: Result<(), RunError> = async {
        while let Some(d) = serving.next().await? {
            let name = layout.object(crate::lease::span(&d.units));
            let rec = PartialRecord {
                sha256: d.sha256.clone(),
                settings: l.settings.clone(),
                units: if d.units.len() > 1 {
                    d.units.clone()
                } else {
                    Vec::new()
                },
            };
            let staged = d.staged.as_deref();
            from.recorder.accept(&name, &d.bytes, staged, rec).await?;
            if let Some(bar) = &mut bar {
                let items_done = hub.sched().chunks_done().0;
                bar.advance(d.output.measured(), items_done, &hub.workers());
            }
            let lease = K::Output::LABELS.lease;
            tracing::info!(worker = %d.worker, first = %d.units[0], units = d.units.len(), "{lease} merged");
            add_into(&mut running, d.output, || name)?;
            // Merged: the next result may take its ingest slot.
            drop(d.slot);
        }
        Ok(())
    }
    .await;
    if let Some(bar) = bar {
        bar.finish();
    }
    open.lobby.end();
    outcome?;
    serve::clear_staging(store).await?;
    Ok((running, hub))
}
