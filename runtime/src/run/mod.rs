//! `coordinator run`: corpus preparation, leases to workers over QUIC, exact
//! merge, artifacts, then the checks and scoring.
//!
//! - its `[run]`, `[cluster]` and `[storage]` config sections are
//!   [`config::run`].
//! - [`accept`]: the checks a partial passes before it is merged.
//! - [`record`]: accepted partials stored create-only, their hashes in the manifest.
//! - [`resume`]: results already stored are reused, not recomputed.
//! - [`runner`]: the lease runner every kind of lease shares (collection
//!   here, evaluation in `eval`); [`serve`]: its lease loop.
//! - [`lock`]: one coordinator writes to a run location at a time.
//! - [`crew`]: one server and the local workers for every phase of a run.
//! - [`local`]: `--local-workers N` worker processes.
//! - [`progress`]: the progress bar.
//! - [`trace_plan`]: the per-split trace budget as a chunk stride.
//! - [`respond`]: the response phase's leases (prompts, before the corpus).
//! - [`execute`] is the collection itself, given a prepared corpus;
//!   `coordinator run` (the pipeline module) wraps it with corpus preparation
//!   and the later stages.

pub mod accept;
pub mod crew;
pub mod join_hint;
pub mod local;
pub mod lock;
pub mod progress;
pub mod record;
pub mod respond;
pub mod resume;
pub mod runner;
pub mod serve;
pub mod trace_plan;

