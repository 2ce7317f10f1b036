//! Placing the shipped files in the output directory, and quantised files
//! made by `worker quantize` (llama.cpp's quantiser; the worker crate holds
//! the only unsafe code).
//!
//! Every file is made in a scratch directory inside the output directory
//! and then linked to its final name, which fails if the name exists, so a
//! final name only ever holds a complete file and is never replaced. A file
//! that already exists is reused when its bytes are what these inputs make;
//! any other file under that name is an error naming it.

use super::ShipError;
use gguf::hash::sha256_file;
use slicer::make_model_split;
use std::path::{Path, PathBuf};

/// A file at its final name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// SHA-256 of its bytes.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// Whether it was already there (nothing was made).
    pub reused: bool,
}

/// The output directory and its scratch space (removed on drop).
pub struct OutDir {
    dir: PathBuf,
    scratch: tempfile::TempDir,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ShipError + '_ {
    move |e| ShipError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

impl OutDir {
    /// Creates `dir` if needed, with a scratch directory inside it (same
    /// file system, so a finished file is linked, never copied).
    pub fn open(dir: &Path) -> Result<OutDir, ShipError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let scratch = tempfile::Builder::new()
            .prefix(".ship-scratch-")
            .tempdir_in(dir)
            .map_err(io_err(dir))?;
        Ok(OutDir {
            dir: dir.to_path_buf(),
            scratch,
        })
    }

    /// The final path of file `name` (`x.gguf`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A path in the scratch directory (removed with it).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// Places file `name`: `make` writes it to the scratch path it is
    /// given, and the result is linked to the final name, or, when a file
    /// is there already, compared with it: the same bytes are reused, other
    /// bytes are an error.
    pub fn place(
        &self,
        name: &str,
        make: impl FnOnce(&Path) -> Result<(), ShipError>,
    ) -> Result<Placed, ShipError> {
        let made = self.scratch(name);
        make(&made)?;
        let placed = self.hashed(&made).and_then(|p| self.link(name, &made, p));
        std::fs::remove_file(&made).map_err(io_err(&made))?;
        placed
    }

    /// Places the model file `name` as [`OutDir::place`] does, or, with
    /// `split_max_bytes`, when it is larger, as llama.cpp's `gguf-split`
    /// files of at most that much tensor data (`<stem>-00001-of-0000N.gguf`,
    /// ...). The model as one file stays in the scratch directory while the
    /// ship lasts (the source of its quantisations). `make` returns the
    /// file's SHA-256 when it computed it while writing (the slicer does),
    /// so the file is not read again for it.
    pub fn place_model(
        &self,
        name: &str,
        split_max_bytes: Option<u64>,
        make: impl FnOnce(&Path) -> Result<Option<String>, ShipError>,
    ) -> Result<PlacedModel, ShipError> {
        let made = self.scratch(name);
        let whole = match make(&made)? {
            Some(sha256) => Placed {
                sha256,
                bytes: std::fs::metadata(&made).map_err(io_err(&made))?.len(),
                reused: false,
            },
            None => self.hashed(&made)?,
        };
        let parts: Vec<(PathBuf, Placed)> = match split_max_bytes {
            Some(max) if whole.bytes > max => {
                let dir = self.scratch(&format!("{name}.split"));
                std::fs::create_dir(&dir).map_err(io_err(&dir))?;
                let split = make_model_split(&made, None, None, &dir.join(name), max);
                split
                    .map_err(|e| ShipError::File {
                        path: self.path(name),
                        reason: format!("splitting: {e}"),
                    })?
                    .into_iter()
                    .map(|(path, sliced)| {
                        let placed = Placed {
                            sha256: sliced.sha256,
                            bytes: sliced.bytes,
                            reused: false,
                        };
                        (path, placed)
                    })
                    .collect()
            }
            _ => vec![(made.clone(), whole.clone())],
        };
        let mut files = Vec::with_capacity(parts.len());
        for (path, placed) in parts {
            let part = path.file_name().unwrap_or_default().to_string_lossy();
            let placed = self.link(&part, &path, placed)?;
            if path != made {
                std::fs::remove_file(&path).map_err(io_err(&path))?;
            }
            files.push((part.into_owned(), placed));
        }
        Ok(PlacedModel {
            whole: Placed {
                reused: files.iter().all(|(_, p)| p.reused),
                ..whole
            },
            files,
            path: made,
        })
    }

