//! A GGUF model's vocabulary checked in Rust before llama.cpp loads it:
//! llama.cpp's vocabulary loader aborts the whole process (`GGML_ASSERT`, no
//! message) on a token string that appears twice, and reads the scores and
//! token types as raw arrays. A model's header is read (with the reader's
//! budget) and refused here instead, by model and token.

use crate::read::{GgufHeader, GgufReadError, GgufReader, GgufValue};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// Metadata key of the token strings.
pub const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
/// Metadata key of the per-token scores.
pub const SCORES_KEY: &str = "tokenizer.ggml.scores";
/// Metadata key of the per-token types.
pub const TOKEN_TYPE_KEY: &str = "tokenizer.ggml.token_type";

/// Largest token type llama.cpp defines (`LLAMA_TOKEN_TYPE_BYTE`; 0 is
/// `UNDEFINED`).
const MAX_TOKEN_TYPE: i32 = 6;

/// Why a model's vocabulary is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VocabError {
    /// The header could not be read (the reader's error names the file).
    #[error("model {0}")]
    Read(#[from] GgufReadError),
    /// The vocabulary is inconsistent.
    #[error("model {path}: {reason}")]
    Bad {
        /// The model file.
        path: String,
        /// What is wrong, naming the token.
        reason: String,
    },
}

/// Reads the header of the model at `path` and checks its vocabulary
/// ([`check_header`]).
pub fn check_file(path: &Path) -> Result<(), VocabError> {
    let header = GgufReader::open(path)?.header;
    check_header(&header).map_err(|reason| VocabError::Bad {
        path: path.display().to_string(),
        reason,
    })
}

/// Checks a header's vocabulary as llama.cpp will load it: token strings
/// unique (an empty one counts as llama.cpp renames it, `[EMPTY_<id>]`),
/// scores (f32 or i32) and token types (i32, each a type llama.cpp defines)
/// one per token. A header without a token list is left to llama.cpp (a
/// model without a vocabulary). The error names the token.
pub fn check_header(header: &GgufHeader) -> Result<(), String> {
    let Some(tokens) = header.get(TOKENS_KEY) else {
        return Ok(());
    };
    let tokens =
        strings(tokens).ok_or_else(|| format!("{TOKENS_KEY} is not an array of strings"))?;
    let n = tokens.len();
    if n > i32::MAX as usize {
        return Err(format!(
            "{TOKENS_KEY} holds {n} tokens, more than a token id can name"
        ));
    }
    let mut seen: HashMap<Cow<str>, usize> = HashMap::with_capacity(n);
    for (id, &text) in tokens.iter().enumerate() {
        let key = match text {
            "" => Cow::Owned(format!("[EMPTY_{id}]")),
            t => Cow::Borrowed(t),
        };
        if let Some(first) = seen.insert(key, id) {
            return Err(format!(
                "token {id} {text:?} repeats token {first} ({TOKENS_KEY} must hold each string once; \
                 llama.cpp aborts on a repeated one)"
            ));
        }
    }
    if let Some(scores) = header.get(SCORES_KEY) {
        let ok = |v: &GgufValue| matches!(v, GgufValue::F32(_) | GgufValue::I32(_));
        let scores = scores
            .as_array()
            .filter(|a| a.iter().all(ok))
            .ok_or_else(|| format!("{SCORES_KEY} is not an array of f32 or i32"))?;
        same_count(SCORES_KEY, scores.len(), n)?;
    }
    if let Some(types) = header.get(TOKEN_TYPE_KEY) {
        let types = types
            .as_array()
            .ok_or_else(|| format!("{TOKEN_TYPE_KEY} is not an array of i32"))?;
        same_count(TOKEN_TYPE_KEY, types.len(), n)?;
        for (id, t) in types.iter().enumerate() {
            match t {
                GgufValue::I32(t) if (0..=MAX_TOKEN_TYPE).contains(t) => {}
                GgufValue::I32(t) => {
                    return Err(format!(
                        "token {id} {:?} has type {t} in {TOKEN_TYPE_KEY}, not one of 0..={MAX_TOKEN_TYPE}",
                        tokens[id]
                    ))
                }
                _ => return Err(format!("{TOKEN_TYPE_KEY} is not an array of i32")),
            }
        }
    }
    Ok(())
}

