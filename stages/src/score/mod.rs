//! `coordinator score`: rank experts per layer under each method, write keep
//! maps for every K, and the tables of DESIGN section 6.
//!
//! - [`source`]: the statistics a method is scored on (fit, domain, mix).
//! - [`method`]: the methods, their parameters and the ranking rule.
//! - [`keep`]: keep maps from rankings, nested across K by construction.
//! - [`tables`], [`screen`], [`bootstrap`]: what a keep map keeps, what it
//!   costs on traced routing, and how stable it is under resampling.
//! - [`render`]: the tables as Markdown and Parquet.
//! - [`worst`]: the `worst_domain` method's selection and its bound;
//!   [`floor`]: every keep map's worst-served domain.

pub mod bootstrap;
pub mod floor;
pub mod keep;
pub mod merge;
pub mod method;
pub mod render;
pub mod screen;
pub mod source;
pub mod super_experts;
pub mod tables;
#[cfg(test)]
pub(crate) mod testdata;
pub mod worst;

use crate::StagesError;
use config::method::Method;
use keep::{keep_map, rank_layers, LayerRanking};
use method::{Prior, ScoreParams};
use numbers::partial::Partial;
use numbers::saliency::Saliency;
use numbers::stats::ChunkStats;
use numbers::Split;
use runfiles::corpus::{Chunk, CHUNKS_FILE};
use runfiles::keepmap::KeepMap;
use runfiles::layout;
use runfiles::mergeplan::MergePlan;
use runfiles::store::RunStore;
use serde::{Deserialize, Serialize};
use source::{LayerInput, Source};
use std::collections::BTreeMap;

/// Options of `coordinator score` (everything but the run).
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    /// Methods to score, comma-separated.
    pub methods: Vec<Method>,
    /// Keep-map sizes in experts (default: a quarter, half and three
    /// quarters of the experts); the command line's `--k` takes shares too
    /// ([`ScoreRequest::k`]).
    pub k: Vec<u32>,
    /// Score one domain of the fit split.
    pub domain: Option<String>,
    /// Score a weighted mix of fit domains: `a=0.5,b=0.5`.
    pub mix: Option<String>,
    /// Prior of `reap_shrink`: median of live experts' means, or of their LCBs.
    pub prior: Prior,
    /// Prior strength of `reap_shrink`, in pseudo-tokens.
    pub m: f64,
    /// Width of the LCB prior, in standard errors.
    pub z: f64,
    /// Keep floor: an expert with fewer hits ranks after every expert with
    /// at least this many, under every method, and only experts at or above
    /// it inform the prior (1: no floor beyond the dead rule).
    pub c_min: u64,
    /// Let dead experts and experts below the floor compete on score alone.
    pub allow_dead: bool,
    /// Keep super experts first under every method (REAP's rule on the
    /// largest output element per expert: see `super_experts`).
    pub guard_super_experts: bool,
    /// The statistic the super-expert guard reads: `element` (REAP's, the
    /// largest single output element) or `norm` (the largest output norm).
    pub super_expert_statistic: super_experts::Statistic,
    /// Bootstrap resamples for keep-map stability (0: skip).
    pub bootstrap: u32,
    /// Seed of the bootstrap.
    pub seed: u64,
    /// Trace rows (token x layer) the substitution screen reads at most,
    /// whole parts at a time in name order (0: skip the screen).
    pub screen_rows: u64,
    /// How merge plans assign experts to centres: `output` (the cosine of
    /// their mean projected outputs, the router's where the run has none),
    /// `router` (of their router probabilities over the screen's trace
    /// rows) or `output-router` (REAM's mean of both).
    pub merge_similarity: merge::Similarity,
}

