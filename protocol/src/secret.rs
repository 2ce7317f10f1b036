//! The join secret: at least [`MIN_SECRET_BYTES`] bytes that look random
//! (at least [`MIN_SECRET_BITS`] bits by their byte frequencies, so 32 equal
//! bytes or `abab...` are refused), read from a file or an environment
//! variable, and never printed (its `Debug` shows the length only), so a log
//! line or an error cannot leak it. A [`WorkerKey`] is one worker's own
//! credential, made from the join secret for one name (`coordinator
//! worker-key`): it proves that name and no other.

use std::fmt;
use std::path::Path;

/// Shortest join secret accepted: an HMAC key much shorter than its 32-byte
/// tag is guessable, and an empty one (a typo, an empty file) is no secret.
pub const MIN_SECRET_BYTES: usize = 32;

/// Least estimated entropy of a secret: its length times the Shannon entropy
/// of its byte frequencies. 64 random hex digits (what `head -c 32
/// /dev/urandom | xxd -p -c 64` writes) estimate about 240 bits; 32 equal
/// bytes 0, a two-letter pattern 32.
pub const MIN_SECRET_BITS: f64 = 80.0;

/// A join secret of at least [`MIN_SECRET_BYTES`] bytes and
/// [`MIN_SECRET_BITS`] estimated bits.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinSecret(Vec<u8>);

/// Why a secret was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The secret's source could not be read.
    #[error("join secret {source_name}: {error}")]
    Unreadable {
        /// The file or variable.
        source_name: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "join secret {source_name} holds {len} bytes; at least {MIN_SECRET_BYTES} are required \
         (e.g. `head -c 32 /dev/urandom | xxd -p -c 64 > FILE`)"
    )]
    TooShort {
        /// The file or variable.
        source_name: String,
        /// Its length after trimming whitespace.
        len: usize,
    },
    /// The secret is long enough but far from random.
    #[error(
        "join secret {source_name} is not random enough: about {bits:.0} bits by its byte \
         frequencies, at least {MIN_SECRET_BITS} are required \
         (e.g. `head -c 32 /dev/urandom | xxd -p -c 64 > FILE`)"
    )]
    Weak {
        /// The file or variable.
        source_name: String,
        /// Its estimated entropy.
        bits: f64,
    },
    /// A worker key file that is not what `coordinator worker-key` writes.
    #[error("worker key {source_name}: {why}")]
    BadKeyFile {
        /// The file.
        source_name: String,
        /// What is wrong with it.
        why: String,
    },
}

/// `len * H(byte frequencies)`: the entropy a secret would have if its
/// bytes were drawn independently from their own frequencies.
fn estimated_bits(bytes: &[u8]) -> f64 {
    let mut freq = [0usize; 256];
    for &b in bytes {
        freq[b as usize] += 1;
    }
    let n = bytes.len() as f64;
    let per_byte: f64 = freq
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum();
    per_byte * n
}

impl JoinSecret {
    /// Checks the length and the estimated entropy of `bytes` (surrounding
    /// ASCII whitespace trimmed); `source_name` names where they came from
    /// in the error.
    pub fn new(bytes: &[u8], source_name: &str) -> Result<JoinSecret, SecretError> {
        let bytes = bytes.trim_ascii();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                source_name: source_name.to_string(),
                len: bytes.len(),
            });
        }
        let bits = estimated_bits(bytes);
        if bits < MIN_SECRET_BITS {
            return Err(SecretError::Weak {
                source_name: source_name.to_string(),
                bits,
            });
        }
        Ok(JoinSecret(bytes.to_vec()))
    }

    /// Reads a secret file.
    pub fn from_file(path: &Path) -> Result<JoinSecret, SecretError> {
        let source_name = format!("file {}", path.display());
        let bytes = std::fs::read(path).map_err(|error| SecretError::Unreadable {
            source_name: source_name.clone(),
            error,
        })?;
        JoinSecret::new(&bytes, &source_name)
    }

    /// A fresh random secret (64 hex characters), for runs whose workers are
    /// all local and learn it from the coordinator.
    pub fn generate() -> JoinSecret {
        JoinSecret(hex::encode(crate::wire::random_bytes(32)).into_bytes())
    }

    /// The key bytes, for the HMAC and for handing to local workers.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for JoinSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JoinSecret(<{} bytes, redacted>)", self.0.len())
    }
}

