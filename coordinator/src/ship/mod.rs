//! `coordinator ship` (DESIGN section 12): the files people serve. For each
//! candidate (a keep map, a lower top-k, or both) and quantisation type:
//! the candidate sliced from the base model, quantised by llama.cpp's own
//! quantiser with the importance matrix sliced the same way, every file
//! evaluated against the base model by the sharded evaluation (the
//! unquantised candidates and the quantised base model too, so each step's
//! cost shows), and described by a model card; then a summary table and a
//! plot of size against held-out KL. It runs after evaluation and reads
//! the run's keep maps, importance matrix, scores and corpus.
//!
//! - [`spec`]: candidate specs and the list of shipped files.
//! - [`make`]: making each file ([`files`]: create-only placement and
//!   `worker quantize`).
//! - [`facts`]: what a card says about the run; [`card`]: the card schema
//!   and its Markdown; [`summary`]: the table and the plot.
//! - [`settings`]: the `[ship]` config section; [`cli`]: `coordinator ship`.

pub mod card;
pub mod cli;
pub mod facts;
pub mod files;
pub mod make;
pub mod settings;
pub mod spec;
pub mod summary;

use crate::eval::{EvalOutcome, EvalRunError, EvalSetup};
use crate::run::runner::OnListen;
use crate::run::RunSetup;
use card::ModelCard;
use common::eval::EvalSummary;
use common::quant::{quantised_tensor, QuantType};
use common::store::StoreError;
use common::wire::{EvalCandidate, EvalJob};
use common::Split;
use make::{Inputs, Made, MapInput};
use spec::{Shipped, Spec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use summary::ShipSummary;

pub use settings::ShipSettings;

/// Errors of `coordinator ship`.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// Settings, run or base model unusable.
    #[error("{0}")]
    Setup(String),
    /// A file could not be made, read or placed.
    #[error("{}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The evaluation of the shipped files failed.
    #[error(transparent)]
    Eval(#[from] EvalRunError),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Everything [`ship`] needs.
#[derive(Clone, Debug)]
pub struct ShipSetup {
    /// The run, its base model and the settings its workers evaluate with.
    pub base: RunSetup,
    /// The candidates.
    pub candidates: Vec<Spec>,
    /// The quantisation types.
    pub quants: Vec<QuantType>,
    /// The output directory (local).
    pub out: PathBuf,
    /// Quantise a base model that is already quantised.
    pub allow_requantize: bool,
    /// Splits scored.
    pub splits: Vec<Split>,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
    /// The `worker` binary that quantises.
    pub worker: PathBuf,
    /// CPU threads of the quantiser.
    pub threads: u32,
}

/// What a ship did.
pub struct ShipOutcome {
    /// One card per shipped file, in ship order.
    pub cards: Vec<ModelCard>,
    /// The summary.
    pub summary: ShipSummary,
    /// Files made by this process.
    pub made: usize,
    /// Files reused from the output directory.
    pub reused: usize,
    /// The evaluation of the files.
    pub eval: EvalOutcome,
}

/// The base model's refusal to be quantised again: its first quantised
/// tensor, unless `allow` (llama-quantize's `--allow-requantize`).
fn check_requantize(base: &Path, header: &common::gguf_read::GgufHeader, quants: &[QuantType], allow: bool) -> Result<(), ShipError> {
    match (quants.is_empty() || allow, quantised_tensor(header)) {
        (false, Some((tensor, ty))) => Err(ShipError::Setup(format!(
            "base model {} is already quantised ({tensor} is {ty}): quantising it again compounds two rounding errors; pass --allow-requantize (or [ship] allow_requantize = true) to do it anyway",
            base.display()
        ))),
        _ => Ok(()),
    }
}

/// Makes (or reuses) every shipped file, evaluates them all against the
/// base model with the run's workers (`on_listen` starts local ones; not
/// called when every result is stored), writes each file's card and the
/// summary. The run location is locked during the evaluation.
pub async fn ship(setup: &ShipSetup, on_listen: impl OnListen) -> Result<ShipOutcome, ShipError> {
    let b = &setup.base;
    let store = &b.store;
    if setup.candidates.is_empty() && setup.quants.is_empty() {
        return Err(ShipError::Setup(
            "nothing to ship: give --candidates (and --quant), or a [ship] candidates list".into(),
        ));
    }
    let list = spec::shipped(&setup.candidates, &setup.quants).map_err(ShipError::Setup)?;
    let base_sha256 = crate::eval::check_base_model(store, &b.model_path).await?;
    let header = facts::header(&b.model_path)?;
    check_requantize(&b.model_path, &header, &setup.quants, setup.allow_requantize)?;
    let mut maps = BTreeMap::new();
    for name in setup.candidates.iter().filter_map(|c| c.keep_map.clone()) {
        if !maps.contains_key(&name) {
            let (keep, bytes) = crate::eval::candidates::read_keep_map(store, &name).await?;
            let sha256 = common::hash::sha256_hex(&bytes);
            maps.insert(name, MapInput { keep, sha256 });
        }
    }
    let imatrix = match setup.quants.is_empty() {
        true => None,
        false => store.get_opt(common::layout::IMATRIX_GGUF).await?,
    };
    let out = files::OutDir::open(&setup.out)?;
    let inputs = Inputs {
        base: &b.model_path,
        base_sha256: &base_sha256,
        maps: &maps,
        imatrix: imatrix.as_deref(),
        worker: &setup.worker,
        threads: setup.threads,
        allow_requantize: setup.allow_requantize,
    };
    let made = make::make_all(&out, &list, &inputs)?;
    let eval = evaluate(setup, &made, on_listen).await?;
    let cards = cards(setup, &header, &base_sha256, &made, &eval.summary).await?;
    for c in &cards {
        write_if_changed(&out.path(&format!("{}.json", c.name)), &c.to_json_bytes())?;
        write_if_changed(&out.path(&format!("{}.md", c.name)), c.to_markdown().as_bytes())?;
    }
    let summary = ShipSummary::of(&cards);
    write_if_changed(&out.path(summary::TABLE_MD), summary.table().as_bytes())?;
    write_if_changed(&out.path(summary::SUMMARY_JSON), &summary.to_json_bytes())?;
    let plot = summary
        .plot()
        .map_err(|e| ShipError::Setup(format!("{e:#}")))?;
    write_if_changed(&out.path(summary::PLOT_PNG), &plot)?;
    let reused = made.iter().filter(|m| m.placed.reused).count();
    Ok(ShipOutcome {
        made: made.len() - reused,
        reused,
        cards,
        summary,
        eval,
    })
}

/// Evaluates every shipped file against the base model: each worker makes
/// the files itself from their recipes and the run's inputs, and the
/// coordinator refuses a result whose file hash is not the shipped one.
async fn evaluate(setup: &ShipSetup, made: &[Made], on_listen: impl OnListen) -> Result<EvalOutcome, ShipError> {
    let candidates = made
        .iter()
        .map(|m| EvalCandidate {
            name: m.shipped.name.clone(),
            keep_map: m.shipped.spec.as_ref().and_then(Spec::keep_map_object),
            top_k: m.shipped.spec.as_ref().and_then(|s| s.top_k),
            quant: m.shipped.quant,
            sha256: m.placed.sha256.clone(),
        })
        .collect();
    let eval = EvalSetup {
        base: setup.base.clone(),
        job: EvalJob {
            candidates,
            skip_first: setup.skip_first,
            splits: setup.splits.clone(),
        },
        layout: common::layout::SHIP_EVAL,
    };
    Ok(crate::eval::evaluate(&eval, on_listen).await?)
}

/// One card per made file.
async fn cards(
    setup: &ShipSetup,
    header: &common::gguf_read::GgufHeader,
    base_sha256: &str,
    made: &[Made],
    eval: &EvalSummary,
) -> Result<Vec<ModelCard>, ShipError> {
    let b = &setup.base;
    let base = facts::base(&b.model_path, header, base_sha256)?;
    let corpus = facts::corpus(&b.store, &b.index).await?;
    let pruning = facts::pruning(&b.store).await?;
    made.iter()
        .map(|m| {
            let figures = eval
                .candidates
                .iter()
                .find(|c| c.name == m.shipped.name)
                .ok_or_else(|| ShipError::Setup(format!("the evaluation has no row for {}", m.shipped.name)))?;
            let keep = m.recipe.keep_map.as_ref();
            Ok(ModelCard {
                name: m.shipped.name.clone(),
                file: card::FileRef {
                    file: format!("{}.gguf", m.shipped.name),
                    sha256: m.placed.sha256.clone(),
                },
                bytes: m.placed.bytes,
                recipe: m.recipe.clone(),
                imatrix_tensors: m.imatrix_tensors,
                base: base.clone(),
                pruning: keep.and_then(|k| pruning.get(&k.name).cloned()),
                corpus: corpus.clone(),
                measured: card::Measured {
                    n_chunks: eval.n_chunks,
                    skip_first: eval.skip_first,
                    backends: eval.backends.clone(),
                    splits: figures.splits.clone(),
                },
                commands: commands(setup, &m.shipped),
            })
        })
        .collect()
}

/// The commands that make a file again: the `coordinator ship` call, and
/// the same steps by hand (in the output directory).
fn commands(setup: &ShipSetup, s: &Shipped) -> Vec<String> {
    let b = &setup.base;
    let (run, base, out) = (b.store.url(), b.model_path.display(), setup.out.display());
    let mut ship = format!("coordinator ship {run} --model {base} --out {out}");
    if let Some(c) = &s.spec {
        ship.push_str(&format!(" --candidates {}", c.name()));
    }
    if let Some(q) = s.quant {
        ship.push_str(&format!(" --quant {q}"));
    }
    if setup.allow_requantize {
        ship.push_str(" --allow-requantize");
    }
    let mut out_lines = vec![ship, format!("# or step by step, in {out}:")];
    if let Some(c) = &s.spec {
        match (&c.keep_map, c.top_k) {
            (Some(m), None) => out_lines.push(format!(
                "coordinator prune {run} --keep-map {m} --model {base} --out {}.gguf",
                c.name()
            )),
            _ => out_lines.push(format!(
                "# {}.gguf: only `coordinator ship` lowers expert_used_count (a metadata edit of {})",
                c.name(),
                c.keep_map.as_ref().map_or("the base model".into(), |m| format!("the {m} slice")),
            )),
        }
    }
    if let Some(q) = s.quant {
        let (src, im) = match &s.spec {
            None => (base.to_string(), make::BASE_IMATRIX.to_string()),
            Some(c) if c.keep_map.is_some() => (format!("{}.gguf", c.name()), format!("{}.imatrix.gguf", c.name())),
            Some(c) => (format!("{}.gguf", c.name()), make::BASE_IMATRIX.to_string()),
        };
        let requant = if setup.allow_requantize { " --allow-requantize" } else { "" };
        out_lines.push(format!(
            "worker quantize --model {src} --imatrix {im} --type {q} --out {}.gguf{requant}",
            s.name
        ));
        out_lines.push(format!(
            "# the same with llama.cpp's tool: llama-quantize{requant} --imatrix {im} {src} {}.gguf {q}",
            s.name
        ));
    }
    out_lines
}

/// Writes `bytes` to `path` unless it already holds them; a new version
/// replaces the old one only once complete (written beside it, renamed).
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), ShipError> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let err = |e: std::io::Error| ShipError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".ship-write-")
        .tempfile_in(dir)
        .map_err(err)?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
}

/// Prints what a ship did and its table.
pub fn print_outcome(setup: &ShipSetup, o: &ShipOutcome) {
    crate::eval::print_leases(&setup.base.store, &common::layout::SHIP_EVAL, &o.eval);
    println!(
        "shipped {} files to {} ({} made, {} reused), each with its card (<name>.json, <name>.md)",
        o.cards.len(),
        setup.out.display(),
        o.made,
        o.reused
    );
    print!("{}", o.summary.table());
    println!(
        "summary: {} ({}, {})",
        setup.out.join(summary::TABLE_MD).display(),
        summary::SUMMARY_JSON,
        summary::PLOT_PNG
    );
}