/// The strings of an array of strings.
fn strings(v: &GgufValue) -> Option<Vec<&str>> {
    v.as_array()?.iter().map(GgufValue::as_str).collect()
}

/// Refuses a per-token array whose length is not the token count.
fn same_count(key: &str, len: usize, n_tokens: usize) -> Result<(), String> {
    if len != n_tokens {
        return Err(format!(
            "{key} holds {len} entries for {n_tokens} tokens in {TOKENS_KEY}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{GgufWriter, Value};

    fn header(tokens: &[&str], extra: impl FnOnce(&mut GgufWriter)) -> GgufHeader {
        let mut g = GgufWriter::new();
        g.kv(
            TOKENS_KEY,
            Value::StrArray(tokens.iter().map(|t| t.to_string()).collect()),
        );
        extra(&mut g);
        GgufReader::new(std::io::Cursor::new(g.to_bytes()), "<memory>")
            .unwrap()
            .header
    }

    #[test]
    fn a_consistent_vocabulary_passes() {
        let h = header(&["a", "b", ""], |g| {
            g.kv(SCORES_KEY, Value::F32Array(vec![0.0, -1.0, -2.0]));
            g.kv(TOKEN_TYPE_KEY, Value::I32Array(vec![1, 3, 6]));
        });
        assert_eq!(check_header(&h), Ok(()));
        let none = GgufReader::new(
            std::io::Cursor::new(GgufWriter::new().to_bytes()),
            "<memory>",
        )
        .unwrap()
        .header;
        assert_eq!(check_header(&none), Ok(()));
    }

    #[test]
    fn a_repeated_token_is_named_with_both_ids() {
        let e = check_header(&header(&["a", "<s>", "b", "<s>"], |_| {})).unwrap_err();
        assert!(e.starts_with("token 3 \"<s>\" repeats token 1"), "{e}");
        // llama.cpp renames an empty token `[EMPTY_<id>]`, which can collide.
        let e = check_header(&header(&["[EMPTY_1]", ""], |_| {})).unwrap_err();
        assert!(e.starts_with("token 1 \"\" repeats token 0"), "{e}");
    }

    #[test]
    fn scores_and_types_must_match_the_tokens() {
        let e = check_header(&header(&["a", "b"], |g| {
            g.kv(SCORES_KEY, Value::F32Array(vec![0.0]));
        }))
        .unwrap_err();
        assert_eq!(
            e,
            "tokenizer.ggml.scores holds 1 entries for 2 tokens in tokenizer.ggml.tokens"
        );
        let e = check_header(&header(&["a", "b"], |g| {
            g.kv(TOKEN_TYPE_KEY, Value::I32Array(vec![1, 1, 1]));
        }))
        .unwrap_err();
        assert!(e.contains("holds 3 entries for 2 tokens"), "{e}");
        let e = check_header(&header(&["a", "b"], |g| {
            g.kv(TOKEN_TYPE_KEY, Value::I32Array(vec![1, 9]));
        }))
        .unwrap_err();
        assert!(e.starts_with("token 1 \"b\" has type 9"), "{e}");
        let e = check_header(&header(&["a"], |g| {
            g.kv(SCORES_KEY, Value::StrArray(vec!["x".into()]));
        }))
        .unwrap_err();
        assert!(e.contains("not an array of f32 or i32"), "{e}");
    }

    #[test]
    fn the_file_is_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("dup.gguf");
        let mut g = GgufWriter::new();
        g.kv(TOKENS_KEY, Value::StrArray(vec!["x".into(), "x".into()]));
        std::fs::write(&p, g.to_bytes()).unwrap();
        let e = check_file(&p).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "model {}: token 1 \"x\" repeats token 0",
                p.display()
            )),
            "{e}"
        );
        let e = check_file(&d.path().join("gone.gguf"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("model ") && e.contains("gone.gguf"), "{e}");
    }
}
