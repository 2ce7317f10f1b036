//! On-device reductions of observed graph tensors: small ggml graphs run on
//! the backend that holds the tensor, reading it in place, so only their
//! results cross to the host.
//!
//! Inside the eval callback the scheduler has synchronised its backend, so
//! the observed tensor's buffer holds its values; each reduction here runs
//! to completion (a synchronous graph computation) before the callback
//! returns, while the graph allocator cannot yet reuse that memory. Nothing
//! reads `tensor->data` on the host: the same code runs on CPU and GPU
//! backends. Importance-matrix sums accumulate in device tensors across the
//! micro-batches of one chunk and are read (and zeroed) once per chunk.

use super::TensorRef;
use llama_cpp_sys_2 as sys;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::ptr::NonNull;

/// Why a reduction was not done on the device.
#[derive(Debug, thiserror::Error)]
pub enum ReduceError {
    /// The tensor's backend cannot run an operation the reduction needs (the
    /// caller reads the tensor on the host instead).
    #[error("the {device} backend does not support {op} for this reduction")]
    Unsupported {
        /// The device's name.
        device: String,
        /// The ggml operation.
        op: String,
    },
    /// A shape or type the reduction does not handle (the caller reads the
    /// tensor on the host instead).
    #[error("{0}")]
    Shape(String),
    /// ggml could not allocate or compute (out of device memory, ...).
    #[error("device reduction failed: {0}")]
    Backend(String),
}

/// ggml memory (a context and the backend buffer holding its tensors),
/// freed on drop.
struct Owned {
    ctx: NonNull<sys::ggml_context>,
    buffer: NonNull<sys::ggml_backend_buffer>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: both were created together in `Owned::alloc` and nothing
        // refers to their tensors after the owner drops them.
        unsafe {
            sys::ggml_backend_buffer_free(self.buffer.as_ptr());
            sys::ggml_free(self.ctx.as_ptr());
        }
    }
}

impl Owned {
    /// Allocates f32 tensors of the given 2-D shapes on `backend`, zeroed.
    fn alloc(
        backend: NonNull<sys::ggml_backend>,
        shapes: &[[i64; 2]],
    ) -> Result<(Owned, Vec<*mut sys::ggml_tensor>), ReduceError> {
        // SAFETY: plain ggml calls on objects created here; the context is
        // metadata only (no_alloc) and its tensors live in the buffer.
        unsafe {
            let params = sys::ggml_init_params {
                mem_size: (shapes.len() + 1) * sys::ggml_tensor_overhead(),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            };
            let ctx = NonNull::new(sys::ggml_init(params))
                .ok_or_else(|| ReduceError::Backend("ggml_init failed".into()))?;
            let tensors: Vec<_> = shapes
                .iter()
                .map(|s| sys::ggml_new_tensor_2d(ctx.as_ptr(), sys::GGML_TYPE_F32, s[0], s[1]))
                .collect();
            let Some(buffer) = NonNull::new(sys::ggml_backend_alloc_ctx_tensors(
                ctx.as_ptr(),
                backend.as_ptr(),
            )) else {
                sys::ggml_free(ctx.as_ptr());
                return Err(ReduceError::Backend(format!(
                    "could not allocate device tensors {shapes:?}"
                )));
            };
            sys::ggml_backend_buffer_clear(buffer.as_ptr(), 0);
            Ok((Owned { ctx, buffer }, tensors))
        }
    }
}

/// One backend device and what the reducer keeps on it.
struct Device {
    dev: sys::ggml_backend_dev_t,
    name: String,
    backend: NonNull<sys::ggml_backend>,
    galloc: NonNull<sys::ggml_gallocr>,
    /// `n x n` identity matrices by `n` (one-hot rows for expert ids).
    identities: BTreeMap<usize, (Owned, *mut sys::ggml_tensor)>,
}

impl Drop for Device {
    fn drop(&mut self) {
        self.identities.clear();
        // SAFETY: created in `Reducer::device`; no graph is in flight.
        unsafe {
            sys::ggml_gallocr_free(self.galloc.as_ptr());
            sys::ggml_backend_free(self.backend.as_ptr());
        }
    }
}

