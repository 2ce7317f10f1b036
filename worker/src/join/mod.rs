//! `worker join`: connect to a coordinator over QUIC, prove the join secret,
//! then measure leases until the run needs nothing more.
//!
//! - [`tls`]: how the coordinator's certificate is trusted (pin or CA).
//! - [`engine`]: the measuring engine on its own thread; [`fake`] a
//!   deterministic stand-in for tests.
//! - [`join`] runs the protocol of [`common::wire`] with any engine.

pub mod engine;
pub mod fake;
pub mod tls;

use common::corpus::{read_chunks, CorpusIndex, CHUNKS_FILE, INDEX_FILE};
use common::store::RunStore;
use common::wire::{
    join_proof, parse_pin, read_msg, staged_partial_name, write_msg, JobInfo, LeaseGrant,
    PartialRef, Refusal, ToCoordinator, ToWorker, WireError, WorkerState, MAX_CONTROL_FRAME,
    PROTOCOL_VERSION,
};
use engine::{EngineLoader, EngineThread};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls::Trust;

/// Environment variable holding the join secret when no file is given.
pub const SECRET_ENV: &str = "MOE_CENSUS_JOIN_SECRET";

/// Arguments of `worker join`.
#[derive(clap::Args, Debug, Clone)]
pub struct JoinArgs {
    /// Coordinator address, `HOST:PORT`.
    #[arg(long)]
    pub coordinator: String,
    /// SHA-256 fingerprint of the coordinator's certificate (hex, colons allowed).
    #[arg(long, conflicts_with = "ca", required_unless_present = "ca")]
    pub pin: Option<String>,
    /// Cluster CA certificate (PEM) that signed the coordinator's certificate.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Name to check in the coordinator's certificate (default: the host of --coordinator).
    #[arg(long)]
    pub server_name: Option<String>,
    /// File holding the join secret (default: the MOE_CENSUS_JOIN_SECRET variable).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// This worker's name in logs and progress (default: host name and process id).
    #[arg(long)]
    pub name: Option<String>,
    /// GGUF model file (default: the path the coordinator sends).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Layers offloaded to the GPU (`-ngl`).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<u32>,
}

/// Why joining or working failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Flags or secret are unusable.
    #[error("{0}")]
    Setup(String),
    /// The QUIC/TLS connection failed (including a certificate that does not match).
    #[error("cannot connect to the coordinator at {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
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
    Store(#[from] common::store::StoreError),
    /// The stream broke or carried something unexpected.
    #[error("protocol: {0}")]
    Protocol(String),
}

impl From<WireError> for JoinError {
    fn from(e: WireError) -> JoinError {
        JoinError::Protocol(e.to_string())
    }
}

/// What a worker did before it left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinSummary {
    /// Leases finished and reported.
    pub leases: u64,
    /// Chunks measured.
    pub chunks: u64,
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
    /// The join secret.
    pub secret: Vec<u8>,
    /// This worker's name.
    pub name: String,
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
        let secret = match &args.secret_file {
            Some(path) => std::fs::read(path)
                .map_err(|e| JoinError::Setup(format!("--secret-file {}: {e}", path.display())))?
                .trim_ascii()
                .to_vec(),
            None => std::env::var(SECRET_ENV)
                .map_err(|_| {
                    JoinError::Setup(format!(
                        "no join secret: give --secret-file or set {SECRET_ENV}"
                    ))
                })?
                .into_bytes(),
        };
        let name = args
            .name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
        Ok(ClientOptions {
            addr,
            server_name,
            trust,
            secret,
            name,
        })
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".into())
}

/// Entry point of `worker join` with the real engine.
pub fn run(args: JoinArgs) -> Result<JoinSummary, JoinError> {
    let opts = ClientOptions::from_args(&args)?;
    let loader = engine::CollectorLoader {
        model: args.model.clone(),
        n_gpu_layers: args.n_gpu_layers,
        threads: args.threads,
    };
    let rt = tokio::runtime::Runtime::new().map_err(|e| JoinError::Setup(e.to_string()))?;
    let summary = rt.block_on(join(&opts, loader))?;
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
            None => Err(JoinError::Protocol(
                "the coordinator closed the stream".into(),
            )),
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

/// Joins the coordinator at `opts.addr` and works until it says the run is
/// finished. Nothing about the job is received before the proof.
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
    let conn = endpoint
        .connect(opts.addr, &opts.server_name)
        .map_err(|e| connect_err(e.to_string()))?
        .await
        .map_err(|e| connect_err(e.to_string()))?;
    let (send, recv) = conn
        .open_bi()
        .await
        .map_err(|e| connect_err(e.to_string()))?;
    let mut c = Conn { send, recv };
    let mut summary = JoinSummary::default();
    let result = match work(&mut c, opts, loader, &mut summary).await {
        Ok(()) => Ok(summary),
        // The coordinator ends every connection with "run finished" once the
        // last lease is merged; a worker polling or measuring then is done.
        Err(_) if finished_by_coordinator(&conn) => {
            tracing::info!("the coordinator finished the run");
            Ok(summary)
        }
        Err(e) => Err(e),
    };
    let _ = c.send.finish();
    conn.close(0u32.into(), b"bye");
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    result
}

/// Whether the coordinator closed the connection because the run finished.
fn finished_by_coordinator(conn: &quinn::Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(quinn::ConnectionError::ApplicationClosed(c))
            if c.error_code == quinn::VarInt::from_u32(0) && &c.reason[..] == b"run finished"
    )
}

