//! This process's CPU time and peak memory from `/proc` (Linux), for the
//! bench binaries of every crate: one reader instead of one per binary.

/// User + system CPU seconds of this process so far, all threads
/// (`/proc/self/stat` fields 14 and 15, in clock ticks of 1/100 s): on a
/// loaded machine the wall clock says more about the other processes.
pub fn process_cpu_seconds() -> std::io::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected /proc/self/stat: {stat}"),
        )
    };
    // The command name (field 2) may hold spaces; fields after it are plain.
    let rest = stat.rsplit_once(')').ok_or_else(bad)?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, so utime (14) is index 11.
    let ticks = |i: usize| -> std::io::Result<f64> {
        fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(bad)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// Peak resident set size of this process so far (`VmHWM` of
/// `/proc/self/status`), KiB; `None` where it cannot be read.
pub fn peak_rss_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let cpu = process_cpu_seconds().unwrap();
        assert!(cpu >= 0.0);
        let kib = peak_rss_kib().expect("VmHWM on Linux");
        assert!(kib > 0);
    }
}
