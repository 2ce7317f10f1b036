//! What a worker needs to join a listening coordinator: the address to dial,
//! the trust (the pinned certificate, or the cluster CA and the name the
//! certificate is checked against), and placeholders for what only the
//! worker's node knows (its secret or key file, its copy of the model). The
//! coordinator prints it as a `worker join` command and writes it to
//! `[cluster] connect_file`.

use crate::net::tls::CA_CERT_FILE;
use config::run::ClusterSettings;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The placeholder of the join secret's file in the printed command.
pub const SECRET_FILE: &str = "SECRET_FILE";

/// The placeholder of the worker's copy of the model.
pub const MODEL_FILE: &str = "MODEL.gguf";

/// The join instructions of one listening coordinator (`connect_file` JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JoinHint {
    /// The bound address.
    pub addr: SocketAddr,
    /// What `worker join --coordinator` takes: `addr`, or `server_name:port`
    /// when the coordinator listens on every interface (`0.0.0.0`, `::`).
    pub coordinator: String,
    /// The name a worker checks the certificate against: the first of
    /// `[cluster] server_names`, else `localhost`.
    pub server_name: String,
    /// SHA-256 of the coordinator's certificate.
    pub pin: String,
    /// The cluster CA certificate, when `[cluster] ca_dir` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The `worker join` command line with every flag a worker needs, the
    /// secret file and the model as placeholders ([`SECRET_FILE`],
    /// [`MODEL_FILE`]); flags appended to it replace them.
    pub join: String,
    /// What each placeholder of `join` stands for.
    pub placeholders: BTreeMap<&'static str, &'static str>,
}

impl JoinHint {
    /// The hint for a coordinator bound to `addr` with certificate `pin`.
    pub fn new(addr: SocketAddr, pin: &str, cluster: &ClusterSettings) -> JoinHint {
        let server_name = cluster
            .server_names
            .first()
            .cloned()
            .unwrap_or_else(|| "localhost".into());
        let coordinator = if addr.ip().is_unspecified() {
            format!("{server_name}:{}", addr.port())
        } else {
            addr.to_string()
        };
        let ca = cluster.ca_dir.as_ref().map(|d| d.join(CA_CERT_FILE));
        let trust = match &ca {
            Some(ca) => format!("--ca {} --server-name {server_name}", ca.display()),
            None => format!("--pin {pin}"),
        };
        let join = format!(
            "worker join --coordinator {coordinator} {trust} --secret-file {SECRET_FILE} --model {MODEL_FILE}"
        );
        let placeholders = BTreeMap::from([
            (
                SECRET_FILE,
                "the join secret's file ([cluster] secret_file), or `--key-file KEY` with the worker's own key (coordinator worker-key)",
            ),
            (
                MODEL_FILE,
                "the run's model file on the worker's node (the same bytes as the coordinator's)",
            ),
        ]);
        JoinHint {
            addr,
            coordinator,
            server_name,
            pin: pin.to_string(),
            ca,
            join,
            placeholders,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_name_and_ca_make_the_command() {
        let mut cluster = ClusterSettings {
            server_names: vec!["coord.example".into()],
            ..ClusterSettings::default()
        };
        let any: SocketAddr = "0.0.0.0:7443".parse().unwrap();
        let pinned = JoinHint::new(any, "ab12", &cluster);
        assert_eq!(
            pinned.join,
            "worker join --coordinator coord.example:7443 --pin ab12 --secret-file SECRET_FILE --model MODEL.gguf"
        );
        cluster.ca_dir = Some(PathBuf::from("/shared/ca"));
        let signed = JoinHint::new("10.0.0.5:7443".parse().unwrap(), "ab12", &cluster);
        assert_eq!(
            signed.join,
            "worker join --coordinator 10.0.0.5:7443 --ca /shared/ca/ca.pem --server-name coord.example --secret-file SECRET_FILE --model MODEL.gguf"
        );
        let local = JoinHint::new(any, "ab12", &ClusterSettings::default());
        assert_eq!(local.server_name, "localhost");
    }
}
