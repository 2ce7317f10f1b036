//! A record's image file, checked before anything reads it whole: the path
//! stays under the source file's directory or the source's `image_dir` (no
//! `..`, not absolute, no symbolic link leading out), the file is a
//! regular file of at most
//! [`MAX_IMAGE_BYTES`], and its pixels, from the PNG or JPEG header before
//! any decoding, are at most [`MAX_IMAGE_PIXELS`]. Images are copied into
//! the run for every worker to fetch, and decoded whole by mtmd, so a path
//! to `/dev/zero`, to a file outside the corpus, or a small file claiming a
//! huge image is refused here, naming the record.

use super::media::ImageRef;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Most bytes an image file may hold: 32 MiB (a lossless 8K photograph
/// takes less).
pub const MAX_IMAGE_BYTES: u64 = 32 << 20;

/// Most pixels an image may have: 2^25 (8K UHD, 7680 x 4320, fits); mtmd
/// decodes an image whole to 3 bytes a pixel before resizing it.
pub const MAX_IMAGE_PIXELS: u64 = 1 << 25;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
const JPEG_SIGNATURE: &[u8] = &[0xff, 0xd8, 0xff];

/// The directory a source file's records name their images under: the
/// source's `image_dir` when its config names one, else the file's own.
pub fn image_dir<'a>(image_dir: Option<&'a Path>, source: &'a Path) -> &'a Path {
    match (image_dir, source.parent()) {
        (Some(d), _) => d,
        (None, Some(d)) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Reads and checks the image `name` of a record whose images lie under
/// `dir` ([`image_dir`]): confined to `dir`, a regular file within the
/// byte limit, a PNG that decodes (row by row) or a JPEG (mtmd decodes it
/// when tokenizing), within the pixel limit by its header. The error names
/// the image; the caller adds the record.
pub fn image_ref(dir: &Path, name: &str) -> Result<ImageRef, String> {
    let path = confined(dir, name)?;
    let unreadable = |why: String| format!("image {name:?} ({}): {why}", path.display());
    let bytes = read_bounded(&path).map_err(unreadable)?;
    if bytes.starts_with(PNG_SIGNATURE) {
        check_png(&bytes).map_err(unreadable)?;
    } else if bytes.starts_with(JPEG_SIGNATURE) {
        if let Some((w, h)) = jpeg_size(&bytes) {
            check_pixels(w, h).map_err(unreadable)?;
        }
    } else {
        return Err(unreadable("not a PNG or JPEG image".into()));
    }
    Ok(ImageRef {
        name: name.to_string(),
        path,
        sha256: hex::encode(Sha256::digest(&bytes)),
    })
}

/// `dir/name`, refused unless `name` is a relative path without `..` and
/// the file it names (symbolic links followed) lies under `dir`.
fn confined(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let outside = |why: &str| {
        format!(
            "image {name:?}: {why}; images must be files under the source file's directory or its image_dir ({})",
            dir.display()
        )
    };
    let relative = Path::new(name);
    if name.is_empty() {
        return Err(outside("an empty path"));
    }
    for c in relative.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err(outside("a path with \"..\" is refused")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(outside("an absolute path is refused"))
            }
        }
    }
    let path = dir.join(relative);
    let cannot =
        |p: &Path, e: std::io::Error| format!("image {name:?}: cannot read {} ({e})", p.display());
    let real_dir = dir.canonicalize().map_err(|e| cannot(dir, e))?;
    let real = path.canonicalize().map_err(|e| cannot(&path, e))?;
    if !real.starts_with(&real_dir) {
        return Err(outside(&format!(
            "it leads (through a symbolic link) to {}, outside",
            real.display()
        )));
    }
    Ok(path)
}

/// The bytes of a regular file of at most [`MAX_IMAGE_BYTES`], its type and
/// size checked on the opened file before it is read (a device or a pipe
/// is never read).
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    // Checked before opening too: opening a pipe would wait for a writer.
    let regular = |m: &std::fs::Metadata| {
        if !m.is_file() {
            return Err("not a regular file".to_string());
        }
        if m.len() > MAX_IMAGE_BYTES {
            return Err(format!(
                "{} bytes, more than the {MAX_IMAGE_BYTES} bytes an image may take",
                m.len()
            ));
        }
        Ok(m.len())
    };
    regular(&std::fs::metadata(path).map_err(|e| format!("cannot read ({e})"))?)?;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read ({e})"))?;
    let len = regular(&file.metadata().map_err(|e| format!("cannot read ({e})"))?)?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_IMAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read ({e})"))?;
    if bytes.len() as u64 > MAX_IMAGE_BYTES {
        return Err(format!(
            "grew past the {MAX_IMAGE_BYTES} bytes an image may take while it was read"
        ));
    }
    Ok(bytes)
}

