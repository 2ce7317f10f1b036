//! GGUF metadata entries encoded for a rewritten header: the new expert
//! count, and, when NextN blocks are dropped, the block count, the NextN
//! count and per-block arrays cut to the blocks that remain.

use gguf::read::GgufValue;

/// GGUF's type id of a value.
fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::Str(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

/// Appends a value's bytes (without its type id).
fn value_bytes(v: &GgufValue, out: &mut Vec<u8>) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::Str(s) => {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        GgufValue::Array(items) => {
            // An empty array keeps no element type; u32 is what writers use.
            let elem = items.first().map_or(4, type_id);
            out.extend(elem.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                value_bytes(item, out);
            }
        }
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// The whole entry `key = value` (key, type id, value).
pub(super) fn entry(key: &str, value: &GgufValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 20);
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key.as_bytes());
    out.extend(type_id(value).to_le_bytes());
    value_bytes(value, &mut out);
    out
}

/// `n` in the integer type of `old` (u32 when `old` is not an integer).
pub(super) fn same_int_type(old: &GgufValue, n: u64) -> GgufValue {
    match old {
        GgufValue::U8(_) => GgufValue::U8(n as u8),
        GgufValue::I8(_) => GgufValue::I8(n as i8),
        GgufValue::U16(_) => GgufValue::U16(n as u16),
        GgufValue::I16(_) => GgufValue::I16(n as i16),
        GgufValue::I32(_) => GgufValue::I32(n as i32),
        GgufValue::U64(_) => GgufValue::U64(n),
        GgufValue::I64(_) => GgufValue::I64(n as i64),
        _ => GgufValue::U32(n as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::read::GgufReader;
    use gguf::write::{GgufWriter, Value};

    /// Entries encoded here read back as the values they were made from.
    #[test]
    fn entries_round_trip_through_the_reader() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.gguf");
        let mut g = GgufWriter::new();
        g.kv("a.layers", Value::I32Array(vec![1, 2, 3]))
            .kv("a.count", Value::U32(7))
            .kv("a.name", Value::Str("x".into()));
        std::fs::write(&path, g.to_bytes()).unwrap();
        let h = GgufReader::open(&path).unwrap().header;
        for (i, (key, value)) in h.kv.iter().enumerate() {
            let r = &h.kv_ranges[i];
            let bytes = std::fs::read(&path).unwrap()[r.start as usize..r.end as usize].to_vec();
            assert_eq!(entry(key, value), bytes, "{key}");
        }
        assert_eq!(same_int_type(&GgufValue::I32(3), 9), GgufValue::I32(9));
    }
}
