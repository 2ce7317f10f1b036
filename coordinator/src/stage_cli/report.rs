//! `coordinator report RUN`: `report/report.md` with PNG plots
//! ([`stages::report`]).

use runfiles::store::RunStore;
use std::process::ExitCode;

/// Arguments of `coordinator report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Run location (path or URL).
    pub run: String,
}

/// Entry point of `coordinator report`.
pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let store = RunStore::open(&args.run)?;
    let out = super::async_runtime()?.block_on(stages::report::report(&store))?;
    println!(
        "wrote {} and {} plots under {}",
        out.markdown,
        out.plots.len(),
        args.run
    );
    for missing in &out.missing {
        println!("not in the report: {missing}");
    }
    if !out.verified {
        println!("warning: some invariants fail; see the verification section");
    }
    Ok(ExitCode::SUCCESS)
}
