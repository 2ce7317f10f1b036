//! The scoring methods (DESIGN section 6) by name: what a config's `[eval]`
//! and `[ship]`, a flag and a keep map's name refer to; how each ranks
//! experts belongs to the score stage.

use serde::{Deserialize, Serialize};

/// A scoring method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case", try_from = "String")]
#[cfg_attr(feature = "cli", value(rename_all = "snake_case"))]
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
