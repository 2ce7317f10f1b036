//! `worker quantize`: a GGUF quantised by llama.cpp's own quantiser, with
//! the per-column weights llama-quantize derives from an importance matrix
//! (llama.cpp's GGUF imatrix format) and the `quantize.imatrix.*` keys it
//! records, written create-only, readable by all (0644) and hashed.

use crate::error::WorkerError;
use gguf::quant::{check_requantize, QuantType};
use gguf::read::GgufReader;
use gguf::split::SplitError;
use llama::{f32s, quantize_model, MetaValue, QuantizeParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
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

/// An importance-matrix file as llama-quantize loads it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImatrixFile {
    /// Per weight tensor, the values passed to llama.cpp: `in_sum2 /
    /// count` column by column, 1 where a matrix saw no input.
    pub weights: BTreeMap<String, Vec<f32>>,
    /// Its `imatrix.datasets`.
    pub datasets: Vec<String>,
    /// Its `imatrix.chunk_count`.
    pub chunk_count: u64,
}

impl ImatrixFile {
    /// The `quantize.imatrix.*` entries llama-quantize writes into a file
    /// it quantises with this matrix, read from `path` as given: the file
    /// (here its name without the directory, so a published file holds no
    /// local path; llama-quantize run beside it, as the model card's
    /// command does, writes the same), the first dataset when there is
    /// one, the entries, and the chunks when there are any.
    pub fn quantize_metadata(&self, path: &Path) -> Vec<(String, MetaValue)> {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut out = vec![("quantize.imatrix.file".to_string(), MetaValue::Str(name))];
        if let Some(first) = self.datasets.first() {
            out.push((
                "quantize.imatrix.dataset".into(),
                MetaValue::Str(first.clone()),
            ));
        }
        let count = |n: u64| MetaValue::Int(n.min(u64::from(u32::MAX)) as u32);
        out.push((
            "quantize.imatrix.entries_count".into(),
            count(self.weights.len() as u64),
        ));
        if self.chunk_count > 0 {
            out.push((
                "quantize.imatrix.chunks_count".into(),
                count(self.chunk_count),
            ));
        }
        out
    }
}

/// The importance matrix of `path`, as llama-quantize loads it.
pub fn read_imatrix(path: &Path) -> Result<ImatrixFile, WorkerError> {
    let (weights, header) = read_weights(path)?;
    let datasets = header
        .get("imatrix.datasets")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let chunk_count = header
        .get("imatrix.chunk_count")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    Ok(ImatrixFile {
        weights,
        datasets,
        chunk_count,
    })
}

/// The weights llama-quantize passes to llama.cpp for each weight tensor of
/// the imatrix file `path`: per matrix, `in_sum2 / count` column by column
/// (f32 division), and 1 for every column of a matrix that saw no input;
/// with the file's header. `Err` names the file and the entry that is not
/// `in_sum2 [n_in, n_mat]` with `counts [1, n_mat]` in F32.
fn read_weights(
    path: &Path,
) -> Result<(BTreeMap<String, Vec<f32>>, gguf::read::GgufHeader), WorkerError> {
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
    Ok((out, r.header))
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
    let header = match gguf::split::open_joined(base) {
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
    if opts.quant.needs_imatrix() && opts.imatrix.is_none() {
        return Err(model_err(format!(
            "{} needs an importance matrix (llama-quantize refuses it without one): pass --imatrix",
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
    let imatrix = opts.imatrix.as_deref().map(read_imatrix).transpose()?;
    let imatrix_tensors = imatrix.as_ref().map_or(0, |m| {
        header
            .tensors
            .iter()
            .filter(|t| m.weights.contains_key(&t.name))
            .count()
    });
    let metadata = match (&imatrix, &opts.imatrix) {
        (Some(m), Some(path)) => m.quantize_metadata(path),
        _ => Vec::new(),
    };
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
        imatrix: imatrix.as_ref().map(|m| &m.weights),
        metadata: &metadata,
    };
    quantize_model(base, tmp.path(), &params)?;
    // A published file: readable by all, as llama-quantize's (the
    // temporary file was made 0600).
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))
        .map_err(io(tmp.path()))?;
    let sha256 = gguf::hash::sha256_file(tmp.path()).map_err(io(tmp.path()))?;
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
