//! A JSON array of records (`.json`), streamed: each element is parsed and
//! handed on before the next is read, so the file is never held whole.

use serde::de::{DeserializeSeed, Error as _, SeqAccess, Visitor};
use serde_json::Value;
use std::io::Read;

/// Calls `each(index, element)` for every element of the JSON array that
/// `reader` holds, in order; stops at the first error (`each`'s own, or a
/// malformed file's with its line and column).
pub fn for_each(
    reader: impl Read,
    each: &mut dyn FnMut(usize, Value) -> Result<(), String>,
) -> Result<(), String> {
    let mut failed = None;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let seed = Elements {
        each,
        failed: &mut failed,
    };
    let parsed = seed.deserialize(&mut de).and_then(|()| de.end());
    match (failed, parsed) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(format!("not a JSON array of records ({e})")),
        (None, Ok(())) => Ok(()),
    }
}

struct Elements<'a, 'b> {
    each: &'a mut dyn FnMut(usize, Value) -> Result<(), String>,
    failed: &'b mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for Elements<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Elements<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while let Some(v) = seq.next_element::<Value>()? {
            if let Err(e) = (self.each)(i, v) {
                *self.failed = Some(e);
                return Err(A::Error::custom("stopped"));
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_come_in_order_and_errors_say_where() {
        let mut seen = Vec::new();
        for_each(&b"[{\"a\": 1}, {\"a\": 2}]\n"[..], &mut |i, v| {
            seen.push((i, v["a"].as_i64().unwrap()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [(0, 1), (1, 2)]);
        let e = for_each(&b"{\"a\": 1}"[..], &mut |_, _| Ok(())).unwrap_err();
        assert!(
            e.contains("not a JSON array") && e.contains("line 1"),
            "{e}"
        );
        let e = for_each(&b"[1, 2"[..], &mut |_, _| Ok(())).unwrap_err();
        assert!(e.contains("EOF"), "{e}");
        let e = for_each(&b"[1, 2]"[..], &mut |i, _| match i {
            1 => Err("second".into()),
            _ => Ok(()),
        })
        .unwrap_err();
        assert_eq!(e, "second");
    }
}
