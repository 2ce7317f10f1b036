//! Making every shipped file of a `coordinator ship` in its output
//! directory, in order: the run's importance matrix (`base.imatrix.gguf`),
//! then per candidate its GGUF (sliced and derived from the base model)
//! and its sliced importance matrix, then every quantised file from its
//! unquantised source and that importance matrix. Each file's recipe
//! decides whether a stored file (with its card) is reused.

use super::card::{FileRef, KeepMapRef, ModelCard, Recipe};
use super::files::{self, OutDir, Placed};
use super::spec::Shipped;
use super::{facts, ShipError};
use common::keepmap::KeepMap;
use common::quant::QuantType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// File name of the run's importance matrix in the output directory.
pub const BASE_IMATRIX: &str = "base.imatrix.gguf";

/// A keep map read from the run.
pub struct MapInput {
    /// The map.
    pub keep: KeepMap,
    /// SHA-256 of its stored bytes.
    pub sha256: String,
}

/// What the files are made from.
pub struct Inputs<'a> {
    /// The base GGUF.
    pub base: &'a Path,
    /// Its SHA-256 (checked against the run's).
    pub base_sha256: &'a str,
    /// Keep maps by name.
    pub maps: &'a BTreeMap<String, MapInput>,
    /// The run's `imatrix.gguf`, when a file is quantised.
    pub imatrix: Option<&'a [u8]>,
    /// The `worker` binary (`worker quantize`).
    pub worker: &'a Path,
    /// CPU threads of the quantiser.
    pub threads: u32,
    /// Quantise a base model that is already quantised.
    pub allow_requantize: bool,
}

/// A shipped file at its final name, with how it was made.
pub struct Made {
    /// The file.
    pub shipped: Shipped,
    /// Its bytes.
    pub placed: Placed,
    /// Its recipe.
    pub recipe: Recipe,
    /// Model tensors the quantiser had importance weights for.
    pub imatrix_tensors: Option<usize>,
}

/// The moe-census version in recipes and cards.
pub fn version() -> String {
    format!("moe-census {}", env!("CARGO_PKG_VERSION"))
}

/// The card stored beside `name` in `out`, if it reads as one.
pub fn stored_card(out: &OutDir, name: &str) -> Option<ModelCard> {
    let bytes = std::fs::read(out.path(&format!("{name}.json"))).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Makes (or reuses) every file of `list`.
pub fn make_all(out: &OutDir, list: &[Shipped], inp: &Inputs<'_>) -> Result<Vec<Made>, ShipError> {
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |e: common::prune::PruneError| ShipError::File {
            path: path.clone(),
            reason: e.to_string(),
        }
    };
    let base_imatrix = match (inp.imatrix, list.iter().any(|s| s.quant.is_some())) {
        (Some(bytes), true) => {
            let placed = out.place(BASE_IMATRIX, None, |p| {
                std::fs::write(p, bytes).map_err(|e| ShipError::File {
                    path: p.to_path_buf(),
                    reason: e.to_string(),
                })
            })?;
            Some(FileRef {
                file: BASE_IMATRIX.into(),
                sha256: placed.sha256,
            })
        }
        (None, true) => {
            return Err(ShipError::Setup(format!(
                "the run has no {}: quantised files need it (run `coordinator run` or `coordinator merge` first)",
                common::layout::IMATRIX_GGUF
            )))
        }
        _ => None,
    };
    // Per candidate: (its file, its sliced importance matrix).
    let mut sources: BTreeMap<String, (PathBuf, Option<FileRef>)> = BTreeMap::new();
    let mut made = Vec::with_capacity(list.len());
    for s in list {
        let map = s.spec.as_ref().and_then(|c| c.keep_map.as_ref()).map(|name| &inp.maps[name]);
        let file = format!("{}.gguf", s.name);
        let mut recipe = Recipe {
            base_sha256: inp.base_sha256.to_string(),
            keep_map: s.spec.as_ref().and_then(|c| c.keep_map.clone()).zip(map).map(|(name, m)| KeepMapRef {
                name,
                method: m.keep.method.clone(),
                k: m.keep.k,
                sha256: m.sha256.clone(),
            }),
            top_k: s.spec.as_ref().and_then(|c| c.top_k),
            quant: s.quant,
            imatrix: None,
            moe_census_version: version(),
        };
        let recorded = |recipe: &Recipe| {
            stored_card(out, &s.name)
                .filter(|c| c.recipe == *recipe && c.file.file == file)
                .map(|c| c.file.sha256)
        };
        let mut imatrix_tensors = None;
        let placed = match (s.quant, &s.spec) {
            (None, Some(spec)) => {
                let placed = out.place(&file, recorded(&recipe).as_deref(), |p| {
                    common::prune::derive_model(inp.base, map.map(|m| &m.keep), spec.top_k, p)
                        .map(|_| ())
                        .map_err(fail(inp.base))
                })?;
                let imatrix = match (map, &base_imatrix) {
                    (Some(m), Some(_)) => {
                        let name = format!("{}.imatrix.gguf", s.name);
                        let from = out.path(BASE_IMATRIX);
                        let placed = out.place(&name, None, |p| {
                            common::prune::slice_imatrix(&from, &m.keep, p)
                                .map(|_| ())
                                .map_err(fail(&from))
                        })?;
                        Some(FileRef {
                            file: name,
                            sha256: placed.sha256,
                        })
                    }
                    _ => base_imatrix.clone(),
                };
                sources.insert(s.name.clone(), (out.path(&file), imatrix));
                placed
            }
            (Some(q), spec) => {
                let (model, imatrix) = match spec {
                    None => (inp.base.to_path_buf(), base_imatrix.clone()),
                    Some(c) => sources.get(&c.name()).cloned().ok_or_else(|| {
                        ShipError::Setup(format!("{} is quantised before its source is made", s.name))
                    })?,
                };
                let imatrix = imatrix.expect("a quantised file has an importance matrix");
                let im_path = out.path(&imatrix.file);
                imatrix_tensors = Some(facts::imatrix_tensors(
                    &facts::header(&model)?,
                    &facts::header(&im_path)?,
                ));
                recipe.imatrix = Some(imatrix);
                out.place(&file, recorded(&recipe).as_deref(), |p| {
                    quantize(inp, &model, &im_path, q, p)
                })?
            }
            (None, None) => unreachable!("the unquantised base is not shipped"),
        };
        made.push(Made {
            shipped: s.clone(),
            placed,
            recipe,
            imatrix_tensors,
        });
    }
    Ok(made)
}

fn quantize(inp: &Inputs<'_>, model: &Path, imatrix: &Path, q: QuantType, out: &Path) -> Result<(), ShipError> {
    files::quantize(
        inp.worker,
        model,
        imatrix,
        q,
        out,
        inp.threads,
        inp.allow_requantize,
    )
}
