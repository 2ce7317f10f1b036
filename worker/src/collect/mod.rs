//! The collector: runs corpus chunks through llama.cpp and measures them.
//!
//! Each chunk is evaluated alone in its sequence (KV cache cleared), in
//! micro-batches of `n_ubatch` tokens with outputs on every token, so a chunk
//! gives the same numbers wherever it runs; the regression test
//! `one_call_and_two_merged_calls_give_identical_artifacts` guards this.
//! Outputs on every token make the last block run on all of them; the
//! output head, which feeds no statistic, is never computed and no logits
//! are copied ([`Logits::Backend`]), except the last row of a decode
//! trace's step, whose argmax is the next token. See [`Collector::run`].

pub mod device;
mod folder;
mod gating;
mod importance;
mod kernels;
mod lookahead;
mod names;
mod observer;
mod probe;
mod projector;
mod scratch;
mod shape;
mod strata;

use crate::error::WorkerError;
use crate::images::{self, ImageBytes};
use folder::{Folded, Folder};
use llama::Offload;
use llama::{Context, ContextParams, ImageEmbedding, Input, Logits, Model, Vision};
use numbers::imatrix::Imatrix;
use numbers::partial::{BackendToHost, Partial};
use numbers::projection::OutputProjection;
use numbers::stats::ExpertAccum;
use numbers::{ChunkRange, Modality, Split};
use observer::{Observer, UbatchInfo};
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::store::RunStore;
use runfiles::trace::TraceRow;
use scratch::ChunkScratch;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata::Strata;

pub use shape::{expert_counts, moe_shape};

/// How chunks are evaluated and what is recorded.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CollectOptions {
    /// Tokens per decode call and micro-batch (llama-imatrix's default is 512).
    pub n_ubatch: u32,
    /// Where the weights live: layers on the GPU, experts kept on the host.
    pub offload: Offload,
    /// CPU threads.
    pub threads: u32,
    /// Trace every n-th chunk (by chunk id); 0 disables tracing. With
    /// `trace_every_heldout` set, this stride applies to fit tokens only.
    pub trace_every: u32,
    /// Trace the held-out tokens of every n-th chunk (0: none); `None`
    /// traces them with `trace_every`, like the fit tokens.
    pub trace_every_heldout: Option<u32>,
    /// Router top-N recorded per traced token and layer.
    pub trace_top_n: usize,
    /// Lookahead distances `d`: each traced row of layer `L` also records
    /// layer `L + d`'s router top-N on the residual stream after layer `L`
    /// (empty: none). Default `[1, 2]`.
    #[serde(default = "default_lookahead")]
    pub trace_lookahead: Vec<u8>,
    /// f32 KV cache (for tight oracle comparisons; production keeps f16).
    pub f32_kv: bool,
    /// Flash attention.
    pub flash_attn: bool,
    /// Decode traces: prompt tokens taken from each held-out span of a traced chunk.
    pub decode_prompt: usize,
    /// Decode traces: tokens generated greedily per prompt (0: no decode traces).
    pub decode_tokens: usize,
    /// Weight names (`blk.0.attn_q.weight`) whose matmul inputs are dumped
    /// per chunk, for debugging and oracle tests; empty in production.
    pub dump_inputs: Vec<String>,
    /// Where observed tensors are reduced (host, device, or auto).
    pub reduce: device::Reduce,
    /// Computes the output head and lets llama.cpp copy every logits row to
    /// the host, as a plain decode does: the reference that shows skipping
    /// the head changes no statistic (and the cost before it was skipped,
    /// in `bench_collect`). Off in production: the head feeds nothing.
    #[serde(default)]
    pub output_head: bool,
    /// Dimensions each routed expert output is projected to for merge
    /// plans (`[run] merge_projection`, [`numbers::projection`]); 0: off.
    /// On the device path the projection reads the `ffn_moe_down` rows on
    /// the host (and takes their norms there too).
    #[serde(default)]
    pub merge_projection: u32,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            n_ubatch: 512,
            offload: Offload::default(),
            threads: std::thread::available_parallelism().map_or(4, |n| n.get() as u32),
            trace_every: 1,
            trace_every_heldout: None,
            trace_top_n: 64,
            trace_lookahead: default_lookahead(),
            f32_kv: false,
            flash_attn: false,
            decode_prompt: 32,
            decode_tokens: 0,
            dump_inputs: Vec::new(),
            reduce: device::Reduce::Auto,
            output_head: false,
            merge_projection: 0,
        }
    }
}

