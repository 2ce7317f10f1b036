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
    hash_file_into(&mut h, path, &mut 0, &mut |_| {})?;
    Ok(hex::encode(h.finalize()))
}

/// SHA-256 of a model, lowercase hex: of its file, or of the bytes of its
/// split files one after the other ([`crate::split::model_files`]:
/// `path` is the first), so that the hash names every weight.
pub fn model_sha256(path: &Path) -> std::io::Result<String> {
    model_sha256_with(path, &mut |_, _| {})
}

/// [`model_sha256`], telling `progress` the bytes hashed so far and the
/// model's bytes in all, after every MiB: a model of hundreds of GB takes
/// minutes, which a caller shows.
pub fn model_sha256_with(
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> std::io::Result<String> {
    let files = crate::split::model_files(path)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut total = 0;
    for f in &files {
        total += std::fs::metadata(f)?.len();
    }
    let mut h = Sha256::new();
    let mut done = 0;
    for f in &files {
        hash_file_into(&mut h, f, &mut done, &mut |d| progress(d, total))?;
    }
    Ok(hex::encode(h.finalize()))
}

/// Feeds the bytes of the file at `path` into `h`, 1 MiB at a time, adding
/// each block's length to `done` and telling `progress` the new count.
fn hash_file_into(
    h: &mut Sha256,
    path: &Path,
    done: &mut u64,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
        *done += n as u64;
        progress(*done);
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

    #[test]
    fn a_split_model_hashes_all_its_files_and_reports_progress_to_the_total() {
        use crate::write::{GgufWriter, Value};
        let dir = tempfile::tempdir().unwrap();
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("qwen3moe".into()));
        for i in 0..4 {
            g.tensor_f32(&format!("t{i}"), &[1 << 18], &vec![i as f32; 1 << 18]);
        }
        let mut all = Vec::new();
        for (i, shard) in g.into_shards(2).iter().enumerate() {
            let bytes = shard.to_bytes();
            let name = crate::split::shard_name("m", i as u16, 2);
            std::fs::write(dir.path().join(name), &bytes).unwrap();
            all.extend(bytes);
        }
        let mut seen = Vec::new();
        let first = dir.path().join("m-00001-of-00002.gguf");
        let sha = model_sha256_with(&first, &mut |done, total| seen.push((done, total))).unwrap();
        assert_eq!(sha, sha256_hex(&all));
        let total = all.len() as u64;
        assert!(seen.len() >= 4, "a report per MiB: {seen:?}");
        assert!(seen.iter().all(|&(_, t)| t == total));
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(seen.last().unwrap().0, total);
    }
}
