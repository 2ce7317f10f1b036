//! The scoring methods (DESIGN section 6) by name: what a config's `[eval]`
//! and `[ship]`, a flag and a keep map's name refer to; how each ranks
//! experts belongs to the score stage.

use serde::{Deserialize, Serialize};

/// A scoring method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "String")]
pub enum Method {
    /// `count`.
    Frequency,
    /// `reap_l2_sum / count`.
    ReapMean,
    /// `reap_l2_sum`.
    ReapL2Sum,
    /// `(reap_l2_sum + m * mu0) / (count + m)`.
    ReapShrink,
    /// Mean of the ranks under `reap_l2_sum` and `reap_shrink`.
    ReapHybrid,
    /// The experts maximising the smallest, over calibration domains, of
    /// the domain's retained share of its `reap_l2_sum` (greedy leximin).
    WorstDomain,
}

impl Method {
    /// Every method, in report order.
    pub const ALL: [Method; 6] = [
        Method::Frequency,
        Method::ReapMean,
        Method::ReapL2Sum,
        Method::ReapShrink,
        Method::ReapHybrid,
        Method::WorstDomain,
    ];

    /// The name used in files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Frequency => "frequency",
            Method::ReapMean => "reap_mean",
            Method::ReapL2Sum => "reap_l2_sum",
            Method::ReapShrink => "reap_shrink",
            Method::ReapHybrid => "reap_hybrid",
            Method::WorstDomain => "worst_domain",
        }
    }

    /// Inverse of [`Method::as_str`].
    pub fn parse(s: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// Every method's name, comma-separated (for errors that list them).
    pub fn names() -> String {
        Method::ALL.map(Method::as_str).join(", ")
    }

    /// The method named `s`; another name is refused, listing the methods.
    pub fn named(s: &str) -> Result<Method, String> {
        Method::parse(s)
            .ok_or_else(|| format!("{s:?} is not a scoring method ({})", Method::names()))
    }
}
/// A method read from a file by name: an unknown name is refused with the
/// list of methods ([`Method::named`]).
impl TryFrom<String> for Method {
    type Error = String;

    fn try_from(name: String) -> Result<Method, String> {
        Method::named(&name)
    }
}

/// A method as a candidate family names it (`[eval] methods`, `[ship]`
/// candidates): a scoring method's pruned candidates (`reap_hybrid`,
/// `<method>_K<k>`) or the merge plans `score` writes beside its keep maps
/// (`reap_hybrid_merge`, `<method>_merge_K<k>`, issue #57).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CandidateMethod {
    /// The scoring method (of the keep map, or of the plan's centres).
    pub method: Method,
    /// Whether the candidates are merged (merge plans), not pruned.
    pub merged: bool,
}

impl CandidateMethod {
    /// The name in candidate names: the method's, with
    /// [`runfiles::mergeplan::MERGE_SUFFIX`] when merged.
    pub fn name(self) -> String {
        match self.merged {
            true => format!(
                "{}{}",
                self.method.as_str(),
                runfiles::mergeplan::MERGE_SUFFIX
            ),
            false => self.method.as_str().to_string(),
        }
    }

    /// The candidate method named `s` (`reap_hybrid`, `reap_hybrid_merge`);
    /// another name is refused, listing what is accepted.
    pub fn named(s: &str) -> Result<CandidateMethod, String> {
        let (base, merged) = match s.strip_suffix(runfiles::mergeplan::MERGE_SUFFIX) {
            Some(base) => (base, true),
            None => (s, false),
        };
        Method::parse(base)
            .map(|method| CandidateMethod { method, merged })
            .ok_or_else(|| {
                format!(
                    "{s:?} is not a scoring method ({}), nor one followed by {} (its merge plans)",
                    Method::names(),
                    runfiles::mergeplan::MERGE_SUFFIX
                )
            })
    }
}

/// A scoring method's pruned candidates.
impl From<Method> for CandidateMethod {
    fn from(method: Method) -> CandidateMethod {
        CandidateMethod {
            method,
            merged: false,
        }
    }
}

/// Read by name ([`CandidateMethod::named`]).
impl TryFrom<String> for CandidateMethod {
    type Error = String;

    fn try_from(name: String) -> Result<CandidateMethod, String> {
        CandidateMethod::named(&name)
    }
}

/// Written by name ([`CandidateMethod::name`]).
impl From<CandidateMethod> for String {
    fn from(m: CandidateMethod) -> String {
        m.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candidate_method_is_a_scoring_method_or_its_merge_plans() {
        let merged = CandidateMethod::named("reap_hybrid_merge").unwrap();
        assert_eq!(
            merged,
            CandidateMethod {
                method: Method::ReapHybrid,
                merged: true
            }
        );
        assert_eq!(merged.name(), "reap_hybrid_merge");
        assert_eq!(
            CandidateMethod::named("frequency").unwrap(),
            Method::Frequency.into()
        );
        let e = CandidateMethod::named("reap_merge").unwrap_err();
        assert!(
            e.starts_with("\"reap_merge\" is not a scoring method")
                && e.contains("reap_hybrid")
                && e.contains("_merge (its merge plans)"),
            "{e}"
        );
        assert!(CandidateMethod::named("frequency_merge_merge").is_err());
    }
}
