//! Frames of joined workers, read as their bytes arrive: a declared length
//! (up to the connection's frame limit, 64 MiB by default) costs nothing
//! until the bytes come. Past a small free allowance, a frame reserves the
//! rest of its length from one budget that all connections share before more
//! of it is read, so 256 connections each declaring 64 MiB hold a few MiB,
//! and those that really send their bytes wait their turn (the peer is held
//! back by QUIC flow control meanwhile) instead of growing the coordinator
//! without bound. A reservation is all of a frame's remainder at once, so
//! two half-read frames never wait on each other; a reserved frame must
//! then keep arriving at [`MIN_UPLOAD_BYTES_PER_S`], so no peer holds the
//! budget by trickling.

use protocol::wire::{decode, ToCoordinator, WireError};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bytes of a frame read before it must reserve the rest: a control
/// message or a small partial never waits for the budget.
pub const FREE_BYTES: usize = 256 << 10;

/// The slowest a reserved frame may arrive, on average after its
/// reservation (64 MiB in about 4 minutes).
pub const MIN_UPLOAD_BYTES_PER_S: u64 = 256 << 10;

/// Bytes read from the stream at a time.
const PIECE: usize = 64 << 10;

/// The budget is counted in KiB, so a semaphore's permits cover 4 TiB.
const UNIT: usize = 1 << 10;

/// The bytes all connections' frames may hold at once beyond their free
/// allowances.
#[derive(Clone, Debug)]
pub struct FrameBudget {
    units: Arc<Semaphore>,
    total_units: u32,
}

/// Part of the budget held by one frame until it is dropped (after the
/// message it carried was handled).
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
}

impl FrameBudget {
    /// A budget of `bytes` (at least one frame's free allowance).
    pub fn new(bytes: usize) -> FrameBudget {
        let total_units = (bytes.max(FREE_BYTES) / UNIT).min(u32::MAX as usize) as u32;
        FrameBudget {
            units: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
        }
    }

    /// Reserves `bytes` (capped at the whole budget), waiting for other
    /// frames to finish; `waiting` is called about once a second meanwhile.
    async fn reserve(&self, bytes: usize, mut waiting: impl FnMut()) -> Reservation {
        let units = (bytes.div_ceil(UNIT) as u64).min(u64::from(self.total_units)) as u32;
        let acquire = self.units.clone().acquire_many_owned(units);
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                permit = &mut acquire => {
                    let permit = permit.expect("the budget's semaphore is never closed");
                    return Reservation { _permit: permit };
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => waiting(),
            }
        }
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> usize {
        (self.total_units as usize - self.units.available_permits()) * UNIT
    }
}

/// Limits and clocks of one read.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    /// Largest frame accepted.
    pub max: u32,
    /// Time for the first bytes of the frame.
    pub first: Duration,
    /// Time for each further piece.
    pub idle: Duration,
}

