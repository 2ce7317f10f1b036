//! `coordinator prune`: a pruned GGUF and its importance matrix from one of
//! the run's keep maps (DESIGN section 12), sliced by [`slicer`].

use crate::{During, StagesError};
use runfiles::keepmap::{KeepMap, KeepMapRef};
use runfiles::layout;
use runfiles::store::RunStore;
use slicer::{make_model_split, slice_imatrix, slice_model, Sliced};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `coordinator prune` asks for.
#[derive(Debug)]
pub struct PruneRequest {
    /// Run location holding `keep_maps/NAME.json` and `imatrix.gguf`.
    pub run: String,
    /// Keep map: a name under the run's `keep_maps/` (`reap_l2_sum_K8`),
    /// or the path of a JSON file, e.g. written by hand as `{"layers":
    /// {"0": [expert ids], "1": [...], ...}}` (the same number of ids in
    /// every MoE block), checked against the run's model.
    pub keep_map: String,
    /// Base model; default: the model named by the run's manifest.
    pub model: Option<PathBuf>,
    /// The pruned model to write; its importance matrix goes next to it as
    /// `<stem>.imatrix.gguf`. Both are new files: an existing one is
    /// refused, never replaced.
    pub out: PathBuf,
    /// An importance matrix to slice instead of the run's `imatrix.gguf`:
    /// a file in llama-imatrix's GGUF format (`<name>.in_sum2` and
    /// `<name>.counts` per weight), such as llama-imatrix itself writes;
    /// the run then needs no `imatrix.gguf`.
    pub imatrix: Option<PathBuf>,
    /// Splits a large model (`--split-max-size`).
    pub split: SplitMaxSize,
}

/// `--split-max-size`, which `prune` and `ship` share.
#[derive(Clone, Debug, Default)]
pub struct SplitMaxSize {
    /// Write each model file larger than this as llama.cpp's `gguf-split`
    /// files of at most this much tensor data (`48G`, `500M`: decimal, as
    /// `llama-gguf-split --split-max-size`; Hugging Face caps a file at
    /// 50 GB): `<stem>-00001-of-0000N.gguf`, ...
    pub text: Option<String>,
}

impl SplitMaxSize {
    /// The size as given and in bytes; `None` when not given. A malformed
    /// size is refused naming the flag.
    pub fn parsed(&self) -> Result<Option<(String, u64)>, StagesError> {
        let Some(text) = &self.text else {
            return Ok(None);
        };
        let bytes =
            config::ship::parse_split_size(text).map_err(|problem| StagesError::Argument {
                argument: "--split-max-size".into(),
                problem,
            })?;
        Ok(Some((text.clone(), bytes)))
    }
}

/// `x/pruned.gguf` -> `x/pruned.imatrix.gguf`.
pub fn imatrix_path(out: &Path) -> PathBuf {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    out.with_file_name(format!("{stem}.imatrix.gguf"))
}

/// The base model: `--model`, else the model collection ran with (the
/// manifest's `model_path`), else the absolute model path of the run's
/// config (`config.model.path`).
pub async fn base_model(store: &RunStore, model: Option<&Path>) -> Result<PathBuf, StagesError> {
    if let Some(m) = model {
        return Ok(m.to_path_buf());
    }
    let no_model = |problem: String| StagesError::NoModel {
        manifest: store.url_of(layout::MANIFEST_JSON),
        problem,
    };
    let manifest = runfiles::manifest::read(store)
        .await
        .during_with(|| format!("parsing {}", store.url_of(layout::MANIFEST_JSON)))?
        .ok_or_else(|| no_model("is missing".into()))?;
    if let Some(recorded) = manifest.model_path.clone().filter(|p| p.is_file()) {
        return Ok(recorded);
    }
    let path = manifest
        .config::<config::Config>()
        .ok()
        .map(|c| c.model.path)
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| no_model("names no model (config.model.path)".into()))?;
    if !path.is_absolute() || !path.is_file() {
        return Err(no_model(format!(
            "names model {}, which is not an absolute path to an existing file",
            path.display()
        )));
    }
    Ok(path)
}

/// Tensors whose shape differs between the base and the pruned model
/// (each given by its first file).
fn tensors_sliced(base: &Path, pruned: &Path) -> Result<usize, StagesError> {
    let base = gguf::split::open_joined(base)?.header;
    let pruned = gguf::split::open_joined(pruned)?.header;
    Ok(base
        .tensors
        .iter()
        .zip(&pruned.tensors)
        .filter(|(a, b)| a.dims != b.dims)
        .count())
}

fn describe(what: &str, path: &Path, s: &Sliced, seconds: f64) -> String {
    format!(
        "{what} {}: {} bytes, sha256 {}, {:.2} GB/s",
        path.display(),
        s.bytes,
        s.sha256,
        s.bytes as f64 / seconds.max(1e-9) / 1e9
    )
}

/// Links each file of `finals` from its scratch path (`in_scratch`) to its
/// final name, never over an existing file: the first that exists is
/// refused by name, and the ones linked before it are removed.
fn place(finals: &[&Path], in_scratch: &dyn Fn(&Path) -> PathBuf) -> Result<(), StagesError> {
    for (i, path) in finals.iter().enumerate() {
        if let Err(e) = std::fs::hard_link(in_scratch(path), path) {
            for placed in &finals[..i] {
                let _ = std::fs::remove_file(placed);
            }
            return Err(match e.kind() {
                std::io::ErrorKind::AlreadyExists => exists(path),
                _ => StagesError::io("linking", path)(e),
            });
        }
    }
    Ok(())
}

