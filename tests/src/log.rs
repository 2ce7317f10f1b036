//! The coordinator's log in an end-to-end test binary, captured as text so
//! tests can assert what it says about misbehaving peers (and that peers
//! cannot forge lines of it).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// Everything logged at INFO and above in this test binary since the first
/// call, which installs the capturing subscriber.
pub fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Capture(sink.clone()))
            .init();
        buf
    })
    .clone()
}

/// The captured log so far, as (lossy) text.
pub fn log_text() -> String {
    String::from_utf8_lossy(&captured_log().lock().unwrap()).into_owned()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