/// The defaults of `coordinator score`: the command line's and every caller's.
impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions {
            methods: Method::ALL.to_vec(),
            k: Vec::new(),
            domain: None,
            mix: None,
            prior: Prior::Median,
            m: 10.0,
            z: 1.0,
            c_min: method::DEFAULT_C_MIN,
            allow_dead: false,
            guard_super_experts: false,
            super_expert_statistic: super_experts::Statistic::default(),
            bootstrap: 20,
            seed: 0,
            screen_rows: 2_000_000,
            merge_similarity: merge::Similarity::default(),
        }
    }
}

impl ScoreOptions {
    /// The ranking parameters these options describe.
    pub fn params(&self) -> Result<ScoreParams, StagesError> {
        if !(self.m.is_finite() && self.m >= 0.0 && self.z.is_finite()) {
            return Err(StagesError::Argument {
                argument: format!("--m {} --z {}", self.m, self.z),
                problem: "--m must be finite and >= 0 and --z finite".into(),
            });
        }
        Ok(ScoreParams {
            source: Source::from_flags(self.domain.as_deref(), self.mix.as_deref())?,
            prior: self.prior,
            m: self.m,
            z: self.z,
            c_min: self.c_min.max(1),
            allow_dead: self.allow_dead,
            guard_super_experts: self.guard_super_experts,
            super_expert_statistic: self.super_expert_statistic,
        })
    }

    /// The requested sizes, or the defaults for the model of `s` (a
    /// quarter, half and three quarters of its experts, under grouped
    /// routing rounded down to sizes llama.cpp can run); sorted, unique. A
    /// requested size outside `1..=n_expert`, or one a grouped model cannot
    /// be pruned to ([`numbers::routing::check_group_keep`]), is refused.
    pub fn ks(&self, s: &Saliency) -> Result<Vec<u32>, StagesError> {
        let n_expert = s.n_expert;
        let groups = s.routing.groups;
        let mut ks = if self.k.is_empty() {
            let step = groups.map_or(1, |g| g.n_group.max(1));
            [1, 2, 3]
                .iter()
                .map(|q| (n_expert * q / 4 / step * step).max(1))
                .filter(|&k| size_fits(s, k).is_ok())
                .collect()
        } else {
            self.k.clone()
        };
        ks.sort_unstable();
        ks.dedup();
        for &k in &ks {
            size_fits(s, k).map_err(|problem| StagesError::Argument {
                argument: format!("--k {k}"),
                problem,
            })?;
        }
        if ks.is_empty() {
            return Err(StagesError::Argument {
                argument: "--k".into(),
                problem: format!(
                    "no keep-map size fits the model's routing groups {groups:?}; pass --k"
                ),
            });
        }
        Ok(ks)
    }
}

/// `score`'s options in `coordinator run` with `config` on the model of
/// `s` (the run's own score): the default methods and sizes plus every size
/// the `[eval]` candidates resolve to and the `[ship]` candidates name that
/// `score` can write, so each candidate it can run has its keep map.
/// Candidates that do not resolve are left to the evaluation and ship
/// stages, which name them after verify has run.
pub fn run_options(config: &config::Config, s: &Saliency) -> ScoreOptions {
    let mut options = ScoreOptions::default();
    // No default size may fit a grouped model; the candidates' sizes do.
    let mut ks = options.ks(s).unwrap_or_default();
    let ship = config.ship.as_ref().map(|c| c.sizes()).unwrap_or_default();
    // An unconfigured `[eval]` names no size.
    ks.extend(
        config
            .eval
            .sizes(&config::eval::KeepShape::of(s))
            .unwrap_or_default()
            .into_iter()
            .chain(ship)
            .filter(|&k| size_fits(s, k).is_ok()),
    );
    options.k = ks;
    options
}

