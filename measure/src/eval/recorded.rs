//! `coordinator eval RUN --keep-maps A,B,...` on a recorded run: the run's
//! settings and model from its manifest, local or joined workers, then
//! [`super::evaluate`].

use super::{
    evaluate, job, print_outcome, Choice, EvalOutcome, EvalRunError, EvalSettings, EvalSetup,
};
use crate::MeasureError;
use config::Config;
use numbers::Splits;
use protocol::wire::EvalJob;
use runfiles::layout::EvalLayout;
use runfiles::manifest::RunManifest;
use runfiles::store::RunStore;
use runtime::run::crew::Crew;
use runtime::run::local::{worker_binary, LocalWorkers};
use runtime::run::{read_index, RunSetup};
use stages::StagesError;
use std::path::{Path, PathBuf};

/// What `coordinator eval` asks for besides the run (a location with
/// `corpus/` and `keep_maps/`).
#[derive(Debug)]
pub struct EvalRequest {
    /// Keep maps to evaluate, comma-separated names `<method>_K<k>`; K may
    /// be a share of the model's experts (`frequency_K50%`).
    pub keep_maps: Vec<String>,
    /// Start this many local worker processes (loopback QUIC); 0 waits for
    /// workers to join.
    pub local_workers: u32,
    /// Splits scored: fit, heldout or both.
    pub split: Splits,
    /// Positions skipped at the start of every chunk; default: half the
    /// chunk (`n_ctx / 2`: the second half is scored, like
    /// llama-perplexity); 0 scores every position.
    pub skip_first: Option<u32>,
    /// KL budget (mean KL in nats): per method, the smallest evaluated K
    /// whose held-out KL interval's upper end is within it is picked;
    /// default: the run config's `[eval] kl_budget`.
    pub kl_budget: Option<f64>,
    /// Which held-out figures every K must fit the budget in:
    /// `every_domain` (each calibration domain and eval set) or `pooled`;
    /// default: the run config's `[eval] budget_scope`.
    pub budget_scope: Option<numbers::eval::BudgetScope>,
    /// Models each worker holds in memory at once: `auto`, `all` or a
    /// number (2: the base and one candidate; 1: one at a time). Default:
    /// the run config's `[eval] models_in_memory`.
    pub models_in_memory: Option<numbers::eval::ModelsInMemory>,
    /// The base GGUF model (the run's; checked by SHA-256). Default: the
    /// model collection ran with, recorded in the manifest, else the model
    /// path of the run's config when it is absolute.
    pub model: Option<PathBuf>,
    /// Write this evaluation to `explore/NAME/eval/` in the run, leaving
    /// the run's own `eval/` as it is.
    pub out: Option<String>,
}

/// A run's manifest and the config recorded in it.
pub(crate) async fn recorded(store: &RunStore) -> Result<(RunManifest, Config), MeasureError> {
    let manifest = runfiles::manifest::read_or_default(store).await?;
    let config = manifest
        .config()
        .map_err(|problem| EvalRunError::RecordedConfig {
            manifest: store.url_of(runfiles::layout::MANIFEST_JSON),
            problem,
        })?;
    Ok((manifest, config))
}

/// The mmproj the run's collection fed its images with, which evaluation
/// feeds them with too; `None` for a text corpus.
async fn recorded_mmproj(
    store: &RunStore,
) -> Result<Option<protocol::wire::MmprojFile>, MeasureError> {
    let manifest = runfiles::manifest::read_or_default(store).await?;
    match (&manifest.corpus.images, manifest.mmproj) {
        (None, _) => Ok(None),
        (Some(_), Some(mmproj)) => Ok(Some(mmproj)),
        (Some(_), None) => Err(EvalRunError::Setup(format!(
            "the corpus at {} has images, but its manifest names no mmproj: collect the run \
             first (`coordinator run` records the mmproj it measured them with)",
            store.url()
        ))
        .into()),
    }
}

/// `coordinator eval`: evaluates the candidates `args` names on the run
/// `store` with the settings its config recorded (writing the run's own
/// `eval/` only with its own `[eval]`; otherwise under `--out NAME`), and
/// prints the evaluation's table.
pub async fn evaluate_request(store: &RunStore, args: &EvalRequest) -> Result<(), MeasureError> {
    let (manifest, config) = recorded(store).await?;
    let model = match (&args.model, manifest.model_path) {
            (Some(m), _) => std::path::absolute(m).map_err(|e| StagesError::Argument {
                argument: "--model".into(),
                problem: e.to_string(),
            })?,
            (None, Some(recorded)) if recorded.is_file() => recorded,
            (None, _) if config.model.path.is_absolute() => config.model.path.clone(),
            (None, _) => {
                return Err(EvalRunError::Setup(format!(
                    "give --model: the run's config names the model by a path relative to its config file ({})",
                    config.model.path.display()
                ))
                .into())
            }
        };
    let settings = EvalSettings {
        keep_maps: args.keep_maps.clone(),
        split: args.split,
        skip_first: args.skip_first,
        kl_budget: args.kl_budget.or(config.eval.kl_budget),
        budget_scope: args.budget_scope.unwrap_or(config.eval.budget_scope),
        models_in_memory: args
            .models_in_memory
            .unwrap_or(config.eval.models_in_memory),
        // Only the candidates named on the command line.
        methods: Vec::new(),
        k: Vec::new(),
        // The rest (the generation check, the scratch directory) as
        // the run's config gives it.
        ..config.eval.clone()
    };
    if args.out.is_none() {
        own_differences(store, &settings, &config.eval)
            .await?
            .allow("eval/")?;
    }
    let prepared = job(store, &model, &settings).await?;
    let base = Base {
        path: &model,
        sha256: prepared.base_sha256,
    };
    let out = match &args.out {
        None => runfiles::layout::EVAL,
        Some(name) => EvalLayout::under(&stages::own::explore_prefix(name)?),
    };
    let choice = Choice {
        sizes: prepared.sizes,
        kl_budget: settings.kl_budget,
        budget_scope: settings.budget_scope,
    };
    let job = prepared.job;
    evaluate_recorded(store, &config, base, job, out, choice, args.local_workers).await?;
    Ok(())
}

