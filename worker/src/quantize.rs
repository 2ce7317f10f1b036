//! `worker quantize`: a GGUF quantised by llama.cpp's own quantiser, with
//! the per-column weights llama-quantize derives from an importance matrix
//! (llama.cpp's GGUF imatrix format), written create-only and hashed.

use crate::error::WorkerError;
use crate::llama::{f32s, quantize_model, QuantizeParams};
use common::gguf_read::GgufReader;
use common::gguf_split::SplitError;
use common::quant::{check_requantize, QuantType};
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

const SUM2: &str = ".in_sum2";
const COUNTS: &str = ".counts";

/// The weights llama-quantize passes to llama.cpp for each weight tensor of
/// the imatrix file `path`: per matrix, `in_sum2 / count` column by column
/// (f32 division), and 1 for every column of a matrix that saw no input.
/// `Err` names the file and the entry that is not `in_sum2 [n_in, n_mat]`
/// with `counts [1, n_mat]` in F32.
pub fn imatrix_weights(path: &Path) -> Result<BTreeMap<String, Vec<f32>>, WorkerError> {
    let bad = |reason: String| WorkerError::Model {
        path: path.display().to_string(),
        reason,
    };
    let mut r = GgufReader::open(path).map_err(|source| WorkerError::GgufFile {
        role: "imatrix",
        source,
    })?;
    let names: Vec<String> = r
        .header
        .tensors
        .iter()
        .filter_map(|t| t.name.strip_suffix(SUM2).map(str::to_string))
        .collect();
    let mut out = BTreeMap::new();
    for name in names {
        let (sum2, counts) = (format!("{name}{SUM2}"), format!("{name}{COUNTS}"));
        let shape = |t: &str| r.header.tensor(t).map(|t| (t.ggml_type, t.dims.clone()));
        let n_in = match (shape(&sum2), shape(&counts)) {
            (Some((0, s)), Some((0, c)))
                if s.len() == 2 && c.len() == 2 && c[0] == 1 && s[1] == c[1] && s[0] > 0 =>
            {
                s[0] as usize
            }
            (_, None) => return Err(bad(format!("{sum2} has no {counts}"))),
            (s, c) => {
                return Err(bad(format!(
                    "{sum2} {s:?} and {counts} {c:?} (type, dims) are not F32 [n_in, n_mat] and [1, n_mat]"
                )))
            }
        };
        let sums: Vec<f32> =
            f32s(&r.tensor_bytes(&sum2).map_err(|e| bad(e.to_string()))?).collect();
        let counts: Vec<f32> =
            f32s(&r.tensor_bytes(&counts).map_err(|e| bad(e.to_string()))?).collect();
        let mut w = Vec::with_capacity(sums.len());
        for (row, &count) in sums.chunks_exact(n_in).zip(&counts) {
            if count > 0.0 {
                w.extend(row.iter().map(|s| s / count));
            } else {
                w.extend(std::iter::repeat_n(1.0, n_in));
            }
        }
        out.insert(name, w);
    }
    Ok(out)
}

/// Quantises `base` into `out` (created: an existing file is never
/// replaced). llama.cpp writes a temporary file beside `out`, which is
/// hashed and then linked to `out`, so `out` only ever appears complete.
/// A base that is already quantised is refused unless `allow_requantize`.
pub fn quantize_file(
    base: &Path,
    out: &Path,
    opts: &QuantizeOptions,
) -> Result<Quantized, WorkerError> {
    let model = base.display().to_string();
    let model_err = |reason: String| WorkerError::Model {
        path: model.clone(),
        reason,
    };
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| WorkerError::Io { path, source }
    };
    // A split base is one model to llama.cpp: check all its tensors.
    let header = match common::gguf_split::open_joined(base) {
        Ok(joined) => joined.header,
        Err(SplitError::Read(source)) => {
            return Err(WorkerError::GgufFile {
                role: "model",
                source,
            })
        }
        Err(e) => return Err(e.into()),
    };
    check_requantize(&header, "the model", opts.quant, opts.allow_requantize).map_err(model_err)?;
    if out.exists() {
        return Err(WorkerError::Io {
            path: out.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists; a quantised file is never overwritten",
            ),
        });
    }
    let weights = opts.imatrix.as_deref().map(imatrix_weights).transpose()?;
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
        threads: opts.threads.clamp(1, i32::MAX as u32) as i32,
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
