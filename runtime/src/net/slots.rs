//! Connection slots: a limit on connections served at once, and per remote
//! network a limit on connections that have not proven the join secret yet,
//! so one host opening connections that never log in cannot take every slot
//! (each such connection is also closed at the login deadline). A network
//! is an IPv4 address or an IPv6 /64, the block one host is usually given:
//! 32 addresses of one /64 count as one host.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The network a login slot is counted against: an IPv4 address (also when
/// written as an IPv4-mapped IPv6 address), or the /64 of an IPv6 address.
pub fn network(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut seg = v6.segments();
                seg[4..].fill(0);
                IpAddr::V6(seg.into())
            }
        },
    }
}

/// What the accept loop does with an incoming connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it.
    Accept,
    /// Ask the client to prove its address first (stateless retry).
    Retry,
    /// Refuse it: every slot is taken.
    RefuseFull,
    /// Refuse it: its address has too many connections still logging in.
    RefuseAddressBusy,
}

/// The accept policy: refuse over the limits, validate the address, else serve.
/// `pending_here` counts the connections from the same address that have
/// not logged in yet.
pub fn admission(
    open: usize,
    max_open: usize,
    pending_here: usize,
    max_pending_per_address: usize,
    address_validated: bool,
) -> Admission {
    if open >= max_open {
        Admission::RefuseFull
    } else if pending_here >= max_pending_per_address {
        Admission::RefuseAddressBusy
    } else if !address_validated {
        Admission::Retry
    } else {
        Admission::Accept
    }
}

#[derive(Debug, Default)]
struct Counts {
    open: usize,
    pending: HashMap<IpAddr, usize>,
}

/// The server's slots, shared by the accept loop and the connection tasks.
#[derive(Debug)]
pub struct Slots {
    max_open: usize,
    max_pending_per_address: usize,
    counts: Mutex<Counts>,
}

/// One connection's slot; freed when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    ip: IpAddr,
    pending: bool,
}

impl Slots {
    /// Slots for at most `max_open` connections, of which at most
    /// `max_pending_per_address` per address may be logging in.
    pub fn new(max_open: usize, max_pending_per_address: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max_open: max_open.max(1),
            max_pending_per_address: max_pending_per_address.max(1),
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies [`admission`] to a connection from `ip`; on `Accept` the
    /// connection holds a slot, counted against its [`network`] as logging
    /// in until [`Slot::logged_in`].
    pub fn admit(self: &Arc<Self>, ip: IpAddr, address_validated: bool) -> Result<Slot, Admission> {
        let ip = network(ip);
        let mut c = self.counts();
        let pending_here = c.pending.get(&ip).copied().unwrap_or(0);
        match admission(
            c.open,
            self.max_open,
            pending_here,
            self.max_pending_per_address,
            address_validated,
        ) {
            Admission::Accept => {
                c.open += 1;
                *c.pending.entry(ip).or_insert(0) += 1;
                Ok(Slot {
                    slots: self.clone(),
                    ip,
                    pending: true,
                })
            }
            other => Err(other),
        }
    }

    /// Connections holding a slot now.
    pub fn open(&self) -> usize {
        self.counts().open
    }

    /// The per-address limit on connections logging in.
    pub fn max_pending_per_address(&self) -> usize {
        self.max_pending_per_address
    }
}

impl Slot {
    /// The connection proved the join secret: it no longer counts against its
    /// address's limit on connections logging in.
    pub fn logged_in(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.slots.release_pending(self.ip);
        }
    }
}

impl Slots {
    fn release_pending(&self, ip: IpAddr) {
        let mut c = self.counts();
        if let Some(n) = c.pending.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                c.pending.remove(&ip);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.logged_in();
        self.slots.counts().open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_policy_table() {
        assert_eq!(admission(8, 8, 0, 2, true), Admission::RefuseFull);
        assert_eq!(admission(1, 8, 2, 2, true), Admission::RefuseAddressBusy);
        assert_eq!(admission(0, 8, 0, 2, false), Admission::Retry);
        assert_eq!(admission(7, 8, 1, 2, true), Admission::Accept);
    }

    #[test]
    fn slots_count_logins_per_address_and_free_on_drop() {
        let slots = Slots::new(4, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = slots.admit(a, true).unwrap();
        let mut a2 = slots.admit(a, true).unwrap();
        assert_eq!(
            slots.admit(a, true).unwrap_err(),
            Admission::RefuseAddressBusy
        );
        let b1 = slots.admit(b, true).unwrap();
        a2.logged_in();
        let a3 = slots.admit(a, true).unwrap();
        assert_eq!(slots.admit(b, true).unwrap_err(), Admission::RefuseFull);
        drop((a1, b1));
        assert_eq!(slots.open(), 2);
        let _a4 = slots.admit(a, true).unwrap();
        drop((a2, a3));
        assert_eq!(slots.open(), 1);
    }

    #[test]
    fn addresses_of_one_ipv6_64_share_their_login_slots() {
        let slots = Slots::new(64, 2);
        let host = |i: u16| -> IpAddr { format!("2001:db8:1:2:{i:x}::1").parse().unwrap() };
        let _a = slots.admit(host(1), true).unwrap();
        let _b = slots.admit(host(2), true).unwrap();
        assert_eq!(
            slots.admit(host(3), true).unwrap_err(),
            Admission::RefuseAddressBusy,
            "a third address of the same /64 waits"
        );
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _c = slots.admit(other, true).unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.9".parse().unwrap();
        assert_eq!(network(mapped), "10.0.0.9".parse::<IpAddr>().unwrap());
    }
}
