//! The coordinator-worker protocol: messages, framing and the join proof.
//!
//! Every message is one frame: a 4-byte big-endian length, then the message
//! encoded with bincode 2 (serde, standard config). A frame longer than the
//! reader's limit is refused before its body is read.
//!
//! The exchange on the single bidirectional stream of a connection, worker
//! first, one reply per request:
//!
//! ```text
//! worker                                  coordinator
//! Hello{version, name, backend}     ->
//!                                   <-    Challenge{nonce}
//! Proof{hmac(key(name), nonce, name)} ->
//!                                   <-    Welcome{job, task} | Wait (only after a valid proof)
//! Poll{version, busy}               ->                       (the poll is the heartbeat)
//!                                   <-    Lease | Wait | Ack | Welcome | Finished
//! Computed{lease}                   ->                       (folded into the worker's running result)
//!                                   <-    Ack
//! Done{lease, result, sha256}       ->                       (a partial or an eval partial, by task)
//!                                   <-    Ack
//! Checkpoint{leases, result, sha256} ->                      (one result covering several computed leases)
//!                                   <-    Ack
//! ```
//!
//! A worker adds the leases it computes into one running result (the merge
//! is exact, so the grouping changes no bit) and ships it at checkpoints
//! ([`Checkpoint`]): `Computed` tells the coordinator a lease is computed
//! and held for the next checkpoint, which then names every lease it
//! covers. Until that result is accepted the leases are not done; a worker
//! lost before its checkpoint loses them to the queue.
//!
//! One connection serves every phase of a run (collection, evaluation,
//! shipping's evaluation), each with its own job and task: the proof is
//! answered with the current phase's `Welcome`, or `Wait` between phases;
//! an idle worker's poll is answered with the next phase's `Welcome` once
//! its phase is over, `Wait` until that phase begins, and `Finished` when
//! the run is (the coordinator also closes the connection saying
//! [`RUN_FINISHED`]).
//!
//! A worker learns nothing about the job (run location, corpus, model hash)
//! before its proof checks out. The proof is keyed by the worker's own key
//! ([`worker_key`]: the join secret's HMAC over the worker's name), so an
//! operator can hand a worker that key alone: it proves that one name and
//! no other, and the coordinator counts failures, quarantine and
//! redundancy by that name across reconnects.

use numbers::split::ChunkRange;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;
#[cfg(feature = "io")]
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Version of this protocol; both sides must speak the same one.
///
/// 4: the join proof is keyed by the worker's key ([`worker_key`]), not by
/// the join secret itself.
/// 5: worker-side aggregation ([`Checkpoint`] in the job, the `Computed`
/// and `Checkpoint` messages).
/// 6: an [`EvalCandidate`] is a recipe (keep map or every expert, experts
/// per token, quantisation), so shipped files are evaluated like slices.
/// 7: the job names the model's mmproj ([`MmprojFile`]) when the corpus
/// has images, which workers measure.
/// 8: one connection serves every phase of a run: `Wait` may answer the
/// proof, and `Welcome` an idle poll (the next phase's job and task).
/// 9: an eval job carries `models_in_memory` and `scratch_dir`.
/// 10: an eval job carries the generation check's prompts.
/// 11: the job's options carry the lookahead distances (`trace_lookahead`)
/// and decode traces (`decode_tokens`, `decode_prompt`).
/// 12: a third task, [`Task::Respond`] (the response phase), appended.
/// 13: the generation check's prompts carry their tokens (read across the
/// chunks of their document) and the noise floor's micro-batch.
/// 14: the job's options carry `merge_projection` (projected expert
/// outputs for merge plans).
pub const PROTOCOL_VERSION: u32 = 14;

/// ALPN token of the protocol, so a stray QUIC client is refused in the handshake.
pub const ALPN: &[u8] = b"moe-census/1";

/// Limit on frames a coordinator sends (they are small).
pub const MAX_CONTROL_FRAME: u32 = 1 << 20;

/// Limit on frames a worker sends before it has proven the join secret
/// (`Hello`, `Proof`): a few KiB, so an unauthenticated peer cannot make the
/// coordinator buffer megabytes.
pub const PRE_AUTH_MAX_FRAME: u32 = 4 << 10;