/// What of `settings` differs from the run's own `[eval]`, `own`: the
/// candidates (by resolved name, in any order), the splits, the skipped
/// positions and the KL budget. A run whose config has no `[eval]` has no
/// evaluation of its own: every evaluation of it needs `--out`.
async fn own_differences(
    store: &RunStore,
    settings: &EvalSettings,
    own: &EvalSettings,
) -> Result<stages::own::Differences, MeasureError> {
    let mut d = stages::own::Differences::default();
    if !own.is_configured() {
        d.check("--keep-maps", &settings.keep_maps, &Vec::new());
        return Ok(d);
    }
    let names = |e: &EvalSettings, shape| -> Result<Vec<String>, MeasureError> {
        let mut names = e.candidate_names(shape).map_err(EvalRunError::Setup)?;
        names.sort();
        names.dedup();
        Ok(names)
    };
    let saliency = runfiles::saliency::read(store).await?.saliency;
    let shape = config::eval::KeepShape::of(&saliency);
    d.check("--keep-maps", names(settings, &shape)?, names(own, &shape)?);
    d.check("--split", settings.split, own.split);
    d.check("--skip-first", settings.skip_first, own.skip_first);
    d.check("--kl-budget", settings.kl_budget, own.kl_budget);
    Ok(d)
}

/// The base model of an evaluation: its path and SHA-256.
pub struct Base<'a> {
    /// The GGUF workers load.
    pub path: &'a Path,
    /// Its SHA-256 (hex), which every worker's model must match.
    pub sha256: String,
}

/// Evaluates `job` on the run `store` recorded with `config` (its `[run]`
/// and `[cluster]`), its objects under `out`, with `local_count` local
/// workers (0: waits for workers to join); prints the evaluation's table.
/// `coordinator eval` and `coordinator ship` both run through it.
pub(crate) async fn evaluate_recorded(
    store: &RunStore,
    config: &Config,
    base: Base<'_>,
    job: EvalJob,
    out: EvalLayout,
    choice: Choice,
    local_count: u32,
) -> Result<EvalOutcome, MeasureError> {
    let setup = EvalSetup {
        base: RunSetup {
            store: store.clone(),
            index: read_index(store).await?,
            model_sha256: base.sha256,
            model_path: base.path.to_path_buf(),
            mmproj: recorded_mmproj(store).await?,
            run: config.run.clone(),
            cluster: config.cluster.clone(),
        },
        job,
        out,
        choice,
    };
    let local = (local_count > 0)
        .then(|| local_workers(config, base.path, local_count))
        .transpose()?;
    let outcome = evaluate(&setup, |l| start_workers(local.as_ref(), l)).await?;
    print_outcome(store, &outcome).await;
    Ok(outcome)
}

/// Evaluates `job` on the base model `base` for a caller that holds the
/// run's lock (`setup.store` is the lock's: `coordinator run`), its objects
/// under `out`, with the caller's `crew` (the workers of its earlier
/// phases stay for this one); prints the evaluation's table.
pub async fn evaluate_held(
    setup: &RunSetup,
    base: Base<'_>,
    job: EvalJob,
    out: EvalLayout,
    choice: Choice,
    crew: &mut Crew<'_>,
) -> Result<EvalOutcome, MeasureError> {
    let eval = EvalSetup {
        base: RunSetup {
            model_sha256: base.sha256,
            model_path: base.path.to_path_buf(),
            ..setup.clone()
        },
        job,
        out,
        choice,
    };
    let outcome = super::evaluate_locked(&eval, crew).await?;
    print_outcome(&setup.store, &outcome).await;
    Ok(outcome)
}

/// `count` local workers of the run's config on `model`.
pub fn local_workers(
    config: &Config,
    model: &std::path::Path,
    count: u32,
) -> Result<LocalWorkers, MeasureError> {
    Ok(LocalWorkers::new(
        worker_binary()?,
        &config.run,
        config.storage.env(),
        model.to_path_buf(),
        count,
    ))
}

/// Starts the local workers, or prints how remote workers join.
pub fn start_workers(
    local: Option<&LocalWorkers>,
    l: &runtime::run::Listening,
) -> Result<Vec<tokio::process::Child>, runtime::run::RunError> {
    match local {
        Some(w) => w.spawn(l.addr, &l.pin, &l.secret),
        None => {
            println!("waiting for workers: {}", l.hint.join);
            Ok(Vec::new())
        }
    }
}
