//! Keep maps: the experts kept per layer for a (method, K) (DESIGN section 10).

use crate::file_error::FileError;
use crate::store::RunStore;
use bytes::Bytes;
use numbers::keep_name::KeepMapName;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A keep map as written to `keep_maps/<method>_K<k>.json`, or by hand:
/// only `layers` is needed (`{"layers": {"0": [1, 4, 7], "1": [0, 2, 5]}}`,
/// the same number of expert ids for every MoE block); `method` is then
/// [`CUSTOM`] and `k` the ids per block ([`KeepMap::parse`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeepMap {
    /// Scoring method name (`frequency`, `reap_mean`, ...), or [`CUSTOM`].
    #[serde(default = "custom")]
    pub method: String,
    /// Experts kept per layer.
    #[serde(default)]
    pub k: u32,
    /// Method parameters, as given (prior, m, z, domain mix, ...).
    #[serde(default)]
    pub params: serde_json::Value,
    /// SHA-256 of the `saliency.json` bytes the map was computed from
    /// (empty for a map made by hand).
    #[serde(default)]
    pub saliency_sha256: String,
    /// Block index to sorted, unique expert ids; in the file each block is
    /// a string key in string order (`"0"`, `"1"`, `"10"`, `"2"`), read
    /// back as numbers ([`block_keys`]).
    #[serde(with = "block_keys")]
    pub layers: BTreeMap<u32, Vec<u32>>,
}

/// A keep map's `layers` as the file writes them: block indices as string
/// keys, in string order (the bytes `score` has always written); a key that
/// is not a block index as written by Rust (`"x"`, `"01"`) is refused.
/// Merge plans write their layers the same way.
pub(crate) mod block_keys {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer, T: Serialize>(
        layers: &BTreeMap<u32, T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let by_text: BTreeMap<String, &T> =
            layers.iter().map(|(l, ids)| (l.to_string(), ids)).collect();
        by_text.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<BTreeMap<u32, T>, D::Error> {
        BTreeMap::<String, T>::deserialize(d)?
            .into_iter()
            .map(|(key, ids)| match key.parse::<u32>() {
                Ok(l) if l.to_string() == key => Ok((l, ids)),
                _ => Err(D::Error::custom(format!(
                    "layer {key:?} is not a block index"
                ))),
            })
            .collect()
    }
}

/// The method of a keep map made by hand, not by `score`: `verify` checks
/// its shape but cannot recompute it.
pub const CUSTOM: &str = "custom";

fn custom() -> String {
    CUSTOM.into()
}

/// Where a keep map named on a command line is: a file, or the run's
/// `keep_maps/<name>.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeepMapRef {
    /// A JSON file at this path (written by hand, or copied from a run).
    File(std::path::PathBuf),
    /// The run's keep map of this name (`frequency_K8`).
    Run(String),
}

impl KeepMapRef {
    /// Reads a `--keep-map` argument: an existing file, or an argument
    /// with a `/` (but `keep_maps/NAME.json`), is a file; otherwise the
    /// name of one of the run's maps (`frequency_K8`,
    /// `keep_maps/frequency_K8.json`).
    pub fn parse(arg: &str) -> KeepMapRef {
        let path = std::path::Path::new(arg);
        let run_object = arg.starts_with(&format!("{}/", crate::layout::KEEP_MAPS_DIR))
            && !arg[crate::layout::KEEP_MAPS_DIR.len() + 1..].contains('/');
        if path.is_file() || (!run_object && arg.contains('/')) {
            KeepMapRef::File(path.to_path_buf())
        } else {
            KeepMapRef::Run(crate::layout::keep_map_name(arg).to_string())
        }
    }
}

impl KeepMap {
    /// The object name of this map under the run: `keep_maps/<method>_K<k>.json`.
    pub fn file_name(method: &str, k: u32) -> String {
        crate::layout::keep_map(&KeepMapName::new(method, k).to_string())
    }

    /// The object name of the map called `name` (`<method>_K<k>`) under the
    /// run: `keep_maps/<name>.json`.
    pub fn object_name(name: &str) -> String {
        crate::layout::keep_map(name)
    }

    /// The `params` object of a map computed with `params` (the scoring
    /// stage's parameter type, which comes after this crate).
    pub fn params_of<P: Serialize>(params: &P) -> serde_json::Value {
        serde_json::to_value(params).expect("parameters serialise")
    }

    /// The map's `params` read as `P`, the type [`KeepMap::params_of`]
    /// wrote; an error for a map whose params are not a `P`.
    pub fn params_as<P: serde::de::DeserializeOwned>(&self) -> Result<P, serde_json::Error> {
        P::deserialize(&self.params)
    }

    /// Kept experts of block `layer`, if the map covers it.
    pub fn kept(&self, layer: u32) -> Option<&[u32]> {
        self.layers.get(&layer).map(|v| v.as_slice())
    }

