//! The candidates of `coordinator ship`, by name: a keep map of the run
//! (`frequency_K8`), the whole base model (`base`), either with fewer
//! experts routed per token (`frequency_K8_top2`, `base_top2`: the model's
//! `expert_used_count` lowered to 2, metadata only), or a merge plan of the
//! run (`reap_hybrid_merge_K8`, issue #57), read from the run. Their names'
//! grammar is [`config::candidate`].

use super::ShipError;
use crate::MeasureError;
use config::candidate::{parse, Named};
use runfiles::keepmap::KeepMap;
use runfiles::mergeplan::MergePlan;
use runfiles::store::RunStore;
use stages::During;
use stages::StagesError;

/// A candidate to ship.
pub struct Candidate {
    /// Its name as given, the stem of its files (`frequency_K8_top2`).
    pub name: String,
    /// The keep map it is sliced to; `None`: every expert is kept. Of a
    /// merged candidate, its plan's centres (named and hashed as the plan).
    pub keep: Option<KeepMapOf>,
    /// Experts routed per token, when lowered.
    pub experts_used: Option<u32>,
    /// The merge plan it is merged to, when it is merged.
    pub merge: Option<MergePlan>,
}

/// A keep map of the run with what names it.
pub struct KeepMapOf {
    /// Its name under the run's `keep_maps/`.
    pub name: String,
    /// The map.
    pub map: KeepMap,
    /// SHA-256 of its stored bytes.
    pub sha256: String,
}

impl Candidate {
    /// Whether the candidate is the base model itself (nothing to make
    /// before quantising, nothing to evaluate unquantised).
    pub fn is_base(&self) -> bool {
        self.keep.is_none() && self.experts_used.is_none()
    }

    /// The object name of its keep map (of a merged candidate, its merge
    /// plan) under the run.
    pub fn keep_map_object(&self) -> Option<String> {
        let k = self.keep.as_ref()?;
        Some(match &self.merge {
            Some(plan) => MergePlan::file_name(&plan.method, plan.k),
            None => KeepMap::object_name(&k.name),
        })
    }
}

/// The candidate list that ships only the Pareto front of the run's
/// evaluation.
pub const PARETO: &str = "pareto";

/// `names` as given, or, for [`PARETO`] alone, the candidates on the
/// size-versus-KL Pareto front of the run's `eval/summary.json`
/// ([`numbers::eval::choice::front_names`]). `pareto` beside other names,
/// or without an evaluation that knew the candidates' sizes, is refused.
pub async fn resolve_pareto(
    store: &RunStore,
    names: &[String],
) -> Result<Vec<String>, MeasureError> {
    if !names.iter().any(|n| n == PARETO) {
        return Ok(names.to_vec());
    }
    let refuse = |problem: String| -> MeasureError {
        StagesError::Argument {
            argument: "--candidates".into(),
            problem,
        }
        .into()
    };
    if names.len() > 1 {
        return Err(refuse(format!(
            "{PARETO} stands alone (it names the candidates itself), not beside {:?}",
            names.iter().filter(|n| *n != PARETO).collect::<Vec<_>>()
        )));
    }
    let summary = runfiles::eval_summary::read_opt(store, &runfiles::layout::EVAL)
        .await?
        .ok_or_else(|| {
        refuse(format!(
            "{PARETO} ships the Pareto front of the run's evaluation, and {} does not exist (run `coordinator eval` first)",
            store.url_of(runfiles::layout::eval::SUMMARY_JSON)
        ))
    })?;
    let front = numbers::eval::choice::front_names(&summary);
    if front.is_empty() {
        return Err(refuse(format!(
            "{} has no candidate with a file size and a KL figure (evaluate again with this version)",
            store.url_of(runfiles::layout::eval::SUMMARY_JSON)
        )));
    }
    Ok(front)
}

/// Reads the candidates `names` from the run; errors name the candidate.
pub async fn read(store: &RunStore, names: &[String]) -> Result<Vec<Candidate>, MeasureError> {
    let mut out: Vec<Candidate> = Vec::with_capacity(names.len());
    for Named {
        name,
        keep_map,
        experts_used,
        merged,
    } in parse(names).map_err(ShipError::from)?
    {
        if let (Some(plan_name), true) = (&keep_map, merged) {
            let (keep, plan) = read_plan(store, plan_name, &name).await?;
            out.push(Candidate {
                name,
                keep: Some(keep),
                experts_used,
                merge: Some(plan),
            });
            continue;
        }
        let keep = match keep_map {
            None => None,
            Some(map_name) => {
                let (map, bytes) = KeepMap::read(store, &map_name)
                    .await
                    .during_with(|| format!("reading keep map {map_name} of candidate {name}"))?;
                Some(KeepMapOf {
                    name: map_name,
                    map,
                    sha256: gguf::hash::sha256_hex(&bytes),
                })
            }
        };
        out.push(Candidate {
            name,
            keep,
            experts_used,
            merge: None,
        });
    }
    Ok(out)
}

/// Reads the run's merge plan `plan_name` (of candidate `name`): its
/// centres as a keep map named and hashed as the plan, and the plan. A plan
/// the run lacks is refused naming it and what writes it.
async fn read_plan(
    store: &RunStore,
    plan_name: &str,
    name: &str,
) -> Result<(KeepMapOf, MergePlan), MeasureError> {
    let object = format!("{}/{plan_name}.json", runfiles::mergeplan::MERGE_PLANS_DIR);
    let Some(bytes) = store.get_opt(&object).await? else {
        return Err(StagesError::Argument {
            argument: "--candidates".into(),
            problem: format!(
                "candidate {name}: the run has no merge plan {plan_name}: {} does not exist (`coordinator score` writes <method>_merge_K<k> beside each keep map when the run has routing traces)",
                store.url_of(&object)
            ),
        }.into());
    };
    let plan =
        MergePlan::decode(&bytes, &store.url_of(&object)).map_err(|e| StagesError::Argument {
            argument: "--candidates".into(),
            problem: format!("candidate {name}: {e}"),
        })?;
    if plan.name() != plan_name {
        return Err(StagesError::Argument {
            argument: "--candidates".into(),
            problem: format!(
                "candidate {name}: {} holds the plan {}",
                store.url_of(&object),
                plan.name()
            ),
        }
        .into());
    }
    let keep = KeepMapOf {
        name: plan_name.to_string(),
        map: plan.keep_map(),
        sha256: gguf::hash::sha256_hex(&bytes),
    };
    Ok((keep, plan))
}
