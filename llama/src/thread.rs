//! Scheduling priority of threads that work beside ggml's compute threads.

/// Gives the calling thread the lowest scheduling priority (nice 19; Linux
/// keeps nice values per thread). The fold should run on idle cores and
/// never take one from ggml's compute threads, which spin at their barriers
/// and all stall when one of them is preempted; where no core is idle, the
/// fold runs while the decoding thread waits for it at the next hand-over.
pub fn yield_to_compute_threads() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread; a failure only leaves
    // the priority unchanged.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}
