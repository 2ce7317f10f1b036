//! `coordinator run`, the whole pipeline: the response phase (when a
//! source sets `respond`, [`crate::respond`]), corpus preparation, collection
//! ([`runtime::run::execute`]), scoring, replay, verification, the report,
//! then the evaluation of the `[eval]` keep maps ([`measure::eval`]), the
//! report again with its results, and the files of `[ship]`
//! ([`measure::ship`]). Verification comes first, so a failed evaluation or
//! ship never loses the verify table, the report or the manifest's record
//! of the collection; an unverified run is neither evaluated nor shipped. Each stage
//! is its own module; this one only calls them in order, so no stage
//! depends on a later one. One crew of workers serves every phase that
//! needs them (collection, evaluation, shipping's evaluation) and is let go
//! after the last ([`runtime::run::crew`]): a `worker join` started once
//! serves the whole run.

use config::eval::KeepShape;
use config::ship::ShipSettings;
use config::Config;
use measure::ship::ShipRequest;
use numbers::keep_name::KeepMapName;
use runfiles::error_text::with_causes;
use runfiles::layout;
use runfiles::store::RunStore;
use runtime::run::crew::Crew;
use runtime::run::local::{self, LocalWorkers};
use runtime::run::lock::RunLock;
use runtime::run::{execute_locked, mark_finished, progress, read_index, RunSetup, RunSummary};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `coordinator run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The run config (TOML).
    pub config: PathBuf,
    /// Start this many local worker processes (loopback QUIC).
    #[arg(long, default_value_t = 0)]
    pub local_workers: u32,
    /// Run location (path or URL); overrides `[run] out`.
    #[arg(long)]
    pub out: Option<String>,
    /// Model file; overrides `[model] path`.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Address to listen on; overrides `[cluster] listen`.
    #[arg(long)]
    pub listen: Option<String>,
    /// Write `{addr, pin, server_name}` here once listening; overrides `[cluster] connect_file`.
    #[arg(long)]
    pub connect_file: Option<PathBuf>,
    /// The name workers dial (and check the certificate against), put
    /// first in `[cluster] server_names`: a batch job's node, known only
    /// when it starts.
    #[arg(long)]
    pub server_name: Option<String>,
    /// Take the run location's lock over even when its holder's heartbeat is
    /// fresh (when that coordinator is known to be gone).
    #[arg(long)]
    pub take_over_lock: bool,
}

/// Entry point of `coordinator run`.
pub fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let mut config = Config::load(&args.config)?;
    if let Some(m) = &args.model {
        config.model.path = std::path::absolute(m).context("--model")?;
    }
    if let Some(l) = &args.listen {
        config.cluster.listen = l.clone();
    }
    if let Some(f) = &args.connect_file {
        config.cluster.connect_file = Some(f.clone());
    }
    if let Some(name) = &args.server_name {
        config.cluster.server_names.insert(0, name.clone());
    }
    if args.take_over_lock {
        config.run.lock_stale_s = 0;
    }
    for (k, v) in config.storage.env() {
        // Set before the runtime starts any thread.
        std::env::set_var(k, v);
    }
    let out = args
        .out
        .clone()
        .or_else(|| config.run.out.clone())
        .unwrap_or_else(|| corpus::default_out(&args.config));
    if config.cluster.identity_dir.is_none() {
        config.cluster.identity_dir = Some(default_identity_dir(&config.base_dir, &out));
    }
    ensure_model(&config.model_path())?;
    if let Some(mmproj) = config.mmproj_path() {
        ensure_mmproj(&config.model_path(), &mmproj)?;
    }
    // Refuse a model without experts, and `[eval]` sizes it cannot run,
    // before any corpus work or lease. The header knows no routing groups:
    // they round shares down further and are checked against saliency.json
    // once it exists, so this refuses only what that check would refuse.
    let facts = gguf::model_check::moe_facts(&config.model_path()).map_err(anyhow::Error::msg)?;
    if config.eval.is_configured() {
        let header = KeepShape {
            n_expert: facts.n_expert,
            n_expert_used: facts.n_expert_used,
            groups: None,
        };
        config
            .eval
            .candidate_names(&header)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{} [eval]", args.config.display()))?;
    }
    // `[ship]` candidates the run cannot make, and where the files go,
    // before any corpus work too.
    let ship = match &config.ship {
        Some(ship) => {
            let shape = KeepShape {
                n_expert: facts.n_expert,
                n_expert_used: facts.n_expert_used,
                groups: None,
            };
            let request = ship_request(ship, &out, &config.model_path(), &shape)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("config {}", args.config.display()))?;
            Some((request, ship.eval))
        }
        None => None,
    };
    // A weak or missing secret file is refused before anything is written.
    runtime::run::check_secret(&config.cluster)?;
    let local = if args.local_workers > 0 {
        Some(LocalWorkers::new(
            local::worker_binary()?,
            &config.run,
            config.storage.env(),
            std::path::absolute(config.model_path()).context("model path")?,
            args.local_workers,
        ))
    } else {
        None
    };
    let rt = tokio::runtime::Runtime::new()?;
    let code = rt.block_on(async {
        let store = RunStore::open(&out)?;
        // Every stage writes through the lock's fenced store, and the run
        // is marked complete only while the lock is still ours.
        let lock = RunLock::acquire(&store, config.run.lock_stale()).await?;
        let mut crew = Crew::new(move |l| measure::eval::recorded::start_workers(local.as_ref(), l));
        let run = stages(&config, ship.as_ref(), lock.store(), &lock, &mut crew);
        let outcome = tokio::select! {
            outcome = run => Ok(outcome),
            stopped = stop_signal() => Err(stopped),
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err((signal, code)) => {
                eprintln!(
                    "{signal}: stopping the run; what it stored is kept, and the same command resumes it"
                );
                crew.close(&Err::<(), _>(format!("stopped by {signal}"))).await;
                lock.release().await?;
                eprintln!("stopped: workers let go, the lock on {} released", store.url());
                return Ok(ExitCode::from(code));
            }
        };
        // The run is finished (verified or not) or failed: the workers go.
        let ended = outcome.as_ref().map(|_| ()).map_err(|e| with_causes(e.as_ref()));
        crew.close(&ended).await;
        lock.release().await?;
        outcome
    });
    // Blocking work a signal interrupted is not waited for.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// Every stage of `coordinator run` after the lock is taken, writing through
/// `store` (the lock's), with the run's workers, `crew`.
async fn stages(
    config: &Config,
    ship: Option<&(ShipRequest, bool)>,
    store: RunStore,
    lock: &RunLock,
    crew: &mut Crew<'static>,
) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    // The response phase writes the text of the sources that set
    // `respond`, before the corpus is built from it.
    if config.corpus.responds() {
        crate::respond::respond(config, &store, crew).await?;
    }
    let outcome = corpus::prepare_run(config, &store, false).await?;
    if !outcome.reused {
        print!("{}", corpus::summary(&outcome.manifest));
    }
    let index = read_index(&store).await?;
    let model_path = std::path::absolute(config.model_path()).context("model path")?;
    // Workers measure the corpus's images with the mmproj it was tokenized with.
    let mmproj = match (&outcome.manifest.images, config.mmproj_path()) {
        (Some(im), Some(path)) => Some(protocol::wire::MmprojFile {
            path: std::path::absolute(&path)
                .context("mmproj path")?
                .display()
                .to_string(),
            sha256: im.mmproj_sha256.clone(),
        }),
        (Some(_), None) => anyhow::bail!(
            "the corpus at {} has images, but [model] mmproj is not set: name the mmproj it \
             was tokenized with, so that workers can measure them",
            store.url()
        ),
        (None, _) => None,
    };
    let setup = RunSetup {
        store: store.clone(),
        index,
        model_sha256: outcome.manifest.model_sha256.clone(),
        model_path,
        mmproj,
        run: config.run.clone(),
        cluster: config.cluster.clone(),
    };
    // The phases after collection that need workers: the crew is let go
    // after the last.
    let ship_eval = ship.is_some_and(|(_, eval)| *eval);
    let evaluating = config.eval.is_configured();
    let summary = execute_locked(&setup, crew).await?;
    if !evaluating && !ship_eval {
        crew.close(&FINISHED).await;
    }
    print_summary(&store, &summary);
    let options = score_options(&store, config).await?;
    let scored = stages::score::score(&store, &options).await?;
    println!(
        "scored {} methods at K = {:?}: keep maps under keep_maps/",
        scored.methods.len(),
        scored.ks
    );
    let replayed = replay_defaults(&store, &setup.model_path, &scored.ks)?;
    println!(
        "replayed {} (split, trace, mode, policy, capacity, keep map) cells: {}",
        replayed.rows.len(),
        layout::REPLAY_REPORT_MD
    );
    // Verify before the evaluation: the verify table, the report and the
    // manifest's record of the collection are written whatever `[eval]`
    // then does.
    let report = stages::verify::verify(&store).await?;
    print!("{report}");
    let ok = report.ok();
    stages::report::report_verified(&store, &report).await?;
    println!("report: {}", store.url_of(layout::REPORT_MD));
    lock.confirm().await?;
    mark_finished(&store, &summary, ok).await?;
    let manifest = store.url_of(runfiles::layout::MANIFEST_JSON);
    if !ok {
        let skipped = match (config.eval.is_configured(), ship.is_some()) {
            (true, true) => "; [eval] and [ship] were not run on an unverified run",
            (true, false) => "; [eval] was not run on an unverified run",
            (false, true) => "; [ship] was not run on an unverified run",
            (false, false) => "",
        };
        eprintln!(
            "run finished but verification failed (see above); {manifest} is not marked complete{skipped}"
        );
        return Ok(ExitCode::FAILURE);
    }
    if evaluating {
        let evaluated = evaluate_configured(config, &setup, crew).await;
        if !ship_eval {
            crew.close(&FINISHED).await;
        }
        if let Err(e) = evaluated {
            eprintln!(
                "[eval] failed: {}\nthe collection is complete and verified ({manifest}); the verify table is above and the report at {}",
                with_causes(e.as_ref()),
                store.url_of(layout::REPORT_MD)
            );
            return Ok(ExitCode::FAILURE);
        }
        // Again, now with the candidates' section (evaluation writes
        // nothing verify reads).
        stages::report::report_verified(&store, &report).await?;
    }
    if let Some((request, eval)) = ship {
        let evaluator = eval.then_some(measure::ship::measure::Evaluator::Locked {
            setup: &setup,
            crew,
        });
        if let Err(e) = measure::ship::ship(&store, request, evaluator).await {
            eprintln!(
                "[ship] failed: {}\nthe collection is complete and verified ({manifest}); the verify table is above and the report at {}",
                with_causes(&e),
                store.url_of(layout::REPORT_MD)
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    println!("run complete: {}", store.url());
    Ok(ExitCode::SUCCESS)
}

/// The first SIGTERM or SIGINT (Ctrl-C), with its exit status; never,
/// when the signals cannot be watched.
async fn stop_signal() -> (&'static str, u8) {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => ("SIGTERM", 143),
            _ = int.recv() => ("SIGINT", 130),
        },
        _ => std::future::pending().await,
    }
}

/// The outcome that lets a crew go as finished.
const FINISHED: Result<(), String> = Ok(());

/// Where a run's coordinator keeps its identity when `[cluster]
/// identity_dir` is unset: `.moe-census/coordinator-<hash of the run
/// location>` in the config's directory, so the same command finds it again
/// and two runs of one config do not share it.
fn default_identity_dir(config_dir: &std::path::Path, out: &str) -> std::path::PathBuf {
    let location = if out.contains("://") {
        out.to_string()
    } else {
        std::path::absolute(out).map_or_else(|_| out.to_string(), |p| p.display().to_string())
    };
    let key = &gguf::hash::sha256_hex(location.as_bytes())[..16];
    config_dir
        .join(".moe-census")
        .join(format!("coordinator-{key}"))
}