/// The lookahead distances traced by default: the next layer and the one after.
pub fn default_lookahead() -> Vec<u8> {
    vec![1, 2]
}

impl CollectOptions {
    /// Refuses options no chunk can be measured with: an empty micro-batch,
    /// decode traces without a prompt (the first token would come from
    /// the previous generation's logits), or a lookahead distance of 0.
    pub fn validate(&self) -> Result<(), WorkerError> {
        if self.trace_lookahead.contains(&0) {
            return Err(WorkerError::Option {
                option: "trace_lookahead",
                value: format!("{:?}", self.trace_lookahead),
                reason: "a lookahead distance is at least 1 layer (an empty list turns it off)",
            });
        }
        if self.merge_projection > numbers::projection::MAX_DIM {
            return Err(WorkerError::Option {
                option: "merge_projection",
                value: self.merge_projection.to_string(),
                reason: "outputs are projected to at most 4096 dimensions (0 turns it off)",
            });
        }
        if self.n_ubatch == 0 {
            return Err(WorkerError::Option {
                option: "n_ubatch",
                value: "0".into(),
                reason: "a micro-batch needs at least one token",
            });
        }
        if self.decode_tokens > 0 && self.decode_prompt == 0 {
            return Err(WorkerError::Option {
                option: "decode_prompt",
                value: "0".into(),
                reason: "decode traces need at least one prompt token",
            });
        }
        Ok(())
    }
}

/// A loaded model ready to measure chunks.
pub struct Collector {
    /// The model's image encoder, when it measures images (dropped before
    /// the model it was loaded beside).
    vision: Option<Vision>,
    model: Arc<Model>,
    path: PathBuf,
    sha256: String,
    shape: numbers::stats::MoeShape,
    opts: CollectOptions,
    backend: String,
    /// Whether observed tensors are reduced on their backend.
    on_device: bool,
    /// Later layers' routers for lookahead guesses (`None`: off).
    routers: Option<Arc<lookahead::Routers>>,
    /// The context of the last run and its settings, reused by the next run
    /// with the same settings (a worker's next lease), so llama.cpp's
    /// buffers are allocated once per worker rather than once per lease.
    context: Option<(ContextParams, Context<'static, Observer>)>,
}

impl Collector {
    /// Checks the options, loads the GGUF, hashes it and reads its MoE shape
    /// (routing semantics from a probe decode of one token).
    pub fn load(path: &Path, opts: CollectOptions) -> Result<Collector, WorkerError> {
        opts.validate()?;
        // llama.cpp aborts (GGML_ASSERT) on a model without experts: check
        // the header before it loads the file (and before hashing it, so a
        // malformed header is refused at once).
        gguf::model_check::moe_facts(path).map_err(|reason| WorkerError::Model {
            path: path.display().to_string(),
            reason,
        })?;
        let sha256 = model_sha256(path)?;
        let model = Model::load(path, &opts.offload)?;
        let model_error = |reason| WorkerError::Model {
            path: path.display().to_string(),
            reason,
        };
        let (shape, router_inputs) =
            shape::probe_shape(&model, opts.threads).map_err(model_error)?;
        let traces = opts.trace_every > 0 || opts.trace_every_heldout.is_some_and(|n| n > 0);
        let routers = match traces && !opts.trace_lookahead.is_empty() {
            true => Some(Arc::new(
                lookahead::Routers::load(
                    path,
                    &shape,
                    &router_inputs,
                    &opts.trace_lookahead,
                    opts.trace_top_n,
                )
                .map_err(model_error)?,
            )),
            false => None,
        };
        let on_device = opts
            .reduce
            .on_device(opts.offload.n_gpu_layers, llama::has_gpu());
        Ok(Collector {
            vision: None,
            model: Arc::new(model),
            path: path.to_path_buf(),
            sha256,
            shape,
            backend: device::backend_label(on_device, &opts.offload),
            opts,
            on_device,
            routers,
            context: None,
        })
    }

