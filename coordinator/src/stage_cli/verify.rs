//! `coordinator verify RUN [--json FILE]`: every invariant of the run's
//! results ([`stages::verify`]); exit 0 only if all hold.

use anyhow::Context;
use runfiles::store::RunStore;
use std::process::ExitCode;

/// Arguments of `coordinator verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Run location (path or URL).
    pub run: String,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Entry point of `coordinator verify`.
pub fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let store = RunStore::open(&args.run)?;
    let report = super::async_runtime()?.block_on(stages::verify::verify(&store))?;
    print!("{report}");
    if let Some(path) = &args.json {
        let json = stages::StagesError::encode_json("the verify report", &report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report.exit_code())
}
