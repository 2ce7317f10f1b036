//! The base model and its candidates in turn, for a worker that holds fewer
//! models than 1 + n (DESIGN section 12, "Memory"): per lease the base
//! model decodes every micro-batch once and its scored logits rows are kept
//! ([`KeptRows`]); then each candidate in turn is loaded (the previous one
//! unloaded first), decodes the same micro-batches and is compared with
//! the kept rows, on the host in f64 ([`rows::compare_kept`]) or on the
//! device after uploading them ([`LogitsCompare::restore_base`]). The
//! comparisons are those of the all-at-once path on the same values, and
//! the figures are folded in the same position order, so the partial is
//! the same bit for bit.
//!
//! With two or more models in memory the base model stays loaded with its
//! context from lease to lease, and so does the last candidate, which goes
//! first at the next lease; with one, the base model is loaded per lease.

use super::device::{compared, graph_error, outputs, outputs_of, unseen};
use super::generate;
use super::kept::KeptRows;
use super::plan::Ubatch;
use super::rows::{self, RowResult};
use super::{check_candidate, Accum, Dumps, EvalCost, Evaluated, Evaluator, Position, Shared};
use crate::error::WorkerError;
use crate::images::Embeddings;
use llama::{f32s, Context, ContextParams, LogitsCompare, Model, NoGraph};
use runfiles::corpus::{Chunk, CorpusIndex};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The contexts (each owning its model) kept from one lease to the next,
/// with the settings they were made with.
#[derive(Default)]
pub(super) struct Held {
    params: Option<ContextParams>,
    base: Option<Context<'static, NoGraph>>,
    cand: Option<(usize, Context<'static, NoGraph>)>,
}

/// Evaluates `chunks` with the models in turn ([`Evaluator::run`]'s work).
pub(super) fn run(
    e: &Evaluator,
    shared: &mut Shared,
    index: &CorpusIndex,
    chunks: &[Chunk],
    embeddings: &Embeddings,
    progress: &mut dyn FnMut(u32, usize),
) -> Result<Evaluated, WorkerError> {
    let params = e.context_params(index);
    let mut held = std::mem::take(&mut shared.turns);
    if held.params.as_ref() != Some(&params) {
        // Free the stale contexts (and their models) before making others.
        held = Held {
            params: Some(params.clone()),
            ..Held::default()
        };
    }
    let done = run_held(e, shared, &mut held, &params, index, chunks, embeddings);
    shared.turns = held;
    let evaluated = done?;
    for c in chunks {
        progress(c.id.0, c.tokens.len());
    }
    Ok(evaluated)
}

fn run_held(
    e: &Evaluator,
    shared: &mut Shared,
    held: &mut Held,
    params: &ContextParams,
    index: &CorpusIndex,
    chunks: &[Chunk],
    embeddings: &Embeddings,
) -> Result<Evaluated, WorkerError> {
    let pool = shared.pool.clone();
    let owning = |m: Arc<Model>| Context::owning(m, params, NoGraph, pool.clone());
    let ubatches = e.ubatches(index, chunks, params, e.n_vocab)?;
    let n_scored: usize = ubatches.iter().map(|u| u.rows.len()).sum();
    let mut kept = KeptRows::new(
        n_scored,
        e.n_vocab,
        e.opts.kept_rows_memory,
        &e.opts.scratch_dir,
    )?;
    let mut pass = Pass {
        e,
        ubatches: &ubatches,
        embeddings,
        dumps: e.opts.dump_logits.then(BTreeMap::new),
        cost: EvalCost::default(),
    };
    let cmp_before = shared.cmp.cost();

    let mut base = match held.base.take() {
        Some(ctx) => ctx,
        None => {
            let model = match &e.base {
                Some(m) => m.clone(),
                None => {
                    // One model at a time: the last candidate goes first.
                    held.cand = None;
                    Arc::new(Model::load(&e.base_path, &e.opts.offload)?)
                }
            };
            owning(model)?
        }
    };
    let before = base.bytes_read();
    pass.base(&mut base, &mut kept)?;
    pass.cost.bytes += base.bytes_read() - before;
    let job = &e.opts.generate;
    let prompts = generate::prompts(job, chunks, params.n_ctx, e.n_vocab)?;
    let (new_tokens, n_ubatch) = (job.new_tokens, params.n_ubatch as usize);
    let from_base = generate::continue_all(&mut base, &prompts, new_tokens, n_ubatch)?;
    let noise = match prompts.is_empty() {
        true => Vec::new(),
        false => generate::noise_all(&mut base, &prompts, job)?,
    };
    if e.in_memory >= 2 {
        held.base = Some(base);
    } else {
        drop(base);
    }
    tracing::debug!(
        rows = n_scored,
        on_disk = kept.on_disk(),
        "kept the base model's scored logits"
    );

    let n = e.candidates.len();
    let first = held.cand.as_ref().map(|(i, _)| *i);
    let order = first
        .into_iter()
        .chain((0..n).filter(|&i| Some(i) != first));
    let mut results: Vec<Vec<RowResult>> = (0..n).map(|_| Vec::new()).collect();
    let mut generated: Vec<Vec<Vec<i32>>> = vec![Vec::new(); n];
    for ci in order {
        let mut ctx = match held.cand.take() {
            Some((i, ctx)) if i == ci => ctx,
            other => {
                // Unload the previous candidate before loading the next.
                drop(other);
                let c = &e.candidates[ci];
                let model = Model::load(&c.path, &e.opts.offload)?;
                check_candidate(&c.name, &c.path, &model, e.n_vocab)?;
                owning(Arc::new(model))?
            }
        };
        kept.rewind()?;
        let before = ctx.bytes_read();
        results[ci] = pass.candidate(&mut ctx, &mut shared.cmp, &mut kept, ci + 1)?;
        pass.cost.bytes += ctx.bytes_read() - before;
        generated[ci] = generate::continue_all(&mut ctx, &prompts, new_tokens, n_ubatch)?;
        held.cand = Some((ci, ctx));
    }

    let fold_start = Instant::now();
    let mut acc = Accum::new(e, index, chunks);
    let scored = ubatches
        .iter()
        .flat_map(|u| u.rows.iter().zip(&u.groups).map(move |(sr, &g)| (u, sr, g)));
    for (j, (u, sr, g)) in scored.enumerate() {
        let at = Position {
            chunk: u.chunk.id.0,
            pos: (u.pos0 + sr.row) as u32,
            cluster: super::positions::cluster_of(u.chunk, u.pos0 + sr.row),
            group: g,
        };
        // Every candidate's pass computed the same base figure.
        acc.add_base(at, results[0][j].nll_base)?;
        for (ci, r) in results.iter().enumerate() {
            acc.add_candidate(ci, at, &r[j].candidates[0])?;
        }
    }
    for (ci, got) in generated.iter().enumerate() {
        acc.add_generations(ci, &prompts, &from_base, got);
    }
    acc.add_noise(&prompts, &from_base, &noise);
    let mut cost = pass.cost;
    cost.comparisons = (n_scored * n) as u64;
    cost.host_s += fold_start.elapsed().as_secs_f64();
    let c = shared.cmp.cost().since(&cmp_before);
    cost.backend_s = c.backend_s;
    cost.host_s += c.host_s;
    if e.on_device {
        // The figures, and the base rows copied to the host once.
        cost.bytes = c.bytes + KeptRows::bytes_for(n_scored, e.n_vocab);
    }
    tracing::debug!(
        chunks = chunks.len(),
        candidates = n,
        ?cost,
        "evaluated in turn"
    );
    Ok(Evaluated {
        partial: acc.partial,
        dumps: pass.dumps.unwrap_or_default(),
        cost,
    })
}

/// One model's pass over a run's micro-batches.
struct Pass<'a, 'c> {
    e: &'a Evaluator,
    ubatches: &'a [Ubatch<'c>],
    embeddings: &'a Embeddings,
    dumps: Option<Dumps>,
    cost: EvalCost,
}

