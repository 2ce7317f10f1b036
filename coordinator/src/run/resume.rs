//! Resuming: the partials a previous process stored under `partials/` for
//! units of the same lease plan are reused instead of recomputed, but only
//! when their bytes still hash to the SHA-256 recorded in the manifest at
//! acceptance, they were made under the same settings key, they pass the
//! acceptance checks again, and they merge with the others. Anything else is
//! named in the log, moved under `rejected/` (so the recomputed partial is
//! written create-only under the final name) and recomputed: no stored
//! object can make every resume fail.

use super::accept::Acceptance;
use super::record::{check_stored, Recorder, Records};
use super::RunError;
use common::hash::sha256_hex;
use common::partial::Partial;
use common::store::RunStore;
use common::wire::parse_partial_name;
use common::ChunkRange;
use std::collections::{BTreeMap, BTreeSet};

/// Prefix under the run where unusable stored partials are moved.
pub const REJECTED_DIR: &str = "rejected";

/// What was found in storage.
#[derive(Debug, Default)]
pub struct Resumed {
    /// Units already done, with their partial's hash.
    pub done: BTreeMap<ChunkRange, String>,
    /// Their merge.
    pub merged: Option<Partial>,
    /// Stored partials left alone (not a unit of this plan), with the reason.
    pub skipped: Vec<(String, String)>,
    /// Stored partials set aside for recomputation, with the reason.
    pub rejected: Vec<(String, String)>,
}

/// Why stored bytes of the unit `range` cannot be reused, if they can't.
fn verdict(
    range: ChunkRange,
    bytes: &[u8],
    record: Option<&super::record::PartialRecord>,
    settings: &str,
    acceptance: &Acceptance,
) -> Result<Partial, String> {
    check_stored(record, bytes, settings)?;
    acceptance.decode_and_check(range, bytes)
}

/// Reads every stored partial of a unit of `units`; the usable ones are
/// merged, the others set aside (see the module doc) and their records
/// dropped. A partial that passes its checks but does not merge with those
/// before it is set aside too, and the merge starts over without it (a
/// failed merge leaves the running total half-added).
pub async fn load(
    store: &RunStore,
    units: &[ChunkRange],
    acceptance: &Acceptance,
    recorder: &mut Recorder,
    settings: &str,
) -> Result<Resumed, RunError> {
    let mut rejected = Vec::new();
    loop {
        match load_once(store, units, acceptance, recorder, settings).await? {
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

/// One pass over the stored partials.
enum Loaded {
    /// Everything usable merged.
    All(Resumed),
    /// `name` passed its checks but did not merge; `earlier` were set aside
    /// before it in this pass.
    Unmergeable {
        name: String,
        bytes: bytes::Bytes,
        reason: String,
        earlier: Vec<(String, String)>,
    },
}

async fn load_once(
    store: &RunStore,
    units: &[ChunkRange],
    acceptance: &Acceptance,
    recorder: &mut Recorder,
    settings: &str,
) -> Result<Loaded, RunError> {
    let wanted: BTreeSet<ChunkRange> = units.iter().copied().collect();
    let records: Records = recorder.records()?;
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
        match verdict(range, &bytes, records.get(&name), settings, acceptance) {
            Ok(p) => {
                let merged = match &mut out.merged {
                    None => {
                        out.merged = Some(p);
                        Ok(())
                    }
                    Some(m) => m.merge(&p),
                };
                if let Err(e) = merged {
                    return Ok(Loaded::Unmergeable {
                        reason: format!("it does not merge with the other stored partials: {e}"),
                        name,
                        bytes,
                        earlier: out.rejected,
                    });
                }
                out.done.insert(range, sha256_hex(&bytes));
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

/// Moves stored bytes to `rejected/<sha256 prefix>-<file name>`.
pub(crate) async fn set_aside(
    store: &RunStore,
    name: &str,
    bytes: &bytes::Bytes,
) -> Result<(), RunError> {
    let file = name.rsplit('/').next().unwrap_or(name);
    let aside = format!("{REJECTED_DIR}/{}-{file}", &sha256_hex(bytes)[..16]);
    store.put(&aside, bytes.clone()).await?;
    store.delete(name).await?;
    Ok(())
}
