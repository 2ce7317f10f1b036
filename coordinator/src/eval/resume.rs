//! Resuming an evaluation: the eval partials a previous process stored
//! under `eval/partials/` for units of the same lease plan are reused
//! instead of recomputed, but only when their bytes still hash to the
//! SHA-256 recorded in the manifest (`eval_partials`) at acceptance, they
//! were made under the same settings key (base model, corpus, evaluation
//! settings, candidates and their SHA-256) and they pass the acceptance
//! checks again. Anything else is named in the log, moved under `rejected/`
//! and recomputed, like a collection partial.

use super::EvalRunError;
use crate::net::hub::eval::check_against_job;
use crate::run::record::{check_stored, PartialRecord, Recorder};
use crate::run::resume::set_aside;
use common::eval::{names, EvalPartial};
use common::hash::sha256_hex;
use common::store::RunStore;
use common::wire::EvalJob;
use common::ChunkRange;
use std::collections::{BTreeMap, BTreeSet};

/// The manifest's table of accepted eval partials.
pub const MANIFEST_KEY: &str = "eval_partials";

/// Prefix of the stored eval partials.
pub const PARTIALS_DIR: &str = "eval/partials";

/// What the stored eval partials must match.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    /// SHA-256 of the base model.
    pub base_sha256: &'a str,
    /// SHA-256 of the corpus chunk table.
    pub corpus_sha256: &'a str,
    /// The evaluation job.
    pub job: &'a EvalJob,
    /// The settings key recorded with each accepted eval partial.
    pub settings: &'a str,
}

/// What was found in storage.
#[derive(Debug, Default)]
pub struct Resumed {
    /// Units already done, with their eval partial's hash.
    pub done: BTreeMap<ChunkRange, String>,
    /// Their merge.
    pub merged: Option<EvalPartial>,
    /// Stored eval partials set aside for recomputation, with the reason.
    pub rejected: Vec<(String, String)>,
}

/// Inverse of [`names::partial`]; `None` for other objects.
fn parse_name(name: &str) -> Option<ChunkRange> {
    let rest = name
        .strip_prefix("eval/partials/part-")?
        .strip_suffix(".bin")?;
    let (a, b) = rest.split_once('-')?;
    let range = ChunkRange {
        start: a.parse().ok()?,
        end: b.parse().ok()?,
    };
    (!range.is_empty() && names::partial(range) == name).then_some(range)
}

fn verdict(
    range: ChunkRange,
    bytes: &[u8],
    record: Option<&PartialRecord>,
    want: Expected<'_>,
) -> Result<EvalPartial, String> {
    check_stored(record, bytes, want.settings)?;
    let p = EvalPartial::from_bytes(bytes).map_err(|e| e.to_string())?;
    check_against_job(&p, range, want.base_sha256, want.corpus_sha256, want.job)?;
    Ok(p)
}

/// Reads every stored eval partial; those of a unit of `units` that pass
/// are merged, the others set aside and their records dropped.
pub async fn load(
    store: &RunStore,
    units: &[ChunkRange],
    recorder: &mut Recorder,
    want: Expected<'_>,
) -> Result<Resumed, EvalRunError> {
    let wanted: BTreeSet<ChunkRange> = units.iter().copied().collect();
    let records = recorder.records()?;
    let mut out = Resumed::default();
    for name in store.list(PARTIALS_DIR).await? {
        let bytes = store.get(&name).await?;
        let checked = match parse_name(&name) {
            Some(range) if wanted.contains(&range) => {
                verdict(range, &bytes, records.get(&name), want).map(|p| (range, p))
            }
            _ => Err("not a unit of this run's lease plan".to_string()),
        };
        match checked {
            Ok((range, p)) => {
                out.done.insert(range, sha256_hex(&bytes));
                match &mut out.merged {
                    None => out.merged = Some(p),
                    Some(m) => m.merge(&p).map_err(|source| EvalRunError::Merge {
                        what: store.url_of(&name),
                        source,
                    })?,
                }
            }
            Err(reason) => {
                set_aside(store, &name, &bytes).await?;
                recorder.forget(&name).await?;
                out.rejected.push((name, reason));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_eval_partial_names_parse() {
        let r = ChunkRange { start: 4, end: 6 };
        assert_eq!(parse_name(&names::partial(r)), Some(r));
        assert_eq!(parse_name("eval/partials/part-00000004-00000004.bin"), None);
        assert_eq!(parse_name("partials/part-00000004-00000006.bin"), None);
        assert_eq!(parse_name("eval/partials/part-4-6.bin"), None);
    }
}
