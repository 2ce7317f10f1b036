//! Local worker processes for `--local-workers N`: the `worker` binary next
//! to the coordinator's own executable, joined over loopback QUIC exactly
//! like a remote worker.

use super::RunError;
use config::run::RunSettings;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::process::{Child, Command};

/// Environment variable naming the worker binary explicitly.
pub use runfiles::layout::env::WORKER_BIN as WORKER_BIN_ENV;

/// Environment variable a worker reads the join secret from.
pub use runfiles::layout::env::JOIN_SECRET as SECRET_ENV;

/// Variable through which local workers get `[run] local_worker_reduce`
/// (the worker reads it when `--reduce` is not given).
pub use runfiles::layout::env::REDUCE as REDUCE_ENV;

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
    /// Extra environment (storage settings, `[run] local_worker_reduce`).
    pub env: Vec<(&'static str, String)>,
    /// `worker join` flags that place the model's weights: `--ngl N`, then
    /// `--cpu-moe` or `--n-cpu-moe N` (`[run] local_worker_gpu_layers`,
    /// `local_worker_cpu_moe`, `local_worker_n_cpu_moe`).
    pub placement: Vec<String>,
    /// The GPUs each worker sees in turn (`CUDA_VISIBLE_DEVICES` of worker
    /// i is `gpus[i % len]`); empty: the variable is left as it is.
    pub gpus: Vec<String>,
}

/// The variable through which the CUDA runtime shows a process only some
/// of the machine's GPUs.
pub const VISIBLE_GPUS_ENV: &str = "CUDA_VISIBLE_DEVICES";

impl LocalWorkers {
    /// `count` workers of `binary` on `model`, as `[run]` says (threads,
    /// reductions, GPUs and placement), with the storage settings `storage`.
    pub fn new(
        binary: PathBuf,
        run: &RunSettings,
        storage: Vec<(&'static str, String)>,
        model: PathBuf,
        count: u32,
    ) -> LocalWorkers {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let mut placement = vec![
            "--n-gpu-layers".to_string(),
            run.local_worker_gpu_layers.to_string(),
        ];
        if run.local_worker_cpu_moe {
            placement.push("--cpu-moe".into());
        } else if run.local_worker_n_cpu_moe > 0 {
            placement.extend(["--n-cpu-moe".into(), run.local_worker_n_cpu_moe.to_string()]);
        }
        let reduce = run.local_worker_reduce.clone().map(|r| (REDUCE_ENV, r));
        LocalWorkers {
            binary,
            count,
            model,
            threads: run
                .local_worker_threads
                .unwrap_or((cores / count.max(1)).max(1)),
            env: storage.into_iter().chain(reduce).collect(),
            placement,
            gpus: run.local_worker_gpus.clone(),
        }
    }

    /// Starts the processes; they are killed if the handles are dropped.
    pub fn spawn(
        &self,
        addr: SocketAddr,
        pin: &str,
        secret: &protocol::secret::JoinSecret,
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
                    .args(&self.placement)
                    .env(SECRET_ENV, &secret)
                    .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true);
                if !self.gpus.is_empty() {
                    cmd.env(VISIBLE_GPUS_ENV, &self.gpus[i as usize % self.gpus.len()]);
                }
                cmd.spawn().map_err(|e| {
                    RunError::Setup(format!("cannot start {}: {e}", self.binary.display()))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in worker binary that writes its arguments and the GPUs it
    /// was shown to `<dir>/<name>.args`, then exits.
    fn recording_worker(dir: &Path) -> PathBuf {
        let bin = dir.join("worker");
        let script = format!(
            "#!/bin/sh\n\
             while [ \"$1\" != --name ]; do shift; done\n\
             name=$2\n\
             {{ echo \"$*\"; echo \"gpus=${{{VISIBLE_GPUS_ENV}-unset}}\"; }} > {}/$name.args\n",
            dir.display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A process another test forks while the script is open for writing
        // holds that descriptor until it execs, and meanwhile the script
        // cannot be run (ETXTBSY). Once one run starts, no writer is left
        // (ours is closed, so no later fork inherits it): probe until then.
        for _ in 0..500 {
            match std::process::Command::new(&bin)
                .args(["--name", "probe"])
                .status()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                status => {
                    assert!(status.unwrap().success());
                    return bin;
                }
            }
        }
        panic!("{} stayed busy (ETXTBSY) for 5 s", bin.display());
    }

    /// Spawns `count` recording workers configured by `run` and returns
    /// what each was given, in worker order.
    async fn spawned(run: RunSettings, count: u32) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        run.validate().unwrap();
        let workers = LocalWorkers::new(
            recording_worker(dir.path()),
            &run,
            Vec::new(),
            dir.path().join("m.gguf"),
            count,
        );
        let secret = protocol::secret::JoinSecret::generate();
        let children = workers
            .spawn("127.0.0.1:7000".parse().unwrap(), "PIN", &secret)
            .unwrap();
        for mut child in children {
            assert!(child.wait().await.unwrap().success());
        }
        (0..count)
            .map(|i| std::fs::read_to_string(dir.path().join(format!("local-{i}.args"))).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn local_workers_get_the_gpus_and_placement_of_the_config() {
        let run = RunSettings {
            local_worker_gpu_layers: 999,
            local_worker_gpus: vec!["0".into(), "2,3".into()],
            local_worker_n_cpu_moe: 12,
            local_worker_threads: Some(4),
            ..RunSettings::default()
        };
        let got = spawned(run, 3).await;
        let flags = "--threads 4 --n-gpu-layers 999 --n-cpu-moe 12";
        for (i, gpus) in ["0", "2,3", "0"].iter().enumerate() {
            let (args, seen) = got[i].trim_end().split_once('\n').unwrap();
            assert!(args.contains(flags), "worker {i}: {args}");
            assert_eq!(seen, format!("gpus={gpus}"), "worker {i}");
        }
        let run = RunSettings {
            local_worker_gpu_layers: 20,
            local_worker_cpu_moe: true,
            ..RunSettings::default()
        };
        let all = spawned(run, 1).await;
        assert!(
            all[0].contains("--n-gpu-layers 20 --cpu-moe\n"),
            "{}",
            all[0]
        );
    }

    #[tokio::test]
    async fn by_default_local_workers_run_on_the_cpu_and_see_every_gpu() {
        // What the caller's environment says about GPUs passes through.
        let got = spawned(RunSettings::default(), 2).await;
        for args in got {
            assert!(args.contains("--n-gpu-layers 0\n"), "{args}");
            assert!(!args.contains("cpu-moe"), "{args}");
            let inherited = std::env::var(VISIBLE_GPUS_ENV).unwrap_or_else(|_| "unset".into());
            assert!(args.ends_with(&format!("gpus={inherited}\n")), "{args}");
        }
    }
}