    /// Loads the model's `mmproj` (its vision encoder and projector) so
    /// that image chunks can be measured; returns its SHA-256.
    pub fn load_mmproj(&mut self, mmproj: &Path) -> Result<String, WorkerError> {
        let sha256 = sha256_file(mmproj)?;
        self.vision = Some(Vision::load_for_decoding(
            mmproj,
            &self.model,
            self.opts.threads,
        )?);
        Ok(sha256)
    }

    /// SHA-256 of the model file, lowercase hex.
    pub fn model_sha256(&self) -> &str {
        &self.sha256
    }

    /// The model's MoE shape.
    pub fn shape(&self) -> &numbers::stats::MoeShape {
        &self.shape
    }

    /// Measures `chunks` (sorted, unique ids) of text. `progress` is called
    /// after each chunk with its id and token count.
    pub fn run(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        progress: &mut dyn FnMut(u32, usize),
    ) -> Result<Collected, WorkerError> {
        self.run_with_images(index, chunks, &ImageBytes::new(), progress)
    }

    /// [`Collector::run`] on chunks that may carry images, whose bytes are
    /// in `images` (an image chunk needs [`Collector::load_mmproj`]).
    pub fn run_with_images(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
        progress: &mut dyn FnMut(u32, usize),
    ) -> Result<Collected, WorkerError> {
        check_chunks(index, chunks)?;
        let embeddings = images::encode(self.vision.as_mut(), index, chunks, images)?;
        let strata = Strata::new(index.domains.clone()).map_err(|e| corpus_error(index, e))?;
        let params = chunk_context(
            index,
            self.opts.n_ubatch,
            self.opts.threads,
            self.opts.f32_kv,
            self.opts.flash_attn,
            if self.opts.output_head {
                Logits::Host
            } else {
                Logits::Backend
            },
        );
        let observer = Observer::new(
            &self.shape,
            self.opts.trace_top_n,
            strata.clone(),
            self.opts.dump_inputs.clone(),
            self.on_device.then(device::DeviceReads::new),
            self.routers.clone(),
            (self.opts.merge_projection > 0).then(|| {
                projector::Projector::new(
                    self.opts.merge_projection as usize,
                    numbers::projection::SEED,
                )
            }),
        );
        let mut ctx = self.take_context(&params, observer)?;
        let (tokens_before, bytes_before) = (ctx.tokens_decoded(), ctx.bytes_read());
        let mut folder = Folder::start(
            strata.clone(),
            ExpertAccum::new(self.shape.clone()),
            Imatrix {
                chunk_size: index.n_ctx,
                ..Default::default()
            },
            (self.opts.merge_projection > 0)
                .then(|| OutputProjection::new(self.opts.merge_projection)),
            (self.shape.moe_layers.len(), self.shape.n_expert as usize),
        );
        let mut trace_tokens = 0u64;
        let mut decode_trace = Vec::new();
        for chunk in chunks {
            let splits = self.traced_splits(chunk.id.0);
            let traced = splits.fit || splits.heldout;
            let labels = chunk.token_labels();
            let rows_before = ctx.observer().trace.len();
            ctx.clear();
            for piece in images::pieces(chunk) {
                let fed = Feed {
                    chunk: chunk.id.0,
                    pos0: piece.start,
                    traced,
                    measured: true,
                    greedy: false,
                    trace_only: splits.only(),
                };
                let range = piece.start..piece.start + piece.len;
                let (tokens, labels) = (&chunk.tokens[range.clone()], &labels[range]);
                let step = params.n_ubatch as usize;
                match piece.image {
                    None => {
                        feed(&mut ctx, fed, tokens, None, labels, step)?;
                    }
                    Some(im) => {
                        // An image's positions are measured in its domain's image stratum.
                        let labels: Vec<(Split, u16)> = labels
                            .iter()
                            .map(|&(split, d)| (split, strata.stratum(d, Modality::Image)))
                            .collect();
                        let image = Some(&embeddings[&im.sha256]);
                        feed(&mut ctx, fed, tokens, image, &labels, step)?;
                    }
                }
            }
            if !(splits.fit && splits.heldout) {
                // One split of this chunk is traced: keep only its rows.
                let rows = ctx.observer().trace.split_off(rows_before);
                let kept = rows.into_iter().filter(|r| splits.covers(r.split));
                ctx.observer().trace.extend(kept);
            }
            if splits.heldout && self.opts.decode_tokens > 0 {
                let before = ctx.observer().trace.len();
                self.generate(&mut ctx, chunk, index.n_ctx as usize)?;
                let generated = ctx.observer().trace.split_off(before);
                decode_trace.extend(generated);
            }
            let obs = ctx.observer();
            obs.end_chunk().map_err(|reason| WorkerError::Graph {
                chunk: chunk.id.0,
                reason,
            })?;
            let full = std::mem::replace(&mut obs.scratch, ChunkScratch::new(0, 0));
            obs.scratch = folder.swap(chunk.id.0, full)?;
            trace_tokens += chunk
                .spans
                .iter()
                .filter(|s| splits.covers(s.split))
                .map(|s| u64::from(s.len))
                .sum::<u64>();
            progress(chunk.id.0, chunk.tokens.len());
        }
        let backend_to_host = BackendToHost {
            tokens: ctx.tokens_decoded() - tokens_before,
            bytes: ctx.bytes_read() - bytes_before + ctx.observer().device_bytes(),
        };
        let obs = ctx.observer();
        let trace = std::mem::take(&mut obs.trace);
        let drops: BTreeMap<String, u64> = std::mem::take(&mut obs.drops);
        let dumps = std::mem::take(&mut obs.dumps);
        self.context = Some((params, ctx));
        let Folded {
            experts,
            imatrix,
            chunk_stats,
            projection,
        } = folder.finish()?;
        let partial = Partial {
            nonfinite_drops: drops,
            trace_tokens,
            trace_rows: trace.len() as u64,
            chunk_stats,
            backend_to_host,
            projection,
            ..Partial::new(
                self.sha256.clone(),
                index.chunks_sha256.clone(),
                self.backend.clone(),
                ranges_of(chunks),
                experts,
                imatrix,
            )
        };
        tracing::debug!(model = %self.path.display(), chunks = chunks.len(), "collected");
        Ok(Collected {
            partial,
            trace,
            decode_trace,
            dumps,
        })
    }

