//! The product's only door to llama.cpp: owning wrappers around its
//! handles (models, contexts, mtmd, the quantiser, ggml's backends and type
//! traits) that the worker, the corpus stage and the coordinator call, so
//! that one crate links `llama-cpp-sys-2` and all the product's unsafe code
//! lives here, each block with its SAFETY comment (the other crates forbid
//! unsafe code). It may depend on the GGUF format and the protocol's limits
//! only; nothing of the run's files or the network.
//!
//! - [`Model`]: a loaded GGUF model (`llama_model`), freed on drop.
//! - [`Context`]: an inference context whose eval callback forwards every
//!   graph node to a [`GraphObserver`]; freed on drop.
//! - [`TensorRef`]: a borrowed graph tensor with strides and host-side bytes.
//! - [`Reducer`]: reductions of graph tensors on their own backend, so only
//!   results are copied to the host.
//! - [`quantize_model`]: llama.cpp's quantiser, with an importance matrix.
//! - [`GgmlCodec`]: ggml's type traits decoding and re-encoding merged
//!   experts for the slicer.
//! - [`LogitsCompare`]: base and candidate logits compared on the backend
//!   that holds them, so only per-position figures are copied to the host.
//! - [`Offload`]: where a model's weights live (`-ngl`, `--cpu-moe`).
//! - [`simd`]: the run-time CPU-feature dispatch of a host kernel, and
//!   [`yield_to_compute_threads`], the OS call that lowers a thread's
//!   priority beside ggml's.
//!
//! A context made with [`Logits::Backend`] never lets llama.cpp copy logits
//! to the host: a backend sampler that adds nothing to the graph is
//! attached to its sequence (llama.cpp then skips its own copy of the raw
//! logits), and its eval callback stops the graph at the output norm
//! (`result_norm`), before the output head, or right after the head
//! (`result_output`) once the caller has read the logits there.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod backend;
pub mod batched;
mod codec;
mod logits;
mod offload;
mod quantize;
mod reduce;
mod sampler;
pub mod simd;
mod tensor;
mod thread;
mod vision;
mod vocab;

pub use backend::ReduceError;
pub use codec::{to_f32, GgmlCodec};
pub use logits::{BaseFigures, CandidateFigures, CompareCost, LogitsCompare};
pub use offload::{ExpertsOnCpu, Offload};
pub use quantize::{quantize_model, MetaValue, QuantizeParams};
pub use reduce::{ChunkSquares, ExpertIds, Reducer, RouterGating, RouterQuery, RouterWeights};
pub use tensor::{as_f32s, f32_at, f32s, i32_at, ElemType, Op, TensorRef};
pub use thread::yield_to_compute_threads;
pub use vision::{media_marker, Bitmap, ImageEmbedding, Piece, Vision};
pub use vocab::apply_chat_template;

use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, c_void, CStr, CString};
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Once};

/// Failures of llama.cpp calls, each naming what was being done.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    /// The model file could not be loaded.
    #[error("llama.cpp could not load model {path} (missing, truncated or not a supported GGUF; run with RUST_LOG=debug for llama.cpp's log)")]
    ModelLoad {
        /// The file.
        path: String,
    },
    /// The model's vocabulary would abort llama.cpp's loader (checked in
    /// Rust first; the error names the model and the token).
    #[error(transparent)]
    Vocab(#[from] gguf::vocab_check::VocabError),
    /// Context creation failed.
    #[error("llama.cpp could not create a context (n_ctx {n_ctx}, n_ubatch {n_ubatch})")]
    ContextInit {
        /// Requested context size.
        n_ctx: u32,
        /// Requested micro-batch size.
        n_ubatch: u32,
    },
    /// `llama_decode` returned an error code.
    #[error("llama_decode failed with code {code} on {n_tokens} tokens at position {pos}")]
    Decode {
        /// llama.cpp's return code.
        code: i32,
        /// Tokens in the batch.
        n_tokens: usize,
        /// Position of the first token.
        pos: i32,
    },
    /// The eval callback panicked; the decode's results are void.
    #[error("the eval callback failed: {0}")]
    Callback(String),
    /// `llama_model_quantize` failed.
    #[error("llama.cpp could not quantise {input} into {output}: {reason} (run with RUST_LOG=debug for llama.cpp's log)")]
    Quantize {
        /// The model quantised.
        input: String,
        /// The file it was writing.
        output: String,
        /// What failed.
        reason: String,
    },
    /// An `mmproj` could not be loaded, or an image not encoded with it.
    #[error("mmproj {path}: {reason}")]
    Mmproj {
        /// The mmproj file.
        path: String,
        /// What failed.
        reason: String,
    },
    /// llama.cpp's built-in chat templates could not render a conversation.
    #[error("llama_chat_apply_template: {0}")]
    ChatTemplate(String),
}