    /// Whether the map was made by hand ([`CUSTOM`]), not by `score`.
    pub fn is_custom(&self) -> bool {
        self.method == CUSTOM
    }

    /// The one decoder of a keep map's bytes, `score`'s or one made by
    /// hand: blocks named by their index, each with sorted, unique expert
    /// ids, the same number in every block (`k`, filled in when absent).
    /// Errors name `file` (its URL or path) and say what is wrong.
    pub fn decode(bytes: &[u8], file: &str) -> Result<KeepMap, FileError> {
        KeepMap::parse(bytes).map_err(|problem| FileError::invalid(file, "keep map", problem))
    }

    /// Reads the run's keep map `name` (`keep_maps/<name>.json`): a valid
    /// name ([`numbers::keep_name::NAME_RULE`]), a valid map
    /// ([`KeepMap::decode`]), and a map `score` wrote holds the method and
    /// K its name says. Returns the bytes too (their hash is a candidate's).
    pub async fn read(store: &RunStore, name: &str) -> Result<(KeepMap, Bytes), FileError> {
        let object = KeepMap::object_name(name);
        if !numbers::keep_name::is_valid(name) {
            return Err(FileError::invalid(
                store.url_of(&object),
                "keep map",
                format!("its name {name:?} {}", numbers::keep_name::NAME_RULE),
            ));
        }
        let bytes = store.get(&object).await?;
        let map = KeepMap::decode(&bytes, &store.url_of(&object))?;
        if !map.is_custom() && KeepMapName::new(&map.method, map.k).to_string() != name {
            return Err(FileError::invalid(
                store.url_of(&object),
                "keep map",
                format!("it holds the map of {} at K={}", map.method, map.k),
            ));
        }
        Ok((map, bytes))
    }

    /// Reads the keep map `object` (`keep_maps/<name>.json`, as a
    /// candidate names it) through [`KeepMap::read`].
    pub async fn read_object(
        store: &RunStore,
        object: &str,
    ) -> Result<(KeepMap, Bytes), FileError> {
        let name = crate::layout::keep_map_name(object);
        if KeepMap::object_name(name) != object {
            return Err(FileError::invalid(
                store.url_of(object),
                "keep map",
                format!("keep maps are {}/<name>.json", crate::layout::KEEP_MAPS_DIR),
            ));
        }
        KeepMap::read(store, name).await
    }

