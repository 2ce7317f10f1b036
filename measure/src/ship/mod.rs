//! `coordinator ship RUN --candidates A,B --quant Q8_0,Q4_K_M --out DIR`
//! (DESIGN section 12): the files people serve. A candidate ([`spec`]) is
//! a keep map of the run, the whole base model (`base`), either with
//! fewer experts routed per token (`_top<N>`), or a merge plan of the run.
//! For each: the base model made into it (`<A>.gguf`: sliced,
//! `expert_used_count` lowered, or merged) and the run's importance matrix
//! sliced (or merged) to it (`<A>.imatrix.gguf`),
//! then per quantisation type the model quantised by llama.cpp's own
//! quantiser with that importance matrix (`<A>.<Q>.gguf`). Every shipped
//! model file is then evaluated against the base model by the run's
//! evaluation pipeline ([`measure`], results under `ship/eval/`), and
//! beside it goes its card ([`card`]: `<A>.<Q>.json`, `<A>.<Q>.md`) with
//! those figures. Files are created, never replaced ([`files`]);
//! `SHA256SUMS` records every file's SHA-256 (`sha256sum -c` checks it).
//! With `--split-max-size`, a model file larger than that is shipped as
//! llama.cpp's `gguf-split` files instead (`<A>.<Q>-00001-of-0000N.gguf`,
//! ...), for hosts that cap a file's size; its card describes the model
//! as one file (what was evaluated) and lists the files. A
//! base model that is already quantised is refused before anything is
//! written, unless `--allow-requantize`. `coordinator run` ships the same
//! way at its end when its config has a `[ship]` section ([`config::ship`],
//! [`ship`] with the run's lock and workers).

pub mod card;
pub mod files;
pub mod measure;
pub mod spec;
pub mod sums;

use crate::MeasureError;
use card::ModelCard;
use files::{OutDir, Placed};
use gguf::quant::{check_requantize, QuantType};
use gguf::split::open_joined;
use runfiles::layout;
use runfiles::store::RunStore;
use runtime::run::local::worker_binary;
use slicer::{installed_codec, make_model, merge_imatrix, merge_model, slice_imatrix};
use spec::Candidate;
use stages::During;
use stages::StagesError;
use std::path::{Path, PathBuf};

/// Name of the checksum file in the output directory.
pub const SHA256SUMS: &str = "SHA256SUMS";

/// Errors of a ship: a candidate that cannot be shipped, or a shipped file
/// that cannot be made or measured.
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
    /// A candidate's name is unusable.
    #[error(transparent)]
    Candidate(#[from] config::candidate::CandidateError),
    /// The base model is a candidate but no quantisation type was given.
    #[error("candidate {}: the base model unquantised is the base model itself; give --quant to ship it quantised", config::candidate::BASE)]
    BaseUnquantised,
    /// The base model is already quantised and re-quantising it was not
    /// allowed (`--allow-requantize`).
    #[error("{reason}")]
    Quantised {
        /// Names the model, a quantised tensor and its type.
        reason: String,
    },
    /// A shipped model file has no figures in the evaluation of the shipped
    /// files.
    #[error("{file}: no figures in the evaluation of the shipped files")]
    Unmeasured {
        /// The file's name (`<stem>.gguf`).
        file: String,
    },
}

/// What one ship makes: from `coordinator ship`'s flags, or from `[ship]`
/// of the run config at the end of `coordinator run`.
#[derive(Clone, Debug)]
pub struct ShipRequest {
    /// Candidate names ([`spec`]).
    pub candidates: Vec<String>,
    /// Quantisation types; none ships the unquantised files only.
    pub quants: Vec<QuantType>,
    /// Output directory (local).
    pub out: PathBuf,
    /// Quantise a base model that is already quantised.
    pub allow_requantize: bool,
    /// Base model; `None`: the model named by the run's manifest.
    pub model: Option<PathBuf>,
    /// CPU threads of the quantiser; `None`: all cores.
    pub threads: Option<u32>,
    /// Model files larger than this are shipped split, as it was given
    /// (`48G`) and in bytes; `None`: one file each.
    pub split_max_size: Option<(String, u64)>,
}

/// One shipped file at its final name.
struct Shipped {
    name: String,
    placed: Placed,
}

