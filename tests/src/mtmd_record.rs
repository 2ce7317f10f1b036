//! One image record through mtmd's own C API, for the independent oracles
//! of image calibration and evaluation: a model and its mmproj loaded, the
//! record's prompt (one media marker) tokenized with its image, and the
//! pieces mtmd made of it. None of the worker's image code runs here.

use llama_cpp_sys_2 as sys;
use numbers::{ChunkId, Split};
use runfiles::corpus::{image_token, Chunk, ImageSpan, Span};
use std::ffi::{c_void, CString};
use std::path::Path;

/// Drops llama.cpp's and mtmd's log lines (the tests' output stays readable).
unsafe extern "C" fn quiet(_: sys::ggml_log_level, _: *const std::ffi::c_char, _: *mut c_void) {}

/// The bundled sample picture `configs/sample_images/images/red_square.png`:
/// its bytes and their SHA-256 (hex).
pub fn sample_image() -> (Vec<u8>, String) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/sample_images/images/red_square.png");
    let bytes = std::fs::read(path).unwrap();
    let sha = gguf::hash::sha256_hex(&bytes);
    (bytes, sha)
}

/// A piece of a record as mtmd tokenized it, in order.
pub enum Piece {
    /// Text token ids.
    Text(Vec<i32>),
    /// An image: its position count, and its embedding (`n_embd` values a
    /// position) when the pieces were asked with `encode`.
    Image {
        /// Positions mtmd gives the image.
        positions: usize,
        /// The mmproj's embedding rows, one per position.
        rows: Option<Vec<f32>>,
    },
}

/// The record `pieces` as chunk 0, one fit span of domain 0: mtmd's text
/// ids, and the marker ids of the image whose SHA-256 is `sha256` where
/// mtmd put it.
pub fn as_chunk(pieces: &[Piece], sha256: &str) -> Chunk {
    let mut tokens = Vec::new();
    let mut images = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(ids) => tokens.extend(ids),
            Piece::Image { positions, .. } => {
                images.push(ImageSpan {
                    start: tokens.len() as u32,
                    len: *positions as u32,
                    sha256: sha256.to_string(),
                });
                tokens.extend(std::iter::repeat_n(image_token(sha256), *positions));
            }
        }
    }
    Chunk {
        id: ChunkId(0),
        spans: vec![Span {
            start: 0,
            len: tokens.len() as u32,
            split: Split::Fit,
            domain: 0,
            doc: 0,
            group: 0,
        }],
        tokens,
        images,
    }
}

/// A model, its mmproj and one record tokenized by mtmd; every handle is
/// freed on drop.
pub struct MtmdRecord {
    model: *mut sys::llama_model,
    mtmd: *mut sys::mtmd_context,
    bitmap: *mut sys::mtmd_bitmap,
    chunks: *mut sys::mtmd_input_chunks,
}