/// One weight's importance sums over the current chunk, on its device.
struct Accumulator {
    device: usize,
    mem: Owned,
    sums: *mut sys::ggml_tensor,
    counts: *mut sys::ggml_tensor,
    n_in: usize,
    n_mat: usize,
    touched: bool,
}

/// A chunk's importance sums of one weight, read from the device.
pub struct ChunkSquares {
    /// Weight name.
    pub weight: String,
    /// Input width.
    pub n_in: usize,
    /// Matrices (experts) in the weight.
    pub n_mat: usize,
    /// Sums of squared inputs, `[n_mat][n_in]` row-major.
    pub sum2: Vec<f32>,
    /// Rows (tokens, or token-slots for experts) counted per matrix.
    pub counts: Vec<f32>,
}

/// Where the experts of a stacked-expert matmul come from.
pub struct ExpertIds<'t, 'a> {
    /// The matmul's ids operand `[k, n_tokens]` (i32, values below `n_mat`).
    pub ids: &'t TensorRef<'a>,
    /// Matrices in the stacked weight.
    pub n_mat: usize,
}

/// Runs reductions on the backends of observed tensors; see the module doc.
pub struct Reducer {
    devices: Vec<Device>,
    accumulators: BTreeMap<String, Accumulator>,
    bytes_read: u64,
}

// SAFETY: the reducer's ggml objects are used by one thread at a time (every
// method takes &mut self) and ggml backends may move between threads.
unsafe impl Send for Reducer {}

/// A graph under construction: a metadata-only ggml context, freed on drop.
struct Graph {
    ctx: NonNull<sys::ggml_context>,
    inputs: Vec<(*mut sys::ggml_tensor, Vec<u8>)>,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created in `Graph::new`; its tensors are not used after.
        unsafe { sys::ggml_free(self.ctx.as_ptr()) }
    }
}

impl Graph {
    fn new() -> Result<Graph, ReduceError> {
        // SAFETY: a metadata-only context sized for a few dozen tensors and
        // one graph.
        let ctx = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: 64 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead(),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        NonNull::new(ctx)
            .map(|ctx| Graph {
                ctx,
                inputs: Vec::new(),
            })
            .ok_or_else(|| ReduceError::Backend("ggml_init failed".into()))
    }

    fn ctx(&self) -> *mut sys::ggml_context {
        self.ctx.as_ptr()
    }

    /// A leaf that reads the observed tensor `t` in place (same type,
    /// shape, strides, buffer and data), made contiguous on the device when
    /// it is a strided view.
    fn observed(&self, t: &TensorRef<'_>) -> *mut sys::ggml_tensor {
        let raw = t.raw();
        // SAFETY: the leaf is metadata in our context; pointing it at the
        // observed tensor's data is valid while the callback runs, which
        // outlives the graph's computation.
        unsafe {
            let leaf = sys::ggml_new_tensor(self.ctx(), raw.type_, 4, raw.ne.as_ptr());
            (*leaf).nb = raw.nb;
            (*leaf).buffer = raw.buffer;
            (*leaf).data = raw.data;
            if sys::ggml_is_contiguous(leaf) {
                leaf
            } else {
                sys::ggml_cont(self.ctx(), leaf)
            }
        }
    }

    /// An f32 input `[ne0, ne1, ne2]` whose values are uploaded after
    /// allocation.
    fn input(&mut self, ne: [i64; 3], values: &[f32]) -> *mut sys::ggml_tensor {
        assert_eq!(values.len() as i64, ne.iter().product::<i64>());
        // SAFETY: a new tensor in our context.
        let t = unsafe {
            let t = sys::ggml_new_tensor_3d(self.ctx(), sys::GGML_TYPE_F32, ne[0], ne[1], ne[2]);
            sys::ggml_set_input(t);
            t
        };
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.inputs.push((t, bytes));
        t
    }
}

impl Reducer {
    /// A reducer with no device started yet.
    pub fn new() -> Reducer {
        Reducer {
            devices: Vec::new(),
            accumulators: BTreeMap::new(),
            bytes_read: 0,
        }
    }

