//! The `replay` command: flags, inputs of a run, and the per-layer fan-out.

use super::keep::requests;
use super::lru::miss_curve;
use super::policy::{simulate, Policy, PolicyParams};
use super::report::{self, Cell, CurveCell, ReplayReport, RowKey};
use super::steps::Steps;
use super::trace_io::TraceSet;
use anyhow::{bail, ensure, Context};
use clap::{Args, ValueEnum};
use common::keepmap::KeepMap;
use common::store::RunStore;
use common::Split;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// Which splits to replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SplitArg {
    /// In-sample: the tokens the keep maps were fitted on.
    Fit,
    /// Held-out tokens.
    Heldout,
    /// Both, side by side.
    Both,
}

impl SplitArg {
    fn includes(self, s: Split) -> bool {
        matches!(
            (self, s),
            (SplitArg::Both, _) | (SplitArg::Fit, Split::Fit) | (SplitArg::Heldout, Split::Heldout)
        )
    }
}

/// What one cache step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One token (decode-like).
    Token,
    /// One ubatch of a chunk (prefill-like): the union of its experts.
    Ubatch,
}

/// Where a trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceKind {
    /// Teacher-forced prefill of corpus chunks: `trace/*.parquet`.
    Prefill,
    /// Tokens the model generated itself: `trace/decode/*.parquet`.
    Decode,
}

/// A per-layer capacity: a number of experts, or a fraction of the layer's
/// experts (the kept ones under a keep map).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Capacity {
    /// That many experts.
    Experts(usize),
    /// That fraction of the layer's experts, rounded, at least 1.
    Fraction(f64),
}

impl Capacity {
    /// Parses `64` (experts), `0.25` or `25%` (fraction).
    pub fn parse(s: &str) -> Result<Capacity, String> {
        let bad = || {
            format!("capacity {s:?} is neither a number of experts nor a fraction in (0, 1] such as 0.25 or 25%")
        };
        if let Some(pct) = s.strip_suffix('%') {
            let f: f64 = pct.trim().parse().map_err(|_| bad())?;
            return Capacity::fraction(f / 100.0).ok_or_else(bad);
        }
        if s.contains('.') {
            let f: f64 = s.trim().parse().map_err(|_| bad())?;
            return Capacity::fraction(f).ok_or_else(bad);
        }
        s.trim().parse().map(Capacity::Experts).map_err(|_| bad())
    }

    fn fraction(f: f64) -> Option<Capacity> {
        (f > 0.0 && f <= 1.0).then_some(Capacity::Fraction(f))
    }

    /// Resident experts for a layer of `experts` experts.
    pub fn resolve(self, experts: usize) -> usize {
        match self {
            Capacity::Experts(c) => c,
            Capacity::Fraction(f) => {
                ((f * experts as f64).round() as usize).clamp(1, experts.max(1))
            }
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capacity::Experts(c) => write!(f, "{c}"),
            Capacity::Fraction(x) => write!(f, "{x}"),
        }
    }
}

/// Arguments of `coordinator replay`.
#[derive(Args, Clone, Debug)]
pub struct ReplayArgs {
    /// Run location (path or object-store URL) with `trace/*.parquet`.
    pub run: String,
    /// Policies to replay, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = Policy::parse,
        default_value = "lru,lfu,ema,near_pick_ema,router_ema,inverse_router_ema,belady"
    )]
    pub policies: Vec<Policy>,
    /// Per-layer capacities: experts (`64`) or fractions of the layer's experts (`0.25`, `25%`).
    #[arg(long, value_delimiter = ',', value_parser = Capacity::parse, default_value = "0.125,0.25,0.5")]
    pub capacity: Vec<Capacity>,
    /// Keep maps: `none`, a name under `keep_maps/` (`frequency_K8`) or a JSON path.
    #[arg(long = "keep-map", value_delimiter = ',', default_value = "none")]
    pub keep_map: Vec<String>,
    /// Splits to replay.
    #[arg(long, value_enum, default_value = "both")]
    pub split: SplitArg,
    /// Step modes, comma-separated (decode traces are replayed per token only).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "token,ubatch"
    )]
    pub mode: Vec<Mode>,
    /// Tokens per ubatch in ubatch mode (llama.cpp's `n_ubatch`).
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// EMA decay per step, in (0, 1).
    #[arg(long, default_value_t = 0.99)]
    pub ema_decay: f64,
    /// Near picks per token for `near_pick_ema`.
    #[arg(long, default_value_t = 4)]
    pub near_pick_n: usize,
    /// Credit of one near pick (a use earns 1).
    #[arg(long, default_value_t = 0.5)]
    pub near_pick_credit: f64,
    /// Model GGUF for expert sizes; default: `model_path` of the run's manifest.json.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl ReplayArgs {
    fn params(&self) -> PolicyParams {
        PolicyParams {
            ema_decay: self.ema_decay,
            near_pick_n: self.near_pick_n,
            near_pick_credit: self.near_pick_credit,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.ema_decay > 0.0 && self.ema_decay < 1.0,
            "--ema-decay {} must be in (0, 1)",
            self.ema_decay
        );
        ensure!(self.ubatch >= 1, "--ubatch must be at least 1");
        ensure!(!self.policies.is_empty(), "--policies names no policy");
        ensure!(!self.capacity.is_empty(), "--capacity names no capacity");
        ensure!(!self.mode.is_empty(), "--mode names no mode");
        Ok(())
    }
}