/// Bytes of the coordinator's challenge nonce.
pub const NONCE_LEN: usize = 32;

/// The reason (with code 0) a coordinator closes every connection with once
/// the run is finished: a worker that reads it leaves instead of
/// reconnecting. Any other close means the coordinator was lost or stopped.
pub const RUN_FINISHED: &[u8] = b"run finished";

/// Domain-separation label of the join proof.
const PROOF_LABEL: &[u8] = b"moe-census join proof v1\0";

/// Domain-separation label of a worker's key.
const WORKER_KEY_LABEL: &[u8] = b"moe-census worker key v1\0";

/// A lease id, unique within one coordinator process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

/// A worker id, assigned by the coordinator at registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease#{}", self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker#{}", self.0)
    }
}

/// Everything a worker needs to measure chunks of this run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The run's location (object-store URL); trace parts and large partials go here.
    pub run_url: String,
    /// The tokenized corpus location (holds `index.json` and `chunks.parquet`).
    pub corpus_url: String,
    /// SHA-256 of the model file; a worker with another model refuses to work.
    pub model_sha256: String,
    /// Model path as the coordinator knows it (local workers use it as is).
    pub model_path: String,
    /// The model's mmproj, when the corpus has images to measure.
    pub mmproj: Option<MmprojFile>,
    /// How chunks are evaluated.
    pub options: JobOptions,
    /// Partials up to this many bytes travel inline; larger ones are stored.
    pub max_inline_bytes: u64,
    /// The worker sends a poll at least this often while it holds a lease.
    pub heartbeat_ms: u64,
    /// When the worker ships the result of the leases it computed.
    pub checkpoint: Checkpoint,
}

/// The `mmproj` GGUF (vision encoder and projector) a run's images were
/// tokenized with, which workers load beside the model to measure them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmprojFile {
    /// Path as the coordinator knows it (local workers use it as is).
    pub path: String,
    /// SHA-256 of the file; a worker with another mmproj refuses the job.
    pub sha256: String,
}

/// When a worker ships its running result (the exact sum of the leases it
/// computed since the last one): after `leases` leases, once the oldest of
/// them is `seconds` old (or half its lease's deadline, whichever comes
/// first), and whenever the coordinator has no lease for it. `leases = 1`
/// ships every lease alone, as a run with redundancy does (so a worker
/// cannot tell a checked lease from another).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Leases per shipped result (at least 1).
    pub leases: u32,
    /// Seconds after which held leases are shipped.
    pub seconds: u64,
}

/// Evaluation settings every worker of a run must share, so each chunk is
/// evaluated identically wherever it runs (the context size is the corpus's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOptions {
    /// Tokens per micro-batch.
    pub n_ubatch: u32,
    /// Which chunks are traced, per split.
    pub trace_every: TraceStrides,
    /// Router top-N kept in trace rows.
    pub trace_top_n: u32,
    /// Lookahead distances traced (layer `L + d`'s router on layer `L`'s
    /// residual stream); empty: none.
    pub trace_lookahead: Vec<u8>,
    /// Decode traces: tokens generated greedily from each held-out span's
    /// prompt in a chunk whose held-out tokens are traced (0: none).
    pub decode_tokens: u32,
    /// Decode traces: prompt tokens taken from the start of each held-out span.
    pub decode_prompt: u32,
    /// f32 KV cache instead of f16.
    pub f32_kv: bool,
    /// Flash attention.
    pub flash_attn: bool,
    /// Dimensions each routed expert output is projected to (partial
    /// format 9's projected outputs); 0: off.
    pub merge_projection: u32,
}

/// What a worker computes for each lease of a run: measure the chunks
/// (a [`numbers::partial::Partial`]), or evaluate pruned candidates against
/// the base model on them (a [`numbers::eval::EvalPartial`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Task {
    /// Collection: routing statistics, importance matrix, trace rows.
    Collect,
    /// Evaluation of the job's candidates.
    Evaluate(EvalJob),
    /// The response phase: generate responses to the job's prompts (a
    /// lease's range names prompts, not chunks).
    Respond(RespondJob),
}

