//! How many models an evaluating worker holds in memory at once (DESIGN
//! section 12, "Memory"): every model (the base and each candidate), the
//! base and one candidate, or one model at a time. Fewer models than 1 + n
//! costs no extra forward pass: the base model's scored logits rows of a
//! lease are kept once and every candidate is compared with them in turn.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Models an evaluating worker may hold in memory at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ModelsInMemory {
    /// Chosen by the worker from its free memory and the models' sizes:
    /// every model when they fit, else the base and one candidate, else one.
    #[default]
    Auto,
    /// The base model and every candidate at once.
    All,
    /// At most this many (at least 1): 1 is one model at a time, 2 the base
    /// and one candidate; 1 + n or more is the same as [`ModelsInMemory::All`].
    Count(u32),
}

impl ModelsInMemory {
    /// The number of models held at once when evaluating `n_candidates`
    /// candidates, `auto` resolved to `auto_count`: between 1 and
    /// `1 + n_candidates`.
    pub fn resolve(self, n_candidates: usize, auto_count: usize) -> usize {
        let all = 1 + n_candidates;
        match self {
            ModelsInMemory::Auto => auto_count.clamp(1, all),
            ModelsInMemory::All => all,
            ModelsInMemory::Count(n) => (n as usize).clamp(1, all),
        }
    }
}

impl fmt::Display for ModelsInMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelsInMemory::Auto => f.write_str("auto"),
            ModelsInMemory::All => f.write_str("all"),
            ModelsInMemory::Count(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for ModelsInMemory {
    type Err = String;

    /// `auto`, `all` or a whole number of at least 1.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(ModelsInMemory::Auto),
            "all" => Ok(ModelsInMemory::All),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|&n| n >= 1)
                .map(ModelsInMemory::Count)
                .ok_or_else(|| {
                    format!("models in memory {s:?}: expected auto, all or a number of at least 1 (2: the base and one candidate)")
                }),
        }
    }
}

/// As written in a config: `"auto"`, `"all"` or a number.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Written {
    Number(u32),
    Text(String),
}

/// In a binary format (the wire's bincode, which cannot tell a number from
/// a word): one number, 0 for `auto` and `u32::MAX` for `all`.
const AUTO_CODE: u32 = 0;
const ALL_CODE: u32 = u32::MAX;

impl Serialize for ModelsInMemory {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self, s.is_human_readable()) {
            (ModelsInMemory::Count(n), _) => s.serialize_u32(*n),
            (other, true) => s.serialize_str(&other.to_string()),
            (ModelsInMemory::Auto, false) => s.serialize_u32(AUTO_CODE),
            (ModelsInMemory::All, false) => s.serialize_u32(ALL_CODE),
        }
    }
}

impl<'de> Deserialize<'de> for ModelsInMemory {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if !d.is_human_readable() {
            return Ok(match u32::deserialize(d)? {
                AUTO_CODE => ModelsInMemory::Auto,
                ALL_CODE => ModelsInMemory::All,
                n => ModelsInMemory::Count(n),
            });
        }
        match Written::deserialize(d)? {
            Written::Number(n) => n.to_string().parse(),
            Written::Text(t) => t.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::ModelsInMemory as M;

    #[test]
    fn counts_parse_and_resolve_between_one_and_every_model() {
        assert_eq!("auto".parse::<M>(), Ok(M::Auto));
        assert_eq!("all".parse::<M>(), Ok(M::All));
        assert_eq!("2".parse::<M>(), Ok(M::Count(2)));
        let err = "0".parse::<M>().unwrap_err();
        assert!(err.contains("at least 1"), "{err}");
        assert!("two".parse::<M>().is_err());
        assert_eq!(M::Count(2).resolve(4, 9), 2);
        assert_eq!(M::Count(9).resolve(4, 1), 5);
        assert_eq!(M::All.resolve(4, 1), 5);
        assert_eq!(M::Auto.resolve(4, 3), 3);
        assert_eq!(M::Auto.resolve(4, 0), 1);
        assert_eq!(M::Auto.resolve(4, 99), 5);
    }

    #[test]
    fn a_config_writes_a_number_or_a_word_and_the_wire_a_number() {
        for (text, m) in [
            ("2", M::Count(2)),
            ("\"all\"", M::All),
            ("\"auto\"", M::Auto),
        ] {
            assert_eq!(serde_json::from_str::<M>(text).unwrap(), m);
            assert_eq!(serde_json::to_string(&m).unwrap(), text);
            let cfg = bincode::config::standard();
            let bytes = bincode::serde::encode_to_vec(m, cfg).unwrap();
            let (back, _): (M, usize) = bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
            assert_eq!(back, m);
        }
        let err = serde_json::from_str::<M>("0").unwrap_err().to_string();
        assert!(err.contains("at least 1"), "{err}");
    }
}