    /// Checks `bytes` against the keep map schema and shape; the problem
    /// in words ([`KeepMap::decode`] names the file).
    fn parse(bytes: &[u8]) -> Result<KeepMap, String> {
        let mut map: KeepMap = serde_json::from_slice(bytes).map_err(|e| {
            format!("not a keep map ({e}); expected {{\"layers\": {{\"0\": [expert ids], ...}}}}")
        })?;
        let Some(first) = map.layers.values().next() else {
            return Err("its \"layers\" name no block".into());
        };
        let k = first.len() as u32;
        for (layer, ids) in &map.layers {
            if !ids.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!(
                    "layer {layer}: expert ids {ids:?} are not sorted and unique"
                ));
            }
            if ids.len() as u32 != k {
                return Err(format!(
                    "layer {layer} keeps {} experts, another {k}: llama.cpp needs the same number in every block",
                    ids.len()
                ));
            }
        }
        if map.k != 0 && map.k != k {
            return Err(format!("\"k\" is {} but every layer keeps {k}", map.k));
        }
        map.k = k;
        Ok(map)
    }

    /// Checks the map against the model `s` describes: one entry per MoE
    /// block of the model, ids below its expert count, and at least the
    /// experts it routes each token to (fitting its routing groups).
    pub fn check_fits(&self, s: &numbers::saliency::Saliency) -> Result<(), String> {
        let mut want: Vec<u32> = s
            .split(numbers::Split::Fit)
            .map(|f| f.layers.iter().map(|l| l.layer).collect())
            .unwrap_or_default();
        want.sort();
        let have: Vec<u32> = self.layers.keys().copied().collect();
        if have != want {
            return Err(format!(
                "it covers blocks {have:?}; the model's MoE blocks are {want:?}"
            ));
        }
        if let Some((layer, e)) = self
            .layers
            .iter()
            .find_map(|(l, ids)| ids.iter().find(|&&e| e >= s.n_expert).map(|e| (l, e)))
        {
            return Err(format!(
                "layer {layer} keeps expert {e}; the model has {} per block",
                s.n_expert
            ));
        }
        if self.k < s.n_expert_used {
            return Err(format!(
                "it keeps {} experts per block, fewer than the {} the model routes each token to",
                self.k, s.n_expert_used
            ));
        }
        numbers::routing::check_group_keep(s.routing.groups, s.n_expert, s.n_expert_used, self.k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_written_by_hand_parses_and_is_checked() {
        let m = KeepMap::parse(br#"{"layers": {"0": [1, 4, 7], "1": [0, 2, 5]}}"#).unwrap();
        assert_eq!((m.method.as_str(), m.k, m.is_custom()), ("custom", 3, true));
        assert_eq!(m.kept(1), Some(&[0, 2, 5][..]));
        for (bad, why) in [
            (r#"{"layers": {}}"#, "name no block"),
            (r#"{"layers": {"0": [3, 1]}}"#, "not sorted and unique"),
            (r#"{"layers": {"0": [1, 1]}}"#, "not sorted and unique"),
            (
                r#"{"layers": {"0": [1], "1": [1, 2]}}"#,
                "same number in every block",
            ),
            (r#"{"layers": {"x": [1]}}"#, "not a block index"),
            (r#"{"layers": {"01": [1]}}"#, "not a block index"),
            (r#"{"k": 2, "layers": {"0": [1]}}"#, "\"k\" is 2"),
            (r#"{"0": [1]}"#, "expected {\"layers\""),
        ] {
            let e = KeepMap::parse(bad.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn the_run_reader_refuses_bad_maps_and_names_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        let put = |name: &str, text: &str| {
            let (store, object) = (store.clone(), KeepMap::object_name(name));
            let text = text.to_string();
            async move { store.put(&object, text).await.unwrap() }
        };
        put(
            "frequency_K2",
            r#"{"method":"frequency","k":2,"layers":{"0":[1,4],"1":[0,2]}}"#,
        )
        .await;
        let (m, bytes) = KeepMap::read(&store, "frequency_K2").await.unwrap();
        assert_eq!((m.method.as_str(), m.k), ("frequency", 2));
        assert_eq!(KeepMap::decode(&bytes, "x").unwrap(), m);
        let (again, _) = KeepMap::read_object(&store, "keep_maps/frequency_K2.json")
            .await
            .unwrap();
        assert_eq!(again, m);
        for (name, text, why) in [
            (
                "count_K2",
                r#"{"layers":{"0":[1,4],"1":[0]}}"#,
                "same number in every block",
            ),
            (
                "count2_K2",
                r#"{"method":"count2","k":3,"layers":{"0":[1,4]}}"#,
                "\"k\" is 3",
            ),
            (
                "unsorted_K2",
                r#"{"layers":{"0":[4,1]}}"#,
                "not sorted and unique",
            ),
            (
                "repeated_K2",
                r#"{"layers":{"0":[1,1]}}"#,
                "not sorted and unique",
            ),
            (
                "other_K4",
                r#"{"method":"frequency","layers":{"0":[1,4]}}"#,
                "holds the map of frequency at K=2",
            ),
        ] {
            put(name, text).await;
            let e = KeepMap::read(&store, name).await.unwrap_err().to_string();
            let url = store.url_of(&KeepMap::object_name(name));
            assert!(e.contains(why) && e.contains(&url), "{name}: {e}");
        }
        for bad in [".hidden", "a/b", "../frequency_K2", ""] {
            let e = KeepMap::read(&store, bad).await.unwrap_err().to_string();
            assert!(
                e.contains("must be a name of letters") && e.contains("keep_maps/"),
                "{bad:?}: {e}"
            );
        }
        let e = KeepMap::read_object(&store, "merge_plans/frequency_K2.json")
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("keep maps are keep_maps/<name>.json"),
            "{e}"
        );
        let e = KeepMap::read(&store, "absent_K2").await.unwrap_err();
        assert!(
            matches!(
                e,
                FileError::Store(crate::store::StoreError::NotFound { .. })
            ),
            "{e}"
        );
    }

    #[test]
    fn blocks_are_numbers_in_memory_and_string_keys_in_string_order_in_the_file() {
        let text = r#"{"layers":{"0":[1],"1":[2],"10":[3],"2":[4]}}"#;
        let m = KeepMap::parse(text.as_bytes()).unwrap();
        assert_eq!(m.layers.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 10]);
        assert_eq!(m.kept(10), Some(&[3][..]));
        let json = serde_json::to_value(&m).unwrap();
        let keys: Vec<&String> = json["layers"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["0", "1", "10", "2"]);
    }

    #[test]
    fn command_line_keep_maps_are_files_or_run_names() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mine");
        std::fs::write(&f, "{}").unwrap();
        let file = |p: &str| KeepMapRef::File(p.into());
        let run = |n: &str| KeepMapRef::Run(n.into());
        assert_eq!(
            KeepMapRef::parse(f.to_str().unwrap()),
            file(f.to_str().unwrap())
        );
        assert_eq!(KeepMapRef::parse("maps/x.json"), file("maps/x.json"));
        assert_eq!(KeepMapRef::parse("x.json"), run("x"));
        assert_eq!(KeepMapRef::parse("frequency_K8"), run("frequency_K8"));
        assert_eq!(
            KeepMapRef::parse("keep_maps/frequency_K8.json"),
            run("frequency_K8")
        );
    }
}