/// A response job: the prompts the base model answers, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RespondJob {
    /// Object name of the prompt file under the run
    /// (`corpus/responses/prompts.json`).
    pub prompts: String,
    /// SHA-256 of its bytes; a worker that reads other bytes refuses.
    pub prompts_sha256: String,
    /// Sampling and lengths.
    pub sampling: Sampling,
}

/// How responses are sampled. Floats travel as their bits, so the job
/// compares exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sampling {
    /// Most tokens per response.
    pub max_tokens: u32,
    /// Responses per prompt.
    pub n: u32,
    /// The run's sampling seed.
    pub seed: u64,
    /// Temperature (`f64::to_bits`); 0 is greedy.
    pub temperature_bits: u64,
    /// Nucleus mass (`f64::to_bits`).
    pub top_p_bits: u64,
}

impl Sampling {
    /// The temperature.
    pub fn temperature(&self) -> f64 {
        f64::from_bits(self.temperature_bits)
    }

    /// The nucleus mass.
    pub fn top_p(&self) -> f64 {
        f64::from_bits(self.top_p_bits)
    }
}

/// An evaluation job (DESIGN section 12): besides the [`JobInfo`] of the
/// base model, the pruned candidates each worker slices locally from its
/// base file and compares with it, and which positions are scored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalJob {
    /// The candidates, in result order.
    pub candidates: Vec<EvalCandidate>,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
    /// Splits whose positions are scored.
    pub splits: Vec<numbers::split::Split>,
    /// Models a worker holds in memory at once (`[eval] models_in_memory`;
    /// a worker's `--models-in-memory` overrides it).
    pub models_in_memory: numbers::eval::ModelsInMemory,
    /// Where a worker writes sliced candidates and a lease's base logits
    /// (`[eval] scratch_dir`, a path on each worker's machine; `None`: its
    /// `$TMPDIR`; a worker's `--scratch-dir` overrides it).
    pub scratch_dir: Option<String>,
    /// The generation check's prompts and lengths (none: no check).
    pub generate: numbers::eval::GenerateJob,
}

/// A candidate of an [`EvalJob`]: how a worker makes it from its base
/// file, in this order: sliced to a keep map (or every expert kept), the
/// experts routed per token set, quantised by llama.cpp with the run's
/// importance matrix (sliced to the same keep map). Every step is
/// deterministic, so every worker makes the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalCandidate {
    /// Its name in results: `<method>_K<k>`, or a shipped file's stem.
    pub name: String,
    /// Object name of its keep map under the run (`keep_maps/<name>.json`);
    /// `None`: every expert is kept.
    pub keep_map: Option<String>,
    /// SHA-256 of the candidate GGUF as the coordinator made it; a worker
    /// whose file differs refuses the job, and the coordinator refuses any
    /// result that names another hash.
    pub sha256: String,
    /// Experts routed per token (`{arch}.expert_used_count`), when the
    /// candidate lowers it; `None`: the base model's.
    pub expert_used: Option<u32>,
    /// Quantisation type, when the candidate is quantised (with the run's
    /// `imatrix.gguf` sliced to the keep map).
    pub quant: Option<gguf::quant::QuantType>,
}

/// Trace strides per split: the fit tokens of every `fit`-th chunk and the
/// held-out tokens of every `heldout`-th chunk are traced (0: none of that
/// split), so each split gets its own share of the trace budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStrides {
    /// Stride for fit tokens.
    pub fit: u32,
    /// Stride for held-out tokens.
    pub heldout: u32,
}

impl TraceStrides {
    /// The same stride for both splits.
    pub fn both(every: u32) -> TraceStrides {
        TraceStrides {
            fit: every,
            heldout: every,
        }
    }
}

/// What a worker is doing, sent with every poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    /// Loading the model: a heartbeat only.
    Loading,
    /// Ready: asks for a lease.
    Idle,
    /// Measuring a lease: a heartbeat only.
    Busy(LeaseId),
}

/// A lease: chunks to measure before a deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// Id to quote in heartbeats and the result.
    pub lease_id: LeaseId,
    /// Chunks to measure.
    pub range: ChunkRange,
    /// Milliseconds from the grant after which the lease may go to another worker.
    pub deadline_ms: u64,
}