/// The options asked for, `a`, that differ from the run's own, `o` (both
/// with their sizes resolved on `s`).
fn differences(
    a: &ScoreOptions,
    o: &ScoreOptions,
    s: &Saliency,
) -> Result<crate::own::Differences, StagesError> {
    let methods = |x: &ScoreOptions| {
        let mut m: Vec<&str> = x.methods.iter().map(|m| m.as_str()).collect();
        m.sort_unstable();
        m.dedup();
        m
    };
    let mut d = crate::own::Differences::default();
    d.check("--methods", methods(a), methods(o));
    d.check("--k", a.ks(s)?, o.ks(s)?);
    d.check("--domain", &a.domain, &o.domain);
    d.check("--mix", &a.mix, &o.mix);
    d.check("--prior", a.prior, o.prior);
    d.check("--m", a.m, o.m);
    d.check("--z", a.z, o.z);
    d.check("--c-min", a.c_min.max(1), o.c_min.max(1));
    d.check("--allow-dead", a.allow_dead, o.allow_dead);
    d.check(
        "--guard-super-experts",
        a.guard_super_experts,
        o.guard_super_experts,
    );
    d.check(
        "--super-expert-statistic",
        a.super_expert_statistic,
        o.super_expert_statistic,
    );
    d.check("--bootstrap", a.bootstrap, o.bootstrap);
    d.check("--seed", a.seed, o.seed);
    d.check("--screen-rows", a.screen_rows, o.screen_rows);
    d.check("--merge-similarity", a.merge_similarity, o.merge_similarity);
    Ok(d)
}

/// Whether `score` can write a keep map of `k` experts per layer for the
/// model of `s`: `k` in `1..=n_expert` and, under grouped routing, a size
/// llama.cpp can run ([`numbers::routing::check_group_keep`]).
pub fn size_fits(s: &Saliency, k: u32) -> Result<(), String> {
    if k == 0 || k > s.n_expert {
        return Err(format!(
            "{k} is not in 1..={} (the model's experts per layer)",
            s.n_expert
        ));
    }
    numbers::routing::check_group_keep(s.routing.groups, s.n_expert, s.n_expert_used, k)
}

/// What the report says about grouped routing: how every keep map is built.
pub fn routing_note(s: &Saliency) -> Option<String> {
    let g = s.routing.groups.filter(|g| g.n_group > 1)?;
    Some(format!(
        "grouped routing: {} groups of {} experts, {} used per token; every keep map keeps K / {} experts of each group (K must be a multiple of {} with at least 2 per group)",
        g.n_group,
        s.n_expert / g.n_group,
        g.n_group_used,
        g.n_group,
        g.n_group
    ))
}

/// What `coordinator score` asks for besides the run: its options, the
/// sizes as given and where to write.
#[derive(Debug)]
pub struct ScoreRequest {
    /// Keep-map sizes: numbers of experts (`8`) or shares of the model's
    /// experts (`50%`, rounded down as `eval` rounds it); empty: the run's
    /// own sizes.
    pub k: Vec<String>,
    /// Scoring options (their `k` is set from [`ScoreRequest::k`]).
    pub options: ScoreOptions,
    /// Write this score (score/, keep_maps/) to `explore/NAME/` in the run,
    /// leaving the run's own score and keep maps as they are (exploring
    /// other methods or sizes).
    pub out: Option<String>,
}

/// Everything `score` computed; written as `score/score.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoreReport {
    /// SHA-256 of the saliency.json bytes scored.
    pub saliency_sha256: String,
    /// Ranking parameters.
    pub params: ScoreParams,
    /// Methods scored.
    pub methods: Vec<String>,
    /// Sizes.
    pub ks: Vec<u32>,
    /// Keep-map object names written.
    pub keep_maps: Vec<String>,
    /// One table per (method, K).
    pub tables: Vec<tables::MapTable>,
    /// Overlaps between methods per K.
    pub overlaps: Vec<tables::Overlap>,
    /// Prior diagnostic per layer.
    pub priors: Vec<tables::PriorRow>,
    /// Substitution screen per (method, K, split).
    pub screen: Vec<screen::ScreenRow>,
    /// Why the screen is missing or partial, if it is.
    pub screen_note: Option<String>,
    /// Each (method, K)'s smallest retained share of a domain's routed
    /// REAP mass (what `worst_domain` maximises; absent in reports written
    /// before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domain_floor: Vec<floor::FloorRow>,
    /// Bootstrap stability per (method, K).
    pub stability: Vec<bootstrap::StabilityRow>,
    /// Why stability is missing, if it is.
    pub stability_note: Option<String>,
    /// How grouped routing shaped the keep maps, for a grouped model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_note: Option<String>,
    /// The experts the super-expert guard kept first, per layer (block
    /// index), when it was on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub super_experts: BTreeMap<u32, Vec<u32>>,
    /// Merge-plan object names written (`merge_plans/<method>_merge_K<k>.json`,
    /// one per keep map; [`merge`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merge_plans: Vec<String>,
    /// Why merge plans are missing, if they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_note: Option<String>,
}

