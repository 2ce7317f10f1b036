//! The `[run]`, `[cluster]` and `[storage]` sections of the run config.

use protocol::MAX_CPU_MOE_LAYERS;
use sched::SchedConfig;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[run]`: how the chunks are leased and evaluated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RunSettings {
    /// Run location (path or URL); `--out` overrides; default `runs/<config stem>`.
    pub out: Option<String>,
    /// Chunks per lease (and per stored partial). Keep it fixed within a run:
    /// resuming matches stored partials by chunk range.
    pub lease_chunks: u32,
    /// Seconds before an unfinished lease goes to another worker.
    pub lease_timeout_s: u64,
    /// Leases a worker adds into one running partial before it ships it (a
    /// checkpoint): stored partials then scale with workers, not leases.
    /// The merge is exact, so this changes no bit of the result; a worker
    /// lost between checkpoints loses its leases since the last one to the
    /// queue. 1 ships every lease alone (as runs with `verify_fraction` do).
    pub checkpoint_leases: u32,
    /// Seconds after which a worker ships the leases it holds, however
    /// few (also at half a lease's deadline, and whenever it gets no lease).
    pub checkpoint_s: u64,
    /// Stored results the coordinator reads, checks and merges at once
    /// (each check and merge is spread over its cores). Its memory is the
    /// running total plus this many results: at 48 MoE layers x 512
    /// experts, 2.03 GB + 0.98 GB each (at most 0.1 GB more for each and
    /// for the total with `merge_projection = 128`). 1 saves a result's memory for about
    /// a sixth of the ingest throughput (BENCHMARKS.md).
    pub ingest_slots: u32,
    /// Seconds of silence after which a worker is considered gone.
    pub heartbeat_timeout_s: u64,
    /// Distinct workers a lease may fail on before the run fails.
    pub max_attempts: u32,
    /// Failures in a row after which a worker (an identity: its name, across
    /// reconnects) is quarantined (its leases go to other workers).
    pub max_worker_failures: u32,
    /// Seconds a quarantine for failures lasts; then the worker may join
    /// again (one whose result two others contradicted stays out for the run).
    pub quarantine_s: u64,
    /// Seconds two disagreeing results wait for a third worker's when no
    /// other worker is there to compute it; then the unit is decided
    /// without it and the run reports the disagreement as unresolved.
    pub disagreement_wait_s: u64,
    /// Seconds the run waits, once quarantine left no healthy worker, for
    /// one to join before it fails.
    pub no_worker_grace_s: u64,
    /// Fraction of leases (a sample salted with a secret the coordinator
    /// keeps with its identity, so workers cannot tell which) also run on a
    /// second worker and compared: bitwise on the same backend, else counts exact
    /// and sums within a tolerance; a mismatch gets a third opinion and the
    /// odd worker is quarantined. Collection and evaluation leases alike
    /// (the same sample of units; eval tolerances across backends:
    /// per-position KL and means within 1e-3 + 1%, same top-1 within 1% of
    /// the positions). 0 (default) turns it off.
    pub verify_fraction: f64,
    /// Tokens per micro-batch.
    pub n_ubatch: u32,
    /// Traced tokens per split (fit, held-out), each spread evenly over the
    /// corpus as "every n-th chunk" of its own (the run's trace plan);
    /// 0: no trace.
    pub trace_tokens_per_split: u64,
    /// Router top-N per trace row.
    pub trace_top_n: u32,
    /// Lookahead distances `d` (layers ahead): each trace row of MoE layer
    /// `L` also records layer `L + d`'s router top-N applied to the residual
    /// stream after layer `L` (llama.cpp's `l_out-L`, the pre-attention
    /// signal of layer `L + 1`), with that layer's input norm and routing
    /// rule; null where `L + d` is past the last MoE layer. Empty: none.
    pub trace_lookahead: Vec<u8>,
    /// Decode traces: tokens each worker generates greedily (teacher-free,
    /// the model's own continuation) from the first `trace_decode_prompt`
    /// tokens of each held-out span of a chunk whose held-out tokens are
    /// traced, each generated token traced (`trace/decode/`, replayed
    /// beside the prefill trace). 0: no decode trace.
    pub trace_decode_tokens: u32,
    /// Decode traces: prompt tokens taken from each held-out span (at least 1).
    pub trace_decode_prompt: u32,
    /// f32 KV cache (exact oracle comparisons); production keeps f16.
    pub f32_kv: bool,
    /// Flash attention.
    pub flash_attn: bool,
    /// Dimensions each routed expert output (before its routing weight) is
    /// projected to, summed exactly per expert and split: the mean output
    /// merge plans compare experts by (a seeded random sign projection,
    /// README "Merged candidates"). At 48 MoE layers x 512 experts, 128
    /// adds 2 x 48 x 512 x 128 = 6.3M sums to a partial (100.7 MB in
    /// memory beside a total's 2.03 GB; packed, about 17 MB stored at 2,048
    /// tokens, BENCHMARKS.md). 0: off (merge plans then use the router's
    /// similarity).
    pub merge_projection: u32,
    /// CPU threads per local worker (default: cores / local workers).
    pub local_worker_threads: Option<u32>,
    /// Where local workers reduce observed tensors (`worker join --reduce`,
    /// passed as `MOE_CENSUS_REDUCE`): `auto` (on the device when layers
    /// are offloaded to a GPU), `host` or `device`; default: the worker's
    /// own (`auto`).
    pub local_worker_reduce: Option<String>,
    /// Layers each local worker offloads to its GPU (`worker join --ngl`;
    /// 0: none, the CPU computes everything).
    pub local_worker_gpu_layers: u32,
    /// The GPUs local workers use, an entry each in turn: worker i sees
    /// `local_worker_gpus[i % len]` as its `CUDA_VISIBLE_DEVICES` (`"0"`,
    /// `"2,3"` for a worker on two, a GPU UUID). Empty: every local worker
    /// sees every GPU.
    pub local_worker_gpus: Vec<String>,
    /// Local workers keep every routed expert's weights in host memory,
    /// computed by the CPU (`worker join --cpu-moe`): a MoE model larger
    /// than one GPU, with attention and the shared weights on the GPU.
    pub local_worker_cpu_moe: bool,
    /// Local workers keep the routed experts of the first N blocks in host
    /// memory (`worker join --n-cpu-moe N`; 0: none).
    pub local_worker_n_cpu_moe: u32,
    /// Seconds after which the run location's lock, if its holder stopped
    /// refreshing it, may be taken over (0: take over any lock).
    pub lock_stale_s: u64,
    /// Seconds between the progress lines a phase logs (leases and tokens
    /// done of the total, rate, ETA, workers): what a Slurm log or
    /// `kubectl logs` shows of a long run. On a terminal the collection
    /// draws a bar instead.
    pub progress_interval_s: u64,
}

impl RunSettings {
    /// `lock_stale_s` as a duration.
    pub fn lock_stale(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.lock_stale_s)
    }

    /// The evaluation settings every worker of the run shares; `trace_every`
    /// holds the chunk strides that meet `trace_tokens_per_split` per split.
    pub fn job_options(
        &self,
        trace_every: protocol::wire::TraceStrides,
    ) -> protocol::wire::JobOptions {
        protocol::wire::JobOptions {
            n_ubatch: self.n_ubatch,
            trace_every,
            trace_top_n: self.trace_top_n,
            trace_lookahead: self.trace_lookahead.clone(),
            decode_tokens: self.trace_decode_tokens,
            decode_prompt: self.trace_decode_prompt,
            f32_kv: self.f32_kv,
            flash_attn: self.flash_attn,
            merge_projection: self.merge_projection,
        }
    }
}

impl Default for RunSettings {
    /// The scheduler's own defaults ([`SchedConfig`]) for leases, heartbeats
    /// and attempts, so there is one of each.
    fn default() -> Self {
        let sched = SchedConfig::default();
        RunSettings {
            out: None,
            lease_chunks: 4,
            lease_timeout_s: sched.lease_timeout.as_secs(),
            checkpoint_leases: 1,
            checkpoint_s: 300,
            ingest_slots: 2,
            heartbeat_timeout_s: sched.heartbeat_timeout.as_secs(),
            max_attempts: sched.max_attempts,
            max_worker_failures: sched.max_worker_failures,
            quarantine_s: sched.quarantine.as_secs(),
            disagreement_wait_s: sched.disagreement_wait.as_secs(),
            no_worker_grace_s: sched.no_worker_grace.as_secs(),
            verify_fraction: sched.verify_fraction,
            n_ubatch: 512,
            trace_tokens_per_split: 65_536,
            trace_top_n: 64,
            trace_lookahead: vec![1, 2],
            trace_decode_tokens: 0,
            trace_decode_prompt: 32,
            f32_kv: false,
            flash_attn: false,
            merge_projection: 128,
            local_worker_threads: None,
            local_worker_reduce: None,
            local_worker_gpu_layers: 0,
            local_worker_gpus: Vec::new(),
            local_worker_cpu_moe: false,
            local_worker_n_cpu_moe: 0,
            lock_stale_s: 120,
            progress_interval_s: 10,
        }
    }
}

impl RunSettings {
    /// Refuses settings no run can work with, naming the `[run]` field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            (
                "n_ubatch",
                u64::from(self.n_ubatch),
                "a micro-batch needs at least one token",
            ),
            (
                "lease_chunks",
                u64::from(self.lease_chunks),
                "a lease needs at least one chunk",
            ),
            (
                "max_attempts",
                u64::from(self.max_attempts),
                "a lease needs at least one attempt",
            ),
            (
                "progress_interval_s",
                self.progress_interval_s,
                "progress lines need at least a second between them",
            ),
            (
                "checkpoint_leases",
                u64::from(self.checkpoint_leases),
                "a checkpoint ships at least one lease (1: every lease alone)",
            ),
            (
                "ingest_slots",
                u64::from(self.ingest_slots),
                "the coordinator reads at least one result at a time",
            ),
        ];
        if let Some((field, _, why)) = positive.iter().find(|(_, v, _)| *v == 0) {
            return Err(format!("[run] {field} = 0: {why}"));
        }
        if self.trace_decode_tokens > 0 && self.trace_decode_prompt == 0 {
            return Err(format!(
                "[run] trace_decode_prompt = 0 with trace_decode_tokens = {}: a decode trace \
                 needs at least one prompt token",
                self.trace_decode_tokens
            ));
        }
        if self.merge_projection > numbers::projection::MAX_DIM {
            return Err(format!(
                "[run] merge_projection = {}: outputs are projected to at most 4096 dimensions \
                 (0 turns the projection off)",
                self.merge_projection
            ));
        }
        if self.trace_lookahead.contains(&0) {
            return Err(format!(
                "[run] trace_lookahead = {:?}: a distance is at least 1 layer (an empty list \
                 turns lookahead off)",
                self.trace_lookahead
            ));
        }
        match self.local_worker_reduce.as_deref() {
            None | Some("auto" | "host" | "device") => {}
            Some(other) => {
                return Err(format!(
                "[run] local_worker_reduce = {other:?}: expected \"auto\", \"host\" or \"device\""
            ))
            }
        }
        self.validate_gpus()
    }

    /// Refuses local-worker GPU settings that contradict each other or
    /// that would leave the GPUs idle.
    fn validate_gpus(&self) -> Result<(), String> {
        if self.local_worker_cpu_moe && self.local_worker_n_cpu_moe > 0 {
            return Err(format!(
                "[run] local_worker_cpu_moe = true and local_worker_n_cpu_moe = {}: set one \
                 (every block's experts, or the first N blocks')",
                self.local_worker_n_cpu_moe
            ));
        }
        if self.local_worker_n_cpu_moe > MAX_CPU_MOE_LAYERS {
            return Err(format!(
                "[run] local_worker_n_cpu_moe = {}: at most {MAX_CPU_MOE_LAYERS} blocks \
                 (use local_worker_cpu_moe = true for all)",
                self.local_worker_n_cpu_moe
            ));
        }
        if let Some(bad) = self
            .local_worker_gpus
            .iter()
            .find(|g| g.is_empty() || g.split(',').any(|d| !is_device_name(d)))
        {
            return Err(format!(
                "[run] local_worker_gpus holds {bad:?}: expected GPU indices or UUIDs \
                 (\"0\", \"2,3\", \"GPU-<uuid>\"), one entry per worker"
            ));
        }
        let needs_gpu = [
            ("local_worker_gpus", !self.local_worker_gpus.is_empty()),
            ("local_worker_cpu_moe", self.local_worker_cpu_moe),
            ("local_worker_n_cpu_moe", self.local_worker_n_cpu_moe > 0),
        ];
        match needs_gpu.iter().find(|(_, set)| *set) {
            Some((field, _)) if self.local_worker_gpu_layers == 0 => Err(format!(
                "[run] {field} is set but local_worker_gpu_layers = 0 puts no layer on a GPU \
                 (999 offloads all)"
            )),
            _ => Ok(()),
        }
    }
}

/// Whether `d` can name one GPU in `CUDA_VISIBLE_DEVICES`: an index, a
/// `GPU-`/`MIG-` UUID.
fn is_device_name(d: &str) -> bool {
    !d.is_empty()
        && d.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '/')
}

/// `[cluster]`: the QUIC endpoint and who may join.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Address to listen on; `127.0.0.1:0` (loopback, any port) serves local workers only.
    pub listen: String,
    /// Extra names (DNS or IP) the coordinator's certificate is valid for.
    pub server_names: Vec<String>,
    /// Directory of the cluster CA made by `coordinator ca`; without it the
    /// certificate is self-signed and workers pin its fingerprint.
    pub ca_dir: Option<PathBuf>,
    /// File holding the join secret; default: `MOE_CENSUS_JOIN_SECRET`, else a
    /// random secret only local workers learn.
    pub secret_file: Option<PathBuf>,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections from one address that may be logging in (not yet past
    /// the join proof) at once, capped at half of `max_connections` so one
    /// host cannot take every slot; more from that address are refused
    /// (workers retry with backoff).
    pub max_pending_per_address: usize,
    /// Milliseconds a connection has, from its arrival, to prove the join
    /// secret; then it is closed and its slot freed.
    pub login_timeout_ms: u64,
    /// Largest frame a worker may send, MiB (larger partials go through storage).
    pub max_frame_mib: u32,
    /// Largest result a worker may stage in storage, MiB: the coordinator
    /// reads a staged result whole (`[run] ingest_slots` of them at once),
    /// so a larger one is refused by its size, unread. At 48 MoE layers x
    /// 512 experts a partial is about 1 GB.
    pub max_staged_mib: u64,
    /// MiB that all joined workers' frames may hold at once while they
    /// arrive; a frame that would go past it waits (its sender held back
    /// by flow control) until others are handled.
    pub max_buffered_mib: u32,
    /// Where to write `{addr, pin, server_name}` for launch scripts.
    pub connect_file: Option<PathBuf>,
    /// Directory that keeps the coordinator's certificate, stateless-reset
    /// key, listening address and redundancy-sample salt across restarts,
    /// so its workers rejoin a restarted coordinator by themselves and it
    /// samples the same units.
    /// `coordinator run` defaults it to `.moe-census/` beside the config,
    /// one subdirectory per run location; unset, every start is a new peer
    /// with a new salt.
    pub identity_dir: Option<PathBuf>,
}

impl ClusterSettings {
    /// Refuses settings no run can work with, naming the `[cluster]` field.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_staged_mib == 0 {
            return Err("[cluster] max_staged_mib = 0: every result too large to \
                 travel inline would be refused"
                .into());
        }
        Ok(())
    }

    /// `max_pending_per_address`, capped at half of `max_connections` (at least 1).
    pub fn pending_per_address(&self) -> usize {
        self.max_pending_per_address
            .min(self.max_connections / 2)
            .max(1)
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            listen: "127.0.0.1:0".into(),
            server_names: Vec::new(),
            ca_dir: None,
            secret_file: None,
            max_connections: 256,
            max_pending_per_address: 8,
            login_timeout_ms: 5000,
            max_frame_mib: 64,
            max_staged_mib: 8192,
            max_buffered_mib: 256,
            connect_file: None,
            identity_dir: None,
        }
    }
}

/// `[storage]`: S3-compatible endpoint settings for `s3://` run locations
/// (credentials stay in `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSettings {
    /// Endpoint URL (`http://127.0.0.1:9000`); sets `AWS_ENDPOINT`.
    pub endpoint: Option<String>,
    /// Allow plain HTTP; sets `AWS_ALLOW_HTTP`.
    pub allow_http: bool,
    /// Region; sets `AWS_REGION`.
    pub region: Option<String>,
}

