//! `worker quantize`: a GGUF quantised by llama.cpp's own quantiser, with
//! an importance matrix read by llama.cpp's own loader and turned into the
//! per-column weights the way llama-quantize does, written create-only.

use crate::error::WorkerError;
use crate::llama::{load_imatrix, quantize_model, LoadedImatrix, QuantizeParams};
use common::gguf_read::GgufReader;
use common::quant::{quantised_tensor, QuantType};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How a model is quantised.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// The type written.
    pub quant: QuantType,
    /// An importance matrix (llama.cpp's GGUF imatrix format), if any.
    pub imatrix: Option<PathBuf>,
    /// Quantise a model that is already quantised.
    pub allow_requantize: bool,
    /// CPU threads.
    pub threads: u32,
}

/// What a quantisation wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantized {
    /// SHA-256 of the written file.
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Tensors of the model that had importance-matrix weights.
    pub imatrix_tensors: usize,
}

/// The weights llama-quantize passes to llama.cpp for each imatrix entry:
/// per matrix, `in_sum2 / count` column by column (f32 division), and 1 for
/// every column of a matrix that saw no input.
pub fn imatrix_weights(m: &LoadedImatrix) -> BTreeMap<String, Vec<f32>> {
    m.entries
        .iter()
        .map(|(name, e)| {
            let n_mat = e.counts.len().max(1);
            let n_in = e.sums.len() / n_mat;
            let mut w = Vec::with_capacity(e.sums.len());
            for (mat, &count) in e.counts.iter().enumerate() {
                let row = &e.sums[mat * n_in..(mat + 1) * n_in];
                let count = count as f32;
                if count > 0.0 {
                    w.extend(row.iter().map(|s| s / count));
                } else {
                    w.extend(std::iter::repeat_n(1.0, n_in));
                }
            }
            (name.clone(), w)
        })
        .collect()
}

/// Quantises `base` into `out` (created: an existing file is never
/// replaced). llama.cpp writes a temporary file beside `out`, which is
/// hashed and then linked to `out`, so `out` only ever appears complete.
/// A base that is already quantised is refused unless
/// `allow_requantize`, naming a quantised tensor.
pub fn quantize_file(
    base: &Path,
    out: &Path,
    opts: &QuantizeOptions,
) -> Result<Quantized, WorkerError> {
    let model_err = |reason: String| WorkerError::Model {
        path: base.display().to_string(),
        reason,
    };
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| WorkerError::Io { path, source }
    };
    let header = GgufReader::open(base)
        .map_err(|e| model_err(e.to_string()))?
        .header;
    if let (false, Some((tensor, ty))) = (opts.allow_requantize, quantised_tensor(&header)) {
        return Err(model_err(format!(
            "already quantised ({tensor} is {ty}): re-quantising it to {} compounds two rounding errors; pass --allow-requantize to do it anyway",
            opts.quant
        )));
    }
    if out.exists() {
        return Err(WorkerError::Io {
            path: out.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists; a quantised file is never overwritten",
            ),
        });
    }
    let weights = match &opts.imatrix {
        Some(path) => Some(imatrix_weights(&load_imatrix(path)?)),
        None => None,
    };
    let imatrix_tensors = weights.as_ref().map_or(0, |w| {
        header
            .tensors
            .iter()
            .filter(|t| w.contains_key(&t.name))
            .count()
    });
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".quantizing-")
        .suffix(".gguf")
        .tempfile_in(dir)
        .map_err(io(dir))?;
    let params = QuantizeParams {
        quant: opts.quant,
        threads: opts.threads.max(1) as i32,
        allow_requantize: opts.allow_requantize,
        imatrix: weights.as_ref(),
    };
    quantize_model(base, tmp.path(), &params)?;
    let sha256 = common::hash::sha256_file(tmp.path()).map_err(io(tmp.path()))?;
    let bytes = std::fs::metadata(tmp.path()).map_err(io(tmp.path()))?.len();
    tmp.persist_noclobber(out).map_err(|e| WorkerError::Io {
        path: out.display().to_string(),
        source: e.error,
    })?;
    Ok(Quantized {
        sha256,
        bytes,
        imatrix_tensors,
    })
}
