//! `coordinator ship RUN --candidates A,B --quant Q8_0,Q4_K_M --out DIR`:
//! the files people serve, quantised by llama.cpp and measured
//! ([`measure::ship`]).

use super::SplitMaxSizeArg;
use gguf::quant::QuantType;
use measure::ship::{measure::Evaluator, ShipRequest};
use runfiles::store::RunStore;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `coordinator ship`.
#[derive(clap::Args, Debug)]
pub struct ShipArgs {
    /// Run location (path or URL) holding `keep_maps/` and `imatrix.gguf`.
    pub run: String,
    /// Candidates, comma-separated: keep map names under the run's
    /// `keep_maps/`, or `base` (every expert); `_top<N>` after either
    /// routes each token to N experts (`base_top2`); merge plan names under
    /// the run's `merge_plans/` (`reap_hybrid_merge_K8`); or `pareto` alone:
    /// the candidates on the size-versus-KL Pareto front of the run's
    /// evaluation (`eval/summary.json`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub candidates: Vec<String>,
    /// Quantisation types, comma-separated (llama-quantize's names: Q8_0,
    /// Q4_K_M, ...); none ships the unquantised files only.
    #[arg(long, value_delimiter = ',')]
    pub quant: Vec<String>,
    /// Output directory (local) for the files and `SHA256SUMS`.
    #[arg(long)]
    pub out: PathBuf,
    /// Quantise a base model that is already quantised.
    #[arg(long)]
    pub allow_requantize: bool,
    /// Base model; default: the model named by the run's manifest.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// CPU threads of the quantiser (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Evaluate the shipped files with this many local worker processes
    /// (loopback QUIC); 0 waits for workers to join.
    #[arg(long, default_value_t = 1)]
    pub local_workers: u32,
    /// Ship without evaluating the files (their cards carry no figures).
    #[arg(long)]
    pub no_eval: bool,
    /// Ships large model files split (`--split-max-size`).
    #[command(flatten)]
    pub split: SplitMaxSizeArg,
}

impl ShipArgs {
    /// The request these flags make; an unknown `--quant` is refused.
    fn request(&self) -> anyhow::Result<ShipRequest> {
        let quants = self
            .quant
            .iter()
            .map(|q| QuantType::parse(q).map_err(|problem| anyhow::anyhow!("--quant: {problem}")))
            .collect::<Result<Vec<_>, _>>()?;
        let split: stages::prune::SplitMaxSize = self.split.clone().into();
        Ok(ShipRequest {
            candidates: self.candidates.clone(),
            quants,
            out: self.out.clone(),
            allow_requantize: self.allow_requantize,
            model: self.model.clone(),
            threads: self.threads,
            split_max_size: split.parsed()?,
        })
    }
}

/// Entry point of `coordinator ship`.
pub fn run(args: ShipArgs) -> anyhow::Result<ExitCode> {
    let request = args.request()?;
    let store = RunStore::open(&args.run)?;
    let evaluator = (!args.no_eval).then_some(Evaluator::Own {
        local_workers: args.local_workers,
    });
    let rt = super::async_runtime()?;
    rt.block_on(measure::ship::ship(&store, &request, evaluator))?;
    Ok(ExitCode::SUCCESS)
}
