//! The engines behind `worker join`, each on a thread of its own
//! ([`EngineThread`]: a llama.cpp context need not be `Send`): [`Engine`]
//! is what a collection lease needs, [`EvalEngine`] what an evaluation
//! lease needs, [`CollectorLoader`] loads the real ones over [`Collector`]
//! and [`SlicedEvaluator`].

use super::eval_engine::{EvalEngine, SlicedEvaluator};
use crate::collect::device::Reduce;
use crate::collect::{CollectOptions, Collector};
use crate::error::WorkerError;
use crate::eval::candidates::Inputs;
use crate::eval::{Compare, EvalOptions};
use crate::images::ImageBytes;
use crate::respond::Responder;
use llama::Offload;
use numbers::eval::ModelsInMemory;
use numbers::partial::Partial;
use protocol::wire::{EvalJob, JobInfo, RespondJob};
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::respond::PromptFile;
use runfiles::trace::TraceRow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Measures chunks of a corpus.
pub trait Engine {
    /// SHA-256 of the model file the engine measures.
    fn model_sha256(&self) -> String;
    /// Experts per token (k) and router top-N of trace rows.
    fn trace_shape(&self) -> (usize, usize);
    /// Measures the chunks, whose images' bytes are in `images`; the
    /// partial and the trace rows of traced chunks. Engines that cannot
    /// measure images refuse image chunks.
    fn measure(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
    ) -> Result<(Partial, Vec<TraceRow>), String>;

    /// The decode trace rows (generated tokens) of the last
    /// [`Engine::measure`], taken; engines without decode traces have none.
    fn take_decode_trace(&mut self) -> Vec<TraceRow> {
        Vec::new()
    }
}

/// Creates an engine once the job is known (on the engine's thread); cloned
/// to load again when a reconnect brings another job.
pub trait EngineLoader: Send + Clone + 'static {
    /// The engine it makes.
    type Engine: Engine;
    /// Compute backend, announced in `Hello` before any job data.
    fn backend(&self) -> String;
    /// Loads the model for `job`.
    fn load(self, job: &JobInfo) -> Result<Self::Engine, String>;
    /// Loads the base model of an evaluation job and makes its candidates
    /// from it and `inputs`. Engines that cannot evaluate refuse.
    fn load_eval(
        self,
        _job: &JobInfo,
        _eval: &EvalJob,
        _inputs: &Inputs,
    ) -> Result<Box<dyn EvalEngine>, String> {
        Err("this engine cannot evaluate pruned candidates".into())
    }
    /// Loads the model of a response job with its prompts. Engines that
    /// cannot generate refuse.
    fn load_respond(
        self,
        _job: &JobInfo,
        _respond: &RespondJob,
        _prompts: PromptFile,
    ) -> Result<Responder, String> {
        Err("this engine cannot generate responses".into())
    }
}

/// The real engine: llama.cpp through [`Collector`].
#[derive(Clone, Debug)]
pub struct CollectorLoader {
    /// Model file; `None` uses the path the coordinator sends.
    pub model: Option<PathBuf>,
    /// The model's mmproj, for jobs whose corpus has images; `None` uses
    /// the path the coordinator sends.
    pub mmproj: Option<PathBuf>,
    /// Where the model's weights live.
    pub offload: Offload,
    /// CPU threads (`None`: all cores).
    pub threads: Option<u32>,
    /// Where observed tensors are reduced.
    pub reduce: Reduce,
    /// Where evaluations compare logits.
    pub compare: Compare,
    /// Models an evaluation holds at once (`None`: the job's).
    pub models_in_memory: Option<ModelsInMemory>,
    /// Scratch directory of evaluations (`None`: the job's, else `$TMPDIR`).
    pub scratch_dir: Option<PathBuf>,
}

/// [`Collector`] with the trace width of its job.
pub struct CollectorEngine {
    collector: Collector,
    trace_top_n: usize,
    /// The decode trace rows of the last measurement, until taken.
    decode_trace: Vec<TraceRow>,
}

impl EngineLoader for CollectorLoader {
    type Engine = CollectorEngine;

    fn backend(&self) -> String {
        let on_device = self
            .reduce
            .on_device(self.offload.n_gpu_layers, llama::has_gpu());
        crate::collect::device::backend_label(on_device, &self.offload)
    }

    fn load(self, job: &JobInfo) -> Result<CollectorEngine, String> {
        let o = &job.options;
        let mut opts = CollectOptions {
            n_ubatch: o.n_ubatch,
            offload: self.offload,
            trace_every: o.trace_every.fit,
            trace_every_heldout: Some(o.trace_every.heldout),
            trace_top_n: o.trace_top_n as usize,
            trace_lookahead: o.trace_lookahead.clone(),
            decode_tokens: o.decode_tokens as usize,
            decode_prompt: o.decode_prompt as usize,
            f32_kv: o.f32_kv,
            flash_attn: o.flash_attn,
            reduce: self.reduce,
            merge_projection: o.merge_projection,
            ..CollectOptions::default()
        };
        if let Some(t) = self.threads {
            opts.threads = t;
        }
        let model = self.model.unwrap_or_else(|| PathBuf::from(&job.model_path));
        let mut collector = Collector::load(&model, opts).map_err(|e| e.to_string())?;
        load_mmproj(job, self.mmproj, |path| collector.load_mmproj(path))?;
        Ok(CollectorEngine {
            collector,
            trace_top_n: o.trace_top_n as usize,
            decode_trace: Vec::new(),
        })
    }

