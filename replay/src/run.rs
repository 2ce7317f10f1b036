//! The `replay` command: flags and the per-layer fan-out.

use super::capacity::Capacity;
use super::inputs::{load_inputs, Inputs};
use super::keep::{requests, KeptLayer};
use super::lru::miss_curve;
use super::pinned;
use super::policy::{simulate, Policy, PolicyParams};
use super::report::{self, Cell, CurveCell, RowKey, Setup};
use super::results::{Mode, ReplayReport, TraceKind};
use super::steps::Steps;
use super::trace_io::TraceSet;
use crate::ReplayError;
use numbers::{Split, Splits};
use rayon::prelude::*;
use runfiles::artifacts::names;
use runfiles::store::RunStore;
use std::path::PathBuf;

/// `--policies`' default: every policy.
const DEFAULT_POLICIES: &str =
    "lru,lfu,ema,near_pick_ema,router_ema,inverse_router_ema,belady,static";

/// `--capacity`'s default: an eighth, a quarter and half of the layer's experts.
const DEFAULT_CAPACITY: &str = "0.125,0.25,0.5";

/// `--mode`'s default: both step modes.
const DEFAULT_MODES: &str = "token,ubatch";

/// Arguments of `coordinator replay`.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ReplayArgs {
    /// Run location (path or object-store URL) with `trace/*.parquet`.
    pub run: String,
    /// Policies to replay, comma-separated.
    #[cfg_attr(feature = "cli", arg(
        long,
        value_delimiter = ',',
        value_parser = Policy::parse,
        default_value = DEFAULT_POLICIES
    ))]
    pub policies: Vec<Policy>,
    /// Per-layer capacities: experts (`64`), fractions of the layer's
    /// (kept) experts (`0.25`, `25%`), or bytes of expert weights (`512MiB`,
    /// `2GB`: the experts that fit, so keep maps compare at equal memory).
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', value_parser = Capacity::parse, default_value = DEFAULT_CAPACITY))]
    pub capacity: Vec<Capacity>,
    /// Keep maps: `none`, a name under `keep_maps/` (`frequency_K8`) or a JSON path.
    #[cfg_attr(feature = "cli", arg(long = "keep-map", value_delimiter = ',', default_values_t = ReplayArgs::for_run("").keep_map))]
    pub keep_map: Vec<String>,
    /// Splits to replay: fit (the tokens the keep maps were fitted on),
    /// heldout or both, side by side.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = ReplayArgs::for_run("").split, value_parser = Splits::parse))]
    pub split: Splits,
    /// Step modes, comma-separated (decode traces are replayed per token only).
    #[cfg_attr(feature = "cli", arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = DEFAULT_MODES
    ))]
    pub mode: Vec<Mode>,
    /// Tokens per ubatch in ubatch mode (llama.cpp's `n_ubatch`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = ReplayArgs::for_run("").ubatch))]
    pub ubatch: usize,
    /// EMA decay per step, in (0, 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = ReplayArgs::for_run("").ema_decay))]
    pub ema_decay: f64,
    /// Near picks per token for `near_pick_ema`.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = ReplayArgs::for_run("").near_pick_n))]
    pub near_pick_n: usize,
    /// Credit of one near pick (a use earns 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = ReplayArgs::for_run("").near_pick_credit))]
    pub near_pick_credit: f64,
    /// Model GGUF for expert sizes; default: `model_path` of the run's manifest.json.
    #[cfg_attr(feature = "cli", arg(long))]
    pub model: Option<PathBuf>,
    /// Worker threads (0: one per core).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = ReplayArgs::for_run("").threads))]
    pub threads: usize,
    /// Write this replay (`replay/`) to `explore/NAME/` in the run, leaving
    /// the run's own results as they are.
    #[cfg_attr(feature = "cli", arg(long, value_name = "NAME"))]
    pub out: Option<String>,
}