/// A shipped model file: which candidate, how quantised.
struct ModelFile {
    /// The model as one file, under its name (`<A>.<Q>.gguf`).
    file: Shipped,
    /// The files it is shipped as: itself, or its split files in order.
    parts: Vec<Shipped>,
    candidate: usize,
    quantisation: Option<card::Quantisation>,
}

impl ModelFile {
    /// The model file `name` of candidate `candidate`, as placed.
    fn of(
        name: String,
        placed: files::PlacedModel,
        candidate: usize,
        quantisation: Option<card::Quantisation>,
    ) -> ModelFile {
        ModelFile {
            file: Shipped {
                name,
                placed: placed.whole,
            },
            parts: placed
                .files
                .into_iter()
                .map(|(name, placed)| Shipped { name, placed })
                .collect(),
            candidate,
            quantisation,
        }
    }
}

/// Ships `request` from the run `store`: makes (or finds) every file, then,
/// unless `evaluator` is `None`, evaluates every model file by it, then
/// writes the cards and `SHA256SUMS` and prints the files and the table.
/// Must run on a multi-threaded runtime: making the files blocks.
pub async fn ship(
    store: &RunStore,
    request: &ShipRequest,
    evaluator: Option<measure::Evaluator<'_>>,
) -> Result<(), MeasureError> {
    let quants = &request.quants;
    let names = spec::resolve_pareto(store, &request.candidates).await?;
    let candidates = spec::read(store, &names).await?;
    if candidates.iter().any(Candidate::is_base) && quants.is_empty() {
        return Err(ShipError::BaseUnquantised.into());
    }
    let imatrix = store
        .get(layout::IMATRIX_GGUF)
        .await
        .during("reading the run's importance matrix")?;
    let base = stages::prune::base_model(store, request.model.as_deref()).await?;
    let base = std::path::absolute(&base).unwrap_or(base);
    let (ship, models, mut shipped) =
        tokio::task::block_in_place(|| make(request, &base, &candidates, &imatrix))?;
    let summary = match evaluator {
        None => None,
        Some(how) => {
            let job = models
                .iter()
                .map(|m| {
                    measure::job_candidate(
                        &m.file.name,
                        &m.file.placed.sha256,
                        &candidates[m.candidate],
                        m.quantisation.as_ref().map(|q| q.quant),
                    )
                })
                .collect();
            let sizes = models
                .iter()
                .map(|m| {
                    let stem = m.file.name.strip_suffix(".gguf").unwrap_or(&m.file.name);
                    (stem.to_string(), m.file.placed.bytes)
                })
                .collect();
            Some(measure::measure(store, &base, job, sizes, how).await?)
        }
    };
    for m in &models {
        let measured = summary
            .as_ref()
            .map(|s| card::measured(s, &m.file.name))
            .transpose()?;
        let cards = ship.card(&candidates[m.candidate], m, measured)?;
        shipped.extend(cards);
    }
    let files: Vec<(String, u64)> = models
        .iter()
        .map(|m| (m.file.name.clone(), m.file.placed.bytes))
        .collect();
    shipped.extend(models.into_iter().flat_map(|m| m.parts));
    shipped.sort_by(|a, b| a.name.cmp(&b.name));
    write_sums(&ship.out, &shipped)?;
    print(&base, &request.out, &shipped);
    if let Some(s) = &summary {
        print!("{}", measure::table(&files, s));
    }
    Ok(())
}

