//! The evaluator: runs corpus chunks through the base model and each pruned
//! candidate and compares their next-token distributions (DESIGN section 12).
//!
//! Each chunk runs alone in its sequence in every model (KV caches cleared),
//! in micro-batches of `n_ubatch` tokens with outputs on every token, like
//! collection. The base model and every candidate decode the same tokens
//! and their scored rows are compared, in one of two ways ([`Compare`]):
//!
//! - **on the device** (the default with layers on a GPU): the logits
//!   never leave the backend that computed them. The base model's scored
//!   rows are kept there
//!   ([`LogitsCompare`](llama::LogitsCompare)), each candidate's
//!   are compared with them in f32, and only per-position figures come
//!   back (4 bytes per position for the base model, 16 per candidate); a
//!   micro-batch without scored positions skips the output head.
//! - **on the host** (the reference, and the default on the CPU backend,
//!   where the f64 comparison costs less than the backend's): llama.cpp
//!   copies every logits row to the host and [`rows`] compares them in
//!   f64, split over threads. The models decode a group of micro-batches
//!   (a lease's, at small vocabularies) one model after the other, so that
//!   each keeps its weights in the CPU's cache (`host`).
//!
//! Either way the per-position values are folded exactly into the partial,
//! in position order, and no whole-vocabulary file is ever written. See
//! [`metrics`] for the figures.
//!
//! With fewer models in memory than the base and every candidate
//! ([`EvalOptions::models_in_memory`]), the models run one after another
//! ([`turns`]): the base model decodes a lease once and its scored logits
//! rows are kept ([`kept`]: host memory up to a bound, else a scratch file);
//! then each candidate is loaded, decodes the lease and is compared with
//! them. The forward passes stay 1 + n per lease and the figures are the
//! all-at-once path's bit for bit, on either comparison path.
//!
//! An image chunk's images are encoded once through the base model's mmproj
//! and their embeddings decoded by every model, in micro-batches cut at the
//! images' edges ([`crate::images`]); positions whose context holds an image
//! are scored in their group's image modality ([`scored_positions`]).

pub mod candidates;
mod device;
mod exp;
mod generate;
mod host;
mod kept;
pub mod memory;
pub mod metrics;
mod plan;
mod positions;
pub mod rows;
mod turns;

use crate::collect::{
    check_chunks, chunk_context, corpus_error, expert_counts, model_sha256, ranges_of, sha256_file,
};
use crate::error::WorkerError;
use crate::images::{self, ImageBytes};
use llama::Offload;
use llama::{
    self, Context, ContextParams, Logits, LogitsCompare, Model, NoGraph, ThreadPool, Vision,
};
use numbers::eval::{
    CandidateResult, EvalPartial, GenerateJob, Generation, Group, ModelsInMemory, TokenKl,
    EVAL_FORMAT_VERSION,
};
use numbers::exact::ExactSum;
use numbers::Split;
use runfiles::corpus::{Chunk, CorpusIndex};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use positions::{cluster_of, scored_positions};

/// How chunks are evaluated and which positions are scored.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// Tokens per decode call and micro-batch.
    pub n_ubatch: u32,
    /// Where the weights of every model live (base and candidates alike).
    pub offload: Offload,
    /// CPU threads.
    pub threads: u32,
    /// f32 KV cache (tight comparisons; production keeps f16).
    pub f32_kv: bool,
    /// Flash attention.
    pub flash_attn: bool,
    /// Positions skipped at the start of every chunk (llama-perplexity
    /// scores the second half of each chunk: `n_ctx / 2`).
    pub skip_first: u32,
    /// Splits whose positions are scored.
    pub splits: Vec<Split>,
    /// Keep every model's logits of every chunk (oracle tests and debugging
    /// only: whole-vocabulary rows).
    pub dump_logits: bool,
    /// Where logits are compared.
    pub compare: Compare,
    /// Models held in memory at once: fewer than the base and every
    /// candidate runs them in turn ([`turns`]).
    pub models_in_memory: ModelsInMemory,
    /// Bytes of a lease's base logits rows kept in host memory when models
    /// run in turn; a lease with more keeps them in a file in `scratch_dir`.
    pub kept_rows_memory: u64,
    /// Where a lease's base logits rows go when they exceed
    /// `kept_rows_memory` (and sliced candidates, in `worker join`).
    pub scratch_dir: PathBuf,
    /// The generation check's prompts and lengths (none: no check).
    pub generate: GenerateJob,
}

