//! `coordinator ship RUN --candidates A,B --quant Q8_0,Q4_K_M --out DIR`
//! (DESIGN section 12): the files people serve. For each candidate (one of
//! the run's keep maps): the base model and the run's importance matrix
//! sliced to it (`<A>.gguf`, `<A>.imatrix.gguf`), then per quantisation type
//! the slice quantised by llama.cpp's own quantiser with that sliced
//! importance matrix (`<A>.<Q>.gguf`); beside each model file its card
//! ([`card`]: `<A>.<Q>.json`, `<A>.<Q>.md`). Files are created, never
//! replaced ([`files`]); `SHA256SUMS` records every file's SHA-256
//! (`sha256sum -c` checks it). A base model that is already quantised is refused before
//! anything is written, unless `--allow-requantize`.

pub mod card;
pub mod files;

use crate::run::local::worker_binary;
use anyhow::{bail, Context};
use card::ModelCard;
use clap::Args;
use common::artifacts::names;
use common::gguf_read::GgufReader;
use common::keepmap::KeepMap;
use common::prune::{slice_imatrix, slice_model, PruneError, Sliced};
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

/// A slice of a file to a keep map ([`slice_model`], [`slice_imatrix`]).
type Slicer = fn(&Path, &KeepMap, &Path) -> Result<Sliced, PruneError>;

/// One shipped file at its final name.
struct Shipped {
    name: String,
    placed: Placed,
}

/// A candidate: its keep map and the SHA-256 of the map's stored bytes.
struct Candidate {
    name: String,
    keep: KeepMap,
    sha256: String,
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

/// The run's keep maps `names`, its importance matrix and the base model.
async fn read_run(
    store: &RunStore,
    names: &[String],
    model: Option<&Path>,
) -> anyhow::Result<(Vec<Candidate>, bytes::Bytes, PathBuf)> {
    let mut candidates = Vec::with_capacity(names.len());
    for name in names {
        let object = KeepMap::object_name(name);
        let bytes = store
            .get(&object)
            .await
            .with_context(|| format!("reading keep map {name}"))?;
        let keep: KeepMap = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing keep map {}", store.url_of(&object)))?;
        candidates.push(Candidate {
            name: name.clone(),
            keep,
            sha256: common::hash::sha256_hex(&bytes),
        });
    }
    let imatrix = store
        .get(names::IMATRIX_GGUF)
        .await
        .context("reading the run's importance matrix")?;
    let base = crate::prune::base_model(store, model).await?;
    Ok((candidates, imatrix, base))
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
    let (candidates, imatrix, base) =
        rt.block_on(read_run(&store, &names, args.model.as_deref()))?;
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
    let base_ref = card::FileRef {
        file: base
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
        sha256: common::hash::sha256_file(&base)
            .with_context(|| format!("hashing base model {}", base.display()))?,
    };
    let stem = base_ref
        .file
        .strip_suffix(".gguf")
        .unwrap_or(&base_ref.file)
        .to_string();
    let ship = Ship {
        args: &args,
        base: &base,
        base_card: card::Base::of(&header, base_ref, &stem),
        out: OutDir::open(&args.out)?,
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
    };
    let run_imatrix = ship.out.scratch("run.imatrix.gguf");
    std::fs::write(&run_imatrix, &imatrix)
        .with_context(|| format!("writing {}", run_imatrix.display()))?;
    let mut shipped = Vec::new();
    for c in &candidates {
        let (model, im) = (
            format!("{}.gguf", c.name),
            format!("{}.imatrix.gguf", c.name),
        );
        let slices: [(&String, Slicer, &Path); 2] = [
            (&model, slice_model, &base),
            (&im, slice_imatrix, &run_imatrix),
        ];
        let mut sliced = Vec::with_capacity(2);
        for (file, slice, from) in slices {
            let placed = ship.out.place(file, |p| {
                slice(from, &c.keep, p)
                    .map(drop)
                    .map_err(|e| ShipError::File {
                        path: from.to_path_buf(),
                        reason: e.to_string(),
                    })
            })?;
            sliced.push(Shipped {
                name: file.clone(),
                placed,
            });
        }
        let cards = ship.card(c, &sliced[0], None)?;
        let imatrix = card::FileRef {
            file: im.clone(),
            sha256: sliced[1].placed.sha256.clone(),
        };
        shipped.extend(sliced.into_iter().chain(cards));
        let Some(worker) = &worker else { continue };
        for &q in &quants {
            let file = format!("{}.{q}.gguf", c.name);
            let placed = ship.out.place(&file, |p| {
                files::quantize(
                    worker,
                    &ship.out.path(&model),
                    &ship.out.path(&im),
                    q,
                    p,
                    ship.threads,
                    args.allow_requantize,
                )
            })?;
            let quantised = Shipped { name: file, placed };
            let quantisation = card::Quantisation {
                quant: q,
                imatrix: imatrix.clone(),
            };
            let cards = ship.card(c, &quantised, Some(quantisation))?;
            shipped.extend(std::iter::once(quantised).chain(cards));
        }
    }
    write_sums(&ship.out, &shipped)?;
    print(&base, &args.out, &shipped);
    Ok(ExitCode::SUCCESS)
}

/// What every file of one `coordinator ship` shares.
struct Ship<'a> {
    args: &'a ShipArgs,
    base: &'a Path,
    base_card: card::Base,
    out: OutDir,
    threads: u32,
}

