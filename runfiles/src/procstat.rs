//! A process's CPU time, peak memory and start time from `/proc` (Linux):
//! for the bench binaries of every crate, and for telling a live lock
//! holder from a dead one.

/// The numeric fields of `/proc/<pid>/stat` after the command name, as
/// text: index 0 is field 3 (the state).
fn stat_fields(pid: &str) -> std::io::Result<Vec<String>> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path)?;
    // The command name (field 2) may hold spaces; fields after it are plain.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected {path}: {stat}"),
        )
    })?;
    Ok(rest.split_whitespace().map(str::to_string).collect())
}

/// Field `n` (1-based, as `man proc` counts) of a stat line's fields.
fn field(fields: &[String], n: usize) -> std::io::Result<u64> {
    fields
        .get(n - 3)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc stat without field {n}"),
            )
        })
}

/// User + system CPU seconds of this process so far, all threads
/// (`/proc/self/stat` fields 14 and 15, in clock ticks of 1/100 s): on a
/// loaded machine the wall clock says more about the other processes.
pub fn process_cpu_seconds() -> std::io::Result<f64> {
    let fields = stat_fields("self")?;
    Ok((field(&fields, 14)? + field(&fields, 15)?) as f64 / 100.0)
}

/// When process `pid` started, in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`); `None` when no such process runs. With the pid it
/// names one process for the life of the machine: a recycled pid has
/// another start time.
pub fn start_ticks(pid: u32) -> Option<u64> {
    field(&stat_fields(&pid.to_string()).ok()?, 22).ok()
}

/// [`start_ticks`] of this process.
pub fn own_start_ticks() -> Option<u64> {
    field(&stat_fields("self").ok()?, 22).ok()
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
        let me = own_start_ticks().expect("our own start time");
        assert_eq!(start_ticks(std::process::id()), Some(me));
        assert_eq!(start_ticks(u32::MAX), None, "no such process");
    }
}
