//! The candidates of an evaluation: keep maps read from the run and sliced
//! from the base model by the coordinator too, so it knows the SHA-256
//! every worker's slice must have.

use super::EvalRunError;
use crate::MeasureError;
use protocol::wire::EvalCandidate;
use runfiles::file_error::FileError;
use runfiles::keepmap::{KeepMap, KeepMapRef};
use runfiles::mergeplan::MergePlan;
use runfiles::store::{RunStore, StoreError};
use std::collections::BTreeMap;
use std::path::Path;

/// Brings the keep maps given as files (written by hand, `{"layers":
/// {"0": [ids], ...}}`) into the run: each is checked against the run's
/// model and stored as `keep_maps/<file stem>.json`, where workers read
/// it and `verify` checks it as it checks the run's own; the names of the
/// run's maps pass as they are. A stem already holding another map is
/// refused, never replaced.
pub async fn import(store: &RunStore, names: &[String]) -> Result<Vec<String>, MeasureError> {
    let mut out = Vec::with_capacity(names.len());
    for given in names {
        let KeepMapRef::File(path) = KeepMapRef::parse(given) else {
            out.push(given.clone());
            continue;
        };
        let bad = |reason: String| EvalRunError::KeepMap {
            name: given.clone(),
            reason,
        };
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let named = config::candidate::parse(std::slice::from_ref(&stem))
            .map_err(|e| bad(format!("its file name does not make a keep map name: {e}")))?;
        if named[0].keep_map.is_none() {
            return Err(bad("\"base\" names the base model; rename the file".into()).into());
        }
        let (_, keep) = stages::prune::read_keep_map(store, given).await?;
        let object = KeepMap::object_name(&stem);
        let mut bytes = stages::StagesError::encode_json(&object, &keep)?;
        bytes.push(b'\n');
        // Create-only: an equal map already there is this one; another is
        // never replaced.
        match store.put_new(&object, bytes.clone()).await {
            Err(StoreError::AlreadyExists { url }) if store.get(&object).await? != bytes => {
                return Err(bad(format!(
                    "{url} already holds another keep map; rename the file"
                ))
                .into())
            }
            Err(StoreError::AlreadyExists { .. }) | Ok(()) => {}
            Err(e) => return Err(e.into()),
        }
        out.push(stem);
    }
    Ok(out)
}

