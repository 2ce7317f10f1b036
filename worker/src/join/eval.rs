//! `worker join` in an evaluation run: the worker reads the job's keep maps
//! from the run, slices each candidate from its base model (refusing the
//! job when a slice's SHA-256 is not the coordinator's), then evaluates
//! leases on an engine thread and reports eval partials, heartbeating all
//! along like a collection lease.

use super::engine::EngineLoader;
use super::eval_engine::EvalEngine;
use super::{report_lease, Conn, Corpus, JoinError, JoinSummary};
use common::corpus::{read_chunks, Chunk, CorpusIndex};
use common::eval::EvalPartial;
use common::keepmap::KeepMap;
use common::store::RunStore;
use common::wire::{
    staged_partial_name, write_msg, EvalJob, JobInfo, LeaseGrant, PartialRef, ToCoordinator,
    ToWorker, WorkerState,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type EvalRequest = (
    Arc<CorpusIndex>,
    Vec<Chunk>,
    oneshot::Sender<Result<EvalPartial, String>>,
);

/// An eval engine running on its own thread (a llama.cpp context need not
/// be `Send`).
struct EvalThread {
    jobs: mpsc::Sender<EvalRequest>,
    base_sha256: String,
}

impl EvalThread {
    /// Starts the thread and loads the eval engine for the job there.
    async fn start<L: EngineLoader>(
        loader: L,
        job: &JobInfo,
        eval: &EvalJob,
        maps: Vec<(String, KeepMap)>,
    ) -> Result<EvalThread, String> {
        let (tx, mut rx) = mpsc::channel::<EvalRequest>(1);
        let (ready_tx, ready_rx) = oneshot::channel();
        let (job, eval) = (job.clone(), eval.clone());
        std::thread::Builder::new()
            .name("eval-engine".into())
            .spawn(move || {
                let mut engine: Box<dyn EvalEngine> = match loader.load_eval(&job, &eval, &maps) {
                    Ok(e) => {
                        let _ = ready_tx.send(Ok(e.base_sha256()));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Some((index, chunks, reply)) = rx.blocking_recv() {
                    let _ = reply.send(engine.evaluate(&index, &chunks));
                }
            })
            .map_err(|e| format!("cannot start the eval engine thread: {e}"))?;
        let base_sha256 = ready_rx
            .await
            .map_err(|_| "the eval engine thread died while loading".to_string())??;
        Ok(EvalThread {
            jobs: tx,
            base_sha256,
        })
    }

    /// Evaluates chunks on the engine thread.
    async fn evaluate(
        &self,
        index: Arc<CorpusIndex>,
        chunks: Vec<Chunk>,
    ) -> Result<EvalPartial, String> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send((index, chunks, tx))
            .await
            .map_err(|_| "the eval engine thread is gone".to_string())?;
        rx.await
            .map_err(|_| "the eval engine thread died".to_string())?
    }
}

/// Reads the job's keep maps from the run, each with its candidate name.
async fn keep_maps(run: &RunStore, eval: &EvalJob) -> Result<Vec<(String, KeepMap)>, JoinError> {
    let mut out = Vec::with_capacity(eval.candidates.len());
    for c in &eval.candidates {
        let bytes = run.get(&c.keep_map).await?;
        let map = serde_json::from_slice(&bytes).map_err(|e| {
            JoinError::Engine(format!(
                "{} is not a keep map: {e}",
                run.url_of(&c.keep_map)
            ))
        })?;
        out.push((c.name.clone(), map));
    }
    Ok(out)
}

/// The eval job's work loop, after the welcome.
pub(super) async fn work<L: EngineLoader>(
    c: &mut Conn,
    loader: L,
    job: JobInfo,
    eval: EvalJob,
    summary: &mut JoinSummary,
) -> Result<(), JoinError> {
    let heartbeat = Duration::from_millis(job.heartbeat_ms.max(50));
    let run = RunStore::open(&job.run_url)?;
    let maps = keep_maps(&run, &eval).await?;
    let loading = EvalThread::start(loader, &job, &eval, maps);
    tokio::pin!(loading);
    let loaded = loop {
        tokio::select! {
            r = &mut loading => break r,
            _ = tokio::time::sleep(heartbeat) => {
                c.poll(WorkerState::Loading).await?;
            }
        }
    };
    let engine = match loaded {
        Ok(e) if e.base_sha256 == job.model_sha256 => e,
        Ok(e) => {
            let err = JoinError::ModelMismatch {
                path: job.model_path.clone(),
                actual: e.base_sha256,
                expected: job.model_sha256.clone(),
            };
            return refuse(c, err).await;
        }
        Err(reason) => return refuse(c, JoinError::Engine(reason)).await,
    };
    let corpus = Corpus::open(&job).await?;
    loop {
        match c.poll(WorkerState::Idle).await? {
            ToWorker::Lease(lease) => {
                let done = eval_lease(c, &engine, &corpus, &run, &job, &lease, heartbeat).await?;
                count(summary, &lease, done);
            }
            ToWorker::Wait { retry_ms } => {
                tokio::time::sleep(Duration::from_millis(retry_ms)).await
            }
            ToWorker::Finished => return Ok(()),
            other => {
                return Err(JoinError::Protocol(format!(
                    "unexpected reply to a poll: {other:?}"
                )))
            }
        }
    }
}

fn count(summary: &mut JoinSummary, lease: &LeaseGrant, done: bool) {
    summary.leases += u64::from(done);
    summary.chunks += u64::from(lease.range.len()) * u64::from(done);
}

/// Tells the coordinator this worker refuses the job, and why.
async fn refuse(c: &mut Conn, err: JoinError) -> Result<(), JoinError> {
    write_msg(
        &mut c.send,
        &ToCoordinator::Refuse {
            reason: err.to_string(),
        },
    )
    .await?;
    Err(err)
}

/// Evaluates a lease's chunks and stages the eval partial when it is too
/// large to travel inline.
async fn produce(
    engine: &EvalThread,
    corpus: &Corpus,
    run: &RunStore,
    job: &JobInfo,
    lease: &LeaseGrant,
) -> Result<(PartialRef, String), String> {
    corpus.index.check_range(lease.range)?;
    let chunks = read_chunks(corpus.table.clone(), Some(lease.range))
        .map_err(|e| format!("{}: {e}", corpus.url))?;
    let partial = engine.evaluate(corpus.index.clone(), chunks).await?;
    let bytes = partial.to_bytes();
    let sha256 = common::hash::sha256_hex(&bytes);
    let partial = if bytes.len() as u64 <= job.max_inline_bytes {
        PartialRef::Inline(bytes)
    } else {
        let name = staged_partial_name(&sha256).expect("a SHA-256 in hex");
        run.put(&name, bytes).await.map_err(|e| e.to_string())?;
        PartialRef::Stored(name)
    };
    Ok((partial, sha256))
}

/// Evaluates one lease while heartbeating and reports the result (or the
/// failure). Returns whether a result was sent.
async fn eval_lease(
    c: &mut Conn,
    engine: &EvalThread,
    corpus: &Corpus,
    run: &RunStore,
    job: &JobInfo,
    lease: &LeaseGrant,
    heartbeat: Duration,
) -> Result<bool, JoinError> {
    let work = produce(engine, corpus, run, job, lease);
    let done = |partial, sha256, elapsed_ms| ToCoordinator::EvalDone {
        lease_id: lease.lease_id,
        partial,
        sha256,
        elapsed_ms,
    };
    report_lease(c, lease, heartbeat, "eval lease", work, done).await
}
