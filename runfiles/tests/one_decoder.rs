//! Each run file is decoded in exactly one function, in the module that owns
//! its schema: this test reads the product sources of the workspace and fails
//! on a second decoder (a `serde_json` call, or a stage's JSON helper, in a
//! statement that names the file's type) anywhere else.

use std::path::{Path, PathBuf};

/// A run file's schema type and the one source file allowed to decode it.
const OWNERS: &[(&str, &str)] = &[
    ("KeepMap", "runfiles/src/keepmap.rs"),
    ("MergePlan", "runfiles/src/mergeplan.rs"),
];

/// Calls that turn bytes or text into a typed value.
const DECODERS: &[&str] = &[
    "from_slice",
    "from_str",
    "from_reader",
    "from_value",
    "parse_json",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every `.rs` file under each crate's `src/`, but the test crate's and
/// test-only files (`tests.rs`, `*_tests.rs`).
fn product_sources(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.file_name().unwrap() != "tests")
        .map(|p| p.join("src"))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The text before a file's unit tests (`#[cfg(test)]`).
fn product_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

/// Whether `text` names `ty` as what is decoded: a turbofish or type
/// argument (`::<KeepMap>`, `Result<KeepMap, _>`) or a binding's type
/// (`let m: KeepMap =`), not a parameter (`map: &KeepMap`).
fn names_type(text: &str, ty: &str) -> bool {
    [format!("<{ty}>"), format!("<{ty},"), format!(": {ty} =")]
        .iter()
        .any(|p| text.contains(p.as_str()))
}

/// The statements of `text` (split at `;`) that decode `ty` outside its
/// owner: a decoder call naming the type, or the type's own `parse`.
fn second_decoders(text: &str, ty: &str) -> Vec<String> {
    text.split(';')
        .filter(|st| {
            (DECODERS.iter().any(|d| st.contains(d)) && names_type(st, ty))
                || st.contains(&format!("{ty}::parse("))
        })
        .map(|st| st.trim().lines().next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn each_run_file_has_one_decoder() {
    let root = workspace();
    let sources = product_sources(&root);
    assert!(
        sources.len() > 50,
        "only {} sources under {}",
        sources.len(),
        root.display()
    );
    let mut found = Vec::new();
    for path in &sources {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(path).unwrap();
        for (ty, owner) in OWNERS {
            if rel == *owner {
                continue;
            }
            for st in second_decoders(product_part(&text), ty) {
                found.push(format!("{rel}: decodes {ty} ({st})"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "run files decoded outside their owner:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_a_second_decoder() {
    let bad = "fn f(b: &[u8]) {\n    let m: KeepMap = serde_json::from_slice(b).unwrap();\n}";
    assert_eq!(second_decoders(bad, "KeepMap").len(), 1);
    let turbofish = "let m = serde_json::from_slice::<MergePlan>(b)?;";
    assert_eq!(second_decoders(turbofish, "MergePlan").len(), 1);
    assert_eq!(
        second_decoders("let p = MergePlan::parse(&b)?;", "MergePlan").len(),
        1
    );
    let other = "let r = KeepMapRef::parse(arg); let x: Foo = serde_json::from_slice(b)?;";
    assert!(second_decoders(other, "KeepMap").is_empty());
    let params = "fn f(m: &KeepMap) -> u32 { serde_json::from_value(m.params.clone()).unwrap() }";
    assert!(second_decoders(params, "KeepMap").is_empty());
    let helper = "let m: KeepMap = StagesError::parse_json(&b, || url, \"a keep map\")?;";
    assert_eq!(second_decoders(helper, "KeepMap").len(), 1);
    assert!(product_part("a\n#[cfg(test)]\nmod tests { KeepMap::parse( }").ends_with("a\n"));
}
