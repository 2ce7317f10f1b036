//! An image encoder beside a loaded text model: the model's `mmproj` through
//! llama.cpp's mtmd. The one mtmd wrapper of the product: the corpus stage
//! tokenizes a record's text with its images through it ([`Vision::tokenize`],
//! beside a vocabulary-only model) and a worker encodes an image into the
//! embeddings the text model decodes at the image's positions
//! ([`Vision::encode`]), so both take an image's positions from the same
//! mtmd tokenization.

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

/// mtmd's media marker (`<__media__>`): the text that stands for an image
/// in a prompt [`Vision::tokenize`] reads.
pub fn media_marker() -> &'static str {
    // SAFETY: mtmd returns a static NUL-terminated string.
    let marker = unsafe { std::ffi::CStr::from_ptr(sys::mtmd_default_marker()) };
    marker.to_str().expect("mtmd's marker is ASCII")
}

/// One piece of a tokenized prompt, in order: text tokens, or an image's
/// (or audio's) positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Token ids of a run of text.
    Text(Vec<i32>),
    /// An image taking this many positions.
    Image(usize),
    /// Audio taking this many positions.
    Audio(usize),
}

// SAFETY: mtmd contexts carry no thread affinity; encoding, which writes the
// context's output, takes &mut self.
unsafe impl Send for Vision {}
// SAFETY: the &self methods only tokenize (mtmd_tokenize reads the context
// and writes only the chunk list it is given: safe from several threads, as
// llama-cpp-2's MtmdContext also relies on) or decode bitmaps (mtmd copies
// the bytes into a new bitmap).
unsafe impl Sync for Vision {}

impl Vision {
    /// [`Vision::load`], refusing also projectors whose images need M-RoPE
    /// positions, which workers do not feed yet.
    pub fn load_for_decoding(
        mmproj: &Path,
        model: &Model,
        threads: u32,
    ) -> Result<Vision, LlamaError> {
        let vision = Vision::load(mmproj, model, threads)?;
        // SAFETY: the context is live.
        if unsafe { sys::mtmd_decode_use_mrope(vision.ptr.as_ptr()) } {
            return Err(LlamaError::Mmproj {
                path: vision.path.clone(),
                reason: "its images take M-RoPE positions (Qwen-VL style), which workers do not \
                         feed yet"
                    .into(),
            });
        }
        Ok(vision)
    }

    /// Loads `mmproj` beside `model` (a full or a vocabulary-only load) on
    /// the CPU with `threads` threads; its media marker is mtmd's default
    /// (`<__media__>`). Refused: an mmproj without a vision encoder.
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
        if !unsafe { sys::mtmd_support_vision(vision.ptr.as_ptr()) } {
            return Err(refused("it has no vision encoder"));
        }
        Ok(vision)
    }

    /// Decodes one image file's bytes (PNG, JPEG: mtmd's own decoder);
    /// `None` when mtmd cannot.
    pub fn bitmap(&self, bytes: &[u8]) -> Option<Bitmap> {
        Bitmap::decode(self, bytes)
    }

    /// Tokenizes `text`, whose media markers stand for `images` in order,
    /// as mtmd does for the model: `add_special` adds BOS/EOS as the
    /// model's metadata says, `parse_special` reads special-token text.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        images: &[&Bitmap],
    ) -> Result<Vec<Piece>, LlamaError> {
        let failed = |reason: String| LlamaError::Mmproj {
            path: self.path.clone(),
            reason,
        };
        let text = CString::new(text)
            .map_err(|_| failed("the text holds a NUL byte, which mtmd cannot take".into()))?;
        let chunks = Chunks::tokenize(self, &text, add_special, parse_special, images)
            .map_err(|code| failed(format!("mtmd_tokenize failed with code {code}")))?;
        Ok(chunks.pieces())
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
        let marker = CString::new(media_marker()).expect("no NUL in the marker");
        let chunks = Chunks::tokenize(self, &marker, false, true, &[&bitmap]).map_err(|code| {
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

/// A decoded image ([`Vision::bitmap`]), freed on drop.
pub struct Bitmap(NonNull<sys::mtmd_bitmap>);

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
    /// Tokenizes `text` with `bitmaps` (one per media marker): the pieces
    /// of text and of each image. The media marker alone with one bitmap
    /// gives the image's pieces and whatever text the projector wraps them
    /// in.
    fn tokenize(
        vision: &Vision,
        text: &std::ffi::CStr,
        add_special: bool,
        parse_special: bool,
        bitmaps: &[&Bitmap],
    ) -> Result<Chunks, i32> {
        // SAFETY: the text, the bitmaps and the output are live for the
        // call; the output is freed on drop.
        unsafe {
            let out = NonNull::new(sys::mtmd_input_chunks_init()).ok_or(-1)?;
            let chunks = Chunks(out);
            let text = sys::mtmd_input_text {
                text: text.as_ptr(),
                text_len: text.to_bytes().len(),
                add_special,
                parse_special,
            };
            let bitmaps: Vec<*const sys::mtmd_bitmap> =
                bitmaps.iter().map(|b| b.0.as_ptr().cast_const()).collect();
            let code = sys::mtmd_tokenize(
                vision.ptr.as_ptr(),
                out.as_ptr(),
                &text,
                bitmaps.as_ptr().cast_mut(),
                bitmaps.len(),
            );
            match code {
                0 => Ok(chunks),
                c => Err(c),
            }
        }
    }

    /// Every piece in order: text tokens, or the positions of an image or
    /// audio.
    fn pieces(&self) -> Vec<Piece> {
        // SAFETY: the list is live; its chunks, and the token ids a text
        // chunk holds, live as long as it does and are copied here.
        unsafe {
            let n = sys::mtmd_input_chunks_size(self.0.as_ptr());
            (0..n)
                .filter_map(|i| {
                    NonNull::new(sys::mtmd_input_chunks_get(self.0.as_ptr(), i) as *mut _)
                })
                .map(|c: NonNull<sys::mtmd_input_chunk>| {
                    let c = c.as_ptr();
                    match sys::mtmd_input_chunk_get_type(c) {
                        sys::MTMD_INPUT_CHUNK_TYPE_TEXT => {
                            let mut len = 0usize;
                            let p = sys::mtmd_input_chunk_get_tokens_text(c, &mut len);
                            Piece::Text(match p.is_null() {
                                true => Vec::new(),
                                false => std::slice::from_raw_parts(p, len).to_vec(),
                            })
                        }
                        sys::MTMD_INPUT_CHUNK_TYPE_IMAGE => {
                            Piece::Image(sys::mtmd_input_chunk_get_n_tokens(c))
                        }
                        _ => Piece::Audio(sys::mtmd_input_chunk_get_n_tokens(c)),
                    }
                })
                .collect()
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
