//! Trace parts in a remote object store (`s3://`, `gs://`, `az://`, `http(s)://`),
//! read by byte range: the footer once per part, then only the row groups
//! of the layer being replayed, so replay from a bucket holds one layer's
//! bytes at a time instead of every part.

use crate::ReplayError;
use bytes::Bytes;
use parquet::file::reader::{ChunkReader, Length};
use runfiles::store::RunStore;

/// Bytes fetched per footer read; a larger footer takes a second request.
const FOOTER_GUESS: u64 = 256 * 1024;

/// A remote run location (the run's own store) with an I/O runtime of its
/// own, usable from any thread.
pub struct Remote {
    store: RunStore,
    /// Always `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Remote {
    /// Shuts the I/O runtime down without blocking, so a `Remote` may be
    /// dropped inside async code too (a plain runtime drop would panic there).
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Remote {
    /// The run's store when it is remote ([`RunStore::is_remote`]); `None`
    /// for local files and in-process stores, which are read otherwise.
    pub fn open(store: &RunStore) -> Result<Option<Remote>, ReplayError> {
        if !store.is_remote() {
            return Ok(None);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|source| ReplayError::Runtime {
                runtime: "trace I/O runtime",
                source,
            })?;
        Ok(Some(Remote {
            store: store.clone(),
            runtime: Some(runtime),
        }))
    }

    /// Runs `f` to completion on the I/O runtime; call it outside async code.
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(f)
    }

    /// Size of object `name` (relative to the run).
    pub fn size(&self, name: &str) -> Result<u64, ReplayError> {
        Ok(self.block_on(self.store.size(name))?)
    }

    /// Bytes `start..end` of object `name`, wrapped so a Parquet reader sees
    /// them at their offsets in a file of `size` bytes.
    pub fn range(
        &self,
        name: &str,
        start: u64,
        end: u64,
        size: u64,
    ) -> Result<Window, ReplayError> {
        let bytes = self.block_on(self.store.get_range(name, start..end))?;
        Ok(Window {
            base: start,
            bytes,
            size,
        })
    }

    /// The tail of object `name` that holds its Parquet footer.
    pub fn footer(&self, name: &str, size: u64) -> Result<Window, ReplayError> {
        let tail = self.range(name, size.saturating_sub(FOOTER_GUESS), size, size)?;
        let n = tail.bytes.len();
        if n < 8 {
            return Err(ReplayError::FooterTooShort {
                name: name.to_string(),
            });
        }
        let len_bytes: [u8; 4] = tail.bytes[n - 8..n - 4]
            .try_into()
            .expect("a four-byte slice");
        let meta_len = u32::from_le_bytes(len_bytes) as u64;
        if meta_len + 8 <= n as u64 {
            return Ok(tail);
        }
        if meta_len + 8 > size {
            return Err(ReplayError::FooterTooLong {
                name: name.to_string(),
                footer_len: meta_len,
                size,
            });
        }
        self.range(name, size - meta_len - 8, size, size)
    }
}

/// Some bytes of a remote file at their offsets; reads outside them fail.
#[derive(Clone)]
pub struct Window {
    base: u64,
    bytes: Bytes,
    size: u64,
}

impl Window {
    fn slice(&self, start: u64, len: usize) -> parquet::errors::Result<Bytes> {
        let out_of_window = || {
            parquet::errors::ParquetError::General(format!(
                "bytes {start}..+{len} are outside the fetched range {}..{}",
                self.base,
                self.base + self.bytes.len() as u64
            ))
        };
        let from = start.checked_sub(self.base).ok_or_else(out_of_window)? as usize;
        let to = from.checked_add(len).ok_or_else(out_of_window)?;
        if to > self.bytes.len() {
            return Err(out_of_window());
        }
        Ok(self.bytes.slice(from..to))
    }
}

impl Length for Window {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for Window {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        let len = (self.base + self.bytes.len() as u64).saturating_sub(start) as usize;
        Ok(self.slice(start, len)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length)
    }
}
