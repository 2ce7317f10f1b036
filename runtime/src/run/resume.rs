//! Resuming, for every kind of lease: the results a previous process stored
//! under the kind's prefix (`partials/`, `eval/partials/`) for units of the
//! same lease plan are reused instead of recomputed, but only when their
//! bytes still hash to the SHA-256 recorded in the manifest at acceptance,
//! they were made under the same settings key, and they pass the kind's
//! acceptance checks again, and they merge with the others. Anything else is
//! named in the log, moved under `rejected/` (so the recomputed result is
//! written create-only under the final name) and recomputed: no stored
//! object can make every resume fail. Objects of another lease plan are left
//! alone. A stored result of a worker's checkpoint covers several units
//! (its record in the manifest names them) and is reused, or set aside, for
//! all of them at once. Per-lease partials of an earlier run (format 5, one
//! unit each, no units in their record) resume as they are.

use super::record::{check_stored, Recorder, Records};
use super::RunError;
use crate::lease::LeaseKind;
use gguf::hash::sha256_hex;
use numbers::ChunkRange;
use runfiles::lease::{Addend, LeaseOutput};
use runfiles::store::RunStore;
use std::collections::{BTreeMap, BTreeSet};

/// What was found in storage.
#[derive(Debug)]
pub struct Resumed<T> {
    /// Units already done, with their result's hash.
    pub done: BTreeMap<ChunkRange, String>,
    /// Their merge.
    pub merged: Option<T>,
    /// Stored results left alone (not a unit of this plan), with the reason.
    pub skipped: Vec<(String, String)>,
    /// Stored results set aside for recomputation, with the reason.
    pub rejected: Vec<(String, String)>,
}

/// Reads every stored result of a unit of `units`; the usable ones are
/// merged, the others set aside (see the module doc) and their records
/// dropped. A result that passes its checks but does not merge with those
/// before it is set aside too, and the merge starts over without it (a
/// failed merge leaves the running total half-added).
pub async fn load<K: LeaseKind>(
    store: &RunStore,
    units: &[ChunkRange],
    kind: &K,
    recorder: &mut Recorder,
    settings: &str,
) -> Result<Resumed<K::Output>, RunError> {
    let mut rejected = Vec::new();
    loop {
        match load_once(store, units, kind, recorder, settings).await? {
            Loaded::All(mut out) => {
                rejected.append(&mut out.rejected);
                out.rejected = rejected;
                return Ok(out);
            }
            Loaded::Unmergeable {
                name,
                bytes,
                reason,
                mut earlier,
            } => {
                set_aside(store, &name, &bytes).await?;
                recorder.forget(&name).await?;
                rejected.append(&mut earlier);
                rejected.push((name, reason));
            }
        }
    }
}

/// One pass over the stored results.
enum Loaded<T> {
    /// Everything usable merged.
    All(Resumed<T>),
    /// `name` passed its checks but did not merge; `earlier` were set aside
    /// before it in this pass.
    Unmergeable {
        name: String,
        bytes: bytes::Bytes,
        reason: String,
        earlier: Vec<(String, String)>,
    },
}

async fn load_once<K: LeaseKind>(
    store: &RunStore,
    units: &[ChunkRange],
    kind: &K,
    recorder: &mut Recorder,
    settings: &str,
) -> Result<Loaded<K::Output>, RunError> {
    let layout = kind.layout();
    let wanted: BTreeSet<ChunkRange> = units.iter().copied().collect();
    let records: Records = recorder.records();
    let mut out = Resumed {
        done: BTreeMap::new(),
        merged: None,
        skipped: Vec::new(),
        rejected: Vec::new(),
    };
    for name in store.list(layout.dir).await? {
        let Some(range) = layout.parse(&name) else {
            continue;
        };
        let covered = match records.get(&name) {
            Some(r) if !r.units.is_empty() => r.units.clone(),
            _ => vec![range],
        };
        if !covered.iter().all(|u| wanted.contains(u)) || crate::lease::span(&covered) != range {
            out.skipped
                .push((name, "not a unit of this run's lease plan".into()));
            continue;
        }
        let bytes = store.get(&name).await?;
        let verdict = check_stored(records.get(&name), &bytes, settings)
            .and_then(|()| kind.decode_and_check(&covered, bytes.clone()));
        match verdict {
            Ok(p) => {
                if let Err(e) = add_into(&mut out.merged, p, || store.url_of(&name)) {
                    return Ok(Loaded::Unmergeable {
                        reason: format!("it does not merge with the other stored results: {e}"),
                        name,
                        bytes,
                        earlier: out.rejected,
                    });
                }
                let sha = sha256_hex(&bytes);
                out.done
                    .extend(covered.into_iter().map(|u| (u, sha.clone())));
            }
            Err(reason) => {
                set_aside(store, &name, &bytes).await?;
                recorder.forget(&name).await?;
                out.rejected.push((name, reason));
            }
        }
    }
    Ok(Loaded::All(out))
}

/// Adds `more` to a running merge; `what` names it in the error.
pub(crate) fn merge_into<T: LeaseOutput>(
    running: &mut Option<T>,
    more: T,
    what: impl FnOnce() -> String,
) -> Result<(), RunError> {
    match running {
        None => *running = Some(more),
        Some(m) => m.merge(&more).map_err(|source| RunError::Merge {
            what: what(),
            source: Box::new(source),
        })?,
    }
    Ok(())
}

/// Adds a checked result to a running merge; `what` names it in the error.
pub(crate) fn add_into<T: LeaseOutput>(
    running: &mut Option<T>,
    more: T::Addend,
    what: impl FnOnce() -> String,
) -> Result<(), RunError> {
    more.add_to(running).map_err(|source| RunError::Merge {
        what: what(),
        source: Box::new(source),
    })
}

/// Moves stored bytes to `rejected/<sha256 prefix>-<file name>`.
async fn set_aside(store: &RunStore, name: &str, bytes: &bytes::Bytes) -> Result<(), RunError> {
    let aside = runfiles::layout::rejected(name, &sha256_hex(bytes));
    store.put(&aside, bytes.clone()).await?;
    store.delete(name).await?;
    Ok(())
}
