//! What a record's images are before tokenization: the media marker that
//! stands for each in the text, and the checked image file.

/// The text standing for one image in a record's content: mtmd's default
/// media marker, where the image's positions go. Text that holds it
/// literally cannot also carry images.
pub const MEDIA_MARKER: &str = "<__media__>";

/// An image a record carries (PNG or JPEG), checked when its source is read.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageRef {
    /// The path as the record spells it (relative to the source file's directory).
    pub name: String,
    /// The file, resolved against the source file's directory.
    pub path: std::path::PathBuf,
    /// SHA-256 of its bytes.
    pub sha256: String,
}
