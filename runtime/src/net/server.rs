//! The QUIC server: an accept loop that applies a policy table to each
//! incoming connection ([`super::slots`]), then one task per connection that
//! runs the protocol of [`common::wire`] on the connection's single stream.
//! A malformed or oversized frame, a timeout or a failed proof closes that
//! connection only.
//!
//! A connection must prove the join secret within one login deadline, with
//! frames of at most [`PRE_AUTH_MAX_FRAME`] bytes until then. Text from a
//! peer is never Debug-formatted or logged as is: names and reasons go
//! through [`peer_text`].

use super::frames::{read_frame, FrameBudget, ReadLimits};
use super::hub::Hub;
use super::slots::{Admission, Slot, Slots};
use super::tls::Identity;
use super::NetError;
use crate::lease::LeaseKind;
use common::peer_text::peer_text;
use common::wire::{
    check_proof, random_bytes, read_msg, write_msg, Refusal, ToCoordinator, ToWorker, WireError,
    WorkerId, WorkerState, NONCE_LEN, PRE_AUTH_MAX_FRAME, PROTOCOL_VERSION, RUN_FINISHED,
};
use sched::{Grant, SchedError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Application close codes.
mod code {
    /// The worker left normally.
    pub const DONE: u32 = 0;
    /// A protocol violation (malformed, oversized, unexpected message).
    pub const PROTOCOL: u32 = 1;
    /// Refused: version, proof, quarantine or run failure.
    pub const REFUSED: u32 = 2;
    /// The coordinator stopped on an error before the run finished: a
    /// worker keeps reconnecting, for a restarted coordinator to resume.
    pub const STOPPED: u32 = 3;
}

/// How long a worker waits when every unit is done but not yet stored.
const IDLE_UNTIL_STORED: Duration = Duration::from_millis(200);

/// The longest close reason sent: a CONNECTION_CLOSE frame fits one packet.
const MAX_CLOSE_REASON: usize = 512;

/// Unread bytes quinn holds per connection (flow control stops the peer
/// there): 256 connections hold at most 256 MiB before the frame budget.
const STREAM_WINDOW: u32 = 1 << 20;

/// Server limits and timeouts.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Address to listen on (`127.0.0.1:0` picks a free loopback port).
    pub listen: SocketAddr,
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// Connections from one address that may be logging in at once.
    pub max_pending_per_address: usize,
    /// Largest frame a worker may send once it has proven the secret.
    pub max_frame: u32,
    /// Bytes all joined workers' frames may hold at once ([`super::frames`]).
    pub frame_budget: usize,
    /// Time a connection has, from its arrival, to prove the join secret.
    pub login_timeout: Duration,
    /// Silence after which a joined worker's connection is closed.
    pub heartbeat_timeout: Duration,
    /// Key of the stateless resets this endpoint sends; the same key across
    /// restarts lets a new coordinator end its predecessor's connections at
    /// once ([`super::persist`]). `None`: a random one.
    pub reset_key: Option<Vec<u8>>,
    /// An address to try before `listen` (the one a predecessor used).
    pub preferred: Option<SocketAddr>,
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
}

impl Server {
    /// Binds and starts the accept loop.
    pub fn spawn<K: LeaseKind>(
        identity: &Identity,
        opts: ServerOptions,
        hub: Arc<Hub<K>>,
    ) -> Result<Server, NetError> {
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(1u8.into())
            .max_concurrent_uni_streams(0u8.into())
            // The protocol sends no datagrams: keep no buffer for them.
            .datagram_receive_buffer_size(None)
            .datagram_send_buffer_size(0)
            // What quinn buffers per connection before the frame reader
            // takes it (quinn's default is 1.25 MB).
            .stream_receive_window(STREAM_WINDOW.into())
            .max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(opts.heartbeat_timeout)
                    .map_err(|e| NetError::Tls(e.to_string()))?,
            ));
        let config = identity.server_config(transport)?;
        let endpoint_config = match &opts.reset_key {
            Some(key) => quinn::EndpointConfig::new(Arc::new(ring::hmac::Key::new(
                ring::hmac::HMAC_SHA256,
                key,
            ))),
            None => quinn::EndpointConfig::default(),
        };
        let bind_err = |source| NetError::Bind {
            addr: opts.listen,
            source,
        };
        let socket = bind(opts.listen, opts.preferred).map_err(bind_err)?;
        let runtime = Arc::new(quinn::TokioRuntime);
        let endpoint = quinn::Endpoint::new(endpoint_config, Some(config), socket, runtime)
            .map_err(bind_err)?;
        let addr = endpoint.local_addr().map_err(bind_err)?;
        tokio::spawn(accept_loop(endpoint.clone(), opts, hub));
        Ok(Server { endpoint, addr })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection: with [`RUN_FINISHED`] when `outcome` is a
    /// finished run, so workers leave; otherwise as stopped, naming the
    /// error, so they keep reconnecting for a restarted coordinator. Waits
    /// until the peers know.
    pub async fn shutdown<E: std::fmt::Display>(&self, outcome: &Result<(), E>) {
        match outcome {
            Ok(()) => self.endpoint.close(code::DONE.into(), RUN_FINISHED),
            Err(e) => {
                let why = format!("coordinator stopped: {e}");
                let end = why.floor_char_boundary(MAX_CLOSE_REASON);
                self.endpoint
                    .close(code::STOPPED.into(), &why.as_bytes()[..end]);
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
    }
}

/// A UDP socket on `preferred` if that address is free, else on `listen`.
fn bind(listen: SocketAddr, preferred: Option<SocketAddr>) -> std::io::Result<std::net::UdpSocket> {
    if let Some(addr) = preferred {
        match std::net::UdpSocket::bind(addr) {
            Ok(socket) => return Ok(socket),
            Err(e) => tracing::warn!("cannot listen on {addr} again ({e}); listening on {listen}"),
        }
    }
    std::net::UdpSocket::bind(listen)
}

async fn accept_loop<K: LeaseKind>(
    endpoint: quinn::Endpoint,
    opts: ServerOptions,
    hub: Arc<Hub<K>>,
) {
    let slots = Slots::new(opts.max_connections, opts.max_pending_per_address);
    let budget = FrameBudget::new(opts.frame_budget);
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        match slots.admit(remote.ip(), incoming.remote_address_validated()) {
            Err(Admission::Retry) => {
                if let Err(e) = incoming.retry() {
                    tracing::debug!(%remote, "retry failed: {e}");
                }
            }
            Err(why) => {
                tracing::warn!(%remote, "connection refused: {}", refusal_text(why, &opts));
                incoming.refuse();
            }
            Ok(slot) => {
                let (hub, opts, budget) = (hub.clone(), opts.clone(), budget.clone());
                let span = tracing::info_span!("conn", %remote);
                tokio::spawn(
                    async move { handle_connection(incoming, slot, &hub, &opts, &budget).await }
                        .instrument(span),
                );
            }
        }
    }
}

