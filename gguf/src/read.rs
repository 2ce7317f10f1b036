//! A small GGUF (version 2 and 3) reader: metadata key/values, tensor infos,
//! and the bytes of one tensor.
//!
//! [`GgufReader::open`] reads only the header; [`GgufReader::tensor_bytes`]
//! then reads one tensor's data by offset, so a large model file is never
//! loaded whole.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// Errors while reading a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufReadError {
    /// Reading failed (including a file that ends early).
    #[error("{path}: {source}")]
    Io {
        /// The file, or `<memory>`.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file is not GGUF or is malformed.
    #[error("{path}: {reason}")]
    Malformed {
        /// The file, or `<memory>`.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// No tensor of that name.
    #[error("{path}: no tensor named {name:?}")]
    NoSuchTensor {
        /// The file.
        path: String,
        /// The tensor asked for.
        name: String,
    },
}

/// A metadata value, of any GGUF type.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `GGUF_TYPE_UINT8`.
    U8(u8),
    /// `GGUF_TYPE_INT8`.
    I8(i8),
    /// `GGUF_TYPE_UINT16`.
    U16(u16),
    /// `GGUF_TYPE_INT16`.
    I16(i16),
    /// `GGUF_TYPE_UINT32`.
    U32(u32),
    /// `GGUF_TYPE_INT32`.
    I32(i32),
    /// `GGUF_TYPE_FLOAT32`.
    F32(f32),
    /// `GGUF_TYPE_BOOL`.
    Bool(bool),
    /// `GGUF_TYPE_STRING`.
    Str(String),
    /// `GGUF_TYPE_ARRAY`: values of one type (arrays of arrays are allowed).
    Array(Vec<GgufValue>),
    /// `GGUF_TYPE_UINT64`.
    U64(u64),
    /// `GGUF_TYPE_INT64`.
    I64(i64),
    /// `GGUF_TYPE_FLOAT64`.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A tensor's description in the header.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.ffn_up_exps.weight`).
    pub name: String,
    /// ggml's `ne`: fastest-varying dimension first.
    pub dims: Vec<u64>,
    /// ggml type id (0 = F32, 1 = F16, 8 = Q8_0, ...).
    pub ggml_type: u32,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// (block size in elements, bytes per block) of a ggml type, if known.
pub fn ggml_type_size(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        9 => (32, 36),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),
        18 => (256, 98),
        19 => (256, 50),
        20 => (32, 18), // IQ4_NL
        21 => (256, 110),
        22 => (256, 82),
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),
        26 => (1, 4),
        27 => (1, 8),
        28 => (1, 8), // F64
        29 => (256, 56),
        30 => (1, 2),    // BF16
        34 => (256, 54), // TQ1_0
        35 => (256, 66),
        39 => (32, 17), // MXFP4
        _ => return None,
    })
}

/// The parsed header of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub kv: Vec<(String, GgufValue)>,
    /// Byte range in the file of each metadata entry (key, type and value),
    /// parallel to `kv`, so a rewriter can copy entries verbatim.
    pub kv_ranges: Vec<std::ops::Range<u64>>,
    /// Tensor descriptions in file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

