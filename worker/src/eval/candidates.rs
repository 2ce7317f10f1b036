//! The candidates to evaluate: pre-made GGUF files, or recipes (keep map,
//! top-k, quantisation) made here from the base model (`worker join` in an
//! evaluation run).

use super::Candidate;
use crate::collect::sha256_file;
use crate::error::WorkerError;
use crate::quantize::{quantize_file, QuantizeOptions};
use common::keepmap::KeepMap;
use common::quant::QuantType;
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

/// How one candidate is made from the base model: sliced to a keep map,
/// routed to fewer experts per token, quantised with the run's importance
/// matrix (sliced like the model), each step when given.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// Its name in results.
    pub name: String,
    /// The keep map it is sliced to.
    pub keep: Option<KeepMap>,
    /// Its `expert_used_count`, below the base model's.
    pub top_k: Option<u32>,
    /// The type it is quantised to.
    pub quant: Option<QuantType>,
}

/// Makes each recipe's model from `base` in `dir` as `<name>.gguf`. Every
/// step is deterministic: the same base file, keep map, importance matrix
/// (`imatrix`, needed by quantised recipes) and build give the same bytes
/// (and SHA-256) on every worker, which the coordinator checks.
pub fn build(
    base: &Path,
    recipes: &[Recipe],
    imatrix: Option<&Path>,
    dir: &Path,
    threads: u32,
) -> Result<Vec<Candidate>, WorkerError> {
    let mut out: Vec<Candidate> = Vec::with_capacity(recipes.len());
    for r in recipes {
        let failed = |reason: String| WorkerError::Model {
            path: base.display().to_string(),
            reason: format!("making candidate {}: {reason}", r.name),
        };
        let path = dir.join(format!("{}.gguf", r.name));
        let derived = (r.keep.is_some() || r.top_k.is_some()).then(|| match r.quant {
            Some(_) => dir.join(format!("{}.unquantised.gguf", r.name)),
            None => path.clone(),
        });
        let mut sha256 = None;
        if let Some(d) = &derived {
            let made = common::prune::derive_model(base, r.keep.as_ref(), r.top_k, d)
                .map_err(|e| failed(e.to_string()))?;
            sha256 = Some(made.sha256);
        }
        if let Some(quant) = r.quant {
            let imatrix = imatrix.ok_or_else(|| {
                failed(format!("quantising to {quant} needs the run's importance matrix"))
            })?;
            let sliced = dir.join(format!("{}.imatrix.gguf", r.name));
            let imatrix = match &r.keep {
                Some(keep) => {
                    common::prune::slice_imatrix(imatrix, keep, &sliced)
                        .map_err(|e| failed(e.to_string()))?;
                    sliced.as_path()
                }
                None => imatrix,
            };
            let opts = QuantizeOptions {
                quant,
                imatrix: Some(imatrix.to_path_buf()),
                allow_requantize: true,
                threads,
            };
            let from = derived.as_deref().unwrap_or(base);
            sha256 = Some(quantize_file(from, &path, &opts)?.sha256);
            for scratch in derived.iter().chain([&sliced]) {
                let _ = std::fs::remove_file(scratch);
            }
        }
        let sha256 = sha256.ok_or_else(|| failed("the recipe changes nothing".into()))?;
        out.push(Candidate {
            name: r.name.clone(),
            path,
            sha256,
        });
    }
    Ok(out)
}
