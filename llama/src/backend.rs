//! Small ggml graphs computed on the backend that holds an observed graph
//! tensor, reading it in place: the machinery the device reductions
//! ([`super::Reducer`]) and the logits comparisons ([`super::LogitsCompare`])
//! share. Backends are started on first use, one per device; results are
//! copied to the host only when asked for, and every byte copied is counted.

use super::TensorRef;
use llama_cpp_sys_2 as sys;
use std::ffi::CStr;
use std::ptr::NonNull;

/// Why a computation was not done on the device.
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
pub(super) struct Owned {
    ctx: NonNull<sys::ggml_context>,
    pub(super) buffer: NonNull<sys::ggml_backend_buffer>,
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
    /// Allocates tensors of the given types and 2-D shapes on `backend`, zeroed.
    pub(super) fn alloc(
        backend: NonNull<sys::ggml_backend>,
        shapes: &[(sys::ggml_type, [i64; 2])],
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
                .map(|(ty, s)| sys::ggml_new_tensor_2d(ctx.as_ptr(), *ty, s[0], s[1]))
                .collect();
            let Some(buffer) = NonNull::new(sys::ggml_backend_alloc_ctx_tensors(
                ctx.as_ptr(),
                backend.as_ptr(),
            )) else {
                sys::ggml_free(ctx.as_ptr());
                return Err(ReduceError::Backend(format!(
                    "could not allocate device tensors {:?}",
                    shapes.iter().map(|s| s.1).collect::<Vec<_>>()
                )));
            };
            sys::ggml_backend_buffer_clear(buffer.as_ptr(), 0);
            Ok((Owned { ctx, buffer }, tensors))
        }
    }
}

/// One backend device: its backend and graph allocator.
struct Device {
    dev: sys::ggml_backend_dev_t,
    name: String,
    backend: NonNull<sys::ggml_backend>,
    galloc: NonNull<sys::ggml_gallocr>,
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: created in `Devices::of`; no graph is in flight.
        unsafe {
            sys::ggml_gallocr_free(self.galloc.as_ptr());
            sys::ggml_backend_free(self.backend.as_ptr());
        }
    }
}

/// How a CPU backend started by [`Devices`] computes.
#[derive(Clone, Copy)]
pub(super) enum CpuThreads {
    /// One thread, the caller's: right for small graphs (a second thread
    /// spinning on ggml's barriers next to llama.cpp's idle pool made them
    /// 20x slower on a loaded 2-core machine, measured).
    One,
    /// The threads of a ggml thread pool that llama.cpp computes on too
    /// (large graphs, computed between llama.cpp's own graph pieces).
    Pool(NonNull<sys::ggml_threadpool>, u32),
}

/// The backends of the devices that observed tensors live on.
pub(super) struct Devices {
    devices: Vec<Device>,
    cpu: CpuThreads,
    bytes_read: u64,
    /// Seconds spent in the backends' graph computations.
    compute_s: f64,
}

// SAFETY: the ggml objects are used by one thread at a time (every method
// takes &mut self) and ggml backends may move between threads; a thread
// pool handle is only used while its owner computes on this thread.
unsafe impl Send for Devices {}

impl Devices {
    /// No backend started yet; CPU backends compute as `cpu` says.
    pub(super) fn new(cpu: CpuThreads) -> Devices {
        Devices {
            devices: Vec::new(),
            cpu,
            bytes_read: 0,
            compute_s: 0.0,
        }
    }

    /// Seconds spent in the backends' graph computations so far.
    pub(super) fn compute_seconds(&self) -> f64 {
        self.compute_s
    }

    /// Bytes copied from backends to the host so far.
    pub(super) fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The backend of device `d`.
    pub(super) fn backend(&self, d: usize) -> NonNull<sys::ggml_backend> {
        self.devices[d].backend
    }

    /// The device holding `t`, its backend started on first use.
    pub(super) fn of(&mut self, t: &TensorRef<'_>) -> Result<usize, ReduceError> {
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
            // Host memory (plain or pinned) is computed on by the CPU
            // backend; ggml's plain CPU buffer type names no device anyway
            // (a FIXME upstream).
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
        // are freed in Device's Drop; a pool outlives this object (its
        // owner keeps it for as long as it computes with us).
        let device = unsafe {
            let name = CStr::from_ptr(sys::ggml_backend_dev_name(dev))
                .to_string_lossy()
                .into_owned();
            let backend = NonNull::new(sys::ggml_backend_dev_init(dev, std::ptr::null()))
                .ok_or_else(|| ReduceError::Backend(format!("cannot start a {name} backend")))?;
            if sys::ggml_backend_is_cpu(backend.as_ptr()) {
                match self.cpu {
                    CpuThreads::One => sys::ggml_backend_cpu_set_n_threads(backend.as_ptr(), 1),
                    CpuThreads::Pool(pool, n) => {
                        sys::ggml_backend_cpu_set_n_threads(backend.as_ptr(), n as i32);
                        sys::ggml_backend_cpu_set_threadpool(backend.as_ptr(), pool.as_ptr());
                    }
                }
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
            }
        };
        self.devices.push(device);
        Ok(self.devices.len() - 1)
    }