    /// The kept context if it was made with `params` (its observer replaced
    /// by `observer`), or a new one. A run that fails drops its context, so
    /// the next starts from a fresh one.
    fn take_context(
        &mut self,
        params: &ContextParams,
        observer: Observer,
    ) -> Result<Context<'static, Observer>, WorkerError> {
        match self.context.take() {
            Some((kept, mut ctx)) if kept == *params => {
                *ctx.observer() = observer;
                Ok(ctx)
            }
            stale => {
                drop(stale);
                Ok(Context::owning(
                    self.model.clone(),
                    params,
                    observer,
                    llama::ThreadPool::new(params.threads),
                )?)
            }
        }
    }

    /// Which splits of chunk `id` are traced: fit tokens every
    /// `trace_every`-th chunk, held-out tokens every `trace_every_heldout`-th.
    fn traced_splits(&self, id: u32) -> TracedSplits {
        let every = |n: u32| n > 0 && id.is_multiple_of(n);
        let fit = self.opts.trace_every;
        TracedSplits {
            fit: every(fit),
            heldout: every(self.opts.trace_every_heldout.unwrap_or(fit)),
        }
    }

    /// Decode traces: from each held-out span of `chunk`, prompt with its
    /// first `decode_prompt` tokens and generate up to `decode_tokens`
    /// tokens greedily, one at a time, tracing each generated token.
    fn generate(
        &self,
        ctx: &mut Context<'_, Observer>,
        chunk: &Chunk,
        n_ctx: usize,
    ) -> Result<(), WorkerError> {
        for span in chunk.spans.iter().filter(|s| s.split == Split::Heldout) {
            let start = span.start as usize;
            let prompt =
                &chunk.tokens[start..start + (span.len as usize).min(self.opts.decode_prompt)];
            // A prompt is text: it stops before the span's first image.
            let prompt = &prompt[..prompt.iter().take_while(|&&t| t >= 0).count()];
            if prompt.is_empty() {
                continue;
            }
            let label = (span.split, span.domain);
            let end = (prompt.len() + self.opts.decode_tokens).min(n_ctx);
            ctx.clear();
            let quiet = Feed {
                chunk: chunk.id.0,
                pos0: 0,
                traced: false,
                measured: false,
                greedy: prompt.len() < end,
                trace_only: None,
            };
            let mut next = feed(
                ctx,
                quiet,
                prompt,
                None,
                &vec![label; prompt.len()],
                self.opts.n_ubatch as usize,
            )?;
            for pos in prompt.len()..end {
                let Some(token) = next.filter(|&t| !self.model.is_end_of_generation(t)) else {
                    break;
                };
                let step = Feed {
                    chunk: chunk.id.0,
                    pos0: pos,
                    traced: true,
                    measured: false,
                    greedy: pos + 1 < end,
                    trace_only: None,
                };
                next = feed(ctx, step, &[token], None, &[label], 1)?;
            }
        }
        Ok(())
    }
}

