//! Streams a sliced GGUF: the header rewritten, tensor data copied range by
//! range (from whichever of a split model's files holds it) inside the kernel (`copy_file_range` with an explicit source
//! offset on Linux: one system call per range; `std::io::copy` elsewhere or
//! when the kernel refuses), adjacent ranges merged into one, while a second
//! thread hashes the same ranges, handed over in batches of a few MiB so
//! that it wakes a few dozen times rather than once per expert, under a
//! temporary name renamed to the output only once complete.

use super::merge::{Mean, RowCodec};
use super::plan::{Cut, Plan};
use super::{PruneError, Sliced};
use gguf::read::{GgufValue, TensorInfo};
use gguf::split::{is_split_key, Joined, TensorPlace, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Bytes hashed per read: the only buffer whose size depends on the data.
const HASH_BUFFER: usize = 4 << 20;

/// Batches queued for the hashing thread before the copy waits for it.
const HASH_QUEUE: usize = 16;

/// Bytes of output gathered into one batch before it is handed to the
/// hashing thread.
const HASH_BATCH: u64 = 2 << 20;

/// What the output receives next, in order, for the hashing thread.
enum Piece {
    /// Bytes built in memory (header, padding).
    Bytes(Vec<u8>),
    /// A range of a source file, copied to the output by the kernel.
    Range { file: usize, offset: u64, len: u64 },
}

/// SHA-256 of the output, computed on its own thread from the pieces the
/// copy writes, so hashing overlaps the copy instead of following it.
struct Hasher {
    feed: mpsc::SyncSender<Vec<Piece>>,
    thread: JoinHandle<Result<Sha256, Side>>,
}

impl Hasher {
    /// Starts the thread; it reads ranges from the source files `src` by
    /// position, so the copy's own file offsets are never disturbed.
    fn start(src: Vec<File>) -> Hasher {
        let (feed, batches) = mpsc::sync_channel::<Vec<Piece>>(HASH_QUEUE);
        let thread = std::thread::spawn(move || {
            let mut hash = Sha256::new();
            let mut buf = vec![0u8; HASH_BUFFER];
            for piece in batches.into_iter().flatten() {
                match piece {
                    Piece::Bytes(b) => hash.update(&b),
                    Piece::Range { file, offset, len } => {
                        let mut at = offset;
                        while at < offset + len {
                            let n = (offset + len - at).min(buf.len() as u64) as usize;
                            src[file]
                                .read_exact_at(&mut buf[..n], at)
                                .map_err(|e| Side::Read(file, e))?;
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

    /// Queues a batch of pieces; a refused one means the thread stopped on a
    /// read error, which `finish` returns.
    fn push(&self, batch: Vec<Piece>) -> bool {
        self.feed.send(batch).is_ok()
    }

    /// Waits for the thread and returns the hash of everything pushed.
    fn finish(self) -> Result<Sha256, Side> {
        drop(self.feed);
        self.thread.join().unwrap_or_else(|_| {
            Err(Side::Read(
                0,
                io::Error::other("the hashing thread panicked"),
            ))
        })
    }
}

/// The output file, with the hash and size of what was written to it.
struct Out {
    file: File,
    hasher: Hasher,
    /// Pieces written but not yet handed to the hasher, and their bytes.
    batch: Vec<Piece>,
    batch_bytes: u64,
    /// Set once the kernel refused `copy_file_range` for these files: the
    /// rest goes through `std::io::copy`.
    kernel_copy_refused: bool,
    bytes: u64,
}

impl Out {
    fn new(file: File, hasher: Hasher) -> Out {
        Out {
            file,
            hasher,
            batch: Vec::new(),
            batch_bytes: 0,
            kernel_copy_refused: false,
            bytes: 0,
        }
    }

    /// Writes bytes held in memory (header, padding).
    fn put(&mut self, b: &[u8]) -> Result<(), Side> {
        self.file.write_all(b).map_err(Side::Write)?;
        self.queue(Piece::Bytes(b.to_vec()))?;
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Appends the `len` bytes at `at` of the source files `src`, copied
    /// file to file in the kernel and hashed on the side.
    fn copy(&mut self, src: &[File], at: TensorPlace, len: u64) -> Result<(), Side> {
        let (file, offset) = (at.file, at.offset);
        let done = if self.kernel_copy_refused {
            0
        } else {
            self.kernel_copy(&src[file], offset, len)
                .map_err(|e| e.in_file(file))?
        };
        if done < len {
            self.std_copy(&src[file], offset + done, len - done)
                .map_err(|e| e.in_file(file))?;
        }
        self.queue(Piece::Range { file, offset, len })?;
        self.bytes += len;
        Ok(())
    }

    /// `copy_file_range` from `offset` of `src` to the output's position,
    /// until `len` bytes are copied or the kernel refuses these files
    /// (another file system, an old kernel: then it returns what it copied
    /// and remembers the refusal).
    #[cfg(target_os = "linux")]
    fn kernel_copy(&mut self, src: &File, offset: u64, len: u64) -> Result<u64, Side> {
        use rustix::io::Errno;
        let mut at = offset;
        while at < offset + len {
            let want = usize::try_from(offset + len - at).unwrap_or(usize::MAX);
            match rustix::fs::copy_file_range(src, Some(&mut at), &self.file, None, want) {
                Ok(0) => return Err(past_the_end(offset, len)),
                Ok(_) => {}
                Err(Errno::INTR) => {}
                Err(Errno::XDEV | Errno::NOSYS | Errno::OPNOTSUPP | Errno::INVAL) => {
                    self.kernel_copy_refused = true;
                    break;
                }
                Err(e) => return Err(Side::Write(e.into())),
            }
        }
        Ok(at - offset)
    }

    /// Without `copy_file_range`: nothing is copied here, `std_copy` does it.
    #[cfg(not(target_os = "linux"))]
    fn kernel_copy(&mut self, _: &File, _: u64, _: u64) -> Result<u64, Side> {
        self.kernel_copy_refused = true;
        Ok(0)
    }

    /// Appends `len` bytes at `offset` of `src` with `std::io::copy` (which
    /// picks the best way the platform has).
    fn std_copy(&mut self, src: &File, offset: u64, len: u64) -> Result<(), Side> {
        let mut reader = src;
        reader
            .seek(SeekFrom::Start(offset))
            .map_err(|e| Side::Read(0, e))?;
        let copied = io::copy(&mut reader.take(len), &mut self.file).map_err(Side::Write)?;
        if copied != len {
            return Err(past_the_end(offset, len));
        }
        Ok(())
    }

    /// Adds a piece to the batch for the hashing thread (a range that
    /// continues the previous one extends it), and hands the batch over
    /// once it holds [`HASH_BATCH`] bytes.
    fn queue(&mut self, piece: Piece) -> Result<(), Side> {
        let len = match &piece {
            Piece::Bytes(b) => b.len() as u64,
            Piece::Range { len, .. } => *len,
        };
        match (self.batch.last_mut(), piece) {
            (
                Some(Piece::Range {
                    file,
                    offset,
                    len: last,
                }),
                Piece::Range {
                    file: next_file,
                    offset: next,
                    len,
                },
            ) if *file == next_file && *offset + *last == next => *last += len,
            (_, piece) => self.batch.push(piece),
        }
        self.batch_bytes += len;
        if self.batch_bytes >= HASH_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands the gathered pieces to the hashing thread; a stopped thread is
    /// a read error.
    fn flush(&mut self) -> Result<(), Side> {
        self.batch_bytes = 0;
        if self.batch.is_empty() || self.hasher.push(std::mem::take(&mut self.batch)) {
            Ok(())
        } else {
            Err(Side::Read(
                0,
                io::Error::other("the hashing thread stopped on a read error"),
            ))
        }
    }
}

/// The error of a range that runs past the end of the source.
fn past_the_end(offset: u64, len: u64) -> Side {
    Side::Read(
        0,
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{len} bytes at offset {offset} run past the end of the file"),
        ),
    )
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

/// What one output file holds of a plan's slice.
struct Part {
    /// The source's metadata entries (indices) it copies first, with the
    /// plan's replacements: all of them in one file; in a split model's
    /// first file all but `split.*` (a file merged by `llama-gguf-split`
    /// keeps them, with a count of 0); none in its other files.
    source_kv: Vec<usize>,
    /// Encoded entries after it: the plan's added metadata (in the first
    /// file), then a split file's `split.*` keys.
    extra_kv: Vec<Vec<u8>>,
    /// Indices of the source's tensors it holds, in order (none dropped).
    tensors: Vec<usize>,
}

/// Writes the slice of the model `src` that `plan` describes to `out`.
/// Merged tensors of a type other than F32 are decoded and re-encoded by
/// `codec`.
pub(super) fn sliced(
    src: &Joined,
    plan: &Plan,
    codec: Option<&dyn RowCodec>,
    out: &Path,
) -> Result<Sliced, PruneError> {
    let part = Part {
        source_kv: (0..src.header.kv.len())
            .filter(|i| !plan.kv_dropped.contains(i))
            .collect(),
        extra_kv: plan.kv_added.clone(),
        tensors: kept(plan),
    };
    write_part(src, plan, codec, &part, out)
}

/// Bytes the slice `plan` of `src` takes as one file: the source's metadata
/// and tensor infos with the plan's added entries (the output's differ by a
/// few bytes), then each kept
/// tensor's data padded to the alignment.
pub(super) fn planned_bytes(src: &Joined, plan: &Plan) -> u64 {
    let align = src.header.alignment.max(1);
    let data: u64 = kept(plan)
        .into_iter()
        .map(|i| cut_bytes(&src.header.tensors[i], &plan.cuts[i]).div_ceil(align) * align)
        .sum();
    let added: u64 = plan.kv_added.iter().map(|e| e.len() as u64).sum();
    src.header.data_offset + added + data
}

/// Indices of the tensors the plan does not drop.
fn kept(plan: &Plan) -> Vec<usize> {
    (0..plan.cuts.len())
        .filter(|&i| plan.cuts[i] != Cut::Drop)
        .collect()
}

/// Bytes tensor `t` takes in the output under `cut`, before padding.
fn cut_bytes(t: &TensorInfo, cut: &Cut) -> u64 {
    match cut {
        Cut::Drop => 0,
        Cut::Whole => t.n_bytes,
        Cut::Experts(ids) => per_expert(t) * ids.len() as u64,
        Cut::Merged(groups) => per_expert(t) * groups.len() as u64,
    }
}

/// Bytes of one expert of the expert tensor `t`.
fn per_expert(t: &TensorInfo) -> u64 {
    t.n_bytes / t.dims.last().expect("an expert tensor has dimensions")
}

/// Writes the slice of `src` that `plan` describes as llama.cpp's
/// `gguf-split` lays a model out: files of at most `max_bytes` of tensor
/// data (each tensor padded to 32 bytes, as `gguf-split` counts), tensors
/// in order, the first file with all the metadata, every file with
/// `split.no`, `split.count` and `split.tensors.count`; file `i` of `n` at
/// `path(i, n)`. A model that fits is one file at `path(0, 1)` without
/// split keys. A tensor larger than `max_bytes` is refused before anything
/// is written; on an error the files already written are removed.
pub(super) fn split(
    src: &Joined,
    plan: &Plan,
    codec: Option<&dyn RowCodec>,
    max_bytes: u64,
    path: &dyn Fn(u16, u16) -> PathBuf,
) -> Result<Vec<(PathBuf, Sliced)>, PruneError> {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0u64;
    for i in kept(plan) {
        let t = &src.header.tensors[i];
        let n = cut_bytes(t, &plan.cuts[i]).next_multiple_of(SPLIT_ALIGNMENT);
        if n > max_bytes {
            return Err(PruneError::SplitSize {
                max_bytes,
                reason: format!(
                    "tensor {} takes {n} bytes (padded to {SPLIT_ALIGNMENT}), more than a file may hold",
                    t.name
                ),
            });
        }
        let group = groups.last_mut().expect("one group at least");
        if size + n > max_bytes && !group.is_empty() {
            groups.push(vec![i]);
            size = n;
        } else {
            group.push(i);
            size += n;
        }
    }
    let count = u16::try_from(groups.len()).map_err(|_| PruneError::SplitSize {
        max_bytes,
        reason: format!("{} files, over the 65,535 gguf-split numbers", groups.len()),
    })?;
    let total = groups.iter().map(Vec::len).sum::<usize>();
    let source_kv: Vec<usize> = (0..src.header.kv.len())
        .filter(|&i| count == 1 || !is_split_key(&src.header.kv[i].0))
        .filter(|i| !plan.kv_dropped.contains(i))
        .collect();
    let mut written: Vec<(PathBuf, Sliced)> = Vec::new();
    for (no, tensors) in (0..).zip(groups) {
        let added = match no {
            0 => plan.kv_added.clone(),
            _ => Vec::new(),
        };
        let extra_kv = match count {
            1 => added,
            _ => [
                added,
                vec![
                    super::kv::entry(SPLIT_NO, &GgufValue::U16(no)),
                    super::kv::entry(SPLIT_COUNT, &GgufValue::U16(count)),
                    super::kv::entry(
                        SPLIT_TENSORS_COUNT,
                        &GgufValue::I32(i32::try_from(total).unwrap_or(i32::MAX)),
                    ),
                ],
            ]
            .concat(),
        };
        let part = Part {
            source_kv: match no {
                0 => source_kv.clone(),
                _ => Vec::new(),
            },
            extra_kv,
            tensors,
        };
        let out = path(no, count);
        match write_part(src, plan, codec, &part, &out) {
            Ok(sliced) => written.push((out, sliced)),
            Err(e) => {
                for (done, _) in &written {
                    let _ = std::fs::remove_file(done);
                }
                return Err(e);
            }
        }
    }
    Ok(written)
}

/// The alignment of a split file without the source's metadata (no
/// `general.alignment`: GGUF's default), and the padding `gguf-split`
/// counts sizes in.
const SPLIT_ALIGNMENT: u64 = 32;

/// Writes the part `part` of the slice of `src` that `plan` describes to
/// `out`.
fn write_part(
    src: &Joined,
    plan: &Plan,
    codec: Option<&dyn RowCodec>,
    part: &Part,
    out: &Path,
) -> Result<Sliced, PruneError> {
    let io_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| PruneError::Io {
            path: path.clone(),
            source,
        }
    };
    let open = |p: &PathBuf| File::open(p).map_err(io_err(p));
    let files = src.files.iter().map(open).collect::<Result<Vec<_>, _>>()?;
    let for_hasher = src.files.iter().map(open).collect::<Result<Vec<_>, _>>()?;
    let hasher = Hasher::start(for_hasher);
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    let partial = Partial {
        path: out.with_file_name(name),
        done: false,
    };
    let file = File::create(&partial.path).map_err(io_err(&partial.path))?;
    let mut w = Out::new(file, hasher);
    let result = write_all(&files, src, plan, codec, part, &mut w).and_then(|()| w.flush());
    let Out {
        file,
        hasher,
        bytes,
        ..
    } = w;
    // The thread's own read error, if it stopped, names the cause better
    // than the refused queue does.
    let hash = hasher.finish();
    let result = match (result, hash) {
        (Ok(()), Ok(hash)) => Ok(hash),
        (_, Err(e)) | (Err(e), Ok(_)) => Err(e),
    };
    let hash = result.map_err(|e| match e {
        Side::Read(file, source) => PruneError::Io {
            path: src.files[file].display().to_string(),
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

/// Which file an I/O error came from: a source file (by its index in
/// [`Joined::files`]) or the output.
enum Side {
    Read(usize, io::Error),
    Write(io::Error),
}

impl Side {
    /// The error with a read blamed on source file `file`.
    fn in_file(self, file: usize) -> Side {
        match self {
            Side::Read(_, e) => Side::Read(file, e),
            write => write,
        }
    }
}

fn write_all(
    files: &[File],
    src: &Joined,
    plan: &Plan,
    codec: Option<&dyn RowCodec>,
    part: &Part,
    w: &mut Out,
) -> Result<(), Side> {
    let header = &src.header;
    let align = match part.source_kv.is_empty() {
        false => header.alignment,
        true => SPLIT_ALIGNMENT,
    };
    // The header is built in memory (the reader bounded its size), then the
    // data is streamed.
    let mut head = Vec::new();
    head.extend(b"GGUF");
    head.extend(header.version.to_le_bytes());
    head.extend((part.tensors.len() as u64).to_le_bytes());
    let n_kv = part.source_kv.len() + part.extra_kv.len();
    head.extend((n_kv as u64).to_le_bytes());
    for &i in &part.source_kv {
        match plan.kv_overrides.iter().find(|(j, _)| *j == i) {
            Some((_, bytes)) => head.extend(bytes),
            None => {
                let range = &header.kv_ranges[i];
                let at = head.len();
                head.resize(at + (range.end - range.start) as usize, 0);
                files[0]
                    .read_exact_at(&mut head[at..], range.start)
                    .map_err(|e| Side::Read(0, e))?;
            }
        }
    }
    for entry in &part.extra_kv {
        head.extend(entry);
    }
    let mut offset = 0u64;
    for &i in &part.tensors {
        let (t, cut) = (&header.tensors[i], &plan.cuts[i]);
        let last = match cut {
            Cut::Experts(ids) => Some(ids.len() as u64),
            Cut::Merged(groups) => Some(groups.len() as u64),
            _ => None,
        };
        head.extend((t.name.len() as u64).to_le_bytes());
        head.extend(t.name.as_bytes());
        head.extend((t.dims.len() as u32).to_le_bytes());
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
        offset += cut_bytes(t, cut).next_multiple_of(align);
    }
    head.resize(head.len().next_multiple_of(align as usize), 0);
    w.put(&head)?;
    let zeros = vec![0u8; align as usize];
    for &i in &part.tensors {
        let (t, cut, start) = (&header.tensors[i], &plan.cuts[i], src.places[i]);
        match cut {
            Cut::Drop => continue,
            Cut::Whole => w.copy(files, start, t.n_bytes)?,
            Cut::Experts(ids) => {
                let per_expert = per_expert(t);
                for (first, n) in runs(ids) {
                    let at = TensorPlace {
                        offset: start.offset + first * per_expert,
                        ..start
                    };
                    w.copy(files, at, n * per_expert)?;
                }
            }
            Cut::Merged(groups) => write_merged(files, t, start, groups, codec, w)?,
        }
        let written = cut_bytes(t, cut);
        let pad = (written.next_multiple_of(align) - written) as usize;
        w.put(&zeros[..pad])?;
    }
    Ok(())
}

/// Writes the expert tensor `t` (data at `start`) merged to `groups`: a
/// lone member of weight 1 copied as it is, every other group as the
/// weighted sum of its members' values, re-encoded in `t`'s type. One
/// expert's values are held at a time.
fn write_merged(
    files: &[File],
    t: &TensorInfo,
    start: TensorPlace,
    groups: &[Vec<(u32, f64)>],
    codec: Option<&dyn RowCodec>,
    w: &mut Out,
) -> Result<(), Side> {
    let per_expert = per_expert(t);
    let n = t.n_elements() / t.dims.last().expect("an expert tensor has dimensions");
    let mut mean = Mean::new(t.ggml_type, codec, n as usize, per_expert as usize);
    let mut out = Vec::new();
    let at = |id: u32| TensorPlace {
        offset: start.offset + u64::from(id) * per_expert,
        ..start
    };
    for group in groups {
        if let [(id, weight)] = group[..] {
            if weight == 1.0 {
                w.copy(files, at(id), per_expert)?;
                continue;
            }
        }
        let read = |id: u32, buf: &mut [u8]| {
            let place = at(id);
            files[place.file]
                .read_exact_at(buf, place.offset)
                .map_err(|e| Side::Read(place.file, e))
        };
        mean.of(group, read, &mut out)?;
        w.put(&out)?;
    }
    Ok(())
}

/// Kept ids as runs of consecutive ids `(first, count)`, in keep-map order:
/// each run is one range of the source.
fn runs(ids: &[u32]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &id in ids {
        match out.last_mut() {
            Some((first, n)) if *first + *n == u64::from(id) => *n += 1,
            _ => out.push((u64::from(id), 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn consecutive_ids_merge_into_runs_in_order() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[0, 1, 2, 3]), vec![(0, 4)]);
        assert_eq!(
            runs(&[0, 2, 3, 4, 7, 9, 10]),
            vec![(0, 1), (2, 3), (7, 1), (9, 2)]
        );
        // Not sorted (keep maps are, but order is what the output follows).
        assert_eq!(runs(&[5, 6, 2, 3]), vec![(5, 2), (2, 2)]);
    }
}
