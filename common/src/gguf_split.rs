//! Models split across files as llama.cpp's `gguf-split` writes them
//! (`NAME-00001-of-00003.gguf`, `NAME-00002-of-00003.gguf`, ...), the way
//! large MoE models are published: the first file holds the metadata and
//! `split.count`, and llama.cpp loads every file from the first one's path.

use crate::gguf_read::GgufReader;
use std::path::{Path, PathBuf};

/// Metadata key: this file's index among the split files, from 0 (u16).
pub const SPLIT_NO: &str = "split.no";
/// Metadata key: how many files the model is split into (u16).
pub const SPLIT_COUNT: &str = "split.count";
/// Metadata key: tensors in all the files together (i32).
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The file name of split `index` (from 0) of `count` for `prefix`, as
/// llama.cpp's `llama_split_path` spells it.
pub fn shard_name(prefix: &str, index: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", u32::from(index) + 1)
}

/// The files of the model whose first (or only) file is `path`, in order.
/// A file whose header cannot be read, or has no `split.count` above 1, is
/// the model alone (its own readers then say what is wrong with it). A
/// split model's first file must be named as llama.cpp names it, and every
/// other file must be there: the error names the file and what is wrong.
pub fn model_files(path: &Path) -> Result<Vec<PathBuf>, String> {
    let Ok(reader) = GgufReader::open(path) else {
        return Ok(vec![path.to_path_buf()]);
    };
    let count = split_count(&reader.header);
    if count <= 1 {
        return Ok(vec![path.to_path_buf()]);
    }
    let shown = path.display();
    let count = u16::try_from(count)
        .map_err(|_| format!("model {shown}: {SPLIT_COUNT} = {count} is over 65,535"))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let first = shard_name("", 0, count);
    let prefix = name.strip_suffix(&first).ok_or_else(|| {
        format!(
            "model {shown} is the first of {count} split files ({SPLIT_COUNT}), but its name \
             does not end in {first:?}, as llama.cpp needs to find the others"
        )
    })?;
    let files: Vec<PathBuf> = (0..count)
        .map(|i| path.with_file_name(shard_name(prefix, i, count)))
        .collect();
    match files.iter().find(|f| !f.is_file()) {
        Some(missing) => Err(format!(
            "model {shown} is split into {count} files, but {} is missing",
            missing.display()
        )),
        None => Ok(files),
    }
}

/// `split.count` of a header: 1 for a model in one file.
pub fn split_count(header: &crate::gguf_read::GgufHeader) -> u64 {
    header
        .get(SPLIT_COUNT)
        .and_then(|v| v.as_u64())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, Value};

    fn model(tensors: usize) -> GgufWriter {
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("qwen3moe".into()));
        for i in 0..tensors {
            g.tensor_f32(&format!("t{i}"), &[2], &[i as f32, 1.0]);
        }
        g
    }

    #[test]
    fn shards_hold_the_tensors_in_order_and_the_first_the_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let shards = model(5).into_shards(3);
        for (i, s) in shards.iter().enumerate() {
            let name = shard_name("m", i as u16, 3);
            std::fs::write(dir.path().join(name), s.to_bytes()).unwrap();
        }
        let first = dir.path().join("m-00001-of-00003.gguf");
        let files = model_files(&first).unwrap();
        assert_eq!(
            files,
            [
                "m-00001-of-00003.gguf",
                "m-00002-of-00003.gguf",
                "m-00003-of-00003.gguf"
            ]
            .map(|n| dir.path().join(n))
        );
        let mut names = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let h = GgufReader::open(f).unwrap().header;
            assert_eq!(h.get(SPLIT_NO).and_then(|v| v.as_u64()), Some(i as u64));
            assert_eq!(split_count(&h), 3);
            assert_eq!(h.get(SPLIT_TENSORS_COUNT).and_then(|v| v.as_u64()), Some(5));
            assert_eq!(h.get("general.architecture").is_some(), i == 0);
            names.extend(h.tensors.iter().map(|t| t.name.clone()));
        }
        assert_eq!(names, ["t0", "t1", "t2", "t3", "t4"]);

        std::fs::remove_file(&files[2]).unwrap();
        let err = model_files(&first).unwrap_err();
        assert!(
            err.contains("split into 3 files") && err.contains("m-00003-of-00003.gguf is missing"),
            "{err}"
        );
        let renamed = dir.path().join("m.gguf");
        std::fs::rename(&first, &renamed).unwrap();
        let err = model_files(&renamed).unwrap_err();
        assert!(
            err.contains("does not end in \"-00001-of-00003.gguf\""),
            "{err}"
        );
    }

    #[test]
    fn one_file_and_unreadable_files_are_the_model_alone() {
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("one.gguf");
        std::fs::write(&one, model(2).to_bytes()).unwrap();
        assert_eq!(model_files(&one).unwrap(), [one]);
        let junk = dir.path().join("junk.gguf");
        std::fs::write(&junk, b"not a gguf").unwrap();
        assert_eq!(model_files(&junk).unwrap(), [junk]);
    }
}
