//! `coordinator ship RUN --candidates A,B,... [--quant Q4_K_M,...] --out DIR`:
//! the run's settings and model from its manifest, local or joined
//! workers for the evaluation, then [`super::ship`]; and the same from a
//! run config's `[ship]` section for `coordinator run`.

use super::spec::Spec;
use super::{print_outcome, ship, ShipSettings, ShipSetup};
use crate::config::Config;
use crate::eval::cli::{local_workers, recorded_config, start_workers};
use crate::run::local::{worker_binary, LocalWorkers};
use crate::run::{read_index, RunSetup};
use anyhow::Context;
use clap::Args;
use common::quant::QuantType;
use common::store::RunStore;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `coordinator ship`.
#[derive(Args, Debug)]
pub struct ShipArgs {
    /// Run location (path or URL) with `keep_maps/`, `imatrix.gguf` and `score/`.
    pub run: String,
    /// Candidates, comma-separated: `<method>_K<k>` (a keep map), `top<t>`
    /// (the base model routing t experts per token), `<method>_K<k>+top<t>`.
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    /// Quantisation types, comma-separated (llama-quantize's names).
    #[arg(long, value_delimiter = ',')]
    pub quant: Vec<String>,
    /// Output directory (local) for the files, their cards and the summary.
    #[arg(long)]
    pub out: PathBuf,
    /// Quantise a base model that is already quantised.
    #[arg(long)]
    pub allow_requantize: bool,
    /// Start this many local worker processes for the evaluation; 0 waits
    /// for workers to join (none are needed when every result is stored).
    #[arg(long, default_value_t = 0)]
    pub local_workers: u32,
    /// Splits scored: fit, heldout or both.
    #[arg(long, default_value = "both")]
    pub split: String,
    /// Positions skipped at the start of every chunk.
    #[arg(long, default_value_t = 0)]
    pub skip_first: u32,
    /// The base GGUF model (the run's; checked by SHA-256). Default: the
    /// model path recorded in the run's config when it is absolute.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads of the quantiser (default: all cores).
    #[arg(long)]
    pub threads: Option<u32>,
}

/// The setup of a ship of `settings` over `base`.
pub fn setup(base: RunSetup, settings: &ShipSettings, out: PathBuf, threads: Option<u32>) -> anyhow::Result<ShipSetup> {
    let candidates = settings
        .candidates
        .iter()
        .map(|c| Spec::parse(c).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let quants = settings
        .quant
        .iter()
        .map(|q| QuantType::parse(q).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let splits = common::eval::summary::parse_splits(&settings.split).with_context(|| {
        format!("split {:?}: expected fit, heldout or both", settings.split)
    })?;
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    Ok(ShipSetup {
        base,
        candidates,
        quants,
        out,
        allow_requantize: settings.allow_requantize,
        splits,
        skip_first: settings.skip_first,
        worker: worker_binary()?,
        threads,
    })
}

/// Entry point of `coordinator ship`.
pub fn main(args: ShipArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let store = RunStore::open(&args.run)?;
        let config = recorded_config(&store).await?;
        let model = match &args.model {
            Some(m) => std::path::absolute(m).context("--model")?,
            None if config.model.path.is_absolute() => config.model.path.clone(),
            None => anyhow::bail!(
                "give --model: the run's config names the model by a path relative to its config file ({})",
                config.model.path.display()
            ),
        };
        let base = RunSetup {
            store: store.clone(),
            index: read_index(&store).await?,
            model_sha256: common::hash::sha256_file(&model).with_context(|| model.display().to_string())?,
            model_path: model.clone(),
            run: config.run.clone(),
            cluster: config.cluster.clone(),
        };
        let settings = ShipSettings {
            candidates: args.candidates.clone(),
            quant: args.quant.clone(),
            out: Some(args.out.clone()),
            allow_requantize: args.allow_requantize,
            split: args.split.clone(),
            skip_first: args.skip_first,
        };
        let setup = setup(base, &settings, args.out.clone(), args.threads)?;
        let local = (args.local_workers > 0)
            .then(|| local_workers(&config, &model, args.local_workers))
            .transpose()?;
        let outcome = ship(&setup, |l| start_workers(local.as_ref(), l)).await?;
        print_outcome(&setup, &outcome);
        Ok(ExitCode::SUCCESS)
    })
}

/// Ships the `[ship]` section of `config` at the end of `coordinator run`,
/// with the run's local workers when it has some. The output directory is
/// `[ship] out` (relative to the config's directory), else `shipped/`
/// inside a local run location.
pub async fn ship_configured(config: &Config, base: &RunSetup, local: Option<&LocalWorkers>) -> anyhow::Result<()> {
    let out = match &config.ship.out {
        Some(o) => config.resolve(o),
        None => match base.store.local_dir() {
            Some(dir) => dir.join("shipped"),
            None => anyhow::bail!(
                "[ship] out is needed: the run location {} is not a local directory",
                base.store.url()
            ),
        },
    };
    let setup = setup(base.clone(), &config.ship, out, config.run.local_worker_threads)?;
    let outcome = ship(&setup, |l| start_workers(local, l)).await?;
    print_outcome(&setup, &outcome);
    Ok(())
}
