//! `coordinator verify`: every invariant of DESIGN section 4, one line each
//! with its figure (worst layer, worst deviation); exit 0 only if all hold.
//!
//! - [`stats`]: the statistics invariants.
//! - [`imatrix`]: the importance-matrix invariants.
//! - [`maps`]: the keep-map invariants.

pub mod imatrix;
pub mod maps;
pub mod plans;
pub mod stats;

use crate::StagesError;
use numbers::partial::Partial;
use numbers::saliency::Saliency;
use numbers::Split;
use runfiles::file_error::FileError;
use runfiles::keepmap::KeepMap;
use runfiles::layout;
use runfiles::mergeplan::MergePlan;
use runfiles::store::RunStore;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::process::ExitCode;

/// Invariant names, as printed (tests and reports match on them).
pub mod names {
    /// Every group has the same layers and n_expert values per statistic.
    pub const SHAPE: &str = "every layer holds n_expert values of each statistic";
    /// `sum(count) == n_tokens * k` per layer.
    pub const COUNT_SUM: &str = "per layer sum(count) == n_tokens * k";
    /// What the gating implies of `prob_sum` (softmax: `sum == n_tokens`
    /// per layer; sigmoid: every value in [0, 1], so each sum in
    /// [0, n_tokens]); the figure names the gating.
    pub const PROB_SUM: &str = "router probabilities as the gating implies (softmax: per layer sum(prob_sum) == n_tokens; sigmoid: each in [0, n_tokens])";
    /// `sum(weight_sum) == n_tokens * scale` per layer when the top-k
    /// weights are normalised.
    pub const WEIGHT_SUM: &str =
        "per layer sum(weight_sum) == n_tokens * scale (normalised top-k weights)";
    /// `count == 0` exactly when `reap_l2_sum == 0`.
    pub const DEAD_IFF_ZERO: &str = "count == 0 exactly when reap_l2_sum == 0";
    /// Every value finite.
    pub const FINITE: &str = "every value finite";
    /// The sums of squares are at least their bound (Cauchy-Schwarz).
    pub const CAUCHY_SCHWARZ: &str = numbers::saliency::LayerStats::CAUCHY_SCHWARZ;
    /// No non-finite value dropped during measurement.
    pub const DROPS: &str = "no non-finite values dropped during measurement";
    /// The importance matrix's entries are the model's weights, with every
    /// MoE layer's router and expert weights.
    pub const IMATRIX_ENTRIES: &str = "importance matrix: entries are weights of the model, every MoE layer's router and expert weights present";
    /// Its shapes are the model's.
    pub const IMATRIX_SHAPES: &str =
        "importance matrix: shapes [n_in, n_mat] as the model's weights, counts [1, n_mat]";
    /// Its counts are the fit tokens (per expert: those routed to it).
    pub const IMATRIX_COUNTS: &str =
        "importance matrix: counts == fit tokens (stacked experts: fit tokens routed to each)";
    /// Every value finite and bounded, and Cauchy-Schwarz per column.
    pub const IMATRIX_VALUES: &str = "importance matrix: values finite, in_sum2 <= count x 2^32, Cauchy-Schwarz in_sum^2 <= count x in_sum2";
    /// Trace rows written == tokens traced x layers.
    pub const TRACE_ROWS: &str = "trace rows written == tokens traced x layers";
    /// Keep maps sorted, unique, exactly K per layer.
    pub const MAP_SHAPE: &str = "keep maps: sorted, unique, exactly K per layer";
    /// Keep maps nested across K.
    pub const MAP_NESTED: &str = "keep maps: nested across K";
    /// Keep maps equal to a fresh recomputation.
    pub const MAP_RECOMPUTE: &str = "keep maps: equal to a fresh recomputation from saliency.json";
    /// Merge plans well formed, their centres their keep maps' experts,
    /// super experts alone.
    pub const MERGE_PLANS: &str = "merge plans: K centres per layer, each its own member, none merged twice, centres = the keep map of the same method and K, super experts alone";
    /// Stored per-lease partials hash to what the manifest recorded.
    pub const RECORDED_HASHES: &str = "stored partials hash to the SHA-256 recorded at acceptance";
    /// Merge result independent of how chunks were spread.
    pub const BITWISE: &str = "merged result bitwise identical however chunks were spread";
}

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The invariant holds.
    Pass,
    /// The invariant is violated: `verify` exits non-zero.
    Fail,
    /// Holds, but something needs a person's attention.
    Warn,
    /// Reported, not asserted.
    Info,
}

/// One invariant's line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// The invariant, one of [`names`].
    pub invariant: String,
    /// Whether it holds.
    pub status: Status,
    /// The figure: worst layer, worst deviation, counts.
    pub figure: String,
}

