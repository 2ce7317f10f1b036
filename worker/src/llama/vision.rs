//! An image encoder beside a loaded text model: the model's `mmproj` through
//! llama.cpp's mtmd, turning an image file's bytes into the embeddings the
//! text model decodes at the image's positions.

use super::{init_backend, LlamaError, Model};
use llama_cpp_sys_2 as sys;
use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

/// The embeddings of one image: `n_tokens` rows of `n_embd` values, one row
/// per position the image takes in the text model.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageEmbedding {
    /// Positions (rows).
    pub n_tokens: usize,
    /// Row width: the text model's input embedding width.
    pub n_embd: usize,
    /// Row-major values, `n_tokens * n_embd`.
    pub values: Vec<f32>,
}

/// An mtmd context: the vision encoder and projector of an `mmproj` GGUF,
/// loaded beside the text model it feeds.
pub struct Vision {
    ptr: NonNull<sys::mtmd_context>,
    n_embd: usize,
    path: String,
}

// SAFETY: the context is used by one thread at a time (encoding takes
// &mut self); mtmd contexts carry no thread affinity.
unsafe impl Send for Vision {}

impl Vision {
    /// Loads `mmproj` beside `model` on the CPU with `threads` threads.
    /// Refused: an mmproj without a vision encoder, and projectors whose
    /// images need M-RoPE positions, which workers do not feed yet.
    pub fn load(mmproj: &Path, model: &Model, threads: u32) -> Result<Vision, LlamaError> {
        init_backend();
        let path = mmproj.display().to_string();
        let refused = |reason: &str| LlamaError::Mmproj {
            path: path.clone(),
            reason: reason.to_string(),
        };
        let c_path = CString::new(path.as_bytes()).map_err(|_| refused("path holds a NUL"))?;
        // SAFETY: default params are plain data; the marker is a static C
        // string owned by mtmd; the model is live for this call and mtmd
        // keeps only a pointer to it, which `Collector` keeps alive longer
        // than the vision context (see its field order).
        let raw = unsafe {
            let mut p = sys::mtmd_context_params_default();
            p.use_gpu = false;
            p.print_timings = false;
            p.warmup = false;
            p.n_threads = threads.max(1) as i32;
            sys::mtmd_init_from_file(c_path.as_ptr(), model.ptr.as_ptr(), p)
        };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            refused("mtmd cannot load it beside the model (RUST_LOG=debug shows llama.cpp's log)")
        })?;
        let vision = Vision {
            ptr,
            // SAFETY: the model is live.
            n_embd: unsafe { sys::llama_model_n_embd_inp(model.ptr.as_ptr()) } as usize,
            path: path.clone(),
        };
        // SAFETY: the context is live.
        let (has_vision, mrope) = unsafe {
            (
                sys::mtmd_support_vision(vision.ptr.as_ptr()),
                sys::mtmd_decode_use_mrope(vision.ptr.as_ptr()),
            )
        };
        if !has_vision {
            return Err(refused("it has no vision encoder"));
        }
        if mrope {
            return Err(refused(
                "its images take M-RoPE positions (Qwen-VL style), which workers do not feed yet",
            ));
        }
        Ok(vision)
    }

    /// Encodes the image file `bytes` (PNG, JPEG: mtmd's own decoder) into
    /// the embeddings of its positions. Refused: bytes mtmd cannot decode,
    /// an image mtmd cuts into several pieces (tiling projectors), and
    /// images the text model must attend to non-causally.
    pub fn encode(&mut self, bytes: &[u8]) -> Result<ImageEmbedding, LlamaError> {
        let failed = |reason: String| LlamaError::Mmproj {
            path: self.path.clone(),
            reason,
        };
        let bitmap = Bitmap::decode(self, bytes)
            .ok_or_else(|| failed("mtmd cannot decode the image's bytes".into()))?;
        let chunks = Chunks::tokenize(self, &bitmap).map_err(|code| {
            failed(format!(
                "mtmd_tokenize failed with code {code} on the image"
            ))
        })?;
        let images = chunks.images();
        let [chunk] = images[..] else {
            return Err(failed(format!(
                "mtmd cuts one image into {} pieces (a tiling projector), which workers do not \
                 feed yet",
                images.len()
            )));
        };
        // SAFETY: the context and the chunk (owned by `chunks`) are live.
        let (non_causal, n_tokens, code) = unsafe {
            let ctx = self.ptr.as_ptr();
            (
                sys::mtmd_decode_use_non_causal(ctx, chunk.as_ptr()),
                sys::mtmd_input_chunk_get_n_tokens(chunk.as_ptr()),
                sys::mtmd_encode_chunk(ctx, chunk.as_ptr()),
            )
        };
        if non_causal {
            return Err(failed(
                "its images are attended to non-causally, which workers do not feed yet".into(),
            ));
        }
        if code != 0 {
            return Err(failed(format!("mtmd_encode_chunk failed with code {code}")));
        }
        let len = n_tokens * self.n_embd;
        // SAFETY: after a successful encode mtmd holds n_tokens x n_embd_inp
        // floats (mtmd.h, mtmd_get_output_embd), valid until the next encode,
        // which needs &mut self; they are copied before this returns.
        let values = unsafe {
            let p = sys::mtmd_get_output_embd(self.ptr.as_ptr());
            if p.is_null() {
                return Err(failed("mtmd returned no embeddings after encoding".into()));
            }
            std::slice::from_raw_parts(p, len).to_vec()
        };
        Ok(ImageEmbedding {
            n_tokens,
            n_embd: self.n_embd,
            values,
        })
    }
}

