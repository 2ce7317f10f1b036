//! Property tests of the wire decoder with a fixed number of deterministic
//! random cases: random bodies, mutated valid frames and random length
//! prefixes never panic, and never make the decoder allocate more than twice
//! the pre-login frame cap (its limit tier; measured by a counting
//! allocator on the test's thread).

use protocol::wire::{
    decode, encode_frame, read_msg, LeaseId, PartialRef, ToCoordinator, ToWorker, WorkerState,
    PRE_AUTH_MAX_FRAME, PROTOCOL_VERSION,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator and remembers, per thread, the largest
/// single allocation since the last reset in [`largest_during`].
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size)
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; `note` only
// touches a const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns the largest single allocation it made on this thread.
fn largest_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

/// The project's one seeded generator: deterministic, so a failure reproduces.
type Rng = numbers::splitmix::SplitMix64;

/// `n` random bytes from `rng`.
fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// Valid bodies of every message a worker sends, the seeds of mutation.
fn seeds() -> Vec<Vec<u8>> {
    let msgs = [
        ToCoordinator::Hello {
            protocol_version: PROTOCOL_VERSION,
            worker_name: "gpu-node-17".into(),
            backend: "cuda:NVIDIA H200".into(),
        },
        ToCoordinator::Proof { mac: vec![7; 32] },
        ToCoordinator::Poll {
            protocol_version: PROTOCOL_VERSION,
            state: WorkerState::Busy(LeaseId(9)),
        },
        ToCoordinator::Done {
            lease_id: LeaseId(3),
            partial: PartialRef::Inline(vec![1; 300]),
            sha256: "ab".repeat(32),
            elapsed_ms: 12,
        },
        ToCoordinator::Done {
            lease_id: LeaseId(4),
            partial: PartialRef::Stored("partials/part-00000000-00000004.bin".into()),
            sha256: "cd".repeat(32),
            elapsed_ms: 1,
        },
        ToCoordinator::Computed {
            lease_id: LeaseId(6),
        },
        ToCoordinator::Checkpoint {
            leases: vec![LeaseId(6), LeaseId(7), LeaseId(u64::MAX)],
            partial: PartialRef::Stored("partials/part-00000000-00000012.bin".into()),
            sha256: "ef".repeat(32),
            elapsed_ms: 40,
        },
        ToCoordinator::Failed {
            lease_id: LeaseId(5),
            reason: "out of memory".into(),
        },
        ToCoordinator::Refuse {
            reason: "model differs".into(),
        },
    ];
    msgs.iter().map(|m| encode_frame(m)[4..].to_vec()).collect()
}

/// Largest allocation allowed while decoding a pre-login frame: the limit
/// tier of a 4 KiB body (twice the cap).
const BOUND: usize = 2 * PRE_AUTH_MAX_FRAME as usize;

#[test]
fn a_tiny_body_claiming_gigabytes_allocates_nothing_large() {
    // Hello, protocol 1, then a name whose varint length claims 2^31 - 1 bytes.
    let body = [0u8, 1, 0xfc, 0xff, 0xff, 0xff, 0x7f, b'a', b'b'];
    let (r, largest) = largest_during(|| decode::<ToCoordinator>(&body));
    assert!(r.is_err());
    assert!(largest <= BOUND, "{largest} bytes");
}

#[test]
fn random_bodies_never_panic_nor_allocate_beyond_the_cap() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut decoded = 0usize;
    for _ in 0..100_000 {
        let len = rng.below(PRE_AUTH_MAX_FRAME as usize + 1);
        let body = random_bytes(&mut rng, len);
        let (r, largest) = largest_during(|| decode::<ToCoordinator>(&body));
        decoded += usize::from(r.is_ok());
        assert!(largest <= BOUND, "{largest} bytes for a {len}-byte body");
        let _ = decode::<ToWorker>(&body);
    }
    // Random bytes rarely form a message; the decoder must not accept them all.
    assert!(decoded < 100_000);
}

#[test]
fn mutated_valid_frames_never_panic_nor_allocate_beyond_the_cap() {
    let seeds = seeds();
    for s in &seeds {
        decode::<ToCoordinator>(s).expect("seeds are valid");
    }
    let mut rng = Rng::new(0xdead_beef_cafe_f00d);
    let mut still_valid = 0usize;
    for _ in 0..200_000 {
        let mut body = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(5) {
                0 => {
                    let i = rng.below(body.len());
                    body[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = rng.below(body.len());
                    body[i] = [0x00, 0x7f, 0x80, 0xfb, 0xfc, 0xfd, 0xff][rng.below(7)];
                }
                2 => body.truncate(rng.below(body.len() + 1)),
                3 => {
                    let n = 1 + rng.below(16);
                    body.extend(random_bytes(&mut rng, n));
                }
                _ => {
                    let i = rng.below(body.len() + 1);
                    let n = 1 + rng.below(8);
                    let junk = random_bytes(&mut rng, n);
                    body.splice(i..i, junk);
                }
            }
            if body.is_empty() {
                break;
            }
        }
        let (r, largest) = largest_during(|| decode::<ToCoordinator>(&body));
        still_valid += usize::from(r.is_ok());
        assert!(largest <= BOUND, "{largest} bytes for {body:?}");
    }
    assert!(still_valid < 200_000);
}

#[test]
fn random_length_prefixes_are_refused_before_any_large_allocation() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut rng = Rng::new(0x0123_4567_89ab_cdef);
    for _ in 0..20_000 {
        let claimed = match rng.below(3) {
            0 => rng.next_u64() as u32,
            1 => rng.below(2 * PRE_AUTH_MAX_FRAME as usize) as u32,
            _ => u32::MAX - rng.below(16) as u32,
        };
        let mut frame = claimed.to_be_bytes().to_vec();
        let n = rng.below(64);
        frame.extend(random_bytes(&mut rng, n));
        let (r, largest) = largest_during(|| {
            rt.block_on(read_msg::<_, ToCoordinator>(
                &mut frame.as_slice(),
                PRE_AUTH_MAX_FRAME,
            ))
        });
        drop(r);
        assert!(
            largest <= BOUND,
            "{largest} bytes for a frame claiming {claimed}"
        );
    }
}
