//! Command-line contract (DESIGN section 10): one subcommand per stage.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// moe-census coordinator.
#[derive(Parser, Debug)]
#[command(
    name = "coordinator",
    version,
    about = "moe-census coordinator: corpus, run, merge, verify, score, replay, eval, report, prune, ship"
)]
pub struct Cli {
    /// The stage to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Coordinator subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Prepare the tokenized corpus and print the share table; non-zero exit on a share miss.
    Corpus(CorpusArgs),
    /// The whole pipeline: corpus, leases to workers over QUIC, merge, checks, scoring.
    Run(crate::pipeline::RunArgs),
    /// Create a cluster CA (ca.pem, ca.key) that signs the coordinator's certificate.
    Ca(crate::keys::CaArgs),
    /// Write one worker's own key file (from the join secret, for one name): it joins as that name only.
    WorkerKey(crate::keys::WorkerKeyArgs),
    /// Merge partials into saliency.json, saliency.parquet and imatrix.gguf.
    Merge(crate::merge::MergeArgs),
    /// Check every invariant of the run's results; exit 0 only if all hold.
    Verify(crate::stage_cli::verify::VerifyArgs),
    /// Rank experts, write keep maps for every K and the scoring tables.
    Score(crate::stage_cli::score::ScoreArgs),
    /// Write report/report.md with PNG plots.
    Report(crate::stage_cli::report::ReportArgs),
    /// Replay traces against expert caches: misses per policy, capacity and keep map.
    Replay(crate::replay_cli::ReplayFlags),
    /// Slice a pruned GGUF (and its importance matrix) from one of the run's keep maps.
    Prune(crate::stage_cli::prune::PruneArgs),
    /// Pruned GGUFs quantised by llama.cpp with their sliced importance matrix, create-only, SHA-256 recorded.
    Ship(crate::stage_cli::ship::ShipArgs),
    /// KL, perplexity and top-1 agreement of pruned candidates against the base model, over the run's workers.
    Eval(crate::stage_cli::eval::EvalArgs),
}

/// Runs a parsed command; the exit code says whether it succeeded.
pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Corpus(args) => corpus(args),
        Command::Run(args) => crate::pipeline::main(args),
        Command::Ca(args) => crate::keys::ca(args),
        Command::WorkerKey(args) => crate::keys::worker_key(args),
        Command::Merge(args) => crate::merge::run(args),
        Command::Verify(args) => crate::stage_cli::verify::run(args),
        Command::Score(args) => crate::stage_cli::score::run(args),
        Command::Report(args) => crate::stage_cli::report::run(args),
        Command::Replay(args) => replay(args.into()),
        Command::Prune(args) => crate::stage_cli::prune::run(args),
        Command::Ship(args) => crate::stage_cli::ship::run(args),
        Command::Eval(args) => crate::stage_cli::eval::run(args),
    }
}

/// Arguments of `coordinator corpus`.
#[derive(clap::Args, Debug)]
pub struct CorpusArgs {
    /// The run config (TOML); relative paths in it are resolved against its directory.
    pub config: std::path::PathBuf,
    /// Run location (path or URL); default `runs/<config file stem>`.
    #[arg(long)]
    pub out: Option<String>,
    /// Replace a corpus prepared from other inputs.
    #[arg(long)]
    pub force: bool,
    /// Tokenizer threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Entry point of `coordinator corpus`.
fn corpus(args: CorpusArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let config = config::Config::load(&args.config)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| corpus::default_out(&args.config));
    let store = runfiles::store::RunStore::open(&out)?;
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot start the tokenizer threads")?;
    }
    let rt = tokio::runtime::Runtime::new()?;
    let outcome = rt.block_on(corpus::prepare_run(&config, &store, args.force))?;
    let m = &outcome.manifest;
    let rows: Vec<_> = m.domains.iter().map(|d| d.shares.clone()).collect();
    println!("{}", corpus::shares::render(&rows, config.corpus.tolerance));
    print!("{}", corpus::summary(m));
    if outcome.reused {
        println!(
            "reused the corpus at {} (same inputs {})",
            store.url(),
            &m.inputs_sha256[..12]
        );
    } else {
        println!("wrote the corpus to {}", store.url());
    }
    Ok(ExitCode::SUCCESS)
}

/// `coordinator replay`: without `--model`, the expert sizes come from the
/// model the run recorded (the manifest's `model_path`) while it exists.
/// Without `--out` it writes the run's own `replay/` only with the run's
/// own options ([`crate::pipeline::own_replay_args`]).
fn replay(mut args: replay::ReplayArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let store = runfiles::store::RunStore::open(&args.run)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the I/O runtime")?;
    if args.model.is_none() {
        let manifest = rt
            .block_on(runfiles::manifest::read(&store))
            .with_context(|| {
                format!("parsing {}", store.url_of(runfiles::layout::MANIFEST_JSON))
            })?;
        args.model = manifest.and_then(|m| m.model_path).filter(|p| p.exists());
    }
    if args.out.is_none() {
        let ks = rt.block_on(scored_sizes(&store))?;
        replay_differences(&args, &crate::pipeline::own_replay_args(&args.run, &ks))
            .allow("replay/")?;
    }
    drop(rt);
    let report = replay::replay_run(&args)?;
    println!("{}", report.markdown);
    Ok(ExitCode::SUCCESS)
}

/// The sizes the run's own score wrote keep maps at (none before `score`).
async fn scored_sizes(store: &runfiles::store::RunStore) -> anyhow::Result<Vec<u32>> {
    if store
        .get_opt(runfiles::layout::score::REPORT_JSON)
        .await?
        .is_none()
    {
        return Ok(Vec::new());
    }
    let sha = runfiles::saliency::read(store).await?.sha256;
    Ok(stages::score::stored_report(store, &sha)
        .await?
        .map(|r| r.ks)
        .unwrap_or_default())
}

/// The options of `args` that change the replay's results and differ from
/// the run's own, `own`.
fn replay_differences(
    args: &replay::ReplayArgs,
    own: &replay::ReplayArgs,
) -> stages::own::Differences {
    let mut d = stages::own::Differences::default();
    d.check("--policies", &args.policies, &own.policies);
    d.check("--capacity", &args.capacity, &own.capacity);
    d.check("--keep-map", &args.keep_map, &own.keep_map);
    d.check("--split", args.split, own.split);
    d.check("--mode", &args.mode, &own.mode);
    d.check("--ubatch", args.ubatch, own.ubatch);
    d.check("--ema-decay", args.ema_decay, own.ema_decay);
    d.check("--near-pick-n", args.near_pick_n, own.near_pick_n);
    d.check(
        "--near-pick-credit",
        args.near_pick_credit,
        own.near_pick_credit,
    );
    d
}

/// Sets up logging, parses the command line, runs the stage and maps errors
/// to the exit code; the `coordinator` binary is this function.
pub fn main() -> ExitCode {
    crate::front::init_logging();
    // Merged candidates are re-quantised by ggml's type traits (#57).
    slicer::install_codec(Box::leak(Box::new(llama::GgmlCodec::new())));
    match dispatch(Cli::parse()) {
        Ok(code) => code,
        Err(e) => crate::front::failed(e.as_ref()),
    }
}
