//! What a worker computes for each lease, by the task the coordinator
//! welcomed it with: [`LeaseWork`] is all the join loop needs, so one loop
//! serves every task. Collection measures chunks on an [`Engine`] (and
//! stores the trace part); evaluation first reads the job's keep maps (and
//! importance matrix) from the run, makes each candidate from its base model
//! (refusing the job when one's SHA-256 is not the coordinator's) and evaluates chunks on an
//! [`EvalEngine`]; the response phase reads the job's prompts and generates
//! a lease's responses with a [`Responder`] (no corpus exists yet, so its
//! leases get none). A new task is one more implementation.

use super::engine::{Engine, EngineLoader, EngineThread};
use super::eval_engine::EvalEngine;
use super::{Corpus, JoinError};
use crate::eval::candidates::Inputs;
use crate::respond::Responder;
use numbers::eval::EvalPartial;
use numbers::partial::Partial;
use numbers::respond::ResponsePartial;
use numbers::ChunkRange;
use protocol::wire::{EvalJob, JobInfo, RespondJob, Task};
use runfiles::file_error::FileError;
use runfiles::keepmap::KeepMap;
use runfiles::lease::{Labels, LeaseOutput};
use runfiles::respond::PromptFile;
use runfiles::store::RunStore;
use runfiles::trace::TraceRow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The result of a lease, when it is computed.
pub(super) type Produced<'a> = Pin<Box<dyn Future<Output = Result<Output, String>> + Send + 'a>>;

/// The result of one or more leases of a task: what a worker adds up
/// between its checkpoints (exactly, so the grouping changes no bit).
#[derive(Debug)]
pub(super) enum Output {
    /// A collection partial (boxed: it is large beside an eval partial).
    Collect(Box<Partial>),
    /// An eval partial.
    Evaluate(EvalPartial),
    /// Generated responses.
    Respond(ResponsePartial),
}

impl Output {
    /// Adds the result of other leases of the same task.
    pub(super) fn merge(&mut self, other: Output) -> Result<(), String> {
        match (self, other) {
            (Output::Collect(a), Output::Collect(b)) => a.merge(&b).map_err(|e| e.to_string()),
            (Output::Evaluate(a), Output::Evaluate(b)) => a.merge(&b).map_err(|e| e.to_string()),
            (Output::Respond(a), Output::Respond(b)) => a.merge(&b).map_err(|e| e.to_string()),
            _ => Err("results of two tasks do not add".into()),
        }
    }

    /// The encoding the coordinator decodes.
    pub(super) fn encode(&self) -> Vec<u8> {
        match self {
            Output::Collect(p) => p.encode(),
            Output::Evaluate(p) => p.encode(),
            Output::Respond(p) => p.encode(),
        }
    }
}

/// The work of one task, loaded for one job.
pub(super) struct Work {
    /// How logs name its leases and results.
    pub(super) labels: Labels,
    /// SHA-256 of the model the work runs on (a mismatch with the job makes
    /// the worker refuse it).
    pub(super) model_sha256: String,
    /// What computes each lease.
    pub(super) task: Box<dyn LeaseWork>,
}

/// What a lease is computed from: the chunks `range` of the `corpus`
/// (which the response phase has not: its units are prompts), and the run
/// that stores what goes besides the result (trace parts).
pub(super) struct LeaseInputs<'a> {
    pub(super) corpus: Option<&'a Corpus>,
    pub(super) run: &'a RunStore,
    pub(super) range: ChunkRange,
}

/// Computes a task's leases.
pub(super) trait LeaseWork: Send + Sync {
    /// Computes the result of a lease and stores what goes besides it.
    fn produce<'a>(&'a self, lease: LeaseInputs<'a>) -> Produced<'a>;
}

/// Runs `engine` on the chunks of `lease` (with their images).
async fn run_chunks<R: Send + 'static>(
    engine: &EngineThread<R>,
    lease: &LeaseInputs<'_>,
) -> Result<R, String> {
    let corpus = lease.corpus.ok_or(NO_CORPUS)?;
    let chunks = corpus.chunks(lease.range)?;
    let images = corpus.images(&chunks).await?;
    engine.run(corpus.index.clone(), chunks, images).await
}

/// Collection: partials and trace rows from an [`Engine`].
struct Collect {
    /// Partial, prefill trace rows and decode trace rows.
    engine: EngineThread<(Partial, Vec<TraceRow>, Vec<TraceRow>)>,
    /// (k, top-N) of its trace rows.
    trace_shape: (usize, usize),
}

impl LeaseWork for Collect {
    fn produce<'a>(&'a self, lease: LeaseInputs<'a>) -> Produced<'a> {
        Box::pin(async move {
            let (mut partial, rows, decode_rows) = run_chunks(&self.engine, &lease).await?;
            partial.trace_parts = Vec::new();
            for (rows, decode) in [(rows, false), (decode_rows, true)] {
                if !rows.is_empty() {
                    let (k, n) = self.trace_shape;
                    let name = runfiles::layout::trace_part(lease.range, decode);
                    let name = crate::collect::write_trace_part(lease.run, name, rows, k, n)
                        .await
                        .map_err(|e| e.to_string())?;
                    partial.trace_parts.push(name);
                }
            }
            Ok(Output::Collect(Box::new(partial)))
        })
    }
}

/// Evaluation: eval partials from an [`EvalEngine`].
struct Evaluate {
    engine: EngineThread<EvalPartial>,
}