/// A worker's own credential: its name and [`crate::wire::worker_key`] of
/// the join secret for that name. A worker given only this key (not the
/// join secret) can join under that name alone, so it cannot pose as
/// another worker or as many.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerKey {
    name: String,
    key: Vec<u8>,
}

/// What a worker key file holds (JSON).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    worker: String,
    key: String,
}

impl WorkerKey {
    /// The key of the worker `name` under the join `secret`.
    pub fn derive(secret: &JoinSecret, name: &str) -> WorkerKey {
        WorkerKey {
            name: name.to_string(),
            key: crate::wire::worker_key(secret.expose(), name),
        }
    }

    /// The worker name the key proves.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key bytes, for the join proof.
    pub fn expose(&self) -> &[u8] {
        &self.key
    }

    /// The text of a worker key file (`{"worker": NAME, "key": HEX}`).
    pub fn file_text(&self) -> String {
        let file = KeyFile {
            worker: self.name.clone(),
            key: hex::encode(&self.key),
        };
        serde_json::to_string_pretty(&file).expect("a key file encodes") + "\n"
    }

    /// Reads a worker key file written by `coordinator worker-key`.
    pub fn from_file(path: &Path) -> Result<WorkerKey, SecretError> {
        let source_name = format!("file {}", path.display());
        let bad = |why: String| SecretError::BadKeyFile {
            source_name: source_name.clone(),
            why,
        };
        let bytes = std::fs::read(path).map_err(|error| SecretError::Unreadable {
            source_name: source_name.clone(),
            error,
        })?;
        let file: KeyFile = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not a worker key file: {e}")))?;
        let key = hex::decode(file.key.trim())
            .ok()
            .filter(|k| k.len() == 32)
            .ok_or_else(|| bad("\"key\" is not 32 bytes of hex".into()))?;
        if file.worker.is_empty() {
            return Err(bad("\"worker\" is empty".into()));
        }
        Ok(WorkerKey {
            name: file.worker,
            key,
        })
    }
}

impl fmt::Debug for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerKey({:?}, <redacted>)", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_empty_secrets_are_refused_with_their_source_named() {
        for bytes in [&b""[..], b"  \n", &[b'x'; MIN_SECRET_BYTES - 1]] {
            let e = JoinSecret::new(bytes, "file /tmp/s").unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("file /tmp/s"), "{msg}");
            assert!(msg.contains("at least 32"), "{msg}");
        }
        let ok = JoinSecret::generate();
        let again = JoinSecret::new(ok.expose(), "x").unwrap();
        assert_eq!(again.expose().len(), 64);
    }

    #[test]
    fn equal_bytes_and_short_patterns_are_refused_as_weak() {
        let nul = [0u8; 32];
        let two = b"ab".repeat(32);
        for bytes in [&nul[..], &[b'k'; 48][..], &two[..]] {
            let e = JoinSecret::new(bytes, "file /tmp/s").unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, SecretError::Weak { .. }), "{msg}");
            assert!(
                msg.contains("file /tmp/s") && msg.contains("not random enough"),
                "{msg}"
            );
        }
        // 32 random bytes in hex, and a pass phrase, are fine.
        for _ in 0..1000 {
            JoinSecret::new(JoinSecret::generate().expose(), "x").unwrap();
        }
        JoinSecret::new(b"a shared join secret of at least 32 bytes", "x").unwrap();
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let s = JoinSecret::new(b"correct horse battery staple 12345", "x").unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("horse"), "{shown}");
        assert!(shown.contains("34 bytes"), "{shown}");
        assert_eq!(JoinSecret::generate().expose().len(), 64);
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = JoinSecret::from_file(Path::new("/nonexistent/secret")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/secret"), "{e}");
    }

    #[test]
    fn a_worker_key_file_round_trips_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let secret = JoinSecret::generate();
        let key = WorkerKey::derive(&secret, "gpu-07");
        assert!(!format!("{key:?}").contains(&hex::encode(key.expose())));
        let path = dir.path().join("gpu-07.key");
        std::fs::write(&path, key.file_text()).unwrap();
        assert_eq!(WorkerKey::from_file(&path).unwrap(), key);
        assert_ne!(WorkerKey::derive(&secret, "gpu-08"), key);
        for bad in ["{}", "{\"worker\": \"w\", \"key\": \"abcd\"}", "not json"] {
            std::fs::write(&path, bad).unwrap();
            let e = WorkerKey::from_file(&path).unwrap_err().to_string();
            assert!(e.contains("gpu-07.key"), "{e}");
        }
    }
}
