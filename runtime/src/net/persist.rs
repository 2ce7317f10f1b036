//! The coordinator's identity across restarts, kept in `[cluster]
//! identity_dir` (`coordinator run` defaults it to a directory beside the
//! config, one per run location): its self-signed certificate and key, so
//! the pin its workers hold stays valid; its stateless-reset key, so a
//! restarted coordinator tells the workers of its predecessor's
//! connections at once that those are gone (a QUIC stateless reset) instead
//! of letting them wait for an idle timeout; and the address it listened on,
//! which it binds again when the config fixes no port. With a cluster CA the
//! certificate is made afresh at each start (workers trust the CA), the
//! reset key and the address are kept all the same. It also keeps the salt
//! of the redundancy sample (`sched::sampled`): secret from the
//! workers, and the same for a restarted coordinator, which samples the
//! same units.
//!
//! The file holds a private key: it is written with mode 0600, and never
//! under the run location, which workers can read.

use super::tls::Identity;
use super::NetError;
use sched::SampleSalt;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// File name of the kept identity under the identity directory.
pub const IDENTITY_FILE: &str = "coordinator.json";

/// Bytes of the stateless-reset key.
const RESET_KEY_LEN: usize = 32;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Stored {
    /// Names the certificate is valid for; another set makes a new one.
    names: Vec<String>,
    /// Self-signed certificate, DER in hex (none with a cluster CA).
    cert_der: Option<String>,
    /// Its PKCS#8 key, DER in hex.
    key_der: Option<String>,
    /// Stateless-reset key, hex.
    reset_key: String,
    /// The address last listened on.
    addr: Option<SocketAddr>,
    /// Salt of the redundancy sample, hex (made at the first run that needs it).
    #[serde(default)]
    sample_salt: Option<String>,
}

/// A coordinator identity kept on disk.
#[derive(Debug)]
pub struct Kept {
    path: PathBuf,
    stored: Stored,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NetError + '_ {
    move |source| NetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad(path: &Path, why: impl std::fmt::Display) -> NetError {
    NetError::Tls(format!(
        "{}: {why}; remove it to let the coordinator make a new identity",
        path.display()
    ))
}

impl Kept {
    /// Reads the identity kept in `dir`, or starts a new one (saved by
    /// [`Kept::save`]).
    pub fn open(dir: &Path) -> Result<Kept, NetError> {
        let path = dir.join(IDENTITY_FILE);
        let stored = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| bad(&path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Stored {
                reset_key: hex::encode(protocol::wire::random_bytes(RESET_KEY_LEN)),
                ..Stored::default()
            },
            Err(e) => return Err(io(&path)(e)),
        };
        Ok(Kept { path, stored })
    }

    /// The kept self-signed certificate for `names`, or a new one (kept
    /// from now on) when there is none or it was made for other names;
    /// with `ca_dir`, a fresh certificate signed by that CA.
    pub fn identity(
        &mut self,
        names: &[String],
        ca_dir: Option<&Path>,
    ) -> Result<Identity, NetError> {
        if let Some(ca) = ca_dir {
            return Identity::from_ca(ca, names);
        }
        let s = &self.stored;
        if let (Some(cert), Some(key), true) = (&s.cert_der, &s.key_der, s.names == names) {
            let cert = hex::decode(cert).map_err(|e| bad(&self.path, e))?;
            let key = hex::decode(key).map_err(|e| bad(&self.path, e))?;
            return Ok(Identity::from_der(cert, key));
        }
        let fresh = Identity::self_signed(names)?;
        self.stored.names = names.to_vec();
        self.stored.cert_der = Some(hex::encode(fresh.cert_der()));
        self.stored.key_der = Some(hex::encode(fresh.key_der()));
        Ok(fresh)
    }

    /// The stateless-reset key.
    pub fn reset_key(&self) -> Result<Vec<u8>, NetError> {
        match hex::decode(&self.stored.reset_key) {
            Ok(k) if k.len() == RESET_KEY_LEN => Ok(k),
            _ => Err(bad(&self.path, "the reset key is not 32 bytes of hex")),
        }
    }

    /// The address to listen on for a configured `listen`: the one kept
    /// when `listen` asks for any port (0) on the same IP address.
    pub fn preferred_addr(&self, listen: SocketAddr) -> Option<SocketAddr> {
        self.stored
            .addr
            .filter(|a| listen.port() == 0 && a.ip() == listen.ip())
    }

    /// The salt of the redundancy sample: the kept one, or a new one kept
    /// from now on.
    pub fn sample_salt(&mut self) -> Result<SampleSalt, NetError> {
        let hex_salt = self
            .stored
            .sample_salt
            .get_or_insert_with(|| hex::encode(protocol::wire::random_bytes(32)));
        let bytes: [u8; 32] = hex::decode(hex_salt.as_str())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad(&self.path, "the sample salt is not 32 bytes of hex"))?;
        Ok(SampleSalt::new(bytes))
    }

    /// Records the address now listened on.
    pub fn record_addr(&mut self, addr: SocketAddr) {
        self.stored.addr = Some(addr);
    }

    /// Writes the identity (mode 0600, replaced atomically).
    pub fn save(&self) -> Result<(), NetError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = self.path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let bytes = serde_json::to_vec_pretty(&self.stored).expect("the identity encodes");
        super::tls::write_private(&tmp, &bytes).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &self.path).map_err(io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_identity_is_the_same_peer_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let names = super::super::tls::server_names(&[]);
        let mut first = Kept::open(dir.path()).unwrap();
        let id = first.identity(&names, None).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(first.preferred_addr(any), None);
        first.record_addr("127.0.0.1:40123".parse().unwrap());
        first.save().unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(IDENTITY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let mut again = Kept::open(dir.path()).unwrap();
        assert_eq!(
            again.identity(&names, None).unwrap().fingerprint(),
            id.fingerprint()
        );
        assert_eq!(again.reset_key().unwrap(), first.reset_key().unwrap());
        let salt = again.sample_salt().unwrap();
        again.save().unwrap();
        assert_eq!(Kept::open(dir.path()).unwrap().sample_salt().unwrap(), salt);
        assert_ne!(
            Kept::open(&dir.path().join("other"))
                .unwrap()
                .sample_salt()
                .unwrap(),
            salt
        );
        assert_eq!(
            again.preferred_addr(any),
            Some("127.0.0.1:40123".parse().unwrap())
        );
        let fixed: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(again.preferred_addr(fixed), None, "a configured port wins");
        let other = super::super::tls::server_names(&["coord.example".into()]);
        assert_ne!(
            again.identity(&other, None).unwrap().fingerprint(),
            id.fingerprint(),
            "other names, another certificate"
        );
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(IDENTITY_FILE), b"{not json").unwrap();
        let e = Kept::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains(IDENTITY_FILE) && e.contains("remove it"), "{e}");
    }
}
