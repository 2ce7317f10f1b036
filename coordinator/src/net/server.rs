//! The QUIC server: an accept loop that applies a policy table to each
//! incoming connection, then one task per connection that runs the protocol
//! of [`common::wire`] on the connection's single stream. A malformed or
//! oversized frame, a timeout or a failed proof closes that connection only.

use super::hub::Hub;
use super::tls::Identity;
use super::NetError;
use crate::sched::Grant;
use common::wire::{
    check_proof, random_bytes, read_msg, write_msg, Refusal, ToCoordinator, ToWorker, WireError,
    WorkerId, WorkerState, NONCE_LEN, PROTOCOL_VERSION,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Application close codes.
mod code {
    /// The worker left normally.
    pub const DONE: u32 = 0;
    /// A protocol violation (malformed, oversized, unexpected message).
    pub const PROTOCOL: u32 = 1;
    /// Refused: version, proof or run failure.
    pub const REFUSED: u32 = 2;
}

/// Server limits and timeouts.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Address to listen on (`127.0.0.1:0` picks a free loopback port).
    pub listen: SocketAddr,
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// Largest frame a worker may send.
    pub max_frame: u32,
    /// Time a worker has to complete the join exchange.
    pub handshake_timeout: Duration,
    /// Silence after which a joined worker's connection is closed.
    pub heartbeat_timeout: Duration,
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
}

impl Server {
    /// Binds and starts the accept loop.
    pub fn spawn(
        identity: &Identity,
        opts: ServerOptions,
        hub: Arc<Hub>,
    ) -> Result<Server, NetError> {
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(1u8.into())
            .max_concurrent_uni_streams(0u8.into())
            .max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(opts.heartbeat_timeout)
                    .map_err(|e| NetError::Tls(e.to_string()))?,
            ));
        let config = identity.server_config(transport)?;
        let endpoint =
            quinn::Endpoint::server(config, opts.listen).map_err(|source| NetError::Bind {
                addr: opts.listen,
                source,
            })?;
        let addr = endpoint.local_addr().map_err(|source| NetError::Bind {
            addr: opts.listen,
            source,
        })?;
        tokio::spawn(accept_loop(endpoint.clone(), opts, hub));
        Ok(Server { endpoint, addr })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection and waits until the peers know.
    pub async fn shutdown(&self) {
        self.endpoint.close(code::DONE.into(), b"run finished");
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
    }
}

/// What the accept loop does with an incoming connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it.
    Accept,
    /// Ask the client to prove its address first (stateless retry).
    Retry,
    /// Refuse it.
    Refuse,
}

/// The accept policy: refuse over the limit, validate the address, else serve.
pub fn admission(open: usize, max: usize, address_validated: bool) -> Admission {
    if open >= max {
        Admission::Refuse
    } else if !address_validated {
        Admission::Retry
    } else {
        Admission::Accept
    }
}

async fn accept_loop(endpoint: quinn::Endpoint, opts: ServerOptions, hub: Arc<Hub>) {
    let open = Arc::new(AtomicUsize::new(0));
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        match admission(
            open.load(Ordering::Relaxed),
            opts.max_connections,
            incoming.remote_address_validated(),
        ) {
            Admission::Refuse => {
                tracing::warn!(%remote, "connection refused: {} connections open", opts.max_connections);
                incoming.refuse();
            }
            Admission::Retry => {
                if let Err(e) = incoming.retry() {
                    tracing::debug!(%remote, "retry failed: {e}");
                }
            }
            Admission::Accept => {
                let (hub, opts, open) = (hub.clone(), opts.clone(), open.clone());
                open.fetch_add(1, Ordering::Relaxed);
                let span = tracing::info_span!("conn", %remote);
                tokio::spawn(
                    async move {
                        match incoming.await {
                            Ok(conn) => handle_connection(conn, &hub, &opts).await,
                            Err(e) => tracing::info!("handshake failed: {e}"),
                        }
                        open.fetch_sub(1, Ordering::Relaxed);
                    }
                    .instrument(span),
                );
            }
        }
    }
}

/// Why a connection ended, and the close code to send.
struct Ended {
    code: u32,
    reason: String,
}

impl Ended {
    fn new(code: u32, reason: impl Into<String>) -> Ended {
        Ended {
            code,
            reason: reason.into(),
        }
    }
}

impl From<WireError> for Ended {
    fn from(e: WireError) -> Ended {
        Ended::new(code::PROTOCOL, e.to_string())
    }
}

struct Stream<'a> {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    opts: &'a ServerOptions,
}

impl Stream<'_> {
    async fn read(&mut self, timeout: Duration) -> Result<Option<ToCoordinator>, Ended> {
        match tokio::time::timeout(timeout, read_msg(&mut self.recv, self.opts.max_frame)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Ended::new(
                code::PROTOCOL,
                format!("silent for {timeout:?}"),
            )),
        }
    }

    async fn send(&mut self, msg: &ToWorker) -> Result<(), Ended> {
        Ok(write_msg(&mut self.send, msg).await?)
    }

    async fn refuse(&mut self, why: Refusal) -> Ended {
        let _ = self.send(&ToWorker::Refused(why.clone())).await;
        let _ = self.send.finish();
        Ended::new(code::REFUSED, why.to_string())
    }
}