/// The stored score results, when `score/score.json` exists and was computed
/// from the saliency of SHA-256 `sha`; otherwise why not, naming the object
/// and what to run (the later stages never score: a stage writes only its
/// own outputs, and `keep_maps/` belong to `score`).
pub async fn stored_report(
    store: &RunStore,
    sha: &str,
) -> Result<Result<ScoreReport, String>, StagesError> {
    let url = store.url_of(layout::score::REPORT_JSON);
    let Some(bytes) = store.get_opt(layout::score::REPORT_JSON).await? else {
        return Ok(Err(format!(
            "{url} is missing: run `coordinator score` for the keep maps and their tables"
        )));
    };
    let stored: ScoreReport = StagesError::parse_json(&bytes, || url.clone(), "a score report")?;
    if stored.saliency_sha256 != sha {
        return Ok(Err(format!(
            "{url} was computed from another saliency.json (SHA-256 {}, now {sha}): \
             run `coordinator score` again",
            stored.saliency_sha256
        )));
    }
    Ok(Ok(stored))
}

/// The source's layers of `s` under `p`, with the super experts marked
/// when the guard is on.
pub fn scored_layers(s: &Saliency, p: &ScoreParams) -> Result<Vec<LayerInput>, StagesError> {
    let mut layers = p.source.layers(s)?;
    if p.guard_super_experts {
        let guard = super_experts::guarded(s, p.super_expert_statistic)?;
        super_experts::mark(&mut layers, &guard);
    }
    Ok(layers)
}

/// Rankings per method for `s` under `p` (group-balanced under grouped
/// routing).
pub fn rank_all(
    s: &Saliency,
    methods: &[Method],
    p: &ScoreParams,
) -> Result<Vec<(Method, Vec<LayerRanking>)>, StagesError> {
    Ok(rank_each(
        &scored_layers(s, p)?,
        methods,
        p,
        s.routing.groups,
    ))
}

/// Rankings per method of `layers`, group-balanced under `groups`.
fn rank_each(
    layers: &[LayerInput],
    methods: &[Method],
    p: &ScoreParams,
    groups: Option<numbers::routing::ExpertGroups>,
) -> Vec<(Method, Vec<LayerRanking>)> {
    methods
        .iter()
        .map(|&m| (m, rank_layers(m, p, layers, groups)))
        .collect()
}

/// Scores a run and writes keep maps and tables under it.
pub async fn score(store: &RunStore, opts: &ScoreOptions) -> Result<ScoreReport, StagesError> {
    score_into(store, store, opts).await
}