/// Default of [`EvalOptions::kept_rows_memory`]: 1 GiB (about 1,700
/// positions at a 151,936-token vocabulary).
pub const KEPT_ROWS_MEMORY: u64 = 1 << 30;

/// Where base and candidate logits are compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compare {
    /// `device` when model layers are offloaded to a GPU, `host` otherwise:
    /// on the CPU backend the f64 host comparison costs less than the
    /// backend's own (BENCHMARKS.md, issue #22).
    #[default]
    Auto,
    /// On the backend that holds them, in f32; only per-position figures
    /// are copied to the host.
    Device,
    /// On the host in f64, after llama.cpp copies every logits row (the
    /// reference path).
    Host,
}

impl Compare {
    /// Whether logits are compared on the device, with `n_gpu_layers`
    /// offloaded and a GPU present or not.
    pub fn on_device(self, n_gpu_layers: u32, has_gpu: bool) -> bool {
        match self {
            Compare::Auto => n_gpu_layers > 0 && has_gpu,
            Compare::Device => true,
            Compare::Host => false,
        }
    }

    /// The label appended to the backend description of eval partials, so
    /// results of the two paths (equal within the device path's stated
    /// tolerance, not bit for bit) are never mistaken for one another.
    pub fn label(on_device: bool) -> &'static str {
        if on_device {
            "device comparison"
        } else {
            "host comparison (f64)"
        }
    }
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            n_ubatch: 512,
            offload: Offload::default(),
            threads: std::thread::available_parallelism().map_or(4, |n| n.get() as u32),
            f32_kv: false,
            flash_attn: false,
            skip_first: 0,
            splits: Split::ALL.to_vec(),
            dump_logits: false,
            compare: Compare::Auto,
            models_in_memory: ModelsInMemory::Auto,
            kept_rows_memory: KEPT_ROWS_MEMORY,
            scratch_dir: std::env::temp_dir(),
            generate: GenerateJob::default(),
        }
    }
}

/// A pruned model file to evaluate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its name in results (`<method>_K<k>`).
    pub name: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// SHA-256 of the file.
    pub sha256: String,
}

struct Loaded {
    name: String,
    sha256: String,
    path: PathBuf,
    k: u32,
    /// Loaded for the job when every model is in memory; loaded per lease
    /// in turn otherwise.
    model: Option<Arc<Model>>,
}

/// The base model and its candidates, loaded and ready to evaluate chunks.
pub struct Evaluator {
    /// The base model's image encoder, when it evaluates images (dropped
    /// before the model it was loaded beside).
    vision: Option<Vision>,
    /// The base model, unless models run one at a time (then loaded per
    /// lease).
    base: Option<Arc<Model>>,
    base_path: PathBuf,
    base_sha256: String,
    candidates: Vec<Loaded>,
    /// Models held in memory at once, resolved: `1 + candidates` for all.
    in_memory: usize,
    /// The base model's vocabulary (every candidate's).
    n_vocab: usize,
    opts: EvalOptions,
    /// Where logits are compared ([`Compare::on_device`]).
    on_device: bool,
    backend: String,
    /// Kept from one run to the next (taken out while a run uses it).
    shared: Option<Shared>,
}

/// The thread pool and the device comparer, kept across runs: each lease of
/// a job reuses the pool's warm threads and the comparison's buffers (sized,
/// allocated and first touched on the first scored micro-batch) instead of
/// paying for them again.
struct Shared {
    pool: Option<Arc<ThreadPool>>,
    cmp: LogitsCompare,
    /// The last run's contexts, reused by a run with the same settings:
    /// llama.cpp's buffers (output rows of the whole vocabulary per token
    /// among them) are allocated once per job, not once per lease.
    contexts: Option<Contexts>,
    /// The contexts of models run in turn that stay loaded from one lease
    /// to the next.
    turns: turns::Held,
}

/// A context for the base model and one per candidate, made with `params`.
struct Contexts {
    params: ContextParams,
    base: Context<'static, NoGraph>,
    cands: Vec<Context<'static, NoGraph>>,
}

impl Shared {
    fn new(threads: u32) -> Shared {
        let pool = ThreadPool::new(threads);
        Shared {
            cmp: LogitsCompare::new(pool.clone(), threads),
            pool,
            contexts: None,
            turns: turns::Held::default(),
        }
    }
}

