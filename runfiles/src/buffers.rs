//! Buffers kept from one large read to the next. Reading an object of a
//! gigabyte into fresh memory costs the kernel a page fault and a zeroed
//! page every 4 KiB (about 0.9 CPU s a GB on the test VM, against 0.25 s
//! into memory already touched), so the coordinator reads the partials
//! workers stage into buffers it lends out and gets back.

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Idle read buffers, at most `keep` of them, lent out as [`Bytes`] that
/// return their buffer when the last clone is dropped.
#[derive(Debug)]
pub struct BufferPool {
    idle: Mutex<Vec<Vec<u8>>>,
    keep: usize,
    closed: AtomicBool,
}

impl BufferPool {
    /// A pool keeping at most `keep` idle buffers (the reads that may be in
    /// flight at once: more would only hold memory).
    pub fn new(keep: usize) -> Arc<BufferPool> {
        Arc::new(BufferPool {
            idle: Mutex::new(Vec::new()),
            keep,
            closed: AtomicBool::new(false),
        })
    }

    /// An empty buffer: the largest idle one, or a new one.
    pub fn take(&self) -> Vec<u8> {
        let mut idle = self.idle();
        let largest = (0..idle.len()).max_by_key(|&i| idle[i].capacity());
        let mut buf = largest.map(|i| idle.swap_remove(i)).unwrap_or_default();
        buf.clear();
        buf
    }

    /// `buf`'s bytes, lent out: the buffer comes back to the pool when the
    /// last clone of the returned [`Bytes`] is dropped.
    pub fn lend(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Lent {
            buf,
            pool: Arc::clone(self),
        })
    }

    /// Frees the idle buffers, and every buffer that comes back from now on:
    /// for when no large read is to come (the run writes its results next).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.idle().clear();
    }

    /// How many buffers are idle, and their bytes of capacity.
    #[cfg(test)]
    fn idle_figures(&self) -> (usize, usize) {
        let idle = self.idle();
        (idle.len(), idle.iter().map(Vec::capacity).sum())
    }

    fn give_back(&self, buf: Vec<u8>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let mut idle = self.idle();
        if idle.len() < self.keep {
            idle.push(buf);
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A buffer lent out as [`Bytes`].
struct Lent {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_buffer_comes_back_when_its_last_clone_drops() {
        let pool = BufferPool::new(1);
        let mut buf = pool.take();
        buf.extend_from_slice(&[7; 1 << 20]);
        let at = buf.as_ptr();
        let bytes = pool.lend(buf);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.idle_figures().0, 0, "a clone still holds it");
        assert_eq!(&slice[..], &[7; 10]);
        drop(slice);
        assert_eq!(pool.idle_figures(), (1, 1 << 20));
        let again = pool.take();
        assert!(again.is_empty());
        assert_eq!(
            (again.as_ptr(), again.capacity()),
            (at, 1 << 20),
            "the same memory"
        );
    }

    #[test]
    fn the_pool_keeps_at_most_its_number_and_nothing_once_closed() {
        let pool = BufferPool::new(2);
        let lent: Vec<Bytes> = (1..=3)
            .map(|n| pool.lend(Vec::with_capacity(n * 100)))
            .collect();
        drop(lent);
        assert_eq!(pool.idle_figures(), (2, 300));
        assert_eq!(pool.take().capacity(), 200, "the largest");
        assert_eq!(pool.take().capacity(), 100);
        assert_eq!(pool.take().capacity(), 0, "else a new one");
        drop(pool.lend(Vec::with_capacity(50)));
        assert_eq!(pool.idle_figures(), (1, 50));
        pool.close();
        assert_eq!(pool.idle_figures(), (0, 0));
        drop(pool.lend(Vec::with_capacity(50)));
        assert_eq!(
            pool.idle_figures(),
            (0, 0),
            "closed: given back buffers are freed"
        );
    }
}