/// Initialises llama.cpp once per process and routes its log to `tracing`.
pub fn init_backend() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: called exactly once before any other llama.cpp function;
        // the log callback is a plain function valid for the whole process.
        // mtmd's helper sets mtmd's own log too.
        unsafe {
            sys::llama_backend_init();
            sys::llama_log_set(Some(log_to_tracing), std::ptr::null_mut());
            sys::mtmd_helper_log_set(Some(log_to_tracing), std::ptr::null_mut());
        }
    });
}

unsafe extern "C" fn log_to_tracing(
    level: sys::ggml_log_level,
    text: *const c_char,
    _: *mut c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() {
        return;
    }
    // Continuation pieces (progress dots) carry their own level; only real
    // errors surface by default.
    if level == sys::GGML_LOG_LEVEL_ERROR {
        tracing::warn!(target: "llama.cpp", "{msg}");
    } else {
        tracing::debug!(target: "llama.cpp", "{msg}");
    }
}

/// A loaded model.
pub struct Model {
    ptr: NonNull<sys::llama_model>,
}

// SAFETY: a llama_model is immutable after loading and llama.cpp allows using
// it from any thread; the wrapper hands out no interior references.
unsafe impl Send for Model {}
// SAFETY: as above: every method reads immutable model data, and llama.cpp
// lets contexts on several threads share one model.
unsafe impl Sync for Model {}

