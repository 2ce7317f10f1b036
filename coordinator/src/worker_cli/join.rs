//! `worker join`: its flags, read into the worker library's [`JoinArgs`],
//! and the tokio runtime it runs on.

use super::offload::OffloadArgs;
use crate::values;
use std::path::PathBuf;
use worker::collect::device::Reduce;
use worker::eval::Compare;
use worker::join::{JoinArgs, JoinError, JoinSummary};

/// Arguments of `worker join`.
#[derive(clap::Args, Debug, Clone)]
pub struct JoinFlags {
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
    /// File holding the join secret (default: the MOE_CENSUS_JOIN_SECRET
    /// variable); a later `--key-file` replaces it.
    #[arg(long, overrides_with = "key_file")]
    pub secret_file: Option<PathBuf>,
    /// This worker's own key file (`coordinator worker-key`), instead of the
    /// join secret: it names the worker and proves that name only; a later
    /// `--secret-file` replaces it.
    #[arg(long, conflicts_with = "name", overrides_with = "secret_file")]
    pub key_file: Option<PathBuf>,
    /// This worker's name in logs and progress, and its identity for the
    /// coordinator across reconnects (default: host name and process id).
    #[arg(long)]
    pub name: Option<String>,
    /// GGUF model file (default: the path the coordinator sends).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// The model's mmproj GGUF, for a corpus with images (default: the
    /// path the coordinator sends).
    #[arg(long)]
    pub mmproj: Option<PathBuf>,
    /// Where the model's weights live (`--ngl`, `--cpu-moe`, `--n-cpu-moe`).
    #[command(flatten)]
    pub offload: OffloadArgs,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Where observed tensors are reduced: `device` (on their backend; only
    /// results are copied to the host), `host` (the reference path), or
    /// `auto` (device when layers are offloaded to a GPU). Default:
    /// $MOE_CENSUS_REDUCE, else auto.
    #[arg(long, value_parser = values::reduce())]
    pub reduce: Option<Reduce>,
    /// Where an evaluation compares base and candidate logits: `device`
    /// (on the backend that holds them; only per-position figures are
    /// copied to the host) or `host` (in f64 after llama.cpp copies every
    /// logits row: the reference path), or `auto`: device with layers
    /// offloaded to a GPU, else host.
    #[arg(long, value_parser = values::compare(), default_value = "auto")]
    pub compare: Compare,
    /// Models an evaluation holds in memory at once (`auto`, `all`, or a
    /// number: 2 is the base and one candidate, 1 one model at a time).
    /// Default: the run's `[eval] models_in_memory`.
    #[arg(long)]
    pub models_in_memory: Option<numbers::eval::ModelsInMemory>,
    /// Scratch directory for sliced candidates and a lease's base logits.
    /// Default: the run's `[eval] scratch_dir`, else `$TMPDIR`.
    #[arg(long)]
    pub scratch_dir: Option<PathBuf>,
    /// Seconds to keep reconnecting (with backoff) without reaching the
    /// coordinator before giving up.
    #[arg(long, default_value_t = 300)]
    pub give_up_after_s: u64,
}

impl From<JoinFlags> for JoinArgs {
    fn from(f: JoinFlags) -> JoinArgs {
        JoinArgs {
            coordinator: f.coordinator,
            pin: f.pin,
            ca: f.ca,
            server_name: f.server_name,
            secret_file: f.secret_file,
            key_file: f.key_file,
            name: f.name,
            model: f.model,
            mmproj: f.mmproj,
            offload: f.offload.offload(),
            threads: f.threads,
            reduce: f.reduce,
            compare: f.compare,
            models_in_memory: f.models_in_memory,
            scratch_dir: f.scratch_dir,
            give_up_after_s: f.give_up_after_s,
        }
    }
}

/// Entry point of `worker join`: the library's [`worker::join::run`] on a
/// multi-threaded runtime.
pub fn run(flags: JoinFlags) -> Result<JoinSummary, JoinError> {
    let rt = tokio::runtime::Runtime::new().map_err(|e| JoinError::Setup(e.to_string()))?;
    rt.block_on(worker::join::run(flags.into()))
}
