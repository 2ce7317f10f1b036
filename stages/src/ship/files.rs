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
use common::hash::sha256_file;
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
        let target = self.path(name);
        let made = self.scratch(name);
        make(&made)?;
        let sha256 = sha256_file(&made).map_err(io_err(&made))?;
        let bytes = std::fs::metadata(&made).map_err(io_err(&made))?.len();
        let linked = std::fs::hard_link(&made, &target);
        std::fs::remove_file(&made).map_err(io_err(&made))?;
        match linked {
            Ok(()) => Ok(Placed {
                sha256,
                bytes,
                reused: false,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let theirs = sha256_file(&target).map_err(io_err(&target))?;
                if theirs == sha256 {
                    Ok(Placed {
                        sha256,
                        bytes,
                        reused: true,
                    })
                } else {
                    Err(ShipError::File {
                        path: target,
                        reason: format!(
                            "exists with SHA-256 {theirs}, but these inputs make {sha256}: remove it or ship to another --out (a shipped file is never replaced)"
                        ),
                    })
                }
            }
            Err(e) => Err(io_err(&target)(e)),
        }
    }
}

/// Runs `worker quantize` (llama.cpp's quantiser) on `model` into `out`.
pub fn quantize(
    worker: &Path,
    model: &Path,
    imatrix: &Path,
    quant: common::quant::QuantType,
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