/// Where a finished lease's partial is.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartialRef {
    /// The encoded partial itself.
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Object name relative to the run, written by the worker.
    Stored(String),
}

impl fmt::Debug for PartialRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartialRef::Inline(b) => write!(f, "Inline({} bytes)", b.len()),
            PartialRef::Stored(name) => write!(f, "Stored({name:?})"),
        }
    }
}

/// Messages a worker sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// First message of a connection.
    Hello {
        /// [`PROTOCOL_VERSION`] of the worker.
        protocol_version: u32,
        /// A human-readable name (host, rank).
        worker_name: String,
        /// Compute backend (`cpu`, `cuda:NVIDIA H200`, ...).
        backend: String,
    },
    /// Answer to the challenge: see [`join_proof`].
    Proof {
        /// HMAC-SHA256 tag.
        #[serde(with = "serde_bytes")]
        mac: Vec<u8>,
    },
    /// Asks for work when idle; a heartbeat otherwise.
    Poll {
        /// [`PROTOCOL_VERSION`], checked on every heartbeat.
        protocol_version: u32,
        /// What the worker is doing.
        state: WorkerState,
    },
    /// A lease is finished: the result of the run's [`Task`].
    Done {
        /// The lease.
        lease_id: LeaseId,
        /// The encoded result of its chunks (staged when large).
        partial: PartialRef,
        /// SHA-256 of the encoded result (hex).
        sha256: String,
        /// Wall time the worker spent, for throughput figures.
        elapsed_ms: u64,
    },
    /// The worker could not finish a lease (the chunks go back to the queue).
    Failed {
        /// The lease.
        lease_id: LeaseId,
        /// Why.
        reason: String,
    },
    /// The worker refuses the job (for example its model hash differs) and leaves.
    Refuse {
        /// Why.
        reason: String,
    },
    /// A lease is computed and added to the worker's running result; it is
    /// shipped with the next [`ToCoordinator::Checkpoint`] (or `Done`).
    Computed {
        /// The lease.
        lease_id: LeaseId,
    },
    /// The running result of several computed leases: its chunks are
    /// exactly theirs.
    Checkpoint {
        /// The leases it covers, each once.
        #[serde(with = "lease_list")]
        leases: Vec<LeaseId>,
        /// The encoded result (staged when large).
        partial: PartialRef,
        /// SHA-256 of the encoded result (hex).
        sha256: String,
        /// Wall time the worker spent on these leases.
        elapsed_ms: u64,
    },
}

/// A list of lease ids on the wire as one byte string of little-endian
/// `u64`s: its length is claimed in bytes, which the decoder's limit bounds
/// before allocating, where a sequence's claimed element count would let a
/// few bytes reserve a megabyte.
mod lease_list {
    use super::LeaseId;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ids: &[LeaseId], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.0.to_le_bytes()).collect();
        serde_bytes::serialize(&bytes, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LeaseId>, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?;
        if bytes.len() % 8 != 0 {
            return Err(D::Error::custom(format!(
                "a lease list of {} bytes is not a whole number of 8-byte ids",
                bytes.len()
            )));
        }
        Ok(bytes
            .chunks_exact(8)
            .map(|c| LeaseId(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
            .collect())
    }
}

impl ToCoordinator {
    /// The message's name, for errors and logs that must not echo peer data.
    pub fn kind(&self) -> &'static str {
        match self {
            ToCoordinator::Hello { .. } => "Hello",
            ToCoordinator::Proof { .. } => "Proof",
            ToCoordinator::Poll { .. } => "Poll",
            ToCoordinator::Done { .. } => "Done",
            ToCoordinator::Computed { .. } => "Computed",
            ToCoordinator::Checkpoint { .. } => "Checkpoint",
            ToCoordinator::Failed { .. } => "Failed",
            ToCoordinator::Refuse { .. } => "Refuse",
        }
    }
}

