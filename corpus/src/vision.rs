//! Images through the model's `mmproj` with llama.cpp's mtmd: a record's
//! text, whose [`MEDIA_MARKER`]s stand for its images, becomes the token ids
//! and image positions the model really sees. Every position of an image
//! holds the image's marker token ([`image_token`]), so shares, dedup and
//! packing count it as tokens of its record.

use super::media::{ImageRef, MEDIA_MARKER};
use gguf::read::GgufReader;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::mtmd::{
    MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunkType, MtmdInputText,
};
use runfiles::corpus::{image_token, ImageSpan};
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::path::Path;

/// A record's tokens: ids (an image's positions hold its marker) and the
/// spans of its images, in order.
pub type ImageTokens = (Vec<i32>, Vec<ImageSpan>);

/// An mmproj loaded by mtmd beside a text model's vocabulary.
pub struct Vision {
    ctx: MtmdContext,
}

impl Vision {
    /// Loads `mmproj` beside `model` (the text model read from `model_path`,
    /// vocabulary only), after checking from both GGUF headers that the
    /// projector's output width is the text model's hidden size: mtmd checks
    /// that only against a fully loaded model, which the corpus stage never
    /// loads.
    pub fn load(mmproj: &Path, model: &LlamaModel, model_path: &Path) -> Result<Vision, String> {
        check_width(model_path, mmproj)?;
        let params = MtmdContextParams {
            use_gpu: false,
            print_timings: false,
            n_threads: std::thread::available_parallelism().map_or(1, |n| n.get() as i32),
            media_marker: CString::new(MEDIA_MARKER).map_err(|e| e.to_string())?,
            image_min_tokens: -1,
            image_max_tokens: -1,
        };
        let path = mmproj
            .to_str()
            .ok_or_else(|| format!("mmproj path {} is not UTF-8", mmproj.display()))?;
        let ctx = MtmdContext::init_from_file(path, model, &params).map_err(|e| {
            format!(
                "mtmd cannot load the mmproj {} beside the model ({e}; RUST_LOG=info shows why)",
                mmproj.display()
            )
        })?;
        if !ctx.support_vision() {
            return Err(format!(
                "mmproj {} has no vision encoder, so it cannot tokenize images",
                mmproj.display()
            ));
        }
        Ok(Vision { ctx })
    }

    /// Tokenizes `text` with its `images` (one per [`MEDIA_MARKER`], in
    /// order) as mtmd does for the model: BOS/EOS as the model's metadata
    /// says, `special` parsing special-token text. Each image's file must
    /// still have the hash it was read with; an image mtmd cuts into several
    /// pieces (tiling projectors) is refused.
    pub fn tokenize(
        &self,
        text: &str,
        special: bool,
        images: &[ImageRef],
    ) -> Result<ImageTokens, String> {
        let bitmaps = images
            .iter()
            .map(|im| self.bitmap(im))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&MtmdBitmap> = bitmaps.iter().collect();
        let input = MtmdInputText {
            text: text.to_string(),
            add_special: true,
            parse_special: special,
        };
        let chunks = self
            .ctx
            .tokenize(input, &refs)
            .map_err(|e| format!("mtmd cannot tokenize the record with its images ({e})"))?;
        let mut ids = Vec::with_capacity(chunks.total_tokens());
        let mut spans: Vec<ImageSpan> = Vec::with_capacity(images.len());
        for chunk in (0..chunks.len()).filter_map(|i| chunks.get(i)) {
            match chunk.chunk_type() {
                MtmdInputChunkType::Text => {
                    ids.extend(chunk.text_tokens().unwrap_or_default().iter().map(|t| t.0));
                }
                MtmdInputChunkType::Image => {
                    let im = images.get(spans.len()).ok_or_else(|| {
                        format!(
                            "the mmproj cuts the record's {} image(s) into more pieces than \
                             images (a tiling projector), which the corpus does not support yet",
                            images.len()
                        )
                    })?;
                    let n = chunk.n_tokens();
                    spans.push(ImageSpan {
                        start: ids.len() as u32,
                        len: n as u32,
                        sha256: im.sha256.clone(),
                    });
                    ids.extend(std::iter::repeat_n(image_token(&im.sha256), n));
                }
                MtmdInputChunkType::Audio => {
                    return Err("mtmd returned audio for an image record".into());
                }
            }
        }
        if spans.len() != images.len() {
            return Err(format!(
                "mtmd gave {} image pieces for the record's {} images",
                spans.len(),
                images.len()
            ));
        }
        Ok((ids, spans))
    }

    /// Decodes one image (mtmd's own decoder) from bytes whose hash is
    /// checked against the one read with the record.
    fn bitmap(&self, im: &ImageRef) -> Result<MtmdBitmap, String> {
        let shown = || format!("image {:?} ({})", im.name, im.path.display());
        let bytes =
            super::image_file::read_bounded(&im.path).map_err(|e| format!("{}: {e}", shown()))?;
        if hex::encode(Sha256::digest(&bytes)) != im.sha256 {
            return Err(format!(
                "{}: changed while the corpus was prepared",
                shown()
            ));
        }
        MtmdBitmap::from_buffer(&self.ctx, &bytes, false)
            .map_err(|e| format!("{}: mtmd cannot decode it ({e})", shown()))
    }
}

/// Refuses an mmproj whose projector output width is not the text model's
/// hidden size (`{arch}.embedding_length`), from the GGUF headers. The
/// width is read for the LLaVA `mlp` projector family (`mm.2.weight`);
/// other projector types are checked by mtmd when a worker loads the full
/// model.
pub fn check_width(model: &Path, mmproj: &Path) -> Result<(), String> {
    // The reader's errors name the file.
    let open = |p: &Path| GgufReader::open(p).map_err(|e| e.to_string());
    let text = open(model)?;
    let arch = text
        .header
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("model {}: no general.architecture", model.display()))?;
    let hidden = text
        .header
        .get(&format!("{arch}.embedding_length"))
        .and_then(|v| v.as_u64());
    let proj = open(mmproj)?;
    let kind = proj
        .header
        .get("clip.projector_type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let width = match kind {
        "mlp" => proj
            .header
            .tensor("mm.2.weight")
            .and_then(|t| t.dims.get(1).copied()),
        _ => None,
    };
    match (hidden, width) {
        (Some(h), Some(w)) if h != w => Err(format!(
            "mmproj {} projects images to width {w}, but the model {} has hidden size {h} \
             ({arch}.embedding_length): they are not a pair",
            mmproj.display(),
            model.display()
        )),
        _ => Ok(()),
    }
}
