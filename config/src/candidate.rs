//! Candidate names of `[ship]` and `coordinator ship --candidates`: a keep
//! map of the run (`frequency_K8`), the whole base model (`base`), either
//! with fewer experts routed per token (`frequency_K8_top2`, `base_top2`),
//! or a merge plan of the run (`reap_hybrid_merge_K8`).
//! Taken apart here, before anything is read, so a config is checked
//! before the run.

/// The candidate name of the whole base model.
pub const BASE: &str = "base";

/// Why a candidate name is refused; each names the candidate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CandidateError {
    /// Not usable as a file name.
    #[error("candidate {name:?}: a keep map name of letters, digits, '_', '-' and '.' is expected (it names the shipped files)")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// Named twice in one list.
    #[error("candidate {name:?} is named twice")]
    Twice {
        /// The name.
        name: String,
    },
    /// A `_top<N>` suffix on a merge plan's name.
    #[error("candidate {name:?}: a merged candidate keeps the base model's experts per token (_top<N> applies to keep maps and base)")]
    MergedTop {
        /// The name.
        name: String,
    },
    /// A `_top<N>` suffix with N = 0.
    #[error("candidate {name:?}: _top<N> needs N of at least 1 experts per token")]
    NoExpertsUsed {
        /// The name.
        name: String,
    },
}

/// A candidate name usable as a file name: letters, digits, `_`, `-`, `.`,
/// not starting with a dot.
fn check_name(name: &str) -> Result<(), CandidateError> {
    if !numbers::keep_name::is_valid(name) {
        return Err(CandidateError::BadName { name: name.into() });
    }
    Ok(())
}

/// Splits `name` into the keep map part and the experts per token of a
/// `_top<N>` suffix.
fn split_top(name: &str) -> Result<(&str, Option<u32>), CandidateError> {
    let Some((rest, n)) = name.rsplit_once("_top") else {
        return Ok((name, None));
    };
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Ok((name, None));
    }
    match n.parse::<u32>() {
        Ok(used) if used > 0 && !rest.is_empty() => Ok((rest, Some(used))),
        _ => Err(CandidateError::NoExpertsUsed { name: name.into() }),
    }
}

/// A candidate's name taken apart, before anything is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// The name, the stem of its files (`frequency_K8_top2`).
    pub name: String,
    /// The keep map's name; `None`: the base model (`base`).
    pub keep_map: Option<String>,
    /// Experts routed per token of a `_top<N>` suffix.
    pub experts_used: Option<u32>,
    /// Whether `keep_map` names a merge plan (`<method>_merge_K<k>`).
    pub merged: bool,
}

/// Whether `name` is a merge plan's (`<method>_merge_K<k>`).
pub fn is_merge_plan(name: &str) -> bool {
    numbers::keep_name::split(name)
        .is_some_and(|(method, _)| method.ends_with(runfiles::mergeplan::MERGE_SUFFIX))
}

/// Parses the candidate names `names` (`frequency_K8`, `base_top2`): usable
/// as file names, each named once; errors name the candidate.
pub fn parse(names: &[String]) -> Result<Vec<Named>, CandidateError> {
    let mut out: Vec<Named> = Vec::with_capacity(names.len());
    for given in names {
        let name = runfiles::layout::keep_map_name(given.trim()).to_string();
        check_name(&name)?;
        if out.iter().any(|c| c.name == name) {
            return Err(CandidateError::Twice { name });
        }
        let (map_name, experts_used) = split_top(&name)?;
        let merged = is_merge_plan(map_name);
        if merged && experts_used.is_some() {
            return Err(CandidateError::MergedTop { name });
        }
        out.push(Named {
            keep_map: (map_name != BASE).then(|| map_name.to_string()),
            experts_used,
            merged,
            name,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_suffix_names_the_experts_per_token() {
        assert_eq!(split_top("base_top2").unwrap(), ("base", Some(2)));
        assert_eq!(
            split_top("reap_l2_sum_K8_top3").unwrap(),
            ("reap_l2_sum_K8", Some(3))
        );
        assert_eq!(split_top("frequency_K8").unwrap(), ("frequency_K8", None));
        // Not a number: part of a keep map's name.
        assert_eq!(split_top("x_topaz").unwrap(), ("x_topaz", None));
        assert!(split_top("base_top0")
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        assert!(check_name("../x").is_err() && check_name(".x").is_err());
    }

    #[test]
    fn a_merge_plan_is_a_candidate_without_a_top_suffix() {
        let named = parse(&["reap_hybrid_merge_K8".into(), "reap_hybrid_K8".into()]).unwrap();
        assert!(named[0].merged && !named[1].merged);
        assert_eq!(named[0].keep_map.as_deref(), Some("reap_hybrid_merge_K8"));
        let e = parse(&["reap_hybrid_merge_K8_top2".into()]).unwrap_err();
        assert_eq!(
            e,
            CandidateError::MergedTop {
                name: "reap_hybrid_merge_K8_top2".into()
            }
        );
        assert!(e
            .to_string()
            .contains("keeps the base model's experts per token"));
    }
}
