//! Reading `saliency.json` without refusing non-finite values: serde_json
//! writes NaN and infinities as `null` and refuses bare `NaN`, so a file with
//! one would not parse. Here each such value is recorded by its JSON path and
//! read as 0, so the other invariants can still be checked.

use numbers::saliency::Saliency;
use serde_json::Value;

/// A parsed saliency file and the paths of values that were not finite numbers.
pub struct Lenient {
    /// The document, non-finite values read as 0.
    pub saliency: Saliency,
    /// JSON paths (`splits.fit.layers[0].reap_l2_sum[5]`) of non-finite values.
    pub nonfinite: Vec<String>,
}

/// Why a saliency file could not be read even leniently.
#[derive(Debug, thiserror::Error)]
pub enum LenientError {
    /// The bytes are not UTF-8.
    #[error("{what} is not UTF-8")]
    NotUtf8 {
        /// The file, as named by the caller.
        what: String,
        /// Where decoding stopped.
        #[source]
        source: std::str::Utf8Error,
    },
    /// The text is not JSON.
    #[error("{what} is not JSON")]
    NotJson {
        /// The file, as named by the caller.
        what: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON is not a saliency document.
    #[error("{what} is not a saliency file")]
    NotSaliency {
        /// The file, as named by the caller.
        what: String,
        /// The missing or mistyped field.
        #[source]
        source: serde_json::Error,
    },
}

/// Parses `bytes` (named `what` in errors), tolerating non-finite values.
pub fn parse(bytes: &[u8], what: &str) -> Result<Lenient, LenientError> {
    let what = || what.to_string();
    let text = std::str::from_utf8(bytes).map_err(|source| LenientError::NotUtf8 {
        what: what(),
        source,
    })?;
    let mut value: Value =
        serde_json::from_str(&nullify_bare_nonfinite(text)).map_err(|source| {
            LenientError::NotJson {
                what: what(),
                source,
            }
        })?;
    let mut nonfinite = Vec::new();
    walk(&mut value, &mut String::new(), &mut nonfinite);
    let saliency = serde_json::from_value(value).map_err(|source| LenientError::NotSaliency {
        what: what(),
        source,
    })?;
    Ok(Lenient {
        saliency,
        nonfinite,
    })
}

const BARE: [&str; 5] = ["-Infinity", "Infinity", "NaN", "-inf", "inf"];

/// Replaces bare `NaN` / `Infinity` / `inf` tokens outside strings with `null`.
fn nullify_bare_nonfinite(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if let Some(tok) = BARE.iter().find(|t| rest.starts_with(**t)) {
            out.push_str("null");
            rest = &rest[tok.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Replaces `null` and non-numeric strings inside arrays with 0, recording paths.
fn walk(v: &mut Value, path: &mut String, found: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                walk(child, path, found);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                if matches!(child, Value::Null | Value::String(_)) {
                    found.push(path.clone());
                    *child = Value::from(0);
                } else {
                    walk(child, path, found);
                }
                path.truncate(len);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_tokens_outside_strings_become_null() {
        assert_eq!(
            nullify_bare_nonfinite(r#"[NaN, -Infinity, "NaN inf", 1.5]"#),
            r#"[null, null, "NaN inf", 1.5]"#
        );
        assert_eq!(
            nullify_bare_nonfinite(r#"{"a\"NaN": inf}"#),
            r#"{"a\"NaN": null}"#
        );
    }
}