/// The refusal of an output that exists.
fn exists(path: &Path) -> StagesError {
    StagesError::Argument {
        argument: "--out".into(),
        problem: format!(
            "{} exists; prune never replaces a file (remove it or choose another --out)",
            path.display()
        ),
    }
}

/// The keep map a `--keep-map` argument names ([`KeepMapRef`]): one of
/// the run's (which `verify` checks), or a file (written by hand:
/// `{"layers": {"0": [ids], ...}}`), checked against the run's model
/// ([`KeepMap::check_fits`]); with the name it is reported by (the run's
/// map name, or the file's path).
pub async fn read_keep_map(store: &RunStore, arg: &str) -> Result<(String, KeepMap), StagesError> {
    let (name, url, keep, file) = match KeepMapRef::parse(arg) {
        KeepMapRef::Run(name) => {
            let (keep, _) = KeepMap::read(store, &name)
                .await
                .during("reading the keep map")?;
            let url = store.url_of(&KeepMap::object_name(&name));
            (name, url, keep, false)
        }
        KeepMapRef::File(path) => {
            let bytes =
                std::fs::read(&path).map_err(StagesError::io("reading the keep map", &path))?;
            let shown = path.display().to_string();
            let keep = KeepMap::decode(&bytes, &shown)?;
            (shown.clone(), shown, keep, true)
        }
    };
    let bad = |problem: String| StagesError::Artifact {
        url: url.clone(),
        problem,
    };
    if file {
        let s = runfiles::saliency::read(store).await?.saliency;
        keep.check_fits(&s)
            .map_err(|e| bad(format!("does not fit the run's model: {e}")))?;
    }
    Ok((name, keep))
}

/// `coordinator prune`: slices the base model and the importance matrix to
/// the keep map into new files (never over an existing one) and prints what
/// it wrote. Must run on a multi-threaded runtime: the slicing blocks.
pub async fn prune(args: &PruneRequest) -> Result<(), StagesError> {
    let out_imatrix = imatrix_path(&args.out);
    // Create-only: refused before any work (and again when placed).
    for path in [&args.out, &out_imatrix] {
        if path.symlink_metadata().is_ok() {
            return Err(exists(path));
        }
    }
    let store = RunStore::open(&args.run)?;
    let (name, keep) = read_keep_map(&store, &args.keep_map).await?;
    let base = base_model(&store, args.model.as_deref()).await?;
    let split = args.split.parsed()?.map(|(_, bytes)| bytes);

    let out_dir = out_imatrix
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Everything is written in a scratch directory beside the outputs, then
    // linked to its final name: create-only, and the pair appears together
    // or not at all.
    let scratch = tempfile::Builder::new()
        .prefix(".prune-scratch-")
        .tempdir_in(out_dir)
        .map_err(StagesError::io("creating a scratch directory in", out_dir))?;
    let in_scratch = |p: &Path| scratch.path().join(p.file_name().unwrap_or_default());
    // A given file is sliced where it is; the run's matrix (in any store)
    // is copied to the scratch directory first.
    let imatrix_in = match &args.imatrix {
        Some(path) => {
            std::fs::File::open(path)
                .map_err(StagesError::io("reading the importance matrix", path))?;
            path.clone()
        }
        None => {
            let bytes = store
                .get(layout::IMATRIX_GGUF)
                .await
                .during("reading the run's importance matrix")?;
            let copy = scratch.path().join("run.imatrix.gguf");
            std::fs::write(&copy, &bytes).map_err(StagesError::io(
                "writing the run's importance matrix to",
                &copy,
            ))?;
            copy
        }
    };
    tokio::task::block_in_place(|| {
        let started = Instant::now();
        let sliced_imatrix =
            slice_imatrix(&imatrix_in, &keep, &in_scratch(&out_imatrix)).map_err(|source| {
                StagesError::Slice {
                    input: match &args.imatrix {
                        Some(path) => path.display().to_string(),
                        None => store.url_of(layout::IMATRIX_GGUF),
                    },
                    source,
                }
            })?;
        let imatrix_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let model_out = in_scratch(&args.out);
        let written = match split {
            None => slice_model(&base, &keep, &model_out).map(|s| vec![(model_out.clone(), s)]),
            Some(max) => make_model_split(&base, Some(&keep), None, &model_out, max),
        }
        .map_err(|e| StagesError::Slice {
            input: base.display().to_string(),
            source: e,
        })?;
        let files: Vec<(PathBuf, Sliced)> = written
            .into_iter()
            .map(|(p, s)| (out_dir.join(p.file_name().unwrap_or_default()), s))
            .collect();
        let finals: Vec<&Path> = files
            .iter()
            .map(|(p, _)| p.as_path())
            .chain([out_imatrix.as_path()])
            .collect();
        place(&finals, &in_scratch)?;
        let seconds = started.elapsed().as_secs_f64();
        let n_sliced = tensors_sliced(&base, &files[0].0)?;
        println!(
        "pruned {} with keep map {name} ({} of each MoE layer's experts kept, {} layers): {n_sliced} tensors sliced",
        base.display(),
        files[0].1.k,
        keep.layers.len()
    );
        for (path, sliced) in &files {
            println!("{}", describe("model", path, sliced, seconds));
        }
        println!(
            "{}",
            describe("imatrix", &out_imatrix, &sliced_imatrix, imatrix_seconds)
        );
        Ok(())
    })
}