/// Messages the coordinator sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Answer to `Hello`: prove the join secret over this nonce.
    Challenge {
        /// Random bytes, fresh per connection.
        #[serde(with = "serde_bytes")]
        nonce: Vec<u8>,
    },
    /// The proof holds, or the worker's phase is over: the current
    /// phase's job, and what each lease asks for.
    Welcome {
        /// Id assigned to this worker.
        worker_id: WorkerId,
        /// The run, corpus, model and how chunks are evaluated (boxed: it
        /// is large beside the other messages).
        job: Box<JobInfo>,
        /// What the worker computes for each lease.
        task: Task,
    },
    /// Measure these chunks.
    Lease(LeaseGrant),
    /// No work right now (or no phase being served); poll again after
    /// this long.
    Wait {
        /// Milliseconds to wait.
        retry_ms: u64,
    },
    /// Heartbeat or result received.
    Ack,
    /// The run is finished: no phase is to come; disconnect.
    Finished,
    /// The coordinator refuses; the connection closes after this.
    Refused(Refusal),
}

/// Why the coordinator refused a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// Protocol versions differ.
    #[error("protocol version {worker} is not the coordinator's {coordinator}")]
    Version {
        /// The worker's version.
        worker: u32,
        /// The coordinator's version.
        coordinator: u32,
    },
    /// The join proof did not check out.
    #[error("join secret refused")]
    BadProof,
    /// The message was not expected at this point of the exchange.
    #[error("unexpected message: {0}")]
    Unexpected(String),
    /// The run failed; no more work.
    #[error("run failed: {0}")]
    RunFailed(String),
    /// This worker failed too often and is kept out of the run.
    #[error("quarantined for this run: {0}")]
    Quarantined(String),
}

/// Errors of framing and decoding.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A frame announced more bytes than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The frame body is not a valid message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Reading or writing the stream failed.
    #[error("stream: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent nothing for too long.
    #[error("silent for {0:?}")]
    Silent(Duration),
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes a message into one frame (length prefix included).
pub fn encode_frame<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(msg, &mut out, config())
        .expect("writing to a Vec cannot fail");
    let len = u32::try_from(out.len() - 4).expect("messages are under 4 GiB");
    out[..4].copy_from_slice(&len.to_be_bytes());
    out
}

fn decode_within<T: DeserializeOwned, const LIMIT: usize>(
    body: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::serde::decode_from_slice(body, config().with_limit::<LIMIT>())
}

/// Room over a body's length for bincode's claims: it counts each integer
/// at its in-memory size (8 bytes for a `u64`) though varints take fewer.
/// The messages here hold a handful of integers, so a few hundred bytes do.
const CLAIM_SLACK: usize = 256;

/// Decodes a frame body; trailing bytes are malformed too. Whatever lengths
/// the body claims, decoding allocates at most the body's length plus
/// [`CLAIM_SLACK`], rounded up to the next limit tier (at most twice that):
/// bincode allocates a claimed `Vec<u8>` before reading it, so the limit
/// must follow the body, not the largest frame. Frames before login hold
/// few integers, so this is tighter than [`numbers::bounded`]'s general 16
/// claimed bytes per input byte, which would let a 4 KiB pre-login frame
/// allocate 64 KiB.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    decode_claiming(body, body.len() + CLAIM_SLACK)
}

/// [`decode`] for a frame of a peer past login (a worker reading its pinned
/// coordinator's jobs), which may hold long lists of small integers:
/// bincode counts each at its in-memory size (4 for an `i32` token id of
/// one varint byte, 8 for a `u64`, 16 at most), so the limit is
/// [`numbers::bounded`]'s 16 claimed bytes per byte plus the slack, 16 MiB
/// for a [`MAX_CONTROL_FRAME`].
pub fn decode_after_login<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    decode_claiming(body, 16 * body.len() + CLAIM_SLACK)
}

/// Decodes `body` with bincode counting at most `claims` bytes (rounded up
/// to the next limit tier).
fn decode_claiming<T: DeserializeOwned>(body: &[u8], claims: usize) -> Result<T, WireError> {
    let decoded = match claims {
        0..=0x1000 => decode_within::<T, 0x1000>(body),
        0x1001..=0x2000 => decode_within::<T, 0x2000>(body),
        0x2001..=0x4000 => decode_within::<T, 0x4000>(body),
        0x4001..=0x1_0000 => decode_within::<T, 0x1_0000>(body),
        0x1_0001..=0x10_0000 => decode_within::<T, 0x10_0000>(body),
        0x10_0001..=0x100_0000 => decode_within::<T, 0x100_0000>(body),
        0x100_0001..=0x1000_0000 => decode_within::<T, 0x1000_0000>(body),
        _ => decode_within::<T, { 1 << 31 }>(body),
    };
    let (msg, used) = decoded.map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes after the message",
            body.len() - used
        )));
    }
    Ok(msg)
}

