//! Models split across files as llama.cpp's `gguf-split` writes them
//! (`NAME-00001-of-00003.gguf`, `NAME-00002-of-00003.gguf`, ...), the way
//! large MoE models are published: the first file holds the metadata and
//! `split.count`, and llama.cpp loads every file from the first one's path.
//! [`open_joined`] reads such a model's headers as one model's.

use crate::read::{GgufHeader, GgufReadError, GgufReader};
use std::path::{Path, PathBuf};

/// Why a model's files cannot be read as one model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SplitError {
    /// A file's header cannot be read.
    #[error(transparent)]
    Read(#[from] GgufReadError),
    /// The files are not laid out as llama.cpp's `gguf-split` lays them
    /// out: a first file misnamed, a file missing, split keys that
    /// disagree with a file's place.
    #[error("model {model} {reason}")]
    Layout {
        /// The model's first file.
        model: String,
        /// What is wrong, naming the file.
        reason: String,
    },
}

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
pub fn model_files(path: &Path) -> Result<Vec<PathBuf>, SplitError> {
    match GgufReader::open(path) {
        Ok(reader) => files_of(path, &reader.header),
        Err(_) => Ok(vec![path.to_path_buf()]),
    }
}

/// [`model_files`] of the model whose first file `path` has `header`.
fn files_of(path: &Path, header: &GgufHeader) -> Result<Vec<PathBuf>, SplitError> {
    let count = split_count(header);
    if count <= 1 {
        return Ok(vec![path.to_path_buf()]);
    }
    let layout = |reason: String| SplitError::Layout {
        model: path.display().to_string(),
        reason,
    };
    let count = u16::try_from(count)
        .map_err(|_| layout(format!("has {SPLIT_COUNT} = {count}, over 65,535")))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let first = shard_name("", 0, count);
    let prefix = name.strip_suffix(&first).ok_or_else(|| {
        layout(format!(
            "is the first of {count} split files ({SPLIT_COUNT}), but its name does not end \
             in {first:?}, as llama.cpp needs to find the others"
        ))
    })?;
    let files: Vec<PathBuf> = (0..count)
        .map(|i| path.with_file_name(shard_name(prefix, i, count)))
        .collect();
    match files.iter().find(|f| !f.is_file()) {
        Some(missing) => Err(layout(format!(
            "is split into {count} files, but {} is missing",
            missing.display()
        ))),
        None => Ok(files),
    }
}

/// Where a tensor's data lies among a model's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorPlace {
    /// Index of the file in [`Joined::files`].
    pub file: usize,
    /// Absolute offset of the data in that file.
    pub offset: u64,
}

/// A model's headers read as one: what a tool that rewrites the model
/// (the slicer) sees, whether it is in one file or split.
#[derive(Clone, Debug)]
pub struct Joined {
    /// The model's files, first one first (one for a model in one file).
    pub files: Vec<PathBuf>,
    /// The whole model: the first file's metadata without the `split.*`
    /// keys and every file's tensors in order. `kv_ranges`, `alignment`
    /// and `data_offset` are the first file's; tensor offsets are each
    /// file's own (see `places`).
    pub header: GgufHeader,
    /// Where the data of each tensor of `header` lies.
    pub places: Vec<TensorPlace>,
}

