//! The `[run]`, `[cluster]` and `[storage]` sections of the run config.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[run]`: how the chunks are leased and evaluated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSettings {
    /// Run location (path or URL); `--out` overrides; default `runs/<config stem>`.
    pub out: Option<String>,
    /// Chunks per lease (and per stored partial). Keep it fixed within a run:
    /// resuming matches stored partials by chunk range.
    pub lease_chunks: u32,
    /// Seconds before an unfinished lease goes to another worker.
    pub lease_timeout_s: u64,
    /// Seconds of silence after which a worker is considered gone.
    pub heartbeat_timeout_s: u64,
    /// Attempts per lease before the run fails.
    pub max_attempts: u32,
    /// Tokens per micro-batch.
    pub n_ubatch: u32,
    /// Traced tokens per split (fit, held-out), spread evenly over the
    /// corpus as "every n-th chunk" (see [`super::trace_plan`]); 0: no trace.
    pub trace_tokens_per_split: u64,
    /// Router top-N per trace row.
    pub trace_top_n: u32,
    /// f32 KV cache (exact oracle comparisons); production keeps f16.
    pub f32_kv: bool,
    /// Flash attention.
    pub flash_attn: bool,
    /// CPU threads per local worker (default: cores / local workers).
    pub local_worker_threads: Option<u32>,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            out: None,
            lease_chunks: 4,
            lease_timeout_s: 3600,
            heartbeat_timeout_s: 30,
            max_attempts: 3,
            n_ubatch: 512,
            trace_tokens_per_split: 65_536,
            trace_top_n: 64,
            f32_kv: false,
            flash_attn: false,
            local_worker_threads: None,
        }
    }
}

/// `[cluster]`: the QUIC endpoint and who may join.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Largest frame a worker may send, MiB (larger partials go through storage).
    pub max_frame_mib: u32,
    /// Where to write `{addr, pin, server_name}` for launch scripts.
    pub connect_file: Option<PathBuf>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            listen: "127.0.0.1:0".into(),
            server_names: Vec::new(),
            ca_dir: None,
            secret_file: None,
            max_connections: 256,
            max_frame_mib: 64,
            connect_file: None,
        }
    }
}

/// `[storage]`: S3-compatible endpoint settings for `s3://` run locations
/// (credentials stay in `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    use crate::config::Config;

    #[test]
    fn run_sections_parse_with_defaults() {
        let c = Config::parse("[run]\nlease_chunks = 2\n[cluster]\nlisten = \"0.0.0.0:7000\"\n[storage]\nallow_http = true\n").unwrap();
        assert_eq!(c.run.lease_chunks, 2);
        assert_eq!(c.run.max_attempts, 3);
        assert_eq!(c.cluster.listen, "0.0.0.0:7000");
        assert_eq!(
            c.storage.env(),
            vec![("AWS_ALLOW_HTTP", "true".to_string())]
        );
        assert!(Config::parse("[run]\nlease_chunk = 2\n").is_err());
    }
}
