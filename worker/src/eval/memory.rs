//! How many models an evaluation holds at once ([`ModelsInMemory`]), with
//! `auto` chosen from the memory free where the weights go: the GPUs' free
//! memory when layers are offloaded to one, else the host's available
//! memory. Every model when the base and all candidates fit in 90% of it,
//! else the base and one candidate when the base and the largest candidate
//! fit, else one model at a time. A model's size is its file's (GGUF
//! weights load as they are stored).

use crate::error::WorkerError;
use llama::Offload;
use numbers::eval::ModelsInMemory;
use std::path::Path;

/// Share of the free memory the models may take under `auto`; the rest is
/// left to contexts, compute buffers and the kept base rows.
const MODEL_SHARE: f64 = 0.9;

/// The number of models held at once for `base` and `candidates` (model
/// files) placed as `offload` says: between 1 and `1 + candidates`.
pub fn resolve(
    wanted: ModelsInMemory,
    base: &Path,
    candidates: &[&Path],
    offload: &Offload,
) -> Result<usize, WorkerError> {
    let all = 1 + candidates.len();
    if wanted != ModelsInMemory::Auto {
        return Ok(wanted.resolve(candidates.len(), all));
    }
    let size = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.len())
            .map_err(|source| WorkerError::Io {
                path: p.display().to_string(),
                source,
            })
    };
    let base_bytes = size(base)?;
    let cand_bytes = candidates
        .iter()
        .map(|p| size(p))
        .collect::<Result<Vec<_>, _>>()?;
    let free = match offload.n_gpu_layers > 0 {
        true => llama::gpu_free_memory().or_else(runfiles::room::available_memory),
        false => runfiles::room::available_memory(),
    };
    let count = auto_count(base_bytes, &cand_bytes, free);
    tracing::info!(
        free = ?free.map(runfiles::room::human),
        base = %runfiles::room::human(base_bytes),
        models_in_memory = count,
        "models in memory chosen from free memory"
    );
    Ok(count)
}

/// `auto`'s choice for a base of `base` bytes and candidates of `cands`
/// bytes with `free` bytes free (`None`: unknown, every model).
fn auto_count(base: u64, cands: &[u64], free: Option<u64>) -> usize {
    let all = 1 + cands.len();
    let Some(free) = free else {
        return all;
    };
    let budget = (free as f64 * MODEL_SHARE) as u64;
    let sum: u64 = base.saturating_add(cands.iter().sum());
    let largest = cands.iter().copied().max().unwrap_or(0);
    if sum <= budget {
        all
    } else if base.saturating_add(largest) <= budget {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::auto_count;

    #[test]
    fn auto_holds_every_model_that_fits_else_two_else_one() {
        let cands = [60, 80, 60, 70];
        assert_eq!(auto_count(100, &cands, Some(1000)), 5);
        // 370 of models, 90% of 400 is 360: the base and the largest.
        assert_eq!(auto_count(100, &cands, Some(400)), 2);
        assert_eq!(auto_count(100, &cands, Some(200)), 2);
        assert_eq!(auto_count(100, &cands, Some(199)), 1);
        assert_eq!(auto_count(100, &cands, None), 5);
        assert_eq!(auto_count(100, &[], Some(1)), 1);
    }
}
