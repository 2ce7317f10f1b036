//! Streams a sliced GGUF: the header rewritten, tensor data copied through a
//! bounded buffer, the whole hashed as it is written, under a temporary name
//! renamed to the output only once complete.

use super::plan::Plan;
use super::{PruneError, Sliced};
use crate::gguf_read::GgufHeader;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Bytes copied per read: the only buffer whose size depends on the data.
const COPY_BUFFER: usize = 4 << 20;

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
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

/// Copies `len` bytes at `offset` of `src` to `w` through `buf`.
fn copy(
    src: &mut File,
    offset: u64,
    len: u64,
    buf: &mut [u8],
    w: &mut impl Write,
) -> Result<(), Side> {
    src.seek(SeekFrom::Start(offset)).map_err(Side::Read)?;
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        src.read_exact(&mut buf[..n]).map_err(Side::Read)?;
        w.write_all(&buf[..n]).map_err(Side::Write)?;
        left -= n as u64;
    }
    Ok(())
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
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    let partial = Partial {
        path: out.with_file_name(name),
        done: false,
    };
    let file = File::create(&partial.path).map_err(io_err(&partial.path))?;
    let mut w = Hashing {
        inner: BufWriter::with_capacity(1 << 20, file),
        hash: Sha256::new(),
        bytes: 0,
    };
    let result = write_all(&mut src, header, plan, &mut w);
    result.map_err(|e| match e {
        Side::Read(source) => PruneError::Io {
            path: src_path.display().to_string(),
            source,
        },
        Side::Write(source) => PruneError::Io {
            path: partial.path.display().to_string(),
            source,
        },
    })?;
    let Hashing { inner, hash, bytes } = w;
    let file = inner
        .into_inner()
        .map_err(|e| e.into_error())
        .map_err(io_err(&partial.path))?;
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

fn write_all(
    src: &mut File,
    header: &GgufHeader,
    plan: &Plan,
    w: &mut impl Write,
) -> Result<(), Side> {
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
    w.write_all(&head).map_err(Side::Write)?;
    let zeros = vec![0u8; align as usize];
    let mut buf = vec![0u8; COPY_BUFFER];
    for (t, cut) in header.tensors.iter().zip(&plan.cuts) {
        let start = header.data_offset + t.offset;
        let written = match cut {
            None => {
                copy(src, start, t.n_bytes, &mut buf, w)?;
                t.n_bytes
            }
            Some(ids) => {
                let per_expert = t.n_bytes / t.dims.last().expect("checked");
                for &id in ids {
                    copy(src, start + id as u64 * per_expert, per_expert, &mut buf, w)?;
                }
                per_expert * ids.len() as u64
            }
        };
        let pad = (written.next_multiple_of(align) - written) as usize;
        w.write_all(&zeros[..pad]).map_err(Side::Write)?;
    }
    w.flush().map_err(Side::Write)
}
