//! The base model's scored logits rows of one lease, kept while the
//! candidates run in turn (fewer models in memory than 1 + n, DESIGN
//! section 12 "Memory"): `n_vocab` f32 values per scored position, exactly
//! as the base model computed them, so every comparison is the one the
//! all-at-once path makes, bit for bit.
//!
//! They are kept in host memory up to a bound; a lease with more goes to an
//! unnamed file in the scratch directory (removed by the system when it is
//! closed), after a free-space check. Rows are written once, in scored
//! order, and read back in the same order once per candidate.

use crate::error::WorkerError;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const F32: usize = std::mem::size_of::<f32>();

/// Where [`KeptRows`] live.
enum Store {
    Memory(Vec<f32>),
    File {
        file: File,
        dir: PathBuf,
        /// Byte buffer of the last write or read.
        bytes: Vec<u8>,
    },
}

/// A lease's base rows, written in scored order and read back in turn.
pub(super) struct KeptRows {
    n_vocab: usize,
    n_rows: usize,
    store: Store,
    written: usize,
    read: usize,
    /// The rows of the last [`KeptRows::next_rows`] (file store).
    buf: Vec<f32>,
}

impl KeptRows {
    /// Room for `n_rows` rows of `n_vocab` values: in memory when they take
    /// at most `memory_limit` bytes, else in a file under `scratch`, whose
    /// free space is checked first.
    pub fn new(
        n_rows: usize,
        n_vocab: usize,
        memory_limit: u64,
        scratch: &Path,
    ) -> Result<KeptRows, WorkerError> {
        let bytes = Self::bytes_for(n_rows, n_vocab);
        let store = if bytes <= memory_limit {
            Store::Memory(Vec::with_capacity(n_rows * n_vocab))
        } else {
            let what = format!(
                "the base model's logits of a lease ({n_rows} scored positions x {n_vocab} tokens x 4 bytes)"
            );
            runfiles::room::check_room(scratch, bytes, &what).map_err(|reason| {
                WorkerError::Scratch {
                    path: scratch.display().to_string(),
                    reason,
                }
            })?;
            let file = tempfile::tempfile_in(scratch).map_err(WorkerError::creating(scratch))?;
            Store::File {
                file,
                dir: scratch.to_path_buf(),
                bytes: Vec::new(),
            }
        };
        Ok(KeptRows {
            n_vocab,
            n_rows,
            store,
            written: 0,
            read: 0,
            buf: Vec::new(),
        })
    }

    /// Bytes that `n_rows` rows of `n_vocab` values take.
    pub fn bytes_for(n_rows: usize, n_vocab: usize) -> u64 {
        (n_rows as u64)
            .saturating_mul(n_vocab as u64)
            .saturating_mul(F32 as u64)
    }

    /// Whether the rows live in a scratch file.
    pub fn on_disk(&self) -> bool {
        matches!(self.store, Store::File { .. })
    }

    /// Appends whole rows (`n_vocab` values each, at most the room left).
    pub fn push(&mut self, rows: &[f32]) -> Result<(), WorkerError> {
        assert!(rows.len().is_multiple_of(self.n_vocab), "whole rows");
        let n = rows.len() / self.n_vocab;
        assert!(self.written + n <= self.n_rows, "more rows than sized for");
        match &mut self.store {
            Store::Memory(v) => v.extend_from_slice(rows),
            Store::File { file, dir, bytes } => {
                bytes.clear();
                bytes.extend(rows.iter().flat_map(|v| v.to_le_bytes()));
                file.write_all(bytes).map_err(WorkerError::writing(dir))?;
            }
        }
        self.written += n;
        Ok(())
    }

    /// Starts reading from the first row again (before each candidate).
    pub fn rewind(&mut self) -> Result<(), WorkerError> {
        assert_eq!(self.written, self.n_rows, "every row written first");
        self.read = 0;
        if let Store::File { file, dir, .. } = &mut self.store {
            file.seek(SeekFrom::Start(0))
                .map_err(WorkerError::writing(dir))?;
        }
        Ok(())
    }

    /// The next `n` rows, in the order they were written.
    pub fn next_rows(&mut self, n: usize) -> Result<&[f32], WorkerError> {
        assert!(self.read + n <= self.written, "reading past the rows kept");
        let (start, len) = (self.read * self.n_vocab, n * self.n_vocab);
        self.read += n;
        match &mut self.store {
            Store::Memory(v) => Ok(&v[start..start + len]),
            Store::File { file, dir, bytes } => {
                bytes.resize(len * F32, 0);
                file.read_exact(bytes).map_err(|source| WorkerError::Io {
                    path: dir.display().to_string(),
                    source,
                })?;
                self.buf.clear();
                self.buf.extend(
                    bytes
                        .chunks_exact(F32)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
                Ok(&self.buf)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(seed: usize, n: usize, n_vocab: usize) -> Vec<f32> {
        (0..n * n_vocab)
            .map(|i| ((i * 7919 + seed * 31) % 1013) as f32 * -0.37)
            .collect()
    }

    #[test]
    fn rows_come_back_bit_for_bit_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let n_vocab = 13;
        let (a, b) = (rows(1, 3, n_vocab), rows(2, 2, n_vocab));
        for limit in [u64::MAX, 0] {
            let mut k = KeptRows::new(5, n_vocab, limit, dir.path()).unwrap();
            assert_eq!(k.on_disk(), limit == 0);
            k.push(&a).unwrap();
            k.push(&b).unwrap();
            for _ in 0..2 {
                k.rewind().unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(k.next_rows(2).unwrap()), bits(&a[..2 * n_vocab]));
                let rest: Vec<f32> = a[2 * n_vocab..].iter().chain(&b).copied().collect();
                assert_eq!(bits(k.next_rows(3).unwrap()), bits(&rest));
            }
        }
        // Nothing is left behind in the scratch directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn rows_that_cannot_fit_on_the_scratch_disk_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let err = KeptRows::new(usize::MAX / 8, 2, 0, dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(err.contains("logits of a lease"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