/// Writes one message as a frame.
#[cfg(feature = "io")]
pub async fn write_msg<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), WireError> {
    w.write_all(&encode_frame(msg)).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame of at most `max` bytes and decodes it. `Ok(None)` at a
/// clean end of stream before a frame starts.
#[cfg(feature = "io")]
pub async fn read_msg<R: AsyncRead + Unpin, T: DeserializeOwned>(
    r: &mut R,
    max: u32,
) -> Result<Option<T>, WireError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await?;
    match max <= PRE_AUTH_MAX_FRAME {
        true => decode(&body).map(Some),
        false => decode_after_login(&body).map(Some),
    }
}

/// The key of the worker named `worker_name`: HMAC-SHA256 of the join
/// secret over a label and the name. Whoever holds it can prove that name
/// only; whoever holds the join secret can make the key of any name.
pub fn worker_key(secret: &[u8], worker_name: &str) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let mut m = Vec::with_capacity(WORKER_KEY_LABEL.len() + worker_name.len());
    m.extend_from_slice(WORKER_KEY_LABEL);
    m.extend_from_slice(worker_name.as_bytes());
    ring::hmac::sign(&key, &m).as_ref().to_vec()
}

/// The join proof: HMAC-SHA256 keyed by the worker's key ([`worker_key`])
/// over a label, the coordinator's nonce and the worker's name.
pub fn join_proof(worker_key: &[u8], nonce: &[u8], worker_name: &str) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, worker_key);
    ring::hmac::sign(&key, &proof_message(nonce, worker_name))
        .as_ref()
        .to_vec()
}

/// Checks, in constant time, a join proof for `worker_name` against the
/// key the join `secret` makes for that name.
pub fn check_proof(secret: &[u8], nonce: &[u8], worker_name: &str, mac: &[u8]) -> bool {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &worker_key(secret, worker_name));
    ring::hmac::verify(&key, &proof_message(nonce, worker_name), mac).is_ok()
}

fn proof_message(nonce: &[u8], worker_name: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(PROOF_LABEL.len() + nonce.len() + 8 + worker_name.len());
    m.extend_from_slice(PROOF_LABEL);
    m.extend_from_slice(&(nonce.len() as u32).to_be_bytes());
    m.extend_from_slice(nonce);
    m.extend_from_slice(worker_name.as_bytes());
    m
}

/// Fresh random bytes from the system generator.
pub fn random_bytes(n: usize) -> Vec<u8> {
    use ring::rand::SecureRandom;
    let mut out = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the system random generator works");
    out
}