/// Whole logits of every decode, keyed by (model, chunk) with model 0 the
/// base and `i + 1` candidate `i`, rows appended in decode order.
type Dumps = BTreeMap<(usize, u32), Vec<f32>>;

/// What [`Evaluator::run`] measured.
pub struct Evaluated {
    /// The accumulators, ready to store or merge.
    pub partial: EvalPartial,
    /// With [`EvalOptions::dump_logits`]: every model's logits per chunk,
    /// keyed by (model, chunk) with model 0 the base and `i + 1` candidate `i`.
    pub dumps: Dumps,
    /// Where the comparison's work went.
    pub cost: EvalCost,
}

/// Where an evaluation's comparison work went and what it copied from the
/// backend (for benchmarks: issue #22's per-position host cost and bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalCost {
    /// Scored positions times candidates.
    pub comparisons: u64,
    /// Seconds the backend spent computing comparison graphs (device path).
    pub backend_s: f64,
    /// Seconds of host work: the f64 comparison itself (host path), or
    /// building graphs and copying figures (device path); and folding every
    /// figure into the partial.
    pub host_s: f64,
    /// Bytes the comparison took from the backend: the figures (device
    /// path), or llama.cpp's copies of every model's logits (host path).
    pub bytes: u64,
}

impl Evaluator {
    /// Loads and hashes the base model and every candidate (or, with
    /// fewer models in memory, checks each in turn and keeps what stays
    /// loaded); a candidate with another vocabulary is refused.
    pub fn load(
        base: &Path,
        candidates: &[Candidate],
        opts: EvalOptions,
    ) -> Result<Evaluator, WorkerError> {
        let base_sha256 = model_sha256(base)?;
        let paths: Vec<&Path> = candidates.iter().map(|c| c.path.as_path()).collect();
        let in_memory = memory::resolve(opts.models_in_memory, base, &paths, &opts.offload)?;
        let all = in_memory > candidates.len();
        if !all {
            tracing::info!(
                models_in_memory = in_memory,
                candidates = candidates.len(),
                "the base model and its candidates run in turn"
            );
        }
        let base_model = Arc::new(Model::load(base, &opts.offload)?);
        let n_vocab = base_model.n_vocab();
        // One model at a time: the base model is loaded again per lease
        // (unless it is the only model: then it is every model).
        let base_model = (all || in_memory >= 2).then_some(base_model);
        let mut loaded = Vec::with_capacity(candidates.len());
        for c in candidates {
            let model = Model::load(&c.path, &opts.offload)?;
            let k = check_candidate(&c.name, &c.path, &model, n_vocab)?;
            loaded.push(Loaded {
                name: c.name.clone(),
                sha256: c.sha256.clone(),
                path: c.path.clone(),
                k,
                model: all.then(|| Arc::new(model)),
            });
        }
        let on_device = opts
            .compare
            .on_device(opts.offload.n_gpu_layers, llama::has_gpu());
        Ok(Evaluator {
            vision: None,
            base: base_model,
            base_path: base.to_path_buf(),
            base_sha256,
            in_memory,
            n_vocab,
            on_device,
            backend: format!(
                "{}, {}",
                llama::backend_description(&opts.offload),
                Compare::label(on_device)
            ),
            candidates: loaded,
            opts,
            shared: None,
        })
    }

    /// Models held in memory at once (`1 + candidates`: every model).
    pub fn models_in_memory(&self) -> usize {
        self.in_memory
    }

    /// Whether the base model and its candidates run in turn.
    fn in_turn(&self) -> bool {
        self.in_memory <= self.candidates.len()
    }

    /// SHA-256 of the base model file.
    pub fn base_sha256(&self) -> &str {
        &self.base_sha256
    }

    /// Loads the base model's `mmproj` (its vision encoder and projector)
    /// so that image chunks can be evaluated; returns its SHA-256. Every
    /// candidate decodes the same embeddings: pruning keeps the embedding
    /// width.
    pub fn load_mmproj(&mut self, mmproj: &Path) -> Result<String, WorkerError> {
        let sha256 = sha256_file(mmproj)?;
        let Some(base) = &self.base else {
            return Err(WorkerError::Model {
                path: mmproj.display().to_string(),
                reason: "evaluating images needs the base model in memory beside its image \
                         encoder: models in memory must be at least 2"
                    .into(),
            });
        };
        self.vision = Some(Vision::load_for_decoding(mmproj, base, self.opts.threads)?);
        Ok(sha256)
    }

