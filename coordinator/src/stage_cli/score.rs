//! `coordinator score RUN`: rank experts, write keep maps for every K and
//! the scoring tables ([`stages::score`]).

use super::{name_of, named, Named};
use config::method::Method;
use runfiles::store::RunStore;
use stages::score::merge::Similarity;
use stages::score::method::Prior;
use stages::score::super_experts::Statistic;
use stages::score::{render, ScoreOptions, ScoreRequest};
use std::process::ExitCode;

/// The scoring methods by the names files and flags use.
const METHODS: &Named<Method> = &[
    (Method::Frequency, "frequency", "`count`"),
    (Method::ReapMean, "reap_mean", "`reap_l2_sum / count`"),
    (Method::ReapL2Sum, "reap_l2_sum", "`reap_l2_sum`"),
    (
        Method::ReapShrink,
        "reap_shrink",
        "`(reap_l2_sum + m * mu0) / (count + m)`",
    ),
    (
        Method::ReapHybrid,
        "reap_hybrid",
        "Mean of the ranks under `reap_l2_sum` and `reap_shrink`",
    ),
    (
        Method::WorstDomain,
        "worst_domain",
        "The experts maximising the smallest, over calibration domains, of the domain's retained share of its `reap_l2_sum` (greedy leximin)",
    ),
];

/// `--prior`.
const PRIORS: &Named<Prior> = &[
    (
        Prior::Median,
        "median",
        "Median of per-expert means over the prior's experts",
    ),
    (
        Prior::Lcb,
        "lcb",
        "Median of per-expert lower confidence bounds `mean - z * sd / sqrt(count)`",
    ),
];

/// `--super-expert-statistic`.
const STATISTICS: &Named<Statistic> = &[
    (
        Statistic::Element,
        "element",
        "The largest single output element (`act_max`): REAP's",
    ),
    (
        Statistic::Norm,
        "norm",
        "The largest output norm (`ean_max`): the guard's rule before REAP's statistic was measured",
    ),
];

/// `--merge-similarity`.
const SIMILARITIES: &Named<Similarity> = &[
    (
        Similarity::Output,
        "output",
        "Cosine of the experts' mean projected outputs (HC-SMoE's); the router's where the run collected no projection",
    ),
    (
        Similarity::Router,
        "router",
        "Cosine of the experts' router probabilities over traced fit tokens",
    ),
    (
        Similarity::OutputRouter,
        "output-router",
        "REAM's: the mean of the output similarity mapped to `[0, 1]` (`(1 + cos) / 2`) and the router's (already in `[0, 1]`)",
    ),
];

/// Arguments of `coordinator score`.
#[derive(clap::Args, Debug)]
pub struct ScoreArgs {
    /// Run location (path or URL) holding saliency.json.
    pub run: String,
    /// Keep-map sizes, comma-separated: numbers of experts (`8`) or shares
    /// of the model's experts (`50%`, rounded down as `eval` rounds it);
    /// default: a quarter, half and three quarters of the experts.
    #[arg(long, value_delimiter = ',')]
    pub k: Vec<String>,
    /// Scoring options.
    #[command(flatten)]
    pub options: ScoreFlags,
    /// Write this score (score/, keep_maps/) to `explore/NAME/` in the run,
    /// leaving the run's own score and keep maps as they are (exploring
    /// other methods or sizes).
    #[arg(long, value_name = "NAME")]
    pub out: Option<String>,
}

