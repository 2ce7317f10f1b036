//! The coordinator's log in an end-to-end test binary, captured as text so
//! tests can assert what it says about misbehaving peers (and that peers
//! cannot forge lines of it), and wait for what it says ([`wait_for_line`])
//! instead of sleeping.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The captured bytes, and a signal for every write.
#[derive(Default)]
struct Log {
    bytes: Mutex<Vec<u8>>,
    written: Condvar,
}

fn log() -> &'static Arc<Log> {
    static LOG: OnceLock<Arc<Log>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log: Arc<Log> = Arc::default();
        let sink = log.clone();
        // INFO and above, and the server's lease grants (DEBUG).
        let filter = tracing_subscriber::EnvFilter::new(
            "info,runtime::net::server=debug,runtime::net::lobby=debug",
        );
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(filter)
            .with_writer(move || Capture(sink.clone()))
            .init();
        log
    })
}

/// Installs the capturing subscriber (once per test binary): everything
/// logged at INFO and above from then on, and the coordinator's lease grants.
pub fn captured_log() {
    log();
}

/// The captured log so far, as (lossy) text.
pub fn log_text() -> String {
    String::from_utf8_lossy(&log().bytes.lock().unwrap()).into_owned()
}

/// Blocks until a line of the captured log satisfies `pred`, and returns
/// it; panics after `limit` (a bound on a hung run, not a race with it).
pub fn wait_for_line(limit: Duration, pred: impl Fn(&str) -> bool) -> String {
    let log = log();
    let end = Instant::now() + limit;
    let mut bytes = log.bytes.lock().unwrap();
    loop {
        let text = String::from_utf8_lossy(&bytes);
        if let Some(line) = text.lines().find(|l| pred(l)) {
            return line.to_string();
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no such line logged within {limit:?}:\n{text}"
        );
        bytes = log.written.wait_timeout(bytes, left).unwrap().0;
    }
}

struct Capture(Arc<Log>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.bytes.lock().unwrap().extend_from_slice(b);
        self.0.written.notify_all();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