impl Model {
    /// Loads a GGUF file placed as `offload` says (layers on the GPU,
    /// routed experts kept in host memory; no GPU on CPU builds).
    pub fn load(path: &Path, offload: &Offload) -> Result<Model, LlamaError> {
        // llama.cpp aborts the process on a repeated token string: refuse
        // such a vocabulary by name before it sees the file.
        gguf::vocab_check::check_file(path)?;
        init_backend();
        let err = || LlamaError::ModelLoad {
            path: path.display().to_string(),
        };
        let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| err())?;
        let patterns = offload.cpu_patterns();
        // SAFETY: the CPU buffer type is a static of ggml's CPU backend.
        let cpu = unsafe { sys::ggml_backend_cpu_buffer_type() };
        // The C array llama.cpp's loader walks until an entry with a null
        // pattern; each pattern sends the tensors it matches to host memory.
        let overrides: Vec<sys::llama_model_tensor_buft_override> = patterns
            .iter()
            .map(|p| sys::llama_model_tensor_buft_override {
                pattern: p.as_ptr(),
                buft: cpu,
            })
            .chain(std::iter::once(sys::llama_model_tensor_buft_override {
                pattern: std::ptr::null(),
                buft: std::ptr::null_mut(),
            }))
            .collect();
        // SAFETY: default params are plain data; the path, the patterns and
        // the override array that points at them (ended by a null pattern)
        // outlive the call, which reads them only while loading.
        let raw = unsafe {
            let mut params = sys::llama_model_default_params();
            params.n_gpu_layers = offload.n_gpu_layers.min(i32::MAX as u32) as i32;
            if !patterns.is_empty() {
                params.tensor_buft_overrides = overrides.as_ptr();
            }
            sys::llama_model_load_from_file(c_path.as_ptr(), params)
        };
        NonNull::new(raw).map(|ptr| Model { ptr }).ok_or_else(err)
    }

    /// A metadata string value (`general.architecture`, ...), if present.
    pub fn meta(&self, key: &str) -> Option<String> {
        let c_key = CString::new(key).ok()?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: the model is live, the key is NUL-terminated and the buffer
        // is writable for its full length.
        let n = unsafe {
            sys::llama_model_meta_val_str(
                self.ptr.as_ptr(),
                c_key.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return None;
        }
        buf.truncate((n as usize).min(buf.len() - 1));
        String::from_utf8(buf).ok()
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the model is live; its vocabulary lives as long as it does.
        unsafe { sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(self.ptr.as_ptr())) as usize }
    }

    /// Whether `token` ends generation (end of turn or of text).
    pub fn is_end_of_generation(&self, token: i32) -> bool {
        // SAFETY: the model is live; any token id is accepted.
        unsafe { sys::llama_vocab_is_eog(sys::llama_model_get_vocab(self.ptr.as_ptr()), token) }
    }

    /// Number of blocks a decode runs (NextN / MTP blocks excluded).
    pub fn n_layer(&self) -> u32 {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_n_layer(self.ptr.as_ptr()) as u32 }
    }

    /// Number of NextN / MTP blocks after the last layer (run only by an
    /// MTP draft context, never by a decode).
    pub fn n_layer_nextn(&self) -> u32 {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_n_layer_nextn(self.ptr.as_ptr()).max(0) as u32 }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the pointer came from llama_model_load_from_file and every
        // context borrowing the model has been dropped (lifetimes enforce it).
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// Receives the graph nodes of every decode.
pub trait GraphObserver {
    /// `ask` phase: whether this node's data is wanted.
    fn wants(&mut self, t: &TensorRef<'_>) -> bool;
    /// The node has been computed; read it.
    fn observe(&mut self, t: &TensorRef<'_>);
}

/// Where a context's logits go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Logits {
    /// llama.cpp computes the output head on every decode and copies every
    /// output row to the host ([`Context::batch_logits`]): plain inference,
    /// and the host comparison of logits.
    #[default]
    Host,
    /// They never leave the backend: [`Context::decode`] stops the graph
    /// before the output head; [`Context::decode_with_logits`] computes it
    /// and hands the logits tensor to the caller on its backend.
    Backend,
}

/// The node whose output the output head multiplies (llama.cpp's builders
/// name it so in every decoder architecture it has).
const OUTPUT_NORM: &str = "result_norm";
/// The output head's result: the logits `[n_vocab, n_outputs]`.
const OUTPUT_LOGITS: &str = "result_output";

/// A caller's reader of the logits tensor inside a decode.
type LogitsHook = dyn FnMut(&TensorRef<'_>);

/// What a decode computes past the last block.
enum Head {
    /// Everything llama.cpp builds (host logits).
    All,
    /// Nothing after the output norm.
    Skip,
    /// The output head, whose tensor goes to the hook; nothing after it.
    /// The pointer is valid for the decode that set it.
    Hand(NonNull<LogitsHook>),
}

/// Which tokens of a decode have outputs (logits rows). The last block
/// runs its feed-forward part on these tokens only.
#[derive(Clone, Copy, Debug)]
pub enum Outputs<'a> {
    /// Every token (collection needs the last block on all of them).
    All,
    /// The last token only.
    Last,
    /// The tokens flagged `true`, one flag per token.
    Rows(&'a [bool]),
}

/// What a micro-batch decodes: token ids, or rows of input embeddings
/// (an image's positions, from its [`ImageEmbedding`]).
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// Token ids.
    Tokens(&'a [i32]),
    /// Row-major rows of `.1` values each (the model's input embedding
    /// width).
    Embd(&'a [f32], usize),
}

impl Input<'_> {
    /// Positions it decodes (tokens or rows).
    pub fn positions(&self) -> usize {
        match self {
            Input::Tokens(t) => t.len(),
            Input::Embd(e, n_embd) => e.len() / n_embd,
        }
    }
}

/// Context settings that matter for reproducible measurements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextParams {
    /// Context size (one chunk).
    pub n_ctx: u32,
    /// Tokens per decode call and per micro-batch (they are equal here).
    pub n_ubatch: u32,
    /// CPU threads.
    pub threads: u32,
    /// f32 KV cache instead of f16 (exact oracle comparisons).
    pub f32_kv: bool,
    /// Flash attention on or off.
    pub flash_attn: bool,
    /// Where logits go.
    pub logits: Logits,
}

struct CallbackState<O> {
    observer: O,
    panic: Option<String>,
    /// Bytes read out of graph tensors through [`TensorRef::bytes`] and
    /// [`TensorRef::row_f32`].
    bytes_read: std::cell::Cell<u64>,
    /// What the current decode computes past the last block.
    head: Head,
    /// The current decode's graph has been stopped.
    stopped: bool,
    /// Decodes whose output head was computed.
    heads_computed: u64,
}

/// An inference context observing its graph through `O`.
pub struct Context<'m, O: GraphObserver> {
    ptr: NonNull<sys::llama_context>,
    /// CPU worker threads kept for the context's life. Without one, ggml
    /// starts and joins its threads for every graph computation, and every
    /// observed node splits the graph into one more computation.
    threadpool: Option<Arc<ThreadPool>>,
    state: *mut CallbackState<O>,
    batch: sys::llama_batch,
    batch_cap: usize,
    /// A batch of embeddings (`batch_cap` rows of `.1` values), made on
    /// the first [`Context::decode_input`] of embeddings.
    embd_batch: Option<(sys::llama_batch, usize)>,
    /// Output rows llama.cpp copied to the host in the last successful
    /// decode (every token's with [`Logits::Host`], none otherwise).
    n_outputs: usize,
    logits: Logits,
    /// The backend sampler of [`Logits::Backend`], freed after the context.
    _sampler: Option<sampler::NoSampler>,
    /// Tokens decoded successfully since the context was made.
    tokens_decoded: u64,
    n_vocab: usize,
    _model: PhantomData<&'m Model>,
    /// The model of an [`Context::owning`] context, released after it.
    _owner: Option<Arc<Model>>,
}

// SAFETY: the context is used by one thread at a time (all methods take
// &mut self); llama.cpp contexts may move between threads. O must be Send.
unsafe impl<O: GraphObserver + Send> Send for Context<'_, O> {}