impl Drop for Vision {
    fn drop(&mut self) {
        // SAFETY: the context came from mtmd_init_from_file and is freed once.
        unsafe { sys::mtmd_free(self.ptr.as_ptr()) }
    }
}

/// A decoded image, freed on drop.
struct Bitmap(NonNull<sys::mtmd_bitmap>);

impl Bitmap {
    fn decode(vision: &Vision, bytes: &[u8]) -> Option<Bitmap> {
        // SAFETY: the context is live and `bytes` is valid for its length;
        // mtmd copies what it decodes. An image never opens a video context,
        // but one that came back is freed.
        let wrapper = unsafe {
            sys::mtmd_helper_bitmap_init_from_buf(
                vision.ptr.as_ptr(),
                bytes.as_ptr(),
                bytes.len(),
                false,
                sys::mtmd_helper_init_opt_default(),
            )
        };
        if !wrapper.video_ctx.is_null() {
            // SAFETY: as above.
            unsafe { sys::mtmd_helper_video_free(wrapper.video_ctx) };
        }
        NonNull::new(wrapper.bitmap).map(Bitmap)
    }
}

impl Drop for Bitmap {
    fn drop(&mut self) {
        // SAFETY: the bitmap came from mtmd and is freed once.
        unsafe { sys::mtmd_bitmap_free(self.0.as_ptr()) }
    }
}

/// mtmd's pieces of a prompt holding one image, freed on drop.
struct Chunks(NonNull<sys::mtmd_input_chunks>);

/// A piece of [`Chunks`], borrowed from it.
#[derive(Clone, Copy)]
struct ChunkPtr<'a>(
    NonNull<sys::mtmd_input_chunk>,
    std::marker::PhantomData<&'a Chunks>,
);

impl ChunkPtr<'_> {
    fn as_ptr(self) -> *const sys::mtmd_input_chunk {
        self.0.as_ptr()
    }
}

impl Chunks {
    /// Tokenizes the media marker alone with `bitmap`: the image's pieces,
    /// and whatever text the projector wraps them in.
    fn tokenize(vision: &Vision, bitmap: &Bitmap) -> Result<Chunks, i32> {
        // SAFETY: the marker is mtmd's static C string; the text, bitmap
        // and output are live for the call; the output is freed on drop.
        unsafe {
            let out = NonNull::new(sys::mtmd_input_chunks_init()).ok_or(-1)?;
            let chunks = Chunks(out);
            let marker = sys::mtmd_default_marker();
            let text = sys::mtmd_input_text {
                text: marker,
                text_len: std::ffi::CStr::from_ptr(marker).to_bytes().len(),
                add_special: false,
                parse_special: true,
            };
            let bitmaps = [bitmap.0.as_ptr() as *const sys::mtmd_bitmap];
            let code = sys::mtmd_tokenize(
                vision.ptr.as_ptr(),
                out.as_ptr(),
                &text,
                bitmaps.as_ptr(),
                1,
            );
            match code {
                0 => Ok(chunks),
                c => Err(c),
            }
        }
    }

    /// The image pieces, in order.
    fn images(&self) -> Vec<ChunkPtr<'_>> {
        // SAFETY: the list is live; its chunks live as long as it does.
        unsafe {
            let n = sys::mtmd_input_chunks_size(self.0.as_ptr());
            (0..n)
                .filter_map(|i| {
                    let c = sys::mtmd_input_chunks_get(self.0.as_ptr(), i) as *mut _;
                    NonNull::new(c)
                })
                .filter(|c| {
                    sys::mtmd_input_chunk_get_type(c.as_ptr()) == sys::MTMD_INPUT_CHUNK_TYPE_IMAGE
                })
                .map(|c| ChunkPtr(c, std::marker::PhantomData))
                .collect()
        }
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        // SAFETY: the list came from mtmd_input_chunks_init and is freed once.
        unsafe { sys::mtmd_input_chunks_free(self.0.as_ptr()) }
    }
}
