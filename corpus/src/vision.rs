//! Images through the model's `mmproj` with llama.cpp's mtmd (the llama
//! crate's [`Vision`]): a record's text, whose media markers
//! ([`MEDIA_MARKER`](super::media::MEDIA_MARKER)) stand for its images,
//! becomes the token ids and image positions the model really sees. Every
//! position of an image holds the image's marker token ([`image_token`]), so
//! shares, dedup and packing count it as tokens of its record.

use super::media::ImageRef;
use gguf::read::GgufReader;
use llama::{Bitmap, Model, Piece, Vision};
use runfiles::corpus::{image_token, ImageSpan};
use sha2::{Digest, Sha256};
use std::path::Path;

/// A record's tokens: ids (an image's positions hold its marker) and the
/// spans of its images, in order.
pub type ImageTokens = (Vec<i32>, Vec<ImageSpan>);

/// Loads `mmproj` with mtmd (whose media marker, [`llama::media_marker`],
/// is the corpus's) beside `model` (the text model read from
/// `model_path`, vocabulary only), after checking from both GGUF headers
/// that the projector's output width is the text model's hidden size: mtmd
/// checks that only against a fully loaded model, which the corpus stage
/// never loads.
pub fn load(mmproj: &Path, model: &Model, model_path: &Path) -> Result<Vision, String> {
    check_width(model_path, mmproj)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    // The error names the mmproj.
    Vision::load(mmproj, model, threads).map_err(|e| e.to_string())
}

/// Tokenizes `text` with its `images` (one per media marker, in order) as
/// mtmd does for the model: BOS/EOS as the model's metadata says,
/// `special` parsing special-token text. Each image's file must still have
/// the hash it was read with; an image mtmd cuts into several pieces
/// (tiling projectors) is refused.
pub fn tokenize(
    vision: &Vision,
    text: &str,
    special: bool,
    images: &[ImageRef],
) -> Result<ImageTokens, String> {
    let bitmaps = images
        .iter()
        .map(|im| bitmap(vision, im))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&Bitmap> = bitmaps.iter().collect();
    let pieces = vision
        .tokenize(text, true, special, &refs)
        .map_err(|e| format!("mtmd cannot tokenize the record with its images ({e})"))?;
    let mut ids = Vec::new();
    let mut spans: Vec<ImageSpan> = Vec::with_capacity(images.len());
    for piece in pieces {
        match piece {
            Piece::Text(tokens) => ids.extend(tokens),
            Piece::Image(n) => {
                let im = images.get(spans.len()).ok_or_else(|| {
                    format!(
                        "the mmproj cuts the record's {} image(s) into more pieces than \
                         images (a tiling projector), which the corpus does not support yet",
                        images.len()
                    )
                })?;
                spans.push(ImageSpan {
                    start: ids.len() as u32,
                    len: n as u32,
                    sha256: im.sha256.clone(),
                });
                ids.extend(std::iter::repeat_n(image_token(&im.sha256), n));
            }
            Piece::Audio(_) => {
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

/// Decodes one image (mtmd's own decoder) from bytes whose hash is checked
/// against the one read with the record.
fn bitmap(vision: &Vision, im: &ImageRef) -> Result<Bitmap, String> {
    let shown = || format!("image {:?} ({})", im.name, im.path.display());
    let bytes =
        super::image_file::read_bounded(&im.path).map_err(|e| format!("{}: {e}", shown()))?;
    if hex::encode(Sha256::digest(&bytes)) != im.sha256 {
        return Err(format!(
            "{}: changed while the corpus was prepared",
            shown()
        ));
    }
    vision
        .bitmap(&bytes)
        .ok_or_else(|| format!("{}: mtmd cannot decode it", shown()))
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
