//! The config reference, `docs/CONFIG.md`: every section and key with its
//! type, default and meaning, generated from the config types' JSON schema
//! (their doc comments and serde defaults), so it cannot drift from what the
//! parser accepts; a test compares the committed file with [`markdown`].

use super::strict::{items, objects, schema};
use serde_json::Value as Json;

/// The reference as Markdown.
pub fn markdown() -> String {
    let root = schema();
    let mut out = String::from(
        "# Config reference\n\n\
         Every section and key of a run config (`CONFIG.toml`), generated from the config \
         types (`config/src/`) by `config::reference::markdown`. Unknown sections and keys \
         are refused, naming the nearest valid name. Relative paths resolve against the \
         config file's directory. The test `reference_is_current` (`cargo test --release -p \
         moe-census-config reference`) fails when this file is stale; \
         `MOE_CENSUS_BLESS=1` with the same command rewrites it.\n",
    );
    section(&root, &root, "", false, &mut out);
    out
}

/// Renders the table at `path` (its keys) and then each of its sub-tables.
fn section(root: &Json, s: &Json, path: &str, array: bool, out: &mut String) {
    let Some(obj) = objects(root, s).into_iter().next() else {
        return;
    };
    let props = obj["properties"].as_object().cloned().unwrap_or_default();
    let required: Vec<&str> = obj
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let mut subs = Vec::new();
    let mut rows = String::new();
    for (key, p) in &props {
        let here = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let table = !objects(root, p).is_empty();
        let table_items = items(root, p).filter(|i| !objects(root, i).is_empty());
        if table {
            subs.push((here, p, false));
        } else if let Some(i) = table_items {
            subs.push((here, i, true));
        }
        if path.is_empty() {
            continue;
        }
        let default = match p.get("default") {
            Some(d) => format!("`{}`", d.to_string().replace('|', "\\|")),
            None if required.contains(&key.as_str()) => "required".into(),
            None => "none".into(),
        };
        rows.push_str(&format!(
            "| `{key}` | {} | {default} | {} |\n",
            type_of(root, p),
            one_line(&description(root, p))
        ));
    }
    if !path.is_empty() {
        let heading = if array {
            format!("[[{path}]]")
        } else {
            format!("[{path}]")
        };
        out.push_str(&format!("\n## `{heading}`\n\n"));
        let about = description(root, s);
        if !about.is_empty() {
            out.push_str(&one_line(&about));
            out.push_str("\n\n");
        }
        out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
        out.push_str(&rows);
    }
    for (here, p, array) in subs {
        section(root, p, &here, array, out);
    }
}

/// A schema's description, or its referenced definition's.
fn description(root: &Json, s: &Json) -> String {
    if let Some(d) = s.get("description").and_then(Json::as_str) {
        return d.to_string();
    }
    objects(root, s)
        .first()
        .and_then(|o| o.get("description"))
        .and_then(Json::as_str)
        .unwrap_or("")
        .to_string()
}

/// Doc-comment text on one table row.
fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// A key's type in words.
fn type_of(root: &Json, s: &Json) -> String {
    if let Some(name) = s
        .get("$ref")
        .and_then(Json::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        return match root["$defs"].get(name) {
            Some(d) if d.get("properties").is_some() => "table".into(),
            Some(d) => type_of(root, d),
            None => name.into(),
        };
    }
    if let Some(c) = s.get("const") {
        return format!("`{c}`");
    }
    if let Some(values) = s.get("enum").and_then(Json::as_array) {
        let names: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        return format!("one of {}", names.join(", "));
    }
    if let Some(members) = s.get("oneOf").and_then(Json::as_array) {
        let names: Vec<String> = members.iter().map(|m| type_of(root, m)).collect();
        return names.join(" or ");
    }
    if let Some(members) = s.get("anyOf").and_then(Json::as_array) {
        let some: Vec<String> = members
            .iter()
            .filter(|m| m.get("type").and_then(Json::as_str) != Some("null"))
            .map(|m| type_of(root, m))
            .collect();
        let optional = some.len() < members.len();
        return format!(
            "{}{}",
            some.join(" or "),
            if optional { " (optional)" } else { "" }
        );
    }
    let (kind, optional) = match s.get("type") {
        Some(Json::String(t)) => (t.as_str(), false),
        Some(Json::Array(ts)) => (
            ts.iter()
                .filter_map(Json::as_str)
                .find(|t| *t != "null")
                .unwrap_or("null"),
            ts.iter().any(|t| t == "null"),
        ),
        _ => ("any", false),
    };
    let base = match kind {
        "integer" => match s.get("minimum") {
            Some(_) => "integer (>= 0)".to_string(),
            None => "integer".to_string(),
        },
        "array" => match items(root, s) {
            Some(i) if !objects(root, i).is_empty() => "array of tables".into(),
            Some(i) => format!("array of {}", type_of(root, i)),
            None => "array".into(),
        },
        "object" if s.get("properties").is_some() => "table".into(),
        other => other.to_string(),
    };
    if optional {
        format!("{base} (optional)")
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn reference_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md");
        let now = markdown();
        if std::env::var_os("MOE_CENSUS_BLESS").is_some() {
            std::fs::write(&path, &now).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == now,
            "{} is stale (a config key was added, renamed or documented anew): rewrite it with \
             MOE_CENSUS_BLESS=1 cargo test --release -p moe-census-config reference",
            path.display()
        );
    }

    #[test]
    fn every_key_of_every_section_has_a_type_and_a_meaning() {
        let text = markdown();
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| `")).collect();
        assert!(rows.len() > 70, "{} rows", rows.len());
        for row in &rows {
            let cells: Vec<&str> = row.split(" | ").collect();
            assert_eq!(cells.len(), 4, "{row}");
            assert!(!cells[1].trim().is_empty() && cells[1] != "any", "{row}");
            assert!(cells[3].trim_end_matches(" |").len() > 3, "{row}");
        }
        for heading in [
            "## `[model]`",
            "## `[corpus.dedup]`",
            "## `[[corpus.domains]]`",
            "## `[[corpus.domains.sources]]`",
            "## `[ship]`",
        ] {
            assert!(text.contains(heading), "{heading}");
        }
        assert!(
            text.contains("| `n_ctx` | integer (>= 0) | `512` |"),
            "{text}"
        );
    }
}