unsafe extern "C" fn eval_callback<O: GraphObserver>(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user: *mut c_void,
) -> bool {
    // SAFETY: user data is the CallbackState<O> owned by the Context, alive
    // for the whole decode, and nothing else touches it during a decode.
    let state = unsafe { &mut *(user as *mut CallbackState<O>) };
    if state.panic.is_some() {
        return false;
    }
    if state.stopped {
        // A later split of a stopped graph: the scheduler computes the node
        // it asks about, then stops again; asking for every node keeps that
        // to one node per split.
        return ask;
    }
    // SAFETY: the scheduler passes a live tensor for the duration of this call.
    let Some(tensor) = (unsafe { TensorRef::from_raw(t, Some(&state.bytes_read)) }) else {
        return false;
    };
    let name = tensor.name();
    if ask && name == OUTPUT_LOGITS {
        state.heads_computed += 1;
    }
    let stop_here = match state.head {
        Head::All => false,
        Head::Skip => name == OUTPUT_NORM,
        Head::Hand(_) => name == OUTPUT_LOGITS,
    };
    if stop_here && ask {
        return true;
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if stop_here {
            if let Head::Hand(mut hook) = state.head {
                // SAFETY: the hook outlives the decode that set it (see
                // `Context::decode_with_logits`).
                unsafe { hook.as_mut()(&tensor) };
            }
            false
        } else if ask {
            state.observer.wants(&tensor)
        } else {
            state.observer.observe(&tensor);
            true
        }
    }));
    state.stopped = stop_here;
    match result {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            state.panic = Some(msg);
            false
        }
    }
}

/// A ggml CPU thread pool that several contexts may share: an evaluator
/// runs its models in turn on one set of threads, which stay warm, instead
/// of waking another context's pool for every decode. Its lock serialises
/// graph computations, so contexts sharing it may live on any threads.
pub struct ThreadPool {
    ptr: Mutex<PoolPtr>,
    /// The same pool, for graphs computed inside a decode of a context
    /// that holds the lock (the logits comparisons).
    raw: NonNull<sys::ggml_threadpool>,
}

// SAFETY: `raw` is only used while a context computing on the pool holds
// its lock (inside that context's decode); the rest is the mutex's.
unsafe impl Sync for ThreadPool {}
// SAFETY: as above.
unsafe impl Send for ThreadPool {}

struct PoolPtr(NonNull<sys::ggml_threadpool>);

// SAFETY: a ggml thread pool may be driven from any thread; the mutex lets
// one graph computation at a time use it.
unsafe impl Send for PoolPtr {}

impl ThreadPool {
    /// A pool of `threads` threads (the calling thread counts as one);
    /// `None` for one thread, where ggml needs no pool.
    pub fn new(threads: u32) -> Option<Arc<ThreadPool>> {
        if threads <= 1 {
            return None;
        }
        init_backend();
        // SAFETY: plain parameters; the pool is freed in PoolPtr's Drop.
        let ptr = unsafe {
            let mut tp = sys::ggml_threadpool_params_default(threads as i32);
            NonNull::new(sys::ggml_threadpool_new(&mut tp))
        }?;
        Some(Arc::new(ThreadPool {
            ptr: Mutex::new(PoolPtr(ptr)),
            raw: ptr,
        }))
    }
}

impl Drop for PoolPtr {
    fn drop(&mut self) {
        // SAFETY: the pool came from ggml_threadpool_new, and every context
        // it was attached to holds an Arc of it, so all are freed already.
        unsafe { sys::ggml_threadpool_free(self.0.as_ptr()) }
    }
}

impl<O: GraphObserver> Context<'static, O> {
    /// [`Context::with_pool`] holding its model, so it can be kept beside the
    /// model's other owners and reused for many runs: llama.cpp's buffers
    /// (KV cache, compute graph, output rows: four vocabulary-wide rows per
    /// token with a backend sampler) are then allocated once, not per lease.
    pub fn owning(
        model: Arc<Model>,
        p: &ContextParams,
        observer: O,
        pool: Option<Arc<ThreadPool>>,
    ) -> Result<Self, LlamaError> {
        // SAFETY: the reference lives as long as `_owner`, which the
        // context keeps and releases only after freeing itself (fields drop
        // after `Drop::drop`).
        let borrowed: &'static Model = unsafe { &*Arc::as_ptr(&model) };
        let mut ctx = Context::with_pool(borrowed, p, observer, pool)?;
        ctx._owner = Some(model);
        Ok(ctx)
    }
}

impl<'m, O: GraphObserver> Context<'m, O> {
    /// Creates a context on `model` whose eval callback feeds `observer`,
    /// with a thread pool of its own.
    pub fn new(model: &'m Model, p: &ContextParams, observer: O) -> Result<Self, LlamaError> {
        Self::with_pool(model, p, observer, ThreadPool::new(p.threads))
    }