impl MtmdRecord {
    /// Loads `model` and `mmproj` (CPU, 2 threads) and tokenizes `prompt`
    /// (one media marker) with `image`'s bytes. Panics on any failure: it
    /// is a test's oracle.
    pub fn load(model: &Path, mmproj: &Path, prompt: &str, image: &[u8]) -> MtmdRecord {
        let c_model = CString::new(model.to_str().unwrap()).unwrap();
        let c_mmproj = CString::new(mmproj.to_str().unwrap()).unwrap();
        let c_prompt = CString::new(prompt).unwrap();
        // SAFETY: plain llama.cpp / mtmd C calls; the strings and the image
        // outlive each call, and the handles made here are kept by the
        // record and freed in its `Drop`.
        unsafe {
            sys::llama_backend_init();
            sys::llama_log_set(Some(quiet), std::ptr::null_mut());
            sys::mtmd_helper_log_set(Some(quiet), std::ptr::null_mut());
            let m = sys::llama_model_load_from_file(
                c_model.as_ptr(),
                sys::llama_model_default_params(),
            );
            assert!(!m.is_null(), "the model loads");
            let mut mp = sys::mtmd_context_params_default();
            mp.use_gpu = false;
            mp.print_timings = false;
            mp.n_threads = 2;
            let mtmd = sys::mtmd_init_from_file(c_mmproj.as_ptr(), m, mp);
            assert!(!mtmd.is_null(), "mtmd loads the mmproj");
            let wrapper = sys::mtmd_helper_bitmap_init_from_buf(
                mtmd,
                image.as_ptr(),
                image.len(),
                false,
                sys::mtmd_helper_init_opt_default(),
            );
            assert!(!wrapper.bitmap.is_null(), "mtmd decodes the image");
            let chunks = sys::mtmd_input_chunks_init();
            let text = sys::mtmd_input_text {
                text: c_prompt.as_ptr(),
                text_len: prompt.len(),
                add_special: true,
                parse_special: true,
            };
            let bitmaps = [wrapper.bitmap as *const sys::mtmd_bitmap];
            assert_eq!(
                sys::mtmd_tokenize(mtmd, chunks, &text, bitmaps.as_ptr(), 1),
                0,
                "mtmd tokenizes the record"
            );
            MtmdRecord {
                model: m,
                mtmd,
                bitmap: wrapper.bitmap,
                chunks,
            }
        }
    }

    /// The loaded model, for contexts the caller makes (and frees before
    /// the record is dropped).
    pub fn model(&self) -> *mut sys::llama_model {
        self.model
    }

    /// The model's input embedding width.
    pub fn n_embd(&self) -> usize {
        // SAFETY: the model is live while the record is.
        unsafe { sys::llama_model_n_embd_inp(self.model) as usize }
    }

    /// The record's pieces in order; with `encode`, mtmd encodes each image
    /// and its embedding rows are copied out.
    pub fn pieces(&self, encode: bool) -> Vec<Piece> {
        let n_embd = self.n_embd();
        // SAFETY: the chunks are live while the record is; token and
        // embedding slices are copied before the next mtmd call.
        unsafe {
            (0..sys::mtmd_input_chunks_size(self.chunks))
                .map(|i| {
                    let c = sys::mtmd_input_chunks_get(self.chunks, i);
                    if sys::mtmd_input_chunk_get_type(c) == sys::MTMD_INPUT_CHUNK_TYPE_TEXT {
                        let mut n = 0usize;
                        let p = sys::mtmd_input_chunk_get_tokens_text(c, &mut n);
                        return Piece::Text(std::slice::from_raw_parts(p, n).to_vec());
                    }
                    let positions = sys::mtmd_input_chunk_get_n_tokens(c);
                    let rows = encode.then(|| {
                        assert_eq!(sys::mtmd_encode_chunk(self.mtmd, c), 0, "mtmd encodes");
                        let out = sys::mtmd_get_output_embd(self.mtmd);
                        std::slice::from_raw_parts(out, positions * n_embd).to_vec()
                    });
                    Piece::Image { positions, rows }
                })
                .collect()
        }
    }

    /// mtmd's own helper decodes the whole record on `ctx` (a context of
    /// [`MtmdRecord::model`]) in batches of `n_batch` positions from
    /// position 0, computing the last position's logits.
    ///
    /// # Safety
    /// `ctx` is a live context of this record's model.
    pub unsafe fn eval_with_helper(&self, ctx: *mut sys::llama_context, n_batch: i32) {
        let mut n_past = 0;
        let code = sys::mtmd_helper_eval_chunks(
            self.mtmd,
            ctx,
            self.chunks,
            0,
            0,
            n_batch,
            true,
            &mut n_past,
        );
        assert_eq!(code, 0, "mtmd's helper evaluates the record");
    }
}

impl Drop for MtmdRecord {
    fn drop(&mut self) {
        // SAFETY: each handle was made in `load` and is freed once here.
        unsafe {
            sys::mtmd_input_chunks_free(self.chunks);
            sys::mtmd_bitmap_free(self.bitmap);
            sys::mtmd_free(self.mtmd);
            sys::llama_model_free(self.model);
        }
    }
}
