//! `coordinator prune RUN --keep-map NAME --out FILE`: a pruned GGUF and its
//! importance matrix from one of the run's keep maps ([`stages::prune`]).

use super::SplitMaxSizeArg;
use stages::prune::PruneRequest;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `coordinator prune`.
#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    /// Run location holding `keep_maps/NAME.json` and `imatrix.gguf`.
    pub run: String,
    /// Keep map: a name under the run's `keep_maps/` (`reap_l2_sum_K8`),
    /// or the path of a JSON file, e.g. written by hand as `{"layers":
    /// {"0": [expert ids], "1": [...], ...}}` (the same number of ids in
    /// every MoE block), checked against the run's model.
    #[arg(long = "keep-map")]
    pub keep_map: String,
    /// Base model; default: the model named by the run's manifest.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// The pruned model to write; its importance matrix goes next to it as
    /// `<stem>.imatrix.gguf`. Both are new files: an existing one is
    /// refused, never replaced.
    #[arg(long)]
    pub out: PathBuf,
    /// An importance matrix to slice instead of the run's `imatrix.gguf`:
    /// a file in llama-imatrix's GGUF format (`<name>.in_sum2` and
    /// `<name>.counts` per weight), such as llama-imatrix itself writes;
    /// the run then needs no `imatrix.gguf`.
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Splits a large model (`--split-max-size`).
    #[command(flatten)]
    pub split: SplitMaxSizeArg,
}

/// Entry point of `coordinator prune`.
pub fn run(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let request = PruneRequest {
        run: args.run,
        keep_map: args.keep_map,
        model: args.model,
        out: args.out,
        imatrix: args.imatrix,
        split: args.split.into(),
    };
    super::async_runtime()?.block_on(stages::prune::prune(&request))?;
    Ok(ExitCode::SUCCESS)
}
