//! SHA-256 helpers: content hashes of models, corpora and artifacts.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// SHA-256 of bytes, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of a file, streamed in 1 MiB blocks, lowercase hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    hash_file_into(&mut h, path)?;
    Ok(hex::encode(h.finalize()))
}

/// SHA-256 of a model, lowercase hex: of its file, or of the bytes of its
/// split files one after the other ([`crate::gguf_split::model_files`]:
/// `path` is the first), so that the hash names every weight.
pub fn model_sha256(path: &Path) -> std::io::Result<String> {
    let files = crate::gguf_split::model_files(path)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut h = Sha256::new();
    for f in &files {
        hash_file_into(&mut h, f)?;
    }
    Ok(hex::encode(h.finalize()))
}

/// Feeds the bytes of the file at `path` into `h`, 1 MiB at a time.
fn hash_file_into(h: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_and_bytes_hashes_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        let data = vec![7u8; 3 << 20];
        std::fs::write(&path, &data).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), sha256_hex(&data));
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