async fn handle_connection(conn: quinn::Connection, hub: &Hub, opts: &ServerOptions) {
    let stream = match tokio::time::timeout(opts.handshake_timeout, conn.accept_bi()).await {
        Ok(Ok((send, recv))) => Stream { send, recv, opts },
        Ok(Err(e)) => {
            tracing::info!("connection ended before a stream: {e}");
            return;
        }
        Err(_) => {
            conn.close(code::PROTOCOL.into(), b"no stream opened");
            return;
        }
    };
    let mut worker = None;
    let ended = serve(stream, hub, opts, &mut worker).await;
    if let Some(id) = worker {
        hub.disconnect(id, &format!("connection ended: {}", ended.reason));
    }
    if ended.code == code::PROTOCOL {
        tracing::warn!("closing connection: {}", ended.reason);
    } else {
        tracing::info!("connection ends: {}", ended.reason);
        // Let the worker read the last reply and close first.
        let _ = tokio::time::timeout(Duration::from_secs(3), conn.closed()).await;
    }
    conn.close(ended.code.into(), ended.reason.as_bytes());
}

/// The join exchange, then the work loop; returns why the connection ended.
async fn serve(
    mut s: Stream<'_>,
    hub: &Hub,
    opts: &ServerOptions,
    joined: &mut Option<WorkerId>,
) -> Ended {
    let (name, backend) = match s.read(opts.handshake_timeout).await {
        Ok(Some(ToCoordinator::Hello {
            protocol_version,
            worker_name,
            backend,
        })) => {
            if let Some(r) = version_refusal(protocol_version) {
                return s.refuse(r).await;
            }
            (worker_name, backend)
        }
        Ok(Some(other)) => {
            return s
                .refuse(Refusal::Unexpected(format!("{other:?} before Hello")))
                .await
        }
        Ok(None) => return Ended::new(code::PROTOCOL, "stream ended before Hello"),
        Err(e) => return e,
    };
    let nonce = random_bytes(NONCE_LEN);
    if let Err(e) = s
        .send(&ToWorker::Challenge {
            nonce: nonce.clone(),
        })
        .await
    {
        return e;
    }
    match s.read(opts.handshake_timeout).await {
        Ok(Some(ToCoordinator::Proof { mac }))
            if check_proof(hub.secret(), &nonce, &name, &mac) => {}
        Ok(Some(ToCoordinator::Proof { .. })) => {
            tracing::warn!(worker = %name, "join secret refused");
            return s.refuse(Refusal::BadProof).await;
        }
        Ok(Some(other)) => {
            return s
                .refuse(Refusal::Unexpected(format!("{other:?} instead of Proof")))
                .await
        }
        Ok(None) => return Ended::new(code::PROTOCOL, "stream ended before Proof"),
        Err(e) => return e,
    }
    let id = hub.register(&name, &backend);
    *joined = Some(id);
    tracing::info!(worker = %name, %backend, %id, "worker joined");
    if let Err(e) = s
        .send(&ToWorker::Welcome {
            worker_id: id,
            job: hub.job().clone(),
        })
        .await
    {
        return e;
    }
    loop {
        let msg = match s.read(opts.heartbeat_timeout).await {
            Ok(Some(m)) => m,
            Ok(None) => return Ended::new(code::DONE, "the worker closed its stream"),
            Err(e) => return e,
        };
        let reply = match msg {
            ToCoordinator::Poll {
                protocol_version,
                state,
            } => {
                if let Some(r) = version_refusal(protocol_version) {
                    return s.refuse(r).await;
                }
                poll_reply(hub, id, state != WorkerState::Idle)
            }
            ToCoordinator::Done {
                lease_id,
                partial,
                sha256,
                elapsed_ms,
            } => {
                hub.deliver(id, lease_id, partial, sha256, elapsed_ms).await;
                ToWorker::Ack
            }
            ToCoordinator::Failed { lease_id, reason } => {
                tracing::warn!(%id, %lease_id, "worker failed a lease: {reason}");
                let now = hub.now();
                hub.sched().fail(lease_id, id, &reason, now);
                ToWorker::Ack
            }
            ToCoordinator::Refuse { reason } => {
                tracing::error!(%id, "worker refused the job: {reason}");
                return Ended::new(
                    code::REFUSED,
                    format!("the worker refused the job: {reason}"),
                );
            }
            other @ (ToCoordinator::Hello { .. } | ToCoordinator::Proof { .. }) => {
                return s
                    .refuse(Refusal::Unexpected(format!("{other:?} after joining")))
                    .await;
            }
        };
        let last = matches!(reply, ToWorker::Finished | ToWorker::Refused(_));
        if let Err(e) = s.send(&reply).await {
            return e;
        }
        if last {
            let _ = s.send.finish();
            return Ended::new(code::DONE, "no more work for this worker");
        }
    }
}

fn poll_reply(hub: &Hub, id: WorkerId, busy: bool) -> ToWorker {
    let now = hub.now();
    let mut sched = hub.sched();
    if busy {
        return match sched.heartbeat(id, now) {
            Ok(()) => ToWorker::Ack,
            Err(e) => ToWorker::Refused(Refusal::RunFailed(e.to_string())),
        };
    }
    match sched.request(id, now) {
        Grant::Lease(l) => {
            tracing::debug!(%id, lease = %l.lease_id, range = %l.range, "lease granted");
            ToWorker::Lease(l)
        }
        Grant::Wait(d) => ToWorker::Wait {
            retry_ms: d.as_millis() as u64,
        },
        Grant::Finished => ToWorker::Finished,
        Grant::Failed(e) => ToWorker::Refused(Refusal::RunFailed(e.to_string())),
    }
}

/// The refusal for a worker speaking another protocol version, checked at
/// registration and on every poll.
fn version_refusal(worker: u32) -> Option<Refusal> {
    (worker != PROTOCOL_VERSION).then_some(Refusal::Version {
        worker,
        coordinator: PROTOCOL_VERSION,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_policy_table() {
        assert_eq!(admission(8, 8, true), Admission::Refuse);
        assert_eq!(admission(0, 8, false), Admission::Retry);
        assert_eq!(admission(7, 8, true), Admission::Accept);
    }
}