    fn load_respond(
        self,
        job: &JobInfo,
        respond: &RespondJob,
        prompts: PromptFile,
    ) -> Result<Responder, String> {
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
        let model = self.model.unwrap_or_else(|| PathBuf::from(&job.model_path));
        Responder::load(&model, &self.offload, threads, prompts, respond.sampling)
    }

    fn load_eval(
        self,
        job: &JobInfo,
        eval: &EvalJob,
        inputs: &Inputs,
    ) -> Result<Box<dyn EvalEngine>, String> {
        let o = &job.options;
        let mut opts = EvalOptions {
            n_ubatch: o.n_ubatch,
            offload: self.offload,
            f32_kv: o.f32_kv,
            flash_attn: o.flash_attn,
            skip_first: eval.skip_first,
            splits: eval.splits.clone(),
            compare: self.compare,
            models_in_memory: self.models_in_memory.unwrap_or(eval.models_in_memory),
            generate: eval.generate.clone(),
            ..EvalOptions::default()
        };
        if let Some(dir) = self
            .scratch_dir
            .or_else(|| eval.scratch_dir.as_ref().map(PathBuf::from))
        {
            opts.scratch_dir = dir;
        }
        if let Some(t) = self.threads {
            opts.threads = t;
        }
        let base = self.model.unwrap_or_else(|| PathBuf::from(&job.model_path));
        let mut engine = SlicedEvaluator::load(&base, inputs, eval, opts)?;
        load_mmproj(job, self.mmproj, |path| engine.load_mmproj(path))?;
        Ok(Box::new(engine))
    }
}

/// Loads the job's mmproj with `load` when its corpus has images: from
/// `path` (`--mmproj`) or where the coordinator says, refused unless its
/// SHA-256 is the one the corpus was prepared with.
fn load_mmproj(
    job: &JobInfo,
    path: Option<PathBuf>,
    load: impl FnOnce(&Path) -> Result<String, WorkerError>,
) -> Result<(), String> {
    let Some(want) = &job.mmproj else {
        return Ok(());
    };
    let path = path.unwrap_or_else(|| PathBuf::from(&want.path));
    let sha256 = load(&path).map_err(|e| e.to_string())?;
    if sha256 != want.sha256 {
        return Err(format!(
            "mmproj {} has SHA-256 {sha256}, but the run's corpus was prepared with {} \
             (pass the run's mmproj with --mmproj)",
            path.display(),
            want.sha256
        ));
    }
    Ok(())
}

impl Engine for CollectorEngine {
    fn model_sha256(&self) -> String {
        self.collector.model_sha256().to_string()
    }

    fn trace_shape(&self) -> (usize, usize) {
        let shape = self.collector.shape();
        (
            shape.n_expert_used as usize,
            self.trace_top_n.min(shape.n_expert as usize),
        )
    }

    fn measure(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
    ) -> Result<(Partial, Vec<TraceRow>), String> {
        let c = self
            .collector
            .run_with_images(index, chunks, images, &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        self.decode_trace = c.decode_trace;
        Ok((c.partial, c.trace))
    }

    fn take_decode_trace(&mut self) -> Vec<TraceRow> {
        std::mem::take(&mut self.decode_trace)
    }
}

/// One request to an engine thread: chunks of a corpus with the bytes of
/// their images, and where the result goes.
type Request<R> = (
    Arc<CorpusIndex>,
    Vec<Chunk>,
    ImageBytes,
    oneshot::Sender<Result<R, String>>,
);

/// An engine running on its own thread (a llama.cpp context need not be
/// `Send`), answering requests with results of type `R`.
pub struct EngineThread<R> {
    requests: mpsc::Sender<Request<R>>,
}

impl<R: Send + 'static> EngineThread<R> {
    /// Starts the thread `name`; `load` makes the engine there and the facts
    /// the caller needs about it (its model hash, say), returned once it is
    /// loaded; `run` computes each request's result with the engine.
    pub async fn start<E, I, Load, Run>(
        name: &str,
        load: Load,
        mut run: Run,
    ) -> Result<(EngineThread<R>, I), String>
    where
        I: Send + 'static,
        Load: FnOnce() -> Result<(E, I), String> + Send + 'static,
        Run: FnMut(&mut E, &CorpusIndex, &[Chunk], &ImageBytes) -> Result<R, String>
            + Send
            + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Request<R>>(1);
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut engine = match load() {
                    Ok((e, info)) => {
                        let _ = ready_tx.send(Ok(info));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Some((index, chunks, images, reply)) = rx.blocking_recv() {
                    let _ = reply.send(run(&mut engine, &index, &chunks, &images));
                }
            })
            .map_err(|e| format!("cannot start the {name} thread: {e}"))?;
        let info = ready_rx
            .await
            .map_err(|_| format!("the {name} thread died while loading"))??;
        Ok((EngineThread { requests: tx }, info))
    }

    /// Computes the result of chunks (with their images' bytes) on the
    /// engine thread.
    pub async fn run(
        &self,
        index: Arc<CorpusIndex>,
        chunks: Vec<Chunk>,
        images: ImageBytes,
    ) -> Result<R, String> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send((index, chunks, images, tx))
            .await
            .map_err(|_| "the engine thread is gone".to_string())?;
        rx.await.map_err(|_| "the engine thread died".to_string())?
    }
}
