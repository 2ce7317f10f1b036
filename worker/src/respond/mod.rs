//! The response phase's generation: every response of a lease (its prompts
//! times `n`) is a sequence of one batched context ([`BatchedContext`]),
//! prompts prefilled together and then one token per live sequence per
//! `llama_decode`, until each stops at an end-of-generation token or at
//! `max_tokens`. A lease gets a context of its own size, cleared, so its
//! responses depend on the lease's prompts and the job only.
//!
//! - [`sample`]: the per-response sampler, seeded from the run's seed and
//!   the prompt's identity.
//! - [`row`]: a logits row's maximum, argmax and log-sum-exp in one
//!   vectorized pass.

pub mod row;
pub mod sample;

use llama::batched::{BatchedContext, Entry};
use llama::Model;
use llama::Offload;
use numbers::respond::{Response, ResponsePartial};
use numbers::ChunkRange;
use protocol::wire::Sampling;
use runfiles::respond::PromptFile;
use sample::Sampler;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// llama.cpp's limit on sequences per context (`LLAMA_MAX_SEQ`).
pub const MAX_SEQUENCES: u32 = 256;

/// Most tokens per `llama_decode` of a response lease.
const BATCH_TOKENS: u32 = 512;

/// A loaded model with the job's prompts and sampling.
pub struct Responder {
    model: Arc<Model>,
    model_sha256: String,
    prompts: PromptFile,
    sampling: Sampling,
    threads: u32,
    /// Generate `max_tokens` whatever the model writes (benchmarks only).
    ignore_eog: bool,
}

/// Where a lease's generation time went (`bench_respond` prints it).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sections {
    /// Making and clearing the lease's context.
    pub context: Duration,
    /// Prefilling the prompts, their first tokens chosen (wall time).
    pub prefill: Duration,
    /// Generating the rest (wall time).
    pub generation: Duration,
    /// Inside `llama_decode` (prefill's and generation's).
    pub decode: Duration,
    /// Choosing tokens from logits rows (prefill's and generation's).
    pub sample: Duration,
    /// Decodes run.
    pub decodes: u64,
}

/// One response being generated.
struct Seq<'p> {
    prompt: u32,
    sample: u32,
    tokens: &'p [i32],
    sampler: Sampler,
    out: Vec<i32>,
    nll: f64,
    eog: bool,
    done: bool,
}

impl Responder {
    /// Loads `model` (placed as `offload` says) for `prompts`, generating
    /// with `sampling` on `threads` CPU threads.
    pub fn load(
        model: &Path,
        offload: &Offload,
        threads: u32,
        prompts: PromptFile,
        sampling: Sampling,
    ) -> Result<Responder, String> {
        let model_sha256 = gguf::hash::model_sha256(model)
            .map_err(|e| format!("model {}: {e}", model.display()))?;
        let loaded = Model::load(model, offload).map_err(|e| e.to_string())?;
        Ok(Responder {
            model: Arc::new(loaded),
            model_sha256,
            prompts,
            sampling,
            threads: threads.max(1),
            ignore_eog: false,
        })
    }

    /// Has every response run to `max_tokens`, end-of-generation tokens
    /// generated like any other, as llama.cpp's `--ignore-eos` does: for
    /// benchmarks that compare with a fixed number of decode steps
    /// (`bench_respond --ignore-eog`); a run never sets it.
    pub fn ignore_end_of_generation(&mut self) {
        self.ignore_eog = true;
    }

    /// SHA-256 of the model file.
    pub fn model_sha256(&self) -> &str {
        &self.model_sha256
    }

    /// Every response of the prompts `range`.
    pub fn respond(&self, range: ChunkRange) -> Result<ResponsePartial, String> {
        self.respond_timed(range).map(|(p, _)| p)
    }

