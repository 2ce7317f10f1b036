//! The budget one rendering of a chat template runs under, so that a model
//! file cannot hang or exhaust the corpus stage through its template:
//!
//! - fuel: at most [`FUEL`] minijinja instructions (a nested loop of 10^5 x
//!   10^5 runs out of it in about a second);
//! - output: at most [`OUTPUT_CAP`] bytes written;
//! - heap: at most [`HEAP_CAP`] bytes live on the rendering's thread (a
//!   string doubled in a loop takes exponential memory for linear fuel, so
//!   fuel alone cannot bound it). The process's global allocator
//!   ([`Metered`], installed by this crate) charges every allocation of a
//!   thread running a rendering to that rendering's [`Meter`] before it
//!   allocates; the allocation that would cross the budget never happens:
//!   the thread is stopped there for good (an allocator cannot fail without
//!   aborting the process) and the caller, waiting on it, gets the refusal.
//!   What the stopped thread holds (at most the budget) is returned when the
//!   process ends, which a refused model makes the corpus stage do.
//!
//! Every rendering runs on a thread of its own ([`run_metered`]).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Minijinja instructions one rendering may run. The published templates
/// of the test fixtures take well under 10^5 for a conversation with tools.
pub const FUEL: u64 = 20_000_000;

/// Bytes one rendering may write: 32 MiB (a JSON lines record may hold at
/// most 32 MiB, and a rendering is that record's conversation plus markup).
pub const OUTPUT_CAP: usize = 32 << 20;

/// Heap bytes one rendering's thread may hold at once: 96 MiB.
pub const HEAP_CAP: usize = 96 << 20;

/// The heap charged to one rendering, and whether it asked for more than
/// its budget.
pub struct Meter {
    live: AtomicIsize,
    cap: isize,
    exceeded: AtomicBool,
}

impl Meter {
    /// A meter with `cap` bytes to spend.
    pub fn new(cap: usize) -> Meter {
        Meter {
            live: AtomicIsize::new(0),
            cap: cap.min(isize::MAX as usize) as isize,
            exceeded: AtomicBool::new(false),
        }
    }

    /// Whether the rendering asked for more heap than its budget.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Acquire)
    }

    /// Charges `bytes`; false (and the meter marked) when that crosses the
    /// budget, in which case nothing is charged.
    fn charge(&self, bytes: usize) -> bool {
        let bytes = bytes.min(isize::MAX as usize) as isize;
        let before = self.live.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) > self.cap {
            self.live.fetch_sub(bytes, Ordering::Relaxed);
            self.exceeded.store(true, Ordering::Release);
            return false;
        }
        true
    }

    fn release(&self, bytes: usize) {
        let bytes = bytes.min(isize::MAX as usize) as isize;
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }
}

thread_local! {
    /// The meter of the rendering this thread runs, if any. A `const`
    /// initialiser without a destructor: reading it never allocates.
    static METER: Cell<*const Meter> = const { Cell::new(std::ptr::null()) };
}

/// The meter charged for this thread's allocations, if it runs a rendering.
fn current() -> Option<&'static Meter> {
    let p = METER.try_with(Cell::get).unwrap_or(std::ptr::null());
    // SAFETY: a non-null pointer is set only by `run_metered`'s thread,
    // which holds the `Arc<Meter>` it points to for as long as it is set
    // (it clears it before dropping the Arc, or never returns).
    unsafe { p.as_ref() }
}

/// Charges `bytes` to this thread's rendering, if any; past the budget the
/// thread stops here for good, before the memory is taken.
fn charge(bytes: usize) {
    if let Some(m) = current() {
        if !m.charge(bytes) {
            loop {
                // Sleeping allocates nothing; the waiting caller has seen
                // `exceeded` and refuses the template.
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}

fn release(bytes: usize) {
    if let Some(m) = current() {
        m.release(bytes);
    }
}

/// The system allocator, charging the heap of a thread that runs a chat
/// template's rendering to that rendering's [`Meter`]; other threads pay
/// one thread-local read per call.
pub struct Metered;

// SAFETY: every call is forwarded to `System` with the caller's own
// arguments; the metering only reads a thread-local and updates atomics.
unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        release(layout.size());
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            release(layout.size() - new_size);
        }
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Metered = Metered;

/// Why a metered run ended without a result.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It asked for more heap than its budget.
    Heap,
    /// Its thread could not be started, or ended in a panic.
    Failed(String),
}

/// Runs `job` on a thread of its own with at most `heap_cap` bytes of heap
/// live on it; a job that asks for more is stopped (and abandoned) before
/// it gets the memory, and [`Stopped::Heap`] returned.
pub fn run_metered<T, F>(heap_cap: usize, job: F) -> Result<T, Stopped>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let meter = Arc::new(Meter::new(heap_cap));
    let theirs = Arc::clone(&meter);
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("chat-template".into())
        .spawn(move || {
            METER.with(|m| m.set(Arc::as_ptr(&theirs)));
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            METER.with(|m| m.set(std::ptr::null()));
            // The receiver may have gone; nothing to tell then.
            let _ = tx.send(out);
            drop(theirs);
        })
        .map_err(|e| Stopped::Failed(format!("cannot start its thread ({e})")))?;
    loop {
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(Ok(out)) => return Ok(out),
            Ok(Err(_)) => return Err(Stopped::Failed("it panicked".into())),
            Err(mpsc::RecvTimeoutError::Timeout) if meter.exceeded() => return Err(Stopped::Heap),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Stopped::Failed("its thread ended without an answer".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_within_its_heap_budget_returns_and_one_past_it_is_stopped() {
        let small = run_metered(1 << 20, || vec![7u8; 1000].len()).unwrap();
        assert_eq!(small, 1000);
        // A string doubled until it would pass 8 MiB: stopped at the
        // allocation that crosses the budget, the caller told so.
        let doubled = run_metered(8 << 20, || {
            let mut s = String::from("ab");
            for _ in 0..40 {
                s = format!("{s}{s}");
            }
            s.len()
        });
        assert_eq!(doubled, Err(Stopped::Heap));
        // Freed memory is given back to the budget: 100 allocations of
        // 1 MiB, one at a time, fit in 2 MiB.
        let churn = run_metered(2 << 20, || {
            (0..100)
                .map(|i| vec![i as u8; 1 << 20][(i * 7) % (1 << 20)] as usize)
                .sum::<usize>()
        });
        assert_eq!(churn, Ok((0..100).sum()));
    }
}