/// The splits whose tokens a chunk traces.
#[derive(Clone, Copy)]
struct TracedSplits {
    fit: bool,
    heldout: bool,
}

impl TracedSplits {
    fn covers(self, split: Split) -> bool {
        match split {
            Split::Fit => self.fit,
            Split::Heldout => self.heldout,
        }
    }

    /// The one split traced, when only one is.
    fn only(self) -> Option<Split> {
        match (self.fit, self.heldout) {
            (true, false) => Some(Split::Fit),
            (false, true) => Some(Split::Heldout),
            _ => None,
        }
    }
}

/// Where a run of tokens goes and what is recorded of it.
#[derive(Clone, Copy)]
struct Feed {
    chunk: u32,
    pos0: usize,
    traced: bool,
    measured: bool,
    /// Whether the greedy next token after the run is wanted (its last
    /// logits row is then computed and read).
    greedy: bool,
    /// The one split whose trace rows are kept ([`UbatchInfo::trace_only`]).
    trace_only: Option<Split>,
}

/// Decodes positions with ids `tokens` (labelled per position) in
/// micro-batches of `step`: the tokens themselves, or with `image` its
/// embeddings (the ids are then its marker tokens, which the observer sees);
/// the greedy next token when `f.greedy` asks for it (text only).
fn feed(
    ctx: &mut Context<'_, Observer>,
    f: Feed,
    tokens: &[i32],
    image: Option<&ImageEmbedding>,
    labels: &[(Split, u16)],
    step: usize,
) -> Result<Option<i32>, WorkerError> {
    let mut next = None;
    let n_batches = tokens.len().div_ceil(step);
    for (i, toks) in tokens.chunks(step).enumerate() {
        let offset = i * step;
        let pos0 = f.pos0 + offset;
        ctx.observer().begin_ubatch(UbatchInfo {
            chunk: f.chunk,
            pos0: pos0 as u32,
            tokens: toks.to_vec(),
            labels: labels[offset..offset + toks.len()].to_vec(),
            traced: f.traced,
            measured: f.measured,
            trace_only: f.trace_only,
        });
        match image {
            Some(im) => {
                let rows = &im.values[offset * im.n_embd..(offset + toks.len()) * im.n_embd];
                ctx.decode_input(Input::Embd(rows, im.n_embd), pos0 as i32)?;
            }
            None if f.greedy && i + 1 == n_batches => {
                next = Some(ctx.decode_greedy(toks, pos0 as i32)?);
            }
            None => ctx.decode(toks, pos0 as i32)?,
        }
        ctx.observer()
            .end_ubatch()
            .map_err(|reason| WorkerError::Graph {
                chunk: f.chunk,
                reason,
            })?;
    }
    Ok(next)
}

