//! What a model card says about the run a file came from: the base model
//! (from its GGUF header), the calibration corpus (the manifest and corpus
//! index), and what each keep map did to routing and to dead experts
//! (`score/score.json` and `saliency.json`, fit split).

use super::card::{Base, Corpus, Domain, Pruning};
use super::ShipError;
use common::gguf_read::{GgufHeader, GgufReader, GgufValue};
use common::store::RunStore;
use std::collections::BTreeMap;
use std::path::Path;

/// The base model's header facts; `sha256` is its checked hash.
pub fn base(path: &Path, header: &GgufHeader, sha256: &str) -> Result<Base, ShipError> {
    let bad = |reason: &str| ShipError::Setup(format!("base model {}: {reason}", path.display()));
    let arch = header
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| bad("no general.architecture"))?;
    let count = |key: &str| {
        header
            .get(&format!("{arch}.{key}"))
            .and_then(GgufValue::as_u64)
            .map(|v| v as u32)
            .ok_or_else(|| bad(&format!("no {arch}.{key}")))
    };
    let file = path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let name = header
        .get("general.name")
        .and_then(GgufValue::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            path.file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        });
    Ok(Base {
        name,
        file,
        sha256: sha256.to_string(),
        architecture: arch.to_string(),
        n_expert: count("expert_count")?,
        n_expert_used: count("expert_used_count")?,
    })
}

/// The header of a GGUF file.
pub fn header(path: &Path) -> Result<GgufHeader, ShipError> {
    GgufReader::open(path)
        .map(|r| r.header)
        .map_err(|e| ShipError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// The calibration corpus of the run.
pub async fn corpus(store: &RunStore, index: &common::corpus::CorpusIndex) -> Result<Corpus, ShipError> {
    let manifest = crate::corpus::read_manifest(store)
        .await
        .map_err(|e| ShipError::Setup(e.to_string()))?
        .ok_or_else(|| {
            ShipError::Setup(format!(
                "{} is missing: not a run location",
                store.url_of(crate::corpus::MANIFEST_FILE)
            ))
        })?;
    let domains = manifest
        .domains
        .iter()
        .map(|d| Domain {
            name: d.shares.domain.clone(),
            tokens: d.shares.tokens,
            token_share: d.shares.token_share,
            target: d.shares.target,
            heldout_fraction: d.heldout_fraction,
            fit_tokens: d.fit_tokens,
            heldout_tokens: d.heldout_tokens,
        })
        .collect();
    Ok(Corpus {
        chunks_sha256: index.chunks_sha256.clone(),
        n_tokens: index.n_tokens,
        n_chunks: index.n_chunks,
        n_ctx: index.n_ctx,
        domains,
    })
}

/// Per keep map name (`<method>_K<k>`) that `score` tabled: its slot
/// replacement and what it did with the experts never routed to on the
/// fit split.
pub async fn pruning(store: &RunStore) -> Result<BTreeMap<String, Pruning>, ShipError> {
    let tables = crate::report::eval::slot_tables(store)
        .await
        .map_err(|e| ShipError::Setup(format!("{e:#}")))?;
    let (saliency, _) = crate::score::load_saliency(store)
        .await
        .map_err(|e| ShipError::Setup(format!("{e:#}")))?;
    let dead: u32 = saliency
        .splits
        .get("fit")
        .map(|s| {
            s.layers
                .iter()
                .map(|l| l.count.iter().filter(|&&c| c == 0).count() as u32)
                .sum()
        })
        .unwrap_or(0);
    Ok(tables
        .into_iter()
        .map(|t| {
            let p = Pruning {
                k: t.k,
                slot_replacement_mean: t.slot_replacement_mean,
                slot_replacement_worst: t.slot_replacement_worst,
                worst_layer: t.worst_layer,
                dead_experts: dead,
                dead_kept: t.dead_kept,
                kept_under_100: t.kept_under_100,
            };
            (format!("{}_K{}", t.method, t.k), p)
        })
        .collect())
}

/// Model tensors of `model` that the importance matrix `imatrix` has an
/// entry for (`<tensor>.in_sum2`): what the quantiser can weigh.
pub fn imatrix_tensors(model: &GgufHeader, imatrix: &GgufHeader) -> usize {
    let entries: std::collections::BTreeSet<&str> = imatrix
        .tensors
        .iter()
        .filter_map(|t| t.name.strip_suffix(".in_sum2"))
        .collect();
    model
        .tensors
        .iter()
        .filter(|t| entries.contains(t.name.as_str()))
        .count()
}