/// The scoring options' flags ([`ScoreOptions`], whose defaults they take).
#[derive(clap::Args, Debug)]
pub struct ScoreFlags {
    /// Methods to score, comma-separated.
    #[arg(long, value_parser = named(METHODS), value_delimiter = ',', default_values = ScoreOptions::default().methods.into_iter().map(|m| name_of(METHODS, m)))]
    pub methods: Vec<Method>,
    /// Score one domain of the fit split.
    #[arg(long)]
    pub domain: Option<String>,
    /// Score a weighted mix of fit domains: `a=0.5,b=0.5`.
    #[arg(long)]
    pub mix: Option<String>,
    /// Prior of `reap_shrink`: median of live experts' means, or of their LCBs.
    #[arg(long, value_parser = named(PRIORS), default_value = name_of(PRIORS, ScoreOptions::default().prior))]
    pub prior: Prior,
    /// Prior strength of `reap_shrink`, in pseudo-tokens.
    #[arg(long, default_value_t = ScoreOptions::default().m)]
    pub m: f64,
    /// Width of the LCB prior, in standard errors.
    #[arg(long, default_value_t = ScoreOptions::default().z)]
    pub z: f64,
    /// Keep floor: an expert with fewer hits ranks after every expert with
    /// at least this many, under every method, and only experts at or above
    /// it inform the prior (1: no floor beyond the dead rule).
    #[arg(long, default_value_t = ScoreOptions::default().c_min)]
    pub c_min: u64,
    /// Let dead experts and experts below the floor compete on score alone.
    #[arg(long)]
    pub allow_dead: bool,
    /// Keep super experts first under every method (REAP's rule on the
    /// largest output element per expert: see `super_experts`).
    #[arg(long)]
    pub guard_super_experts: bool,
    /// The statistic the super-expert guard reads: `element` (REAP's, the
    /// largest single output element) or `norm` (the largest output norm).
    #[arg(long, value_parser = named(STATISTICS), default_value = name_of(STATISTICS, ScoreOptions::default().super_expert_statistic))]
    pub super_expert_statistic: Statistic,
    /// Bootstrap resamples for keep-map stability (0: skip).
    #[arg(long, default_value_t = ScoreOptions::default().bootstrap)]
    pub bootstrap: u32,
    /// Seed of the bootstrap.
    #[arg(long, default_value_t = ScoreOptions::default().seed)]
    pub seed: u64,
    /// Trace rows (token x layer) the substitution screen reads at most,
    /// whole parts at a time in name order (0: skip the screen).
    #[arg(long, default_value_t = ScoreOptions::default().screen_rows)]
    pub screen_rows: u64,
    /// How merge plans assign experts to centres: `output` (the cosine of
    /// their mean projected outputs, the router's where the run has none),
    /// `router` (of their router probabilities over the screen's trace
    /// rows) or `output-router` (REAM's mean of both).
    #[arg(long, value_parser = named(SIMILARITIES), default_value = name_of(SIMILARITIES, ScoreOptions::default().merge_similarity))]
    pub merge_similarity: Similarity,
}

impl From<ScoreFlags> for ScoreOptions {
    fn from(f: ScoreFlags) -> Self {
        ScoreOptions {
            methods: f.methods,
            // Set from `--k` by the stage ([`ScoreRequest::k`]).
            k: Vec::new(),
            domain: f.domain,
            mix: f.mix,
            prior: f.prior,
            m: f.m,
            z: f.z,
            c_min: f.c_min,
            allow_dead: f.allow_dead,
            guard_super_experts: f.guard_super_experts,
            super_expert_statistic: f.super_expert_statistic,
            bootstrap: f.bootstrap,
            seed: f.seed,
            screen_rows: f.screen_rows,
            merge_similarity: f.merge_similarity,
        }
    }
}

/// Entry point of `coordinator score`: writes to the run only with the
/// options of the run's config (without `--k`, its sizes), and with any
/// options under `--out NAME` to `explore/NAME/` in the run
/// ([`stages::score::score_request`]).
pub fn run(args: ScoreArgs) -> anyhow::Result<ExitCode> {
    let store = RunStore::open(&args.run)?;
    let exploring = args.out.is_some();
    let request = ScoreRequest {
        k: args.k,
        options: args.options.into(),
        out: args.out,
    };
    let rt = super::async_runtime()?;
    let (report, out) = rt.block_on(stages::score::score_request(&store, request))?;
    print!("{}", render::summary(&report));
    if exploring {
        println!("wrote {}", out.url());
    }
    Ok(ExitCode::SUCCESS)
}
