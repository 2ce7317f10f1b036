//! `worker join`: connect to a coordinator over QUIC, prove the join secret,
//! then serve every phase of the run (collection, evaluation, shipping's
//! evaluation), waiting between them, until the coordinator says the run is
//! finished. A lost connection
//! (the coordinator restarted, the network dropped, a full server refused
//! it) is retried with exponential backoff until [`Reconnect::give_up`]
//! passes without a session; the loaded work is kept across sessions of the
//! same job.
//!
//! - [`tls`]: how the coordinator's certificate is trusted (pin or CA).
//! - [`stop`]: a signal stops the worker after its current lease.
//! - [`engine`]: the engines on their own threads; [`eval_engine`] the
//!   evaluating one.
//! - `work`: what each lease computes, by the welcome's task (collection or
//!   evaluation), behind one trait, so one loop serves both.
//! - [`join`] runs the protocol of [`protocol::wire`] with any engine.

pub mod engine;
pub mod eval_engine;
pub mod stop;
pub mod tls;
mod work;

use crate::collect::device::Reduce;
use crate::eval::Compare;
use engine::EngineLoader;
use llama::Offload;
use numbers::peer_text::peer_text;
use protocol::secret::{JoinSecret, WorkerKey};
use protocol::wire::{
    join_proof, parse_pin, read_msg, write_msg, Checkpoint, JobInfo, LeaseGrant, PartialRef,
    Refusal, Task, ToCoordinator, ToWorker, WireError, WorkerState, MAX_CONTROL_FRAME,
    PROTOCOL_VERSION, RUN_FINISHED,
};
use runfiles::corpus::{read_chunks, Chunk, CorpusIndex, CHUNKS_FILE};
use runfiles::file_error::FileError;
use runfiles::store::RunStore;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls::Trust;

/// Environment variable holding the join secret when no file is given.
pub use runfiles::layout::env::JOIN_SECRET as SECRET_ENV;

/// What `worker join` was asked (the `worker` binary's flags, read by its
/// command line in the coordinator package).
#[derive(Debug, Clone)]
pub struct JoinArgs {
    /// Coordinator address, `HOST:PORT`.
    pub coordinator: String,
    /// SHA-256 fingerprint of the coordinator's certificate (`--pin`).
    pub pin: Option<String>,
    /// Cluster CA certificate (PEM) that signed the coordinator's certificate.
    pub ca: Option<PathBuf>,
    /// Name to check in the coordinator's certificate (default: the host of `coordinator`).
    pub server_name: Option<String>,
    /// File holding the join secret (default: [`SECRET_ENV`]).
    pub secret_file: Option<PathBuf>,
    /// This worker's own key file, instead of the join secret.
    pub key_file: Option<PathBuf>,
    /// This worker's name (default: host name and process id).
    pub name: Option<String>,
    /// GGUF model file (default: the path the coordinator sends).
    pub model: Option<PathBuf>,
    /// The model's mmproj GGUF (default: the path the coordinator sends).
    pub mmproj: Option<PathBuf>,
    /// Where the model's weights live.
    pub offload: Offload,
    /// CPU threads (default: all cores).
    pub threads: Option<u32>,
    /// Where observed tensors are reduced (default: [`Reduce::from_flag_or_env`]).
    pub reduce: Option<Reduce>,
    /// Where an evaluation compares base and candidate logits.
    pub compare: Compare,
    /// Models an evaluation holds in memory at once (default: the run's).
    pub models_in_memory: Option<numbers::eval::ModelsInMemory>,
    /// Scratch directory for sliced candidates and a lease's base logits.
    pub scratch_dir: Option<PathBuf>,
    /// Seconds to keep reconnecting without reaching the coordinator.
    pub give_up_after_s: u64,
}

