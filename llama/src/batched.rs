//! A context that decodes many sequences at once, as llama.cpp's batched
//! examples do: one `llama_decode` carries tokens of every sequence (each
//! token with its own position and sequence id), and the logits of the
//! tokens that asked for them are read back by batch index. Each sequence
//! has its own part of the KV cache (`kv_unified` off), so a sequence sees
//! only its own tokens.

use super::{LlamaError, Model};
use llama_cpp_sys_2 as sys;
use std::ptr::NonNull;

/// One token of a batched decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The token id.
    pub token: i32,
    /// Its position in its sequence.
    pub pos: i32,
    /// Its sequence.
    pub seq: i32,
    /// Whether its next-token logits are wanted.
    pub logits: bool,
}

/// A context of `n_seq` sequences of up to `n_ctx_seq` positions each.
pub struct BatchedContext<'m> {
    ptr: NonNull<sys::llama_context>,
    batch: sys::llama_batch,
    cap: usize,
    n_vocab: usize,
    _model: std::marker::PhantomData<&'m Model>,
}

// SAFETY: used by one thread at a time (every method takes &mut self);
// llama.cpp contexts may move between threads.
unsafe impl Send for BatchedContext<'_> {}

impl<'m> BatchedContext<'m> {
    /// A context for `n_seq` sequences of `n_ctx_seq` positions, decoding
    /// at most `n_batch` tokens per call on `threads` CPU threads.
    pub fn new(
        model: &'m Model,
        n_seq: u32,
        n_ctx_seq: u32,
        n_batch: u32,
        threads: u32,
    ) -> Result<Self, LlamaError> {
        let n_ctx = n_seq.saturating_mul(n_ctx_seq);
        // SAFETY: default params are plain data; the model is live.
        let raw = unsafe {
            let mut c = sys::llama_context_default_params();
            c.n_ctx = n_ctx;
            c.n_batch = n_batch;
            c.n_ubatch = n_batch;
            c.n_seq_max = n_seq;
            c.kv_unified = false;
            c.n_threads = threads as i32;
            c.n_threads_batch = threads as i32;
            c.no_perf = true;
            sys::llama_init_from_model(model.ptr.as_ptr(), c)
        };
        let ptr = NonNull::new(raw).ok_or(LlamaError::ContextInit {
            n_ctx,
            n_ubatch: n_batch,
        })?;
        // SAFETY: a token batch of n_batch entries, one sequence id each.
        let batch = unsafe { sys::llama_batch_init(n_batch as i32, 0, 1) };
        Ok(BatchedContext {
            ptr,
            batch,
            cap: n_batch as usize,
            n_vocab: model.n_vocab(),
            _model: std::marker::PhantomData,
        })
    }

    /// Tokens one decode may carry.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Empties every sequence's KV cache.
    pub fn clear(&mut self) {
        // SAFETY: the context is live.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) }
    }

    /// Decodes `entries` (at most [`BatchedContext::capacity`]) in one
    /// call and hands `read` the logits row of every entry that asked for
    /// one, with its index in `entries`.
    pub fn decode(
        &mut self,
        entries: &[Entry],
        read: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), LlamaError> {
        let n = entries.len();
        assert!(n <= self.cap, "batch larger than its capacity");
        // SAFETY: the batch holds cap >= n entries with one sequence id each.
        unsafe {
            self.batch.n_tokens = n as i32;
            for (i, e) in entries.iter().enumerate() {
                *self.batch.token.add(i) = e.token;
                *self.batch.pos.add(i) = e.pos;
                *self.batch.n_seq_id.add(i) = 1;
                *(*self.batch.seq_id.add(i)) = e.seq;
                *self.batch.logits.add(i) = i8::from(e.logits);
            }
        }
        // SAFETY: context and batch are live.
        let code = unsafe { sys::llama_decode(self.ptr.as_ptr(), self.batch) };
        if code != 0 {
            return Err(LlamaError::Decode {
                code,
                n_tokens: n,
                pos: entries.first().map_or(0, |e| e.pos),
            });
        }
        for i in (0..n).filter(|&i| entries[i].logits) {
            // SAFETY: entry i asked for logits in the decode that just
            // succeeded, so llama.cpp holds its row of n_vocab values until
            // the next decode (which needs &mut self).
            let row = unsafe {
                let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i as i32);
                assert!(!p.is_null(), "no logits for a token that asked for them");
                std::slice::from_raw_parts(p, self.n_vocab)
            };
            read(i, row);
        }
        Ok(())
    }
}

impl Drop for BatchedContext<'_> {
    fn drop(&mut self) {
        // SAFETY: batch and context were made in `new` and are freed once.
        unsafe {
            sys::llama_batch_free(self.batch);
            sys::llama_free(self.ptr.as_ptr());
        }
    }
}
