//! The QUIC server: an accept loop that applies a policy table to each
//! incoming connection ([`super::slots`]), then one task per connection that
//! runs the protocol of [`protocol::wire`] on the connection's single stream,
//! in whichever phase of the run the [`Lobby`] serves: a connection lives
//! for the whole run, moving from one phase to the next.
//! A malformed or oversized frame, a timeout or a failed proof closes that
//! connection only.
//!
//! A connection must prove the join secret within one login deadline, with
//! frames of at most [`PRE_AUTH_MAX_FRAME`] bytes until then. Text from a
//! peer is never Debug-formatted or logged as is: names and reasons go
//! through [`peer_text`].

use super::frames::{read_frame, FrameBudget, ReadLimits};
use super::hub::LeaseResult;
use super::lobby::{Lobby, Seat, IDLE_POLL};
use super::slots::{Admission, Slot, Slots};
use super::tls::Identity;
use super::NetError;
use numbers::peer_text::peer_text;
use protocol::wire::{
    check_proof, random_bytes, read_msg, write_msg, LeaseId, PartialRef, Refusal, ToCoordinator,
    ToWorker, WireError, WorkerState, NONCE_LEN, PRE_AUTH_MAX_FRAME, PROTOCOL_VERSION,
    RUN_FINISHED,
};
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
    lobby: Arc<Lobby>,
}