/// Scores the run `store` and writes keep maps and tables under `out` (the
/// run itself, or an exploratory output `explore/NAME/` in it).
pub async fn score_into(
    store: &RunStore,
    out: &RunStore,
    opts: &ScoreOptions,
) -> Result<ScoreReport, StagesError> {
    let runfiles::saliency::SaliencyFile {
        saliency: s,
        sha256: sha,
    } = runfiles::saliency::read(store).await?;
    let p = opts.params()?;
    let ks = opts.ks(&s)?;
    let mut methods = opts.methods.clone();
    methods.sort();
    methods.dedup();
    let layers = scored_layers(&s, &p)?;
    let ranked = rank_each(&layers, &methods, &p, s.routing.groups);
    let mut maps = Vec::new();
    let mut report_tables = Vec::new();
    let mut domain_floor = Vec::new();
    for (m, r) in &ranked {
        for &k in &ks {
            let map = keep_map(*m, k, &p, &sha, r)?;
            let name = KeepMap::file_name(m.as_str(), k);
            let mut bytes = StagesError::encode_json(&name, &map)?;
            bytes.push(b'\n');
            out.put(&name, bytes).await?;
            report_tables.push(tables::map_table(m.as_str(), k, &layers, r));
            domain_floor.push(floor::floor_row(*m, k, &layers, r));
            maps.push((name, map));
        }
    }
    let mut overlaps = Vec::new();
    for &k in &ks {
        for (i, (a, ra)) in ranked.iter().enumerate() {
            for (b, rb) in &ranked[i + 1..] {
                overlaps.push(tables::overlap(k, (a.as_str(), ra), (b.as_str(), rb)));
            }
        }
    }
    let outputs = load_output_means(store, &s).await?;
    let similarity = merge_similarity(opts.merge_similarity, outputs.is_some());
    let ids: Vec<u32> = layers.iter().map(|l| l.layer).collect();
    let gram_layers = similarity.needs_router().then_some(ids.as_slice());
    let pass = read_traces(store, &s, &maps, opts.screen_rows, gram_layers).await?;
    let (screen, screen_note) = (pass.screen, pass.note);
    let close = merge::Closeness {
        similarity,
        gram: pass.gram.as_ref(),
        outputs: outputs.as_ref(),
    };
    let (merge_plans, merge_note) =
        write_merge_plans(out, &s, &layers, &ranked, &maps, opts, &close).await?;
    let merge_note = match (merge_note, similarity != opts.merge_similarity) {
        (Some(n), _) => Some(n),
        (None, true) => Some(format!(
            "merge plans use the router's similarity: {} holds no projected expert outputs \
             (collected with `[run] merge_projection = 0`, or before partial format 9)",
            layout::MERGED_PARTIAL
        )),
        (None, false) => None,
    };
    let guarded: Vec<Vec<bool>> = layers.iter().map(|l| l.guarded.clone()).collect();
    let full = Full {
        ranked: &ranked,
        guarded: &guarded,
    };
    let (stability, stability_note) = run_bootstrap(store, &s, &p, full, &ks, opts).await?;
    let report = ScoreReport {
        saliency_sha256: sha,
        params: p,
        methods: methods.iter().map(|m| m.as_str().to_string()).collect(),
        ks,
        keep_maps: maps.into_iter().map(|(n, _)| n).collect(),
        tables: report_tables,
        overlaps,
        priors: layers.iter().map(tables::prior_row).collect(),
        screen,
        screen_note,
        domain_floor,
        stability,
        stability_note,
        routing_note: routing_note(&s),
        super_experts: layers
            .iter()
            .map(|l| {
                let ids = (0..l.guarded.len() as u32).filter(|&e| l.guarded[e as usize]);
                (l.layer, ids.collect::<Vec<u32>>())
            })
            .filter(|(_, ids)| !ids.is_empty())
            .collect(),
        merge_plans,
        merge_note,
    };
    let mut json = StagesError::encode_json(layout::score::REPORT_JSON, &report)?;
    json.push(b'\n');
    out.put(layout::score::REPORT_JSON, json).await?;
    out.put(layout::score::TABLES_MD, render::markdown(&report))
        .await?;
    out.put(layout::score::TABLES_PARQUET, render::parquet(&report)?)
        .await?;
    Ok(report)
}