    /// [`Context::new`] computing on `pool`, which other contexts may share
    /// (`None`: ggml's own threads, per computation).
    pub fn with_pool(
        model: &'m Model,
        p: &ContextParams,
        observer: O,
        pool: Option<Arc<ThreadPool>>,
    ) -> Result<Self, LlamaError> {
        let state = Box::into_raw(Box::new(CallbackState {
            observer,
            panic: None,
            bytes_read: std::cell::Cell::new(0),
            head: Head::All,
            stopped: false,
            heads_computed: 0,
        }));
        let sampler = (p.logits == Logits::Backend).then(sampler::NoSampler::new);
        let mut seq_samplers: Vec<sys::llama_sampler_seq_config> = sampler
            .iter()
            .map(|s| sys::llama_sampler_seq_config {
                seq_id: 0,
                sampler: s.as_ptr(),
            })
            .collect();
        // SAFETY: default params are plain data; the callback and its state
        // pointer stay valid until Drop frees the context before the state;
        // the sampler chain outlives the context (freed after it in Drop)
        // and the config array is only read during initialisation.
        let raw = unsafe {
            let mut c = sys::llama_context_default_params();
            c.n_ctx = p.n_ctx;
            c.n_batch = p.n_ubatch;
            c.n_ubatch = p.n_ubatch;
            c.n_seq_max = 1;
            c.n_threads = p.threads as i32;
            c.n_threads_batch = p.threads as i32;
            c.cb_eval = Some(eval_callback::<O>);
            c.cb_eval_user_data = state.cast();
            c.no_perf = true;
            if p.f32_kv {
                c.type_k = sys::GGML_TYPE_F32;
                c.type_v = sys::GGML_TYPE_F32;
            }
            if !p.flash_attn {
                c.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_DISABLED;
            }
            if !seq_samplers.is_empty() {
                c.samplers = seq_samplers.as_mut_ptr();
                c.n_samplers = seq_samplers.len();
                // Backend samplers default to one output per sequence; every
                // token of a micro-batch has one (0: up to n_batch).
                c.n_outputs_max_per_seq = 0;
            }
            sys::llama_init_from_model(model.ptr.as_ptr(), c)
        };
        let Some(ptr) = NonNull::new(raw) else {
            // SAFETY: the state was never handed to a live context.
            drop(unsafe { Box::from_raw(state) });
            return Err(LlamaError::ContextInit {
                n_ctx: p.n_ctx,
                n_ubatch: p.n_ubatch,
            });
        };
        if let Some(pool) = &pool {
            let raw = pool.ptr.lock().unwrap_or_else(|e| e.into_inner()).0;
            // SAFETY: both are live; the context holds an Arc of the pool,
            // which is freed only after the context.
            unsafe { sys::llama_attach_threadpool(ptr.as_ptr(), raw.as_ptr(), raw.as_ptr()) };
        }
        let cap = p.n_ubatch as usize;
        // SAFETY: allocates a token batch of `cap` entries for one sequence.
        let batch = unsafe { sys::llama_batch_init(cap as i32, 0, 1) };
        Ok(Context {
            ptr,
            threadpool: pool,
            state,
            batch,
            batch_cap: cap,
            embd_batch: None,
            n_outputs: 0,
            logits: p.logits,
            _sampler: sampler,
            tokens_decoded: 0,
            n_vocab: model.n_vocab(),
            _model: PhantomData,
            _owner: None,
        })
    }

    /// The observer, between decodes.
    pub fn observer(&mut self) -> &mut O {
        // SAFETY: no decode is running (we hold &mut self), so the callback
        // cannot alias the state.
        unsafe { &mut (*self.state).observer }
    }

    /// Bytes that crossed from the backend to the host since the context
    /// was made: the observer's and logits readers' reads of graph tensors
    /// ([`TensorRef::bytes`], [`TensorRef::row_f32`]; copied from device
    /// buffers, read in place from host buffers, where a GPU would copy),
    /// plus llama.cpp's own copies of logits (n_vocab x 4 bytes per output
    /// row with [`Logits::Host`]; none with [`Logits::Backend`]).
    pub fn bytes_read(&self) -> u64 {
        // SAFETY: no decode is running while we hold &self, so the callback
        // does not touch the state.
        unsafe { (*self.state).bytes_read.get() }
    }

    /// Decodes in which the output head was computed since the context was
    /// made (none in collection, with [`Logits::Backend`], on every
    /// architecture whose graph names its output norm `result_norm`).
    pub fn heads_computed(&self) -> u64 {
        // SAFETY: as in `bytes_read`.
        unsafe { (*self.state).heads_computed }
    }

    /// Tokens decoded successfully since the context was made.
    pub fn tokens_decoded(&self) -> u64 {
        self.tokens_decoded
    }

    /// Empties the KV cache so the next chunk starts alone in its sequence.
    pub fn clear(&mut self) {
        // SAFETY: the context is live.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) }
    }

    /// Puts the thread pool's threads to sleep until the next graph
    /// computation wakes them. Left alone, ggml's threads spin for work for
    /// a long while (polling level 50: millions of rounds) after each one,
    /// taking a core from whatever runs between decodes: another context's
    /// decode (an evaluator runs one per model), the comparison of logits,
    /// collection's folding.
    fn rest_threads(pool: Option<&PoolPtr>) {
        if let Some(pool) = pool {
            // SAFETY: the pool is live (this context holds it) and no graph
            // computation is running on it (we hold its lock); the next one
            // resumes it.
            unsafe { sys::ggml_threadpool_pause(pool.0.as_ptr()) };
        }
    }

