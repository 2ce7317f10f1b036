//! Local worker processes for `--local-workers N`: the `worker` binary next
//! to the coordinator's own executable, joined over loopback QUIC exactly
//! like a remote worker.

use super::RunError;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::process::{Child, Command};

/// Environment variable naming the worker binary explicitly.
pub use common::layout::env::WORKER_BIN as WORKER_BIN_ENV;

/// Environment variable a worker reads the join secret from.
pub use common::layout::env::JOIN_SECRET as SECRET_ENV;

/// Variable through which local workers get `[run] local_worker_reduce`
/// (the worker reads it when `--reduce` is not given).
pub use common::layout::env::REDUCE as REDUCE_ENV;

/// The worker binary: `$MOE_CENSUS_WORKER_BIN`, else `worker` beside this
/// executable (or one directory up, for test binaries in `target/*/deps`).
pub fn worker_binary() -> Result<PathBuf, RunError> {
    if let Some(p) = std::env::var_os(WORKER_BIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()
        .map_err(|e| RunError::Setup(format!("cannot find this executable: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let name = format!("worker{}", std::env::consts::EXE_SUFFIX);
    let candidates = [dir.join(&name), dir.join("..").join(&name)];
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        RunError::Setup(format!(
            "no worker binary at {} (build it with `cargo build -p worker`, or set {WORKER_BIN_ENV})",
            candidates[0].display()
        ))
    })
}

/// How local workers are started.
#[derive(Clone, Debug)]
pub struct LocalWorkers {
    /// The worker binary.
    pub binary: PathBuf,
    /// How many.
    pub count: u32,
    /// Model file they load.
    pub model: PathBuf,
    /// CPU threads each.
    pub threads: u32,
    /// Extra environment (storage settings).
    pub env: Vec<(&'static str, String)>,
}

impl LocalWorkers {
    /// Starts the processes; they are killed if the handles are dropped.
    pub fn spawn(
        &self,
        addr: SocketAddr,
        pin: &str,
        secret: &common::secret::JoinSecret,
    ) -> Result<Vec<Child>, RunError> {
        let secret = String::from_utf8(secret.expose().to_vec()).map_err(|_| {
            RunError::Setup("the join secret must be UTF-8 text to pass to local workers".into())
        })?;
        (0..self.count)
            .map(|i| {
                let mut cmd = Command::new(&self.binary);
                cmd.arg("join")
                    .arg("--coordinator")
                    .arg(addr.to_string())
                    .arg("--pin")
                    .arg(pin)
                    .arg("--name")
                    .arg(format!("local-{i}"))
                    .arg("--model")
                    .arg(&self.model)
                    .arg("--threads")
                    .arg(self.threads.to_string())
                    .env(SECRET_ENV, &secret)
                    .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true);
                cmd.spawn().map_err(|e| {
                    RunError::Setup(format!("cannot start {}: {e}", self.binary.display()))
                })
            })
            .collect()
    }
}