    /// Removes a scratch file no longer needed (a model's one-file copy
    /// once its files are placed and its quantisations made).
    pub fn forget(&self, path: &Path) -> Result<(), ShipError> {
        std::fs::remove_file(path).map_err(io_err(path))
    }

    /// SHA-256 and size of the file at `path`.
    fn hashed(&self, path: &Path) -> Result<Placed, ShipError> {
        Ok(Placed {
            sha256: sha256_file(path).map_err(io_err(path))?,
            bytes: std::fs::metadata(path).map_err(io_err(path))?.len(),
            reused: false,
        })
    }

    /// Links the finished file `made` (of SHA-256 and size `placed`) to
    /// the final name `name`, or, when a file is there already, compares it
    /// with it: the same bytes are reused, other bytes are an error.
    fn link(&self, name: &str, made: &Path, placed: Placed) -> Result<Placed, ShipError> {
        let target = self.path(name);
        match std::fs::hard_link(made, &target) {
            Ok(()) => Ok(placed),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let theirs = sha256_file(&target).map_err(io_err(&target))?;
                if theirs == placed.sha256 {
                    Ok(Placed {
                        reused: true,
                        ..placed
                    })
                } else {
                    Err(ShipError::File {
                        path: target,
                        reason: format!(
                            "exists with SHA-256 {theirs}, but these inputs make {}: remove it or ship to another --out (a shipped file is never replaced)",
                            placed.sha256
                        ),
                    })
                }
            }
            Err(e) => Err(io_err(&target)(e)),
        }
    }
}

/// A model file at its final name, or split into files there.
#[derive(Clone, Debug)]
pub struct PlacedModel {
    /// The model as one file (what workers make from its recipe and
    /// evaluate); reused when every file was.
    pub whole: Placed,
    /// The files at their final names, in order: the model's own name, or
    /// its split files.
    pub files: Vec<(String, Placed)>,
    /// The model as one file in the scratch directory.
    pub path: PathBuf,
}

/// Runs `worker quantize` (llama.cpp's quantiser) on `model` into `out`.
pub fn quantize(
    worker: &Path,
    model: &Path,
    imatrix: &Path,
    quant: gguf::quant::QuantType,
    out: &Path,
    threads: u32,
    allow_requantize: bool,
) -> Result<(), ShipError> {
    let mut cmd = std::process::Command::new(worker);
    cmd.arg("quantize")
        .arg("--model")
        .arg(model)
        .arg("--imatrix")
        .arg(imatrix)
        .args(["--type", quant.name(), "--threads", &threads.to_string()])
        .arg("--out")
        .arg(out);
    if allow_requantize {
        cmd.arg("--allow-requantize");
    }
    let output = cmd.output().map_err(|e| ShipError::File {
        path: worker.to_path_buf(),
        reason: format!("cannot run `worker quantize`: {e}"),
    })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
    Err(ShipError::File {
        path: model.to_path_buf(),
        reason: format!(
            "`worker quantize --type {quant}` failed ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_name_is_created_once_reused_when_equal_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutDir::open(&dir.path().join("ship")).unwrap();
        let write =
            |bytes: &'static [u8]| move |p: &Path| std::fs::write(p, bytes).map_err(io_err(p));
        let first = out.place("a.gguf", write(b"one")).unwrap();
        assert!(!first.reused);
        assert_eq!(std::fs::read(out.path("a.gguf")).unwrap(), b"one");
        // Made again: equal bytes are reused.
        let again = out.place("a.gguf", write(b"one")).unwrap();
        assert_eq!(
            again,
            Placed {
                reused: true,
                ..first.clone()
            }
        );
        // Other bytes under the name: an error, and the file stays.
        let e = out.place("a.gguf", write(b"two")).unwrap_err().to_string();
        assert!(e.contains("a.gguf") && e.contains("never replaced"), "{e}");
        assert_eq!(std::fs::read(out.path("a.gguf")).unwrap(), b"one");
        // A failed make leaves nothing at the final name.
        let failed = out.place("b.gguf", |p| {
            std::fs::write(p, b"half").unwrap();
            Err(io_err(p)(std::io::Error::other("stopped")))
        });
        assert!(failed.is_err() && !out.path("b.gguf").exists());
    }
}