use crate::net::lobby::Lobby;
use crate::net::persist::Kept;
use crate::net::server::{Server, ServerOptions};
use crate::net::tls::{server_names, Identity};
use crate::net::NetError;
use config::run::{ClusterSettings, RunSettings};
use crew::Crew;
use crew::OnListen;
use join_hint::JoinHint;
use local::SECRET_ENV;
use protocol::secret::JoinSecret;
use runfiles::artifacts::write_results;
use runfiles::corpus::CorpusIndex;
use runfiles::file_error::FileError;
use runfiles::layout;
use runfiles::store::{RunStore, StoreError};
use runner::{lease_all, locked, LeaseFigures, Leasing};
use sched::plan;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Settings, secret or worker binary unusable.
    #[error("{0}")]
    Setup(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// TLS or endpoint.
    #[error(transparent)]
    Net(#[from] NetError),
    /// Results (partials, eval partials) that do not combine.
    #[error("merging {what}: {source}")]
    Merge {
        /// The result being merged.
        what: String,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The scheduler gave up (a lease failed too often).
    #[error(transparent)]
    Sched(#[from] sched::SchedError),
    /// Artifacts could not be written.
    #[error(transparent)]
    Artifacts(#[from] runfiles::artifacts::ArtifactError),
    /// Another coordinator holds the run location.
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    /// The manifest's record of accepted partials.
    #[error(transparent)]
    Record(#[from] record::RecordError),
    /// Every local worker exited before the work was done.
    #[error("all {0} local workers exited before the run finished (see their messages above)")]
    WorkersGone(u32),
}

/// Everything [`execute`] needs: a run whose corpus is prepared.
#[derive(Clone, Debug)]
pub struct RunSetup {
    /// The run location.
    pub store: RunStore,
    /// The corpus index under `corpus/`.
    pub index: CorpusIndex,
    /// SHA-256 of the model.
    pub model_sha256: String,
    /// Model path sent to workers.
    pub model_path: PathBuf,
    /// The model's mmproj sent to workers, when the corpus has images.
    pub mmproj: Option<protocol::wire::MmprojFile>,
    /// `[run]`.
    pub run: RunSettings,
    /// `[cluster]`.
    pub cluster: ClusterSettings,
}

impl RunSetup {
    /// The chunk strides that meet `[run] trace_tokens_per_split` for each
    /// split of the stored manifest's chunk plan (the whole corpus's size
    /// for both when the run has no manifest).
    pub async fn trace_every(&self) -> Result<protocol::wire::TraceStrides, RunError> {
        let manifest = runfiles::manifest::read(&self.store)
            .await
            .map_err(|e| RunError::Setup(e.to_string()))?
            .map(|m| m.corpus);
        let (fit, heldout) = match manifest {
            Some(m) => (m.chunk_plan.fit_tokens, m.chunk_plan.heldout_tokens),
            None => (self.index.n_tokens, self.index.n_tokens),
        };
        Ok(trace_plan::trace_strides(
            self.run.trace_tokens_per_split,
            fit,
            heldout,
        ))
    }
}

/// Where workers connect, handed to the caller once the server listens.
#[derive(Clone, Debug)]
pub struct Listening {
    /// Bound address.
    pub addr: SocketAddr,
    /// SHA-256 of the coordinator's certificate.
    pub pin: String,
    /// The join secret.
    pub secret: JoinSecret,
    /// What a worker elsewhere needs to join.
    pub hint: JoinHint,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunSummary {
    /// The partials' leases: resumed, computed, retried, by whom.
    pub leases: LeaseFigures,
    /// Fit tokens in the merged result.
    pub fit_tokens: u64,
    /// The manifest's `trace` section (budget, stride, tokens, bytes).
    pub trace: Option<runfiles::manifest::TraceRecord>,
}

/// Refuses a configured join secret (file or variable) that is unreadable,
/// short or weak, before a run writes anything.
pub fn check_secret(cluster: &ClusterSettings) -> Result<(), RunError> {
    secret(cluster).map(|_| ())
}

/// The join secret: `[cluster] secret_file`, else `MOE_CENSUS_JOIN_SECRET`,
/// else a random one only local workers learn (`false`: not shared).
pub fn secret(cluster: &ClusterSettings) -> Result<(JoinSecret, bool), RunError> {
    let setup = |e: protocol::secret::SecretError| RunError::Setup(format!("[cluster] {e}"));
    if let Some(path) = &cluster.secret_file {
        return Ok((JoinSecret::from_file(path).map_err(setup)?, true));
    }
    if let Ok(s) = std::env::var(SECRET_ENV) {
        let secret =
            JoinSecret::new(s.as_bytes(), &format!("variable {SECRET_ENV}")).map_err(setup)?;
        return Ok((secret, true));
    }
    Ok((JoinSecret::generate(), false))
}

/// Collects every unit of the lease plan not already stored, merges
/// exactly, writes the merged partial and the artifacts. `on_listen` is
/// called once the server accepts workers (to start local ones); it is not
/// called when everything was already stored. The workers leave when it
/// returns.
/// The run location is locked for the whole call ([`lock`]): a second
/// coordinator on the same location fails instead of writing beside it, and
/// this one writes only while it holds the lock.
pub async fn execute(setup: &RunSetup, on_listen: impl OnListen) -> Result<RunSummary, RunError> {
    locked(setup, |fenced| async move {
        let mut crew = Crew::new(on_listen);
        let outcome = execute_locked(&fenced, &mut crew).await;
        crew.close(&outcome.as_ref().map(|_| ())).await;
        outcome
    })
    .await
}

/// [`execute`] for a caller that holds the run's lock (`setup.store` must be
/// the lock's fenced store, [`lock::RunLock::store`]), with the run's
/// `crew`, which stays for the caller's later phases.
pub async fn execute_locked(setup: &RunSetup, crew: &mut Crew<'_>) -> Result<RunSummary, RunError> {
    let store = &setup.store;
    record_model_path(setup).await?;
    let units = plan(setup.index.n_chunks, setup.run.lease_chunks);
    let options = setup.run.job_options(setup.trace_every().await?);
    let leasing = Leasing {
        setup,
        settings: record::settings_key(&setup.model_sha256, &setup.index.chunks_sha256, &options),
        options,
        verify_fraction: setup.run.verify_fraction,
        progress: true,
        phase: "collection",
    };
    let acceptance = Arc::new(acceptance(setup, &units).await?);
    let leased = lease_all(&leasing, units, acceptance, crew).await?;
    let mut summary = RunSummary {
        leases: leased.leases,
        ..RunSummary::default()
    };
    let merged = leased
        .merged
        .ok_or_else(|| RunError::Setup("the corpus has no chunks".into()))?;
    store
        .put_parts(layout::MERGED_PARTIAL, merged.to_parts())
        .await?;
    let saliency = write_results(store, &merged).await?;
    summary.fit_tokens = saliency
        .split(numbers::Split::Fit)
        .map_or(0, |s| s.n_tokens);
    summary.trace = Some(
        trace_plan::manifest_entry(
            store,
            setup.run.trace_tokens_per_split,
            setup.trace_every().await?,
            saliency.trace_tokens_written,
        )
        .await
        .map_err(|e| RunError::Setup(format!("measuring the trace parts: {e}")))?,
    );
    Ok(summary)
}

/// Records the model file (and mmproj) collection runs with in the run's
/// manifest, so later stages find it without `--model` (a run without a
/// manifest gets none: only the corpus stage creates one).
async fn record_model_path(setup: &RunSetup) -> Result<(), RunError> {
    let setup_err = |e: runfiles::manifest::ManifestError| RunError::Setup(e.to_string());
    let Some(mut m) = runfiles::manifest::read(&setup.store)
        .await
        .map_err(setup_err)?
    else {
        return Ok(());
    };
    if (m.model_path.as_ref(), &m.mmproj) != (Some(&setup.model_path), &setup.mmproj) {
        m.model_path = Some(setup.model_path.clone());
        m.mmproj = setup.mmproj.clone();
        runfiles::manifest::write(&setup.store, &m).await?;
    }
    Ok(())
}

/// The acceptance checks of a run, read from its corpus: the chunk table's
/// spans and, when the model file is there, the GGUF headers' expert facts
/// and importance-matrix entries (the coordinator binary always has it).
pub(crate) async fn acceptance(
    setup: &RunSetup,
    units: &[numbers::ChunkRange],
) -> Result<accept::Acceptance, RunError> {
    let corpus = setup.store.child("corpus");
    let table = corpus.get(runfiles::corpus::CHUNKS_FILE).await?;
    let what = corpus.url_of(runfiles::corpus::CHUNKS_FILE);
    let index = setup.index.clone();
    let units = units.to_vec();
    let (model, weights) = if setup.model_path.exists() {
        let path = &setup.model_path;
        (
            Some(gguf::model_check::moe_facts(path).map_err(RunError::Setup)?),
            Some(gguf::model_weights::ModelWeights::read(path).map_err(RunError::Setup)?),
        )
    } else {
        (None, None)
    };
    let model_sha = setup.model_sha256.clone();
    tokio::task::spawn_blocking(move || {
        let chunks = runfiles::corpus::read_chunks(table, None)?;
        let a = accept::Acceptance::new(&model_sha, &index, &chunks, &units, model)?;
        Ok::<_, String>(match weights {
            Some(w) => a.with_weights(w),
            None => a,
        })
    })
    .await
    .map_err(|e| RunError::Setup(format!("reading {what} panicked: {e}")))?
    .map_err(|e| RunError::Setup(format!("{what}: {e}")))
}

/// The coordinator's identity kept in `[cluster] identity_dir`, when one is set.
pub(crate) fn kept_identity(cluster: &ClusterSettings) -> Result<Option<Kept>, RunError> {
    Ok(match &cluster.identity_dir {
        Some(dir) => Some(Kept::open(dir)?),
        None => None,
    })
}

/// Starts the QUIC server for `lobby` with the `[cluster]` settings and the
/// `kept` identity (saved with the address now used), writes the join hint
/// to `[cluster] connect_file` when one is set, and returns the server with
/// what workers need to join.
pub(crate) fn listen(
    cluster: &ClusterSettings,
    mut kept: Option<Kept>,
    lobby: Arc<Lobby>,
    secret: JoinSecret,
    max_frame: u32,
    heartbeat_timeout: Duration,
) -> Result<(Server, Listening), RunError> {
    let names = server_names(&cluster.server_names);
    let listen: SocketAddr = cluster
        .listen
        .parse()
        .map_err(|e| RunError::Setup(format!("[cluster] listen {:?}: {e}", cluster.listen)))?;
    let identity = match (&mut kept, &cluster.ca_dir) {
        (Some(k), ca) => k.identity(&names, ca.as_deref())?,
        (None, Some(dir)) => Identity::from_ca(dir, &names)?,
        (None, None) => Identity::self_signed(&names)?,
    };
    let server = Server::spawn(
        &identity,
        ServerOptions {
            listen,
            reset_key: kept.as_ref().map(Kept::reset_key).transpose()?,
            preferred: kept.as_ref().and_then(|k| k.preferred_addr(listen)),
            max_connections: cluster.max_connections.max(1),
            max_pending_per_address: cluster.pending_per_address(),
            max_frame,
            frame_budget: (cluster.max_buffered_mib.max(1) as usize) << 20,
            login_timeout: Duration::from_millis(cluster.login_timeout_ms.max(100)),
            heartbeat_timeout,
        },
        lobby,
    )?;
    let (addr, pin) = (server.addr(), identity.fingerprint());
    if let Some(k) = &mut kept {
        k.record_addr(addr);
        k.save()?;
    }
    let listening = Listening {
        addr,
        hint: JoinHint::new(addr, &pin, cluster),
        pin,
        secret,
    };
    tracing::info!(addr = %listening.addr, pin = %listening.pin, "coordinator listening");
    if let Some(path) = &cluster.connect_file {
        let info = serde_json::to_vec_pretty(&listening.hint).unwrap_or_default();
        std::fs::write(path, info).map_err(|source| NetError::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok((server, listening))
}

/// Records the finished run in `manifest.json` (written last), with the
/// collection figures: `complete` only when every invariant held, so a run
/// that failed verification never looks finished. Other manifest fields are
/// kept as they are; a manifest that cannot be read back is left as it is.
pub async fn mark_finished(
    store: &RunStore,
    s: &RunSummary,
    verified: bool,
) -> Result<(), RunError> {
    use runfiles::manifest::{ManifestError, RunRecord, WorkerRecord};
    let mut manifest = runfiles::manifest::read_or_default(store)
        .await
        .map_err(|e| match e {
            ManifestError::Store(e) => RunError::Store(e),
            corrupt => RunError::Setup(format!(
                "{corrupt}; it was left as it is and the run is not marked finished"
            )),
        })?;
    let workers = s
        .leases
        .workers
        .iter()
        .map(|w| WorkerRecord {
            name: w.name.clone(),
            backend: w.backend.clone(),
            leases: w.leases,
            tokens: w.tokens,
            tokens_per_s: progress::throughput(w),
        })
        .collect();
    manifest.run = Some(RunRecord {
        complete: verified,
        verify_passed: verified,
        units: s.leases.units,
        leases_resumed: s.leases.resumed,
        leases_computed: s.leases.computed,
        retries: s.leases.retries,
        duplicates_dropped: s.leases.duplicates,
        workers,
    });
    if s.trace.is_some() {
        manifest.trace = s.trace.clone();
    }
    runfiles::manifest::write(store, &manifest).await?;
    Ok(())
}

/// Reads `corpus/index.json` of a run.
pub async fn read_index(store: &RunStore) -> Result<CorpusIndex, RunError> {
    CorpusIndex::read(&store.child(layout::CORPUS_DIR))
        .await
        .map_err(|e| match e {
            FileError::Store(e) => e.into(),
            e => RunError::Setup(e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `manifest` as the run's manifest, then marks the run finished
    /// (`verified` as given) over it.
    async fn finish_over(store: &RunStore, manifest: &[u8], verified: bool) -> Result<(), String> {
        store
            .put(runfiles::layout::MANIFEST_JSON, manifest.to_vec())
            .await
            .unwrap();
        mark_finished(store, &RunSummary::default(), verified)
            .await
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn a_corrupt_manifest_is_named_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        let corrupt = b"{\"model_sha256\": \"ab".to_vec();
        let err = finish_over(&store, &corrupt, true).await.unwrap_err();
        assert!(
            err.contains("manifest.json is not JSON") && err.contains("left as it is"),
            "{err}"
        );
        let kept = store.get(runfiles::layout::MANIFEST_JSON).await.unwrap();
        assert_eq!(kept.to_vec(), corrupt);

        let err = finish_over(&store, b"[1, 2]", true).await.unwrap_err();
        assert!(err.contains("not a JSON object"), "{err}");

        finish_over(&store, b"{\"model_sha256\": \"ab\"}", false)
            .await
            .unwrap();
        let m = runfiles::manifest::read(&store).await.unwrap().unwrap();
        assert_eq!(
            (m.corpus.model_sha256.as_str(), m.run.map(|r| r.complete)),
            ("ab", Some(false))
        );
    }
}