    /// Evaluates `chunks` (sorted, unique ids) of text. `progress` is called
    /// after each chunk with its id and token count.
    pub fn run(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        progress: &mut dyn FnMut(u32, usize),
    ) -> Result<Evaluated, WorkerError> {
        self.run_with_images(index, chunks, &ImageBytes::new(), progress)
    }

    /// [`Evaluator::run`] on chunks that may carry images, whose bytes are
    /// in `images` (an image chunk needs [`Evaluator::load_mmproj`]).
    pub fn run_with_images(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
        progress: &mut dyn FnMut(u32, usize),
    ) -> Result<Evaluated, WorkerError> {
        check_chunks(index, chunks)?;
        let embeddings = images::encode(self.vision.as_mut(), index, chunks, images)?;
        let mut shared = self
            .shared
            .take()
            .unwrap_or_else(|| Shared::new(self.opts.threads));
        let evaluated = match self.in_turn() {
            true => turns::run(self, &mut shared, index, chunks, &embeddings, progress),
            false => self.run_on(&mut shared, index, chunks, &embeddings, progress),
        };
        self.shared = Some(shared);
        evaluated
    }

    fn run_on(
        &self,
        shared: &mut Shared,
        index: &CorpusIndex,
        chunks: &[Chunk],
        embeddings: &images::Embeddings,
        progress: &mut dyn FnMut(u32, usize),
    ) -> Result<Evaluated, WorkerError> {
        let on_device = self.on_device;
        let params = self.context_params(index);
        // One thread pool for every model: they decode in turn, and one
        // set of warm threads beats waking another pool for each decode;
        // the device comparisons compute on it too.
        let pool = shared.pool.clone();
        let cmp = &mut shared.cmp;
        let cmp_before = cmp.cost();
        let Contexts {
            params,
            mut base,
            mut cands,
        } = match shared.contexts.take() {
            Some(kept) if kept.params == params => kept,
            stale => {
                drop(stale);
                let owning = |m: &Option<Arc<Model>>| {
                    let m = m.clone().expect("every model is loaded");
                    Context::owning(m, &params, NoGraph, pool.clone())
                };
                Contexts {
                    base: owning(&self.base)?,
                    cands: self
                        .candidates
                        .iter()
                        .map(|c| owning(&c.model))
                        .collect::<Result<Vec<_>, _>>()?,
                    params,
                }
            }
        };
        let read = |base: &Context<'_, NoGraph>, cands: &[Context<'_, NoGraph>]| -> u64 {
            std::iter::once(base)
                .chain(cands)
                .map(|c| c.bytes_read())
                .sum()
        };
        let bytes_before = read(&base, &cands);
        let mut acc = Accum::new(self, index, chunks);
        let mut cost = EvalCost::default();
        let mut dumps = BTreeMap::new();
        let n_vocab = base.n_vocab();
        let threads = self.opts.threads.max(1) as usize;
        let ubatches = self.ubatches(index, chunks, &params, n_vocab)?;
        // The device path keeps one micro-batch's base rows on the backend;
        // the host path decodes a group of them model by model.
        let max_rows = match on_device {
            true => 0,
            false => host::max_rows(1 + cands.len(), n_vocab),
        };
        let mut reported = 0;
        for range in plan::groups(&ubatches, max_rows) {
            let group = &ubatches[range];
            let dumping = self.opts.dump_logits.then_some(&mut dumps);
            let results = if on_device {
                device::compare_batch(&mut base, &mut cands, cmp, &group[0], embeddings, dumping)?
            } else {
                host::compare_group(
                    &mut base,
                    &mut cands,
                    group,
                    embeddings,
                    threads,
                    dumping,
                    &mut cost.host_s,
                )?
            };
            let fold_start = std::time::Instant::now();
            let scored = group
                .iter()
                .flat_map(|u| u.rows.iter().zip(&u.groups).map(move |(sr, &g)| (u, sr, g)));
            let mut n_results = 0;
            for ((u, sr, g), res) in scored.zip(&results) {
                let at = Position {
                    chunk: u.chunk.id.0,
                    pos: (u.pos0 + sr.row) as u32,
                    cluster: positions::cluster_of(u.chunk, u.pos0 + sr.row),
                    group: g,
                };
                acc.add_base(at, res.nll_base)?;
                for (ci, c) in res.candidates.iter().enumerate() {
                    acc.add_candidate(ci, at, c)?;
                }
                n_results += 1;
            }
            cost.comparisons += (n_results * cands.len()) as u64;
            cost.host_s += fold_start.elapsed().as_secs_f64();
            if let Some(last) = group.last() {
                let done = last.chunk_index + usize::from(last.ends_chunk());
                for c in &chunks[reported..done] {
                    progress(c.id.0, c.tokens.len());
                }
                reported = done;
            }
        }
        for c in &chunks[reported..] {
            progress(c.id.0, c.tokens.len());
        }
        let c = cmp.cost().since(&cmp_before);
        cost.backend_s = c.backend_s;
        cost.host_s += c.host_s;
        cost.bytes = if on_device {
            c.bytes
        } else {
            read(&base, &cands) - bytes_before
        };
        tracing::debug!(
            chunks = chunks.len(),
            candidates = cands.len(),
            ?cost,
            "evaluated"
        );
        // After the comparison's cost: generation is not comparison work.
        let job = &self.opts.generate;
        let prompts = generate::prompts(job, chunks, params.n_ctx, n_vocab)?;
        if !prompts.is_empty() {
            let n_ubatch = params.n_ubatch as usize;
            let from_base = generate::continue_all(&mut base, &prompts, job.new_tokens, n_ubatch)?;
            let noise = generate::noise_all(&mut base, &prompts, job)?;
            acc.add_noise(&prompts, &from_base, &noise);
            for (ci, ctx) in cands.iter_mut().enumerate() {
                let got = generate::continue_all(ctx, &prompts, job.new_tokens, n_ubatch)?;
                acc.add_generations(ci, &prompts, &from_base, &got);
            }
        }
        shared.contexts = Some(Contexts {
            params,
            base,
            cands,
        });
        Ok(Evaluated {
            partial: acc.partial,
            dumps,
            cost,
        })
    }
}