impl GgufHeader {
    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The description of a tensor.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Most memory the parsed header (metadata and tensor descriptions) may
/// take. Values are held as [`GgufValue`]s, larger than their bytes in the
/// file (a u8 array element takes a whole enum), so the bytes present do not
/// bound memory alone (a sparse file claims any length at no cost on disk);
/// real headers (a 262k-token vocabulary with its merges) take tens of MiB.
pub const MAX_METADATA_MEMORY: u64 = 256 << 20;

/// Memory charged per metadata entry before its slot is reserved: the
/// `(key, value)` pair, its byte range and its place in the duplicate-key
/// set (a key's own bytes are charged twice where they are read, once for
/// the set's copy).
const KV_SLOT_BYTES: u64 = (std::mem::size_of::<(String, GgufValue)>()
    + std::mem::size_of::<std::ops::Range<u64>>()
    + 2 * std::mem::size_of::<String>()
    + 8) as u64;

/// Memory charged per tensor description before its slot is reserved: the
/// [`TensorInfo`], its dimensions, its place in the duplicate-name set and
/// its entry in the data-range check.
const TENSOR_SLOT_BYTES: u64 = (std::mem::size_of::<TensorInfo>()
    + MAX_DIMS as usize * 8
    + 2 * std::mem::size_of::<String>()
    + 8
    + 3 * 8) as u64;

/// Deepest nesting of arrays of arrays accepted.
const MAX_ARRAY_DEPTH: u32 = 4;

/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;

/// Smallest encoding of a value of each type, so a count can be checked
/// against the bytes left before anything is allocated for it.
fn min_value_bytes(ty: u32) -> u64 {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

struct Cursor<'a, R> {
    r: &'a mut R,
    pos: u64,
    /// Length of the input: no count may claim more bytes than remain.
    end: u64,
    /// Memory the parsed values may still take.
    budget: u64,
    path: &'a str,
}

impl<R: Read> Cursor<'_, R> {
    fn bad(&self, reason: String) -> GgufReadError {
        GgufReadError::Malformed {
            path: self.path.to_string(),
            reason,
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufReadError> {
        if self.end - self.pos < N as u64 {
            return Err(self.bad(format!("file ends at byte {} inside the header", self.end)));
        }
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|source| GgufReadError::Io {
                path: self.path.to_string(),
                source,
            })?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, GgufReadError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, GgufReadError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A count of items of at least `item_bytes` bytes each in the file and
    /// `slot_bytes` each in memory: checked against the bytes left in the
    /// input, then charged to the budget, so the caller may reserve room for
    /// `n` items.
    fn count(
        &mut self,
        what: &str,
        item_bytes: u64,
        slot_bytes: u64,
    ) -> Result<u64, GgufReadError> {
        let n = self.u64()?;
        let left = self.end - self.pos;
        if n.checked_mul(item_bytes).is_none_or(|need| need > left) {
            return Err(self.bad(format!(
                "{what} {n} at byte {} needs more than the {left} bytes left in the file",
                self.pos - 8
            )));
        }
        let need = n.saturating_mul(slot_bytes);
        if need > self.budget {
            return Err(self.bad(format!(
                "{what} {n} at byte {} would take {} MiB of memory, more than is left of the {} MiB a GGUF header may take",
                self.pos - 8,
                need.div_ceil(1 << 20),
                MAX_METADATA_MEMORY >> 20
            )));
        }
        self.budget -= need;
        Ok(n)
    }

    /// Takes `bytes` of memory from the metadata budget.
    fn charge(&mut self, bytes: u64) -> Result<(), GgufReadError> {
        self.budget = self.budget.checked_sub(bytes).ok_or_else(|| {
            self.bad(format!(
                "metadata would take more than {} MiB of memory",
                MAX_METADATA_MEMORY >> 20
            ))
        })?;
        Ok(())
    }

    fn string(&mut self) -> Result<String, GgufReadError> {
        let n = self.count("string length", 1, 1)?;
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|source| GgufReadError::Io {
                path: self.path.to_string(),
                source,
            })?;
        self.pos += n;
        String::from_utf8(b)
            .map_err(|_| self.bad(format!("string before byte {} is not UTF-8", self.pos)))
    }

    /// One value of type `ty`; the caller has charged its slot.
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<GgufValue, GgufReadError> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.bytes()?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.bytes()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.bytes()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.bytes()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.bytes()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.bytes()?)),
            7 => match self.bytes::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.bad(format!("key {key:?}: bool byte {b}"))),
            },
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.bad(format!(
                        "key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    )));
                }
                let item = self.u32()?;
                if item > 12 {
                    return Err(self.bad(format!("key {key:?}: array of unknown type {item}")));
                }
                let slot = std::mem::size_of::<GgufValue>() as u64;
                let n = self.count("array length", min_value_bytes(item), slot)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(item, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.bytes()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.bytes()?)),
            t => return Err(self.bad(format!("key {key:?} has unknown value type {t}"))),
        })
    }

    /// One tensor description; its size is computed with overflow checks.
    fn tensor_info(&mut self) -> Result<TensorInfo, GgufReadError> {
        let name = self.string()?;
        let n_dims = self.u32()?;
        if n_dims > MAX_DIMS {
            return Err(self.bad(format!("tensor {name:?} has {n_dims} dimensions")));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64())
            .collect::<Result<Vec<_>, _>>()?;
        let ggml_type = self.u32()?;
        let offset = self.u64()?;
        let (block, size) = ggml_type_size(ggml_type).ok_or_else(|| {
            self.bad(format!("tensor {name:?} has unknown ggml type {ggml_type}"))
        })?;
        let n = dims
            .iter()
            .try_fold(1u64, |n, &d| {
                n.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
            })
            .ok_or_else(|| self.bad(format!("tensor {name:?}: dims {dims:?} overflow")))?;
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(block) {
            return Err(self.bad(format!(
                "tensor {name:?}: rows of {row} elements are not whole blocks of {block}"
            )));
        }
        let n_bytes = (n / block)
            .checked_mul(size)
            .ok_or_else(|| self.bad(format!("tensor {name:?}: size overflows")))?;
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        })
    }
}