/// Makes (or finds) every file of `request` from the base model `base`
/// and the run's importance matrix `imatrix`: the model files (in
/// candidate order, each candidate's unquantised file before its
/// quantisations) and the sliced importance matrices. A quantised base is
/// refused before anything is written, unless `allow_requantize`.
fn make<'a>(
    request: &'a ShipRequest,
    base: &'a Path,
    candidates: &[Candidate],
    imatrix: &[u8],
) -> Result<(Ship<'a>, Vec<ModelFile>, Vec<Shipped>), MeasureError> {
    let quants = &request.quants;
    // A split base is one model: every file's tensors are checked.
    let header = open_joined(base).during("reading the base model")?.header;
    for &q in quants {
        check_requantize(
            &header,
            &format!("base model {}", base.display()),
            q,
            request.allow_requantize,
        )
        .map_err(|reason| ShipError::Quantised { reason })?;
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
        sha256: gguf::hash::model_sha256(base)
            .map_err(StagesError::io("hashing base model", base))?,
    };
    let stem = base_ref
        .file
        .strip_suffix(".gguf")
        .unwrap_or(&base_ref.file)
        .to_string();
    let ship = Ship {
        request,
        base,
        base_card: card::Base::of(&header, base_ref, &stem),
        out: OutDir::open(&request.out)?,
        threads: request
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
    };
    // Under its own name (which a quantised file records, as eval's
    // workers do), in a folder clear of the candidates' files.
    let run_imatrix = ship.out.scratch("run").join(layout::IMATRIX_GGUF);
    std::fs::create_dir_all(ship.out.scratch("run"))
        .and_then(|()| std::fs::write(&run_imatrix, imatrix))
        .map_err(StagesError::io("writing", &run_imatrix))?;
    let run_imatrix_ref = card::FileRef {
        file: layout::IMATRIX_GGUF.to_string(),
        sha256: gguf::hash::sha256_hex(imatrix),
    };
    let mut shipped = Vec::new();
    let mut models: Vec<ModelFile> = Vec::new();
    let split = request.split_max_size.as_ref().map(|(_, bytes)| *bytes);
    for (ci, c) in candidates.iter().enumerate() {
        let model = format!("{}.gguf", c.name);
        // The candidate as one file while its quantisations are made.
        let mut made = None;
        if !c.is_base() {
            let placed = ship.out.place_model(&model, split, |p| {
                match &c.merge {
                    Some(plan) => merge_model(base, plan, installed_codec(), p),
                    None => make_model(base, c.keep.as_ref().map(|k| &k.map), c.experts_used, p),
                }
                .map(|sliced| Some(sliced.sha256))
                .map_err(|e| ShipError::File {
                    path: base.to_path_buf(),
                    reason: e.to_string(),
                })
            })?;
            made = Some(placed.path.clone());
            models.push(ModelFile::of(model.clone(), placed, ci, None));
        }
        let source = made.as_deref().unwrap_or(base);
        let (im_path, im_ref) = match &c.keep {
            Some(k) => {
                let im = format!("{}.imatrix.gguf", c.name);
                let placed = ship.out.place(&im, |p| {
                    match &c.merge {
                        Some(plan) => merge_imatrix(&run_imatrix, plan, p),
                        None => slice_imatrix(&run_imatrix, &k.map, p),
                    }
                    .map(drop)
                    .map_err(|e| ShipError::File {
                        path: run_imatrix.clone(),
                        reason: e.to_string(),
                    })
                })?;
                let im_ref = card::FileRef {
                    file: im.clone(),
                    sha256: placed.sha256.clone(),
                };
                shipped.push(Shipped {
                    name: im.clone(),
                    placed,
                });
                (ship.out.path(&im), im_ref)
            }
            None => (run_imatrix.clone(), run_imatrix_ref.clone()),
        };
        for &q in quants {
            let Some(worker) = &worker else { break };
            let file = format!("{}.{q}.gguf", c.name);
            let placed = ship.out.place_model(&file, split, |p| {
                files::quantize(
                    worker,
                    source,
                    &im_path,
                    q,
                    p,
                    ship.threads,
                    request.allow_requantize,
                )
                .map(|()| None)
            })?;
            ship.out.forget(&placed.path)?;
            let quantisation = card::Quantisation {
                quant: q,
                imatrix: im_ref.clone(),
            };
            models.push(ModelFile::of(file, placed, ci, Some(quantisation)));
        }
        if let Some(made) = &made {
            ship.out.forget(made)?;
        }
    }
    Ok((ship, models, shipped))
}

/// What every file of one `coordinator ship` shares.
struct Ship<'a> {
    request: &'a ShipRequest,
    base: &'a Path,
    base_card: card::Base,
    out: OutDir,
    threads: u32,
}

