//! The candidates to evaluate: GGUF files, or candidates made here from the
//! base model as the job describes them (`worker join` in an evaluation run).

use super::Candidate;
use crate::collect::sha256_file;
use crate::error::WorkerError;
use crate::quantize::{quantize_file, QuantizeOptions};
use protocol::wire::EvalCandidate;
use runfiles::keepmap::KeepMap;
use runfiles::mergeplan::MergePlan;
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

/// What a job's candidates are made from besides the base model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inputs {
    /// Each candidate's keep map, in job order (`None`: every expert kept);
    /// a merged candidate's is its centres'.
    pub maps: Vec<Option<KeepMap>>,
    /// Each candidate's merge plan, in job order where any is (`None`, or
    /// past the end: sliced, not merged).
    pub merges: Vec<Option<MergePlan>>,
    /// The run's `imatrix.gguf`, when a candidate is quantised.
    pub imatrix: Option<Vec<u8>>,
}

/// Refuses to make the candidates of `job` in `dir` unless its file system
/// has room for them all: each slice's size planned from the base model's
/// header (an upper bound of its quantised form), plus the largest
/// quantised candidate's slice, which exists beside its quantised file
/// until that is written.
fn check_room(
    base: &Path,
    job: &[EvalCandidate],
    inputs: &Inputs,
    dir: &Path,
) -> Result<(), WorkerError> {
    let (mut total, mut largest_quantised) = (0u64, 0u64);
    for (c, keep) in job.iter().zip(&inputs.maps) {
        if keep.is_none() && c.expert_used.is_none() && c.quant.is_none() {
            continue; // the base file itself
        }
        let bytes = slicer::model_bytes(base, keep.as_ref(), c.expert_used).map_err(|e| {
            WorkerError::Model {
                path: base.display().to_string(),
                reason: format!("planning candidate {}: {e}", c.name),
            }
        })?;
        total += bytes;
        if c.quant.is_some() {
            largest_quantised = largest_quantised.max(bytes);
        }
    }
    let needed =
        total + largest_quantised + inputs.imatrix.as_ref().map_or(0, |b| 2 * b.len() as u64);
    let what = format!("making {} candidates from {}", job.len(), base.display());
    runfiles::room::check_room(dir, needed, &what).map_err(|reason| WorkerError::Scratch {
        path: dir.display().to_string(),
        reason,
    })
}

/// Makes each candidate of a job from `base` in `dir` as its recipe says
/// ([`EvalCandidate`]: sliced or whole, experts per token, quantised with
/// the run's importance matrix sliced the same way). Every step is
/// deterministic: the same base file and inputs give the same bytes (and
/// SHA-256) on every worker, which the coordinator checks. A candidate that
/// changes nothing is the base file itself.
pub fn make(
    base: &Path,
    job: &[EvalCandidate],
    inputs: &Inputs,
    dir: &Path,
    threads: u32,
) -> Result<Vec<Candidate>, WorkerError> {
    let failed = |name: &str, e: String| WorkerError::Model {
        path: base.display().to_string(),
        reason: format!("making candidate {name}: {e}"),
    };
    if inputs.maps.len() != job.len() {
        return Err(failed(
            "list",
            format!(
                "{} keep maps for {} candidates",
                inputs.maps.len(),
                job.len()
            ),
        ));
    }
    check_room(base, job, inputs, dir)?;
    // Under the run's own name, which a quantised file records
    // (`quantize.imatrix.file`) as `coordinator ship` does; in a folder of
    // its own, clear of the candidates' files.
    let run_imatrix = dir.join("run").join("imatrix.gguf");
    if let Some(bytes) = &inputs.imatrix {
        let write = std::fs::create_dir_all(dir.join("run"))
            .and_then(|()| std::fs::write(&run_imatrix, bytes));
        write.map_err(|source| WorkerError::Io {
            path: run_imatrix.display().to_string(),
            source,
        })?;
    }
    let mut out: Vec<Candidate> = Vec::with_capacity(job.len());
    for (i, (c, keep)) in job.iter().zip(&inputs.maps).enumerate() {
        let name = &c.name;
        let mut path = base.to_path_buf();
        let merge = inputs.merges.get(i).and_then(Option::as_ref);
        if let Some(plan) = merge {
            if c.expert_used.is_some() {
                return Err(failed(
                    name,
                    "a merged candidate keeps the experts per token".into(),
                ));
            }
            path = dir.join(format!("{name}.source.gguf"));
            let codec = llama::GgmlCodec::new();
            slicer::merge_model(base, plan, Some(&codec), &path)
                .map_err(|e| failed(name, e.to_string()))?;
        } else if keep.is_some() || c.expert_used.is_some() {
            path = dir.join(format!("{name}.source.gguf"));
            slicer::make_model(base, keep.as_ref(), c.expert_used, &path)
                .map_err(|e| failed(name, e.to_string()))?;
        }
        if let Some(quant) = c.quant {
            if inputs.imatrix.is_none() {
                return Err(failed(
                    name,
                    "quantised, but no importance matrix was read".into(),
                ));
            }
            let imatrix = match keep {
                Some(keep) => {
                    // Named after its keep map, as `coordinator ship` names
                    // it (a quantised file records the name), in a folder
                    // of this candidate's own.
                    let map = c.keep_map.as_deref().map(Path::new);
                    let stem = map
                        .and_then(Path::file_stem)
                        .unwrap_or(std::ffi::OsStr::new(name));
                    let folder = dir.join(name);
                    let sliced = folder.join(format!("{}.imatrix.gguf", stem.to_string_lossy()));
                    std::fs::create_dir_all(&folder).map_err(|source| WorkerError::Io {
                        path: folder.display().to_string(),
                        source,
                    })?;
                    match merge {
                        Some(plan) => slicer::merge_imatrix(&run_imatrix, plan, &sliced),
                        None => slicer::slice_imatrix(&run_imatrix, keep, &sliced),
                    }
                    .map_err(|e| failed(name, e.to_string()))?;
                    sliced
                }
                None => run_imatrix.clone(),
            };
            let quantised = dir.join(format!("{name}.gguf"));
            // The coordinator already refused a quantised base unless asked;
            // for unquantised tensors the flag changes no byte.
            let opts = QuantizeOptions {
                quant,
                imatrix: Some(imatrix),
                allow_requantize: true,
                threads,
            };
            quantize_file(&path, &quantised, &opts)?;
            if path != base {
                std::fs::remove_file(&path).map_err(|source| WorkerError::Io {
                    path: path.display().to_string(),
                    source,
                })?;
            }
            path = quantised;
        }
        out.push(Candidate {
            name: name.clone(),
            sha256: sha256_file(&path)?,
            path,
        });
    }
    Ok(out)
}