/// Checks that every tensor's data is aligned, inside the file and apart
/// from every other tensor's.
fn check_data_ranges(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_len: u64,
    alignment: u64,
    path: &str,
) -> Result<(), GgufReadError> {
    let bad = |reason: String| GgufReadError::Malformed {
        path: path.to_string(),
        reason,
    };
    let data_len = file_len.saturating_sub(data_offset);
    let mut ranges = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "tensor {:?}: data offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            )));
        }
        let end = t
            .offset
            .checked_add(t.n_bytes)
            .filter(|&end| end <= data_len)
            .ok_or_else(|| {
                bad(format!(
                    "tensor {:?}: {} bytes at data offset {} run past the end of the file ({data_len} bytes of data)",
                    t.name, t.n_bytes, t.offset
                ))
            })?;
        ranges.push((t.offset, end, &t.name));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(bad(format!(
                "tensors {:?} and {:?} overlap in the data section",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(())
}

/// Parses the header from `r`, which must be at the start of an input of
/// `file_len` bytes; `path` names the input in errors. Every count is
/// checked against the bytes present before anything is allocated for it,
/// and every tensor's data must lie inside the file, apart from the others.
pub fn read_header(
    r: &mut impl Read,
    file_len: u64,
    path: &str,
) -> Result<GgufHeader, GgufReadError> {
    let mut c = Cursor {
        r,
        pos: 0,
        end: file_len,
        budget: MAX_METADATA_MEMORY,
        path,
    };
    if &c.bytes::<4>()? != b"GGUF" {
        return Err(c.bad("not a GGUF file (bad magic)".into()));
    }
    let version = c.u32()?;
    if !(2..=3).contains(&version) {
        return Err(c.bad(format!("GGUF version {version} is not supported (2 or 3)")));
    }
    // Smallest tensor description: empty name, no dims, type, offset. Both
    // counts are charged before anything is reserved for them.
    let n_tensors = c.count("tensor count", 8 + 4 + 4 + 8, TENSOR_SLOT_BYTES)?;
    // Smallest metadata entry: empty key, type, one byte.
    let n_kv = c.count("metadata count", 8 + 4 + 1, KV_SLOT_BYTES)?;
    let mut kv = Vec::with_capacity(n_kv as usize);
    let mut kv_ranges = Vec::with_capacity(n_kv as usize);
    let mut keys = std::collections::HashSet::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let start = c.pos;
        let key = c.string()?;
        // The duplicate-key set's copy.
        c.charge(key.len() as u64)?;
        let ty = c.u32()?;
        let value = c.value(ty, &key, 0)?;
        if !keys.insert(key.clone()) {
            return Err(c.bad(format!("metadata key {key:?} appears twice")));
        }
        kv.push((key, value));
        kv_ranges.push(start..c.pos);
    }
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = std::collections::HashSet::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let t = c.tensor_info()?;
        // The duplicate-name set's copy.
        c.charge(t.name.len() as u64)?;
        if !names.insert(t.name.clone()) {
            return Err(c.bad(format!("tensor {:?} appears twice", t.name)));
        }
        tensors.push(t);
    }
    let alignment = match kv.iter().find(|(k, _)| k == "general.alignment") {
        None => 32,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 30 => a,
            _ => {
                return Err(c.bad(format!(
                    "general.alignment {v:?} is not a power of two up to 2^30"
                )))
            }
        },
    };
    let data_offset = c.pos.next_multiple_of(alignment);
    check_data_ranges(&tensors, data_offset, file_len, alignment, path)?;
    Ok(GgufHeader {
        version,
        kv,
        kv_ranges,
        tensors,
        alignment,
        data_offset,
    })
}

/// A GGUF source: the header plus access to tensor data.
pub struct GgufReader<R> {
    /// The parsed header.
    pub header: GgufHeader,
    inner: R,
    path: String,
}

