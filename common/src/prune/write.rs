//! Streams a sliced GGUF: the header rewritten, tensor data copied range by
//! range inside the kernel (`copy_file_range` where the OS has it, through a
//! buffer otherwise) while a second thread hashes the same ranges through a
//! bounded buffer, under a temporary name renamed to the output only once
//! complete.

use super::plan::Plan;
use super::{PruneError, Sliced};
use crate::gguf_read::GgufHeader;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Bytes hashed per read: the only buffer whose size depends on the data.
const HASH_BUFFER: usize = 4 << 20;

/// Pieces queued for the hashing thread before the copy waits for it.
const HASH_QUEUE: usize = 256;

/// What the output receives next, in order, for the hashing thread.
enum Piece {
    /// Bytes built in memory (header, padding).
    Bytes(Vec<u8>),
    /// A range of the source file, copied to the output by the kernel.
    Range { offset: u64, len: u64 },
}

/// SHA-256 of the output, computed on its own thread from the pieces the
/// copy writes, so hashing overlaps the copy instead of following it.
struct Hasher {
    feed: mpsc::SyncSender<Piece>,
    thread: JoinHandle<io::Result<Sha256>>,
}

impl Hasher {
    /// Starts the thread; it reads ranges from `src` by position, so the
    /// copy's own file offset is never disturbed.
    fn start(src: File) -> Hasher {
        let (feed, pieces) = mpsc::sync_channel::<Piece>(HASH_QUEUE);
        let thread = std::thread::spawn(move || {
            let mut hash = Sha256::new();
            let mut buf = vec![0u8; HASH_BUFFER];
            for piece in pieces {
                match piece {
                    Piece::Bytes(b) => hash.update(&b),
                    Piece::Range { offset, len } => {
                        let mut at = offset;
                        while at < offset + len {
                            let n = (offset + len - at).min(buf.len() as u64) as usize;
                            src.read_exact_at(&mut buf[..n], at)?;
                            hash.update(&buf[..n]);
                            at += n as u64;
                        }
                    }
                }
            }
            Ok(hash)
        });
        Hasher { feed, thread }
    }

    /// Queues a piece; a refused one means the thread stopped on a read error,
    /// which `finish` returns.
    fn push(&self, piece: Piece) -> bool {
        self.feed.send(piece).is_ok()
    }

    /// Waits for the thread and returns the hash of everything pushed.
    fn finish(self) -> io::Result<Sha256> {
        drop(self.feed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the hashing thread panicked")))
    }
}

/// The output file, with the hash and size of what was written to it.
struct Out {
    file: File,
    hasher: Hasher,
    bytes: u64,
}

impl Out {
    /// Writes bytes held in memory (header, padding).
    fn put(&mut self, b: &[u8]) -> Result<(), Side> {
        self.file.write_all(b).map_err(Side::Write)?;
        self.queue(Piece::Bytes(b.to_vec()))?;
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Appends `len` bytes at `offset` of `src`, copied file to file by
    /// `std::io::copy` (in the kernel on Linux) and hashed on the side.
    fn copy(&mut self, src: &File, offset: u64, len: u64) -> Result<(), Side> {
        let mut reader = src;
        reader.seek(SeekFrom::Start(offset)).map_err(Side::Read)?;
        let copied = io::copy(&mut reader.take(len), &mut self.file).map_err(Side::Write)?;
        if copied != len {
            return Err(Side::Read(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at offset {offset} run past the end of the file"),
            )));
        }
        self.queue(Piece::Range { offset, len })?;
        self.bytes += len;
        Ok(())
    }

