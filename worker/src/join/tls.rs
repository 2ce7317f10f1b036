//! How a worker trusts the coordinator. Two explicit choices, both verifying:
//! a pinned SHA-256 fingerprint of the coordinator's certificate (the
//! handshake signature is still checked against that certificate's key), or
//! the cluster CA certificate (standard WebPKI path validation and name check).

use gguf::hash::sha256_hex;
use protocol::wire::ALPN;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{
    verify_tls12_signature, verify_tls13_signature, CryptoProvider, WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::PathBuf;
use std::sync::Arc;

/// Which certificate the worker accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Exactly the certificate with this SHA-256 (lower-case hex).
    Pin(String),
    /// Any certificate for the server name signed by this CA (PEM file).
    Ca(PathBuf),
}

/// Accepts exactly the pinned certificate.
#[derive(Debug)]
struct PinVerifier {
    pin: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = sha256_hex(end_entity);
        if got == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "coordinator certificate sha256:{got} does not match the pinned sha256:{}",
                self.pin
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Silence after which a worker gives its connection up (the negotiated
/// idle timeout is the smaller of this and the coordinator's).
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A QUIC client configuration that trusts what `trust` says (TLS 1.3, ring).
pub fn client_config(trust: &Trust) -> Result<quinn::ClientConfig, String> {
    let provider: Arc<CryptoProvider> = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let mut tls = match trust {
        Trust::Pin(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinVerifier {
                pin: pin.clone(),
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        Trust::Ca(path) => {
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("CA file {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("CA file {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("CA file {}: {e}", path.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    // Keep-alives every second, and a connection that hears nothing for
    // IDLE_TIMEOUT is lost: a coordinator killed outright (no close) is
    // noticed that soon, and the worker reconnects to its successor.
    let mut transport = quinn::TransportConfig::default();
    transport
        .keep_alive_interval(Some(std::time::Duration::from_secs(1)))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("a few seconds fit"),
        ));
    cfg.transport_config(Arc::new(transport));
    Ok(cfg)
}
