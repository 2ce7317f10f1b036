//! JSON written as Python's `json.dumps(x, ensure_ascii=False)` writes it:
//! the `tojson` filter Hugging Face's chat templating installs (and
//! llama.cpp's chat engine copies). Jinja's own `tojson` (compact, with
//! `<`, `>`, `&` and `'` escaped for HTML) would write different tokens.

use minijinja::value::{Value, ValueKind};

/// How [`dumps`] lays out containers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    /// Spaces per level (`indent=N`); `None`: one line, `", "` and `": "`.
    pub indent: Option<usize>,
    /// Keys in sorted order (`sort_keys=True`).
    pub sort_keys: bool,
}

/// `value` as `json.dumps` writes it with `layout`.
pub fn dumps(value: &Value, layout: Layout) -> Result<String, String> {
    let mut out = String::new();
    write(&mut out, value, layout, 0)?;
    Ok(out)
}

fn write(out: &mut String, value: &Value, layout: Layout, depth: usize) -> Result<(), String> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value)),
        ValueKind::String => out.push_str(&string(value.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
            container(out, '[', ']', items.len(), layout, depth, |out, i| {
                write(out, &items[i], layout, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
            if layout.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            container(out, '{', '}', keys.len(), layout, depth, |out, i| {
                let key = &keys[i];
                let name = match key.as_str() {
                    Some(s) => s.to_string(),
                    None if key.kind() == ValueKind::Number => number(key),
                    None => return Err(format!("a map key ({key}) is not a string or number")),
                };
                out.push_str(&string(&name));
                out.push_str(": ");
                let item = value.get_item(key).map_err(|e| e.to_string())?;
                write(out, &item, layout, depth + 1)
            })?;
        }
        other => return Err(format!("a {other} value has no JSON form")),
    }
    Ok(())
}

/// Writes a container's `n` items between `open` and `close` with
/// `json.dumps`' separators: `", "` on one line, else one item per line.
fn container(
    out: &mut String,
    open: char,
    close: char,
    n: usize,
    layout: Layout,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), String>,
) -> Result<(), String> {
    out.push(open);
    if n == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..n {
        match layout.indent {
            Some(step) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(step * (depth + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        item(out, i)?;
    }
    if let Some(step) = layout.indent {
        out.push('\n');
        out.push_str(&" ".repeat(step * depth));
    }
    out.push(close);
    Ok(())
}

/// A JSON string as Python writes it without `ensure_ascii`: `"`, `\`
/// and control characters escaped (`\n`, `\u001f`), everything else as is.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A number as Python writes it: integers in full, floats by `repr`.
fn number(value: &Value) -> String {
    let shown = value.to_string();
    // minijinja shows a float with a fraction, exponent, `inf` or `NaN`
    // ("1.0"), an integer without.
    if shown.contains(['.', 'e', 'E', 'n', 'N']) {
        f64::try_from(value.clone()).map_or(shown, float_repr)
    } else {
        shown
    }
}

/// Python's `repr(float)` (what `json.dumps` writes): the shortest digits
/// that read back to the same float, positional for decimal exponents
/// -4..16 (`0.0001`, `1e+16`, `1.5e-05`), `NaN`, `Infinity`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` gives the shortest round-trip digits: "1.5e-7".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    // Python's decimal point position: value = 0.DIGITS x 10^decpt.
    let decpt = exp + 1;
    if f == 0.0 {
        return format!("{sign}0.0");
    }
    if decpt > -4 && decpt <= 16 {
        let n = digits.len() as i32;
        let body = if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= n {
            format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
        } else {
            let (a, b) = digits.split_at(decpt as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let e = decpt - 1;
        let esign = if e < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{esign}{:02}", e.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(json: &str) -> Value {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn floats_are_written_as_pythons_repr() {
        // The right-hand sides are Python 3's repr() of each float.
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (2.5e300, "2.5e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn containers_keep_their_order_and_pythons_separators() {
        let v = value(r#"{"b": [1, 2.0, "x\n\"y\u001f"], "a": {}, "é": null, "c": []}"#);
        assert_eq!(
            dumps(&v, Layout::default()).unwrap(),
            r#"{"b": [1, 2.0, "x\n\"y\u001f"], "a": {}, "é": null, "c": []}"#
        );
        let sorted = Layout {
            sort_keys: true,
            ..Layout::default()
        };
        assert_eq!(
            dumps(&value(r#"{"b": 1, "a": true}"#), sorted).unwrap(),
            r#"{"a": true, "b": 1}"#
        );
        let indented = Layout {
            indent: Some(4),
            ..Layout::default()
        };
        assert_eq!(
            dumps(&value(r#"{"a": [1, {"b": []}]}"#), indented).unwrap(),
            "{\n    \"a\": [\n        1,\n        {\n            \"b\": []\n        }\n    ]\n}"
        );
    }
}
