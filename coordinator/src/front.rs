//! What both binaries, `coordinator` and `worker`, do around their command:
//! log to stderr, and print a failure with its causes.

use runfiles::error_text::with_causes;
use std::process::ExitCode;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), in colour when
/// [`runfiles::layout::env::log_colour`] says so.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(runfiles::layout::env::log_colour())
        .init();
}

/// Prints `error: ` and the error with each cause it does not already say;
/// the failure exit code.
pub fn failed(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("error: {}", with_causes(e));
    ExitCode::FAILURE
}
