//! The name a keep map and the candidate pruned to it go by:
//! `<method>_K<k>` (`frequency_K8`), the one place it is built and read.

use std::fmt;

/// The separator between a keep map's method and its size.
const SEPARATOR: &str = "_K";

/// The suffix a merge plan's method carries in its name:
/// `<method>_merge_K<k>` (`reap_hybrid_merge_K16`, issue #57).
pub const MERGE_SUFFIX: &str = "_merge";

/// The method whose keep map a merge plan's centres are (`reap_hybrid` of
/// `reap_hybrid_merge`); `None` for a method that names no merge plan.
pub fn merged_from(method: &str) -> Option<&str> {
    method.strip_suffix(MERGE_SUFFIX)
}

/// A keep map's name: its scoring method and the experts it keeps per layer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeepMapName {
    /// Scoring method (`frequency`, `reap_hybrid`, ...).
    pub method: String,
    /// Experts kept per MoE layer.
    pub k: u32,
}

impl KeepMapName {
    /// The name of `method`'s map at `k`.
    pub fn new(method: &str, k: u32) -> KeepMapName {
        KeepMapName {
            method: method.to_string(),
            k,
        }
    }

    /// Parses `<method>_K<k>` with a whole number `k`; `None` for another
    /// name (a hand-written map's file name, `base`).
    pub fn parse(name: &str) -> Option<KeepMapName> {
        let (method, size) = split(name)?;
        let k = size.parse().ok()?;
        Some(KeepMapName::new(method, k))
    }
}

/// What a keep map's (and a candidate's) name must be; errors quote it.
pub const NAME_RULE: &str =
    "must be a name of letters, digits, '_', '-' and '.', not starting with '.'";

/// Whether `name` may name a keep map: one object under `keep_maps/`
/// ([`NAME_RULE`]), whether `<method>_K<k>` or a hand-made map's file stem.
pub fn is_valid(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// `(method, size)` of `<method>_K<size>`, the size as written (a number,
/// or a share such as `50%`), at the last `_K`; `None` without one.
pub fn split(name: &str) -> Option<(&str, &str)> {
    name.rsplit_once(SEPARATOR)
}

/// The method part of a candidate's name, or the whole name when it is not
/// `<method>_K<size>`.
pub fn method_of(name: &str) -> &str {
    split(name).map_or(name, |(method, _)| method)
}

impl fmt::Display for KeepMapName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{SEPARATOR}{}", self.method, self.k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_at_the_last_separator() {
        let n = KeepMapName::new("my_Kind", 8);
        assert_eq!(n.to_string(), "my_Kind_K8");
        assert_eq!(KeepMapName::parse("my_Kind_K8"), Some(n));
        assert_eq!(KeepMapName::parse("frequency_K50%"), None);
        assert_eq!(split("frequency_K50%"), Some(("frequency", "50%")));
        assert_eq!(KeepMapName::parse("base"), None);
        assert_eq!(method_of("reap_hybrid_K16"), "reap_hybrid");
        assert_eq!(method_of("base"), "base");
    }

    #[test]
    fn only_plain_names_are_valid() {
        for good in ["frequency_K8", "my-map.v2", "a"] {
            assert!(is_valid(good), "{good}");
        }
        for bad in ["", ".hidden", "a/b", "../x", "a b", "x\\y", "k%"] {
            assert!(!is_valid(bad), "{bad}");
        }
    }
}