/// `wanted`, or the router's where it needs projected outputs the run
/// lacks.
fn merge_similarity(wanted: merge::Similarity, has_outputs: bool) -> merge::Similarity {
    match wanted.needs_outputs() && !has_outputs {
        true => merge::Similarity::Router,
        false => wanted,
    }
}

/// The fit split's mean projected expert outputs, from
/// `partials/merged.bin` (None without it or without a projection).
async fn load_output_means(
    store: &RunStore,
    s: &Saliency,
) -> Result<Option<merge::OutputMeans>, StagesError> {
    let Some(bytes) = store.get_opt(layout::MERGED_PARTIAL).await? else {
        return Ok(None);
    };
    let packed =
        numbers::partial::PackedPartial::parse(bytes).map_err(|problem| StagesError::Artifact {
            url: store.url_of(layout::MERGED_PARTIAL),
            problem,
        })?;
    let p = packed.header();
    let Some(projection) = p.projection.as_ref() else {
        return Ok(None);
    };
    let fit = p
        .experts
        .split_total(numbers::Split::Fit)
        .map_err(|e| StagesError::Artifact {
            url: store.url_of(layout::MERGED_PARTIAL),
            problem: e.to_string(),
        })?;
    let counts: Vec<Vec<u64>> = fit
        .map(|g| g.layers.into_iter().map(|l| l.count).collect())
        .unwrap_or_default();
    if p.experts.shape.n_expert != s.n_expert {
        return Ok(None);
    }
    let layers = &p.experts.shape.moe_layers;
    Ok(merge::OutputMeans::of(projection, layers, &counts))
}

/// Writes a merge plan beside every keep map ([`merge`]), experts assigned
/// by `close`; super experts by the guard's statistic
/// (`opts.super_expert_statistic`) where `saliency.json` has it (else the
/// keep maps' guard). None, with the reason, when `close` needs the
/// router's similarity and no trace row was read.
async fn write_merge_plans(
    out: &RunStore,
    s: &Saliency,
    layers: &[LayerInput],
    ranked: &[(Method, Vec<LayerRanking>)],
    maps: &[(String, KeepMap)],
    opts: &ScoreOptions,
    close: &merge::Closeness<'_>,
) -> Result<(Vec<String>, Option<String>), StagesError> {
    if close.similarity.needs_router() && close.gram.is_none() {
        return Ok((
            Vec::new(),
            Some("no merge plans: no trace rows to measure the router's similarity on".into()),
        ));
    }
    let supers = super_experts::guarded(s, opts.super_expert_statistic).ok();
    let layers: Vec<LayerInput> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut l = l.clone();
            if let Some(g) = supers.as_ref().and_then(|g| g.get(i)) {
                // Empty when the keep maps' guard is off.
                l.guarded.resize(g.len(), false);
                l.guarded.iter_mut().zip(g).for_each(|(a, b)| *a |= *b);
            }
            l
        })
        .collect();
    let mut names = Vec::new();
    for (_, map) in maps {
        let Some((_, r)) = ranked.iter().find(|(m, _)| m.as_str() == map.method) else {
            continue;
        };
        let plan = merge::merge_plan(&map.method, map, r, &layers, close);
        let object = MergePlan::file_name(&map.method, map.k);
        let mut bytes = StagesError::encode_json(&object, &plan)?;
        bytes.push(b'\n');
        out.put(&object, bytes).await?;
        names.push(object);
    }
    Ok((names, None))
}

/// What one pass over the trace parts gave: the substitution screen, and
/// the router's Gram matrix when asked for (None without trace rows).
struct TracePass {
    screen: Vec<screen::ScreenRow>,
    note: Option<String>,
    gram: Option<merge::RouterGram>,
}

