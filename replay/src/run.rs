//! The `replay` command: its options and the per-layer fan-out.

use super::capacity::Capacity;
use super::inputs::{load_inputs, Inputs};
use super::keep::{requests, KeptLayer};
use super::lru::miss_curve;
use super::pinned;
use super::policy::{simulate, Cache, Policy, PolicyParams};
use super::predict::{self, Predictor};
use super::prefetch::{self, Prefetch};
use super::prefetch_report::{self, AccuracyCell, PrefetchCell, PrefetchKey};
use super::report::{self, Cell, CurveCell, RowKey, Setup};
use super::results::{Mode, ReplayReport, TraceKind};
use super::steps::Steps;
use super::trace_io::TraceSet;
use crate::ReplayError;
use numbers::{Split, Splits};
use rayon::prelude::*;
use runfiles::layout;
use runfiles::store::RunStore;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `--policies`' default: every policy.
pub const DEFAULT_POLICIES: &str =
    "lru,lfu,ema,near_pick_ema,router_ema,inverse_router_ema,belady,static";

/// `--capacity`'s default: an eighth, a quarter and half of the layer's experts.
pub const DEFAULT_CAPACITY: &str = "0.125,0.25,0.5";

/// `--mode`'s default: both step modes.
pub const DEFAULT_MODES: &str = "token,ubatch";

/// `--prefetch-m`'s default: prefetch lists of `k` and `2k` experts.
pub const DEFAULT_PREFETCH_M: &str = "1,2";

/// Baseline distances: "same experts as this layer", 1 and 2 layers ahead.
const BASELINE_DISTANCES: [u8; 2] = [1, 2];

/// Recall is measured for the first `m = k x` each of these guesses.
const RECALL_M: [usize; 3] = [1, 2, 4];