async fn work<L: EngineLoader>(
    c: &mut Conn,
    opts: &ClientOptions,
    loader: L,
    summary: &mut JoinSummary,
) -> Result<(), JoinError> {
    let nonce = match c
        .ask(&ToCoordinator::Hello {
            protocol_version: PROTOCOL_VERSION,
            worker_name: opts.name.clone(),
            backend: loader.backend(),
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
    let mac = join_proof(&opts.secret, &nonce, &opts.name);
    let job = match c.ask(&ToCoordinator::Proof { mac }).await? {
        ToWorker::Welcome { job, worker_id } => {
            tracing::info!(%worker_id, run = %job.run_url, "joined");
            job
        }
        other => {
            return Err(JoinError::Protocol(format!(
                "expected Welcome, got {other:?}"
            )))
        }
    };
    let heartbeat = Duration::from_millis(job.heartbeat_ms.max(50));
    let engine = load_engine(c, loader, &job, heartbeat).await?;
    if engine.model_sha256 != job.model_sha256 {
        let err = JoinError::ModelMismatch {
            path: job.model_path.clone(),
            actual: engine.model_sha256.clone(),
            expected: job.model_sha256.clone(),
        };
        write_msg(
            &mut c.send,
            &ToCoordinator::Refuse {
                reason: err.to_string(),
            },
        )
        .await?;
        return Err(err);
    }
    let corpus = Corpus::open(&job).await?;
    let run = RunStore::open(&job.run_url)?;
    loop {
        match c.poll(WorkerState::Idle).await? {
            ToWorker::Lease(lease) => {
                let done =
                    measure_lease(c, &engine, &corpus, &run, &job, &lease, heartbeat).await?;
                summary.leases += u64::from(done);
                summary.chunks += u64::from(lease.range.len()) * u64::from(done);
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

/// Loads the engine while heartbeating, so a slow model load keeps the connection.
async fn load_engine<L: EngineLoader>(
    c: &mut Conn,
    loader: L,
    job: &JobInfo,
    heartbeat: Duration,
) -> Result<EngineThread, JoinError> {
    let loading = EngineThread::start(loader, job);
    tokio::pin!(loading);
    loop {
        tokio::select! {
            r = &mut loading => return r.map_err(JoinError::Engine),
            _ = tokio::time::sleep(heartbeat) => {
                c.poll(WorkerState::Loading).await?;
            }
        }
    }
}

/// The corpus index and chunk table, read once.
struct Corpus {
    index: Arc<CorpusIndex>,
    table: bytes::Bytes,
    url: String,
}

impl Corpus {
    async fn open(job: &JobInfo) -> Result<Corpus, JoinError> {
        let store = RunStore::open(&job.corpus_url)?;
        let index_bytes = store.get(INDEX_FILE).await?;
        let index: CorpusIndex = serde_json::from_slice(&index_bytes).map_err(|e| {
            JoinError::Engine(format!(
                "{} is not a corpus index: {e}",
                store.url_of(INDEX_FILE)
            ))
        })?;
        let table = store.get(CHUNKS_FILE).await?;
        Ok(Corpus {
            index: Arc::new(index),
            table,
            url: store.url_of(CHUNKS_FILE),
        })
    }
}

/// Measures one lease while heartbeating; reports the result (or the
/// failure). Returns whether a result was sent.
async fn measure_lease(
    c: &mut Conn,
    engine: &EngineThread,
    corpus: &Corpus,
    run: &RunStore,
    job: &JobInfo,
    lease: &LeaseGrant,
    heartbeat: Duration,
) -> Result<bool, JoinError> {
    let start = Instant::now();
    let result = async {
        corpus.index.check_range(lease.range)?;
        let chunks = read_chunks(corpus.table.clone(), Some(lease.range))
            .map_err(|e| format!("{}: {e}", corpus.url))?;
        let rx = engine.submit(corpus.index.clone(), chunks).await?;
        tokio::pin!(rx);
        let (mut partial, rows) = loop {
            tokio::select! {
                r = &mut rx => break r.map_err(|_| "the engine thread died".to_string())??,
                _ = tokio::time::sleep(heartbeat) => {
                    c.poll(WorkerState::Busy(lease.lease_id)).await.map_err(|e| e.to_string())?;
                }
            }
        };
        if !rows.is_empty() {
            let (k, n) = engine.trace_shape;
            let name = crate::collect::trace_part_name(lease.range, false);
            let name = crate::collect::write_trace_part(run, name, rows, k, n)
                .await
                .map_err(|e| e.to_string())?;
            partial.trace_parts = vec![name];
        }
        let bytes = partial.to_bytes();
        let sha256 = common::hash::sha256_hex(&bytes);
        let partial = if bytes.len() as u64 <= job.max_inline_bytes {
            PartialRef::Inline(bytes)
        } else {
            let name = staged_partial_name(&sha256).expect("a SHA-256 in hex");
            run.put(&name, bytes).await.map_err(|e| e.to_string())?;
            PartialRef::Stored(name)
        };
        Ok::<_, String>((partial, sha256))
    }
    .await;
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let (msg, sent) = match result {
        Ok((partial, sha256)) => (
            ToCoordinator::Done {
                lease_id: lease.lease_id,
                partial,
                sha256,
                elapsed_ms,
            },
            true,
        ),
        Err(reason) => {
            tracing::warn!(lease = %lease.lease_id, range = %lease.range, "lease failed: {reason}");
            (
                ToCoordinator::Failed {
                    lease_id: lease.lease_id,
                    reason,
                },
                false,
            )
        }
    };
    match c.ask(&msg).await? {
        ToWorker::Ack => Ok(sent),
        other => Err(JoinError::Protocol(format!("expected Ack, got {other:?}"))),
    }
}
