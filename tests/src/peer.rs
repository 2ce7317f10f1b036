//! A scripted peer that speaks the coordinator-worker protocol of
//! `protocol::wire` message by message (or only part of it): the hostile,
//! broken or slow worker of the integrity tests, next to real `join`
//! clients with the deterministic fake engine.

use crate::fake_engine::FakeEngine;
use crate::loopback::{FAKE_MODEL, FAKE_N_CTX};
use numbers::partial::Partial;
use protocol::wire::{
    join_proof, read_msg, worker_key, write_msg, JobInfo, LeaseGrant, PartialRef, ToCoordinator,
    ToWorker, WorkerState, MAX_CONTROL_FRAME, PROTOCOL_VERSION,
};
use runfiles::corpus::CorpusIndex;
use runtime::run::Listening;
use std::net::SocketAddr;
use std::time::Duration;
use worker::join::tls::{client_config, Trust};

/// One pinned QUIC connection to a coordinator and its stream.
pub struct Peer {
    /// The connection.
    pub conn: quinn::Connection,
    /// The stream's sending half.
    pub send: quinn::SendStream,
    /// The stream's receiving half.
    pub recv: quinn::RecvStream,
    _endpoint: quinn::Endpoint,
}

impl Peer {
    /// Connects to `addr`, trusting the certificate pinned as `pin`.
    pub async fn open(addr: SocketAddr, pin: &str) -> Result<Peer, String> {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut cfg = client_config(&Trust::Pin(pin.into())).unwrap();
        // quinn's default idle timeout (30 s), not the worker's 5 s: a
        // scripted peer (an attacker among others) is in no hurry, and its
        // handshake may wait on a coordinator busy with hundreds of others.
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(Duration::from_secs(2)));
        cfg.transport_config(std::sync::Arc::new(transport));
        ep.set_default_client_config(cfg);
        let conn = ep
            .connect(addr, "localhost")
            .unwrap()
            .await
            .map_err(|e| e.to_string())?;
        let (send, recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        Ok(Peer {
            conn,
            send,
            recv,
            _endpoint: ep,
        })
    }

    /// Sends `msg` and reads the reply (`None` once the stream broke).
    pub async fn ask(&mut self, msg: &ToCoordinator) -> Option<ToWorker> {
        write_msg(&mut self.send, msg).await.ok()?;
        read_msg(&mut self.recv, MAX_CONTROL_FRAME).await.ok()?
    }

    /// The `Hello` of a worker called `name`.
    pub fn hello(name: &str) -> ToCoordinator {
        ToCoordinator::Hello {
            protocol_version: PROTOCOL_VERSION,
            worker_name: name.into(),
            backend: "scripted".into(),
        }
    }

    /// Hello, then a proof with the key `secret` makes for `name`; the
    /// coordinator's answer to it.
    pub async fn login_at(
        addr: SocketAddr,
        pin: &str,
        name: &str,
        secret: &[u8],
    ) -> Result<(Peer, ToWorker), String> {
        Peer::login_with_key(addr, pin, name, &worker_key(secret, name)).await
    }

    /// Hello as `name`, then a proof with the worker key `key`; the
    /// coordinator's answer to it.
    pub async fn login_with_key(
        addr: SocketAddr,
        pin: &str,
        name: &str,
        key: &[u8],
    ) -> Result<(Peer, ToWorker), String> {
        let mut p = Peer::open(addr, pin).await?;
        let Some(ToWorker::Challenge { nonce }) = p.ask(&Peer::hello(name)).await else {
            return Err("no challenge".into());
        };
        let mac = join_proof(key, &nonce, name);
        let answer = p
            .ask(&ToCoordinator::Proof { mac })
            .await
            .ok_or("no answer to the proof")?;
        Ok((p, answer))
    }

    /// [`Peer::login_at`] the listening coordinator `l`.
    pub async fn login(l: &Listening, name: &str, secret: &[u8]) -> (Peer, ToWorker) {
        Peer::login_at(l.addr, &l.pin, name, secret).await.unwrap()
    }

    /// Logs in with the run's secret and expects the job: at once, or
    /// (protocol 8: told to wait while no phase is open to it) on one of
    /// its idle polls, within a minute.
    pub async fn joined(l: &Listening, name: &str) -> (Peer, JobInfo) {
        let (mut p, mut answer) = Peer::login(l, name, l.secret.expose()).await;
        for _ in 0..600 {
            match answer {
                ToWorker::Welcome { job, .. } => return (p, *job),
                ToWorker::Wait { retry_ms } => {
                    tokio::time::sleep(std::time::Duration::from_millis(retry_ms.min(100))).await;
                    answer = p.poll_idle().await.expect("an answer to an idle poll");
                }
                other => panic!("not welcomed: {other:?}"),
            }
        }
        panic!("not welcomed within a minute: {answer:?}")
    }

