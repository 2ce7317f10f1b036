//! Resuming: the partials a previous process stored under `partials/` for
//! units of the same lease plan are checked and merged instead of recomputed.

use super::RunError;
use common::hash::sha256_hex;
use common::partial::Partial;
use common::store::RunStore;
use common::wire::parse_partial_name;
use common::ChunkRange;
use std::collections::{BTreeMap, BTreeSet};

/// What was found in storage.
#[derive(Debug, Default)]
pub struct Resumed {
    /// Units already done, with their partial's hash.
    pub done: BTreeMap<ChunkRange, String>,
    /// Their merge.
    pub merged: Option<Partial>,
    /// Stored partials that were not usable, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Reads every stored partial of a unit of `units` that matches the run's
/// model and corpus; anything else is skipped (and later overwritten).
pub async fn load(
    store: &RunStore,
    units: &[ChunkRange],
    model_sha256: &str,
    corpus_sha256: &str,
) -> Result<Resumed, RunError> {
    let wanted: BTreeSet<ChunkRange> = units.iter().copied().collect();
    let mut out = Resumed::default();
    for name in store.list("partials").await? {
        let Some(range) = parse_partial_name(&name) else {
            continue;
        };
        if !wanted.contains(&range) {
            out.skipped
                .push((name, "not a unit of this run's lease plan".into()));
            continue;
        }
        let bytes = store.get(&name).await?;
        let checked = Partial::from_bytes(&bytes).and_then(|p| {
            if p.chunks != [range] {
                Err(format!("covers {:?}", p.chunks))
            } else if p.model_sha256 != model_sha256 {
                Err(format!("model {} is not the run's", p.model_sha256))
            } else if p.corpus_sha256 != corpus_sha256 {
                Err(format!("corpus {} is not the run's", p.corpus_sha256))
            } else {
                Ok(p)
            }
        });
        match checked {
            Ok(p) => {
                out.done.insert(range, sha256_hex(&bytes));
                match &mut out.merged {
                    None => out.merged = Some(p),
                    Some(m) => m.merge(&p).map_err(|source| RunError::Merge {
                        what: store.url_of(&name),
                        source,
                    })?,
                }
            }
            Err(reason) => out.skipped.push((name, reason)),
        }
    }
    Ok(out)
}