impl Check {
    fn new(invariant: &str, status: Status, figure: String) -> Check {
        Check {
            invariant: invariant.to_string(),
            status,
            figure,
        }
    }
    /// A holding invariant.
    pub fn pass(invariant: &str, figure: String) -> Check {
        Check::new(invariant, Status::Pass, figure)
    }
    /// A violated invariant.
    pub fn fail(invariant: &str, figure: String) -> Check {
        Check::new(invariant, Status::Fail, figure)
    }
    /// A holding invariant with a warning.
    pub fn warn(invariant: &str, figure: String) -> Check {
        Check::new(invariant, Status::Warn, figure)
    }
    /// An informational line.
    pub fn info(invariant: &str, figure: String) -> Check {
        Check::new(invariant, Status::Info, figure)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Warn => "WARN",
            Status::Info => "INFO",
        };
        write!(f, "{tag}  {}: {}", self.invariant, self.figure)
    }
}

/// Every check of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// The run's URL.
    pub run: String,
    /// One per invariant, in DESIGN order.
    pub checks: Vec<Check>,
}

impl VerifyReport {
    /// True when no check failed.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The exit status of `coordinator verify`: success only when no check
    /// failed.
    pub fn exit_code(&self) -> ExitCode {
        if self.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    /// The check of an invariant (one of [`names`]).
    pub fn check(&self, invariant: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.invariant == invariant)
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .collect()
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "verify {}", self.run)?;
        for c in &self.checks {
            writeln!(f, "{c}")?;
        }
        let failed = self.failures().len();
        if failed == 0 {
            writeln!(f, "all {} invariants hold", self.checks.len())
        } else {
            writeln!(f, "{failed} of {} invariants FAILED", self.checks.len())
        }
    }
}

/// Rows of every trace part under `trace/`, from Parquet metadata alone.
pub async fn trace_rows(store: &RunStore) -> Result<(u64, usize), StagesError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let (parts, _decode) = runfiles::trace::stored_parts(store).await?;
    let mut rows = 0u64;
    for part in &parts {
        let reader = SerializedFileReader::new(store.get(part).await?).map_err(|e| {
            StagesError::Artifact {
                url: store.url_of(part),
                problem: format!("not a Parquet file: {e}"),
            }
        })?;
        rows += reader.metadata().file_metadata().num_rows() as u64;
    }
    Ok((rows, parts.len()))
}

fn trace_check(s: &Saliency, rows: u64, parts: usize) -> Check {
    let layers = s
        .split(Split::Fit)
        .or_else(|| s.split(Split::Heldout))
        .map_or(0, |x| x.layers.len() as u64);
    let expected = s.trace_tokens_written * layers;
    let figure = format!(
        "{rows} rows in {parts} parts vs {} tokens x {layers} layers = {expected} ({:+})",
        s.trace_tokens_written,
        rows as i128 - expected as i128
    );
    if rows == expected {
        Check::pass(names::TRACE_ROWS, figure)
    } else {
        Check::fail(names::TRACE_ROWS, figure)
    }
}

/// Every keep map under `keep_maps/`, read by [`KeepMap::read`]; with the
/// refusals (each naming its file) of those that are not valid keep maps,
/// which fail the shape check. A store failure is an error.
pub async fn load_keep_maps(
    store: &RunStore,
) -> Result<(Vec<(String, KeepMap)>, Vec<String>), StagesError> {
    let (mut maps, mut refused) = (Vec::new(), Vec::new());
    for object in store
        .list(runfiles::layout::KEEP_MAPS_DIR)
        .await?
        .into_iter()
        .filter(|n| n.ends_with(".json"))
    {
        match KeepMap::read_object(store, &object).await {
            Ok((map, _)) => maps.push((object, map)),
            Err(FileError::Store(e)) => return Err(e.into()),
            Err(e) => refused.push(e.to_string()),
        }
    }
    Ok((maps, refused))
}

/// Every merge plan under `merge_plans/`, read by
/// [`MergePlan::read_object`]; with the refusals (each naming its file) of
/// those that are not valid plans, which fail the merge plan check. A store
/// failure is an error.
pub async fn load_merge_plans(
    store: &RunStore,
) -> Result<(Vec<(String, MergePlan)>, Vec<String>), StagesError> {
    let (mut plans, mut refused) = (Vec::new(), Vec::new());
    for object in store
        .list(runfiles::mergeplan::MERGE_PLANS_DIR)
        .await?
        .into_iter()
        .filter(|n| n.ends_with(".json"))
    {
        match MergePlan::read_object(store, &object).await {
            Ok(plan) => plans.push((object, plan)),
            Err(FileError::Store(e)) => return Err(e.into()),
            Err(e) => refused.push(e.to_string()),
        }
    }
    Ok((plans, refused))
}