impl Evaluator {
    /// The context settings of a run on `index`'s chunks.
    fn context_params(&self, index: &CorpusIndex) -> ContextParams {
        chunk_context(
            index,
            self.opts.n_ubatch,
            self.opts.threads,
            self.opts.f32_kv,
            self.opts.flash_attn,
            if self.on_device {
                Logits::Backend
            } else {
                Logits::Host
            },
        )
    }

    /// The micro-batches of a run, none after a chunk's last scored row
    /// unless every model's logits are dumped; a scored position whose
    /// next token is outside the vocabulary is refused, naming the chunk.
    fn ubatches<'c>(
        &self,
        index: &CorpusIndex,
        chunks: &'c [Chunk],
        params: &ContextParams,
        n_vocab: usize,
    ) -> Result<Vec<plan::Ubatch<'c>>, WorkerError> {
        let outside = |chunk: &Chunk, pos: usize| {
            corpus_error(
                index,
                format!(
                    "chunk {} token {} at position {pos} is outside the vocabulary of {n_vocab}",
                    chunk.id, chunk.tokens[pos]
                ),
            )
        };
        let all = plan::ubatches(
            chunks,
            params.n_ubatch as usize,
            self.opts.skip_first,
            &self.opts.splits,
            n_vocab,
            outside,
        )?;
        Ok(match self.opts.dump_logits {
            true => all,
            false => plan::without_unscored_tails(all),
        })
    }
}

/// Checks a loaded candidate against the base model's vocabulary and
/// returns its experts per layer.
fn check_candidate(
    name: &str,
    path: &Path,
    model: &Model,
    n_vocab: usize,
) -> Result<u32, WorkerError> {
    let model_err = |reason: String| WorkerError::Model {
        path: path.display().to_string(),
        reason,
    };
    let (n_expert, _) = expert_counts(model).map_err(model_err)?;
    if model.n_vocab() != n_vocab {
        return Err(model_err(format!(
            "candidate {name} has {} tokens in its vocabulary, the base model {n_vocab}",
            model.n_vocab(),
        )));
    }
    Ok(n_expert)
}

#[derive(Clone, Copy)]
struct Position {
    chunk: u32,
    pos: u32,
    /// The position's cluster ([`positions::cluster_of`]).
    cluster: u32,
    group: Group,
}

/// The partial being filled, position by position.
struct Accum {
    partial: EvalPartial,
}

