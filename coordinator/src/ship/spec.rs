//! The candidates of `coordinator ship`, by name: a keep map of the run
//! (`frequency_K8`), the whole base model (`base`), either with fewer
//! experts routed per token (`frequency_K8_top2`, `base_top2`: the model's
//! `expert_used_count` lowered to 2, metadata only).

use anyhow::{bail, Context};
use common::keepmap::KeepMap;
use common::store::RunStore;

/// The candidate name of the whole base model.
pub const BASE: &str = "base";

/// A candidate to ship.
pub struct Candidate {
    /// Its name as given, the stem of its files (`frequency_K8_top2`).
    pub name: String,
    /// The keep map it is sliced to; `None`: every expert is kept.
    pub keep: Option<KeepMapOf>,
    /// Experts routed per token, when lowered.
    pub experts_used: Option<u32>,
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

    /// The object name of its keep map under the run.
    pub fn keep_map_object(&self) -> Option<String> {
        self.keep.as_ref().map(|k| KeepMap::object_name(&k.name))
    }
}

/// A candidate name usable as a file name: letters, digits, `_`, `-`, `.`,
/// not starting with a dot.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        bail!("candidate {name:?}: a keep map name of letters, digits, '_', '-' and '.' is expected (it names the shipped files)");
    }
    Ok(())
}

/// Splits `name` into the keep map part and the experts per token of a
/// `_top<N>` suffix.
fn split_top(name: &str) -> anyhow::Result<(&str, Option<u32>)> {
    let Some((rest, n)) = name.rsplit_once("_top") else {
        return Ok((name, None));
    };
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Ok((name, None));
    }
    match n.parse::<u32>() {
        Ok(used) if used > 0 && !rest.is_empty() => Ok((rest, Some(used))),
        _ => bail!("candidate {name:?}: _top<N> needs N of at least 1 experts per token"),
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
}

/// Parses the candidate names `names` (`frequency_K8`, `base_top2`): usable
/// as file names, each named once; errors name the candidate.
pub fn parse(names: &[String]) -> anyhow::Result<Vec<Named>> {
    let mut out: Vec<Named> = Vec::with_capacity(names.len());
    for given in names {
        let name = common::layout::keep_map_name(given.trim()).to_string();
        check_name(&name)?;
        if out.iter().any(|c| c.name == name) {
            bail!("candidate {name:?} is named twice");
        }
        let (map_name, experts_used) = split_top(&name)?;
        out.push(Named {
            keep_map: (map_name != BASE).then(|| map_name.to_string()),
            experts_used,
            name,
        });
    }
    Ok(out)
}

/// Reads the candidates `names` from the run; errors name the candidate.
pub async fn read(store: &RunStore, names: &[String]) -> anyhow::Result<Vec<Candidate>> {
    let mut out: Vec<Candidate> = Vec::with_capacity(names.len());
    for Named {
        name,
        keep_map,
        experts_used,
    } in parse(names)?
    {
        let keep = match keep_map {
            None => None,
            Some(map_name) => {
                let object = KeepMap::object_name(&map_name);
                let bytes = store
                    .get(&object)
                    .await
                    .with_context(|| format!("reading keep map {map_name} of candidate {name}"))?;
                let map: KeepMap = serde_json::from_slice(&bytes)
                    .with_context(|| format!("parsing keep map {}", store.url_of(&object)))?;
                Some(KeepMapOf {
                    name: map_name,
                    map,
                    sha256: common::hash::sha256_hex(&bytes),
                })
            }
        };
        out.push(Candidate {
            name,
            keep,
            experts_used,
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
}
