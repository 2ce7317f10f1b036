//! `coordinator run` as a batch job runs it, its log written to a file: a
//! progress line every `[run] progress_interval_s` (leases and tokens done
//! of the total, rate, ETA, workers) in plain text, no terminal escape
//! codes; SIGTERM stops it within seconds, with every local worker process
//! gone, its lock released and a word on what it did; and the same command
//! resumes the run from what was stored.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Generous bound on anything a test waits for (a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(300);

/// A run config in `dir` over `docs` short documents (64-token chunks, two
/// a lease) with the tiny model and a progress line every second.
fn config(dir: &Path, docs: usize) -> std::path::PathBuf {
    fixtures::model(dir, synth::Preset::Tiny);
    fixtures::numbered_docs(dir, docs);
    fixtures::docs_config(
        dir,
        "batch.toml",
        64,
        "[run]\nlease_chunks = 2\nprogress_interval_s = 1\n",
    )
}

/// The pids of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // pid (comm) state ppid ...: comm may hold spaces.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Seconds since midnight of a log line's RFC 3339 timestamp (its first
/// word, `2026-01-01T12:34:56.789Z`).
fn seconds_of(line: &str) -> f64 {
    let stamp = line.split_whitespace().next().unwrap_or("");
    let time = stamp
        .split_once('T')
        .map(|(_, t)| t.trim_end_matches('Z'))
        .unwrap_or_else(|| panic!("no timestamp: {line}"));
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

#[test]
fn a_logged_run_shows_progress_and_sigterm_stops_it_resumably() {
    let d = tempfile::tempdir().unwrap();
    // Long enough that collection outlasts three progress lines on an idle
    // machine (1,600 documents were collected in under 3 s there).
    let config = config(d.path(), 6400);
    let run = d.path().join("run");
    let log_path = d.path().join("coordinator.log");
    let args = fixtures::run_args(&config, 2, &run);
    let mut coordinator = fixtures::command("coordinator")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(d.path().join("coordinator.out")).unwrap())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let pid = coordinator.id();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let progress = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("collection: ") && l.contains(" leases, "))
            .map(String::from)
            .collect()
    };
    let start = Instant::now();
    while progress(&log()).len() < 3 {
        assert!(
            coordinator.try_wait().unwrap().is_none() && start.elapsed() < DEADLINE,
            "no three progress lines while collecting:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let workers = children_of(pid);
    assert_eq!(workers.len(), 2, "two local workers: {workers:?}");

    let signalled = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let status = loop {
        if let Some(s) = coordinator.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "still running 10 s after SIGTERM:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    while workers
        .iter()
        .any(|w| Path::new(&format!("/proc/{w}")).exists())
    {
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "local workers {workers:?} still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "FIGURE sigterm: coordinator and its local workers gone {:?} after the signal",
        signalled.elapsed()
    );
    let text = log();
    assert_eq!(status.code(), Some(143), "{text}");
    assert!(
        text.contains("SIGTERM: stopping the run") && text.contains("released"),
        "the coordinator says what it does:\n{text}"
    );
    assert!(!run.join("run.lock").exists(), "the lock is released");
    assert!(
        !run.join("saliency.json").exists(),
        "stopped before the end"
    );

    // The log file: plain text, progress lines with done/total, tokens,
    // rate, ETA and workers, never more than 30 s apart.
    assert!(
        !text.contains('\x1b'),
        "escape codes in a log file:\n{text}"
    );
    let lines = progress(&text);
    let total = lines[0]
        .split(" leases, ")
        .next()
        .and_then(|s| s.rsplit_once('/'))
        .map(|(_, t)| t.to_string())
        .unwrap();
    for line in &lines {
        assert!(
            line.contains(&format!("/{total} leases, "))
                && line.contains(" tokens/s, ETA ")
                && line.contains(" workers"),
            "{line}"
        );
    }
    for pair in lines.windows(2) {
        let gap = seconds_of(&pair[1]) - seconds_of(&pair[0]);
        assert!(
            (0.0..=30.0).contains(&gap),
            "{gap} s between\n{}\n{}",
            pair[0],
            pair[1]
        );
    }

    // The same command resumes.
    let o = fixtures::run(
        "coordinator",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    let reused: usize = stdout
        .split(" leases (")
        .nth(1)
        .and_then(|s| s.split(" reused").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(reused > 0, "{stdout}");
    assert!(stdout.contains("run complete"), "{stdout}");
}
