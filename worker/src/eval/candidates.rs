//! The candidates to evaluate: pre-sliced GGUF files, or keep maps sliced
//! here from the base model (`worker join` in an evaluation run).

use super::Candidate;
use crate::collect::sha256_file;
use crate::error::WorkerError;
use common::keepmap::KeepMap;
use std::path::{Path, PathBuf};

/// Candidates from GGUF paths; each is named after its file stem
/// (`reap_l2_sum_K4.gguf` is `reap_l2_sum_K4`) and hashed. Two candidates
/// with one name are refused.
pub fn from_files(paths: &[PathBuf]) -> Result<Vec<Candidate>, WorkerError> {
    let mut out: Vec<Candidate> = Vec::with_capacity(paths.len());
    for path in paths {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| WorkerError::Model {
                path: path.display().to_string(),
                reason: "a candidate file needs a UTF-8 file name".into(),
            })?
            .to_string();
        if out.iter().any(|c| c.name == name) {
            return Err(WorkerError::Model {
                path: path.display().to_string(),
                reason: format!("another candidate is already named {name}"),
            });
        }
        out.push(Candidate {
            name,
            sha256: sha256_file(path)?,
            path: path.clone(),
        });
    }
    Ok(out)
}

/// Slices each named keep map from `base` into `dir` as `<name>.gguf`. The
/// slice is deterministic: the same base file and map give the same bytes
/// (and SHA-256) on every worker, which the coordinator checks.
pub fn slice(
    base: &Path,
    maps: &[(String, KeepMap)],
    dir: &Path,
) -> Result<Vec<Candidate>, WorkerError> {
    let mut out: Vec<Candidate> = Vec::with_capacity(maps.len());
    for (name, keep) in maps {
        let path = dir.join(format!("{name}.gguf"));
        let sliced =
            common::prune::slice_model(base, keep, &path).map_err(|e| WorkerError::Model {
                path: base.display().to_string(),
                reason: format!("slicing candidate {name}: {e}"),
            })?;
        out.push(Candidate {
            name: name.clone(),
            path,
            sha256: sliced.sha256,
        });
    }
    Ok(out)
}