impl Ship<'_> {
    /// Writes the card (`<stem>.json`, `<stem>.md`) of the model `file`
    /// made from candidate `c` with `quantisation`.
    fn card(
        &self,
        c: &Candidate,
        file: &Shipped,
        quantisation: Option<card::Quantisation>,
    ) -> anyhow::Result<Vec<Shipped>> {
        let header = GgufReader::open(self.out.path(&file.name))?.header;
        let quant = quantisation.as_ref().map(|q| q.quant);
        let card = ModelCard {
            file: card::FileRef {
                file: file.name.clone(),
                sha256: file.placed.sha256.clone(),
            },
            bytes: file.placed.bytes,
            base: self.base_card.clone(),
            keep_map: card::KeepMapRef {
                name: c.name.clone(),
                method: c.keep.method.clone(),
                k: c.keep.k,
                sha256: c.sha256.clone(),
                saliency_sha256: c.keep.saliency_sha256.clone(),
            },
            quantisation,
            tensor_types: card::tensor_types(&header),
            made_by: format!("moe-census {}", env!("CARGO_PKG_VERSION")),
            commands: self.commands(&c.name, quant),
        };
        let stem = file
            .name
            .strip_suffix(".gguf")
            .unwrap_or(&file.name)
            .to_string();
        let json = card.to_json();
        let markdown = card.to_markdown();
        let mut cards = Vec::with_capacity(2);
        for (name, bytes) in [
            (format!("{stem}.json"), json.as_slice()),
            (format!("{stem}.md"), markdown.as_bytes()),
        ] {
            let placed = self.out.place(&name, |p| {
                std::fs::write(p, bytes).map_err(|e| ShipError::File {
                    path: p.to_path_buf(),
                    reason: e.to_string(),
                })
            })?;
            cards.push(Shipped { name, placed });
        }
        Ok(cards)
    }

    /// The commands that make candidate `name` (quantised to `quant`) again:
    /// this ship of it alone, and the same steps by hand.
    fn commands(&self, name: &str, quant: Option<QuantType>) -> Vec<String> {
        let a = self.args;
        // Absolute, so the commands work from any directory.
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let run = match a.run.contains("://") {
            true => a.run.clone(),
            false => absolute(Path::new(&a.run)).display().to_string(),
        };
        let (base, out) = (absolute(self.base), absolute(&a.out));
        let (base, out) = (base.display(), out.display());
        let allow = if a.allow_requantize {
            " --allow-requantize"
        } else {
            ""
        };
        let q = quant.map_or(String::new(), |q| format!(" --quant {q}"));
        let mut c = vec![
            format!(
                "coordinator ship {run} --candidates {name}{q}{allow} --model {base} --out {out}"
            ),
            format!("# or step by step, in {out}:"),
            format!("coordinator prune {run} --keep-map {name} --model {base} --out {name}.gguf"),
        ];
        if let Some(q) = quant {
            c.push(format!("worker quantize --model {name}.gguf --imatrix {name}.imatrix.gguf --type {q} --out {name}.{q}.gguf{allow}"));
            c.push(format!("# the same quantisation with llama.cpp's tool: llama-quantize{allow} --imatrix {name}.imatrix.gguf {name}.gguf {name}.{q}.gguf {q}"));
        }
        c
    }
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
