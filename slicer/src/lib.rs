//! Pruned models: a base GGUF sliced down to the experts a keep map keeps,
//! and the matching importance matrix (DESIGN section 12).
//!
//! Both functions first check the keep map against the file ([`plan`]: which
//! tensors are sliced, what metadata changes, every refusal) and only then
//! stream the file through [`write`]: metadata and every other tensor are
//! copied verbatim, each expert-family tensor as the kept experts' byte
//! ranges in keep-map order (file to file, in the kernel where the OS can),
//! and hashed through a bounded buffer. The output is written
//! under a temporary name and renamed to `out` only when complete, so an
//! error never leaves a file at `out`. A model split across files
//! (llama.cpp's `gguf-split`, how large models are published) is read from
//! all its files as one model and written as one file without the
//! `split.*` keys, as `llama-gguf-split --merge` and a slice would make it.
//!
//! It may depend on the GGUF format, the numbers (routing) and the run's
//! keep-map schema; never on a stage or llama.cpp.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod general;
mod kv;
mod plan;
mod write;

pub use error::PruneError;

use gguf::split::{open_joined, Joined};
use runfiles::keepmap::KeepMap;
use std::path::{Path, PathBuf};

/// What a slice wrote: the output's SHA-256 (compared across workers that
/// slice the same candidate), its size and the experts kept per layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sliced {
    /// SHA-256 of the written file, lowercase hex.
    pub sha256: String,
    /// Size of the written file in bytes.
    pub bytes: u64,
    /// Experts kept per MoE layer (the new `{arch}.expert_count`).
    pub k: u32,
}

/// Writes to `out` the model `base` with only the experts `keep` keeps in
/// each MoE layer, in keep-map order; `{arch}.expert_count` becomes K.
/// NextN / MTP blocks, which a decode never runs, are left out (see
/// `plan::NextN`): the output is a model of the blocks that were measured.
/// Refuses (writing nothing) a map that does not fit the model: see
/// [`PruneError`].
pub fn slice_model(base: &Path, keep: &KeepMap, out: &Path) -> Result<Sliced, PruneError> {
    make_model(base, Some(keep), None, out)
}

/// Writes to `out` a candidate model made from `base`: sliced to `keep`
/// as [`slice_model`] does (`None`: every tensor copied as it is), with
/// `{arch}.expert_used_count` set to `experts_used` when given (a
/// candidate that routes each token to fewer experts; refused above the
/// model's own count).
pub fn make_model(
    base: &Path,
    keep: Option<&KeepMap>,
    experts_used: Option<u32>,
    out: &Path,
) -> Result<Sliced, PruneError> {
    let (model, plan) = plan_model(base, keep, experts_used)?;
    write::sliced(&model, &plan, out)
}

/// About the bytes [`make_model`] writes for the same arguments, from the
/// headers alone (within the size of a few metadata entries): what a
/// scratch directory needs free before a candidate is made.
pub fn model_bytes(
    base: &Path,
    keep: Option<&KeepMap>,
    experts_used: Option<u32>,
) -> Result<u64, PruneError> {
    let (model, plan) = plan_model(base, keep, experts_used)?;
    Ok(write::planned_bytes(&model, &plan))
}

/// The model `base` read whole, and its plan for [`make_model`].
fn plan_model(
    base: &Path,
    keep: Option<&KeepMap>,
    experts_used: Option<u32>,
) -> Result<(Joined, plan::Plan), PruneError> {
    let model = open_joined(base)?;
    let (header, path) = (&model.header, base.display().to_string());
    let mut plan = match keep {
        Some(keep) => plan::model(header, keep, &path)?,
        None => plan::whole(header, &path)?,
    };
    if let Some(used) = experts_used {
        plan::experts_used(header, &mut plan, used, &path)?;
    }
    Ok((model, plan))
}

/// [`make_model`] written as llama.cpp's `gguf-split` writes a model, for
/// hosts that cap a file's size (Hugging Face: 50 GB): files of at most
/// `max_bytes` of tensor data, the first holding the metadata, named from
/// `out` (`DIR/NAME.gguf`) as `DIR/NAME-00001-of-0000N.gguf`, ...; a model
/// that fits is one file at `out`. Returns each file and what it holds.
pub fn make_model_split(
    base: &Path,
    keep: Option<&KeepMap>,
    experts_used: Option<u32>,
    out: &Path,
    max_bytes: u64,
) -> Result<Vec<(PathBuf, Sliced)>, PruneError> {
    let (model, plan) = plan_model(base, keep, experts_used)?;
    let stem = out.file_stem().unwrap_or_default().to_string_lossy();
    let name = |no: u16, count: u16| match count {
        1 => out.to_path_buf(),
        _ => out.with_file_name(gguf::split::shard_name(&stem, no, count)),
    };
    write::split(&model, &plan, max_bytes, &name)
}

/// Writes to `out` llama.cpp's importance matrix `imatrix` (`<tensor>.in_sum2`
/// and `<tensor>.in_sum` `[n_in, n_mat]`, `<tensor>.counts` `[1, n_mat]`) with the stacked expert
/// weights' entries cut to the experts `keep` keeps, so a pruned model can be
/// re-quantised with it.
pub fn slice_imatrix(imatrix: &Path, keep: &KeepMap, out: &Path) -> Result<Sliced, PruneError> {
    let matrix = open_joined(imatrix)?;
    let plan = plan::imatrix(&matrix.header, keep, &imatrix.display().to_string())?;
    write::sliced(&matrix, &plan, out)
}

#[cfg(test)]
mod tests;
