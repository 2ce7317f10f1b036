//! `worker`: thin binary over the worker library.

fn main() -> std::process::ExitCode {
    worker::cli::main()
}
