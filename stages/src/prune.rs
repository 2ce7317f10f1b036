//! `coordinator prune`: a pruned GGUF and its importance matrix from one of
//! the run's keep maps (DESIGN section 12), sliced by [`common::prune`].

use anyhow::{bail, Context};
use clap::Args;
use common::artifacts::names;
use common::gguf_read::GgufReader;
use common::keepmap::KeepMap;
use common::prune::{slice_imatrix, slice_model, Sliced};
use common::store::RunStore;
use corpus::manifest::MANIFEST_FILE;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `coordinator prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {
    /// Run location holding `keep_maps/NAME.json` and `imatrix.gguf`.
    pub run: String,
    /// Keep map name under the run's `keep_maps/` (`reap_l2_sum_K8`).
    #[arg(long = "keep-map")]
    pub keep_map: String,
    /// Base model; default: the model named by the run's manifest.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The pruned model to write; its importance matrix goes next to it as
    /// `<stem>.imatrix.gguf`.
    #[arg(long)]
    pub out: PathBuf,
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
pub(crate) async fn base_model(store: &RunStore, model: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(m) = model {
        return Ok(m.to_path_buf());
    }
    let manifest = corpus::manifest::read(store)
        .await
        .with_context(|| format!("parsing {}", store.url_of(MANIFEST_FILE)))?
        .with_context(|| format!("{} is missing: pass --model", store.url_of(MANIFEST_FILE)))?;
    if let Some(recorded) = manifest.model_path.clone().filter(|p| p.is_file()) {
        return Ok(recorded);
    }
    let path = manifest
        .config()
        .ok()
        .map(|c| c.model.path)
        .filter(|p| !p.as_os_str().is_empty())
        .with_context(|| {
            format!(
                "{} names no model (config.model.path): pass --model",
                store.url_of(MANIFEST_FILE)
            )
        })?;
    if !path.is_absolute() || !path.is_file() {
        bail!(
            "{} names model {}, which is not an absolute path to an existing file: pass --model",
            store.url_of(MANIFEST_FILE),
            path.display()
        );
    }
    Ok(path)
}

/// Tensors whose shape differs between the base and the pruned file.
fn tensors_sliced(base: &Path, pruned: &Path) -> anyhow::Result<usize> {
    let base = GgufReader::open(base)?.header;
    let pruned = GgufReader::open(pruned)?.header;
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

/// Entry point of `coordinator prune`.
pub fn run(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let store = RunStore::open(&args.run)?;
    let name = common::layout::keep_map_name(&args.keep_map).to_string();
    let map_object = KeepMap::object_name(&name);
    let (map_bytes, imatrix_bytes, base) = rt.block_on(async {
        let map = store
            .get(&map_object)
            .await
            .context("reading the keep map")?;
        let imatrix = store
            .get(names::IMATRIX_GGUF)
            .await
            .context("reading the run's importance matrix")?;
        let base = base_model(&store, args.model.as_deref()).await?;
        anyhow::Ok((map, imatrix, base))
    })?;
    let keep: KeepMap = serde_json::from_slice(&map_bytes)
        .with_context(|| format!("parsing keep map {}", store.url_of(&map_object)))?;

    let out_imatrix = imatrix_path(&args.out);
    let mut run_imatrix = tempfile::Builder::new()
        .prefix(".run-imatrix")
        .suffix(".gguf")
        .tempfile_in(
            out_imatrix
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        )
        .context("creating a temporary file for the run's importance matrix")?;
    std::io::Write::write_all(&mut run_imatrix, &imatrix_bytes)
        .context("writing the run's importance matrix to a temporary file")?;
    let started = Instant::now();
    let sliced_imatrix = slice_imatrix(run_imatrix.path(), &keep, &out_imatrix)
        .with_context(|| format!("slicing {}", store.url_of(names::IMATRIX_GGUF)))?;
    let imatrix_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let sliced = match slice_model(&base, &keep, &args.out) {
        Ok(s) => s,
        Err(e) => {
            // The pair is written together or not at all.
            let _ = std::fs::remove_file(&out_imatrix);
            return Err(anyhow::Error::new(e).context(format!("slicing {}", base.display())));
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let n_sliced = tensors_sliced(&base, &args.out)?;
    println!(
        "pruned {} with keep map {name} ({} of each MoE layer's experts kept, {} layers): {n_sliced} tensors sliced",
        base.display(),
        sliced.k,
        keep.layers.len()
    );
    println!("{}", describe("model", &args.out, &sliced, seconds));
    println!(
        "{}",
        describe("imatrix", &out_imatrix, &sliced_imatrix, imatrix_seconds)
    );
    Ok(ExitCode::SUCCESS)
}