    /// Hands a piece to the hashing thread; a stopped thread is a read error.
    fn queue(&mut self, piece: Piece) -> Result<(), Side> {
        if self.hasher.push(piece) {
            Ok(())
        } else {
            Err(Side::Read(io::Error::other(
                "the hashing thread stopped on a read error",
            )))
        }
    }
}

/// The temporary output; removed on drop unless it was renamed into place.
struct Partial {
    path: PathBuf,
    done: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes the slice of `src` (whose parsed header is `header`) that `plan`
/// describes to `out`.
pub(super) fn sliced(
    src_path: &Path,
    header: &GgufHeader,
    plan: &Plan,
    out: &Path,
) -> Result<Sliced, PruneError> {
    let io_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| PruneError::Io {
            path: path.clone(),
            source,
        }
    };
    let mut src = File::open(src_path).map_err(io_err(src_path))?;
    let hasher = Hasher::start(src.try_clone().map_err(io_err(src_path))?);
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    let partial = Partial {
        path: out.with_file_name(name),
        done: false,
    };
    let file = File::create(&partial.path).map_err(io_err(&partial.path))?;
    let mut w = Out {
        file,
        hasher,
        bytes: 0,
    };
    let result = write_all(&mut src, header, plan, &mut w);
    let Out {
        file,
        hasher,
        bytes,
    } = w;
    // The thread's own read error, if it stopped, names the cause better
    // than the refused queue does.
    let hash = hasher.finish();
    let result = match (result, hash) {
        (Ok(()), Ok(hash)) => Ok(hash),
        (_, Err(e)) => Err(Side::Read(e)),
        (Err(e), Ok(_)) => Err(e),
    };
    let hash = result.map_err(|e| match e {
        Side::Read(source) => PruneError::Io {
            path: src_path.display().to_string(),
            source,
        },
        Side::Write(source) => PruneError::Io {
            path: partial.path.display().to_string(),
            source,
        },
    })?;
    file.sync_all().map_err(io_err(&partial.path))?;
    drop(file);
    std::fs::rename(&partial.path, out).map_err(io_err(out))?;
    let mut partial = partial;
    partial.done = true;
    Ok(Sliced {
        sha256: hex::encode(hash.finalize()),
        bytes,
        k: plan.k,
    })
}

/// Which file an I/O error came from.
enum Side {
    Read(io::Error),
    Write(io::Error),
}

fn write_all(src: &mut File, header: &GgufHeader, plan: &Plan, w: &mut Out) -> Result<(), Side> {
    let align = header.alignment;
    // The header is built in memory (the reader bounded its size), then the
    // data is streamed.
    let mut head = Vec::new();
    head.extend(b"GGUF");
    head.extend(header.version.to_le_bytes());
    head.extend((header.tensors.len() as u64).to_le_bytes());
    head.extend((header.kv.len() as u64).to_le_bytes());
    for (i, range) in header.kv_ranges.iter().enumerate() {
        match &plan.kv_override {
            Some((j, bytes)) if *j == i => head.extend(bytes),
            _ => {
                let at = head.len();
                head.resize(at + (range.end - range.start) as usize, 0);
                src.seek(SeekFrom::Start(range.start))
                    .and_then(|_| src.read_exact(&mut head[at..]))
                    .map_err(Side::Read)?;
            }
        }
    }
    let mut offset = 0u64;
    for (t, cut) in header.tensors.iter().zip(&plan.cuts) {
        head.extend((t.name.len() as u64).to_le_bytes());
        head.extend(t.name.as_bytes());
        head.extend((t.dims.len() as u32).to_le_bytes());
        let (last, n_bytes) = match cut {
            None => (None, t.n_bytes),
            Some(ids) => {
                let n_expert = *t.dims.last().expect("an expert tensor has dimensions");
                (
                    Some(ids.len() as u64),
                    t.n_bytes / n_expert * ids.len() as u64,
                )
            }
        };
        for (i, d) in t.dims.iter().enumerate() {
            let d = if i + 1 == t.dims.len() {
                last.unwrap_or(*d)
            } else {
                *d
            };
            head.extend(d.to_le_bytes());
        }
        head.extend(t.ggml_type.to_le_bytes());
        head.extend(offset.to_le_bytes());
        offset += n_bytes.next_multiple_of(align);
    }
    head.resize(head.len().next_multiple_of(align as usize), 0);
    w.put(&head)?;
    let zeros = vec![0u8; align as usize];
    for (t, cut) in header.tensors.iter().zip(&plan.cuts) {
        let start = header.data_offset + t.offset;
        let written = match cut {
            None => {
                w.copy(src, start, t.n_bytes)?;
                t.n_bytes
            }
            Some(ids) => {
                let per_expert = t.n_bytes / t.dims.last().expect("checked");
                for &id in ids {
                    w.copy(src, start + id as u64 * per_expert, per_expert)?;
                }
                per_expert * ids.len() as u64
            }
        };
        let pad = (written.next_multiple_of(align) - written) as usize;
        w.put(&zeros[..pad])?;
    }
    Ok(())
}