/// `score`'s options in `coordinator run` ([`stages::score::run_options`]).
async fn score_options(
    store: &RunStore,
    config: &Config,
) -> anyhow::Result<stages::score::ScoreOptions> {
    let saliency = runfiles::saliency::read(store).await?.saliency;
    Ok(stages::score::run_options(config, &saliency))
}

/// What `[ship]` ships from the run at `out` of the model `model` (of
/// shape `shape`), checked before the run starts: the candidates and types
/// ([`ShipSettings::check_model`]) and where the files go.
fn ship_request(
    ship: &ShipSettings,
    out: &str,
    model: &std::path::Path,
    shape: &KeepShape,
) -> Result<ShipRequest, String> {
    ship.check_model(model, shape)?;
    Ok(ShipRequest {
        candidates: ship.candidates.clone(),
        quants: ship.quants()?,
        out: ship.out_dir(out)?,
        allow_requantize: ship.allow_requantize,
        model: Some(std::path::absolute(model).map_err(|e| format!("model path: {e}"))?),
        threads: None,
        split_max_size: ship.split_max()?,
    })
}

/// Evaluates the keep maps of `[eval]` against the run's model (DESIGN
/// section 12) with the run's workers, and prints the table.
async fn evaluate_configured(
    config: &Config,
    setup: &RunSetup,
    crew: &mut Crew<'static>,
) -> anyhow::Result<()> {
    let prepared = measure::eval::job(&setup.store, &setup.model_path, &config.eval).await?;
    let base = measure::eval::recorded::Base {
        path: &setup.model_path,
        sha256: prepared.base_sha256,
    };
    let out = runfiles::layout::EVAL;
    let choice = measure::eval::Choice {
        sizes: prepared.sizes,
        kl_budget: config.eval.kl_budget,
        budget_scope: config.eval.budget_scope,
    };
    measure::eval::recorded::evaluate_held(setup, base, prepared.job, out, choice, crew).await?;
    Ok(())
}