/// Reads the first `max_rows` trace rows (whole parts, in name order) once,
/// feeding the substitution screen and, with `gram` (its MoE layers), the
/// router's Gram matrix for merge plans.
async fn read_traces(
    store: &RunStore,
    s: &Saliency,
    maps: &[(String, KeepMap)],
    max_rows: u64,
    gram: Option<&[u32]>,
) -> Result<TracePass, StagesError> {
    let none = |note: &str| TracePass {
        screen: Vec::new(),
        note: Some(note.into()),
        gram: None,
    };
    // Decode traces (tokens the model generated itself) are not screened.
    let (parts, _decode) = runfiles::trace::stored_parts(store).await?;
    if parts.is_empty() {
        return Ok(none("no trace parts under trace/"));
    }
    if max_rows == 0 {
        return Ok(none("screen disabled (--screen-rows 0)"));
    }
    let masks: Vec<screen::KeepMask> = maps
        .iter()
        .map(|(_, m)| screen::KeepMask::new(m, s.n_expert as usize, &s.routing, s.gating))
        .collect();
    let mut router = gram.map(|ids| merge::RouterGram::new(ids, s.n_expert as usize));
    let mut acc = BTreeMap::new();
    let mut read = 0u64;
    let mut note = None;
    for (i, part) in parts.iter().enumerate() {
        if read >= max_rows {
            note = Some(format!(
                "partial: the first {i} of {} trace parts ({read} rows; raise --screen-rows for more)",
                parts.len()
            ));
            break;
        }
        let rows = runfiles::trace::read_part(store.get(part).await?).map_err(|problem| {
            StagesError::Artifact {
                url: store.url_of(part),
                problem,
            }
        })?;
        read += rows.len() as u64;
        screen::screen_rows(&masks, &rows, &mut acc);
        if let Some(g) = router.as_mut() {
            g.add(&rows);
        }
    }
    let screen = acc
        .iter()
        .map(|((i, split), a)| a.finish(&masks[*i].method, masks[*i].k, *split))
        .collect();
    Ok(TracePass {
        screen,
        note,
        gram: router,
    })
}

/// The fit split's per-chunk statistics: from `partials/merged.bin`, else
/// from every other partial (first copy of a chunk wins).
pub async fn load_chunk_stats(store: &RunStore) -> Result<Vec<ChunkStats>, StagesError> {
    let names = match store.get_opt(layout::MERGED_PARTIAL).await? {
        Some(_) => vec![layout::MERGED_PARTIAL.to_string()],
        None => store
            .list(layout::PARTIALS_DIR)
            .await?
            .into_iter()
            .filter(|n| n.ends_with(".bin"))
            .collect(),
    };
    let mut by_chunk = BTreeMap::new();
    for name in names {
        let p = Partial::from_bytes(&store.get(&name).await?).map_err(|problem| {
            StagesError::Artifact {
                url: store.url_of(&name),
                problem,
            }
        })?;
        for c in p.chunk_stats {
            by_chunk.entry(c.chunk).or_insert(c);
        }
    }
    Ok(by_chunk.into_values().collect())
}

/// The run's chunk table (`corpus/chunks.parquet`); `None` for a run whose
/// corpus was written elsewhere (`worker collect --corpus DIR --out RUN`).
async fn load_chunk_table(store: &RunStore) -> Result<Option<Vec<Chunk>>, StagesError> {
    let corpus = store.child("corpus");
    let Some(bytes) = corpus.get_opt(CHUNKS_FILE).await? else {
        return Ok(None);
    };
    let url = corpus.url_of(CHUNKS_FILE);
    let read = tokio::task::spawn_blocking(move || runfiles::corpus::read_chunks(bytes, None));
    let problem = match read.await {
        Ok(Ok(chunks)) => return Ok(Some(chunks)),
        Ok(Err(problem)) => problem,
        Err(e) => format!("reading it panicked: {e}"),
    };
    Err(StagesError::Artifact { url, problem })
}

/// The full-data rankings the bootstrap compares resamples with, and the
/// super experts they kept first.
struct Full<'a> {
    ranked: &'a [(Method, Vec<LayerRanking>)],
    guarded: &'a [Vec<bool>],
}

