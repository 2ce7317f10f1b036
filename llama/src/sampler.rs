//! A backend sampler that samples nothing. Attached to a context's
//! sequence, it tells llama.cpp that the sequence's outputs are handled on
//! the backend, so llama.cpp skips its copy of the raw logits to the host
//! (`needs_raw_logits` in `llama-context.cpp`); it adds no node to the graph
//! (its `backend_apply` clears the row it is given), so the graph computes
//! exactly what it computed before, and llama.cpp copies no sampled output.

use llama_cpp_sys_2 as sys;
use std::ffi::c_char;
use std::ptr::NonNull;

unsafe extern "C" fn name(_: *const sys::llama_sampler) -> *const c_char {
    c"moe-census-no-sampling".as_ptr()
}

/// Sampling on the host is never asked of this sampler (its context reads
/// no sampled token); a call leaves the candidates as they are.
unsafe extern "C" fn apply(_: *mut sys::llama_sampler, _: *mut sys::llama_token_data_array) {}

unsafe extern "C" fn backend_init(
    _: *mut sys::llama_sampler,
    _: sys::ggml_backend_buffer_type_t,
    _: u32,
) -> bool {
    true
}

unsafe extern "C" fn backend_apply(
    _: *mut sys::llama_sampler,
    _: *mut sys::ggml_context,
    _: *mut sys::ggml_cgraph,
    data: *mut sys::llama_sampler_data,
) {
    // SAFETY: llama.cpp passes a valid sampler-data struct for this call.
    // Without outputs nothing is added to the graph or copied afterwards.
    if let Some(data) = unsafe { data.as_mut() } {
        data.logits = std::ptr::null_mut();
        data.probs = std::ptr::null_mut();
        data.sampled = std::ptr::null_mut();
        data.candidates = std::ptr::null_mut();
    }
}

/// The interface table; llama.cpp keeps a pointer to it for the sampler's life.
struct Iface(sys::llama_sampler_i);

// SAFETY: the table holds only function pointers and is never written.
unsafe impl Sync for Iface {}

static IFACE: Iface = Iface(sys::llama_sampler_i {
    name: Some(name),
    accept: None,
    apply: Some(apply),
    reset: None,
    clone: None,
    free: None,
    backend_init: Some(backend_init),
    backend_accept: None,
    backend_apply: Some(backend_apply),
    backend_set_input: None,
    backend_reset: None,
    copy_state: None,
});

/// A sampler chain holding one no-op backend sampler (llama.cpp accepts
/// only chains as backend samplers), freed on drop: after every context it
/// was attached to.
pub(super) struct NoSampler {
    chain: NonNull<sys::llama_sampler>,
}

// SAFETY: the chain is only touched by llama.cpp inside the decodes of the
// context that owns this value (one thread at a time) and freed once.
unsafe impl Send for NoSampler {}

impl NoSampler {
    /// A new chain.
    pub(super) fn new() -> NoSampler {
        // SAFETY: llama.cpp never writes through the interface pointer
        // (it only calls the functions), so handing out the static table
        // as `*mut` is sound; the chain takes ownership of the sampler.
        unsafe {
            let iface = std::ptr::from_ref(&IFACE.0).cast_mut();
            let sampler = sys::llama_sampler_init(iface, std::ptr::null_mut());
            let chain = sys::llama_sampler_chain_init(sys::llama_sampler_chain_default_params());
            sys::llama_sampler_chain_add(chain, sampler);
            NoSampler {
                chain: NonNull::new(chain).expect("llama_sampler_chain_init returned null"),
            }
        }
    }

    /// The chain, for the context parameters.
    pub(super) fn as_ptr(&self) -> *mut sys::llama_sampler {
        self.chain.as_ptr()
    }
}

impl Drop for NoSampler {
    fn drop(&mut self) {
        // SAFETY: the chain came from llama_sampler_chain_init and the
        // context using it has been freed (it is dropped before this).
        unsafe { sys::llama_sampler_free(self.chain.as_ptr()) }
    }
}