/// Why joining or working failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Flags or secret are unusable.
    #[error("{0}")]
    Setup(String),
    /// The QUIC/TLS connection failed for good (including a certificate
    /// that does not match).
    #[error("cannot connect to the coordinator at {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The coordinator could not be reached or the connection was lost
    /// (worth retrying: it may be restarting or busy).
    #[error("lost the coordinator: {0}")]
    Lost(String),
    /// Reconnecting did not succeed within the give-up time.
    #[error("gave up after {after:?} without reaching the coordinator; last: {last}")]
    GaveUp {
        /// The give-up time.
        after: Duration,
        /// The last error.
        last: Box<JoinError>,
    },
    /// The coordinator refused this worker.
    #[error("the coordinator refused this worker: {0}")]
    Refused(Refusal),
    /// The model is not the run's.
    #[error("model {path} has sha256 {actual}, the run needs {expected}")]
    ModelMismatch {
        /// The worker's model file.
        path: String,
        /// Its hash.
        actual: String,
        /// The run's.
        expected: String,
    },
    /// The engine could not start.
    #[error("engine: {0}")]
    Engine(String),
    /// The corpus or the run's storage failed.
    #[error(transparent)]
    Store(#[from] runfiles::store::StoreError),
    /// The stream broke or carried something unexpected.
    #[error("protocol: {0}")]
    Protocol(String),
}

impl From<WireError> for JoinError {
    fn from(e: WireError) -> JoinError {
        match e {
            WireError::Io(_) | WireError::Silent(_) => JoinError::Lost(e.to_string()),
            WireError::TooLarge { .. } | WireError::Malformed(_) => {
                JoinError::Protocol(e.to_string())
            }
        }
    }
}

impl JoinError {
    /// Whether a new connection may succeed where this one failed: only a
    /// lost or unreachable coordinator; refusals, certificate, model and
    /// protocol errors are final.
    pub fn is_retryable(&self) -> bool {
        matches!(self, JoinError::Lost(_))
    }
}

/// Whether a failed connection is worth retrying: the peer closed, reset or
/// refused it, or it timed out; not a failure detected locally (a
/// certificate that does not match, a version mismatch).
fn connection_lost(e: &quinn::ConnectionError) -> bool {
    use quinn::ConnectionError as E;
    matches!(
        e,
        E::TimedOut | E::Reset | E::ConnectionClosed(_) | E::ApplicationClosed(_)
    )
}

/// What a worker did before it left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinSummary {
    /// Leases finished and reported.
    pub leases: u64,
    /// Chunks measured.
    pub chunks: u64,
}

/// How a worker reconnects after losing the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// Wait before the first retry; doubled after each failed attempt.
    pub first_delay: Duration,
    /// Longest wait between attempts.
    pub max_delay: Duration,
    /// Give up when no session could be established for this long.
    pub give_up: Duration,
}

impl Reconnect {
    /// Backoff from 250 ms to 1 s, giving up after `give_up`: a restarted
    /// coordinator is found within a second of listening again (an attempt
    /// is one handshake, cheap for the coordinator to refuse).
    pub fn giving_up_after(give_up: Duration) -> Reconnect {
        Reconnect {
            first_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(1),
            give_up,
        }
    }
}

/// Connection settings, resolved from [`JoinArgs`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Coordinator address.
    pub addr: SocketAddr,
    /// Name checked in its certificate.
    pub server_name: String,
    /// How its certificate is trusted.
    pub trust: Trust,
    /// This worker's key (its own, or made from the join secret for `name`).
    pub key: WorkerKey,
    /// This worker's name (the one `key` proves).
    pub name: String,
    /// Reconnection policy.
    pub reconnect: Reconnect,
}

impl ClientOptions {
    /// Resolves the address, trust and secret of `args`.
    pub fn from_args(args: &JoinArgs) -> Result<ClientOptions, JoinError> {
        use std::net::ToSocketAddrs;
        let addr = args
            .coordinator
            .to_socket_addrs()
            .map_err(|e| JoinError::Setup(format!("--coordinator {}: {e}", args.coordinator)))?
            .next()
            .ok_or_else(|| {
                JoinError::Setup(format!("--coordinator {}: no address", args.coordinator))
            })?;
        let host = args.coordinator.rsplit_once(':').map_or("", |(h, _)| h);
        let server_name = args.server_name.clone().unwrap_or_else(|| {
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string()
        });
        let trust = match (&args.pin, &args.ca) {
            (Some(pin), _) => Trust::Pin(parse_pin(pin).ok_or_else(|| {
                JoinError::Setup(format!("--pin {pin:?} is not a SHA-256 fingerprint"))
            })?),
            (None, Some(ca)) => Trust::Ca(ca.clone()),
            (None, None) => return Err(JoinError::Setup("give --pin or --ca".into())),
        };
        let key = match &args.key_file {
            Some(path) => WorkerKey::from_file(path)
                .map_err(|e| JoinError::Setup(format!("--key-file: {e}")))?,
            None => {
                let name = args
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
                WorkerKey::derive(&join_secret(args)?, &name)
            }
        };
        Ok(ClientOptions {
            addr,
            server_name,
            trust,
            name: key.name().to_string(),
            key,
            reconnect: Reconnect::giving_up_after(Duration::from_secs(args.give_up_after_s)),
        })
    }
}

