//! Stopping `worker join` on a signal, as a cluster's scheduler does it
//! (Slurm's `scancel`, a pod's termination, Ctrl-C): the first SIGINT or
//! SIGTERM lets the lease being computed finish and its result ship, then
//! the worker leaves; a second one stops it at once.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first signal.
static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Whether a signal asked this worker to stop after its current lease.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Watches for SIGINT and SIGTERM on the current runtime.
pub fn watch() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        for n in 0.. {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if n == 0 {
                tracing::warn!(
                    "{name}: stopping after the current lease (another signal stops at once)"
                );
                REQUESTED.store(true, Ordering::SeqCst);
            } else {
                tracing::warn!("{name} again: stopping now; the coordinator gives this worker's leases to others");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}
