//! Unknown sections and keys, refused with the nearest valid name. serde's
//! `deny_unknown_fields` refuses them too, but names no alternative and
//! cannot tell a section from a key; this walks the parsed TOML against the
//! config's JSON schema (derived from the config types, the same schema the
//! reference in `docs/CONFIG.md` is generated from), so the valid names are
//! the types' own.

use serde_json::Value as Json;
use toml::Value;

/// The JSON schema of the whole config, from its types.
pub fn schema() -> Json {
    schemars::schema_for!(super::Config).to_value()
}

/// Follows `$ref`, `anyOf` / `oneOf` / `allOf` (an `Option<T>` is `T` or
/// null) to the object schemas `s` allows, in order.
pub(crate) fn objects<'a>(root: &'a Json, s: &'a Json) -> Vec<&'a Json> {
    if let Some(name) = s
        .get("$ref")
        .and_then(Json::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        return root["$defs"]
            .get(name)
            .map_or_else(Vec::new, |d| objects(root, d));
    }
    let mut out = Vec::new();
    if s.get("properties").is_some() {
        out.push(s);
    }
    for k in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = s.get(k).and_then(Json::as_array) {
            for member in list {
                out.extend(objects(root, member));
            }
        }
    }
    out
}

/// The schema of an array's items, through `$ref` and `anyOf`.
pub(crate) fn items<'a>(root: &'a Json, s: &'a Json) -> Option<&'a Json> {
    if let Some(i) = s.get("items") {
        return Some(i);
    }
    if let Some(name) = s
        .get("$ref")
        .and_then(Json::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        return items(root, root["$defs"].get(name)?);
    }
    ["anyOf", "oneOf"]
        .iter()
        .filter_map(|k| s.get(*k).and_then(Json::as_array))
        .flatten()
        .find_map(|m| items(root, m))
}

/// The valid name nearest to `given` by edit distance (ties: the first).
pub fn nearest<'a>(given: &str, valid: &[&'a str]) -> Option<&'a str> {
    valid
        .iter()
        .min_by_key(|v| strsim::levenshtein(given, v))
        .copied()
}

/// Refuses the first unknown section or key of `doc`, a parsed config:
/// `unknown section [shipp] (did you mean [ship]? ...)`.
pub fn check(doc: &toml::Table) -> Result<(), String> {
    let root = schema();
    walk_table(&root, &root, doc, "")
}

fn walk_table(root: &Json, s: &Json, table: &toml::Table, path: &str) -> Result<(), String> {
    let Some(obj) = objects(root, s).into_iter().next() else {
        return Ok(());
    };
    let props = obj["properties"].as_object().cloned().unwrap_or_default();
    let valid: Vec<&str> = props.keys().map(String::as_str).collect();
    for (key, value) in table {
        let Some(sub) = props.get(key) else {
            return Err(unknown(path, key, value, &valid));
        };
        let here = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        walk_value(root, sub, value, &here)?;
    }
    Ok(())
}

fn walk_value(root: &Json, s: &Json, value: &Value, path: &str) -> Result<(), String> {
    match value {
        Value::Table(t) => walk_table(root, s, t, path),
        Value::Array(a) => match items(root, s) {
            Some(item) => a
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| walk_value(root, item, v, &format!("{path}[{}]", i + 1))),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The refusal of `key` in the table at `path`, naming the nearest valid name.
fn unknown(path: &str, key: &str, value: &Value, valid: &[&str]) -> String {
    let near = nearest(key, valid).unwrap_or("");
    let all = valid.join(", ");
    match (path.is_empty(), value.is_table()) {
        (true, true) => {
            format!("unknown section [{key}] (did you mean [{near}]? the sections are: {all})")
        }
        (true, false) => format!(
            "unknown top-level key {key:?} (did you mean {near:?}? keys belong in a section: {all})"
        ),
        (false, _) => {
            format!("unknown key {key:?} in [{path}] (did you mean {near:?}? its keys are: {all})")
        }
    }
}

#[cfg(test)]
mod tests {
    fn refusal(text: &str) -> String {
        crate::Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn misspelt_sections_and_stray_keys_name_the_nearest_valid_name() {
        let e = refusal("[model]\npath = \"m.gguf\"\n[shipp]\ncandidates = [\"frequency_K8\"]\n");
        assert!(
            e.contains("unknown section [shipp] (did you mean [ship]?"),
            "{e}"
        );
        let e = refusal("[evals]\nmethods = [\"frequency\"]\n");
        assert!(
            e.contains("unknown section [evals] (did you mean [eval]?"),
            "{e}"
        );
        let e = refusal("seeed = 3\n[model]\npath = \"m.gguf\"\n");
        assert!(
            e.contains("unknown top-level key \"seeed\"") && e.contains("did you mean"),
            "{e}"
        );
        let e = refusal("[corpus]\nn_ctxx = 128\n");
        assert!(
            e.contains("unknown key \"n_ctxx\" in [corpus] (did you mean \"n_ctx\"?"),
            "{e}"
        );
        let e = refusal(
            "[[corpus.domains]]\nname = \"a\"\nsources = [{ path = \"a.txt\", separatr = \"x\" }]\n",
        );
        assert!(
            e.contains("unknown key \"separatr\" in [corpus.domains[1].sources[1]] (did you mean \"separator\"?"),
            "{e}"
        );
        let e = refusal("[corpus.dedupe]\nshingle = 4\n");
        assert!(e.contains("in [corpus] (did you mean \"dedup\"?"), "{e}");
        let e = refusal("[run]\nlease_chunk = 2\n");
        assert!(e.contains("did you mean \"lease_chunks\"?"), "{e}");
        let e = refusal("[ship]\ncandidates = [\"frequency_K8\"]\nquants = [\"Q8_0\"]\n");
        assert!(e.contains("in [ship] (did you mean \"quant\"?"), "{e}");
    }

    #[test]
    fn every_section_of_a_full_config_is_known() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/quickstart.toml"),
        )
        .unwrap();
        crate::Config::parse(&text).unwrap();
    }
}
