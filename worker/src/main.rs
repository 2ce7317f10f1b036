//! `worker`: thin binary over the worker library.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    worker::cli::main()
}