/// What a replay does (`coordinator replay`'s flags, read by its command
/// line in the coordinator package; [`ReplayArgs::for_run`] gives the defaults).
#[derive(Clone, Debug)]
pub struct ReplayArgs {
    /// Run location (path or object-store URL) with `trace/*.parquet`.
    pub run: String,
    /// Policies to replay, comma-separated.
    pub policies: Vec<Policy>,
    /// Per-layer capacities: experts (`64`), fractions of the layer's
    /// (kept) experts (`0.25`, `25%`), or bytes of expert weights (`512MiB`,
    /// `2GB`: the experts that fit, so keep maps compare at equal memory).
    pub capacity: Vec<Capacity>,
    /// Keep maps: `none`, a name under `keep_maps/` (`frequency_K8`) or a JSON path.
    pub keep_map: Vec<String>,
    /// Splits to replay: fit (the tokens the keep maps were fitted on),
    /// heldout or both, side by side.
    pub split: Splits,
    /// Step modes, comma-separated (decode traces are replayed per token only).
    pub mode: Vec<Mode>,
    /// Tokens per ubatch in ubatch mode (llama.cpp's `n_ubatch`).
    pub ubatch: usize,
    /// EMA decay per step, in (0, 1).
    pub ema_decay: f64,
    /// Near picks per token for `near_pick_ema`.
    pub near_pick_n: usize,
    /// Credit of one near pick (a use earns 1).
    pub near_pick_credit: f64,
    /// Prefetch replay (token steps, no keep map): lists of at most `m = k x`
    /// each of these experts per step; `0` alone turns prefetch replay off.
    pub prefetch_m: Vec<usize>,
    /// Model GGUF for expert sizes; default: `model_path` of the run's manifest.json.
    pub model: Option<PathBuf>,
    /// Worker threads (0: one per core).
    pub threads: usize,
    /// Write this replay (`replay/`) to `explore/NAME/` in the run, leaving
    /// the run's own results as they are.
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
            prefetch_m: DEFAULT_PREFETCH_M
                .split(',')
                .map(|m| m.parse().expect("a multiple of k"))
                .collect(),
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
    let mut prefetch_cells = Vec::new();
    let mut accuracy = Vec::new();
    for (kind, set) in &inputs.traces {
        let layers = set.layers();
        let outs = pool.install(|| {
            layers
                .par_iter()
                .map(|&layer| {
                    let (c, k) = replay_layer(set, *kind, layer, &inputs, args)?;
                    let (p, a) = prefetch_layer(set, *kind, layer, &inputs, args)?;
                    Ok::<_, ReplayError>((c, k, p, a))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        for (c, k, p, a) in outs {
            cells.extend(c);
            curves.extend(k);
            prefetch_cells.extend(p);
            accuracy.extend(a);
        }
    }
    let setup = Setup {
        params: args.params(),
        ubatch: args.ubatch,
        capacities: &args.capacity,
    };
    let mut report = report::build(setup, &inputs, cells, curves);
    prefetch_report::add(
        &mut report,
        &args.capacity,
        &inputs,
        prefetch_cells,
        accuracy,
    );
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
        out.put(layout::REPLAY_RESULTS_JSON, report.json_bytes())
            .await?;
        out.put(
            layout::REPLAY_REPORT_MD,
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
                        let capacity = resolve(cap, experts, size.copied(), layer)?;
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

type PrefetchOut = (Vec<PrefetchCell>, Vec<AccuracyCell>);

/// The capacity of `cap` in a layer of `experts` experts of `size` bytes.
fn resolve(
    cap: &Capacity,
    experts: usize,
    size: Option<u64>,
    layer: u32,
) -> Result<usize, ReplayError> {
    cap.resolve(experts, size).ok_or_else(|| ReplayError::Flag {
        flag: "--capacity",
        value: Some(match size {
            Some(b) => format!("{cap} (an expert of layer {layer} is {b} bytes)"),
            None => format!("{cap} (no expert size for layer {layer})"),
        }),
        reason: "a size in bytes needs the model's expert sizes (--model) \
                 and must hold at least one expert of every layer",
    })
}

/// Prefetch replay and predictor recall of one layer (token steps, no keep
/// map): guesses made `d` layers earlier, read from layer `layer - d`.
fn prefetch_layer(
    set: &TraceSet,
    kind: TraceKind,
    layer: u32,
    inputs: &Inputs,
    args: &ReplayArgs,
) -> Result<PrefetchOut, ReplayError> {
    let multiples: Vec<usize> = args.prefetch_m.iter().copied().filter(|&m| m > 0).collect();
    if multiples.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let layers = set.layers();
    let raw = set.read_layer(layer, inputs.n_expert)?;
    let mut distances: Vec<u8> = BASELINE_DISTANCES.to_vec();
    distances.extend(set.ahead.iter().map(|&(d, _)| d));
    distances.sort_unstable();
    distances.dedup();
    let mut sources = BTreeMap::new();
    for &d in &distances {
        let Some(src) = layer
            .checked_sub(u32::from(d))
            .filter(|l| layers.contains(l))
        else {
            continue;
        };
        sources.insert(d, set.read_layer(src, inputs.n_expert)?);
    }
    let mut predictors = vec![Predictor::Oracle];
    predictors.extend(BASELINE_DISTANCES.map(Predictor::SameLayer));
    predictors.extend(set.ahead.iter().map(|&(d, _)| Predictor::Lookahead(d)));
    let params = args.params();
    let n_near = if args.policies.contains(&Policy::NearPickEma) {
        args.near_pick_n
    } else {
        0
    };
    let mut cells = Vec::new();
    let mut accuracy = Vec::new();
    // The fit split's requests per expert: what `static` pins by.
    let fit = match args.policies.contains(&Policy::Static) {
        true => pinned::traffic(&Steps::build(
            &requests(&raw[0], inputs.n_expert, None, 0),
            1,
        )),
        false => Vec::new(),
    };
    for (s_idx, (split, target)) in Split::ALL.into_iter().zip(&raw).enumerate() {
        if !args.split.splits().contains(&split) || target.tokens() == 0 {
            continue;
        }
        let steps = Steps::build(&requests(target, inputs.n_expert, None, n_near), 1);
        let mut base = BTreeMap::new();
        for &predictor in &predictors {
            let source = sources
                .get(&(predictor.distance() as u8))
                .map(|s| &s[s_idx]);
            let Some(g) = predict::guesses(predictor, target, source) else {
                continue;
            };
            if predictor != Predictor::Oracle {
                for x in RECALL_M {
                    accuracy.push(AccuracyCell {
                        split,
                        trace: kind,
                        layer,
                        predictor,
                        m: x * target.k,
                        recall: predict::recall(target, &g, x * target.k),
                    });
                }
            }
            for &x in &multiples {
                let m = x * target.k;
                let pf = Prefetch::from_guesses(&g.ids, g.width, m);
                for &policy in &args.policies {
                    for (cap_idx, cap) in args.capacity.iter().enumerate() {
                        let size = inputs
                            .expert_bytes
                            .as_ref()
                            .and_then(|b| b.get(&layer))
                            .copied();
                        let capacity = resolve(cap, inputs.n_expert, size, layer)?;
                        let cache = Cache::new(policy, capacity, &params, &fit);
                        let base_misses = *base.entry((policy, capacity)).or_insert_with(|| {
                            simulate(policy, &steps, capacity, &params, &fit).misses
                        });
                        cells.push(PrefetchCell {
                            key: PrefetchKey {
                                trace: kind,
                                policy,
                                capacity: cap_idx,
                                predictor,
                                m,
                                split,
                            },
                            layer,
                            capacity,
                            tokens: steps.tokens,
                            counts: prefetch::simulate(cache, &steps, &pf),
                            base_misses,
                        });
                    }
                }
            }
        }
    }
    Ok((cells, accuracy))
}
