//! Run artifacts in object storage: a run location is a local path or an
//! object-store URL (`file://`, `s3://`, `memory://`, ...). Every write is one
//! atomic object put, so a reader never sees half an artifact. A store may be
//! *fenced* ([`RunStore::fenced`]): every write first asks the fence (the
//! run's lock) whether this process may still write.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{
    GetResultPayload, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use std::sync::Arc;

/// Errors of the artifact store, naming the object involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The location string is neither a path nor a supported URL.
    #[error("run location {location:?} is not usable: {reason}")]
    BadLocation {
        /// What the user gave.
        location: String,
        /// Why it was refused.
        reason: String,
    },
    /// The object does not exist.
    #[error("{url} does not exist")]
    NotFound {
        /// Full URL of the missing object.
        url: String,
    },
    /// A create-only write found the object already there.
    #[error("{url} already exists")]
    AlreadyExists {
        /// Full URL of the object.
        url: String,
    },
    /// An object is larger than its reader accepts.
    #[error("{url} is {size} bytes, more than the {limit} bytes accepted for it")]
    TooLarge {
        /// Full URL of the object.
        url: String,
        /// Its size.
        size: u64,
        /// The reader's limit.
        limit: u64,
    },
    /// The store's fence refused the write: this process no longer holds
    /// the run.
    #[error("not writing {url}: {reason}")]
    Fenced {
        /// Full URL of the object.
        url: String,
        /// Why (the fence's words).
        reason: String,
    },
    /// Any other storage failure.
    #[error("object store error on {url}: {source}")]
    Backend {
        /// Full URL of the object.
        url: String,
        /// The underlying error.
        #[source]
        source: object_store::Error,
    },
}

/// The S3 bucket and prefix of an `s3://` URL (endpoint and credentials
/// from the environment).
#[cfg(feature = "s3")]
fn s3(url: &url::Url) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    let bucket = url
        .host_str()
        .ok_or_else(|| "s3 URL without a bucket".to_string())?;
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .build()
        .map_err(|e| e.to_string())?;
    let prefix = Path::parse(url.path().trim_start_matches('/')).map_err(|e| e.to_string())?;
    Ok((Arc::new(store), prefix))
}

/// Without the `s3` feature (a library built alone) an `s3://` URL is
/// refused: the `coordinator` and `worker` binaries have the S3 backend.
#[cfg(not(feature = "s3"))]
fn s3(_url: &url::Url) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    Err("this build has no S3 backend (the runfiles crate's `s3` feature, which the coordinator and worker binaries turn on)".into())
}

/// What a fenced store asks before each write.
pub trait Fence: Send + Sync + std::fmt::Debug {
    /// `Ok` while this process may write to the run; the error says why not.
    fn admit(&self) -> futures::future::BoxFuture<'_, Result<(), String>>;
}

/// A run's root in an object store; names below it are relative (`saliency.json`).
#[derive(Clone, Debug)]
pub struct RunStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
    fence: Option<Arc<dyn Fence>>,
}

impl RunStore {
    /// Opens a location: a URL with a scheme, or a local directory path
    /// (created if missing).
    pub fn open(location: &str) -> Result<RunStore, StoreError> {
        let bad = |reason: String| StoreError::BadLocation {
            location: location.to_string(),
            reason,
        };
        let url = if location.contains("://") {
            url::Url::parse(location).map_err(|e| bad(e.to_string()))?
        } else {
            std::fs::create_dir_all(location).map_err(|e| bad(e.to_string()))?;
            let abs = std::fs::canonicalize(location).map_err(|e| bad(e.to_string()))?;
            url::Url::from_directory_path(&abs).map_err(|_| bad("not an absolute path".into()))?
        };
        let (store, prefix): (Arc<dyn ObjectStore>, Path) = match url.scheme() {
            "s3" => s3(&url).map_err(bad)?,
            "file" => {
                let dir = url
                    .to_file_path()
                    .map_err(|_| bad("file URL is not a local path".into()))?;
                std::fs::create_dir_all(&dir).map_err(|e| bad(e.to_string()))?;
                let (store, prefix) =
                    object_store::parse_url(&url).map_err(|e| bad(e.to_string()))?;
                (Arc::from(store), prefix)
            }
            _ => {
                let (store, prefix) =
                    object_store::parse_url(&url).map_err(|e| bad(e.to_string()))?;
                (Arc::from(store), prefix)
            }
        };
        Ok(RunStore {
            store,
            prefix,
            url: url.to_string().trim_end_matches('/').to_string(),
            fence: None,
        })
    }

