//! `coordinator merge`: combine partials exactly and write the run's results,
//! reading one partial at a time and adding it into the total straight from
//! its packed bytes.

use anyhow::{bail, Context};
use clap::Args;
use numbers::partial::{PackedPartial, Partial};
use runfiles::artifacts::write_results;
use runfiles::layout;
use runfiles::store::RunStore;
use std::process::ExitCode;

/// Arguments of `coordinator merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Run location that receives the merged artifacts.
    pub run: String,
    /// Partial files (paths or URLs); default: every `partials/*.bin` of RUN.
    #[arg(long = "partial")]
    pub partials: Vec<String>,
}

/// Reads one partial from a path or URL (its format checked, its
/// importance matrix left packed).
pub async fn read_partial(location: &str) -> anyhow::Result<PackedPartial> {
    let (dir, name) = location
        .rsplit_once('/')
        .map(|(d, n)| (if d.is_empty() { "/" } else { d }, n))
        .unwrap_or((".", location));
    let store = RunStore::open(dir)?;
    let bytes = store.get(name).await?;
    PackedPartial::parse(bytes).map_err(|e| anyhow::anyhow!("{}: {e}", store.url_of(name)))
}

/// Entry point of `coordinator merge`.
pub fn run(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let store = RunStore::open(&args.run)?;
        let locations = if args.partials.is_empty() {
            store
                .list(runfiles::layout::PARTIALS_DIR)
                .await?
                .into_iter()
                .filter(|n| n.ends_with(".bin") && n != layout::MERGED_PARTIAL)
                .map(|n| store.url_of(&n))
                .collect()
        } else {
            args.partials.clone()
        };
        // One partial's bytes in memory besides the running total; each is
        // added tensor by tensor on all cores (`PackedPartial::add_to`).
        let mut merged: Option<Partial> = None;
        for loc in &locations {
            let p = read_partial(loc)
                .await
                .with_context(|| format!("reading partial {loc}"))?;
            p.add_to(&mut merged)
                .with_context(|| format!("merging {loc}"))?;
        }
        let Some(merged) = merged else {
            bail!("no partials to merge");
        };
        store
            .put_parts(layout::MERGED_PARTIAL, merged.to_parts())
            .await?;
        let saliency = write_results(&store, &merged).await?;
        println!(
            "merged {} partials: {} chunks, {} fit tokens -> {}",
            locations.len(),
            merged.n_chunks(),
            saliency
                .split(numbers::Split::Fit)
                .map_or(0, |s| s.n_tokens),
            store.url()
        );
        Ok(ExitCode::SUCCESS)
    })
}