    /// Decodes `tokens` at positions `pos0..` of sequence 0 as one
    /// micro-batch, with outputs on every token (so the last block runs on
    /// all of them); the context's threads sleep again when it returns.
    /// With [`Logits::Host`] llama.cpp computes the logits and copies them
    /// ([`Context::batch_logits`]); with [`Logits::Backend`] the graph stops
    /// at the output norm: the output head is neither computed nor copied.
    pub fn decode(&mut self, tokens: &[i32], pos0: i32) -> Result<(), LlamaError> {
        self.decode_input(Input::Tokens(tokens), pos0)
    }

    /// [`Context::decode`] with an output on the last token only, so
    /// llama.cpp runs the last block and the output head on that token
    /// alone (what a generation step computes; benchmarks compare it with
    /// outputs on every token to measure the head's share).
    pub fn decode_last_output(&mut self, tokens: &[i32], pos0: i32) -> Result<(), LlamaError> {
        let head = match self.logits {
            Logits::Host => Head::All,
            Logits::Backend => Head::Skip,
        };
        self.decode_as(Input::Tokens(tokens), pos0, head, Outputs::Last)
    }

    /// Decodes `tokens` like [`Context::decode`], with outputs on the tokens
    /// `outputs` names, the output head computed and its logits tensor
    /// `[n_vocab, n_outputs]` (rows in token order) handed to `read` on its
    /// backend, inside the decode; nothing after the head is computed. Only
    /// for [`Logits::Backend`] contexts, whose logits llama.cpp never
    /// copies. With outputs on some tokens only, llama.cpp runs the last
    /// block's feed-forward part and the head on those alone.
    pub fn decode_with_logits(
        &mut self,
        input: Input<'_>,
        pos0: i32,
        outputs: Outputs<'_>,
        read: &mut dyn FnMut(&TensorRef<'_>),
    ) -> Result<(), LlamaError> {
        assert_eq!(
            self.logits,
            Logits::Backend,
            "logits are read on the backend only in a Logits::Backend context"
        );
        let hook: NonNull<dyn FnMut(&TensorRef<'_>) + '_> = NonNull::from(read);
        // SAFETY: only the lifetime is erased; the pointer is cleared
        // (`decode_as` resets the head) before this function returns, so it
        // is never used after `read`'s borrow ends.
        let hook: NonNull<LogitsHook> = unsafe { std::mem::transmute(hook) };
        self.decode_as(input, pos0, Head::Hand(hook), outputs)
    }

    /// The greedy next token after `tokens`: the argmax (the first of equal
    /// maxima) of the last logits row, taken on the host. With
    /// [`Logits::Backend`], [`Context::decode_with_logits`] reads only that
    /// row (n_vocab x 4 bytes, counted in [`Context::bytes_read`]).
    pub fn decode_greedy(&mut self, tokens: &[i32], pos0: i32) -> Result<i32, LlamaError> {
        let mut row = Vec::new();
        if self.logits == Logits::Host {
            self.decode(tokens, pos0)?;
            let all = self.batch_logits();
            row = all[all.len() - self.n_vocab..].to_vec();
        } else {
            self.decode_with_logits(Input::Tokens(tokens), pos0, Outputs::All, &mut |t| {
                row = t.row_f32(t.ne()[1].saturating_sub(1));
            })?;
        }
        let mut best = 0;
        for (i, v) in row.iter().enumerate() {
            if *v > row[best] {
                best = i;
            }
        }
        Ok(best as i32)
    }

    /// [`Context::decode`] of `input`: tokens, or rows (at most `n_ubatch`)
    /// of input embeddings at positions `pos0..` (what an image's positions
    /// decode, from its [`ImageEmbedding`]). Outputs and head as
    /// [`Context::decode`].
    pub fn decode_input(&mut self, input: Input<'_>, pos0: i32) -> Result<(), LlamaError> {
        let head = match self.logits {
            Logits::Host => Head::All,
            Logits::Backend => Head::Skip,
        };
        self.decode_as(input, pos0, head, Outputs::All)
    }

    fn decode_as(
        &mut self,
        input: Input<'_>,
        pos0: i32,
        head: Head,
        outputs: Outputs<'_>,
    ) -> Result<(), LlamaError> {
        if let Input::Embd(embd, n_embd) = input {
            assert!(
                n_embd > 0 && embd.len().is_multiple_of(n_embd),
                "whole rows of n_embd values"
            );
        }
        let n = input.positions();
        assert!(n <= self.batch_cap, "batch larger than n_ubatch");
        if let Outputs::Rows(rows) = outputs {
            assert_eq!(rows.len(), n, "one output flag per token");
        }
        let output = |i: usize| match outputs {
            Outputs::All => true,
            Outputs::Last => i + 1 == n,
            Outputs::Rows(rows) => rows[i],
        };
        let batch = match input {
            Input::Tokens(tokens) => {
                // SAFETY: the token batch holds batch_cap >= n entries.
                unsafe { std::ptr::copy_nonoverlapping(tokens.as_ptr(), self.batch.token, n) };
                &mut self.batch
            }
            Input::Embd(embd, n_embd) => {
                let cap = self.batch_cap;
                let (b, width) = self.embd_batch.get_or_insert_with(|| {
                    // SAFETY: allocates an embedding batch of `cap` rows of
                    // `n_embd` values for one sequence (freed in Drop).
                    (
                        unsafe { sys::llama_batch_init(cap as i32, n_embd as i32, 1) },
                        n_embd,
                    )
                });
                assert_eq!(*width, n_embd, "one embedding width per context");
                // SAFETY: the embedding batch holds cap >= n rows of n_embd.
                unsafe { std::ptr::copy_nonoverlapping(embd.as_ptr(), b.embd, embd.len()) };
                b
            }
        };
        // SAFETY: the batch was allocated for batch_cap entries with one
        // sequence id each; we fill n <= batch_cap entries.
        unsafe {
            batch.n_tokens = n as i32;
            for i in 0..n {
                *batch.pos.add(i) = pos0 + i as i32;
                *batch.n_seq_id.add(i) = 1;
                *(*batch.seq_id.add(i)) = 0;
                *batch.logits.add(i) = i8::from(output(i));
            }
        }
        let batch = *batch;
        let pool = self
            .threadpool
            .as_ref()
            .map(|p| p.ptr.lock().unwrap_or_else(|e| e.into_inner()));
        // SAFETY: no decode is running (we hold &mut self).
        unsafe {
            (*self.state).head = head;
            (*self.state).stopped = false;
        }
        // SAFETY: context and batch are live; the callback state is valid;
        // no other context computes on the pool (we hold its lock).
        let code = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch) };
        Self::rest_threads(pool.as_deref());
        drop(pool);
        // SAFETY: the decode has returned; nothing else references the
        // state; the hook pointer dies here.
        let panic = unsafe {
            (*self.state).head = Head::All;
            (*self.state).panic.take()
        };
        self.n_outputs = 0;
        if let Some(msg) = panic {
            return Err(LlamaError::Callback(msg));
        }
        if code != 0 {
            return Err(LlamaError::Decode {
                code,
                n_tokens: n,
                pos: pos0,
            });
        }
        if self.logits == Logits::Host {
            self.n_outputs = (0..n).filter(|&i| output(i)).count();
            let copied = (self.n_outputs * self.n_vocab * 4) as u64;
            // SAFETY: as above.
            let read = unsafe { &(*self.state).bytes_read };
            read.set(read.get() + copied);
        }
        self.tokens_decoded += n as u64;
        Ok(())
    }
}

