//! `coordinator`: thin binary over the coordinator library.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    coordinator::cli::main()
}
