//! What `coordinator ship` makes: candidate specs (`reap_hybrid_K8`,
//! `top2`, `reap_hybrid_K8+top2`) and the list of shipped files they and
//! the quantisation types give, each with its name (`reap_hybrid_K8.Q8_0`).

use common::keepmap::KeepMap;
use common::quant::QuantType;
use serde::{Deserialize, Serialize};

/// One candidate: a keep map, a lower top-k, or both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// Keep map name, `<method>_K<k>`.
    pub keep_map: Option<String>,
    /// `expert_used_count` of the candidate, below the base model's.
    pub top_k: Option<u32>,
}

impl Spec {
    /// Parses `<method>_K<k>`, `top<t>` or `<method>_K<k>+top<t>`.
    pub fn parse(s: &str) -> Result<Spec, String> {
        let bad = |why: &str| Err(format!("candidate {s:?}: {why}"));
        let mut spec = Spec {
            keep_map: None,
            top_k: None,
        };
        for part in s.split('+') {
            if let Some(t) = part.strip_prefix("top") {
                let Ok(t) = t.parse::<u32>() else {
                    return bad("top-k is written top<number>, e.g. top2");
                };
                if spec.top_k.replace(t).is_some() {
                    return bad("names two top-k values");
                }
            } else {
                let is_map = part
                    .rsplit_once("_K")
                    .is_some_and(|(m, k)| !m.is_empty() && k.parse::<u32>().is_ok());
                if !is_map || part.contains(['/', '.', ' ']) {
                    return bad("expected a keep map <method>_K<k>, top<t>, or <method>_K<k>+top<t>");
                }
                if spec.keep_map.replace(part.to_string()).is_some() {
                    return bad("names two keep maps");
                }
            }
        }
        Ok(spec)
    }

    /// The spec as written (`reap_hybrid_K8+top2`).
    pub fn name(&self) -> String {
        let top = self.top_k.map(|t| format!("top{t}"));
        [self.keep_map.clone(), top]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Object name of its keep map under the run.
    pub fn keep_map_object(&self) -> Option<String> {
        self.keep_map.as_deref().map(KeepMap::object_name)
    }
}

/// One shipped file: a candidate (none: the base model), quantised or not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipped {
    /// `reap_hybrid_K8.Q8_0`, `base.Q8_0`, `top2`: its name in tables, and
    /// its file name without `.gguf`.
    pub name: String,
    /// The candidate; `None` for the quantised base model.
    pub spec: Option<Spec>,
    /// Its quantisation type; `None` leaves the base model's types.
    pub quant: Option<QuantType>,
}

impl Shipped {
    /// The unquantised file a quantised one is made from (`None`: the base
    /// model itself).
    pub fn source(&self) -> Option<String> {
        self.spec.as_ref().map(Spec::name)
    }
}

/// Every file `candidates` and `quants` give, in table order: the base
/// model quantised to each type (what quantisation alone costs), then each
/// candidate unquantised (what pruning alone costs) and quantised to each
/// type. A candidate named twice is refused.
pub fn shipped(candidates: &[Spec], quants: &[QuantType]) -> Result<Vec<Shipped>, String> {
    let mut out: Vec<Shipped> = quants
        .iter()
        .map(|&q| Shipped {
            name: format!("base.{q}"),
            spec: None,
            quant: Some(q),
        })
        .collect();
    for (i, c) in candidates.iter().enumerate() {
        if candidates[..i].contains(c) {
            return Err(format!("candidate {} is named twice", c.name()));
        }
        out.push(Shipped {
            name: c.name(),
            spec: Some(c.clone()),
            quant: None,
        });
        out.extend(quants.iter().map(|&q| Shipped {
            name: format!("{}.{q}", c.name()),
            spec: Some(c.clone()),
            quant: Some(q),
        }));
    }
    for (i, q) in quants.iter().enumerate() {
        if quants[..i].contains(q) {
            return Err(format!("quantisation type {q} is named twice"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_name_themselves() {
        let s = Spec::parse("reap_hybrid_K8+top2").unwrap();
        assert_eq!(s.keep_map.as_deref(), Some("reap_hybrid_K8"));
        assert_eq!((s.top_k, s.name()), (Some(2), "reap_hybrid_K8+top2".into()));
        assert_eq!(Spec::parse("top2").unwrap().name(), "top2");
        assert_eq!(
            Spec::parse("frequency_K12").unwrap().keep_map_object().as_deref(),
            Some("keep_maps/frequency_K12.json")
        );
        for bad in ["top", "topx", "K8", "_K8", "x_Kz", "a_K8+b_K4", "top2+top3", "../a_K8"] {
            let e = Spec::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn files_are_the_base_per_type_then_each_candidate_plain_and_per_type() {
        let c = [Spec::parse("a_K8").unwrap(), Spec::parse("top2").unwrap()];
        let q = [QuantType::Q8_0, QuantType::Q4_K_M];
        let names: Vec<String> = shipped(&c, &q).unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "base.Q8_0",
                "base.Q4_K_M",
                "a_K8",
                "a_K8.Q8_0",
                "a_K8.Q4_K_M",
                "top2",
                "top2.Q8_0",
                "top2.Q4_K_M"
            ]
        );
        assert!(shipped(&[c[0].clone(), c[0].clone()], &q).is_err());
        assert!(shipped(&c, &[QuantType::Q8_0, QuantType::Q8_0]).is_err());
    }
}
