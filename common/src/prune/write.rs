//! Streams a sliced GGUF: the header rewritten, tensor data copied range by
//! range inside the kernel (`copy_file_range` where the OS has it, through a
//! buffer otherwise) and hashed by reading the same ranges through a bounded
//! buffer, under a temporary name renamed to the output only once complete.

use super::plan::Plan;
use super::{PruneError, Sliced};
use crate::gguf_read::GgufHeader;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Bytes hashed per read: the only buffer whose size depends on the data.
const HASH_BUFFER: usize = 4 << 20;

/// The output file, with the hash and size of what was written to it.
struct Out {
    file: File,
    hash: Sha256,
    bytes: u64,
}

impl Out {
    /// Writes bytes held in memory (header, padding).
    fn put(&mut self, b: &[u8]) -> Result<(), Side> {
        self.file.write_all(b).map_err(Side::Write)?;
        self.hash.update(b);
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Appends `len` bytes at `offset` of `src`: copied file to file by
    /// `std::io::copy` (in the kernel on Linux), then hashed from `src`.
    fn copy(&mut self, src: &File, offset: u64, len: u64, buf: &mut [u8]) -> Result<(), Side> {
        let mut reader = src;
        reader.seek(SeekFrom::Start(offset)).map_err(Side::Read)?;
        let copied = io::copy(&mut reader.take(len), &mut self.file).map_err(Side::Write)?;
        if copied != len {
            return Err(Side::Read(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at offset {offset} run past the end of the file"),
            )));
        }
        reader.seek(SeekFrom::Start(offset)).map_err(Side::Read)?;
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            reader.read_exact(&mut buf[..n]).map_err(Side::Read)?;
            self.hash.update(&buf[..n]);
            left -= n as u64;
        }
        self.bytes += len;
        Ok(())
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
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    let partial = Partial {
        path: out.with_file_name(name),
        done: false,
    };
    let file = File::create(&partial.path).map_err(io_err(&partial.path))?;
    let mut w = Out {
        file,
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
    let Out { file, hash, bytes } = w;
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
    let mut buf = vec![0u8; HASH_BUFFER];
    for (t, cut) in header.tensors.iter().zip(&plan.cuts) {
        let start = header.data_offset + t.offset;
        let written = match cut {
            None => {
                w.copy(src, start, t.n_bytes, &mut buf)?;
                t.n_bytes
            }
            Some(ids) => {
                let per_expert = t.n_bytes / t.dims.last().expect("checked");
                for &id in ids {
                    w.copy(src, start + id as u64 * per_expert, per_expert, &mut buf)?;
                }
                per_expert * ids.len() as u64
            }
        };
        let pad = (written.next_multiple_of(align) - written) as usize;
        w.put(&zeros[..pad])?;
    }
    Ok(())
}
