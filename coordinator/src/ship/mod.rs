//! `coordinator ship RUN --candidates A,B --quant Q8_0,Q4_K_M --out DIR`
//! (DESIGN section 12): the files people serve. For each candidate (one of
//! the run's keep maps): the base model and the run's importance matrix
//! sliced to it (`<A>.gguf`, `<A>.imatrix.gguf`), then per quantisation type
//! the slice quantised by llama.cpp's own quantiser with that sliced
//! importance matrix (`<A>.<Q>.gguf`). Files are created, never replaced
//! ([`files`]); `SHA256SUMS` records every file's SHA-256 (`sha256sum -c`
//! checks it). A base model that is already quantised is refused before
//! anything is written, unless `--allow-requantize`.

pub mod files;

use crate::run::local::worker_binary;
use anyhow::{bail, Context};
use clap::Args;
use common::artifacts::names;
use common::gguf_read::GgufReader;
use common::keepmap::KeepMap;
use common::prune::{slice_imatrix, slice_model};
use common::quant::{check_requantize, QuantType};
use common::store::RunStore;
use files::{OutDir, Placed};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Name of the checksum file in the output directory.
pub const SHA256SUMS: &str = "SHA256SUMS";

/// Errors of making a shipped file.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// A file could not be made, read or placed.
    #[error("{}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Arguments of `coordinator ship`.
#[derive(Args, Debug)]
pub struct ShipArgs {
    /// Run location (path or URL) holding `keep_maps/` and `imatrix.gguf`.
    pub run: String,
    /// Keep map names under the run's `keep_maps/`, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub candidates: Vec<String>,
    /// Quantisation types, comma-separated (llama-quantize's names: Q8_0,
    /// Q4_K_M, ...); none ships the unquantised slices only.
    #[arg(long, value_delimiter = ',')]
    pub quant: Vec<String>,
    /// Output directory (local) for the files and `SHA256SUMS`.
    #[arg(long)]
    pub out: PathBuf,
    /// Quantise a base model that is already quantised.
    #[arg(long)]
    pub allow_requantize: bool,
    /// Base model; default: the model named by the run's manifest.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads of the quantiser (default: all cores).
    #[arg(long)]
    pub threads: Option<u32>,
}

/// One shipped file at its final name.
struct Shipped {
    name: String,
    placed: Placed,
}

/// A candidate name usable as a file name: letters, digits, `_`, `-`, `.`,
/// not starting with a dot.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        bail!("candidate {name:?}: a keep map name of letters, digits, '_', '-' and '.' is expected (it names the shipped files)");
    }
    Ok(())
}

/// Entry point of `coordinator ship`.
pub fn run(args: ShipArgs) -> anyhow::Result<ExitCode> {
    let quants = args
        .quant
        .iter()
        .map(|q| QuantType::parse(q).map_err(|e| anyhow::anyhow!("--quant: {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<String> = args
        .candidates
        .iter()
        .map(|c| common::layout::keep_map_name(c.trim()).to_string())
        .collect();
    for n in &names {
        check_name(n)?;
    }
    let store = RunStore::open(&args.run)?;
    let rt = tokio::runtime::Runtime::new()?;
    let (maps, imatrix, base) = rt.block_on(async {
        let mut maps = Vec::with_capacity(names.len());
        for n in &names {
            let object = KeepMap::object_name(n);
            let bytes = store
                .get(&object)
                .await
                .with_context(|| format!("reading keep map {n}"))?;
            let keep: KeepMap = serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing keep map {}", store.url_of(&object)))?;
            maps.push(keep);
        }
        let imatrix = store
            .get(names::IMATRIX_GGUF)
            .await
            .context("reading the run's importance matrix")?;
        let base = crate::prune::base_model(&store, args.model.as_deref()).await?;
        anyhow::Ok((maps, imatrix, base))
    })?;
    let header = GgufReader::open(&base)
        .with_context(|| format!("reading base model {}", base.display()))?
        .header;
    for &q in &quants {
        check_requantize(
            &header,
            &format!("base model {}", base.display()),
            q,
            args.allow_requantize,
        )
        .map_err(anyhow::Error::msg)?;
    }
    let worker = match quants.is_empty() {
        true => None,
        false => Some(worker_binary()?),
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    let out = OutDir::open(&args.out)?;
    let run_imatrix = out.scratch("run.imatrix.gguf");
    std::fs::write(&run_imatrix, &imatrix)
        .with_context(|| format!("writing {}", run_imatrix.display()))?;
    let slice_err = |path: &Path| {
        let path = path.to_path_buf();
        move |e: common::prune::PruneError| ShipError::File {
            path,
            reason: e.to_string(),
        }
    };
    let mut shipped = Vec::new();
    for (name, keep) in names.iter().zip(&maps) {
        let model = format!("{name}.gguf");
        let placed = out.place(&model, |p| {
            slice_model(&base, keep, p).map(drop).map_err(slice_err(&base))
        })?;
        shipped.push(Shipped {
            name: model.clone(),
            placed,
        });
        let im = format!("{name}.imatrix.gguf");
        let placed = out.place(&im, |p| {
            slice_imatrix(&run_imatrix, keep, p)
                .map(drop)
                .map_err(slice_err(&run_imatrix))
        })?;
        shipped.push(Shipped {
            name: im.clone(),
            placed,
        });
        let Some(worker) = &worker else { continue };
        for &q in &quants {
            let file = format!("{name}.{q}.gguf");
            let placed = out.place(&file, |p| {
                files::quantize(
                    worker,
                    &out.path(&model),
                    &out.path(&im),
                    q,
                    p,
                    threads,
                    args.allow_requantize,
                )
            })?;
            shipped.push(Shipped {
                name: file,
                placed,
            });
        }
    }
    write_sums(&out, &shipped)?;
    print(&base, &args.out, &shipped);
    Ok(ExitCode::SUCCESS)
}

/// Writes `SHA256SUMS` (`sha256sum`'s format, sorted by name); a changed
/// list replaces the old one only once complete.
fn write_sums(out: &OutDir, shipped: &[Shipped]) -> anyhow::Result<()> {
    let mut lines: Vec<String> = shipped
        .iter()
        .map(|s| format!("{}  {}\n", s.placed.sha256, s.name))
        .collect();
    lines.sort();
    let tmp = out.scratch(SHA256SUMS);
    std::fs::write(&tmp, lines.concat()).with_context(|| format!("writing {}", tmp.display()))?;
    let path = out.path(SHA256SUMS);
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// Prints one line per file: name, size, SHA-256, made or reused.
fn print(base: &Path, dir: &Path, shipped: &[Shipped]) {
    let reused = shipped.iter().filter(|s| s.placed.reused).count();
    println!(
        "shipped {} files from {} to {} ({} made, {reused} reused; SHA-256 in {SHA256SUMS})",
        shipped.len(),
        base.display(),
        dir.display(),
        shipped.len() - reused,
    );
    for s in shipped {
        let how = if s.placed.reused { "reused" } else { "made" };
        println!(
            "  {}: {} bytes, sha256 {}, {how}",
            s.name, s.placed.bytes, s.placed.sha256
        );
    }
}
