//! `worker`: thin binary over the worker's command line
//! ([`coordinator::worker_cli`]).

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    coordinator::worker_cli::main()
}