impl Accum {
    fn new(e: &Evaluator, index: &CorpusIndex, chunks: &[Chunk]) -> Accum {
        let candidates = e
            .candidates
            .iter()
            .map(|c| CandidateResult {
                name: c.name.clone(),
                sha256: c.sha256.clone(),
                k: c.k,
                groups: BTreeMap::new(),
                chunks: BTreeMap::new(),
                tokens: Vec::new(),
                generations: BTreeMap::new(),
            })
            .collect();
        Accum {
            partial: EvalPartial {
                format_version: EVAL_FORMAT_VERSION,
                base_sha256: e.base_sha256.clone(),
                corpus_sha256: index.chunks_sha256.clone(),
                skip_first: e.opts.skip_first,
                splits: e.opts.splits.clone(),
                generate: e.opts.generate.settings(),
                backends: vec![e.backend.clone()],
                chunks: ranges_of(chunks),
                base: BTreeMap::new(),
                candidates,
                noise: BTreeMap::new(),
            },
        }
    }

    /// Records candidate `ci`'s continuations of `prompts` against the
    /// base model's.
    fn add_generations(
        &mut self,
        ci: usize,
        prompts: &[generate::Prompt<'_>],
        base: &[Vec<i32>],
        candidate: &[Vec<i32>],
    ) {
        let gens = &mut self.partial.candidates[ci].generations;
        record(gens, prompts, base, candidate);
    }

    /// Records the noise floor: the base model's continuations of
    /// `prompts` with another micro-batch (`noise`; none without a noise
    /// floor) against its own.
    fn add_noise(
        &mut self,
        prompts: &[generate::Prompt<'_>],
        base: &[Vec<i32>],
        noise: &[Vec<i32>],
    ) {
        record(&mut self.partial.noise, prompts, base, noise);
    }

    fn add_base(&mut self, at: Position, nll: f64) -> Result<(), WorkerError> {
        let b = self.partial.base.entry(at.group).or_default();
        b.n += 1;
        add(&mut b.nll, nll, at, "base NLL")
    }

    fn add_candidate(
        &mut self,
        ci: usize,
        at: Position,
        c: &metrics::Compared,
    ) -> Result<(), WorkerError> {
        let cand = &mut self.partial.candidates[ci];
        let s = cand.groups.entry(at.group).or_default();
        s.n += 1;
        s.top1_same += u64::from(c.top1_same);
        add(&mut s.kl, c.kl, at, "KL")?;
        add(&mut s.kl_sq, c.kl * c.kl, at, "KL squared")?;
        add(&mut s.nll, c.nll_candidate, at, "candidate NLL")?;
        add(&mut s.dprob, c.dprob, at, "probability change")?;
        let k = cand
            .chunks
            .entry((at.chunk, at.cluster, at.group))
            .or_default();
        k.add(c.kl, c.nll_base, c.nll_candidate, c.top1_same, c.dprob)
            .map_err(|e| WorkerError::Graph {
                chunk: at.chunk,
                reason: format!("per-chunk sums at position {}: {e}", at.pos),
            })?;
        cand.tokens.push(TokenKl {
            chunk: at.chunk,
            pos: at.pos,
            cluster: at.cluster,
            group: at.group,
            kl: c.kl,
        });
        Ok(())
    }
}

/// Adds to `gens` each prompt's continuation in `other` against the base
/// model's in `base`, by prompt id.
fn record(
    gens: &mut BTreeMap<u32, Generation>,
    prompts: &[generate::Prompt<'_>],
    base: &[Vec<i32>],
    other: &[Vec<i32>],
) {
    for ((p, b), o) in prompts.iter().zip(base).zip(other) {
        let len = p.tokens.len() as u32;
        gens.insert(p.id, Generation::of(p.domain, len, b, o));
    }
}

fn add(sum: &mut ExactSum, v: f64, at: Position, what: &str) -> Result<(), WorkerError> {
    sum.add_f64(v).map_err(|e| WorkerError::Graph {
        chunk: at.chunk,
        reason: format!("{what} at position {}: {e}", at.pos),
    })
}

#[cfg(test)]
mod tests {
    use super::Compare;

    #[test]
    fn auto_compares_on_the_device_only_with_layers_on_a_gpu() {
        assert!(Compare::Auto.on_device(99, true));
        assert!(!Compare::Auto.on_device(0, true));
        assert!(!Compare::Auto.on_device(99, false));
        assert!(Compare::Device.on_device(0, false));
        assert!(!Compare::Host.on_device(99, true));
    }
}