/// Reads the headers of the model whose first (or only) file is `path`.
/// A model in one file is returned as it is (split keys and all); each
/// file of a split model must carry its own place (`split.no`), the same
/// `split.count`, and together `split.tensors.count` tensors, each named
/// once.
pub fn open_joined(path: &Path) -> Result<Joined, SplitError> {
    let mut header = GgufReader::open(path)?.header;
    let files = files_of(path, &header)?;
    let place = |file: usize, h: &GgufHeader| {
        h.tensors
            .iter()
            .map(|t| TensorPlace {
                file,
                offset: h.data_offset + t.offset,
            })
            .collect::<Vec<_>>()
    };
    let mut places = place(0, &header);
    if files.len() == 1 {
        return Ok(Joined {
            files,
            header,
            places,
        });
    }
    let layout = |reason: String| SplitError::Layout {
        model: path.display().to_string(),
        reason,
    };
    let count = files.len() as u64;
    let mut names: std::collections::HashSet<String> =
        header.tensors.iter().map(|t| t.name.clone()).collect();
    for (i, file) in files.iter().enumerate().skip(1) {
        let shard = GgufReader::open(file)?.header;
        let key = |k: &str| shard.get(k).and_then(|v| v.as_u64());
        if key(SPLIT_NO) != Some(i as u64) || key(SPLIT_COUNT) != Some(count) {
            return Err(layout(format!(
                "has {count} files, but {} says it is number {:?} (from 0) of {:?} \
                 ({SPLIT_NO}, {SPLIT_COUNT})",
                file.display(),
                key(SPLIT_NO),
                key(SPLIT_COUNT)
            )));
        }
        if let Some(t) = shard.tensors.iter().find(|t| !names.insert(t.name.clone())) {
            return Err(layout(format!(
                "has tensor {:?} twice (again in {})",
                t.name,
                file.display()
            )));
        }
        places.extend(place(i, &shard));
        header.tensors.extend(shard.tensors);
    }
    let expected = header.get(SPLIT_TENSORS_COUNT).and_then(|v| v.as_u64());
    if let Some(expected) = expected.filter(|&n| n != header.tensors.len() as u64) {
        return Err(layout(format!(
            "has {} tensors in its {count} files, but {SPLIT_TENSORS_COUNT} is {expected}",
            header.tensors.len()
        )));
    }
    let kv = std::mem::take(&mut header.kv);
    let ranges = std::mem::take(&mut header.kv_ranges);
    (header.kv, header.kv_ranges) = kv
        .into_iter()
        .zip(ranges)
        .filter(|((key, _), _)| !is_split_key(key))
        .unzip();
    Ok(Joined {
        files,
        header,
        places,
    })
}

/// Whether `key` is one of the keys `gguf-split` adds to each file.
pub fn is_split_key(key: &str) -> bool {
    [SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT].contains(&key)
}

/// `split.count` of a header: 1 for a model in one file.
pub fn split_count(header: &GgufHeader) -> u64 {
    header
        .get(SPLIT_COUNT)
        .and_then(|v| v.as_u64())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{GgufWriter, Value};

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
        let err = model_files(&first).unwrap_err().to_string();
        assert!(
            err.contains("split into 3 files") && err.contains("m-00003-of-00003.gguf is missing"),
            "{err}"
        );
        let renamed = dir.path().join("m.gguf");
        std::fs::rename(&first, &renamed).unwrap();
        let err = model_files(&renamed).unwrap_err().to_string();
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

    /// The joined header of a split model is the one-file model's header
    /// but for tensor offsets; each place holds the tensor's bytes.
    #[test]
    fn a_split_model_joins_into_the_one_file_header() {
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("one.gguf");
        std::fs::write(&one, model(5).to_bytes()).unwrap();
        for (i, s) in model(5).into_shards(2).iter().enumerate() {
            let name = shard_name("m", i as u16, 2);
            std::fs::write(dir.path().join(name), s.to_bytes()).unwrap();
        }
        let first = dir.path().join("m-00001-of-00002.gguf");
        let joined = open_joined(&first).unwrap();
        let whole = open_joined(&one).unwrap();
        assert_eq!(joined.files.len(), 2);
        assert_eq!(whole.files, [one]);
        assert_eq!(joined.header.kv, whole.header.kv, "split keys are left out");
        assert_eq!(joined.header.kv_ranges.len(), joined.header.kv.len());
        let shape = |h: &GgufHeader| {
            h.tensors
                .iter()
                .map(|t| (t.name.clone(), t.dims.clone(), t.n_bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(&joined.header), shape(&whole.header));
        assert_eq!(
            joined.places.iter().map(|p| p.file).collect::<Vec<_>>(),
            [0, 0, 0, 1, 1]
        );
        for (i, place) in joined.places.iter().enumerate() {
            let bytes = std::fs::read(&joined.files[place.file]).unwrap();
            let at = place.offset as usize;
            let data: Vec<f32> = bytes[at..at + 8]
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(data, [i as f32, 1.0], "tensor {i}");
        }

        // A second file that claims another place is named.
        let second = dir.path().join("m-00002-of-00002.gguf");
        let mut wrong = model(2).into_shards(3);
        std::fs::write(&second, wrong.remove(2).to_bytes()).unwrap();
        let err = open_joined(&first).unwrap_err().to_string();
        assert!(
            err.contains("m-00002-of-00002.gguf says it is number Some(2) (from 0) of Some(3)"),
            "{err}"
        );
    }
}