/// Reads every per-lease partial once: re-hashes it against the manifest's
/// record (a changed, unrecorded or missing partial fails), then re-merges
/// the unchanged ones in reverse order and compares the resulting
/// `saliency.json` bytes with the stored ones.
async fn partials_checks(
    store: &RunStore,
    saliency_bytes: &[u8],
) -> Result<[Check; 2], StagesError> {
    let records = runfiles::manifest::read_or_default(store).await?.partials;
    let parts: Vec<String> = store
        .list(runfiles::layout::PARTIALS_DIR)
        .await?
        .into_iter()
        .filter(|n| n.ends_with(".bin") && n != layout::MERGED_PARTIAL)
        .collect();
    let mut changed = Vec::new();
    let mut unrecorded = Vec::new();
    let mut merged: Option<Partial> = None;
    let mut merge_note = None;
    for name in parts.iter().rev() {
        let bytes = store.get(name).await?;
        let sha = gguf::hash::sha256_hex(&bytes);
        match records.get(name) {
            Some(r) if r.sha256 != sha => {
                changed.push(format!("{name} (SHA-256 {sha}, recorded {})", r.sha256));
                continue;
            }
            None => unrecorded.push(name.clone()),
            Some(_) => {}
        }
        let p = Partial::from_bytes(&bytes).map_err(|problem| StagesError::Artifact {
            url: store.url_of(name),
            problem,
        })?;
        match &mut merged {
            None => merged = Some(p),
            Some(m) => {
                if let Err(e) = m.merge(&p) {
                    merge_note.get_or_insert(format!(
                        "stored partials do not re-merge ({e}); not checked here"
                    ));
                }
            }
        }
    }
    let missing: Vec<&String> = records.keys().filter(|n| !parts.contains(n)).collect();
    let n_changed = changed.len();
    let figure = format!(
        "{} partials, {} records: {} changed, {} unrecorded, {} recorded but missing",
        parts.len(),
        records.len(),
        changed.len(),
        unrecorded.len(),
        missing.len()
    );
    let hashes = if !changed.is_empty()
        || !missing.is_empty()
        || (!records.is_empty() && !unrecorded.is_empty())
    {
        let mut named: Vec<String> = changed;
        named.extend(missing.iter().map(|n| format!("{n} (missing)")));
        named.extend(unrecorded.iter().map(|n| format!("{n} (unrecorded)")));
        Check::fail(
            names::RECORDED_HASHES,
            format!("{figure}: {}", named.join(", ")),
        )
    } else if records.is_empty() {
        Check::info(
            names::RECORDED_HASHES,
            format!("{figure} (no coordinator recorded this run's partials)"),
        )
    } else {
        Check::pass(names::RECORDED_HASHES, figure)
    };
    let bitwise = match (merged, merge_note) {
        _ if n_changed > 0 => Check::info(
            names::BITWISE,
            format!("{n_changed} stored partial(s) changed since acceptance; not checked here"),
        ),
        (_, Some(note)) => Check::info(names::BITWISE, note),
        (Some(m), None) if parts.len() >= 2 => {
            let again = m.saliency()?.to_json_bytes();
            let figure = format!("{} partials re-merged in reverse order", parts.len());
            if again == saliency_bytes {
                Check::pass(
                    names::BITWISE,
                    format!("{figure}: saliency.json bytes identical"),
                )
            } else {
                Check::fail(
                    names::BITWISE,
                    format!("{figure}: saliency.json bytes DIFFER"),
                )
            }
        }
        _ => Check::info(
            names::BITWISE,
            format!(
                "{} per-lease partial(s) stored; the distributed tests check this invariant",
                parts.len()
            ),
        ),
    };
    Ok([hashes, bitwise])
}

/// The importance-matrix checks of the run's `imatrix.gguf`, against its
/// model (the manifest's `model_path`) when that file is readable here.
async fn imatrix_checks(store: &RunStore, s: &Saliency) -> Result<Vec<Check>, StagesError> {
    let bytes = store.get_opt(layout::IMATRIX_GGUF).await?;
    let model = runfiles::manifest::read_or_default(store).await?.model_path;
    let (weights, note) = match &model {
        None => (
            None,
            "no model recorded: names not checked against it".to_string(),
        ),
        Some(path) => match gguf::model_weights::ModelWeights::read(path) {
            Ok(w) => (Some(w), String::new()),
            Err(e) => (None, format!("names not checked against the model: {e}")),
        },
    };
    let url = store.url_of(layout::IMATRIX_GGUF);
    Ok(imatrix::check_imatrix(
        bytes.as_deref(),
        &url,
        s,
        weights.as_ref(),
        &note,
    ))
}

/// Runs every check on a run's stored artifacts.
pub async fn verify(store: &RunStore) -> Result<VerifyReport, StagesError> {
    let (parsed, bytes) = runfiles::saliency::read_lenient(store).await?;
    let s = &parsed.saliency;
    let sha = gguf::hash::sha256_hex(&bytes);
    let mut checks = stats::check_saliency(s, &parsed.nonfinite);
    checks.extend(imatrix_checks(store, s).await?);
    let (rows, parts) = trace_rows(store).await?;
    checks.push(trace_check(s, rows, parts));
    let (maps, refused) = load_keep_maps(store).await?;
    checks.extend(maps::check_keep_maps(s, &sha, &maps, &refused));
    let (plans, refused) = load_merge_plans(store).await?;
    checks.push(plans::check_merge_plans(s, &plans, &refused, &maps));
    checks.extend(partials_checks(store, &bytes).await?);
    Ok(VerifyReport {
        run: store.url().to_string(),
        checks,
    })
}

#[cfg(test)]
mod tests;
