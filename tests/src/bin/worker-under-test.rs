//! The `worker` command line, built by this package so that its end-to-end
//! tests run a binary Cargo has just built (`CARGO_BIN_EXE_worker-under-test`).

fn main() -> std::process::ExitCode {
    coordinator::worker_cli::main()
}