/// Reads one frame and decodes it; `Ok(None)` at a clean end of stream
/// before a frame starts. `progress` is called after each piece and while
/// the frame waits for the budget, so a caller can count a slow upload that
/// keeps moving as a live peer. The reservation, if the frame needed one,
/// comes back with the message: drop it once the message is handled.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: ReadLimits,
    budget: &FrameBudget,
    mut progress: impl FnMut(),
) -> Result<Option<(ToCoordinator, Option<Reservation>)>, WireError> {
    let mut len = [0u8; 4];
    match tokio::time::timeout(limits.first, r.read_exact(&mut len)).await {
        Err(_) => return Err(WireError::Silent(limits.first)),
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Ok(Err(e)) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len);
    if len > limits.max {
        return Err(WireError::TooLarge {
            len,
            max: limits.max,
        });
    }
    let len = len as usize;
    let mut body = Vec::with_capacity(len.min(FREE_BYTES));
    let mut piece = vec![0u8; PIECE.min(len)];
    let mut reservation = None;
    let mut deadline: Option<Instant> = None;
    while body.len() < len {
        if body.len() >= FREE_BYTES && reservation.is_none() {
            let rest = len - body.len();
            reservation = Some(budget.reserve(rest, &mut progress).await);
            body.reserve_exact(rest);
            let at_min_rate = Duration::from_secs(rest as u64 / MIN_UPLOAD_BYTES_PER_S);
            deadline = Some(Instant::now() + limits.idle + at_min_rate);
        }
        let want = (len - body.len()).min(piece.len());
        let wait = match deadline {
            Some(d) => limits.idle.min(d.saturating_duration_since(Instant::now())),
            None => limits.idle,
        };
        let n = tokio::time::timeout(wait, r.read(&mut piece[..want]))
            .await
            .map_err(|_| WireError::Silent(wait))??;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        body.extend_from_slice(&piece[..n]);
        progress();
    }
    drop(piece);
    let msg = decode(&body)?;
    Ok(Some((msg, reservation)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::wire::{encode_frame, LeaseId, PartialRef};
    use tokio::io::AsyncWriteExt;

    fn done(len: usize) -> Vec<u8> {
        encode_frame(&ToCoordinator::Done {
            lease_id: LeaseId(1),
            partial: PartialRef::Inline(vec![7; len]),
            sha256: "ab".repeat(32),
            elapsed_ms: 1,
        })
    }

    const LIMITS: ReadLimits = ReadLimits {
        max: 64 << 20,
        first: Duration::from_secs(5),
        idle: Duration::from_secs(5),
    };

    #[tokio::test]
    async fn a_declared_length_costs_nothing_until_the_bytes_arrive() {
        let budget = FrameBudget::new(4 << 20);
        let (mut tx, mut rx) = tokio::io::duplex(1 << 16);
        // Declares 64 MiB, sends 100 KiB, then stops (the stream stays open).
        let (keep_open, until_dropped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tx.write_all(&(64u32 << 20).to_be_bytes()).await.unwrap();
            tx.write_all(&vec![1u8; 100 << 10]).await.unwrap();
            let _ = until_dropped.await;
        });
        let limits = ReadLimits {
            idle: Duration::from_millis(300),
            ..LIMITS
        };
        let r = read_frame(&mut rx, limits, &budget, || {}).await;
        assert!(matches!(r, Err(WireError::Silent(_))), "{r:?}");
        assert_eq!(
            budget.reserved(),
            0,
            "under the free allowance nothing is reserved"
        );
        drop(keep_open);
    }

    #[tokio::test]
    async fn a_large_frame_reserves_its_rest_and_frees_it_when_dropped() {
        let budget = FrameBudget::new(8 << 20);
        let frame = done(3 << 20);
        let (mut tx, mut rx) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(async move { tx.write_all(&frame).await.unwrap() });
        let (msg, held) = read_frame(&mut rx, LIMITS, &budget, || {})
            .await
            .unwrap()
            .unwrap();
        writer.await.unwrap();
        assert!(matches!(msg, ToCoordinator::Done { .. }));
        // The rest is reserved once the free allowance is read, which can
        // overshoot it by up to one piece.
        assert!(
            budget.reserved() >= (3 << 20) - FREE_BYTES - PIECE,
            "{}",
            budget.reserved()
        );
        drop(held);
        assert_eq!(budget.reserved(), 0);
    }

    #[tokio::test]
    async fn a_frame_waits_for_the_budget_another_frame_holds() {
        let budget = FrameBudget::new(4 << 20);
        let (mut tx1, mut rx1) = tokio::io::duplex(1 << 16);
        let (mut tx2, mut rx2) = tokio::io::duplex(1 << 16);
        let (f1, f2) = (done(3 << 20), done(3 << 20));
        tokio::spawn(async move { tx1.write_all(&f1).await });
        tokio::spawn(async move { tx2.write_all(&f2).await });
        let (_, held) = read_frame(&mut rx1, LIMITS, &budget, || {})
            .await
            .unwrap()
            .unwrap();
        let b2 = budget.clone();
        let second = tokio::spawn(async move {
            read_frame(&mut rx2, LIMITS, &b2, || {})
                .await
                .map(|m| m.is_some())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the second frame waits for the first's budget"
        );
        drop(held);
        assert!(second.await.unwrap().unwrap());
    }
}
