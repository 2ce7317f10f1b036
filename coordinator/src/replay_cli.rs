//! `coordinator replay`'s flags, read into the replay library's
//! [`ReplayArgs`] (whose [`ReplayArgs::for_run`] gives their defaults).

use numbers::Splits;
use replay::capacity::Capacity;
use replay::results::Mode;
use replay::run::{DEFAULT_CAPACITY, DEFAULT_MODES, DEFAULT_POLICIES, DEFAULT_PREFETCH_M};
use replay::{Policy, ReplayArgs};
use std::path::PathBuf;

/// Arguments of `coordinator replay`.
#[derive(clap::Args, Clone, Debug)]
pub struct ReplayFlags {
    /// Run location (path or object-store URL) with `trace/*.parquet`.
    pub run: String,
    /// Policies to replay, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = Policy::parse,
        default_value = DEFAULT_POLICIES
    )]
    pub policies: Vec<Policy>,
    /// Per-layer capacities: experts (`64`), fractions of the layer's
    /// (kept) experts (`0.25`, `25%`), or bytes of expert weights (`512MiB`,
    /// `2GB`: the experts that fit, so keep maps compare at equal memory).
    #[arg(long, value_delimiter = ',', value_parser = Capacity::parse, default_value = DEFAULT_CAPACITY)]
    pub capacity: Vec<Capacity>,
    /// Keep maps: `none`, a name under `keep_maps/` (`frequency_K8`) or a JSON path.
    #[arg(long = "keep-map", value_delimiter = ',', default_values_t = ReplayArgs::for_run("").keep_map)]
    pub keep_map: Vec<String>,
    /// Splits to replay: fit (the tokens the keep maps were fitted on),
    /// heldout or both, side by side.
    #[arg(long, default_value_t = ReplayArgs::for_run("").split, value_parser = Splits::parse)]
    pub split: Splits,
    /// Step modes, comma-separated (decode traces are replayed per token only).
    #[arg(
        long,
        value_parser = crate::values::mode(),
        value_delimiter = ',',
        default_value = DEFAULT_MODES
    )]
    pub mode: Vec<Mode>,
    /// Tokens per ubatch in ubatch mode (llama.cpp's `n_ubatch`).
    #[arg(long, default_value_t = ReplayArgs::for_run("").ubatch)]
    pub ubatch: usize,
    /// EMA decay per step, in (0, 1).
    #[arg(long, default_value_t = ReplayArgs::for_run("").ema_decay)]
    pub ema_decay: f64,
    /// Near picks per token for `near_pick_ema`.
    #[arg(long, default_value_t = ReplayArgs::for_run("").near_pick_n)]
    pub near_pick_n: usize,
    /// Credit of one near pick (a use earns 1).
    #[arg(long, default_value_t = ReplayArgs::for_run("").near_pick_credit)]
    pub near_pick_credit: f64,
    /// Prefetch replay (token steps, no keep map): lists of at most `m = k x`
    /// each of these experts per step; `0` alone turns prefetch replay off.
    #[arg(long = "prefetch-m", value_delimiter = ',', default_value = DEFAULT_PREFETCH_M)]
    pub prefetch_m: Vec<usize>,
    /// Model GGUF for expert sizes; default: `model_path` of the run's manifest.json.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = ReplayArgs::for_run("").threads)]
    pub threads: usize,
    /// Write this replay (`replay/`) to `explore/NAME/` in the run, leaving
    /// the run's own results as they are.
    #[arg(long, value_name = "NAME")]
    pub out: Option<String>,
}

impl From<ReplayFlags> for ReplayArgs {
    fn from(f: ReplayFlags) -> ReplayArgs {
        ReplayArgs {
            run: f.run,
            policies: f.policies,
            capacity: f.capacity,
            keep_map: f.keep_map,
            split: f.split,
            mode: f.mode,
            ubatch: f.ubatch,
            ema_decay: f.ema_decay,
            near_pick_n: f.near_pick_n,
            near_pick_credit: f.near_pick_credit,
            prefetch_m: f.prefetch_m,
            model: f.model,
            threads: f.threads,
            out: f.out,
        }
    }
}
