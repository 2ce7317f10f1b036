//! `coordinator eval RUN --keep-maps A,B,...`: pruned candidates against
//! the base model over the run's workers
//! ([`measure::eval::recorded::evaluate_request`]).

use measure::eval::recorded::EvalRequest;
use numbers::Splits;
use runfiles::store::RunStore;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `coordinator eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Run location (path or URL) with `corpus/` and `keep_maps/`.
    pub run: String,
    /// Keep maps to evaluate, comma-separated names `<method>_K<k>`; K may
    /// be a share of the model's experts (`frequency_K50%`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub keep_maps: Vec<String>,
    /// Start this many local worker processes (loopback QUIC); 0 waits for
    /// workers to join.
    #[arg(long, default_value_t = 0)]
    pub local_workers: u32,
    /// Splits scored: fit, heldout or both.
    #[arg(long, default_value_t = Splits::Both, value_parser = Splits::parse)]
    pub split: Splits,
    /// Positions skipped at the start of every chunk; default: half the
    /// chunk (`n_ctx / 2`: the second half is scored, like
    /// llama-perplexity); 0 scores every position.
    #[arg(long)]
    pub skip_first: Option<u32>,
    /// KL budget (mean KL in nats): per method, the smallest evaluated K
    /// whose held-out KL interval's upper end is within it is picked;
    /// default: the run config's `[eval] kl_budget`.
    #[arg(long, value_parser = parse_kl_budget)]
    pub kl_budget: Option<f64>,
    /// Which held-out figures every K must fit the budget in:
    /// `every_domain` (each calibration domain and eval set) or `pooled`;
    /// default: the run config's `[eval] budget_scope`.
    #[arg(long, value_parser = numbers::eval::BudgetScope::parse)]
    pub budget_scope: Option<numbers::eval::BudgetScope>,
    /// Models each worker holds in memory at once: `auto`, `all` or a
    /// number (2: the base and one candidate; 1: one at a time). Default:
    /// the run config's `[eval] models_in_memory`.
    #[arg(long)]
    pub models_in_memory: Option<numbers::eval::ModelsInMemory>,
    /// The base GGUF model (the run's; checked by SHA-256). Default: the
    /// model collection ran with, recorded in the manifest, else the model
    /// path of the run's config when it is absolute.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Write this evaluation to `explore/NAME/eval/` in the run, leaving
    /// the run's own `eval/` as it is.
    #[arg(long, value_name = "NAME")]
    pub out: Option<String>,
}

/// Parses `--kl-budget`: a positive number of nats.
fn parse_kl_budget(text: &str) -> Result<f64, String> {
    let b: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of nats (a mean KL such as 0.05)"))?;
    config::eval::check_kl_budget(b)?;
    Ok(b)
}

/// Entry point of `coordinator eval`.
pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let rt = super::async_runtime()?;
    let store = RunStore::open(&args.run)?;
    let request = EvalRequest {
        keep_maps: args.keep_maps,
        local_workers: args.local_workers,
        split: args.split,
        skip_first: args.skip_first,
        kl_budget: args.kl_budget,
        budget_scope: args.budget_scope,
        models_in_memory: args.models_in_memory,
        model: args.model,
        out: args.out,
    };
    rt.block_on(measure::eval::recorded::evaluate_request(&store, &request))?;
    Ok(ExitCode::SUCCESS)
}