/// A micro-batch to decode on the device path ([`Pass::start`]).
struct DeviceStep<'a> {
    input: llama::Input<'a>,
    pos0: i32,
    /// Whether every position's logits are dumped.
    dumping: bool,
    /// Which positions output logits, and the scored rows among them.
    flags: Vec<bool>,
    rows: Vec<i32>,
}

impl<'a> Pass<'a, '_> {
    /// Starts micro-batch `u` in model `m`: clears the cache at a chunk's
    /// start; on the host path decodes it, dumps its logits and hands them
    /// to `host` (timed as host work); on the device path decodes it alone
    /// when it has no row to score or dump. `Some` when it is still to be
    /// decoded on the device path.
    fn start(
        &mut self,
        ctx: &mut Context<'static, NoGraph>,
        u: &'a Ubatch<'_>,
        m: usize,
        host: impl FnOnce(&[f32]) -> Result<(), WorkerError>,
    ) -> Result<Option<DeviceStep<'a>>, WorkerError> {
        let (input, pos0) = (u.input(self.embeddings), u.pos0 as i32);
        if u.pos0 == 0 {
            ctx.clear();
        }
        let dumping = self.dumps.is_some();
        if !self.e.on_device {
            ctx.decode_input(input, pos0)?;
            let logits = ctx.batch_logits();
            dump_logits(self.dumps.as_mut(), m, u, logits);
            let started = Instant::now();
            host(logits)?;
            self.cost.host_s += started.elapsed().as_secs_f64();
            return Ok(None);
        }
        if u.rows.is_empty() && !dumping {
            ctx.decode_input(input, pos0)?;
            return Ok(None);
        }
        let (flags, rows) = outputs_of(u, dumping);
        Ok(Some(DeviceStep {
            input,
            pos0,
            dumping,
            flags,
            rows,
        }))
    }

    /// Decodes every micro-batch in the base model (model 0) and keeps its
    /// scored rows.
    fn base(
        &mut self,
        ctx: &mut Context<'static, NoGraph>,
        kept: &mut KeptRows,
    ) -> Result<(), WorkerError> {
        let n_vocab = self.e.n_vocab;
        for u in self.ubatches {
            let host = |logits: &[f32]| -> Result<(), WorkerError> {
                for r in &u.rows {
                    kept.push(&logits[r.row * n_vocab..(r.row + 1) * n_vocab])?;
                }
                Ok(())
            };
            let Some(step) = self.start(ctx, u, 0, host)? else {
                continue;
            };
            let mut logits = Vec::new();
            let outputs = outputs(&step.flags, step.dumping);
            ctx.decode_with_logits(step.input, step.pos0, outputs, &mut |t| {
                logits = f32s(&t.bytes()).collect();
            })?;
            if logits.is_empty() {
                return Err(graph_error(u, unseen()));
            }
            dump_logits(self.dumps.as_mut(), 0, u, &logits);
            for &r in &step.rows {
                let r = r as usize;
                kept.push(&logits[r * n_vocab..(r + 1) * n_vocab])?;
            }
        }
        Ok(())
    }

    /// Decodes every micro-batch in candidate `m` (1-based: 0 is the base
    /// model) and compares its scored rows with the kept base rows; one
    /// result per scored row, in order.
    fn candidate(
        &mut self,
        ctx: &mut Context<'static, NoGraph>,
        cmp: &mut LogitsCompare,
        kept: &mut KeptRows,
        m: usize,
    ) -> Result<Vec<RowResult>, WorkerError> {
        let n_vocab = self.e.n_vocab;
        let threads = self.e.opts.threads.max(1) as usize;
        let mut out = Vec::new();
        for u in self.ubatches {
            let host = |logits: &[f32]| -> Result<(), WorkerError> {
                let base = kept.next_rows(u.rows.len())?;
                out.extend(rows::compare_kept(base, logits, &u.rows, n_vocab, threads));
                Ok(())
            };
            let Some(step) = self.start(ctx, u, m, host)? else {
                continue;
            };
            let next: Vec<i32> = u.rows.iter().map(|r| r.next as i32).collect();
            let (dumping, rows) = (step.dumping, &step.rows);
            let scored = !rows.is_empty();
            let base = kept.next_rows(u.rows.len())?;
            let mut got = None;
            let mut whole = Vec::new();
            let outputs = outputs(&step.flags, dumping);
            ctx.decode_with_logits(step.input, step.pos0, outputs, &mut |t| {
                if dumping {
                    whole = f32s(&t.bytes()).collect();
                }
                if scored {
                    got = Some(
                        cmp.restore_base(t, rows, base, &next)
                            .and_then(|b| Ok((b, cmp.compare(t)?))),
                    );
                }
            })?;
            dump_logits(self.dumps.as_mut(), m, u, &whole);
            if !scored {
                continue;
            }
            let (b, f) = got
                .unwrap_or_else(|| Err(unseen()))
                .map_err(|e| graph_error(u, e))?;
            out.extend((0..u.rows.len()).map(|j| {
                let nll_base = f64::from(b.nll[j]);
                RowResult {
                    nll_base,
                    candidates: vec![compared(&f, j, nll_base)],
                }
            }));
        }
        Ok(out)
    }
}

/// Appends model `m`'s logits of micro-batch `u` to `dumps` (keyed by the
/// model and `u`'s chunk), when logits are dumped.
fn dump_logits(dumps: Option<&mut Dumps>, m: usize, u: &Ubatch<'_>, logits: &[f32]) {
    if let Some(d) = dumps {
        d.entry((m, u.chunk.id.0))
            .or_default()
            .extend_from_slice(logits);
    }
}
