//! A small GGUF (version 3) writer: metadata key/values and tensors.
//!
//! Used for `imatrix.gguf` and for the generated test models; llama.cpp's own
//! reader is the oracle that the files are well formed (see the tests crate).

use std::io::{self, Write};

/// Alignment of tensor data (GGUF's default `general.alignment`).
pub const ALIGNMENT: usize = 32;

/// ggml tensor element types this writer emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    /// 32-bit float.
    F32 = 0,
    /// 16-bit float.
    F16 = 1,
    /// 8-bit blocks of 32 with an f16 scale.
    Q8_0 = 8,
}

impl TensorType {
    /// Bytes needed for `n` elements (n must be a multiple of the block size).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            TensorType::F32 => 4 * n,
            TensorType::F16 => 2 * n,
            TensorType::Q8_0 => n / 32 * 34,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `GGUF_TYPE_UINT16` (`split.no`, `split.count`).
    U16(u16),
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
    /// Array of strings.
    StrArray(Vec<String>),
    /// Array of f32.
    F32Array(Vec<f32>),
    /// Array of i32.
    I32Array(Vec<i32>),
}

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes a GGUF file.
#[derive(Default)]
pub struct GgufWriter {
    kv: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

fn put_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata key (keys are written in insertion order).
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.kv.push((key.to_string(), value));
        self
    }

    /// Adds a tensor; `dims` are ggml's `ne` (fastest-varying first).
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: TensorType, data: Vec<u8>) -> &mut Self {
        let n: u64 = dims.iter().product();
        assert_eq!(
            data.len(),
            ty.bytes_for(n as usize),
            "tensor {name}: data size does not match dims"
        );
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Adds an f32 tensor from values.
    pub fn tensor_f32(&mut self, name: &str, dims: &[u64], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, TensorType::F32, data)
    }

    /// Writes the whole file.
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_header(w)?;
        for t in &self.tensors {
            write_data(w, &t.data)?;
        }
        Ok(())
    }

    /// Writes the key-values and tensor infos, padded to the data's alignment.
    fn write_header(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(b"GGUF")?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(self.kv.len() as u64).to_le_bytes())?;
        for (key, value) in &self.kv {
            put_str(w, key)?;
            write_value(w, value)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(w, &t.name)?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&(t.ty as u32).to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            offset += t.data.len().next_multiple_of(ALIGNMENT) as u64;
        }
        w.write_all(&vec![0u8; padding(self.header_len())])
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.file_len());
        self.write(&mut out).expect("writing to a Vec cannot fail");
        out
    }

    /// [`GgufWriter::to_bytes`] in pieces (the header, then each tensor's
    /// data and padding), the data moved, not copied: for a store to write
    /// without one contiguous copy (an importance matrix of 0.9 GB at the
    /// real shape).
    pub fn into_parts(self) -> Vec<bytes::Bytes> {
        let mut header = Vec::with_capacity(self.header_len().next_multiple_of(ALIGNMENT));
        self.write_header(&mut header)
            .expect("writing to a Vec cannot fail");
        let mut parts = vec![bytes::Bytes::from(header)];
        for t in self.tensors {
            let pad = padding(t.data.len());
            parts.push(bytes::Bytes::from(t.data));
            parts.push(bytes::Bytes::from(vec![0u8; pad]));
        }
        parts
    }

    /// The model as `count` files the way llama.cpp's `gguf-split` lays
    /// them out: the tensors in order, spread evenly; the first file holds
    /// every metadata key, and each file `split.no`, `split.count` and
    /// `split.tensors.count` ([`crate::split`] names the files).
    pub fn into_shards(self, count: u16) -> Vec<GgufWriter> {
        let count = count.max(1);
        let total = self.tensors.len();
        let per = total.div_ceil(usize::from(count)).max(1);
        let mut tensors = self.tensors.into_iter();
        let mut first_kv = Some(self.kv);
        (0..count)
            .map(|no| {
                let mut kv = first_kv.take().unwrap_or_default();
                kv.extend([
                    (crate::split::SPLIT_NO.to_string(), Value::U16(no)),
                    (crate::split::SPLIT_COUNT.to_string(), Value::U16(count)),
                    (
                        crate::split::SPLIT_TENSORS_COUNT.to_string(),
                        Value::I32(i32::try_from(total).expect("fewer than 2^31 tensors")),
                    ),
                ]);
                GgufWriter {
                    kv,
                    tensors: tensors.by_ref().take(per).collect(),
                }
            })
            .collect()
    }

    /// Bytes of the whole file.
    fn file_len(&self) -> usize {
        let data: usize = self
            .tensors
            .iter()
            .map(|t| t.data.len().next_multiple_of(ALIGNMENT))
            .sum();
        self.header_len().next_multiple_of(ALIGNMENT) + data
    }

    fn header_len(&self) -> usize {
        let mut n = 4 + 4 + 8 + 8;
        for (key, value) in &self.kv {
            n += 8 + key.len() + value_len(value);
        }
        for t in &self.tensors {
            n += 8 + t.name.len() + 4 + 8 * t.dims.len() + 4 + 8;
        }
        n
    }
}