impl<O: GraphObserver> Context<'_, O> {
    /// The logits of the last decode: one row of `n_vocab` values per
    /// output, in batch order (every token's, or the last token's after
    /// [`Context::decode_last_output`]); empty before a decode and in a
    /// [`Logits::Backend`] context.
    pub fn batch_logits(&self) -> &[f32] {
        if self.n_outputs == 0 {
            return &[];
        }
        // SAFETY: after a successful decode of a Logits::Host context,
        // llama.cpp holds n_outputs x n_vocab logits in batch order; the
        // borrow of self ends before the next decode (which takes &mut self).
        unsafe {
            let p = sys::llama_get_logits(self.ptr.as_ptr());
            assert!(!p.is_null(), "no logits after a decode with outputs");
            std::slice::from_raw_parts(p, self.n_outputs * self.n_vocab)
        }
    }

    /// Vocabulary size of the context's model (the length of a logits row).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
}

/// An observer that wants no graph node: plain inference (evaluation).
pub struct NoGraph;

impl GraphObserver for NoGraph {
    fn wants(&mut self, _: &TensorRef<'_>) -> bool {
        false
    }

    fn observe(&mut self, _: &TensorRef<'_>) {}
}

impl<O: GraphObserver> Drop for Context<'_, O> {
    fn drop(&mut self) {
        // SAFETY: batch and context were created in `new`; the context is
        // freed before the callback state it points to, before its sampler
        // and before its thread pool (fields, dropped after this).
        unsafe {
            sys::llama_batch_free(self.batch);
            if let Some((b, _)) = self.embd_batch {
                sys::llama_batch_free(b);
            }
            sys::llama_free(self.ptr.as_ptr());
            drop(Box::from_raw(self.state));
        }
    }
}

/// Whether this build has a GPU backend device.
pub fn has_gpu() -> bool {
    init_backend();
    // SAFETY: device enumeration returns static registry entries.
    unsafe {
        (0..sys::ggml_backend_dev_count()).any(|i| {
            sys::ggml_backend_dev_type(sys::ggml_backend_dev_get(i))
                == sys::GGML_BACKEND_DEVICE_TYPE_GPU
        })
    }
}

