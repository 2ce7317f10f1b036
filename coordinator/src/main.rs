//! `coordinator`: thin binary over the coordinator library.

fn main() -> std::process::ExitCode {
    coordinator::cli::main()
}