    /// The same location, with every write (put, create, delete) asking
    /// `fence` first; children keep the fence.
    pub fn fenced(&self, fence: Arc<dyn Fence>) -> RunStore {
        RunStore {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// The same location without a fence (for the fence's own writes).
    pub fn unfenced(&self) -> RunStore {
        RunStore {
            fence: None,
            ..self.clone()
        }
    }

    /// Asks the fence, if any, whether this process may write; `name` is
    /// the object about to be written, for the error.
    pub async fn admit(&self, name: &str) -> Result<(), StoreError> {
        match &self.fence {
            Some(f) => f.admit().await.map_err(|reason| StoreError::Fenced {
                url: self.url_of(name),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// The location as a URL without a trailing slash.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The full URL of a relative name, for messages.
    pub fn url_of(&self, name: &str) -> String {
        format!("{}/{}", self.url, name)
    }

    /// A store rooted at `name` below this one (same backend).
    pub fn child(&self, name: &str) -> RunStore {
        RunStore {
            store: self.store.clone(),
            prefix: self.path(name),
            url: self.url_of(name),
            fence: self.fence.clone(),
        }
    }

    fn path(&self, name: &str) -> Path {
        name.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.clone().join(part))
    }

    fn backend(&self, name: &str) -> impl Fn(object_store::Error) -> StoreError + '_ {
        let url = self.url_of(name);
        move |e| match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound { url: url.clone() },
            object_store::Error::AlreadyExists { .. } => {
                StoreError::AlreadyExists { url: url.clone() }
            }
            source => StoreError::Backend {
                url: url.clone(),
                source,
            },
        }
    }

    /// Writes (or replaces) an object atomically.
    pub async fn put(&self, name: &str, bytes: impl Into<Bytes>) -> Result<(), StoreError> {
        self.write(
            name,
            PutPayload::from_bytes(bytes.into()),
            PutMode::Overwrite,
        )
        .await
    }

    /// [`RunStore::put`] of the concatenation of `parts`, which are written
    /// as they are (never joined in memory).
    pub async fn put_parts(&self, name: &str, parts: Vec<Bytes>) -> Result<(), StoreError> {
        self.write(name, PutPayload::from_iter(parts), PutMode::Overwrite)
            .await
    }

    /// Writes an object only if it does not exist yet.
    pub async fn put_new(&self, name: &str, bytes: impl Into<Bytes>) -> Result<(), StoreError> {
        self.write(name, PutPayload::from_bytes(bytes.into()), PutMode::Create)
            .await
    }

    /// The one write every `put` goes through: the fence first, then the
    /// backend's write in `mode`.
    async fn write(
        &self,
        name: &str,
        payload: PutPayload,
        mode: PutMode,
    ) -> Result<(), StoreError> {
        self.admit(name).await?;
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        self.store
            .put_opts(&self.path(name), payload, opts)
            .await
            .map_err(self.backend(name))?;
        Ok(())
    }

    /// Moves `from` to `to` unless an object is at `to` (create-only, as
    /// [`RunStore::put_new`]), without the bytes crossing this process:
    /// true once moved; false, both left as they were, where the backend
    /// cannot move create-only (S3 without `AWS_COPY_IF_NOT_EXISTS`) or
    /// `from` is gone, so the caller writes the bytes itself.
    pub async fn rename_new(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.admit(to).await?;
        let (source, target) = (self.path(from), self.path(to));
        match self.store.rename_if_not_exists(&source, &target).await {
            Ok(()) => Ok(true),
            Err(
                object_store::Error::NotSupported { .. } | object_store::Error::NotFound { .. },
            ) => Ok(false),
            Err(e) => Err(self.backend(to)(e)),
        }
    }

    /// Reads a whole object.
    pub async fn get(&self, name: &str) -> Result<Bytes, StoreError> {
        let r = self
            .store
            .get(&self.path(name))
            .await
            .map_err(self.backend(name))?;
        r.bytes().await.map_err(self.backend(name))
    }

    /// Reads a whole object of at most `limit` bytes; a larger one is
    /// refused before its body is read.
    pub async fn get_limited(&self, name: &str, limit: u64) -> Result<Bytes, StoreError> {
        self.get_limited_into(name, limit, Vec::new())
            .await
            .map(Bytes::from)
    }

    /// [`RunStore::get_limited`] into `buf` (cleared first): a buffer kept
    /// from an earlier read is filled without faulting in fresh memory
    /// ([`crate::buffers`]). An object that yields more or fewer bytes than
    /// its size is refused, so `limit` bounds the memory whatever the
    /// backend streams.
    pub async fn get_limited_into(
        &self,
        name: &str,
        limit: u64,
        mut buf: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        let r = self
            .store
            .get(&self.path(name))
            .await
            .map_err(self.backend(name))?;
        if r.meta.size > limit {
            return Err(StoreError::TooLarge {
                url: self.url_of(name),
                size: r.meta.size,
                limit,
            });
        }
        let len = r.range.end - r.range.start;
        let size_error = |got: u64| {
            self.backend(name)(object_store::Error::Generic {
                store: "RunStore",
                source: format!("{got} bytes read of an object of {len} bytes").into(),
            })
        };
        buf.clear();
        buf.reserve_exact(usize::try_from(len).map_err(|_| size_error(len))?);
        match r.payload {
            GetResultPayload::File(file, _) => {
                let start = r.range.start;
                buf = tokio::task::spawn_blocking(move || read_file(file, start, len, buf))
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))
                    .and_then(|read| read)
                    .map_err(|e| {
                        self.backend(name)(object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source: Box::new(e),
                        })
                    })?;
            }
            GetResultPayload::Stream(mut chunks) => {
                while let Some(chunk) = chunks.try_next().await.map_err(self.backend(name))? {
                    if (buf.len() + chunk.len()) as u64 > len {
                        return Err(size_error((buf.len() + chunk.len()) as u64));
                    }
                    buf.extend_from_slice(&chunk);
                }
            }
        }
        if buf.len() as u64 != len {
            return Err(size_error(buf.len() as u64));
        }
        Ok(buf)
    }