    /// An idle poll (asks for a lease).
    pub async fn poll_idle(&mut self) -> Option<ToWorker> {
        self.ask(&ToCoordinator::Poll {
            protocol_version: PROTOCOL_VERSION,
            state: WorkerState::Idle,
        })
        .await
    }

    /// The reason the coordinator closed the connection with.
    pub async fn closed_reason(&self) -> String {
        tokio::time::timeout(Duration::from_secs(15), self.conn.closed())
            .await
            .expect("the coordinator closes the connection")
            .to_string()
    }

    /// The `Done` that reports `bytes` as the encoded partial of `lease`.
    pub fn done_msg(lease: &LeaseGrant, bytes: Vec<u8>) -> ToCoordinator {
        ToCoordinator::Done {
            lease_id: lease.lease_id,
            sha256: gguf::hash::sha256_hex(&bytes),
            partial: PartialRef::Inline(bytes),
            elapsed_ms: 1,
        }
    }

    /// Reports `bytes` as the encoded partial of `lease`; the reply.
    pub async fn done(&mut self, lease: &LeaseGrant, bytes: Vec<u8>) -> Option<ToWorker> {
        self.ask(&Peer::done_msg(lease, bytes)).await
    }

    /// Polls for leases and answers each with the message `answer` makes of
    /// it (a `Done`, a `Failed`), waiting when told to, until a reply is
    /// neither a lease, a wait nor an Ack; returns that reply and the leases
    /// answered. The one lease loop of every scripted worker.
    pub async fn answer_leases(
        &mut self,
        mut answer: impl FnMut(&LeaseGrant) -> ToCoordinator,
    ) -> (Option<ToWorker>, u32) {
        let mut answered = 0;
        loop {
            match self.poll_idle().await {
                Some(ToWorker::Lease(lease)) => {
                    answered += 1;
                    match self.ask(&answer(&lease)).await {
                        Some(ToWorker::Ack) => {}
                        other => return (other, answered),
                    }
                }
                Some(ToWorker::Wait { retry_ms }) => {
                    tokio::time::sleep(Duration::from_millis(retry_ms)).await
                }
                other => return (other, answered),
            }
        }
    }

    /// [`Peer::answer_leases`] reporting what `result` makes of each lease
    /// as its encoded partial.
    pub async fn work(
        &mut self,
        mut result: impl FnMut(&LeaseGrant) -> Vec<u8>,
    ) -> (Option<ToWorker>, u32) {
        self.answer_leases(|lease| Peer::done_msg(lease, result(lease)))
            .await
    }

    /// [`Peer::answer_leases`] failing every lease with `reason`.
    pub async fn fail_every_lease(&mut self, reason: &str) -> (Option<ToWorker>, u32) {
        self.answer_leases(|lease| ToCoordinator::Failed {
            lease_id: lease.lease_id,
            reason: reason.into(),
        })
        .await
    }
}

/// [`honest_partial`] with one live expert's saliency inflated, encoded:
/// Cauchy-Schwarz still holds, so only a second opinion catches the lie.
pub fn inflated_partial(index: &CorpusIndex, lease: &LeaseGrant) -> Vec<u8> {
    let mut partial = honest_partial(index, lease);
    let layer = &mut partial.experts.groups.values_mut().next().unwrap().layers[0];
    let e = layer.count.iter().position(|&c| c > 0).unwrap();
    layer.reap_l2_sum[e].0 *= 30;
    layer.reap_l2_sq_sum[e].0 *= 900;
    partial.to_bytes()
}

/// The fake engine's honest partial of `lease` over the chunks of
/// [`crate::chunks`] for `index` (the corpus of
/// [`crate::loopback::fake_setup`]).
pub fn honest_partial(index: &CorpusIndex, lease: &LeaseGrant) -> Partial {
    let chunks: Vec<_> = crate::chunks(index.n_chunks, FAKE_N_CTX)
        .into_iter()
        .filter(|c| (lease.range.start..lease.range.end).contains(&c.id.0))
        .collect();
    FakeEngine::new(FAKE_MODEL).partial(index, &chunks).unwrap()
}