impl StorageSettings {
    /// The environment the object store (and local workers) read, as pairs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(e) = &self.endpoint {
            env.push(("AWS_ENDPOINT", e.clone()));
        }
        if self.allow_http {
            env.push(("AWS_ALLOW_HTTP", "true".into()));
        }
        if let Some(r) = &self.region {
            env.push(("AWS_REGION", r.clone()));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_sections_parse_with_defaults() {
        let run: RunSettings = toml::from_str("lease_chunks = 2").unwrap();
        assert_eq!(run.lease_chunks, 2);
        assert_eq!(run.max_attempts, 3);
        let cluster: ClusterSettings = toml::from_str("listen = \"0.0.0.0:7000\"").unwrap();
        assert_eq!(cluster.listen, "0.0.0.0:7000");
        let storage: StorageSettings = toml::from_str("allow_http = true").unwrap();
        assert_eq!(storage.env(), vec![("AWS_ALLOW_HTTP", "true".to_string())]);
        assert!(toml::from_str::<RunSettings>("lease_chunk = 2").is_err());
        assert_eq!(RunSettings::default().validate(), Ok(()));
        let zero: RunSettings = toml::from_str("n_ubatch = 0").unwrap();
        assert_eq!(
            zero.validate(),
            Err("[run] n_ubatch = 0: a micro-batch needs at least one token".into())
        );
        let no_slot: RunSettings = toml::from_str("ingest_slots = 0").unwrap();
        assert_eq!(
            no_slot.validate(),
            Err(
                "[run] ingest_slots = 0: the coordinator reads at least one result at a time"
                    .into()
            )
        );
        let no_staging: ClusterSettings = toml::from_str("max_staged_mib = 0").unwrap();
        assert_eq!(
            no_staging.validate(),
            Err("[cluster] max_staged_mib = 0: every result too large to travel inline would be refused".into())
        );
        assert_eq!(ClusterSettings::default().validate(), Ok(()));
        let device: RunSettings = toml::from_str("local_worker_reduce = \"device\"").unwrap();
        assert_eq!(device.validate(), Ok(()));
        let gpu: RunSettings = toml::from_str("local_worker_reduce = \"gpu\"").unwrap();
        assert_eq!(
            gpu.validate(),
            Err(
                "[run] local_worker_reduce = \"gpu\": expected \"auto\", \"host\" or \"device\""
                    .into()
            )
        );
    }

    #[test]
    fn local_worker_gpu_settings_are_checked() {
        let check = |text: &str| toml::from_str::<RunSettings>(text).unwrap().validate();
        let ok =
            "local_worker_gpu_layers = 999\nlocal_worker_gpus = [\"0\", \"1,2\", \"GPU-8a1b\"]\n\
                  local_worker_n_cpu_moe = 12";
        assert_eq!(check(ok), Ok(()));
        assert_eq!(
            check("local_worker_gpu_layers = 999\nlocal_worker_cpu_moe = true"),
            Ok(())
        );
        for (text, why) in [
            (
                "local_worker_gpus = [\"0\"]",
                "[run] local_worker_gpus is set but local_worker_gpu_layers = 0 puts no layer on a GPU (999 offloads all)",
            ),
            (
                "local_worker_cpu_moe = true",
                "[run] local_worker_cpu_moe is set but local_worker_gpu_layers = 0 puts no layer on a GPU (999 offloads all)",
            ),
            (
                "local_worker_gpu_layers = 1\nlocal_worker_cpu_moe = true\nlocal_worker_n_cpu_moe = 3",
                "[run] local_worker_cpu_moe = true and local_worker_n_cpu_moe = 3: set one (every block's experts, or the first N blocks')",
            ),
            (
                "local_worker_gpu_layers = 1\nlocal_worker_n_cpu_moe = 4097",
                "[run] local_worker_n_cpu_moe = 4097: at most 4096 blocks (use local_worker_cpu_moe = true for all)",
            ),
            (
                "local_worker_gpu_layers = 1\nlocal_worker_gpus = [\"0\", \"1; rm\"]",
                "[run] local_worker_gpus holds \"1; rm\": expected GPU indices or UUIDs (\"0\", \"2,3\", \"GPU-<uuid>\"), one entry per worker",
            ),
            (
                "local_worker_gpu_layers = 1\nlocal_worker_gpus = [\"0,\"]",
                "[run] local_worker_gpus holds \"0,\": expected GPU indices or UUIDs (\"0\", \"2,3\", \"GPU-<uuid>\"), one entry per worker",
            ),
        ] {
            assert_eq!(check(text), Err(why.to_string()), "{text}");
        }
    }
}
