//! `worker synth-images`: the bundled image sample (`configs/sample_images/`:
//! `images/` and `images.jsonl`): a few small generated PNG pictures (shapes,
//! stripes, gradients) with captions, as captioned records `{"image",
//! "text"}` and chat records with image parts, so an image domain needs no
//! downloaded data. The same call always writes the same bytes.

use crate::error::SynthError;
use std::path::Path;

/// Directory of the pictures, relative to `images.jsonl`.
pub const DIR: &str = "images";

/// The records file, beside [`DIR`].
pub const RECORDS: &str = "images.jsonl";

/// One picture: file name, size, caption and pixel function `(x, y) -> rgb`.
struct Picture {
    file: &'static str,
    size: (u32, u32),
    topic: &'static str,
    caption: &'static str,
    pixel: fn(u32, u32) -> [u8; 3],
}

const PICTURES: [Picture; 5] = [
    Picture {
        file: "red_square.png",
        size: (32, 32),
        topic: "shapes",
        caption: "A red square in the middle of a white background.",
        pixel: |x, y| match (8..24).contains(&x) && (8..24).contains(&y) {
            true => [220, 30, 30],
            false => [255, 255, 255],
        },
    },
    Picture {
        file: "blue_circle.png",
        size: (40, 40),
        topic: "shapes",
        caption: "A blue disc on a black background.",
        pixel: |x, y| {
            let (dx, dy) = (x as i32 - 20, y as i32 - 20);
            match dx * dx + dy * dy <= 14 * 14 {
                true => [40, 70, 230],
                false => [0, 0, 0],
            }
        },
    },
    Picture {
        file: "green_stripes.png",
        size: (48, 32),
        topic: "patterns",
        caption: "Horizontal green and white stripes, four pixels wide.",
        pixel: |_, y| match (y / 4) % 2 {
            0 => [30, 160, 60],
            _ => [250, 250, 250],
        },
    },
    Picture {
        file: "sunset_gradient.png",
        size: (32, 48),
        topic: "patterns",
        caption: "A vertical gradient from yellow at the top to deep orange at the bottom.",
        pixel: |_, y| [250, (230 - y * 3) as u8, (60 - y) as u8],
    },
    Picture {
        file: "checkerboard.png",
        size: (32, 32),
        topic: "patterns",
        caption: "A black and white checkerboard of eight by eight squares.",
        pixel: |x, y| match (x / 4 + y / 4) % 2 {
            0 => [0, 0, 0],
            _ => [255, 255, 255],
        },
    },
];

/// The PNG bytes of one picture (8-bit RGB).
fn png_bytes(p: &Picture) -> Result<Vec<u8>, SynthError> {
    let (w, h) = p.size;
    let rgb: Vec<u8> = (0..h)
        .flat_map(|y| (0..w).flat_map(move |x| (p.pixel)(x, y)))
        .collect();
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(&rgb)?;
    writer.finish()?;
    Ok(out)
}

/// The records: one captioned record per picture, then two chat records
/// that ask about pictures (one with two images).
fn records() -> String {
    let path = |p: &Picture| format!("{DIR}/{}", p.file);
    let mut lines: Vec<serde_json::Value> = PICTURES
        .iter()
        .map(|p| serde_json::json!({"topic": p.topic, "image": path(p), "text": p.caption}))
        .collect();
    let image = |i: usize| serde_json::json!({"type": "image", "image": path(&PICTURES[i])});
    let text = |t: &str| serde_json::json!({"type": "text", "text": t});
    lines.push(serde_json::json!({"topic": "chat-shapes", "messages": [
        {"role": "user", "content": [image(0), text("What shape is this, and what colour?")]},
        {"role": "assistant", "content": PICTURES[0].caption},
    ]}));
    lines.push(serde_json::json!({"topic": "chat-patterns", "messages": [
        {"role": "user", "content": [
            text("Which of these two pictures has stripes? "), image(2), image(4)]},
        {"role": "assistant", "content": "The first one: it has horizontal green and white stripes, while the second is a checkerboard."},
    ]}));
    lines.iter().map(|v| format!("{v}\n")).collect()
}

/// Writes `DIR/*.png` and `RECORDS` into `dir`.
pub fn write_images(dir: &Path) -> Result<(), SynthError> {
    let images = dir.join(DIR);
    std::fs::create_dir_all(&images).map_err(SynthError::creating(&images))?;
    for (name, bytes) in files()? {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(SynthError::writing(&path))?;
    }
    Ok(())
}

/// Every file [`write_images`] writes, relative to its directory, with its bytes.
pub fn files() -> Result<Vec<(String, Vec<u8>)>, SynthError> {
    let mut out: Vec<(String, Vec<u8>)> = PICTURES
        .iter()
        .map(|p| Ok((format!("{DIR}/{}", p.file), png_bytes(p)?)))
        .collect::<Result<_, SynthError>>()?;
    out.push((RECORDS.to_string(), records().into_bytes()));
    Ok(out)
}