    /// Builds the graph of `outputs`, checks that device `d` supports every
    /// node, allocates, uploads the inputs and computes synchronously.
    pub(super) fn compute(
        &mut self,
        d: usize,
        g: &Graph,
        outputs: &[*mut sys::ggml_tensor],
    ) -> Result<(), ReduceError> {
        let device = &self.devices[d];
        // SAFETY: the graph lives in g's context; every tensor in it is
        // either ours, an observed tensor's data (live during the callback),
        // or memory owned by the caller for longer than this call.
        unsafe {
            let gf = sys::ggml_new_graph(g.ctx());
            for &out in outputs {
                // Outputs keep their memory (the allocator reuses that of
                // intermediate nodes, which an output may also be).
                sys::ggml_set_output(out);
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
            let started = std::time::Instant::now();
            let status = sys::ggml_backend_graph_compute(device.backend.as_ptr(), gf);
            self.compute_s += started.elapsed().as_secs_f64();
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(ReduceError::Backend(format!(
                    "graph computation on {} returned status {status}",
                    device.name
                )));
            }
        }
        Ok(())
    }

    /// Copies a computed, contiguous tensor of 4-byte elements to the host.
    fn read<T: Copy + Default>(&mut self, t: *mut sys::ggml_tensor) -> Vec<T> {
        debug_assert_eq!(std::mem::size_of::<T>(), 4);
        // SAFETY: `t` is a computed, contiguous tensor of 4-byte elements
        // (checked by the callers' types); we copy exactly its element count.
        unsafe {
            let n = sys::ggml_nelements(t) as usize;
            let mut v = vec![T::default(); n];
            sys::ggml_backend_tensor_get(t, v.as_mut_ptr().cast(), 0, n * 4);
            self.bytes_read += (n * 4) as u64;
            v
        }
    }

    /// Copies a computed, contiguous f32 tensor to the host.
    pub(super) fn read_f32(&mut self, t: *mut sys::ggml_tensor) -> Vec<f32> {
        // SAFETY: reading the type of a live tensor.
        debug_assert_eq!(unsafe { (*t).type_ }, sys::GGML_TYPE_F32);
        self.read(t)
    }

    /// Copies a computed, contiguous i32 tensor to the host.
    pub(super) fn read_i32(&mut self, t: *mut sys::ggml_tensor) -> Vec<i32> {
        // SAFETY: reading the type of a live tensor.
        debug_assert_eq!(unsafe { (*t).type_ }, sys::GGML_TYPE_I32);
        self.read(t)
    }
}

/// A graph under construction: a metadata-only ggml context, freed on drop.
pub(super) struct Graph {
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
    /// An empty graph with room for a hundred tensors.
    pub(super) fn new() -> Result<Graph, ReduceError> {
        // SAFETY: a metadata-only context sized for a hundred tensors and
        // one graph.
        let ctx = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: 128 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead(),
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

    /// The graph's ggml context, for building nodes.
    pub(super) fn ctx(&self) -> *mut sys::ggml_context {
        self.ctx.as_ptr()
    }

    /// A leaf that reads the observed tensor `t` in place (same type,
    /// shape, strides, buffer and data), made contiguous on the device when
    /// it is a strided view.
    pub(super) fn observed(&self, t: &TensorRef<'_>) -> *mut sys::ggml_tensor {
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

    /// An input of type `ty` and shape `ne` whose little-endian `bytes`
    /// are uploaded after allocation.
    fn input_bytes(
        &mut self,
        ty: sys::ggml_type,
        ne: [i64; 3],
        bytes: Vec<u8>,
    ) -> *mut sys::ggml_tensor {
        // SAFETY: a new tensor in our context.
        let t = unsafe {
            let t = sys::ggml_new_tensor_3d(self.ctx(), ty, ne[0], ne[1], ne[2]);
            sys::ggml_set_input(t);
            t
        };
        self.inputs.push((t, bytes));
        t
    }

    /// An f32 input `[ne0, ne1, ne2]` whose values are uploaded after
    /// allocation.
    pub(super) fn input(&mut self, ne: [i64; 3], values: &[f32]) -> *mut sys::ggml_tensor {
        assert_eq!(values.len() as i64, ne.iter().product::<i64>());
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.input_bytes(sys::GGML_TYPE_F32, ne, bytes)
    }

    /// An i32 input `[ne0, ne1, ne2]` (row or element indices).
    pub(super) fn input_i32(&mut self, ne: [i64; 3], values: &[i32]) -> *mut sys::ggml_tensor {
        assert_eq!(values.len() as i64, ne.iter().product::<i64>());
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.input_bytes(sys::GGML_TYPE_I32, ne, bytes)
    }
}

/// Checks that `t` has ggml type `ty`.
pub(super) fn expect_type(t: &TensorRef<'_>, ty: sys::ggml_type) -> Result<(), ReduceError> {
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