/// A keep map with its label and a per-layer bitmap.
pub struct KeepInput {
    /// `none` or the map's name.
    pub label: String,
    /// Block index to `kept[expert]`; `None` for no keep map.
    pub kept: Option<BTreeMap<u32, Vec<bool>>>,
}

/// Everything replay reads from the run, before touching a trace layer.
pub struct Inputs {
    /// Routed experts per layer.
    pub n_expert: usize,
    /// Bytes per expert load, per layer, when the model is known.
    pub expert_bytes: Option<BTreeMap<u32, u64>>,
    /// Where the expert sizes came from.
    pub model: Option<PathBuf>,
    /// Keep maps, in flag order.
    pub keep: Vec<KeepInput>,
    /// Trace parts by kind.
    pub traces: Vec<(TraceKind, TraceSet)>,
}

/// Replays the traces of `args.run` and writes `replay/results.json` and
/// `replay/report.md` under it. Call it outside any async runtime.
pub fn replay_run(args: &ReplayArgs) -> anyhow::Result<ReplayReport> {
    args.validate()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the I/O runtime")?;
    let store = RunStore::open(&args.run)?;
    let inputs = rt.block_on(load_inputs(&store, args))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .context("starting replay threads")?;
    let mut cells = Vec::new();
    let mut curves = Vec::new();
    for (kind, set) in &inputs.traces {
        let layers = set.layers();
        let outs = pool.install(|| {
            layers
                .par_iter()
                .map(|&layer| replay_layer(set, *kind, layer, &inputs, args))
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        for (c, k) in outs {
            cells.extend(c);
            curves.extend(k);
        }
    }
    let report = report::build(args, &inputs, cells, curves);
    rt.block_on(async {
        store
            .put("replay/results.json", report.json_bytes())
            .await?;
        store
            .put("replay/report.md", report.markdown.clone().into_bytes())
            .await
    })?;
    Ok(report)
}

async fn load_inputs(store: &RunStore, args: &ReplayArgs) -> anyhow::Result<Inputs> {
    let manifest = match store.get_opt("manifest.json").await? {
        Some(b) => Some(
            serde_json::from_slice::<serde_json::Value>(&b)
                .with_context(|| format!("parsing {}", store.url_of("manifest.json")))?,
        ),
        None => None,
    };
    let model = args.model.clone().or_else(|| {
        let p = manifest.as_ref()?.get("model_path")?.as_str()?;
        Some(PathBuf::from(p)).filter(|p| p.exists())
    });
    let expert_bytes = model
        .as_deref()
        .map(super::model::expert_bytes)
        .transpose()?;
    let n_expert = match store.get_opt("saliency.json").await? {
        Some(b) => serde_json::from_slice::<serde_json::Value>(&b)
            .with_context(|| format!("parsing {}", store.url_of("saliency.json")))?
            .get("n_expert")
            .and_then(|v| v.as_u64())
            .with_context(|| format!("{} has no n_expert", store.url_of("saliency.json")))?,
        None => match model.as_deref() {
            Some(m) => super::model::expert_count(m)?
                .with_context(|| format!("model {} has no expert_count", m.display()))?,
            None => bail!(
                "{} is missing and no model is known (--model): cannot tell the number of experts",
                store.url_of("saliency.json")
            ),
        },
    } as usize;
    ensure!(
        (1..=u16::MAX as usize).contains(&n_expert),
        "n_expert = {n_expert} is out of range"
    );
    let mut keep = Vec::new();
    for spec in &args.keep_map {
        keep.push(load_keep_map(store, spec, n_expert).await?);
    }
    let names = store.list("trace").await?;
    let (decode, prefill): (Vec<String>, Vec<String>) = names
        .into_iter()
        .filter(|n| n.ends_with(".parquet"))
        .partition(|n| n.starts_with("trace/decode/"));
    let mut traces = Vec::new();
    for (kind, names) in [(TraceKind::Prefill, prefill), (TraceKind::Decode, decode)] {
        if let Some(set) = TraceSet::open(store, &names).await? {
            traces.push((kind, set));
        }
    }
    ensure!(
        !traces.is_empty(),
        "{} holds no trace parts",
        store.url_of("trace")
    );
    Ok(Inputs {
        n_expert,
        expert_bytes,
        model,
        keep,
        traces,
    })
}

async fn load_keep_map(store: &RunStore, spec: &str, n_expert: usize) -> anyhow::Result<KeepInput> {
    if spec == "none" {
        return Ok(KeepInput {
            label: "none".into(),
            kept: None,
        });
    }
    let local = PathBuf::from(spec);
    let (label, where_, bytes) = if spec.ends_with(".json") && local.is_file() {
        let bytes = std::fs::read(&local).with_context(|| format!("reading keep map {spec}"))?;
        let label = local
            .file_stem()
            .map_or(spec.to_string(), |s| s.to_string_lossy().into_owned());
        (label, spec.to_string(), bytes)
    } else {
        let name = spec
            .trim_start_matches("keep_maps/")
            .trim_end_matches(".json");
        let object = format!("keep_maps/{name}.json");
        (
            name.to_string(),
            store.url_of(&object),
            store.get(&object).await?.to_vec(),
        )
    };
    let map: KeepMap =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing keep map {where_}"))?;
    let mut kept = BTreeMap::new();
    for (layer, ids) in &map.layers {
        let layer: u32 = layer
            .parse()
            .with_context(|| format!("keep map {where_}: layer key {layer:?} is not a number"))?;
        let mut bits = vec![false; n_expert];
        for &e in ids {
            ensure!(
                (e as usize) < n_expert,
                "keep map {where_}: layer {layer} keeps expert {e}, but n_expert = {n_expert}"
            );
            bits[e as usize] = true;
        }
        kept.insert(layer, bits);
    }
    Ok(KeepInput {
        label,
        kept: Some(kept),
    })
}

type LayerOut = (Vec<Cell>, Vec<CurveCell>);

fn replay_layer(
    set: &TraceSet,
    kind: TraceKind,
    layer: u32,
    inputs: &Inputs,
    args: &ReplayArgs,
) -> anyhow::Result<LayerOut> {
    let raw = set.read_layer(layer, inputs.n_expert)?;
    let params = args.params();
    let n_near = if args.policies.contains(&Policy::NearPickEma) {
        args.near_pick_n
    } else {
        0
    };
    let mut cells = Vec::new();
    let mut curves = Vec::new();
    for (split, raw) in Split::ALL.into_iter().zip(&raw) {
        if !args.split.includes(split) || raw.tokens() == 0 {
            continue;
        }
        for (keep_idx, keep) in inputs.keep.iter().enumerate() {
            let kept = match &keep.kept {
                None => None,
                Some(m) => Some(
                    m.get(&layer)
                        .with_context(|| format!("keep map {} has no layer {layer}", keep.label))?
                        .as_slice(),
                ),
            };
            let experts = kept.map_or(inputs.n_expert, |k| k.iter().filter(|&&b| b).count());
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
                        let capacity = cap.resolve(experts);
                        cells.push(Cell {
                            key: key(policy, cap_idx),
                            layer,
                            capacity,
                            tokens: steps.tokens,
                            steps: steps.len() as u64,
                            forced: steps.forced,
                            counts: simulate(policy, &steps, capacity, &params),
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
