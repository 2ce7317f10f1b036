//! A JSON array of records (`.json`), streamed: each element is parsed and
//! handed on before the next is read, so the file is never held whole, and
//! an element (a string in it, say) larger than the limit per record is
//! refused once that many bytes of it are read.

use serde::de::{DeserializeSeed, Error as _, SeqAccess, Visitor};
use serde_json::Value;
use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

/// Calls `each(index, element)` for every element of the JSON array that
/// `reader` holds, in order; stops at the first error (`each`'s own, an
/// element of more than `max_record_bytes` bytes of JSON, the reader's, or
/// a malformed file's with its line and column).
pub fn for_each(
    reader: impl Read,
    max_record_bytes: u64,
    each: &mut dyn FnMut(usize, Value) -> Result<(), String>,
) -> Result<(), String> {
    let mut failed = None;
    let since = Rc::new(Cell::new(0u64));
    let index = Cell::new(0usize);
    let over = Rc::new(Cell::new(false));
    let counted = PerRecord {
        inner: reader,
        since: Rc::clone(&since),
        over: Rc::clone(&over),
        limit: max_record_bytes,
    };
    let mut de = serde_json::Deserializer::from_reader(counted);
    let seed = Elements {
        each,
        failed: &mut failed,
        since: &since,
        index: &index,
    };
    let parsed = seed.deserialize(&mut de).and_then(|()| de.end());
    match (failed, parsed) {
        (Some(e), _) => Err(e),
        (None, Err(_)) if over.get() => Err(format!(
            "record {}: more than {max_record_bytes} bytes of JSON exceeds the per-record limit \
             (split the document into smaller ones)",
            index.get() + 1
        )),
        (None, Err(e)) if e.is_io() => Err(e.to_string()),
        (None, Err(e)) => Err(format!("not a JSON array of records ({e})")),
        (None, Ok(())) => Ok(()),
    }
}

/// A reader that counts the bytes read since the last element ended and
/// fails once they pass the limit.
struct PerRecord<R> {
    inner: R,
    since: Rc<Cell<u64>>,
    over: Rc<Cell<bool>>,
    limit: u64,
}

impl<R: Read> Read for PerRecord<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.since.set(self.since.get() + n as u64);
        if self.since.get() > self.limit {
            self.over.set(true);
            return Err(std::io::Error::other("over the per-record limit"));
        }
        Ok(n)
    }
}

struct Elements<'a, 'b> {
    each: &'a mut dyn FnMut(usize, Value) -> Result<(), String>,
    failed: &'b mut Option<String>,
    /// Bytes read since the last element ended.
    since: &'b Cell<u64>,
    /// The element being read.
    index: &'b Cell<usize>,
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
        self.since.set(0);
        while let Some(v) = seq.next_element::<Value>()? {
            self.since.set(0);
            if let Err(e) = (self.each)(i, v) {
                *self.failed = Some(e);
                return Err(A::Error::custom("stopped"));
            }
            i += 1;
            self.index.set(i);
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
        for_each(&b"[{\"a\": 1}, {\"a\": 2}]\n"[..], 100, &mut |i, v| {
            seen.push((i, v["a"].as_i64().unwrap()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [(0, 1), (1, 2)]);
        let e = for_each(&b"{\"a\": 1}"[..], 100, &mut |_, _| Ok(())).unwrap_err();
        assert!(
            e.contains("not a JSON array") && e.contains("line 1"),
            "{e}"
        );
        let e = for_each(&b"[1, 2"[..], 100, &mut |_, _| Ok(())).unwrap_err();
        assert!(e.contains("EOF"), "{e}");
        let e = for_each(&b"[1, 2]"[..], 100, &mut |i, _| match i {
            1 => Err("second".into()),
            _ => Ok(()),
        })
        .unwrap_err();
        assert_eq!(e, "second");
    }

    /// An element is refused once more than the limit of it is read, and
    /// the count starts again at each element: many small elements pass.
    #[test]
    fn an_element_over_the_limit_is_refused_by_number() {
        let small = format!("[{}1]", "1, ".repeat(1000));
        let mut n = 0;
        for_each(small.as_bytes(), 8, &mut |_, _| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 1001);
        let big = format!("[\"short\", \"{}\"]", "a".repeat(100));
        let e = for_each(big.as_bytes(), 64, &mut |_, _| Ok(())).unwrap_err();
        assert_eq!(
            e,
            "record 2: more than 64 bytes of JSON exceeds the per-record limit \
             (split the document into smaller ones)"
        );
    }
}
