//! `coordinator eval`: each pruned candidate against the base model (DESIGN
//! section 12): KL(p || q), perplexity and top-1 agreement over the run's
//! chunks, leased to the same workers by the same runner
//! ([`runtime::run::runner`]) as collection, with the same exact merge and
//! resume; results under `eval/`.
//!
//! - [`candidates`]: keep maps read from the run and sliced here too, so
//!   the coordinator knows each candidate's SHA-256.
//! - [`accept`]: the checks an eval partial passes (the eval lease kind).
//! - [`scoreable`]: which positions of each chunk are scored, in which group.
//! - [`artifacts`]: `eval/merged.bin`, `eval/summary.json`, `eval/summary.parquet`.
//! - [`prompts`]: the generation check's held-out prompts.
//! - [`recorded`]: `coordinator eval` on a recorded run (its settings and
//!   model from its manifest); its `[eval]` config section is
//!   [`config::eval`].

pub mod accept;
pub mod artifacts;
pub mod candidates;
pub mod prompts;
pub mod recorded;
pub mod scoreable;

use crate::MeasureError;
use gguf::hash::sha256_hex;
use numbers::eval::EvalSummary;
use protocol::wire::EvalJob;
use runfiles::layout::EvalLayout;
use runfiles::store::{RunStore, StoreError};
use runtime::run::crew::Crew;
use runtime::run::crew::OnListen;
use runtime::run::record::{settings_key, RecordError};
use runtime::run::runner::{lease_all, locked, LeaseFigures, Leasing};
use runtime::run::{RunError, RunSetup};
use sched::plan;
use stages::During;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use config::eval::EvalSettings;

/// Errors of an evaluation.
#[derive(Debug, thiserror::Error)]
pub enum EvalRunError {
    /// Settings, model or workers unusable.
    #[error("{0}")]
    Setup(String),
    /// The run config recorded in the run's manifest does not parse.
    #[error("the config recorded in {manifest} (is this a run location?): {problem}")]
    RecordedConfig {
        /// The manifest's URL.
        manifest: String,
        /// Why the config is unusable.
        problem: String,
    },
    /// A keep map cannot be evaluated.
    #[error("keep map {name}: {reason}")]
    KeepMap {
        /// Its name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The manifest's record of accepted eval partials.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// What evaluation shares with collection (runner, server, scheduler,
    /// lock, local workers, merge) failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Everything [`evaluate`] needs.
#[derive(Clone, Debug)]
pub struct EvalSetup {
    /// The run: its store, corpus index, base model (hash and path sent to
    /// workers), `[run]` (lease size, micro-batch, KV cache) and `[cluster]`.
    pub base: RunSetup,
    /// The candidates and scored positions.
    pub job: EvalJob,
    /// Where its objects go: [`runfiles::layout::EVAL`] (`coordinator eval`)
    /// or [`runfiles::layout::SHIP_EVAL`] (`coordinator ship`).
    pub out: EvalLayout,
    /// What the summary adds to the figures for choosing a candidate.
    pub choice: Choice,
}

/// What an evaluation's summary adds to the measured figures: each
/// candidate's model file size (the size-versus-KL table and its Pareto
/// front) and a KL budget (K per method, [`numbers::eval::choice`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Choice {
    /// Bytes of each candidate's model file, by candidate name.
    pub sizes: BTreeMap<String, u64>,
    /// Mean KL budget in nats, if one was given.
    pub kl_budget: Option<f64>,
    /// Which held-out figures must fit it.
    pub budget_scope: numbers::eval::BudgetScope,
}

/// The job of an evaluation ([`job`]): the base model's SHA-256, what
/// workers compute, and each candidate's file size.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// SHA-256 of the base model.
    pub base_sha256: String,
    /// The workers' job.
    pub job: EvalJob,
    /// Bytes of each candidate's sliced model file, by name.
    pub sizes: BTreeMap<String, u64>,
}

/// What an evaluation did.
#[derive(Debug)]
pub struct EvalOutcome {
    /// The figures written to `eval/summary.json`.
    pub summary: EvalSummary,
    /// The eval partials' leases: resumed, computed, retried, by whom
    /// (a worker's tokens are scored positions).
    pub leases: LeaseFigures,
    /// Where its objects are.
    pub out: EvalLayout,
}

/// The job of an evaluation: checks the base model against the run's
/// manifest, resolves the candidates' names (K given as a share of the
/// experts resolves against `saliency.json`) and slices their keep maps;
/// positions skip half of each chunk unless `skip_first` says otherwise.
pub async fn job(
    store: &RunStore,
    base: &Path,
    settings: &EvalSettings,
) -> Result<Prepared, MeasureError> {
    let splits = settings.split.splits();
    let base_sha256 = check_base(store, base).await?;
    let names = if settings.needs_shape() {
        let saliency = runfiles::saliency::read(store)
            .await
            .during("resolving keep-map sizes")?
            .saliency;
        settings
            .candidate_names(&config::eval::KeepShape::of(&saliency))
            .map_err(EvalRunError::Setup)?
    } else {
        settings.keep_maps.clone()
    };
    let names = candidates::import(store, &names).await?;
    let (candidates, sizes) = candidates::prepare(store, &names, base).await?;
    let index = runtime::run::read_index(store).await?;
    Ok(Prepared {
        base_sha256,
        job: EvalJob {
            candidates,
            skip_first: settings.skip_first_of(index.n_ctx),
            splits,
            models_in_memory: settings.models_in_memory,
            scratch_dir: settings.scratch_dir.clone(),
            generate: prompts::job(store, settings, &index).await?,
        },
        sizes,
    })
}