impl LeaseWork for Evaluate {
    fn produce<'a>(&'a self, lease: LeaseInputs<'a>) -> Produced<'a> {
        Box::pin(async move { Ok(Output::Evaluate(run_chunks(&self.engine, &lease).await?)) })
    }
}

/// Why a chunk task got no corpus.
const NO_CORPUS: &str = "the job names no corpus to read chunks from";

/// The response phase: a lease's responses from a [`Responder`], on a
/// blocking thread of its own.
struct Respond {
    responder: Arc<Responder>,
}

impl LeaseWork for Respond {
    fn produce<'a>(&'a self, lease: LeaseInputs<'a>) -> Produced<'a> {
        let (responder, range) = (self.responder.clone(), lease.range);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || responder.respond(range))
                .await
                .map_err(|e| format!("generation panicked: {e}"))?
                .map(Output::Respond)
        })
    }
}

/// Loads the work of `task` for `job` on its own thread.
pub(super) async fn load<L: EngineLoader>(
    loader: L,
    job: &JobInfo,
    task: &Task,
    run: &RunStore,
) -> Result<Work, JoinError> {
    let job_for_thread = job.clone();
    match task {
        Task::Collect => {
            let load = move || {
                let e = loader.load(&job_for_thread)?;
                let facts = (e.model_sha256(), e.trace_shape());
                Ok((e, facts))
            };
            let (engine, (model_sha256, trace_shape)) = EngineThread::start(
                "engine",
                load,
                |e: &mut L::Engine, index, chunks, images| {
                    let (partial, rows) = e.measure(index, chunks, images)?;
                    Ok((partial, rows, e.take_decode_trace()))
                },
            )
            .await
            .map_err(JoinError::Engine)?;
            Ok(Work {
                labels: Partial::LABELS,
                model_sha256,
                task: Box::new(Collect {
                    engine,
                    trace_shape,
                }),
            })
        }
        Task::Respond(respond) => {
            let prompts = prompts(run, respond).await?;
            let respond = respond.clone();
            let responder = tokio::task::spawn_blocking(move || {
                loader.load_respond(&job_for_thread, &respond, prompts)
            })
            .await
            .map_err(|e| JoinError::Engine(format!("loading the model panicked: {e}")))?
            .map_err(JoinError::Engine)?;
            Ok(Work {
                labels: ResponsePartial::LABELS,
                model_sha256: responder.model_sha256().to_string(),
                task: Box::new(Respond {
                    responder: Arc::new(responder),
                }),
            })
        }
        Task::Evaluate(eval) => {
            let inputs = inputs(run, eval).await?;
            let eval = eval.clone();
            let load = move || {
                let e = loader.load_eval(&job_for_thread, &eval, &inputs)?;
                let sha = e.base_sha256();
                Ok((e, sha))
            };
            let (engine, base_sha256) = EngineThread::start(
                "eval-engine",
                load,
                |e: &mut Box<dyn EvalEngine>, index, chunks, images| {
                    e.evaluate(index, chunks, images)
                },
            )
            .await
            .map_err(JoinError::Engine)?;
            Ok(Work {
                labels: EvalPartial::LABELS,
                model_sha256: base_sha256,
                task: Box::new(Evaluate { engine }),
            })
        }
    }
}

/// Reads the response job's prompts, refusing bytes that are not the
/// coordinator's.
async fn prompts(run: &RunStore, job: &RespondJob) -> Result<PromptFile, JoinError> {
    let bytes = run.get(&job.prompts).await?;
    let sha = gguf::hash::sha256_hex(&bytes);
    if sha != job.prompts_sha256 {
        return Err(JoinError::Engine(format!(
            "{} has SHA-256 {sha}, the coordinator's is {}",
            run.url_of(&job.prompts),
            job.prompts_sha256
        )));
    }
    runfiles::respond::read_prompts(&bytes)
        .map_err(|e| JoinError::Engine(format!("{}: {e}", run.url_of(&job.prompts))))
}

/// Reads what the job's candidates are made from: their keep maps and,
/// when one is quantised, the run's importance matrix.
async fn inputs(run: &RunStore, eval: &EvalJob) -> Result<Inputs, JoinError> {
    let mut maps = Vec::with_capacity(eval.candidates.len());
    let mut merges = Vec::new();
    for c in &eval.candidates {
        let Some(object) = &c.keep_map else {
            maps.push(None);
            continue;
        };
        if object.starts_with(&format!("{}/", runfiles::mergeplan::MERGE_PLANS_DIR)) {
            let plan = runfiles::mergeplan::MergePlan::read_object(run, object)
                .await
                .map_err(|e| match e {
                    FileError::Store(e) => e.into(),
                    e => JoinError::Engine(e.to_string()),
                })?;
            maps.push(Some(plan.keep_map()));
            merges.resize(maps.len() - 1, None);
            merges.push(Some(plan));
            continue;
        }
        let (map, _) = KeepMap::read_object(run, object)
            .await
            .map_err(|e| match e {
                FileError::Store(e) => e.into(),
                e => JoinError::Engine(e.to_string()),
            })?;
        maps.push(Some(map));
    }
    let imatrix = match eval.candidates.iter().any(|c| c.quant.is_some()) {
        true => Some(run.get(runfiles::layout::IMATRIX_GGUF).await?.to_vec()),
        false => None,
    };
    Ok(Inputs {
        maps,
        merges,
        imatrix,
    })
}
