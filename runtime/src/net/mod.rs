//! The coordinator's QUIC side: TLS identity ([`tls`]) and what of it
//! survives a restart ([`persist`]), the accept loop and
//! one task per worker connection ([`server`]), connection limits
//! ([`slots`]), frames read under a shared memory budget ([`frames`]), and
//! the state those tasks share: the run's join secret and the phase being
//! served ([`lobby`]), and each phase's scheduler and job ([`hub`]).

pub mod frames;
pub mod hub;
pub mod lobby;
pub mod persist;
pub mod server;
pub mod slots;
pub mod tls;

use std::path::PathBuf;

/// Errors of the network layer.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Certificate or TLS configuration.
    #[error("TLS: {0}")]
    Tls(String),
    /// A file (CA, key, secret) could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The UDP endpoint could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}