/// Free memory of this build's GPU devices together, in bytes; `None`
/// without a GPU.
pub fn gpu_free_memory() -> Option<u64> {
    init_backend();
    let mut total = None;
    // SAFETY: device enumeration returns static registry entries; the
    // memory query writes two integers.
    unsafe {
        for i in 0..sys::ggml_backend_dev_count() {
            let dev = sys::ggml_backend_dev_get(i);
            if sys::ggml_backend_dev_type(dev) == sys::GGML_BACKEND_DEVICE_TYPE_GPU {
                let (mut free, mut all) = (0usize, 0usize);
                sys::ggml_backend_dev_memory(dev, &mut free, &mut all);
                total = Some(total.unwrap_or(0) + free as u64);
            }
        }
    }
    total
}

/// Describes the compute backends of this build (`cpu` or GPU names) and,
/// with a GPU, where `offload` places the weights (layers and experts
/// computed on the GPU or the CPU round differently), so partials record
/// where their numbers came from.
pub fn backend_description(offload: &Offload) -> String {
    init_backend();
    let mut gpus = Vec::new();
    // SAFETY: device enumeration returns static registry entries.
    unsafe {
        for i in 0..sys::ggml_backend_dev_count() {
            let dev = sys::ggml_backend_dev_get(i);
            if sys::ggml_backend_dev_type(dev) == sys::GGML_BACKEND_DEVICE_TYPE_GPU {
                let desc = CStr::from_ptr(sys::ggml_backend_dev_description(dev)).to_string_lossy();
                gpus.push(desc.into_owned());
            }
        }
    }
    if gpus.is_empty() {
        // SAFETY: a plain feature query.
        let avx2 = unsafe { sys::ggml_cpu_has_avx2() } != 0;
        format!("cpu (avx2 {})", if avx2 { "on" } else { "off" })
    } else {
        format!("gpu ({}){}", gpus.join(", "), offload.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(logits: Logits) -> ContextParams {
        ContextParams {
            n_ctx: 64,
            n_ubatch: 16,
            threads: 1,
            f32_kv: true,
            flash_attn: false,
            logits,
        }
    }

    /// llama.cpp's host logits buffer: zeroed when allocated, written only
    /// by its own copy of the raw logits.
    fn host_buffer(ctx: &Context<'_, NoGraph>, n_tokens: usize) -> Vec<f32> {
        // SAFETY: after a successful decode of n_tokens outputs llama.cpp's
        // output buffer holds at least n_tokens x n_vocab floats.
        unsafe {
            let p = sys::llama_get_logits(ctx.ptr.as_ptr());
            assert!(!p.is_null());
            std::slice::from_raw_parts(p, n_tokens * ctx.n_vocab).to_vec()
        }
    }

    #[test]
    fn a_backend_context_never_lets_llama_cpp_copy_logits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        synth::write_model(synth::Preset::Tiny, 3, &path).unwrap();
        let model = Model::load(&path, &Offload::default()).unwrap();
        let tokens: Vec<i32> = (0..16).map(|i| (i * 37) % 500).collect();

        let mut host = Context::new(&model, &params(Logits::Host), NoGraph).unwrap();
        host.decode(&tokens, 0).unwrap();
        let expected = host.batch_logits().to_vec();
        assert_eq!(expected.len(), 16 * model.n_vocab());
        assert!(expected.iter().any(|&v| v != 0.0));
        assert_eq!(host.heads_computed(), 1);
        assert_eq!(host.bytes_read(), (expected.len() * 4) as u64);

        let mut dev = Context::new(&model, &params(Logits::Backend), NoGraph).unwrap();
        dev.decode(&tokens, 0).unwrap();
        assert!(dev.batch_logits().is_empty());
        assert_eq!(dev.heads_computed(), 0, "the output head ran");
        assert_eq!(dev.bytes_read(), 0);
        assert!(
            host_buffer(&dev, 16).iter().all(|&v| v == 0.0),
            "llama.cpp copied logits"
        );

        // Computed and read on the backend: the same values, row by row,
        // and still nothing in llama.cpp's host buffer.
        dev.clear();
        let mut seen = Vec::new();
        dev.decode_with_logits(Input::Tokens(&tokens), 0, Outputs::All, &mut |t| {
            assert_eq!(t.ne()[..2], [model.n_vocab(), 16]);
            seen = (0..16).flat_map(|r| t.row_f32(r)).collect();
        })
        .unwrap();
        assert_eq!(seen, expected);
        assert_eq!(dev.heads_computed(), 1);
        assert_eq!(dev.bytes_read(), (expected.len() * 4) as u64);
        assert!(
            host_buffer(&dev, 16).iter().all(|&v| v == 0.0),
            "llama.cpp copied logits"
        );

        // The greedy next token reads one row and agrees with the host's.
        let last = &expected[15 * model.n_vocab()..];
        let mut best = 0;
        for (i, v) in last.iter().enumerate() {
            if *v > last[best] {
                best = i;
            }
        }
        dev.clear();
        assert_eq!(dev.decode_greedy(&tokens, 0).unwrap(), best as i32);
        host.clear();
        assert_eq!(host.decode_greedy(&tokens, 0).unwrap(), best as i32);
    }
}