/// Writes one tensor's data, padded to the alignment.
fn write_data(w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    w.write_all(data)?;
    w.write_all(&vec![0u8; padding(data.len())])
}

/// Zero bytes after `len` bytes of data up to the alignment.
fn padding(len: usize) -> usize {
    len.next_multiple_of(ALIGNMENT) - len
}

fn value_len(v: &Value) -> usize {
    4 + match v {
        Value::U16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::Bool(_) => 1,
        Value::Str(s) => 8 + s.len(),
        Value::StrArray(a) => 12 + a.iter().map(|s| 8 + s.len()).sum::<usize>(),
        Value::F32Array(a) => 12 + 4 * a.len(),
        Value::I32Array(a) => 12 + 4 * a.len(),
    }
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    const U16: u32 = 2;
    const U32: u32 = 4;
    const I32: u32 = 5;
    const F32: u32 = 6;
    const BOOL: u32 = 7;
    const STRING: u32 = 8;
    const ARRAY: u32 = 9;
    let array_head = |w: &mut dyn Write, ty: u32, n: usize| -> io::Result<()> {
        w.write_all(&ARRAY.to_le_bytes())?;
        w.write_all(&ty.to_le_bytes())?;
        w.write_all(&(n as u64).to_le_bytes())
    };
    match v {
        Value::U16(x) => {
            w.write_all(&U16.to_le_bytes())?;
            w.write_all(&x.to_le_bytes())
        }
        Value::U32(x) => {
            w.write_all(&U32.to_le_bytes())?;
            w.write_all(&x.to_le_bytes())
        }
        Value::I32(x) => {
            w.write_all(&I32.to_le_bytes())?;
            w.write_all(&x.to_le_bytes())
        }
        Value::F32(x) => {
            w.write_all(&F32.to_le_bytes())?;
            w.write_all(&x.to_le_bytes())
        }
        Value::Bool(x) => {
            w.write_all(&BOOL.to_le_bytes())?;
            w.write_all(&[*x as u8])
        }
        Value::Str(s) => {
            w.write_all(&STRING.to_le_bytes())?;
            put_str(w, s)
        }
        Value::StrArray(a) => {
            array_head(w, STRING, a.len())?;
            a.iter().try_for_each(|s| put_str(w, s))
        }
        Value::F32Array(a) => {
            array_head(w, F32, a.len())?;
            a.iter().try_for_each(|x| w.write_all(&x.to_le_bytes()))
        }
        Value::I32Array(a) => {
            array_head(w, I32, a.len())?;
            a.iter().try_for_each(|x| w.write_all(&x.to_le_bytes()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_section_is_aligned_and_sized() {
        let mut g = GgufWriter::new();
        g.kv("general.type", Value::Str("imatrix".into()));
        g.tensor_f32("a", &[3], &[1.0, 2.0, 3.0]);
        g.tensor_f32("b", &[2, 1], &[4.0, 5.0]);
        let bytes = g.to_bytes();
        assert_eq!(&bytes[..4], b"GGUF");
        let data_start = g.header_len().next_multiple_of(ALIGNMENT);
        assert_eq!(bytes.len(), data_start + 32 + 32);
        assert_eq!(&bytes[data_start..data_start + 4], &1.0f32.to_le_bytes());
        assert_eq!(
            &bytes[data_start + 32..data_start + 36],
            &4.0f32.to_le_bytes()
        );
        assert_eq!(bytes.len(), g.file_len());
        assert_eq!(g.into_parts().concat(), bytes);
    }
}
