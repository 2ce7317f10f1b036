//! Trace parts in a remote object store (`s3://`, `gs://`, `az://`, `http(s)://`),
//! read by byte range: the footer once per part, then only the row groups
//! of the layer being replayed, so replay from a bucket holds one layer's
//! bytes at a time instead of every part.

use crate::ReplayError;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::file::reader::{ChunkReader, Length};
use std::sync::Arc;

/// Bytes fetched per footer read; a larger footer takes a second request.
const FOOTER_GUESS: u64 = 256 * 1024;

/// A remote run location with its own I/O runtime, usable from any thread.
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
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
    /// Opens `url` when it names a remote store; `None` for local files and
    /// in-process stores (`file://`, `memory://`), which are read otherwise.
    /// S3 settings come from the environment (`AWS_ENDPOINT`, ...), as for
    /// the run's own store.
    pub fn open(url: &str) -> Result<Option<Remote>, ReplayError> {
        let parsed = url::Url::parse(url).map_err(|source| ReplayError::BadUrl {
            url: url.to_string(),
            source,
        })?;
        let opening = |source| ReplayError::RemoteOpen {
            url: url.to_string(),
            source,
        };
        let (store, prefix): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
            "file" | "memory" => return Ok(None),
            "s3" => {
                let bucket = parsed.host_str().ok_or_else(|| ReplayError::NoBucket {
                    url: url.to_string(),
                })?;
                let store = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .map_err(opening)?;
                let prefix =
                    Path::parse(parsed.path().trim_start_matches('/')).map_err(|source| {
                        ReplayError::RemotePath {
                            url: url.to_string(),
                            source,
                        }
                    })?;
                (Arc::new(store), prefix)
            }
            _ => {
                let (store, prefix) = object_store::parse_url(&parsed).map_err(opening)?;
                (Arc::from(store), prefix)
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|source| ReplayError::Runtime {
                runtime: "trace I/O runtime",
                source,
            })?;
        Ok(Some(Remote {
            store,
            prefix,
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

    fn path(&self, name: &str) -> Path {
        name.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.clone().join(part))
    }

    /// Size of object `name` (relative to the run).
    pub fn size(&self, name: &str) -> Result<u64, ReplayError> {
        let path = self.path(name);
        let meta =
            self.block_on(self.store.head(&path))
                .map_err(|source| ReplayError::RemoteSize {
                    path: path.to_string(),
                    source,
                })?;
        Ok(meta.size)
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
        let path = self.path(name);
        let bytes = self
            .block_on(self.store.get_range(&path, start..end))
            .map_err(|source| ReplayError::RemoteRange {
                path: path.to_string(),
                start,
                end,
                source,
            })?;
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
