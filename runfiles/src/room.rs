//! Room on this machine before something large is written or loaded: the
//! bytes free for an unprivileged user on a directory's file system, and
//! the memory the kernel says is available (`MemAvailable`), so that a
//! worker refuses a write that cannot fit with a clear error instead of
//! failing half way, and sizes its evaluation from its free memory.

use std::path::Path;

/// Bytes an unprivileged user may still write on the file system of `dir`.
#[cfg(target_os = "linux")]
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Bytes an unprivileged user may still write on the file system of `dir`
/// (not measured off Linux: no limit).
#[cfg(not(target_os = "linux"))]
pub fn free_bytes(_dir: &Path) -> std::io::Result<u64> {
    Ok(u64::MAX)
}

/// Checks that `dir` has room for `needed` bytes of `what` before they are
/// written; the error names the directory, both sizes and what to do.
pub fn check_room(dir: &Path, needed: u64, what: &str) -> Result<(), String> {
    let free = free_bytes(dir).map_err(|e| format!("scratch directory {}: {e}", dir.display()))?;
    if needed > free {
        return Err(format!(
            "scratch directory {}: {what} needs {} but only {} is free \
             (point the scratch directory at a larger disk)",
            dir.display(),
            human(needed),
            human(free)
        ));
    }
    Ok(())
}

/// The host memory the kernel can give without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where it cannot be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_available(&text)
}

fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let kib = l.strip_prefix("MemAvailable:")?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok()?.checked_mul(1024)
    })
}

/// `bytes` as a person reads them (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{v:.1} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_from_meminfo() {
        let text = "MemTotal:       32000000 kB\nMemFree: 100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_write_larger_than_the_free_space_is_refused_naming_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        check_room(dir.path(), 1, "a test file").unwrap();
        let err = check_room(dir.path(), u64::MAX, "the base logits").unwrap_err();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(
            err.contains("the base logits needs 16777216.0 TiB"),
            "{err}"
        );
        let missing = dir.path().join("nope");
        assert!(check_room(&missing, 1, "x").unwrap_err().contains("nope"));
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(12), "12 B");
    }
}