impl Ship<'_> {
    /// Writes the card (`<stem>.json`, `<stem>.md`) of the model file `m`
    /// made from candidate `c`, with its figures when it was evaluated.
    fn card(
        &self,
        c: &Candidate,
        m: &ModelFile,
        measured: Option<card::Measured>,
    ) -> Result<Vec<Shipped>, MeasureError> {
        let file = &m.file;
        // A split file's tensors are in all its files.
        let header = open_joined(&self.out.path(&m.parts[0].name))?.header;
        let quant = m.quantisation.as_ref().map(|q| q.quant);
        let card = ModelCard {
            file: card::FileRef {
                file: file.name.clone(),
                sha256: file.placed.sha256.clone(),
            },
            bytes: file.placed.bytes,
            split_files: match m.parts.len() {
                1 => Vec::new(),
                _ => m.parts.iter().map(card::SplitFile::of).collect(),
            },
            base: self.base_card.clone(),
            keep_map: c
                .keep
                .as_ref()
                .filter(|_| c.merge.is_none())
                .map(|k| card::KeepMapRef {
                    name: k.name.clone(),
                    method: k.map.method.clone(),
                    k: k.map.k,
                    sha256: k.sha256.clone(),
                    saliency_sha256: k.map.saliency_sha256.clone(),
                }),
            merge: c
                .merge
                .as_ref()
                .zip(c.keep.as_ref())
                .map(|(plan, k)| card::MergeRef::of(plan, &k.sha256, self.base_card.n_expert)),
            experts_used: c.experts_used,
            quantisation: m.quantisation.clone(),
            tensor_types: card::tensor_types(&header),
            made_by: format!("moe-census {}", env!("CARGO_PKG_VERSION")),
            commands: self.commands(c, quant),
            measured,
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

    /// The commands that make candidate `c` (quantised to `quant`) again:
    /// this ship of it alone, and, for a keep map's slice (not a merge),
    /// the same steps by hand. A card is published, so they name no local path: `RUN` is the
    /// run's location, `OUT` the output directory, and the base model is
    /// named by its file name (the card gives its SHA-256).
    fn commands(&self, c: &Candidate, quant: Option<QuantType>) -> Vec<String> {
        let a = self.request;
        let name = &c.name;
        let base = self.base.file_name().map_or_else(
            || "BASE.gguf".to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let (run, out) = ("RUN", "OUT");
        let allow = if a.allow_requantize {
            " --allow-requantize"
        } else {
            ""
        };
        let q = quant.map_or(String::new(), |q| format!(" --quant {q}"));
        let split = a
            .split_max_size
            .as_ref()
            .map_or(String::new(), |(text, _)| {
                format!(" --split-max-size {text}")
            });
        let mut cmds = vec![
            format!("# RUN: the run's location; OUT: an output directory; {base}: the base model above"),
            format!(
                "coordinator ship {run} --candidates {name}{q}{allow}{split} --model {base} --out {out}"
            ),
        ];
        // `coordinator prune` slices keep maps; a merged model is made by
        // ship alone.
        if c.keep.is_none() || c.experts_used.is_some() || c.merge.is_some() {
            return cmds;
        }
        cmds.push(format!("# or step by step, in {out}:"));
        cmds.push(format!(
            "coordinator prune {run} --keep-map {name} --model {base} --out {name}.gguf"
        ));
        if let Some(q) = quant {
            cmds.push(format!("worker quantize --model {name}.gguf --imatrix {name}.imatrix.gguf --type {q} --out {name}.{q}.gguf{allow}"));
            cmds.push(format!("# the same quantisation with llama.cpp's tool: llama-quantize{allow} --imatrix {name}.imatrix.gguf {name}.gguf {name}.{q}.gguf {q}"));
        }
        if let Some((size, _)) = &a.split_max_size {
            let stem = match quant {
                Some(q) => format!("{name}.{q}"),
                None => name.clone(),
            };
            cmds.push(format!("# split as shipped (the same layout; ship's files are its own): llama-gguf-split --split --split-max-size {size} {stem}.gguf {stem}"));
        }
        cmds
    }
}

/// Writes `SHA256SUMS` (`sha256sum`'s format, sorted by name), merged by
/// name with the one already there ([`sums::merge`]: other files' lines are
/// kept); the merged list replaces the old one only once complete.
fn write_sums(out: &OutDir, shipped: &[Shipped]) -> Result<(), MeasureError> {
    let path = out.path(SHA256SUMS);
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(StagesError::io("reading", &path)(e).into()),
    };
    let ours: Vec<(String, String)> = shipped
        .iter()
        .map(|s| (s.placed.sha256.clone(), s.name.clone()))
        .collect();
    let tmp = out.scratch(SHA256SUMS);
    std::fs::write(&tmp, sums::merge(&existing, &ours))
        .map_err(StagesError::io("writing", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(StagesError::io("writing", &path))?;
    Ok(())
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
