//! A safe, borrowed view of a ggml graph tensor inside the eval callback.

use llama_cpp_sys_2 as sys;
use std::borrow::Cow;
use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;

/// The graph operations the worker distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Dense matrix multiplication (`MUL_MAT`).
    MulMat,
    /// Stacked-expert matrix multiplication (`MUL_MAT_ID`).
    MulMatId,
    /// Anything else.
    Other,
}

/// Element types the worker reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    /// 32-bit float.
    F32,
    /// 32-bit signed integer.
    I32,
    /// Anything else (not read).
    Other,
}

/// A graph tensor borrowed for the duration of one callback invocation.
pub struct TensorRef<'a> {
    raw: &'a sys::ggml_tensor,
    /// Bytes the host has read out of graph tensors so far (the context's
    /// backend-to-host figure); [`TensorRef::bytes`] adds to it.
    read: Option<&'a Cell<u64>>,
    _life: PhantomData<&'a ()>,
}

impl<'a> TensorRef<'a> {
    /// Wraps a raw tensor pointer.
    ///
    /// # Safety
    /// `t` must be null or point to a live `ggml_tensor` for lifetime `'a`.
    pub(super) unsafe fn from_raw(
        t: *const sys::ggml_tensor,
        read: Option<&'a Cell<u64>>,
    ) -> Option<TensorRef<'a>> {
        // SAFETY: guaranteed by the caller.
        unsafe { t.as_ref() }.map(|raw| TensorRef {
            raw,
            read,
            _life: PhantomData,
        })
    }

    /// The raw tensor, for the device reductions of this module.
    pub(super) fn raw(&self) -> &'a sys::ggml_tensor {
        self.raw
    }

    /// Adds `n` bytes to the context's backend-to-host figure.
    pub(super) fn count_read(&self, n: usize) {
        if let Some(c) = self.read {
            c.set(c.get() + n as u64);
        }
    }

    /// The node's name (`ffn_moe_probs-3`, `blk.0.attn_q.weight`, ...).
    pub fn name(&self) -> &str {
        // SAFETY: ggml names are NUL-terminated within their 64-byte array.
        let c = unsafe { CStr::from_ptr(self.raw.name.as_ptr()) };
        c.to_str().unwrap_or("")
    }

    /// The node's operation.
    pub fn op(&self) -> Op {
        match self.raw.op {
            sys::GGML_OP_MUL_MAT => Op::MulMat,
            sys::GGML_OP_MUL_MAT_ID => Op::MulMatId,
            _ => Op::Other,
        }
    }

    /// ggml's name of the node's operation, unary and GLU ops by their own
    /// name (`SOFT_MAX`, `SIGMOID`, `MUL_MAT`, ...): how the routing probe
    /// tells gating functions apart.
    pub fn op_desc(&self) -> &'static str {
        // SAFETY: the tensor is live; ggml returns a static NUL-terminated name.
        let c = unsafe { CStr::from_ptr(sys::ggml_op_desc(self.raw)) };
        c.to_str().unwrap_or("")
    }

    /// Operation parameter `i` read as an f32 (`ggml_scale`'s factor is 0).
    pub fn op_param_f32(&self, i: usize) -> Option<f32> {
        self.raw
            .op_params
            .get(i)
            .map(|&bits| f32::from_bits(bits as u32))
    }

    /// Element type.
    pub fn elem(&self) -> ElemType {
        match self.raw.type_ {
            sys::GGML_TYPE_F32 => ElemType::F32,
            sys::GGML_TYPE_I32 => ElemType::I32,
            _ => ElemType::Other,
        }
    }

    /// Elements per dimension (ggml `ne`, fastest-varying first).
    pub fn ne(&self) -> [usize; 4] {
        self.raw.ne.map(|n| n.max(0) as usize)
    }

    /// Byte strides per dimension (ggml `nb`).
    pub fn nb(&self) -> [usize; 4] {
        self.raw.nb
    }

    /// The node's identity within the current graph: two operands that are
    /// the same graph node hold the same values (unlike equal data
    /// addresses, which the graph allocator reuses across nodes).
    pub fn node_id(&self) -> usize {
        std::ptr::from_ref(self.raw) as usize
    }

    /// Source operand `i`, if present.
    pub fn src(&self, i: usize) -> Option<TensorRef<'a>> {
        let p = *self.raw.src.get(i)?;
        // SAFETY: sources of a live graph node are live for the same call.
        unsafe { TensorRef::from_raw(p, self.read) }
    }

    /// The tensor's bytes from offset 0 up to `ggml_nbytes` (which spans
    /// every strided element): borrowed from host memory, copied otherwise.
    /// Either way they count as crossing from the backend to the host (on a
    /// GPU they would be copied).
    pub fn bytes(&self) -> Cow<'a, [u8]> {
        // SAFETY: the tensor is live and computed (observe phase); for host
        // buffers `data` points to ggml_nbytes readable bytes, otherwise
        // ggml_backend_tensor_get copies exactly that many bytes.
        unsafe {
            let n = sys::ggml_nbytes(self.raw);
            if n == 0 || self.raw.data.is_null() {
                return Cow::Borrowed(&[]);
            }
            self.count_read(n);
            let host =
                self.raw.buffer.is_null() || sys::ggml_backend_buffer_is_host(self.raw.buffer);
            if host {
                Cow::Borrowed(std::slice::from_raw_parts(self.raw.data as *const u8, n))
            } else {
                let mut v = vec![0u8; n];
                sys::ggml_backend_tensor_get(self.raw, v.as_mut_ptr().cast(), 0, n);
                Cow::Owned(v)
            }
        }
    }
}

