//! Each run file is decoded in exactly one function, in the module that owns
//! its schema: this test reads the product sources of the workspace and fails
//! on a second decoder anywhere else: a decoding call (`serde_json`, a
//! stage's JSON helper, a lenient parse) in a statement that names the
//! file's type or the constant of its object name.

use std::path::{Path, PathBuf};

/// A run file: the one source file allowed to decode it, the types its
/// bytes decode to, and the constants naming its object.
struct RunFile {
    owner: &'static str,
    types: &'static [&'static str],
    names: &'static [&'static str],
}

/// The five run files, and merge plans.
const RUN_FILES: &[RunFile] = &[
    RunFile {
        owner: "runfiles/src/keepmap.rs",
        types: &["KeepMap"],
        names: &[],
    },
    RunFile {
        owner: "runfiles/src/mergeplan.rs",
        types: &["MergePlan"],
        names: &[],
    },
    RunFile {
        owner: "runfiles/src/saliency.rs",
        types: &["Saliency", "SaliencyHead", "Lenient"],
        names: &["SALIENCY_JSON"],
    },
    RunFile {
        owner: "runfiles/src/corpus.rs",
        types: &["CorpusIndex"],
        names: &["INDEX_FILE"],
    },
    RunFile {
        owner: "runfiles/src/eval_summary.rs",
        types: &["EvalSummary"],
        names: &["SUMMARY_JSON", "summary_json"],
    },
    RunFile {
        owner: "runfiles/src/manifest.rs",
        types: &["RunManifest", "Manifest"],
        names: &["MANIFEST_JSON"],
    },
];

/// Calls that turn bytes or text into a typed value.
const DECODERS: &[&str] = &[
    "from_slice",
    "from_str",
    "from_reader",
    "from_value",
    "from_json_bytes",
    "parse_json",
    "lenient::parse",
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

/// The text before a file's inline unit tests (`#[cfg(test)] mod tests {`)
/// (`#[cfg(test)] mod tests;` declarations of test files do not end it).
fn product_part(text: &str) -> &str {
    let inline_tests = text.match_indices("#[cfg(test)]").find(|(at, tag)| {
        let rest = text[at + tag.len()..].trim_start();
        rest.strip_prefix("mod ").is_some_and(|m| {
            let name_end = m.find(|c: char| !(c.is_alphanumeric() || c == '_'));
            name_end.is_some_and(|end| m[end..].trim_start().starts_with('{'))
        })
    });
    inline_tests.map_or(text, |(at, _)| &text[..at])
}

/// Whether `text` names `ty` as what is decoded: a turbofish or type
/// argument (`::<KeepMap>`, `Result<KeepMap, _>`) or a binding's type
/// (`let m: KeepMap =`), not a parameter (`map: &KeepMap`).
fn names_type(text: &str, ty: &str) -> bool {
    [format!("<{ty}>"), format!("<{ty},"), format!(": {ty} =")]
        .iter()
        .any(|p| text.contains(p.as_str()))
}

/// The statements of `text` (split at `;`) that decode `file` outside its
/// owner: a decoder call naming one of its types or the constant of its
/// object name, or a type's own `parse`.
fn second_decoders(text: &str, file: &RunFile) -> Vec<String> {
    text.split(';')
        .filter(|st| {
            let decodes = DECODERS.iter().any(|d| st.contains(d));
            let names_file = file.types.iter().any(|ty| names_type(st, ty))
                || file.names.iter().any(|n| names_constant(st, n));
            (decodes && names_file)
                || file
                    .types
                    .iter()
                    .any(|ty| st.contains(&format!("{ty}::parse(")))
        })
        .map(|st| st.trim().lines().next().unwrap_or("").to_string())
        .collect()
}

/// Whether `text` names the constant `name` as a whole word
/// (`names::SALIENCY_JSON`, `out.summary_json`, not `SALIENCY_JSON_V2`).
fn names_constant(text: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name)
        .any(|(at, _)| !text[..at].ends_with(word) && !text[at + name.len()..].starts_with(word))
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
        for file in RUN_FILES {
            if rel == file.owner {
                continue;
            }
            for st in second_decoders(product_part(&text), file) {
                found.push(format!("{rel}: decodes {} ({st})", file.owner));
            }
        }
    }
    assert!(
        found.is_empty(),
        "run files decoded outside their owner:\n{}",
        found.join("\n")
    );
}

/// The run file owned by `owner`.
fn run_file(owner: &str) -> &'static RunFile {
    RUN_FILES.iter().find(|f| f.owner.ends_with(owner)).unwrap()
}

#[test]
fn the_scan_finds_a_second_decoder() {
    let (keep, plan) = (run_file("keepmap.rs"), run_file("mergeplan.rs"));
    let bad = "fn f(b: &[u8]) {\n    let m: KeepMap = serde_json::from_slice(b).unwrap();\n}";
    assert_eq!(second_decoders(bad, keep).len(), 1);
    let turbofish = "let m = serde_json::from_slice::<MergePlan>(b)?;";
    assert_eq!(second_decoders(turbofish, plan).len(), 1);
    assert_eq!(
        second_decoders("let p = MergePlan::parse(&b)?;", plan).len(),
        1
    );
    let other = "let r = KeepMapRef::parse(arg); let x: Foo = serde_json::from_slice(b)?;";
    assert!(second_decoders(other, keep).is_empty());
    let params = "fn f(m: &KeepMap) -> u32 { serde_json::from_value(m.params.clone()).unwrap() }";
    assert!(second_decoders(params, keep).is_empty());
    let helper = "let m: KeepMap = StagesError::parse_json(&b, || url, \"a keep map\")?;";
    assert_eq!(second_decoders(helper, keep).len(), 1);
    assert!(product_part("a\n#[cfg(test)]\nmod tests { KeepMap::parse( }").ends_with("a\n"));
    let declared = "#[cfg(test)]\nmod testdata;\nfn f() {}\n#[cfg(test)]\nmod tests {}";
    assert!(product_part(declared).ends_with("fn f() {}\n"));
}

#[test]
fn the_scan_finds_a_decoder_by_the_object_it_reads() {
    let saliency = run_file("saliency.rs");
    let head = "let head = serde_json::from_slice::<SaliencyHead>(&b).map_err(|source| E {\n url: store.url_of(names::SALIENCY_JSON) })?;";
    assert_eq!(second_decoders(head, saliency).len(), 1);
    let untyped = "serde_json::from_slice(&bytes).map_err(|e| E(corpus.url_of(INDEX_FILE)))";
    assert_eq!(second_decoders(untyped, run_file("corpus.rs")).len(), 1);
    let helper =
        "let s = StagesError::parse_json(&bytes, || store.url_of(names::SUMMARY_JSON), \"x\")?;";
    assert_eq!(
        second_decoders(helper, run_file("eval_summary.rs")).len(),
        1
    );
    let lenient = "let parsed = lenient::parse(&bytes, &store.url_of(artifacts::SALIENCY_JSON))?;";
    assert_eq!(second_decoders(lenient, saliency).len(), 1);
    let write = "store.put(names::SALIENCY_JSON, s.to_json_bytes()).await?;";
    assert!(second_decoders(write, saliency).is_empty());
    assert!(names_constant(
        "url_of(names::SALIENCY_JSON)",
        "SALIENCY_JSON"
    ));
    assert!(!names_constant("SALIENCY_JSON_V2", "SALIENCY_JSON"));
    assert!(!names_constant("MY_SUMMARY_JSON", "SUMMARY_JSON"));
}
