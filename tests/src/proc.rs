//! Processes a test starts (a coordinator, `worker join`s, a stand-in
//! `srun`), killed when the test ends however it ends, with what they
//! print captured as it arrives.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A process this test started, killed when the test ends however it ends,
/// with its stderr lines (and when each arrived) and its stdout.
pub struct Proc {
    /// The process.
    pub child: Child,
    stderr: Arc<Mutex<Vec<(Instant, String)>>>,
    /// Its stdout so far.
    pub stdout: Arc<Mutex<String>>,
}

impl Proc {
    /// Starts `cmd` with stdin closed and its output captured.
    pub fn spawn(mut cmd: std::process::Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let stdout: Arc<Mutex<String>> = Arc::default();
        let (err, out) = (stderr.clone(), stdout.clone());
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                err.lock().unwrap().push((Instant::now(), line));
            }
        });
        let mut pipe = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Proc {
            child,
            stderr,
            stdout,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it `sig` (as `kill` spells it: `-TERM`, `-KILL`, `-STOP`).
    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.pid());
    }

    /// Times at which a stderr line containing `what` arrived.
    pub fn logged(&self, what: &str) -> Vec<Instant> {
        let lines = self.stderr.lock().unwrap();
        lines
            .iter()
            .filter(|(_, l)| l.contains(what))
            .map(|(t, _)| *t)
            .collect()
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        let lines = self.stderr.lock().unwrap();
        lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Its stdout so far.
    pub fn out(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits for the exit; its status.
    pub fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(start.elapsed() < within, "still running:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `ready` holds, checking every 20 ms; panics naming `what`
/// after `within`.
pub fn until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < within, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