    /// Bytes copied from backends to the host so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The device holding `t`, its backend created on first use.
    fn device(&mut self, t: &TensorRef<'_>) -> Result<usize, ReduceError> {
        let raw = t.raw();
        if raw.buffer.is_null() || raw.data.is_null() {
            return Err(ReduceError::Shape(format!(
                "{} has no backend buffer",
                t.name()
            )));
        }
        // SAFETY: the buffer of a live, computed graph tensor; the CPU
        // device is a static registry entry.
        let dev = unsafe {
            // Host memory (plain or pinned) is reduced by the CPU backend;
            // ggml's plain CPU buffer type names no device anyway (a FIXME
            // upstream).
            if sys::ggml_backend_buffer_is_host(raw.buffer) {
                sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU)
            } else {
                sys::ggml_backend_buft_get_device(sys::ggml_backend_buffer_get_type(raw.buffer))
            }
        };
        if dev.is_null() {
            return Err(ReduceError::Shape(format!(
                "{}: its buffer type has no device",
                t.name()
            )));
        }
        if let Some(i) = self.devices.iter().position(|d| d.dev == dev) {
            return Ok(i);
        }
        // SAFETY: `dev` is a registered device; the backend and allocator
        // are freed in Device's Drop.
        let device = unsafe {
            let name = CStr::from_ptr(sys::ggml_backend_dev_name(dev))
                .to_string_lossy()
                .into_owned();
            let backend = NonNull::new(sys::ggml_backend_dev_init(dev, std::ptr::null()))
                .ok_or_else(|| ReduceError::Backend(format!("cannot start a {name} backend")))?;
            if sys::ggml_backend_is_cpu(backend.as_ptr()) {
                // One thread: these graphs are small, and a second thread
                // spinning on ggml's barriers next to llama.cpp's idle pool
                // made them 20x slower on a loaded 2-core machine (measured).
                sys::ggml_backend_cpu_set_n_threads(backend.as_ptr(), 1);
            }
            let buft = sys::ggml_backend_get_default_buffer_type(backend.as_ptr());
            let Some(galloc) = NonNull::new(sys::ggml_gallocr_new(buft)) else {
                sys::ggml_backend_free(backend.as_ptr());
                return Err(ReduceError::Backend(format!(
                    "cannot make a {name} graph allocator"
                )));
            };
            Device {
                dev,
                name,
                backend,
                galloc,
                identities: BTreeMap::new(),
            }
        };
        self.devices.push(device);
        Ok(self.devices.len() - 1)
    }

    /// The `n x n` identity on device `d` (made on first use).
    fn identity(&mut self, d: usize, n: usize) -> Result<*mut sys::ggml_tensor, ReduceError> {
        let device = &mut self.devices[d];
        if let Some((_, t)) = device.identities.get(&n) {
            return Ok(*t);
        }
        let (mem, tensors) = Owned::alloc(device.backend, &[[n as i64, n as i64]])?;
        let mut eye = vec![0f32; n * n];
        for i in 0..n {
            eye[i * n + i] = 1.0;
        }
        // SAFETY: the tensor was just allocated with n*n f32 values.
        unsafe {
            sys::ggml_backend_tensor_set(tensors[0], eye.as_ptr().cast(), 0, n * n * 4);
        }
        device.identities.insert(n, (mem, tensors[0]));
        Ok(tensors[0])
    }

    /// Builds the graph of `outputs`, checks that device `d` supports every
    /// node, allocates, uploads the inputs and computes synchronously.
    fn compute(
        &mut self,
        d: usize,
        g: &Graph,
        outputs: &[*mut sys::ggml_tensor],
    ) -> Result<(), ReduceError> {
        let device = &self.devices[d];
        // SAFETY: the graph lives in g's context; every tensor in it is
        // either ours, an observed tensor's data (live during the callback),
        // or an accumulator/identity owned by this reducer.
        unsafe {
            let gf = sys::ggml_new_graph(g.ctx());
            for &out in outputs {
                sys::ggml_build_forward_expand(gf, out);
            }
            for i in 0..sys::ggml_graph_n_nodes(gf) {
                let node = sys::ggml_graph_node(gf, i);
                if !sys::ggml_backend_supports_op(device.backend.as_ptr(), node) {
                    let op = CStr::from_ptr(sys::ggml_op_name((*node).op)).to_string_lossy();
                    return Err(ReduceError::Unsupported {
                        device: device.name.clone(),
                        op: op.into_owned(),
                    });
                }
            }
            if !sys::ggml_gallocr_alloc_graph(device.galloc.as_ptr(), gf) {
                return Err(ReduceError::Backend(format!(
                    "cannot allocate a reduction graph on {}",
                    device.name
                )));
            }
            for (t, bytes) in &g.inputs {
                sys::ggml_backend_tensor_set(*t, bytes.as_ptr().cast(), 0, bytes.len());
            }
            let status = sys::ggml_backend_graph_compute(device.backend.as_ptr(), gf);
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(ReduceError::Backend(format!(
                    "graph computation on {} returned status {status}",
                    device.name
                )));
            }
        }
        Ok(())
    }

    /// Copies a computed f32 tensor to the host.
    fn read_f32(&mut self, t: *mut sys::ggml_tensor) -> Vec<f32> {
        // SAFETY: `t` is a computed, contiguous f32 tensor of our graph or
        // an accumulator; we copy exactly its element count.
        unsafe {
            let n = sys::ggml_nelements(t) as usize;
            let mut v = vec![0f32; n];
            sys::ggml_backend_tensor_get(t, v.as_mut_ptr().cast(), 0, n * 4);
            self.bytes_read += (n * 4) as u64;
            v
        }
    }

    /// The values of an f32 tensor of any strides, compacted on the device
    /// (fastest dimension first).
    pub fn compact_f32(&mut self, t: &TensorRef<'_>) -> Result<Vec<f32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_F32)?;
        let d = self.device(t)?;
        let g = Graph::new()?;
        let out = g.observed(t);
        self.compute(d, &g, &[out])?;
        Ok(self.read_f32(out))
    }

    /// The values of an i32 tensor of any strides (a view such as
    /// `ffn_moe_topk`), compacted on the device.
    pub fn compact_i32(&mut self, t: &TensorRef<'_>) -> Result<Vec<i32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_I32)?;
        let d = self.device(t)?;
        let g = Graph::new()?;
        let out = g.observed(t);
        self.compute(d, &g, &[out])?;
        // SAFETY: `out` is a computed contiguous i32 tensor.
        unsafe {
            let n = sys::ggml_nelements(out) as usize;
            let mut v = vec![0i32; n];
            sys::ggml_backend_tensor_get(out, v.as_mut_ptr().cast(), 0, n * 4);
            self.bytes_read += (n * 4) as u64;
            Ok(v)
        }
    }

    /// The L2 norm of every row (dimension 0) of an f32 tensor:
    /// `sqrt(sum_rows(sqr(t)))`, one value per row in row order.
    pub fn row_norms(&mut self, t: &TensorRef<'_>) -> Result<Vec<f32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_F32)?;
        let d = self.device(t)?;
        let g = Graph::new()?;
        // SAFETY: unary ops on tensors of our context.
        let out = unsafe {
            let x = g.observed(t);
            sys::ggml_sqrt(
                g.ctx(),
                sys::ggml_sum_rows(g.ctx(), sys::ggml_sqr(g.ctx(), x)),
            )
        };
        self.compute(d, &g, &[out])?;
        Ok(self.read_f32(out))
    }

    /// Column sums of a `[n, n_tokens]` f32 tensor weighted per token:
    /// `out[c][i] = sum_t t[i, t] * weights[t][c]` for `n_cols` columns
    /// (`weights` row-major by token), `[n_cols][n]` row-major.
    pub fn weighted_sums(
        &mut self,
        t: &TensorRef<'_>,
        weights: &[f32],
        n_cols: usize,
    ) -> Result<Vec<f32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_F32)?;
        let ne = t.ne();
        if ne[2] != 1 || ne[3] != 1 || weights.len() != ne[1] * n_cols {
            return Err(ReduceError::Shape(format!(
                "{}: weighted sums of shape {ne:?} with {} weights for {n_cols} columns",
                t.name(),
                weights.len()
            )));
        }
        let d = self.device(t)?;
        let mut g = Graph::new()?;
        let w = g.input([n_cols as i64, ne[1] as i64, 1], weights);
        // SAFETY: an outer product of two tensors of our context.
        let out = unsafe { sys::ggml_out_prod(g.ctx(), g.observed(t), w) };
        self.compute(d, &g, &[out])?;
        Ok(self.read_f32(out))
    }

    /// Adds the squares of a matmul input `x` over the tokens where
    /// `mask` is 1 to the device accumulator of `weight`, with row counts:
    /// for a dense weight `x` is `[n_in, n_tokens]`; for stacked experts `x`
    /// is `[n_in, 1 or k, n_tokens]` and each (token, slot) counts for the
    /// expert its id selects.
    pub fn accumulate_squares(
        &mut self,
        weight: &str,
        x: &TensorRef<'_>,
        experts: Option<ExpertIds<'_, '_>>,
        mask: &[f32],
    ) -> Result<(), ReduceError> {
        expect_type(x, sys::GGML_TYPE_F32)?;
        let (xne, n_tokens) = (x.ne(), mask.len());
        let n_in = xne[0];
        let n_mat = experts.as_ref().map_or(1, |e| e.n_mat);
        let d = self.device(x)?;
        let mut g = Graph::new()?;
        let shape_err = || {
            ReduceError::Shape(format!(
                "{weight}: input {} of shape {xne:?} for {n_tokens} tokens",
                x.name()
            ))
        };
        let (contrib, counts) = match &experts {
            None => {
                if xne[1] != n_tokens || xne[2] != 1 || xne[3] != 1 {
                    return Err(shape_err());
                }
                let per_token = g.input([1, n_tokens as i64, 1], mask);
                let as_row = g.input([n_tokens as i64, 1, 1], mask);
                // SAFETY: ops on tensors of our context.
                unsafe {
                    let sq = sys::ggml_sqr(g.ctx(), g.observed(x));
                    (
                        sys::ggml_out_prod(g.ctx(), sq, per_token),
                        sys::ggml_sum_rows(g.ctx(), as_row),
                    )
                }
            }
            Some(e) => {
                expect_type(e.ids, sys::GGML_TYPE_I32)?;
                let ine = e.ids.ne();
                let k = ine[0];
                if ine[1] != n_tokens
                    || ine[2] != 1
                    || xne[2] != n_tokens
                    || xne[3] != 1
                    || (xne[1] != 1 && xne[1] != k)
                {
                    return Err(shape_err());
                }
                if self.device(e.ids)? != d {
                    return Err(ReduceError::Shape(format!(
                        "{weight}: input and expert ids live on different devices"
                    )));
                }
                let eye = self.identity(d, e.n_mat)?;
                let m = g.input([1, 1, n_tokens as i64], mask);
                let (k, t, n, n_in) = (k as i64, n_tokens as i64, e.n_mat as i64, n_in as i64);
                // SAFETY: ops on tensors of our context, the identity and
                // the observed ids (validated by the caller to lie below
                // n_mat, as ggml_get_rows requires).
                unsafe {
                    let c = g.ctx();
                    // One-hot rows [n, k, T] of the selected experts, zero on
                    // masked tokens.
                    let ids = sys::ggml_reshape_1d(c, g.observed(e.ids), k * t);
                    let rows = sys::ggml_reshape_3d(c, sys::ggml_get_rows(c, eye, ids), n, k, t);
                    let hot = sys::ggml_mul(c, rows, m);
                    let sq = sys::ggml_sqr(c, g.observed(x));
                    let (a, b) = if xne[1] == 1 {
                        // One input row per token, shared by its k slots:
                        // sum the one-hot rows over the slots.
                        let per_token = sys::ggml_cont(c, sys::ggml_permute(c, hot, 1, 0, 2, 3));
                        let summed = sys::ggml_sum_rows(c, per_token);
                        (
                            sys::ggml_reshape_2d(c, sq, n_in, t),
                            sys::ggml_reshape_2d(c, summed, n, t),
                        )
                    } else {
                        (
                            sys::ggml_reshape_2d(c, sq, n_in, k * t),
                            sys::ggml_reshape_2d(c, hot, n, k * t),
                        )
                    };
                    let per_expert = sys::ggml_cont(c, sys::ggml_transpose(c, b));
                    (
                        sys::ggml_out_prod(c, a, b),
                        sys::ggml_sum_rows(c, per_expert),
                    )
                }
            }
        };
        let acc = self.accumulator(d, weight, n_in, n_mat)?;
        let (sums, counts_acc) = (acc.sums, acc.counts);
        acc.touched = true;
        // SAFETY: in-place adds into the accumulator tensors (same shapes:
        // [n_in, n_mat] and [1, n_mat]).
        let outputs = unsafe {
            [
                sys::ggml_add_inplace(g.ctx(), sums, contrib),
                sys::ggml_add_inplace(g.ctx(), counts_acc, counts),
            ]
        };
        self.compute(d, &g, &outputs)
    }

    /// The accumulator of `weight`, made on device `d` on first use.
    fn accumulator(
        &mut self,
        d: usize,
        weight: &str,
        n_in: usize,
        n_mat: usize,
    ) -> Result<&mut Accumulator, ReduceError> {
        if !self.accumulators.contains_key(weight) {
            let (mem, t) = Owned::alloc(
                self.devices[d].backend,
                &[[n_in as i64, n_mat as i64], [1, n_mat as i64]],
            )?;
            self.accumulators.insert(
                weight.to_string(),
                Accumulator {
                    device: d,
                    mem,
                    sums: t[0],
                    counts: t[1],
                    n_in,
                    n_mat,
                    touched: false,
                },
            );
        }
        let acc = self.accumulators.get_mut(weight).expect("inserted above");
        if acc.device != d || acc.n_in != n_in || acc.n_mat != n_mat {
            return Err(ReduceError::Shape(format!(
                "{weight}: input [{n_in}] x {n_mat} matrices on device {d}, earlier [{}] x {} on device {}",
                acc.n_in, acc.n_mat, acc.device
            )));
        }
        Ok(acc)
    }

    /// Reads and zeroes every accumulator touched since the last call (one
    /// chunk's sums), in weight-name order.
    pub fn take_chunk(&mut self) -> Vec<ChunkSquares> {
        let touched: Vec<String> = self
            .accumulators
            .iter()
            .filter(|(_, a)| a.touched)
            .map(|(name, _)| name.clone())
            .collect();
        let mut out = Vec::with_capacity(touched.len());
        for weight in touched {
            let (sums, counts, n_in, n_mat) = {
                let a = &self.accumulators[&weight];
                (a.sums, a.counts, a.n_in, a.n_mat)
            };
            let sum2 = self.read_f32(sums);
            let counts = self.read_f32(counts);
            let a = self.accumulators.get_mut(&weight).expect("listed above");
            a.touched = false;
            // SAFETY: the accumulator's own buffer; no graph is in flight.
            unsafe { sys::ggml_backend_buffer_clear(a.mem.buffer.as_ptr(), 0) };
            out.push(ChunkSquares {
                weight,
                n_in,
                n_mat,
                sum2,
                counts,
            });
        }
        out
    }
}

impl Default for Reducer {
    fn default() -> Self {
        Reducer::new()
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // Accumulators live in device buffers: free them before the devices.
        self.accumulators.clear();
        self.devices.clear();
    }
}

fn expect_type(t: &TensorRef<'_>, ty: sys::ggml_type) -> Result<(), ReduceError> {
    if t.raw().type_ == ty {
        Ok(())
    } else {
        Err(ReduceError::Shape(format!(
            "{} has ggml type {}, expected {ty}",
            t.name(),
            t.raw().type_
        )))
    }
}