fn refusal_text(why: Admission, opts: &ServerOptions) -> String {
    match why {
        Admission::RefuseFull => format!("{} connections open", opts.max_connections),
        Admission::RefuseAddressBusy => format!(
            "{} connections from this address are still logging in",
            opts.max_pending_per_address
        ),
        Admission::Accept | Admission::Retry => "not refused".into(),
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

struct Stream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
}

impl Stream {
    /// Reads a message of the login exchange (the login deadline bounds it).
    async fn read_login(&mut self) -> Result<Option<ToCoordinator>, Ended> {
        Ok(read_msg(&mut self.recv, PRE_AUTH_MAX_FRAME).await?)
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

async fn handle_connection<K: LeaseKind>(
    incoming: quinn::Incoming,
    mut slot: Slot,
    hub: &Arc<Hub<K>>,
    opts: &ServerOptions,
    budget: &FrameBudget,
) {
    let deadline = tokio::time::Instant::now() + opts.login_timeout;
    let conn = match tokio::time::timeout_at(deadline, incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::info!("handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::info!("no TLS handshake within {:?}", opts.login_timeout);
            return;
        }
    };
    let joining = async {
        let (send, recv) = conn.accept_bi().await.map_err(|e| {
            Ended::new(code::DONE, format!("connection ended before a stream: {e}"))
        })?;
        let mut stream = Stream { send, recv };
        let id = login(&mut stream, hub).await?;
        Ok::<_, Ended>((stream, id))
    };
    let ended = match tokio::time::timeout_at(deadline, joining).await {
        Err(_) => Ended::new(
            code::PROTOCOL,
            format!("not logged in within {:?}", opts.login_timeout),
        ),
        Ok(Err(ended)) => ended,
        Ok(Ok((mut stream, id))) => {
            slot.logged_in();
            let ended = work(&mut stream, hub, opts, budget, id).await;
            hub.disconnect(id, &format!("connection ended: {}", ended.reason));
            ended
        }
    };
    if ended.code == code::PROTOCOL {
        tracing::warn!("closing connection: {}", ended.reason);
    } else {
        tracing::info!("connection ends: {}", ended.reason);
        // Let the worker read the last reply and close first.
        let _ = tokio::time::timeout(Duration::from_secs(3), conn.closed()).await;
    }
    conn.close(ended.code.into(), ended.reason.as_bytes());
    drop(slot);
}

/// The join exchange: `Hello`, a challenge, a valid proof; then the worker is
/// registered and receives the job.
async fn login<K: LeaseKind>(s: &mut Stream, hub: &Hub<K>) -> Result<WorkerId, Ended> {
    let (name, backend) = match s.read_login().await? {
        Some(ToCoordinator::Hello {
            protocol_version,
            worker_name,
            backend,
        }) => {
            if let Some(r) = version_refusal(protocol_version) {
                return Err(s.refuse(r).await);
            }
            (worker_name, backend)
        }
        Some(other) => {
            let why = format!("{} before Hello", other.kind());
            return Err(s.refuse(Refusal::Unexpected(why)).await);
        }
        None => return Err(Ended::new(code::PROTOCOL, "stream ended before Hello")),
    };
    let nonce = random_bytes(NONCE_LEN);
    s.send(&ToWorker::Challenge {
        nonce: nonce.clone(),
    })
    .await?;
    match s.read_login().await? {
        Some(ToCoordinator::Proof { mac }) if check_proof(hub.secret(), &nonce, &name, &mac) => {}
        Some(ToCoordinator::Proof { .. }) => {
            tracing::warn!(worker = %peer_text(&name), "join secret refused");
            return Err(s.refuse(Refusal::BadProof).await);
        }
        Some(other) => {
            let why = format!("{} instead of Proof", other.kind());
            return Err(s.refuse(Refusal::Unexpected(why)).await);
        }
        None => return Err(Ended::new(code::PROTOCOL, "stream ended before Proof")),
    }
    let (id, identity) = match hub.register(&name, &backend) {
        Ok(ids) => ids,
        Err(refusal) => {
            tracing::warn!(worker = %peer_text(&name), "{refusal}");
            return Err(s.refuse(refusal).await);
        }
    };
    tracing::info!(worker = %peer_text(&name), backend = %peer_text(&backend), %id, %identity, "worker joined");
    s.send(&hub.welcome(id)).await?;
    Ok(id)
}

/// The work loop of a joined worker; returns why the connection ended.
async fn work<K: LeaseKind>(
    s: &mut Stream,
    hub: &Arc<Hub<K>>,
    opts: &ServerOptions,
    budget: &FrameBudget,
    id: WorkerId,
) -> Ended {
    let limits = ReadLimits {
        max: opts.max_frame,
        first: opts.heartbeat_timeout,
        idle: opts.heartbeat_timeout,
    };
    loop {
        // A frame that keeps arriving (a large partial on a slow link), or
        // waits for the frame budget, counts as a heartbeat, at most once a
        // second.
        let mut beat = Instant::now();
        let read = read_frame(&mut s.recv, limits, budget, || {
            if beat.elapsed() >= Duration::from_secs(1) {
                beat = Instant::now();
                let now = hub.now();
                let _ = hub.sched().heartbeat(id, now);
            }
        })
        .await;
        // Held until the message is handled: an inline partial's bytes stay
        // counted while they are checked.
        let (msg, _held) = match read {
            Ok(Some(m)) => m,
            Ok(None) => return Ended::new(code::DONE, "the worker closed its stream"),
            Err(e) => return e.into(),
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
                hub.deliver(id, vec![lease_id], partial, sha256, elapsed_ms)
                    .await;
                quarantine_refusal(hub, id)
            }
            ToCoordinator::Checkpoint {
                leases,
                partial,
                sha256,
                elapsed_ms,
            } => {
                hub.deliver(id, leases, partial, sha256, elapsed_ms).await;
                quarantine_refusal(hub, id)
            }
            ToCoordinator::Computed { lease_id } => {
                if hub.computed(id, lease_id) {
                    tracing::debug!(%id, lease = %lease_id, "lease computed, held until its checkpoint");
                }
                quarantine_refusal(hub, id)
            }
            ToCoordinator::Failed { lease_id, reason } => {
                let reason = peer_text(&reason);
                tracing::warn!(%id, %lease_id, "worker failed a lease: {reason}");
                hub.fail(id, lease_id, &reason);
                quarantine_refusal(hub, id)
            }
            ToCoordinator::Refuse { reason } => {
                let reason = peer_text(&reason);
                tracing::error!(%id, "worker refused the job: {reason}");
                return Ended::new(
                    code::REFUSED,
                    format!("the worker refused the job: {reason}"),
                );
            }
            other @ (ToCoordinator::Hello { .. } | ToCoordinator::Proof { .. }) => {
                let why = format!("{} after joining", other.kind());
                return s.refuse(Refusal::Unexpected(why)).await;
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

/// The reply to a report: a refusal when the worker is quarantined now,
/// else an Ack.
fn quarantine_refusal<K: LeaseKind>(hub: &Hub<K>, id: WorkerId) -> ToWorker {
    hub.quarantine_refusal(id)
        .map_or(ToWorker::Ack, ToWorker::Refused)
}

fn poll_reply<K: LeaseKind>(hub: &Hub<K>, id: WorkerId, busy: bool) -> ToWorker {
    let now = hub.now();
    let mut sched = hub.sched();
    if busy {
        return match sched.heartbeat(id, now) {
            Ok(()) => ToWorker::Ack,
            Err(e) => ToWorker::Refused(sched_refusal(e)),
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
        Grant::Finished if hub.all_stored() => ToWorker::Finished,
        Grant::Finished => ToWorker::Wait {
            retry_ms: IDLE_UNTIL_STORED.as_millis() as u64,
        },
        Grant::Failed(e) => ToWorker::Refused(sched_refusal(e)),
    }
}

fn sched_refusal(e: SchedError) -> Refusal {
    match e {
        SchedError::Quarantined { why, .. } => Refusal::Quarantined(why),
        other => Refusal::RunFailed(other.to_string()),
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