impl ReplayArgs {
    /// `coordinator replay RUN` with every default (the command line's and
    /// every caller's): each policy, capacities of an eighth, a quarter and
    /// a half of the layer's experts, no keep map, both splits, token and
    /// ubatch steps of 512 tokens.
    pub fn for_run(run: &str) -> ReplayArgs {
        ReplayArgs {
            run: run.to_string(),
            policies: DEFAULT_POLICIES
                .split(',')
                .map(|p| Policy::parse(p).expect("a known policy"))
                .collect(),
            capacity: DEFAULT_CAPACITY
                .split(',')
                .map(|c| Capacity::parse(c).expect("a capacity"))
                .collect(),
            keep_map: vec!["none".into()],
            split: Splits::Both,
            mode: DEFAULT_MODES
                .split(',')
                .map(|m| Mode::parse(m).expect("a step mode"))
                .collect(),
            ubatch: 512,
            ema_decay: 0.99,
            near_pick_n: 4,
            near_pick_credit: 0.5,
            model: None,
            threads: 0,
            out: None,
        }
    }

    fn params(&self) -> PolicyParams {
        PolicyParams {
            ema_decay: self.ema_decay,
            near_pick_n: self.near_pick_n,
            near_pick_credit: self.near_pick_credit,
        }
    }

    fn validate(&self) -> Result<(), ReplayError> {
        let refuse = |flag, value, reason| {
            Err(ReplayError::Flag {
                flag,
                value,
                reason,
            })
        };
        if !(self.ema_decay > 0.0 && self.ema_decay < 1.0) {
            return refuse(
                "--ema-decay",
                Some(self.ema_decay.to_string()),
                "must be in (0, 1)",
            );
        }
        if self.ubatch < 1 {
            return refuse("--ubatch", None, "must be at least 1");
        }
        if self.policies.is_empty() {
            return refuse("--policies", None, "names no policy");
        }
        if self.capacity.is_empty() {
            return refuse("--capacity", None, "names no capacity");
        }
        if self.mode.is_empty() {
            return refuse("--mode", None, "names no mode");
        }
        if let Some(name) = self
            .out
            .as_ref()
            .filter(|n| runfiles::layout::explore(n).is_none())
        {
            return refuse(
                "--out",
                Some(name.clone()),
                runfiles::layout::EXPLORE_NAME_RULE,
            );
        }
        Ok(())
    }
}

/// Replays the traces of `args.run` and writes `replay/results.json` and
/// `replay/report.md` under it. Call it outside any async runtime.
pub fn replay_run(args: &ReplayArgs) -> Result<ReplayReport, ReplayError> {
    replay_in(args, RunStore::open(&args.run)?)
}

/// [`replay_run`] reading and writing through `store` (the run of
/// `args.run`, fenced by its lock when the caller holds it).
pub fn replay_in(args: &ReplayArgs, store: RunStore) -> Result<ReplayReport, ReplayError> {
    args.validate()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ReplayError::Runtime {
            runtime: "I/O runtime",
            source,
        })?;
    let inputs = rt.block_on(load_inputs(&store, args.model.as_deref(), &args.keep_map))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .map_err(|source| ReplayError::Threads { source })?;
    let mut cells = Vec::new();
    let mut curves = Vec::new();
    for (kind, set) in &inputs.traces {
        let layers = set.layers();
        let outs = pool.install(|| {
            layers
                .par_iter()
                .map(|&layer| replay_layer(set, *kind, layer, &inputs, args))
                .collect::<Result<Vec<_>, _>>()
        })?;
        for (c, k) in outs {
            cells.extend(c);
            curves.extend(k);
        }
    }
    let setup = Setup {
        params: args.params(),
        ubatch: args.ubatch,
        capacities: &args.capacity,
    };
    let report = report::build(setup, &inputs, cells, curves);
    let out = match &args.out {
        None => store,
        Some(name) => {
            store.child(
                &runfiles::layout::explore(name).ok_or_else(|| ReplayError::Flag {
                    flag: "--out",
                    value: Some(name.clone()),
                    reason: runfiles::layout::EXPLORE_NAME_RULE,
                })?,
            )
        }
    };
    rt.block_on(async {
        out.put(names::REPLAY_RESULTS_JSON, report.json_bytes())
            .await?;
        out.put(
            names::REPLAY_REPORT_MD,
            report.markdown.clone().into_bytes(),
        )
        .await
    })?;
    Ok(report)
}