/// Replays the run's traces with the default policies and capacities,
/// without a keep map and under the hybrid keep map at the middle K. Runs on
/// its own thread: replay drives its own I/O runtime.
fn replay_defaults(
    store: &RunStore,
    model: &std::path::Path,
    ks: &[u32],
) -> anyhow::Result<replay::ReplayReport> {
    let mut args = own_replay_args(store.url(), ks);
    args.model = Some(model.to_path_buf());
    let store = store.clone();
    Ok(std::thread::spawn(move || replay::replay_in(&args, store))
        .join()
        .map_err(|_| anyhow::anyhow!("replay panicked"))??)
}

/// The replay of `coordinator run` on the run at `run` scored at sizes
/// `ks`: the defaults ([`replay::ReplayArgs::for_run`]), without a keep map
/// and under the `reap_hybrid` keep map at the middle K.
pub fn own_replay_args(run: &str, ks: &[u32]) -> replay::ReplayArgs {
    let mut args = replay::ReplayArgs::for_run(run);
    if let Some(&k) = ks.get(ks.len() / 2) {
        args.keep_map
            .push(KeepMapName::new("reap_hybrid", k).to_string());
    }
    args
}

/// A missing model named after a `synth-model` preset (`tiny.gguf`,
/// `tiny-alt.gguf`, `bench.gguf`, `wide.gguf`, and `tiny-vision.gguf`: the
/// tiny preset with two vision experts per layer) is generated with the
/// worker binary, so the quickstarts need nothing but the build.
fn ensure_model(path: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::bail;
    if path.exists() {
        return Ok(());
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let args: &[&str] = match stem {
        "tiny" | "tiny-alt" | "bench" | "wide" => &["--preset", stem],
        "tiny-vision" => &["--preset", "tiny", "--vision-experts", "2"],
        _ => bail!("model {} does not exist", path.display()),
    };
    generate(path, "model", "synth-model", args)
}

/// A missing mmproj named after its model (`tiny-vision-mmproj.gguf` beside
/// `tiny-vision.gguf`) is generated for that model with `worker
/// synth-mmproj`.
fn ensure_mmproj(model: &std::path::Path, mmproj: &std::path::Path) -> anyhow::Result<()> {
    if mmproj.exists() {
        return Ok(());
    }
    let stem = model.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if mmproj.file_name().and_then(|s| s.to_str()) != Some(&format!("{stem}-mmproj.gguf")) {
        anyhow::bail!("mmproj {} does not exist", mmproj.display());
    }
    let model = model
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("model path {} is not UTF-8", model.display()))?;
    generate(mmproj, "mmproj", "synth-mmproj", &["--model", model])
}