    /// [`Responder::respond`] with where its time went.
    pub fn respond_timed(&self, range: ChunkRange) -> Result<(ResponsePartial, Sections), String> {
        let prompts = self
            .prompts
            .prompts
            .get(range.start as usize..range.end as usize)
            .ok_or_else(|| {
                format!(
                    "prompt range {range} is out of bounds: the job has {} prompts",
                    self.prompts.prompts.len()
                )
            })?;
        let s = &self.sampling;
        let mut seqs: Vec<Seq<'_>> = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            if p.tokens.is_empty() {
                return Err(format!("prompt {} has no tokens", range.start as usize + i));
            }
            for sample in 0..s.n {
                seqs.push(Seq {
                    prompt: range.start + i as u32,
                    sample,
                    tokens: &p.tokens,
                    sampler: Sampler::new(s, &p.sha256, sample),
                    out: Vec::new(),
                    nll: 0.0,
                    eog: false,
                    done: false,
                });
            }
        }
        if seqs.len() > MAX_SEQUENCES as usize {
            return Err(format!(
                "a lease of {} responses is more than llama.cpp's {MAX_SEQUENCES} sequences per context",
                seqs.len()
            ));
        }
        let longest = seqs.iter().map(|q| q.tokens.len()).max().unwrap_or(0);
        let n_ctx_seq = (longest + s.max_tokens as usize) as u32;
        let mut times = Sections::default();
        let started = Instant::now();
        let mut ctx = BatchedContext::new(
            &self.model,
            seqs.len() as u32,
            n_ctx_seq,
            BATCH_TOKENS.max(seqs.len() as u32),
            self.threads,
        )
        .map_err(|e| e.to_string())?;
        ctx.clear();
        times.context = started.elapsed();
        let started = Instant::now();
        self.prefill(&mut ctx, &mut seqs, &mut times)?;
        times.prefill = started.elapsed();
        let started = Instant::now();
        self.generate(&mut ctx, &mut seqs, &mut times)?;
        times.generation = started.elapsed();
        let responses = seqs
            .into_iter()
            .map(|q| Response {
                prompt: q.prompt,
                sample: q.sample,
                tokens: q.out,
                stopped_at_eog: q.eog,
                nll: q.nll,
            })
            .collect();
        Ok((ResponsePartial::new(range, responses), times))
    }

    /// Decodes every prompt, batches filled across sequences, and takes
    /// each response's first token from its prompt's last logits.
    fn prefill(
        &self,
        ctx: &mut BatchedContext<'_>,
        seqs: &mut [Seq<'_>],
        times: &mut Sections,
    ) -> Result<(), String> {
        let all: Vec<Entry> = seqs
            .iter()
            .enumerate()
            .flat_map(|(q, seq)| {
                let last = seq.tokens.len() - 1;
                seq.tokens.iter().enumerate().map(move |(j, &token)| Entry {
                    token,
                    pos: j as i32,
                    seq: q as i32,
                    logits: j == last,
                })
            })
            .collect();
        for part in all.chunks(ctx.capacity()) {
            self.step(ctx, seqs, part, times)?;
        }
        Ok(())
    }

    /// Feeds every live sequence its last token, a batch at a time, until
    /// every sequence is done.
    fn generate(
        &self,
        ctx: &mut BatchedContext<'_>,
        seqs: &mut [Seq<'_>],
        times: &mut Sections,
    ) -> Result<(), String> {
        loop {
            let live: Vec<Entry> = seqs
                .iter()
                .enumerate()
                .filter(|(_, q)| !q.done)
                .map(|(i, q)| Entry {
                    token: *q.out.last().expect("a live sequence has a token"),
                    pos: (q.tokens.len() + q.out.len() - 1) as i32,
                    seq: i as i32,
                    logits: true,
                })
                .collect();
            if live.is_empty() {
                return Ok(());
            }
            for part in live.chunks(ctx.capacity()) {
                self.step(ctx, seqs, part, times)?;
            }
        }
    }

    /// Decodes `entries` and samples the next token of each sequence whose
    /// entry asked for logits.
    fn step(
        &self,
        ctx: &mut BatchedContext<'_>,
        seqs: &mut [Seq<'_>],
        entries: &[Entry],
        times: &mut Sections,
    ) -> Result<(), String> {
        let max_tokens = self.sampling.max_tokens as usize;
        let (model, ignore_eog) = (&self.model, self.ignore_eog);
        let started = Instant::now();
        let mut sample = Duration::ZERO;
        ctx.decode(entries, &mut |i, row| {
            let t = Instant::now();
            let q = &mut seqs[entries[i].seq as usize];
            let c = q.sampler.choose(row);
            q.nll += c.nll;
            if !ignore_eog && model.is_end_of_generation(c.token) {
                q.eog = true;
                q.done = true;
            } else {
                q.out.push(c.token);
                q.done = q.out.len() >= max_tokens;
            }
            sample += t.elapsed();
        })
        .map_err(|e| e.to_string())?;
        times.decode += started.elapsed().saturating_sub(sample);
        times.sample += sample;
        times.decodes += 1;
        Ok(())
    }
}
