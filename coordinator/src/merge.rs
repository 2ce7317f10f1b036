//! `coordinator merge`: combine partials exactly and write the run's results.

use anyhow::{bail, Context};
use clap::Args;
use common::artifacts::{names, write_results};
use common::partial::Partial;
use common::store::RunStore;
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

/// Reads one partial from a path or URL.
pub async fn read_partial(location: &str) -> anyhow::Result<Partial> {
    let (dir, name) = location
        .rsplit_once('/')
        .map(|(d, n)| (if d.is_empty() { "/" } else { d }, n))
        .unwrap_or((".", location));
    let store = RunStore::open(dir)?;
    let bytes = store.get(name).await?;
    Partial::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", store.url_of(name)))
}

/// Merges partials in the order given; the result does not depend on it.
pub fn merge_all(parts: &[Partial]) -> anyhow::Result<Partial> {
    let Some((first, rest)) = parts.split_first() else {
        bail!("no partials to merge");
    };
    let mut merged = first.clone();
    for p in rest {
        merged.merge(p)?;
    }
    Ok(merged)
}

/// Entry point of `coordinator merge`.
pub fn run(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let store = RunStore::open(&args.run)?;
        let locations = if args.partials.is_empty() {
            store
                .list(common::artifacts::names::PARTIALS_DIR)
                .await?
                .into_iter()
                .filter(|n| n.ends_with(".bin") && n != names::MERGED_PARTIAL)
                .map(|n| store.url_of(&n))
                .collect()
        } else {
            args.partials.clone()
        };
        let mut parts = Vec::new();
        for loc in &locations {
            parts.push(
                read_partial(loc)
                    .await
                    .with_context(|| format!("reading partial {loc}"))?,
            );
        }
        let merged = merge_all(&parts)?;
        store.put(names::MERGED_PARTIAL, merged.to_bytes()).await?;
        let saliency = write_results(&store, &merged).await?;
        println!(
            "merged {} partials: {} chunks, {} fit tokens -> {}",
            parts.len(),
            merged.n_chunks(),
            saliency.split(common::Split::Fit).map_or(0, |s| s.n_tokens),
            store.url()
        );
        Ok(ExitCode::SUCCESS)
    })
}