impl Server {
    /// Binds and starts the accept loop; joined workers serve the phases
    /// of `lobby`.
    pub fn spawn(
        identity: &Identity,
        opts: ServerOptions,
        lobby: Arc<Lobby>,
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
        tokio::spawn(accept_loop(endpoint.clone(), opts, lobby.clone()));
        Ok(Server {
            endpoint,
            addr,
            lobby,
        })
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
            Ok(()) => {
                // Idle workers poll every IDLE_POLL: they learn the run is
                // finished in-band and leave before the endpoint closes.
                self.lobby.finish();
                tokio::time::sleep(2 * IDLE_POLL).await;
                self.endpoint.close(code::DONE.into(), RUN_FINISHED)
            }
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

async fn accept_loop(endpoint: quinn::Endpoint, opts: ServerOptions, lobby: Arc<Lobby>) {
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
                let (lobby, opts, budget) = (lobby.clone(), opts.clone(), budget.clone());
                let span = tracing::info_span!("conn", %remote);
                tokio::spawn(
                    async move { handle_connection(incoming, slot, &lobby, &opts, &budget).await }
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

async fn handle_connection(
    incoming: quinn::Incoming,
    mut slot: Slot,
    lobby: &Lobby,
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
        let member = login(&mut stream, lobby).await?;
        Ok::<_, Ended>((stream, member))
    };
    let ended = match tokio::time::timeout_at(deadline, joining).await {
        Err(_) => Ended::new(
            code::PROTOCOL,
            format!("not logged in within {:?}", opts.login_timeout),
        ),
        Ok(Err(ended)) => ended,
        Ok(Ok((mut stream, mut member))) => {
            slot.logged_in();
            let ended = work(&mut stream, lobby, opts, budget, &mut member).await;
            if let Some(seat) = &member.seat {
                let reason = format!("connection ended: {}", ended.reason);
                seat.phase.disconnect(seat.id, &reason);
            }
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

/// A joined worker: its name and backend (as it sent them), and its place
/// in the phase it serves, if any.
struct Member {
    name: String,
    backend: String,
    seat: Option<Seat>,
}

impl Member {
    /// The reply when this worker is idle and its phase (if any) needs
    /// nothing more of it: the current phase's welcome, or a wait.
    fn next_phase(&mut self, lobby: &Lobby) -> ToWorker {
        let reply = lobby.next_phase(&mut self.seat, &self.name, &self.backend);
        if let ToWorker::Refused(refusal) = &reply {
            tracing::warn!(worker = %peer_text(&self.name), "{refusal}");
        }
        reply
    }
}

/// The join exchange: `Hello`, a challenge, a valid proof; then the worker
/// is welcomed into the phase being served, or told to wait for one.
async fn login(s: &mut Stream, lobby: &Lobby) -> Result<Member, Ended> {
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
        Some(ToCoordinator::Proof { mac }) if check_proof(lobby.secret(), &nonce, &name, &mac) => {}
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
    let mut member = Member {
        name,
        backend,
        seat: None,
    };
    match member.next_phase(lobby) {
        ToWorker::Refused(refusal) => Err(s.refuse(refusal).await),
        reply => {
            let (worker, backend) = (peer_text(&member.name), peer_text(&member.backend));
            // The connection's id in the phase it joined (none while it
            // waits for one), as the logs of its leases name it.
            match member.seat.as_ref().map(|seat| seat.id) {
                Some(id) => tracing::info!(%worker, %backend, %id, "worker joined"),
                None => tracing::info!(%worker, %backend, "worker joined"),
            }
            s.send(&reply).await?;
            Ok(member)
        }
    }
}

/// The work loop of a joined worker, in one phase after another; returns
/// why the connection ended.
async fn work(
    s: &mut Stream,
    lobby: &Lobby,
    opts: &ServerOptions,
    budget: &FrameBudget,
    member: &mut Member,
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
        let seat = &member.seat;
        let read = read_frame(&mut s.recv, limits, budget, || {
            if beat.elapsed() >= Duration::from_secs(1) {
                beat = Instant::now();
                if let Some(seat) = seat {
                    seat.phase.heartbeat(seat.id);
                }
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
        let reply = match (msg, &member.seat) {
            (
                ToCoordinator::Poll {
                    protocol_version,
                    state,
                },
                seat,
            ) => {
                if let Some(r) = version_refusal(protocol_version) {
                    return s.refuse(r).await;
                }
                let busy = state != WorkerState::Idle;
                match seat {
                    Some(seat) => seat.phase.poll(seat.id, busy),
                    // Nothing to heartbeat outside a phase.
                    None if busy => Some(ToWorker::Ack),
                    None => None,
                }
                .unwrap_or_else(|| member.next_phase(lobby))
            }
            (
                ToCoordinator::Done {
                    lease_id,
                    partial,
                    sha256,
                    ..
                },
                Some(seat),
            ) => deliver(seat, vec![lease_id], partial, sha256).await,
            (
                ToCoordinator::Checkpoint {
                    leases,
                    partial,
                    sha256,
                    ..
                },
                Some(seat),
            ) => deliver(seat, leases, partial, sha256).await,
            (ToCoordinator::Computed { lease_id }, Some(seat)) => {
                if seat.phase.computed(seat.id, lease_id) {
                    tracing::debug!(id = %seat.id, lease = %lease_id, "lease computed, held until its checkpoint");
                }
                quarantine_refusal(seat)
            }
            (ToCoordinator::Failed { lease_id, reason }, Some(seat)) => {
                let reason = peer_text(&reason);
                tracing::warn!(id = %seat.id, %lease_id, "worker failed a lease: {reason}");
                seat.phase.fail(seat.id, lease_id, &reason);
                quarantine_refusal(seat)
            }
            (ToCoordinator::Refuse { reason }, _) => {
                let reason = peer_text(&reason);
                tracing::error!(worker = %peer_text(&member.name), "worker refused the job: {reason}");
                return Ended::new(
                    code::REFUSED,
                    format!("the worker refused the job: {reason}"),
                );
            }
            (other @ (ToCoordinator::Hello { .. } | ToCoordinator::Proof { .. }), _) => {
                let why = format!("{} after joining", other.kind());
                return s.refuse(Refusal::Unexpected(why)).await;
            }
            // A report about a lease from a worker in no phase.
            (other, None) => {
                let why = format!("{} outside a phase", other.kind());
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
/// Hands a worker's result (of `leases`) to its phase, then answers as
/// [`quarantine_refusal`] does.
async fn deliver(
    seat: &Seat,
    leases: Vec<LeaseId>,
    partial: PartialRef,
    sha256: String,
) -> ToWorker {
    let result = LeaseResult {
        leases,
        partial,
        sha256,
    };
    Arc::clone(&seat.phase).deliver(seat.id, result).await;
    quarantine_refusal(seat)
}

fn quarantine_refusal(seat: &Seat) -> ToWorker {
    seat.phase
        .quarantine_refusal(seat.id)
        .map_or(ToWorker::Ack, ToWorker::Refused)
}

/// The refusal for a worker speaking another protocol version, checked at
/// registration and on every poll.
fn version_refusal(worker: u32) -> Option<Refusal> {
    (worker != PROTOCOL_VERSION).then_some(Refusal::Version {
        worker,
        coordinator: PROTOCOL_VERSION,
    })
}