impl GgufReader<BufReader<File>> {
    /// Opens a file and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufReadError> {
        let name = path.as_ref().display().to_string();
        let file = File::open(path.as_ref()).map_err(|source| GgufReadError::Io {
            path: name.clone(),
            source,
        })?;
        GgufReader::new(BufReader::new(file), &name)
    }
}

impl<R: Read + Seek> GgufReader<R> {
    /// Reads the header from `inner` (positioned at the start of the file);
    /// `path` names the input in errors.
    pub fn new(mut inner: R, path: &str) -> Result<Self, GgufReadError> {
        let io = |source| GgufReadError::Io {
            path: path.to_string(),
            source,
        };
        let file_len = inner.seek(SeekFrom::End(0)).map_err(io)?;
        inner.seek(SeekFrom::Start(0)).map_err(io)?;
        let header = read_header(&mut inner, file_len, path)?;
        Ok(GgufReader {
            header,
            inner,
            path: path.to_string(),
        })
    }

    /// The data of tensor `name`.
    pub fn tensor_bytes(&mut self, name: &str) -> Result<Vec<u8>, GgufReadError> {
        let t = self
            .header
            .tensor(name)
            .ok_or_else(|| GgufReadError::NoSuchTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        let (start, len) = (self.header.data_offset + t.offset, t.n_bytes);
        let io = |source| GgufReadError::Io {
            path: self.path.clone(),
            source,
        };
        self.inner.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut out = Vec::new();
        let read = (&mut self.inner)
            .take(len)
            .read_to_end(&mut out)
            .map_err(io)?;
        if read as u64 != len {
            return Err(GgufReadError::Malformed {
                path: self.path.clone(),
                reason: format!("tensor {name:?} runs past the end of the file"),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{GgufWriter, TensorType, Value};

    fn sample() -> Vec<u8> {
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("qwen3moe".into()));
        g.kv("qwen3moe.expert_count", Value::U32(8));
        g.kv("x.i32", Value::I32(-3));
        g.kv("x.f32", Value::F32(0.5));
        g.kv("x.bool", Value::Bool(true));
        g.kv("x.strs", Value::StrArray(vec!["a".into(), "bc".into()]));
        g.kv("x.f32s", Value::F32Array(vec![1.0, 2.5]));
        g.kv("x.i32s", Value::I32Array(vec![7, -7]));
        g.tensor_f32("a", &[3], &[1.0, 2.0, 3.0]);
        g.tensor(
            "blk.0.ffn_up_exps.weight",
            &[32, 2, 4],
            TensorType::Q8_0,
            (0..8 * 34).map(|i| i as u8).collect(),
        );
        g.tensor_f32("b", &[2, 1], &[4.0, 5.0]);
        g.to_bytes()
    }

    #[test]
    fn reads_back_what_the_writer_wrote() {
        let bytes = sample();
        let mut r = GgufReader::new(io::Cursor::new(bytes), "<memory>").unwrap();
        let h = &r.header;
        assert_eq!(h.version, 3);
        assert_eq!(h.alignment, 32);
        assert_eq!(
            h.get("general.architecture").unwrap().as_str(),
            Some("qwen3moe")
        );
        assert_eq!(h.get("qwen3moe.expert_count").unwrap().as_u64(), Some(8));
        assert_eq!(h.get("x.i32"), Some(&GgufValue::I32(-3)));
        assert_eq!(h.get("x.f32").unwrap().as_f64(), Some(0.5));
        assert_eq!(h.get("x.bool"), Some(&GgufValue::Bool(true)));
        let strs = h.get("x.strs").unwrap().as_array().unwrap();
        assert_eq!(
            strs,
            &[GgufValue::Str("a".into()), GgufValue::Str("bc".into())]
        );
        assert_eq!(
            h.get("x.f32s"),
            Some(&GgufValue::Array(vec![
                GgufValue::F32(1.0),
                GgufValue::F32(2.5)
            ]))
        );
        assert_eq!(
            h.get("x.i32s"),
            Some(&GgufValue::Array(vec![
                GgufValue::I32(7),
                GgufValue::I32(-7)
            ]))
        );
        let up = h.tensor("blk.0.ffn_up_exps.weight").unwrap().clone();
        assert_eq!(
            (up.dims.clone(), up.ggml_type, up.n_bytes),
            (vec![32, 2, 4], 8, 8 * 34)
        );
        assert_eq!(
            r.tensor_bytes("a").unwrap(),
            [1.0f32, 2.0, 3.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            r.tensor_bytes("blk.0.ffn_up_exps.weight").unwrap(),
            (0..8 * 34).map(|i| i as u8).collect::<Vec<_>>()
        );
        assert_eq!(
            r.tensor_bytes("b").unwrap(),
            [4.0f32, 5.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
        assert!(matches!(
            r.tensor_bytes("c"),
            Err(GgufReadError::NoSuchTensor { .. })
        ));
    }

    /// A hand-built file with the value types the writer does not emit and a
    /// custom alignment.
    #[test]
    fn reads_every_value_type_and_honours_general_alignment() {
        let mut f = Vec::new();
        let s = |f: &mut Vec<u8>, x: &str| {
            f.extend((x.len() as u64).to_le_bytes());
            f.extend(x.as_bytes());
        };
        f.extend(b"GGUF");
        f.extend(3u32.to_le_bytes());
        f.extend(1u64.to_le_bytes()); // tensors
        f.extend(8u64.to_le_bytes()); // kv
        s(&mut f, "general.alignment");
        f.extend(4u32.to_le_bytes());
        f.extend(64u32.to_le_bytes());
        s(&mut f, "u8");
        f.extend(0u32.to_le_bytes());
        f.push(200);
        s(&mut f, "i8");
        f.extend(1u32.to_le_bytes());
        f.push(0xff);
        s(&mut f, "u16");
        f.extend(2u32.to_le_bytes());
        f.extend(65535u16.to_le_bytes());
        s(&mut f, "i16");
        f.extend(3u32.to_le_bytes());
        f.extend((-2i16).to_le_bytes());
        s(&mut f, "u64s");
        f.extend(9u32.to_le_bytes());
        f.extend(10u32.to_le_bytes());
        f.extend(2u64.to_le_bytes());
        f.extend(5u64.to_le_bytes());
        f.extend(u64::MAX.to_le_bytes());
        s(&mut f, "i64");
        f.extend(11u32.to_le_bytes());
        f.extend((-9i64).to_le_bytes());
        s(&mut f, "f64");
        f.extend(12u32.to_le_bytes());
        f.extend(0.25f64.to_le_bytes());
        s(&mut f, "t");
        f.extend(1u32.to_le_bytes());
        f.extend(2u64.to_le_bytes());
        f.extend(0u32.to_le_bytes()); // F32
        f.extend(0u64.to_le_bytes());
        let header_end = f.len();
        f.resize(header_end.next_multiple_of(64), 0);
        f.extend(1.5f32.to_le_bytes());
        f.extend(2.5f32.to_le_bytes());
        let mut r = GgufReader::new(io::Cursor::new(f), "<memory>").unwrap();
        let h = &r.header;
        assert_eq!(h.alignment, 64);
        assert_eq!(h.data_offset, header_end.next_multiple_of(64) as u64);
        assert_eq!(h.get("u8"), Some(&GgufValue::U8(200)));
        assert_eq!(h.get("i8"), Some(&GgufValue::I8(-1)));
        assert_eq!(h.get("u16"), Some(&GgufValue::U16(65535)));
        assert_eq!(h.get("i16"), Some(&GgufValue::I16(-2)));
        assert_eq!(
            h.get("u64s"),
            Some(&GgufValue::Array(vec![
                GgufValue::U64(5),
                GgufValue::U64(u64::MAX)
            ]))
        );
        assert_eq!(h.get("i64"), Some(&GgufValue::I64(-9)));
        assert_eq!(h.get("f64"), Some(&GgufValue::F64(0.25)));
        let want: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(r.tensor_bytes("t").unwrap(), want);
    }

    #[test]
    fn errors_name_the_input() {
        let err = GgufReader::new(io::Cursor::new(b"GGUX\x03\0\0\0".to_vec()), "m.gguf")
            .err()
            .unwrap();
        assert!(
            err.to_string().starts_with("m.gguf: not a GGUF file"),
            "{err}"
        );
        let mut truncated = sample();
        truncated.truncate(40);
        let err = GgufReader::new(io::Cursor::new(truncated), "t.gguf")
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("t.gguf: "), "{err}");
    }

    /// A header of `n_tensors` F32 tensors `[2]` at the given data offsets,
    /// with `data_len` bytes of data after the aligned header.
    fn with_offsets(names: &[&str], offsets: &[u64], data_len: usize) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend(b"GGUF");
        f.extend(3u32.to_le_bytes());
        f.extend((names.len() as u64).to_le_bytes());
        f.extend(0u64.to_le_bytes());
        for (name, off) in names.iter().zip(offsets) {
            f.extend((name.len() as u64).to_le_bytes());
            f.extend(name.as_bytes());
            f.extend(1u32.to_le_bytes());
            f.extend(2u64.to_le_bytes());
            f.extend(0u32.to_le_bytes());
            f.extend(off.to_le_bytes());
        }
        f.resize(f.len().next_multiple_of(32) + data_len, 0);
        f
    }

    fn refusal(bytes: Vec<u8>) -> String {
        GgufReader::new(io::Cursor::new(bytes), "x.gguf")
            .err()
            .expect("refused")
            .to_string()
    }

    #[test]
    fn tensor_data_must_be_inside_the_file_aligned_and_apart() {
        assert!(GgufReader::new(
            io::Cursor::new(with_offsets(&["a", "b"], &[0, 32], 40)),
            "ok"
        )
        .is_ok());
        let msg = refusal(with_offsets(&["a", "b"], &[0, 32], 39));
        assert!(
            msg.contains("\"b\": 8 bytes at data offset 32 run past the end"),
            "{msg}"
        );
        let msg = refusal(with_offsets(&["a", "b"], &[0, 0], 64));
        assert!(msg.contains("tensors \"a\" and \"b\" overlap"), "{msg}");
        let msg = refusal(with_offsets(&["a"], &[4], 64));
        assert!(
            msg.contains("offset 4 is not a multiple of the alignment 32"),
            "{msg}"
        );
        let msg = refusal(with_offsets(&["a", "a"], &[0, 32], 64));
        assert!(msg.contains("tensor \"a\" appears twice"), "{msg}");
        let msg = refusal(with_offsets(&["a"], &[u64::MAX - 31], 64));
        assert!(msg.contains("run past the end"), "{msg}");
    }

    /// A 64 GiB sparse file (a few KiB on disk) whose header claims an
    /// array as long as the file, or two billion tensors or entries: each
    /// count fits the bytes present, so only the memory budget, charged
    /// before anything is reserved, refuses it (reserving first asked for
    /// terabytes and aborted).
    #[test]
    fn a_sparse_file_claiming_huge_counts_is_refused_before_reserving() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let start = |n_tensors: u64, n_kv: u64| {
            let mut h = b"GGUF".to_vec();
            h.extend(3u32.to_le_bytes());
            h.extend(n_tensors.to_le_bytes());
            h.extend(n_kv.to_le_bytes());
            h
        };
        let mut array = start(0, 1);
        array.extend(1u64.to_le_bytes());
        array.extend(b"k");
        array.extend(9u32.to_le_bytes());
        array.extend(0u32.to_le_bytes());
        array.extend((1u64 << 35).to_le_bytes());
        for (name, header, want) in [
            (
                "array",
                array,
                "array length 34359738368 at byte 41 would take 1048576 MiB",
            ),
            (
                "tensors",
                start(1 << 31, 0),
                "tensor count 2147483648 at byte 8 would take",
            ),
            (
                "kv",
                start(0, 1 << 31),
                "metadata count 2147483648 at byte 16 would take",
            ),
        ] {
            let path = d.path().join(format!("{name}.gguf"));
            let mut f = File::create(&path).unwrap();
            f.write_all(&header).unwrap();
            f.set_len(64 << 30).unwrap();
            let e = GgufReader::open(&path).err().expect("refused").to_string();
            assert!(e.starts_with(&format!("{}: {want}", path.display())), "{e}");
            assert!(e.ends_with("of the 256 MiB a GGUF header may take"), "{e}");
        }
    }

    #[test]
    fn counts_are_checked_against_the_bytes_present() {
        let mut f = Vec::new();
        f.extend(b"GGUF");
        f.extend(3u32.to_le_bytes());
        f.extend(0u64.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        f.extend(b"k");
        f.extend(9u32.to_le_bytes());
        f.extend(0u32.to_le_bytes());
        f.extend((1u64 << 40).to_le_bytes());
        let msg = refusal(f);
        assert!(msg.contains("array length 1099511627776"), "{msg}");
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(u64::MAX.to_le_bytes());
        f.extend(0u64.to_le_bytes());
        assert!(refusal(f).contains("tensor count"));
        let mut g = GgufWriter::new();
        g.kv("k", Value::U32(1)).kv("k", Value::U32(2));
        assert!(refusal(g.to_bytes()).contains("key \"k\" appears twice"));
    }
}