/// Runs `worker COMMAND ARGS --out PATH` to make the missing `what` at `path`.
fn generate(
    path: &std::path::Path,
    what: &str,
    command: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    use anyhow::Context;
    let shown = args.join(" ");
    eprintln!(
        "{what} {} is missing: generating it with `worker {command} {shown}`",
        path.display()
    );
    let status = std::process::Command::new(local::worker_binary()?)
        .arg(command)
        .args(args)
        .arg("--out")
        .arg(path)
        .status()
        .with_context(|| format!("running worker {command}"))?;
    if !status.success() {
        anyhow::bail!("worker {command} {shown} failed ({status})");
    }
    Ok(())
}

fn print_summary(store: &RunStore, s: &RunSummary) {
    println!(
        "collected {} leases ({} reused from {}/partials, {} computed, {} retried, {} duplicates dropped); {} fit tokens",
        s.leases.units,
        s.leases.resumed,
        store.url(),
        s.leases.computed,
        s.leases.retries,
        s.leases.duplicates,
        s.fit_tokens
    );
    for (name, why) in &s.leases.rejected {
        println!("  REJECTED stored partial {}: {why}", store.url_of(name));
    }
    for what in &s.leases.unresolved {
        println!("  UNRESOLVED disagreement: {what}");
    }
    for w in &s.leases.workers {
        println!(
            "  {} ({}): {} leases, {} tokens, {:.0} tokens/s",
            w.name,
            w.backend,
            w.leases,
            w.tokens,
            progress::throughput(w)
        );
    }
}