/// The join secret of `args`: `--secret-file`, else the environment.
fn join_secret(args: &JoinArgs) -> Result<JoinSecret, JoinError> {
    match &args.secret_file {
        Some(path) => {
            JoinSecret::from_file(path).map_err(|e| JoinError::Setup(format!("--secret-file: {e}")))
        }
        None => {
            let value = std::env::var(SECRET_ENV).map_err(|_| {
                JoinError::Setup(format!(
                    "no join secret: give --secret-file, --key-file or set {SECRET_ENV}"
                ))
            })?;
            JoinSecret::new(value.as_bytes(), &format!("variable {SECRET_ENV}"))
                .map_err(|e| JoinError::Setup(e.to_string()))
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".into())
}

/// `worker join` with the real engine, on the caller's tokio runtime (the
/// binary's): serves the run until it is finished or a signal stops it.
pub async fn run(args: JoinArgs) -> Result<JoinSummary, JoinError> {
    let opts = ClientOptions::from_args(&args)?;
    let loader = engine::CollectorLoader {
        model: args.model.clone(),
        mmproj: args.mmproj.clone(),
        offload: args.offload,
        threads: args.threads,
        reduce: Reduce::from_flag_or_env(args.reduce)
            .map_err(|e| JoinError::Setup(e.to_string()))?,
        compare: args.compare,
        models_in_memory: args.models_in_memory,
        scratch_dir: args.scratch_dir.clone(),
    };
    stop::watch().map_err(|e| JoinError::Setup(format!("watching for signals: {e}")))?;
    let summary = join(&opts, loader).await?;
    tracing::info!(
        "leaving: {} leases, {} chunks measured",
        summary.leases,
        summary.chunks
    );
    Ok(summary)
}

struct Conn {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
}

impl Conn {
    async fn ask(&mut self, msg: &ToCoordinator) -> Result<ToWorker, JoinError> {
        write_msg(&mut self.send, msg).await?;
        match read_msg(&mut self.recv, MAX_CONTROL_FRAME).await? {
            Some(ToWorker::Refused(r)) => Err(JoinError::Refused(r)),
            Some(reply) => Ok(reply),
            None => Err(JoinError::Lost("the coordinator closed the stream".into())),
        }
    }

    async fn poll(&mut self, state: WorkerState) -> Result<ToWorker, JoinError> {
        self.ask(&ToCoordinator::Poll {
            protocol_version: PROTOCOL_VERSION,
            state,
        })
        .await
    }
}

/// Longest wait for one connection attempt (QUIC and TLS handshakes); a
/// new attempt starts with a fresh Initial instead of a backed-off retransmit.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The work loaded for a job and task; reused by later sessions of the
/// same job.
struct Loaded {
    job: JobInfo,
    task: Task,
    work: work::Work,
}

/// Joins the coordinator at `opts.addr` and works until it says the run is
/// finished, reconnecting with backoff when the connection is lost. Nothing
/// about the job is received before the proof.
pub async fn join<L: EngineLoader>(
    opts: &ClientOptions,
    loader: L,
) -> Result<JoinSummary, JoinError> {
    let connect_err = |reason: String| JoinError::Connect {
        addr: opts.addr.to_string(),
        reason,
    };
    let bind: SocketAddr = if opts.addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("valid address");
    let mut endpoint = quinn::Endpoint::client(bind).map_err(|e| connect_err(e.to_string()))?;
    endpoint.set_default_client_config(tls::client_config(&opts.trust).map_err(connect_err)?);
    let mut client = Client {
        opts,
        loader,
        loaded: None,
        summary: JoinSummary::default(),
        joined: false,
    };
    let mut delay = opts.reconnect.first_delay;
    let mut failing_since: Option<Instant> = None;
    let result = loop {
        client.joined = false;
        let error = match session(&endpoint, &mut client).await {
            Ok(()) => break Ok(client.summary),
            Err(e) => e,
        };
        if client.joined {
            delay = opts.reconnect.first_delay;
            failing_since = None;
        }
        if !error.is_retryable() {
            break Err(error);
        }
        if stop::requested() {
            tracing::info!("stopped by a signal: not reconnecting ({error})");
            break Ok(client.summary);
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() + delay > opts.reconnect.give_up {
            break Err(JoinError::GaveUp {
                after: opts.reconnect.give_up,
                last: Box::new(error),
            });
        }
        tracing::warn!("{error}; reconnecting in {delay:?}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(opts.reconnect.max_delay);
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    result
}

/// What a worker keeps across its sessions (connections) with the
/// coordinator.
struct Client<'a, L> {
    opts: &'a ClientOptions,
    loader: L,
    /// The last phase's work, reused when the next phase's is the same.
    loaded: Option<Loaded>,
    /// Leases and chunks shipped so far.
    summary: JoinSummary,
    /// Set once the coordinator welcomed this worker in the current session.
    joined: bool,
}

/// One connection: join, then work until the run is finished or the
/// connection fails.
async fn session<L: EngineLoader>(
    endpoint: &quinn::Endpoint,
    client: &mut Client<'_, L>,
) -> Result<(), JoinError> {
    let opts = client.opts;
    let failed = |e: quinn::ConnectionError| {
        if connection_lost(&e) {
            JoinError::Lost(format!("{}: {e}", opts.addr))
        } else {
            JoinError::Connect {
                addr: opts.addr.to_string(),
                reason: e.to_string(),
            }
        }
    };
    let connecting = endpoint
        .connect(opts.addr, &opts.server_name)
        .map_err(|e| JoinError::Connect {
            addr: opts.addr.to_string(),
            reason: e.to_string(),
        })?;
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| {
            JoinError::Lost(format!(
                "{}: no answer within {CONNECT_TIMEOUT:?}",
                opts.addr
            ))
        })?
        .map_err(failed)?;
    let (send, recv) = conn.open_bi().await.map_err(failed)?;
    let mut c = Conn { send, recv };
    let result = match work(&mut c, client).await {
        Ok(()) => Ok(()),
        Err(e) => match coordinator_close(&conn) {
            // The coordinator ends every connection with "run finished" once
            // the last lease is stored; a worker polling or measuring then
            // is done.
            Some(c)
                if c.error_code == quinn::VarInt::from_u32(0) && c.reason[..] == *RUN_FINISHED =>
            {
                tracing::info!("the coordinator finished the run");
                Ok(())
            }
            // Any other close of its own: say what the coordinator said (a
            // stopped one names its error).
            Some(c) if matches!(e, JoinError::Lost(_)) => Err(JoinError::Lost(format!(
                "{}: the coordinator closed the connection (code {}): {}",
                opts.addr,
                c.error_code,
                peer_text(&String::from_utf8_lossy(&c.reason))
            ))),
            _ => Err(e),
        },
    };
    let _ = c.send.finish();
    conn.close(0u32.into(), b"bye");
    result
}

/// The coordinator's own close of the connection (code and reason), when
/// it closed it.
fn coordinator_close(conn: &quinn::Connection) -> Option<quinn::ApplicationClose> {
    match conn.close_reason()? {
        quinn::ConnectionError::ApplicationClosed(c) => Some(c),
        _ => None,
    }
}

/// One session's protocol: join, then serve each phase the coordinator
/// welcomes this worker into, waiting between phases, until the run is
/// finished.
async fn work<L: EngineLoader>(c: &mut Conn, client: &mut Client<'_, L>) -> Result<(), JoinError> {
    let opts = client.opts;
    let nonce = match c
        .ask(&ToCoordinator::Hello {
            protocol_version: PROTOCOL_VERSION,
            worker_name: opts.name.clone(),
            backend: client.loader.backend(),
        })
        .await?
    {
        ToWorker::Challenge { nonce } => nonce,
        other => {
            return Err(JoinError::Protocol(format!(
                "expected Challenge, got {other:?}"
            )))
        }
    };
    let mac = join_proof(opts.key.expose(), &nonce, &opts.name);
    let mut reply = c.ask(&ToCoordinator::Proof { mac }).await?;
    loop {
        reply = match reply {
            ToWorker::Welcome {
                job,
                worker_id,
                task,
            } => {
                client.joined = true;
                match &task {
                    Task::Collect => {
                        tracing::info!(%worker_id, run = %job.run_url, "joined a collection")
                    }
                    Task::Evaluate(eval) => {
                        tracing::info!(%worker_id, run = %job.run_url, candidates = eval.candidates.len(), "joined an evaluation")
                    }
                    Task::Respond(_) => {
                        tracing::info!(%worker_id, run = %job.run_url, "joined a response phase")
                    }
                }
                serve_phase(c, client, *job, task).await?
            }
            ToWorker::Wait { .. } if stop::requested() => return Ok(()),
            // Joined between phases: the next one has not begun.
            ToWorker::Wait { retry_ms } => {
                if !client.joined {
                    tracing::info!("joined; waiting for the coordinator's next phase");
                }
                client.joined = true;
                tokio::time::sleep(Duration::from_millis(retry_ms)).await;
                c.poll(WorkerState::Idle).await?
            }
            ToWorker::Finished => return Ok(()),
            other => {
                return Err(JoinError::Protocol(format!(
                    "expected Welcome or Wait, got {other:?}"
                )))
            }
        };
    }
}

/// Serves one phase of the run (its `job` and `task`): loads the work
/// (unless the last phase's is the same), then computes leases until the
/// coordinator welcomes this worker into the next phase or says the run is
/// finished; returns that reply.
async fn serve_phase<L: EngineLoader>(
    c: &mut Conn,
    client: &mut Client<'_, L>,
    job: JobInfo,
    task: Task,
) -> Result<ToWorker, JoinError> {
    let (loader, loaded, summary) = (&client.loader, &mut client.loaded, &mut client.summary);
    let heartbeat = Duration::from_millis(job.heartbeat_ms.max(50));
    let run = RunStore::open(&job.run_url)?;
    if loaded
        .as_ref()
        .is_none_or(|l| (&l.job, &l.task) != (&job, &task))
    {
        // The last phase's engine goes before the next one loads.
        *loaded = None;
        let loading = work::load(loader.clone(), &job, &task, &run);
        let work = match polling_while(c, WorkerState::Loading, heartbeat, loading).await? {
            Ok(w) => w,
            Err(e) => return refuse(c, e).await,
        };
        *loaded = Some(Loaded {
            job: job.clone(),
            task,
            work,
        });
    }
    let work = &loaded.as_ref().expect("loaded above").work;
    if work.model_sha256 != job.model_sha256 {
        let err = JoinError::ModelMismatch {
            path: job.model_path.clone(),
            actual: work.model_sha256.clone(),
            expected: job.model_sha256.clone(),
        };
        return refuse(c, err).await;
    }
    // The response phase runs before the corpus exists.
    let corpus = match loaded.as_ref().map(|l| &l.task) {
        Some(Task::Respond(_)) => None,
        _ => Some(Corpus::open(&job).await?),
    };
    let lease = Leasing {
        work,
        corpus: corpus.as_ref(),
        run: &run,
        job: &job,
        heartbeat,
    };
    // Leases computed since the last checkpoint: lost with this session
    // (the coordinator gives them to others when the connection ends).
    let mut batch = Batch::default();
    loop {
        if stop::requested() {
            // What it holds ships first: the coordinator needs no redo.
            lease.ship(c, &mut batch, summary).await?;
            tracing::info!("stopped by a signal after its current lease");
            return Ok(ToWorker::Finished);
        }
        match c.poll(WorkerState::Idle).await? {
            ToWorker::Lease(grant) => {
                let Some((output, elapsed)) = lease.compute(c, &grant).await? else {
                    continue;
                };
                if let Err(reason) = batch.add(&grant, output, elapsed) {
                    lease.report_failed(c, &[grant.lease_id], reason).await?;
                } else if batch.due(&job.checkpoint) {
                    lease.ship(c, &mut batch, summary).await?;
                } else {
                    let computed = ToCoordinator::Computed {
                        lease_id: grant.lease_id,
                    };
                    expect_ack(c.ask(&computed).await?)?;
                }
            }
            // No lease for now: ship what is held first (the run may be
            // waiting for it).
            ToWorker::Wait { .. } if !batch.is_empty() => {
                lease.ship(c, &mut batch, summary).await?
            }
            ToWorker::Wait { retry_ms } => {
                tokio::time::sleep(Duration::from_millis(retry_ms)).await
            }
            // The phase is over (every lease of it stored, so nothing held
            // here is needed).
            next @ (ToWorker::Welcome { .. } | ToWorker::Finished) => return Ok(next),
            other => {
                return Err(JoinError::Protocol(format!(
                    "unexpected reply to a poll: {other:?}"
                )))
            }
        }
    }
}

/// The leases a worker computed since its last checkpoint, added into one
/// running result.
#[derive(Default)]
struct Batch {
    leases: Vec<LeaseGrant>,
    running: Option<work::Output>,
    /// When the first of them was computed.
    since: Option<Instant>,
    elapsed: Duration,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Adds a computed lease's result.
    fn add(
        &mut self,
        grant: &LeaseGrant,
        output: work::Output,
        elapsed: Duration,
    ) -> Result<(), String> {
        match &mut self.running {
            None => self.running = Some(output),
            Some(running) => running.merge(output)?,
        }
        self.leases.push(grant.clone());
        self.since.get_or_insert_with(Instant::now);
        self.elapsed += elapsed;
        Ok(())
    }

    /// Whether the checkpoint is due: `policy.leases` leases held, or the
    /// oldest held for `policy.seconds` or half its lease's deadline.
    fn due(&self, policy: &Checkpoint) -> bool {
        let Some(first) = self.leases.first() else {
            return false;
        };
        let seconds = Duration::from_secs(policy.seconds);
        let limit = seconds.min(Duration::from_millis(first.deadline_ms / 2));
        self.leases.len() >= policy.leases.max(1) as usize
            || self.since.is_some_and(|t| t.elapsed() >= limit)
    }
}

/// An `Ack`, or a protocol error.
fn expect_ack(reply: ToWorker) -> Result<(), JoinError> {
    match reply {
        ToWorker::Ack => Ok(()),
        other => Err(JoinError::Protocol(format!("expected Ack, got {other:?}"))),
    }
}

/// Tells the coordinator this worker refuses the job, and why.
async fn refuse<T>(c: &mut Conn, err: JoinError) -> Result<T, JoinError> {
    write_msg(
        &mut c.send,
        &ToCoordinator::Refuse {
            reason: err.to_string(),
        },
    )
    .await?;
    Err(err)
}

/// Runs `fut` while sending a poll saying `state` every `heartbeat`: a
/// `Loading` one keeps the connection through a slow model load, a `Busy`
/// one the lease through its work.
async fn polling_while<T>(
    c: &mut Conn,
    state: WorkerState,
    heartbeat: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, JoinError> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return Ok(r),
            _ = tokio::time::sleep(heartbeat) => {
                c.poll(state).await?;
            }
        }
    }
}

/// Runs `fut` while sending a `Busy` poll every `heartbeat`.
async fn heartbeating<T>(
    c: &mut Conn,
    lease: protocol::wire::LeaseId,
    heartbeat: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    polling_while(c, WorkerState::Busy(lease), heartbeat, fut)
        .await
        .map_err(|e| e.to_string())
}

/// The corpus index and chunk table, read once, and where its images are.
struct Corpus {
    index: Arc<CorpusIndex>,
    table: bytes::Bytes,
    url: String,
    store: RunStore,
}

impl Corpus {
    async fn open(job: &JobInfo) -> Result<Corpus, JoinError> {
        let store = RunStore::open(&job.corpus_url)?;
        let index = CorpusIndex::read(&store).await.map_err(|e| match e {
            FileError::Store(e) => e.into(),
            e => JoinError::Engine(e.to_string()),
        })?;
        let table = store.get(CHUNKS_FILE).await?;
        Ok(Corpus {
            index: Arc::new(index),
            table,
            url: store.url_of(CHUNKS_FILE),
            store,
        })
    }

    /// The chunks of a lease (a range outside the corpus is refused).
    fn chunks(&self, range: numbers::ChunkRange) -> Result<Vec<Chunk>, String> {
        self.index.check_range(range)?;
        read_chunks(self.table.clone(), Some(range)).map_err(|e| format!("{}: {e}", self.url))
    }

    /// The bytes of every image `chunks` carry, read from the corpus (the
    /// collector checks each against its hash).
    async fn images(&self, chunks: &[Chunk]) -> Result<crate::images::ImageBytes, String> {
        let mut out = crate::images::ImageBytes::new();
        for im in chunks.iter().flat_map(|c| &c.images) {
            if !out.contains_key(&im.sha256) {
                let name = runfiles::layout::corpus::image(&im.sha256);
                let bytes = self.store.get(&name).await.map_err(|e| e.to_string())?;
                out.insert(im.sha256.clone(), bytes);
            }
        }
        Ok(out)
    }
}

/// What every lease of a session is computed with.
struct Leasing<'a> {
    work: &'a work::Work,
    corpus: Option<&'a Corpus>,
    run: &'a RunStore,
    job: &'a JobInfo,
    heartbeat: Duration,
}