/// Refuses more than [`MAX_IMAGE_PIXELS`].
fn check_pixels(width: u32, height: u32) -> Result<(), String> {
    let pixels = u64::from(width) * u64::from(height);
    if pixels > MAX_IMAGE_PIXELS {
        return Err(format!(
            "{width} x {height} pixels, more than the {MAX_IMAGE_PIXELS} pixels an image may have"
        ));
    }
    Ok(())
}

/// Checks a PNG's size from its header, then decodes it row by row (a
/// truncated or corrupt file fails here, not later; no whole frame is
/// allocated).
fn check_png(bytes: &[u8]) -> Result<(), String> {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("not a readable PNG ({e})"))?;
    let (width, height) = reader.info().size();
    check_pixels(width, height)?;
    while reader
        .next_row()
        .map_err(|e| format!("not a readable PNG ({e})"))?
        .is_some()
    {}
    Ok(())
}

/// Width and height from a JPEG's frame header (the first `SOFn` marker),
/// if the segments up to it are well formed.
fn jpeg_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        if *bytes.get(at)? != 0xff {
            return None;
        }
        let marker = *bytes.get(at + 1)?;
        match marker {
            // Fill bytes before a marker.
            0xff => at += 1,
            // Markers without a length.
            0x01 | 0xd0..=0xd7 => at += 2,
            // SOF0..SOF15, except DHT (c4), JPG (c8) and DAC (cc).
            0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => {
                let be16 = |i: usize| -> Option<u32> {
                    Some(u32::from(u16::from_be_bytes([
                        *bytes.get(i)?,
                        *bytes.get(i + 1)?,
                    ])))
                };
                return Some((be16(at + 7)?, be16(at + 5)?));
            }
            // Start of scan or end of image before a frame header.
            0xda | 0xd9 => return None,
            _ => {
                let len = u16::from_be_bytes([*bytes.get(at + 2)?, *bytes.get(at + 3)?]);
                at += 2 + usize::from(len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JPEG's first segments with a baseline frame header of `w` x `h`.
    fn jpeg_head(w: u16, h: u16) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8, 0xff, 0xe0, 0, 4, b'J', b'F'];
        b.extend([0xff, 0xc0, 0, 11, 8]);
        b.extend(h.to_be_bytes());
        b.extend(w.to_be_bytes());
        b.extend([1, 1, 0x11, 0]);
        b
    }

    #[test]
    fn jpeg_size_comes_from_the_frame_header() {
        assert_eq!(jpeg_size(&jpeg_head(640, 480)), Some((640, 480)));
        assert_eq!(jpeg_size(&[0xff, 0xd8, 0xff, 0xe0, 0, 16]), None);
        assert_eq!(check_pixels(640, 480), Ok(()));
        let e = check_pixels(65535, 65535).unwrap_err();
        assert!(e.starts_with("65535 x 65535 pixels, more than"), "{e}");
    }

    #[test]
    fn paths_leading_out_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("corpus");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(d.path().join("secret.png"), b"x").unwrap();
        std::fs::write(dir.join("in.png"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret.png"), dir.join("link.png")).unwrap();
        std::os::unix::fs::symlink(dir.join("in.png"), dir.join("inner.png")).unwrap();
        assert_eq!(confined(&dir, "in.png").unwrap(), dir.join("in.png"));
        assert_eq!(
            confined(&dir, "./inner.png").unwrap(),
            dir.join("./inner.png")
        );
        for (name, why) in [
            ("../secret.png", "a path with \"..\" is refused"),
            ("sub/../../secret.png", "a path with \"..\" is refused"),
            ("/etc/passwd", "an absolute path is refused"),
            ("link.png", "leads (through a symbolic link) to"),
            ("", "an empty path"),
        ] {
            let e = confined(&dir, name).unwrap_err();
            assert!(e.starts_with(&format!("image {name:?}: ")), "{e}");
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn devices_and_large_files_are_not_read() {
        let e = read_bounded(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e, "not a regular file");
        let d = tempfile::tempdir().unwrap();
        let big = d.path().join("big.png");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_IMAGE_BYTES + 1)
            .unwrap();
        let e = read_bounded(&big).unwrap_err();
        assert!(e.contains("more than the 33554432 bytes"), "{e}");
    }
}