/// Checks the base model against the run's manifest (the model the run was
/// measured with); returns its SHA-256.
pub async fn check_base(store: &RunStore, base: &Path) -> Result<String, EvalRunError> {
    let base_sha256 = gguf::hash::model_sha256(base)
        .map_err(|e| EvalRunError::Setup(format!("base model {}: {e}", base.display())))?;
    let manifest = runfiles::manifest::read_or_default(store)
        .await
        .map_err(RecordError::from)?;
    match manifest.corpus.model_sha256.as_str() {
        run_sha if run_sha == base_sha256 => {}
        run_sha if !run_sha.is_empty() => {
            return Err(EvalRunError::Setup(format!(
                "base model {} has SHA-256 {base_sha256}, the run was measured with {run_sha}",
                base.display()
            )))
        }
        _ => {
            return Err(EvalRunError::Setup(format!(
                "{} names no model_sha256: not a run's manifest",
                store.url_of(runfiles::layout::MANIFEST_JSON)
            )))
        }
    }
    Ok(base_sha256)
}

/// Fingerprint of everything that changes an eval partial's numbers: the
/// base model, the corpus, how chunks are evaluated and the job (candidates
/// with their SHA-256, scored positions; not the workers' memory settings).
pub fn eval_settings_key(setup: &EvalSetup) -> String {
    let b = &setup.base;
    let collection = settings_key(
        &b.model_sha256,
        &b.index.chunks_sha256,
        &b.run.job_options(protocol::wire::TraceStrides::both(0)),
    );
    // How many models a worker holds and where it writes scratch files
    // change no number (the figures are the same bit for bit): left out,
    // so partials stay reusable whatever they are.
    let mut job = serde_json::json!(setup.job);
    if let Some(fields) = job.as_object_mut() {
        fields.remove("models_in_memory");
        fields.remove("scratch_dir");
    }
    let canonical = serde_json::json!({ "evaluation_of": collection, "job": job });
    sha256_hex(canonical.to_string().as_bytes())
}

/// Evaluates every unit of the lease plan not already stored, merges
/// exactly and writes the results under `eval/`. `on_listen` starts local
/// workers once the server listens; it is not called when everything was
/// already stored. The workers leave when it returns. The run location is
/// locked for the whole call.
pub async fn evaluate(
    setup: &EvalSetup,
    on_listen: impl OnListen,
) -> Result<EvalOutcome, EvalRunError> {
    locked(&setup.base, |base| async move {
        let fenced = EvalSetup {
            base,
            job: setup.job.clone(),
            out: setup.out,
            choice: setup.choice.clone(),
        };
        let mut crew = Crew::new(on_listen);
        let outcome = evaluate_locked(&fenced, &mut crew).await;
        crew.close(&outcome.as_ref().map(|_| ())).await;
        outcome
    })
    .await
}

/// [`evaluate`] for a caller that holds the run's lock (`setup.base.store`
/// must be the lock's fenced store), with the run's `crew`, which stays for
/// the caller's later phases.
pub async fn evaluate_locked(
    setup: &EvalSetup,
    crew: &mut Crew<'_>,
) -> Result<EvalOutcome, EvalRunError> {
    let base = &setup.base;
    let (store, index) = (&base.store, &base.index);
    let units = plan(index.n_chunks, base.run.lease_chunks);
    let leasing = Leasing::untraced(base, eval_settings_key(setup), "evaluation", false);
    let kind = Arc::new(accept::EvalAcceptance {
        partials: setup.out.partials,
        base_sha256: base.model_sha256.clone(),
        corpus_sha256: index.chunks_sha256.clone(),
        job: setup.job.clone(),
        corpus: Arc::new(scoreable::Scoreable::read(store, index).await?),
        corpus_tokens: index.n_tokens,
    });
    let leased = lease_all(&leasing, units, kind, crew).await?;
    let merged = leased
        .merged
        .ok_or_else(|| EvalRunError::Setup("the corpus has no chunks".into()))?;
    if merged.n_chunks() != u64::from(index.n_chunks) {
        return Err(EvalRunError::Setup(format!(
            "the merged evaluation covers {} of {} chunks",
            merged.n_chunks(),
            index.n_chunks
        )));
    }
    let summary = artifacts::write(
        store,
        &setup.out,
        &merged,
        index,
        &setup.choice,
        &setup.job.generate,
    )
    .await?;
    Ok(EvalOutcome {
        summary,
        leases: leased.leases,
        out: setup.out,
    })
}

/// Prints what an evaluation did and its table (with `score`'s slot
/// replacement when `score/score.json` is readable).
pub async fn print_outcome(store: &RunStore, o: &EvalOutcome) {
    println!(
        "evaluated {} candidates over {} leases ({} reused from {}, {} computed, {} retried)",
        o.summary.candidates.len(),
        o.leases.units,
        o.leases.resumed,
        store.url_of(o.out.partials.dir),
        o.leases.computed,
        o.leases.retries
    );
    for (name, why) in &o.leases.rejected {
        println!(
            "  REJECTED stored eval partial {}: {why}",
            store.url_of(name)
        );
    }
    let slots = stages::report::eval::slot_tables(store)
        .await
        .map_err(|e| runfiles::error_text::with_causes(&e))
        .and_then(|stale| stale);
    let slots = slots.unwrap_or_else(|why| {
        println!("  (no slot replacement column: {why})");
        Vec::new()
    });
    print!("{}", stages::report::eval::table(&o.summary, &slots));
    println!("results: {}", store.url_of(o.out.summary_json));
}