impl Leasing<'_> {
    /// Computes a lease's result, heartbeating all along (a slow model or a
    /// slow trace upload never looks like a silent worker), with the time
    /// it took; `None` when it failed (reported to the coordinator).
    async fn compute(
        &self,
        c: &mut Conn,
        lease: &LeaseGrant,
    ) -> Result<Option<(work::Output, Duration)>, JoinError> {
        let start = Instant::now();
        let produce = self.work.task.produce(work::LeaseInputs {
            corpus: self.corpus,
            run: self.run,
            range: lease.range,
        });
        let result = heartbeating(c, lease.lease_id, self.heartbeat, produce)
            .await
            .and_then(|r| r);
        match result {
            Ok(output) => {
                let what = self.work.labels.lease;
                let took = start.elapsed();
                tracing::info!(range = %lease.range, "{what} computed in {:.1} s", took.as_secs_f64());
                Ok(Some((output, took)))
            }
            Err(reason) => {
                let what = self.work.labels.lease;
                tracing::warn!(lease = %lease.lease_id, range = %lease.range, "{what} failed: {reason}");
                self.report_failed(c, &[lease.lease_id], reason).await?;
                Ok(None)
            }
        }
    }

    /// Reports leases this worker could not finish.
    async fn report_failed(
        &self,
        c: &mut Conn,
        leases: &[protocol::wire::LeaseId],
        reason: String,
    ) -> Result<(), JoinError> {
        for &lease_id in leases {
            let failed = ToCoordinator::Failed {
                lease_id,
                reason: reason.clone(),
            };
            expect_ack(c.ask(&failed).await?)?;
        }
        Ok(())
    }

    /// Encodes the batch's result and stages it when it is too large to
    /// travel inline.
    async fn stage(&self, running: &work::Output) -> Result<(PartialRef, String), String> {
        let bytes = running.encode();
        let sha256 = gguf::hash::sha256_hex(&bytes);
        let partial = if bytes.len() as u64 <= self.job.max_inline_bytes {
            PartialRef::Inline(bytes)
        } else {
            let name = runfiles::layout::staged(&sha256).expect("a SHA-256 in hex");
            self.run
                .put(&name, bytes)
                .await
                .map_err(|e| e.to_string())?;
            PartialRef::Stored(name)
        };
        Ok((partial, sha256))
    }

    /// Ships the batch's running result (a checkpoint): `Done` for one
    /// lease, `Checkpoint` naming every lease for more, heartbeating while
    /// it is encoded and uploaded. The batch is empty afterwards.
    async fn ship(
        &self,
        c: &mut Conn,
        batch: &mut Batch,
        summary: &mut JoinSummary,
    ) -> Result<(), JoinError> {
        let b = std::mem::take(batch);
        let (Some(running), Some(first)) = (b.running, b.leases.first()) else {
            return Ok(());
        };
        let ids: Vec<protocol::wire::LeaseId> = b.leases.iter().map(|l| l.lease_id).collect();
        let staged = heartbeating(c, first.lease_id, self.heartbeat, self.stage(&running))
            .await
            .and_then(|r| r);
        let (partial, sha256) = match staged {
            Ok(ok) => ok,
            Err(reason) => {
                tracing::warn!(leases = ids.len(), "storing a result failed: {reason}");
                return self.report_failed(c, &ids, reason).await;
            }
        };
        let elapsed_ms = b.elapsed.as_millis() as u64;
        let msg = match ids.as_slice() {
            [lease_id] => ToCoordinator::Done {
                lease_id: *lease_id,
                partial,
                sha256,
                elapsed_ms,
            },
            _ => ToCoordinator::Checkpoint {
                leases: ids,
                partial,
                sha256,
                elapsed_ms,
            },
        };
        expect_ack(c.ask(&msg).await?)?;
        summary.leases += b.leases.len() as u64;
        summary.chunks += b
            .leases
            .iter()
            .map(|l| u64::from(l.range.len()))
            .sum::<u64>();
        tracing::info!(
            "shipped {} leases' result; {} leases ({} chunks) done by this worker",
            b.leases.len(),
            summary.leases,
            summary.chunks
        );
        Ok(())
    }
}