/// Normalises a certificate pin as users write it (`AB:CD:...`, `sha256:abcd...`)
/// to lower-case hex; `None` if it is not 32 bytes of hex.
pub fn parse_pin(pin: &str) -> Option<String> {
    let hexits: String = pin
        .trim()
        .trim_start_matches("sha256:")
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    (hexits.len() == 64 && hexits.chars().all(|c| c.is_ascii_hexdigit())).then_some(hexits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_frames() {
        let msgs = vec![
            ToCoordinator::Hello {
                protocol_version: PROTOCOL_VERSION,
                worker_name: "w0".into(),
                backend: "cpu".into(),
            },
            ToCoordinator::Done {
                lease_id: LeaseId(3),
                partial: PartialRef::Inline(vec![1, 2, 3]),
                sha256: gguf::hash::sha256_hex(&[1, 2, 3]),
                elapsed_ms: 9,
            },
        ];
        for m in msgs {
            let frame = encode_frame(&m);
            assert_eq!(
                u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
                frame.len() - 4
            );
            assert_eq!(decode::<ToCoordinator>(&frame[4..]).unwrap(), m);
        }
    }

    #[test]
    fn wire_tags_are_pinned_and_one_welcome_carries_either_task() {
        // bincode tags an enum variant by its index: these tags are the
        // protocol of PROTOCOL_VERSION 14 (as of 3, with `Computed` and
        // `Checkpoint` appended in 5; 6 changed the fields of an eval
        // candidate, 7 those of the job, 8 which replies answer what, 9 and
        // 10 the eval job's fields, 11 and 14 the job options', 13 the
        // generation prompts', not a tag; 12 appended a task); moving one
        // needs a new version.
        let tag = |frame: Vec<u8>| frame[4];
        assert_eq!(PROTOCOL_VERSION, 14);
        assert_eq!(tag(encode_frame(&ToWorker::Ack)), 4);
        assert_eq!(tag(encode_frame(&ToWorker::Finished)), 5);
        let refuse = ToCoordinator::Refuse { reason: "r".into() };
        assert_eq!(tag(encode_frame(&refuse)), 5);
        let job = JobInfo {
            run_url: "memory://run".into(),
            corpus_url: "memory://run/corpus".into(),
            model_sha256: "m".into(),
            model_path: "m.gguf".into(),
            mmproj: None,
            options: JobOptions {
                n_ubatch: 16,
                trace_every: TraceStrides::both(0),
                trace_top_n: 0,
                trace_lookahead: vec![1, 2],
                decode_tokens: 0,
                decode_prompt: 32,
                f32_kv: false,
                flash_attn: false,
                merge_projection: 0,
            },
            max_inline_bytes: 1,
            heartbeat_ms: 1,
            checkpoint: Checkpoint {
                leases: 8,
                seconds: 300,
            },
        };
        let eval = EvalJob {
            candidates: vec![EvalCandidate {
                name: "frequency_K8".into(),
                keep_map: Some("keep_maps/frequency_K8.json".into()),
                sha256: "c".repeat(64),
                expert_used: Some(2),
                quant: Some(gguf::quant::QuantType::Q4_K_M),
            }],
            skip_first: 0,
            splits: numbers::split::Split::ALL.to_vec(),
            models_in_memory: numbers::eval::ModelsInMemory::Count(2),
            scratch_dir: Some("/scratch".into()),
            generate: numbers::eval::GenerateJob {
                prompts: vec![numbers::eval::Prompt {
                    chunk: 3,
                    domain: 1,
                    doc: 17,
                    after_user_turn: true,
                    tokens: vec![151_644, 872, 198],
                }],
                new_tokens: 32,
                noise_ubatch: 1,
                unprompted: [(0, "no held-out text".into())].into(),
            },
        };
        let respond = RespondJob {
            prompts: "corpus/responses/prompts.json".into(),
            prompts_sha256: "d".repeat(64),
            sampling: Sampling {
                max_tokens: 8,
                n: 2,
                seed: 3,
                temperature_bits: 0.8f64.to_bits(),
                top_p_bits: 1.0f64.to_bits(),
            },
        };
        for task in [Task::Collect, Task::Evaluate(eval), Task::Respond(respond)] {
            let welcome = ToWorker::Welcome {
                worker_id: WorkerId(1),
                job: Box::new(job.clone()),
                task,
            };
            let frame = encode_frame(&welcome);
            assert_eq!(tag(frame.clone()), 1);
            assert_eq!(decode::<ToWorker>(&frame[4..]).unwrap(), welcome);
        }
        let done = ToCoordinator::Done {
            lease_id: LeaseId(2),
            partial: PartialRef::Inline(vec![1]),
            sha256: "ab".repeat(32),
            elapsed_ms: 3,
        };
        assert_eq!(tag(encode_frame(&done)), 3);
        assert_eq!(done.kind(), "Done");
        let computed = ToCoordinator::Computed {
            lease_id: LeaseId(2),
        };
        assert_eq!(tag(encode_frame(&computed)), 6);
        let checkpoint = ToCoordinator::Checkpoint {
            leases: vec![LeaseId(2), LeaseId(5)],
            partial: PartialRef::Inline(vec![1]),
            sha256: "ab".repeat(32),
            elapsed_ms: 3,
        };
        let frame = encode_frame(&checkpoint);
        assert_eq!(tag(frame.clone()), 7);
        assert_eq!(decode::<ToCoordinator>(&frame[4..]).unwrap(), checkpoint);
    }

    #[test]
    fn lists_of_small_integers_decode_after_login() {
        // Regression: bincode counts an `i32` of one varint byte as 4 and a
        // `u64` as 8, so 2,000 token ids (a 2 KB job's generation prompts)
        // claim 8 KB, past the 4 KiB tier of a pre-login body of 2 KB.
        let tokens: Vec<i32> = (0..2_000).map(|i| i % 100).collect();
        let frame = encode_frame(&tokens);
        assert!(frame.len() - 4 < PRE_AUTH_MAX_FRAME as usize);
        assert!(decode::<Vec<i32>>(&frame[4..]).is_err());
        assert_eq!(decode_after_login::<Vec<i32>>(&frame[4..]).unwrap(), tokens);
        let values: Vec<u64> = (0..12_000).map(|i| i % 200).collect();
        let frame = encode_frame(&values);
        assert_eq!(decode_after_login::<Vec<u64>>(&frame[4..]).unwrap(), values);
    }

    #[test]
    fn frames_of_every_size_near_the_limit_tiers_round_trip() {
        // Regression: bincode counts a u64 as 8 bytes against its limit, so
        // a limit of exactly the body's length refused valid frames.
        for tier in [0x1000usize, 0x2000, 0x4000, 0x1_0000] {
            for len in tier - 400..tier + 16 {
                let msg = ToCoordinator::Done {
                    lease_id: LeaseId(u64::MAX),
                    partial: PartialRef::Inline(vec![7; len]),
                    sha256: "ab".repeat(32),
                    elapsed_ms: u64::MAX,
                };
                let frame = encode_frame(&msg);
                assert_eq!(decode::<ToCoordinator>(&frame[4..]).unwrap(), msg, "{len}");
            }
        }
    }

    #[cfg(feature = "io")]
    #[tokio::test]
    async fn oversized_frame_is_refused_before_its_body_is_read() {
        let mut bytes: &[u8] = &[0xff, 0xff, 0xff, 0xf0, 1, 2];
        let r = read_msg::<_, ToWorker>(&mut bytes, 1024).await;
        assert!(
            matches!(r, Err(WireError::TooLarge { max: 1024, .. })),
            "{r:?}"
        );
    }

    #[cfg(feature = "io")]
    #[tokio::test]
    async fn garbage_is_malformed_and_clean_eof_is_none() {
        let mut garbage: &[u8] = &[0, 0, 0, 3, 0xee, 0xee, 0xee];
        assert!(matches!(
            read_msg::<_, ToWorker>(&mut garbage, 1024).await,
            Err(WireError::Malformed(_))
        ));
        let mut empty: &[u8] = &[];
        assert!(read_msg::<_, ToWorker>(&mut empty, 1024)
            .await
            .unwrap()
            .is_none());
    }

    #[test]
    fn proof_depends_on_secret_nonce_and_name() {
        let nonce = random_bytes(NONCE_LEN);
        let mac = join_proof(&worker_key(b"s3cret", "w0"), &nonce, "w0");
        assert!(check_proof(b"s3cret", &nonce, "w0", &mac));
        assert!(!check_proof(b"other", &nonce, "w0", &mac));
        assert!(!check_proof(b"s3cret", &nonce, "w1", &mac));
        assert!(!check_proof(
            b"s3cret",
            &random_bytes(NONCE_LEN),
            "w0",
            &mac
        ));
        // The key of one name proves no other, and is not the secret.
        let w0 = worker_key(b"s3cret", "w0");
        assert!(!check_proof(
            b"s3cret",
            &nonce,
            "w1",
            &join_proof(&w0, &nonce, "w1")
        ));
        assert!(!check_proof(
            b"s3cret",
            &nonce,
            "w0",
            &join_proof(b"s3cret", &nonce, "w0")
        ));
        assert_ne!(w0, worker_key(b"s3cret", "w1"));
    }

    #[test]
    fn pins_parse() {
        let hex = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_pin(&colons).as_deref(), Some(hex.as_str()));
        assert_eq!(
            parse_pin(&format!("sha256:{hex}")).as_deref(),
            Some(hex.as_str())
        );
        assert!(parse_pin("abcd").is_none());
    }
}