/// What [`Collector::run`] measured.
pub struct Collected {
    /// The accumulators, ready to store or merge.
    pub partial: Partial,
    /// Trace rows of the traced chunks (teacher-forced prefill).
    pub trace: Vec<TraceRow>,
    /// Trace rows of generated tokens (decode), if requested.
    pub decode_trace: Vec<TraceRow>,
    /// Dumped matmul inputs per (weight name, chunk), if requested.
    pub dumps: BTreeMap<(String, u32), Vec<f32>>,
}

/// The error for a chunk of `index` that cannot be evaluated.
pub fn corpus_error(index: &CorpusIndex, reason: String) -> WorkerError {
    WorkerError::Corpus {
        location: format!("chunks of {}", index.chunks_sha256),
        reason,
    }
}

/// Checks chunks before any is decoded (collection and evaluation alike):
/// sorted unique ids, spans valid for the index's domains, at most `n_ctx`
/// tokens each.
pub fn check_chunks(index: &CorpusIndex, chunks: &[Chunk]) -> Result<(), WorkerError> {
    if chunks.windows(2).any(|w| w[0].id >= w[1].id) {
        return Err(corpus_error(
            index,
            "chunks are not sorted by unique id".into(),
        ));
    }
    for chunk in chunks {
        chunk
            .validate(index.domains.len())
            .map_err(|e| corpus_error(index, e))?;
        if chunk.tokens.len() > index.n_ctx as usize {
            return Err(corpus_error(
                index,
                format!(
                    "chunk {} has {} tokens, more than n_ctx {}",
                    chunk.id,
                    chunk.tokens.len(),
                    index.n_ctx
                ),
            ));
        }
    }
    Ok(())
}

/// The llama.cpp context of a chunk run: the corpus's context size, one
/// sequence, micro-batches of `n_ubatch` tokens (at most `n_ctx`, at least 1).
pub fn chunk_context(
    index: &CorpusIndex,
    n_ubatch: u32,
    threads: u32,
    f32_kv: bool,
    flash_attn: bool,
    logits: Logits,
) -> ContextParams {
    ContextParams {
        n_ctx: index.n_ctx,
        n_ubatch: n_ubatch.min(index.n_ctx).max(1),
        threads,
        f32_kv,
        flash_attn,
        logits,
    }
}

/// Coalesces sorted chunk ids into half-open ranges.
pub(crate) fn ranges_of(chunks: &[Chunk]) -> Vec<ChunkRange> {
    let mut out: Vec<ChunkRange> = Vec::new();
    for c in chunks {
        match out.last_mut() {
            Some(r) if r.end == c.id.0 => r.end += 1,
            _ => out.push(ChunkRange {
                start: c.id.0,
                end: c.id.0 + 1,
            }),
        }
    }
    out
}

/// SHA-256 of a model: of its file, or of all its split files
/// ([`gguf::hash::model_sha256`]), logging its progress every 10 s (a
/// model of hundreds of GB takes minutes, before any lease is measured).
pub fn model_sha256(path: &Path) -> Result<String, WorkerError> {
    let started = std::time::Instant::now();
    let mut logged = started;
    let mut progress = |done: u64, total: u64| {
        if logged.elapsed() >= std::time::Duration::from_secs(10) {
            logged = std::time::Instant::now();
            let gb = |b: u64| b as f64 / 1e9;
            tracing::info!(
                "hashing model {}: {:.1} of {:.1} GB ({:.2} GB/s)",
                path.display(),
                gb(done),
                gb(total),
                gb(done) / started.elapsed().as_secs_f64()
            );
        }
    };
    gguf::hash::model_sha256_with(path, &mut progress).map_err(|source| WorkerError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// SHA-256 of a file (an mmproj, a pruned candidate).
pub fn sha256_file(path: &Path) -> Result<String, WorkerError> {
    gguf::hash::sha256_file(path).map_err(|source| WorkerError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Writes trace rows as the Parquet part `name` under the run; returns the name.
pub async fn write_trace_part(
    store: &RunStore,
    name: String,
    mut rows: Vec<TraceRow>,
    k: usize,
    n: usize,
) -> Result<String, WorkerError> {
    let bytes =
        runfiles::trace::write_part(&mut rows, k, n).map_err(|reason| WorkerError::Trace {
            name: name.clone(),
            reason,
        })?;
    store.put(&name, bytes).await?;
    Ok(name)
}