/// Reads each named keep map (`<method>_K<k>`) from the run and slices it
/// from `base` in a scratch directory (removed afterwards); returns the
/// job's candidates with the SHA-256 of each slice, and each slice's size
/// in bytes by name.
pub async fn prepare(
    store: &RunStore,
    names: &[String],
    base: &Path,
) -> Result<(Vec<EvalCandidate>, BTreeMap<String, u64>), EvalRunError> {
    if names.is_empty() {
        return Err(EvalRunError::Setup(
            "no keep maps to evaluate (give --keep-maps, or [eval] keep_maps or methods and k)"
                .into(),
        ));
    }
    let scratch = tempfile::tempdir()
        .map_err(|e| EvalRunError::Setup(format!("cannot create a scratch directory: {e}")))?;
    let mut out: Vec<EvalCandidate> = Vec::with_capacity(names.len());
    let mut sizes = BTreeMap::new();
    for name in names {
        let bad = |reason: String| EvalRunError::KeepMap {
            name: name.clone(),
            reason,
        };
        if out.iter().any(|c| &c.name == name) {
            return Err(bad("named twice".into()));
        }
        let path = scratch.path().join(format!("{name}.gguf"));
        if config::candidate::is_merge_plan(name) {
            let (object, sliced) = merged(store, name, base, &path).await?;
            sizes.insert(name.clone(), sliced.bytes);
            std::fs::remove_file(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            out.push(pruned(name, object, sliced.sha256));
            continue;
        }
        let object = KeepMap::object_name(name);
        let (keep, _) = KeepMap::read(store, name).await.map_err(|e| match e {
            FileError::Store(StoreError::NotFound { url }) => bad(format!(
                "{url} does not exist (run `coordinator score` first; names are <method>_K<k>)"
            )),
            FileError::Store(e) => e.into(),
            e @ FileError::Invalid { .. } => bad(e.to_string()),
        })?;
        let sliced = slicer::slice_model(base, &keep, &path)
            .map_err(|e| bad(format!("slicing {}: {e}", base.display())))?;
        let bytes = std::fs::metadata(&path)
            .map_err(|e| bad(format!("{}: {e}", path.display())))?
            .len();
        std::fs::remove_file(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        sizes.insert(name.clone(), bytes);
        out.push(pruned(name, object, sliced.sha256));
    }
    Ok((out, sizes))
}

/// The candidate `name` whose model is the base pruned by the run's
/// keep map or merge plan `object` (hashed `sha256`): the base's routing,
/// unquantised.
fn pruned(name: &str, object: String, sha256: String) -> EvalCandidate {
    EvalCandidate {
        name: name.to_string(),
        keep_map: Some(object),
        sha256,
        expert_used: None,
        quant: None,
    }
}

/// Reads the run's merge plan `name` and merges it from `base` to `path`
/// with the installed codec ([`slicer::installed_codec`]); returns the
/// plan's object name and what was written.
async fn merged(
    store: &RunStore,
    name: &str,
    base: &Path,
    path: &Path,
) -> Result<(String, slicer::Sliced), EvalRunError> {
    let bad = |reason: String| EvalRunError::KeepMap {
        name: name.to_string(),
        reason,
    };
    let object = format!("{}/{name}.json", runfiles::mergeplan::MERGE_PLANS_DIR);
    let plan = match MergePlan::read_object(store, &object).await {
        Ok(plan) => plan,
        Err(FileError::Store(StoreError::NotFound { .. })) => {
            return Err(bad(no_plan(store, name, &object).await?))
        }
        Err(FileError::Store(e)) => return Err(e.into()),
        Err(e @ FileError::Invalid { .. }) => return Err(bad(e.to_string())),
    };
    let sliced = slicer::merge_model(base, &plan, slicer::installed_codec(), path)
        .map_err(|e| bad(format!("merging {}: {e}", base.display())))?;
    Ok((object, sliced))
}

/// Why the run has no merge plan `name` at `object`: names the method and
/// size, and says why `score` wrote none when its report says (a run
/// without routing traces).
async fn no_plan(store: &RunStore, name: &str, object: &str) -> Result<String, EvalRunError> {
    let (method, k) = numbers::keep_name::split(name).unwrap_or((name, "?"));
    let mut why = format!(
        "the run has no merge plan of method {method} at K={k}: {} does not exist",
        store.url_of(object)
    );
    let report = runfiles::layout::score::REPORT_JSON;
    /// The one field of `score/score.json` read here.
    #[derive(serde::Deserialize)]
    struct Note {
        merge_note: Option<String>,
    }
    let note = match store.get_opt(report).await? {
        Some(bytes) => serde_json::from_slice::<Note>(&bytes)
            .ok()
            .and_then(|r| r.merge_note),
        None => None,
    };
    match note {
        Some(note) => why.push_str(&format!(
            " ({} says why score wrote none: {})",
            store.url_of(report),
            numbers::peer_text::peer_text(&note)
        )),
        None => why.push_str(
            " (`coordinator score` writes <method>_merge_K<k> beside each keep map <method>_K<k> when the run has routing traces)",
        ),
    }
    Ok(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A merge plan the run lacks is refused naming the method and size,
    /// with the reason `score` recorded, before the base model is read.
    #[tokio::test]
    async fn a_missing_merge_plan_is_refused_naming_its_method() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        let base = dir.path().join("absent.gguf");
        let names = ["reap_hybrid_merge_K16".to_string()];
        let e = prepare(&store, &names, &base)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("keep map reap_hybrid_merge_K16: the run has no merge plan of method reap_hybrid_merge at K=16")
                && e.contains("merge_plans/reap_hybrid_merge_K16.json does not exist")
                && e.contains("when the run has routing traces"),
            "{e}"
        );
        // With score's report saying why it wrote no plans, that is said.
        let report = serde_json::json!({
            "methods": ["reap_hybrid"],
            "merge_note": "no trace rows: [collect] trace_tokens_per_split = 0",
        });
        store
            .put(
                runfiles::layout::score::REPORT_JSON,
                serde_json::to_vec(&report).unwrap(),
            )
            .await
            .unwrap();
        let e = prepare(&store, &names, &base)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "says why score wrote none: no trace rows: [collect] trace_tokens_per_split = 0"
            ),
            "{e}"
        );
    }
}
