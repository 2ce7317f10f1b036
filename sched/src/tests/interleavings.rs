//! A seeded random driver: many workers grant, compute, hold, deliver,
//! fail, go silent, reconnect and let leases expire (which quarantines
//! them) in random interleavings; then every worker turns honest. No call
//! may panic, no unit may be accepted twice, and every unit completes.

use super::*;

/// SplitMix64: a small deterministic generator (no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One identity's connection as the driver sees it.
#[derive(Default)]
struct Conn {
    worker: Option<WorkerId>,
    computing: Option<LeaseGrant>,
    held: Vec<LeaseGrant>,
}

/// The driver's state: the scheduler, the connections per identity and
/// every range accepted so far.
struct Driver {
    s: Scheduler,
    conns: Vec<Conn>,
    next_worker: u64,
    now: Duration,
    accepted: BTreeSet<ChunkRange>,
}

impl Driver {
    fn new(identities: usize, units: Vec<ChunkRange>, verify_fraction: f64) -> Driver {
        let config = SchedConfig {
            // More attempts than identities: a unit never fails the run.
            max_attempts: identities as u32 + 1,
            verify_fraction,
            no_worker_grace: Duration::from_secs(1 << 30),
            ..cfg()
        };
        Driver {
            s: Scheduler::new(config, units, &BTreeMap::new()),
            conns: (0..identities).map(|_| Conn::default()).collect(),
            next_worker: 1,
            now: Duration::ZERO,
            accepted: BTreeSet::new(),
        }
    }

    /// The connection of identity `i`, opened anew when the scheduler
    /// dropped the old one (silence) or there was none.
    fn worker(&mut self, i: usize) -> WorkerId {
        let identity = Identity(i as u64 + 1);
        if let Some(w) = self.conns[i].worker {
            if self.s.identity_of(w).is_some() {
                return w;
            }
        }
        let w = WorkerId(self.next_worker);
        self.next_worker += 1;
        self.s.register(w, identity, self.now);
        self.conns[i] = Conn {
            worker: Some(w),
            ..Conn::default()
        };
        w
    }

    fn note(&mut self, c: Completion) {
        let ranges = match c {
            Completion::Accepted(r) => vec![r],
            Completion::AcceptedSet(r) => r,
            Completion::Decide(r) => {
                // Honest results hash alike: the first opinion is kept.
                let keep = self.s.units[self.unit_of(r)].opinions[0].0;
                self.s.settle(r, Verdict::Agree { keep }, self.now);
                vec![r]
            }
            _ => Vec::new(),
        };
        for r in ranges {
            assert!(self.accepted.insert(r), "{r} accepted twice");
        }
        assert_eq!(self.s.progress().done, self.accepted.len());
    }

    fn unit_of(&self, r: ChunkRange) -> usize {
        self.s.units.iter().position(|u| u.range == r).unwrap()
    }

    fn request(&mut self, i: usize) {
        let w = self.worker(i);
        if let Grant::Lease(l) = self.s.request(w, self.now) {
            self.conns[i].computing = Some(l);
        } else {
            // An idle poll gives up whatever the worker was computing.
            self.conns[i].computing = None;
        }
    }

    fn computed(&mut self, i: usize) {
        let w = self.worker(i);
        if let Some(l) = self.conns[i].computing.take() {
            if self.s.computed(l.lease_id, w, self.now) {
                self.conns[i].held.push(l);
            }
        }
    }

    /// Ships the held leases as one checkpoint, or the one being computed.
    fn deliver(&mut self, i: usize) {
        let w = self.worker(i);
        let c = &mut self.conns[i];
        let leases: Vec<LeaseGrant> = if c.held.is_empty() {
            c.computing.take().into_iter().collect()
        } else {
            std::mem::take(&mut c.held)
        };
        if leases.is_empty() {
            return;
        }
        let ids: Vec<LeaseId> = leases.iter().map(|l| l.lease_id).collect();
        let sha = match leases.as_slice() {
            [one] => sha(one.range),
            _ => format!("checkpoint-{ids:?}"),
        };
        let c = self.s.complete_set(&ids, w, &sha, self.now);
        self.note(c);
    }

    fn fail(&mut self, i: usize) {
        let w = self.worker(i);
        if let Some(l) = self.conns[i].computing.take() {
            self.s.fail(l.lease_id, w, "CUDA error", self.now);
        }
    }

    fn disconnect(&mut self, i: usize) {
        if let Some(w) = self.conns[i].worker.take() {
            self.s.disconnect(w, "connection lost");
        }
        self.conns[i] = Conn::default();
    }

    /// Time passes by `dt` (leases expire, silent workers are dropped,
    /// quarantines end).
    fn advance(&mut self, dt: Duration) {
        self.now += dt;
        self.s.tick(self.now);
    }

    /// One random action of a random identity.
    fn step(&mut self, rng: &mut Rng) {
        let i = rng.below(self.conns.len() as u64) as usize;
        match rng.below(16) {
            0..=3 => self.request(i),
            4..=6 => self.computed(i),
            7..=8 => self.deliver(i),
            9 => self.fail(i),
            10 => self.disconnect(i),
            11 => {
                let w = self.worker(i);
                let _ = self.s.heartbeat(w, self.now);
            }
            _ => {
                let dt = rng.below(16_000);
                self.advance(Duration::from_millis(dt))
            }
        }
    }

    /// Every identity turns honest: it ships what it holds, then computes
    /// and ships each lease it is granted, a second at a time, until the
    /// run is finished (quarantines run out meanwhile); whether it finished.
    fn drain(&mut self) -> bool {
        for _ in 0..100_000 {
            if self.s.is_finished() {
                return true;
            }
            assert_eq!(self.s.failure(), None);
            for i in 0..self.conns.len() {
                self.deliver(i);
                self.request(i);
                self.deliver(i);
            }
            self.advance(Duration::from_secs(1));
        }
        false
    }
}

/// Drives `seed`'s random interleaving, then drains it honestly; the
/// driver after the drain and whether the run finished.
fn run_seed(seed: u64) -> (Driver, usize, bool) {
    let mut rng = Rng(seed);
    let identities = 2 + rng.below(10) as usize;
    let units = plan(10 + rng.below(60) as u32, 1 + rng.below(3) as u32);
    let n_units = units.len();
    let verify = if seed.is_multiple_of(3) { 0.3 } else { 0.0 };
    let mut d = Driver::new(identities, units, verify);
    let steps = 200 + rng.below(800);
    for _ in 0..steps {
        d.step(&mut rng);
    }
    let finished = d.drain();
    (d, n_units, finished)
}

/// The crash of issue 42 (a quarantine during expiry removing leases the
/// expiry loop still indexed): no interleaving panics, none fails the run,
/// and no unit is accepted twice (the driver asserts it on every delivery).
#[test]
fn random_interleavings_never_panic() {
    for seed in 0..300u64 {
        let (d, n_units, _) = run_seed(seed);
        assert!(d.accepted.len() <= n_units, "seed {seed}");
        assert_eq!(d.s.failure(), None, "seed {seed}");
    }
}

/// Liveness: after any interleaving, honest workers complete every unit
/// (seed 0..300; one of them once left a sampled unit undone: its one
/// result came from an identity every other had failed it after).
#[test]
fn random_interleavings_complete_every_unit() {
    let stuck: Vec<u64> = (0..300u64).filter(|&seed| !run_seed(seed).2).collect();
    assert!(stuck.is_empty(), "seeds left unfinished: {stuck:?}");
}