impl TensorRef<'_> {
    /// Row `i` (dimension 1) of a 2-D f32 tensor with contiguous rows,
    /// copied to the host (counted as crossing, like [`TensorRef::bytes`]);
    /// empty for another type or a row out of range.
    pub fn row_f32(&self, i: usize) -> Vec<f32> {
        let [ne0, ne1, ..] = self.ne();
        if self.raw.type_ != sys::GGML_TYPE_F32 || self.raw.nb[0] != 4 || i >= ne1 {
            return Vec::new();
        }
        let mut row = vec![0f32; ne0];
        // SAFETY: the tensor is live and computed (observe phase); row i
        // spans ne0 contiguous f32 values from offset i * nb[1], inside it.
        unsafe {
            sys::ggml_backend_tensor_get(
                self.raw,
                row.as_mut_ptr().cast(),
                i * self.raw.nb[1],
                ne0 * 4,
            );
        }
        self.count_read(ne0 * 4);
        row
    }
}

/// Reads a little-endian f32 at byte offset `off`.
#[inline]
pub fn f32_at(bytes: &[u8], off: usize) -> f32 {
    f32::from_le_bytes(bytes[off..off + 4].try_into().expect("4 bytes"))
}

/// Reads consecutive little-endian f32 values (a row of a contiguous tensor).
#[inline]
pub fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
}

/// `bytes` as `&[f32]` when they are 4-byte aligned and a whole number of
/// values (a row of a host tensor usually is), so that loops over it
/// vectorise; `None` otherwise (read them with [`f32s`]).
#[inline]
pub fn as_f32s(bytes: &[u8]) -> Option<&[f32]> {
    // SAFETY: every bit pattern is a valid f32; `align_to` only hands out the
    // aligned middle, and anything unaligned is refused below.
    let (head, values, tail) = unsafe { bytes.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(values)
}

/// Reads a little-endian i32 at byte offset `off`.
#[inline]
pub fn i32_at(bytes: &[u8], off: usize) -> i32 {
    i32::from_le_bytes(bytes[off..off + 4].try_into().expect("4 bytes"))
}
