//! The coordinator's TLS identity. Every source is an explicit choice:
//! a generated self-signed certificate (workers pin its SHA-256
//! fingerprint), or a certificate signed by the cluster CA that
//! `coordinator ca` creates (workers trust the CA certificate).

use super::NetError;
use gguf::hash::sha256_hex;
use protocol::wire::ALPN;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the CA certificate written by `coordinator ca`.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA key written by `coordinator ca` (keep it secret).
pub const CA_KEY_FILE: &str = "ca.key";

/// The coordinator's certificate chain and key.
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity(sha256:{})", self.fingerprint())
    }
}

fn tls_err(what: &str) -> impl Fn(rcgen::Error) -> NetError + '_ {
    move |e| NetError::Tls(format!("{what}: {e}"))
}

/// The names a coordinator certificate is valid for: `localhost`, the
/// loopback addresses and whatever the config adds.
pub fn server_names(extra: &[String]) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    names.extend(extra.iter().cloned());
    names.sort();
    names.dedup();
    names
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name
        .push(DnType::CommonName, "moe-census cluster CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

impl Identity {
    /// A fresh self-signed certificate for `names`.
    pub fn self_signed(names: &[String]) -> Result<Identity, NetError> {
        let ck = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(tls_err("generating a certificate"))?;
        Ok(Identity {
            chain: vec![ck.cert.der().clone()],
            key: PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()),
        })
    }

    /// A fresh certificate for `names` signed by the cluster CA in `ca_dir`.
    pub fn from_ca(ca_dir: &Path, names: &[String]) -> Result<Identity, NetError> {
        let ca_pem = read(&ca_dir.join(CA_CERT_FILE))?;
        let key_pem = read(&ca_dir.join(CA_KEY_FILE))?;
        let ca_key = KeyPair::from_pem(&key_pem).map_err(tls_err("reading the CA key"))?;
        let ca_der = pem_cert_der(&ca_pem)?;
        let issuer = Issuer::new(ca_params(), ca_key);
        let mut params =
            CertificateParams::new(names.to_vec()).map_err(tls_err("certificate names"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "moe-census coordinator");
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(tls_err("generating a key"))?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(tls_err("signing with the CA"))?;
        Ok(Identity {
            chain: vec![cert.der().clone(), ca_der],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }

    /// A self-signed certificate and its PKCS#8 key, both DER, as
    /// the persisted coordinator identity kept them.
    pub fn from_der(cert: Vec<u8>, key: Vec<u8>) -> Identity {
        Identity {
            chain: vec![CertificateDer::from(cert)],
            key: PrivatePkcs8KeyDer::from(key),
        }
    }

    /// The PKCS#8 key, DER (secret: only for persisting the identity).
    pub fn key_der(&self) -> &[u8] {
        self.key.secret_pkcs8_der()
    }

    /// SHA-256 of the leaf certificate, the pin workers check.
    pub fn fingerprint(&self) -> String {
        sha256_hex(&self.chain[0])
    }

    /// The leaf certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.chain[0]
    }

    /// A QUIC server configuration presenting this identity (TLS 1.3,
    /// ring provider, the protocol's ALPN).
    pub fn server_config(
        &self,
        transport: quinn::TransportConfig,
    ) -> Result<quinn::ServerConfig, NetError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(
                self.chain.clone(),
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .map_err(|e| NetError::Tls(e.to_string()))?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|e| NetError::Tls(e.to_string()))?;
        let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        cfg.transport_config(Arc::new(transport));
        Ok(cfg)
    }
}

/// `coordinator ca DIR`: creates a cluster CA (`ca.pem`, `ca.key`) in `dir`;
/// refuses to overwrite an existing one. Returns the certificate's path.
pub fn create_ca(dir: &Path) -> Result<PathBuf, NetError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| NetError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
    for p in [&cert_path, &key_path] {
        if p.exists() {
            return Err(NetError::Tls(format!(
                "{} exists; refusing to replace a cluster CA",
                p.display()
            )));
        }
    }
    let key = KeyPair::generate().map_err(tls_err("generating the CA key"))?;
    let cert = ca_params()
        .self_signed(&key)
        .map_err(tls_err("signing the CA"))?;
    write_private(&key_path, key.serialize_pem().as_bytes()).map_err(io(&key_path))?;
    std::fs::write(&cert_path, cert.pem()).map_err(io(&cert_path))?;
    Ok(cert_path)
}

/// Writes a new file readable by its owner only (mode 0600).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)?.write_all(bytes)
}

fn read(path: &Path) -> Result<String, NetError> {
    std::fs::read_to_string(path).map_err(|source| NetError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The first certificate of a PEM file, DER.
pub fn pem_cert_der(pem: &str) -> Result<CertificateDer<'static>, NetError> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| NetError::Tls(format!("not a PEM certificate: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_is_created_once_and_signs_a_chain() {
        let dir = tempfile::tempdir().unwrap();
        create_ca(dir.path()).unwrap();
        let err = create_ca(dir.path()).unwrap_err().to_string();
        assert!(err.contains("refusing to replace"), "{err}");
        let id = Identity::from_ca(dir.path(), &server_names(&[])).unwrap();
        assert_eq!(id.chain.len(), 2);
        let self_signed = Identity::self_signed(&server_names(&["coord.example".into()])).unwrap();
        assert_ne!(id.fingerprint(), self_signed.fingerprint());
        assert_eq!(self_signed.fingerprint().len(), 64);
    }
}
