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
//! Merged models ([`merge_model`]) write each centre of a merge plan as the
//! weighted mean of its members, through a [`RowCodec`] for quantised
//! types that the caller supplies (the worker's, on ggml's type traits).
//!
//! It may depend on the GGUF format, the numbers (routing) and the run's
//! keep-map and merge-plan schemas; never on a stage or llama.cpp.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod general;
mod kv;
mod merge;
mod plan;
mod write;

pub use error::PruneError;
pub use merge::{install_codec, installed_codec, RowCodec};

use gguf::split::{open_joined, Joined};
use runfiles::keepmap::KeepMap;
use runfiles::mergeplan::MergePlan;
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
    write::sliced(&model, &plan, None, out)
}

/// Writes to `out` the model `base` merged to `merge` (DESIGN section 12,
/// and the README's "Merged candidates"): per MoE layer the plan's centres
/// in order, each centre's gate, up and down (fused `gate_up`, biases and
/// scales too) the weighted mean of its members' values, decoded and
/// re-encoded in the base's type by `codec` (F32 without one; a lone
/// member is copied as it is); router rows and selection biases are the
/// centres'. Memory: one expert's values at a time. `{arch}.expert_count`
/// becomes K; a plan that merges nothing writes its keep map's slice, byte
/// for byte.
pub fn merge_model(
    base: &Path,
    merge: &MergePlan,
    codec: Option<&dyn RowCodec>,
    out: &Path,
) -> Result<Sliced, PruneError> {
    let (model, plan) = plan_merge(base, merge, codec)?;
    write::sliced(&model, &plan, codec, out)
}

/// [`merge_model`] written as [`make_model_split`] writes a model.
pub fn merge_model_split(
    base: &Path,
    merge: &MergePlan,
    codec: Option<&dyn RowCodec>,
    out: &Path,
    max_bytes: u64,
) -> Result<Vec<(PathBuf, Sliced)>, PruneError> {
    let (model, plan) = plan_merge(base, merge, codec)?;
    write::split(&model, &plan, codec, max_bytes, &split_name(out))
}

/// The model `base` read whole and its merge plan, checked against `codec`.
fn plan_merge(
    base: &Path,
    merge: &MergePlan,
    codec: Option<&dyn RowCodec>,
) -> Result<(Joined, plan::Plan), PruneError> {
    let model = open_joined(base)?;
    let path = base.display().to_string();
    let plan = plan::merged(&model.header, merge, &path)?;
    merge::check_codec(&model.header, &plan, codec, &path)?;
    Ok((model, plan))
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
    write::split(&model, &plan, None, max_bytes, &split_name(out))
}

/// File `no` of `count` of a split output named from `out`.
fn split_name(out: &Path) -> impl Fn(u16, u16) -> PathBuf + '_ {
    move |no: u16, count: u16| match count {
        1 => out.to_path_buf(),
        _ => {
            let stem = out.file_stem().unwrap_or_default().to_string_lossy();
            out.with_file_name(gguf::split::shard_name(&stem, no, count))
        }
    }
}

/// Writes to `out` llama.cpp's importance matrix `imatrix` (`<tensor>.in_sum2`
/// and `<tensor>.in_sum` `[n_in, n_mat]`, `<tensor>.counts` `[1, n_mat]`) with the stacked expert
/// weights' entries cut to the experts `keep` keeps, so a pruned model can be
/// re-quantised with it.
pub fn slice_imatrix(imatrix: &Path, keep: &KeepMap, out: &Path) -> Result<Sliced, PruneError> {
    let matrix = open_joined(imatrix)?;
    let plan = plan::imatrix(&matrix.header, keep, &imatrix.display().to_string())?;
    write::sliced(&matrix, &plan, None, out)
}

/// [`slice_imatrix`] for a merged model: each centre's entries (`in_sum2`,
/// `in_sum`, `counts`) are the sums of its members', the statistics of
/// every input the merged expert stands for.
pub fn merge_imatrix(imatrix: &Path, merge: &MergePlan, out: &Path) -> Result<Sliced, PruneError> {
    let matrix = open_joined(imatrix)?;
    let plan = plan::imatrix_merged(&matrix.header, merge, &imatrix.display().to_string())?;
    write::sliced(&matrix, &plan, None, out)
}

#[cfg(test)]
mod tests;