    /// [`RunStore::get_limited`], `None` if the object does not exist.
    pub async fn get_opt_limited(
        &self,
        name: &str,
        limit: u64,
    ) -> Result<Option<Bytes>, StoreError> {
        match self.get_limited(name, limit).await {
            Ok(b) => Ok(Some(b)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads an object, `None` if it does not exist.
    pub async fn get_opt(&self, name: &str) -> Result<Option<Bytes>, StoreError> {
        match self.get(name).await {
            Ok(b) => Ok(Some(b)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Size in bytes of object `name` (a HEAD request on remote stores).
    pub async fn size(&self, name: &str) -> Result<u64, StoreError> {
        let meta = self
            .store
            .head(&self.path(name))
            .await
            .map_err(self.backend(name))?;
        Ok(meta.size)
    }

    /// Bytes `range` of object `name` (one ranged GET on remote stores), so
    /// a reader fetches a large file's footer and the parts it needs only
    /// (replay reads trace parts in a bucket this way).
    pub async fn get_range(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StoreError> {
        self.store
            .get_range(&self.path(name), range)
            .await
            .map_err(self.backend(name))
    }

    /// Whether objects live in a remote store (not a local directory or
    /// memory): readers then fetch ranges instead of mapping files.
    pub fn is_remote(&self) -> bool {
        !["file:", "memory:"].iter().any(|s| self.url.starts_with(s))
    }

    /// Whether an object exists.
    pub async fn exists(&self, name: &str) -> Result<bool, StoreError> {
        match self.store.head(&self.path(name)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.backend(name)(e)),
        }
    }

    /// Deletes an object if it exists.
    pub async fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.admit(name).await?;
        match self.store.delete(&self.path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend(name)(e)),
        }
    }

    /// Relative names of every object below `dir`, sorted.
    pub async fn list(&self, dir: &str) -> Result<Vec<String>, StoreError> {
        let base = self.path(dir);
        let metas: Vec<_> = self
            .store
            .list(Some(&base))
            .try_collect()
            .await
            .map_err(self.backend(dir))?;
        let strip = format!("{}/", self.prefix.as_ref());
        let mut names: Vec<String> = metas
            .into_iter()
            .map(|m| {
                let full = m.location.as_ref().to_string();
                if self.prefix.as_ref().is_empty() {
                    full
                } else {
                    full.strip_prefix(&strip).unwrap_or(&full).to_string()
                }
            })
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Appends at most `len` bytes of `file` from `start` to `buf` (with room
/// for them: read into its spare capacity, never zeroed first).
fn read_file(
    mut file: std::fs::File,
    start: u64,
    len: u64,
    mut buf: Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    file.seek(SeekFrom::Start(start))?;
    file.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Closed;

    impl Fence for Closed {
        fn admit(&self) -> futures::future::BoxFuture<'_, Result<(), String>> {
            Box::pin(async { Err("the lock was lost".to_string()) })
        }
    }

    #[tokio::test]
    async fn a_closed_fence_refuses_every_write_of_the_store_and_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let open = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        open.put("kept", b"1".to_vec()).await.unwrap();
        let fenced = open.fenced(Arc::new(Closed));
        let child = fenced.child("partials");
        for e in [
            fenced.put("a", b"2".to_vec()).await.unwrap_err(),
            fenced.put_new("b", b"2".to_vec()).await.unwrap_err(),
            fenced.delete("kept").await.unwrap_err(),
            child.put("c", b"2".to_vec()).await.unwrap_err(),
        ] {
            assert!(e.to_string().contains("the lock was lost"), "{e}");
        }
        assert_eq!(fenced.get("kept").await.unwrap(), Bytes::from_static(b"1"));
        assert_eq!(open.list("").await.unwrap(), vec!["kept"]);
        fenced.unfenced().put("d", b"3".to_vec()).await.unwrap();
    }

    #[tokio::test]
    async fn local_store_round_trips_and_create_only_refuses_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let s = RunStore::open(dir.path().join("run").to_str().unwrap()).unwrap();
        s.put("a/b.json", b"1".to_vec()).await.unwrap();
        s.put_new("a/c.json", b"2".to_vec()).await.unwrap();
        assert!(matches!(
            s.put_new("a/c.json", b"3".to_vec()).await,
            Err(StoreError::AlreadyExists { .. })
        ));
        assert_eq!(s.get("a/b.json").await.unwrap(), Bytes::from_static(b"1"));
        assert_eq!(s.list("a").await.unwrap(), vec!["a/b.json", "a/c.json"]);
        assert!(s.get_opt("missing").await.unwrap().is_none());
        assert_eq!(
            s.get_limited("a/b.json", 1).await.unwrap(),
            Bytes::from_static(b"1")
        );
        let big = s.get_limited("a/b.json", 0).await.unwrap_err().to_string();
        assert!(
            big.ends_with("/run/a/b.json is 1 bytes, more than the 0 bytes accepted for it"),
            "{big}"
        );
        let err = s.get("missing").await.unwrap_err().to_string();
        assert!(err.ends_with("/run/missing does not exist"), "{err}");
    }
}