type LayerOut = (Vec<Cell>, Vec<CurveCell>);

/// The kept experts of `keep` at `layer` (`None`: the keep-all map).
fn kept_layer<'a>(
    keep: &'a super::inputs::KeepInput,
    layer: u32,
    inputs: &'a Inputs,
) -> Result<Option<KeptLayer<'a>>, ReplayError> {
    Ok(match &keep.kept {
        None => None,
        Some(m) => Some(KeptLayer {
            kept: m
                .get(&layer)
                .ok_or_else(|| ReplayError::KeepMapLayer {
                    keep_map: keep.label.clone(),
                    layer,
                })?
                .as_slice(),
            layer,
            routing: &inputs.routing,
            gating: inputs.gating,
        }),
    })
}

fn replay_layer(
    set: &TraceSet,
    kind: TraceKind,
    layer: u32,
    inputs: &Inputs,
    args: &ReplayArgs,
) -> Result<LayerOut, ReplayError> {
    let raw = set.read_layer(layer, inputs.n_expert)?;
    let params = args.params();
    let n_near = if args.policies.contains(&Policy::NearPickEma) {
        args.near_pick_n
    } else {
        0
    };
    // The fit split's requests per expert under each keep map: what `static` pins by.
    let fit_traffic = inputs
        .keep
        .iter()
        .map(|keep| {
            Ok(match args.policies.contains(&Policy::Static) {
                true => pinned::traffic(&Steps::build(
                    &requests(
                        &raw[0], /* Split::ALL[0]: fit */
                        inputs.n_expert,
                        kept_layer(keep, layer, inputs)?,
                        0,
                    ),
                    1,
                )),
                false => Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, ReplayError>>()?;
    let mut cells = Vec::new();
    let mut curves = Vec::new();
    for (split, raw) in Split::ALL.into_iter().zip(&raw) {
        if !args.split.splits().contains(&split) || raw.tokens() == 0 {
            continue;
        }
        for (keep_idx, keep) in inputs.keep.iter().enumerate() {
            let kept = kept_layer(keep, layer, inputs)?;
            let experts = kept.map_or(inputs.n_expert, |k| k.kept.iter().filter(|&&b| b).count());
            let reqs = requests(raw, inputs.n_expert, kept, n_near);
            for &mode in &args.mode {
                let ubatch = match (mode, kind) {
                    (Mode::Token, _) => 1,
                    (Mode::Ubatch, TraceKind::Decode) => continue,
                    (Mode::Ubatch, TraceKind::Prefill) => args.ubatch,
                };
                let steps = Steps::build(&reqs, ubatch);
                let key = |policy, capacity| RowKey {
                    split,
                    trace: kind,
                    mode,
                    keep: keep_idx,
                    policy,
                    capacity,
                };
                for &policy in &args.policies {
                    for (cap_idx, cap) in args.capacity.iter().enumerate() {
                        let size = inputs.expert_bytes.as_ref().and_then(|b| b.get(&layer));
                        let capacity = cap.resolve(experts, size.copied()).ok_or_else(|| {
                            ReplayError::Flag {
                                flag: "--capacity",
                                value: Some(match size {
                                    Some(b) => {
                                        format!("{cap} (an expert of layer {layer} is {b} bytes)")
                                    }
                                    None => format!("{cap} (no expert size for layer {layer})"),
                                }),
                                reason: "a size in bytes needs the model's expert sizes (--model) \
                                         and must hold at least one expert of every layer",
                            }
                        })?;
                        cells.push(Cell {
                            key: key(policy, cap_idx),
                            layer,
                            capacity,
                            tokens: steps.tokens,
                            steps: steps.len() as u64,
                            forced: steps.forced,
                            counts: simulate(
                                policy,
                                &steps,
                                capacity,
                                &params,
                                &fit_traffic[keep_idx],
                            ),
                        });
                    }
                }
                if args.policies.contains(&Policy::Lru) {
                    curves.push(CurveCell {
                        key: key(Policy::Lru, 0),
                        requests: steps.requests(),
                        misses: miss_curve(&steps),
                    });
                }
            }
        }
    }
    Ok((cells, curves))
}