async fn run_bootstrap(
    store: &RunStore,
    s: &Saliency,
    p: &ScoreParams,
    full: Full<'_>,
    ks: &[u32],
    opts: &ScoreOptions,
) -> Result<(Vec<bootstrap::StabilityRow>, Option<String>), StagesError> {
    if opts.bootstrap == 0 {
        return Ok((
            Vec::new(),
            Some("bootstrap disabled (--bootstrap 0)".into()),
        ));
    }
    if p.source != Source::Fit {
        return Ok((
            Vec::new(),
            Some(
                "per-chunk statistics cover the fit split only; no bootstrap for a domain or mix"
                    .into(),
            ),
        ));
    }
    let chunks = load_chunk_stats(store).await?;
    if chunks.is_empty() {
        return Ok((
            Vec::new(),
            Some("no per-chunk statistics in partials/".into()),
        ));
    }
    let layers: Vec<u32> = s
        .split(Split::Fit)
        .map(|f| f.layers.iter().map(|l| l.layer).collect())
        .unwrap_or_default();
    let reference = bootstrap::Reference {
        // Per-chunk statistics carry no domain, which worst_domain ranks on.
        methods: full
            .ranked
            .iter()
            .filter(|(m, _)| *m != Method::WorstDomain)
            .map(|(m, r)| (*m, r.as_slice()))
            .collect(),
        ks,
        groups: s.routing.groups,
        guarded: full.guarded,
    };
    // Chunks of one fit group resample together; without the chunk table
    // the groups are unknown, and chunks resampled alone would claim more
    // stability than the data holds.
    let Some(table) = load_chunk_table(store).await? else {
        return Ok((
            Vec::new(),
            Some(format!(
                "no bootstrap: no {} to resample the fit split by group",
                store.child("corpus").url_of(CHUNKS_FILE)
            )),
        ));
    };
    let groups =
        bootstrap::fit_groups(&table, &chunks).map_err(|problem| StagesError::Artifact {
            url: store.child("corpus").url_of(CHUNKS_FILE),
            problem,
        })?;
    let clusters = bootstrap::clusters_of(&groups);
    let rows = bootstrap::stability(
        &chunks,
        &clusters,
        &layers,
        s.n_expert as usize,
        p,
        &reference,
        opts.bootstrap,
        opts.seed,
    )?;
    let note = full
        .ranked
        .iter()
        .any(|(m, _)| *m == Method::WorstDomain)
        .then(|| "no bootstrap for worst_domain: per-chunk statistics carry no domain".into());
    Ok((rows, note))
}

/// `coordinator score`: writes to the run only with the options of the
/// run's config ([`run_options`]; without sizes, its sizes), and with any
/// options under `--out NAME` to `explore/NAME/` in the run, leaving the
/// run's own results as they are. Returns the report and where it was
/// written.
pub async fn score_request(
    store: &RunStore,
    mut request: ScoreRequest,
) -> Result<(ScoreReport, RunStore), StagesError> {
    let out = crate::own::explore_output(store, request.out.as_deref())?;
    let s = runfiles::saliency::read(store).await?.saliency;
    let own = match crate::own::recorded_config(store).await? {
        Some(config) => run_options(&config, &s),
        None => ScoreOptions::default(),
    };
    if request.k.is_empty() {
        request.options.k = own.k.clone();
    } else {
        let shape = config::eval::KeepShape::of(&s);
        request.options.k = request
            .k
            .iter()
            .map(|spec| {
                shape.count(spec).map_err(|problem| StagesError::Argument {
                    argument: format!("--k {spec}"),
                    problem,
                })
            })
            .collect::<Result<_, _>>()?;
    }
    if request.out.is_none() {
        differences(&request.options, &own, &s)?.allow("score/, keep_maps/ and merge_plans/")?;
    }
    let report = score_into(store, &out, &request.options).await?;
    Ok((report, out))
}

#[cfg(test)]
mod tests;
