//! What a coordinator tells workers elsewhere is what they need: the
//! "waiting for workers" line is a `worker join` command that joins as
//! printed (with `--ca` and the configured server name when a cluster CA is
//! set, `--pin` otherwise, and placeholders for the secret file and the
//! model that appended flags replace), and `connect_file` says the same,
//! with the server name from `[cluster] server_names`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(300);

/// Kills a process this test started when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the coordinator without local workers, joins one worker with the
/// printed command (plus its secret file and model in place of the
/// command's placeholders), and returns (the command, connect.json) once
/// the run has finished successfully.
fn run_and_join(dir: &Path, cluster: &str) -> (String, serde_json::Value) {
    let secret = dir.join("secret");
    std::fs::write(&secret, "a shared join secret of at least 32 bytes").unwrap();
    let connect = dir.join("connect.json");
    let config = fixtures::text_config(
        dir,
        &format!(
            "[cluster]\nserver_names = [\"localhost\"]\nsecret_file = {:?}\nconnect_file = {:?}\n{cluster}",
            secret.display().to_string(),
            connect.display().to_string(),
        ),
    );
    let run = dir.join("run");
    let mut coordinator = Reaped(
        fixtures::command("coordinator")
            .args([
                "run",
                config.to_str().unwrap(),
                "--out",
                run.to_str().unwrap(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, lines) = mpsc::channel();
    let stdout = coordinator.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let start = Instant::now();
    let hint = loop {
        let line = lines
            .recv_timeout(DEADLINE.saturating_sub(start.elapsed()))
            .expect("the coordinator prints a join command while it waits");
        if let Some(command) = line.strip_prefix("waiting for workers: ") {
            break command.to_string();
        }
    };
    let args: Vec<&str> = hint.split_whitespace().collect();
    assert_eq!(args[..2], ["worker", "join"], "{hint}");
    // The placeholders are replaced by flags appended to the command.
    let _worker = Reaped(
        fixtures::command("worker")
            .args(&args[1..])
            .args(["--secret-file", secret.to_str().unwrap()])
            .arg("--model")
            .arg(dir.join("tiny.gguf"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = loop {
        if let Some(status) = coordinator.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the run did not finish with the joined worker"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let printed: Vec<String> = lines.try_iter().collect();
    assert!(status.success(), "coordinator run failed: {printed:?}");
    assert!(
        printed.iter().any(|l| l.starts_with("run complete")),
        "{printed:?}"
    );
    let info = serde_json::from_slice(&std::fs::read(&connect).unwrap()).unwrap();
    (hint, info)
}

#[test]
fn a_pinned_coordinator_prints_a_pin_command_that_joins() {
    let dir = tempfile::tempdir().unwrap();
    let (hint, info) = run_and_join(dir.path(), "");
    let pin = info["pin"].as_str().unwrap();
    assert!(
        hint.contains(&format!("--pin {pin}")) && !hint.contains("--ca"),
        "{hint}"
    );
    assert_eq!(info["server_name"], "localhost", "{info}");
    assert_eq!(info["join"], hint.as_str(), "{info}");
    assert!(info.get("ca").is_none(), "{info}");
    assert!(
        hint.ends_with(" --secret-file SECRET_FILE --model MODEL.gguf")
            && info["placeholders"]["SECRET_FILE"]
                .as_str()
                .is_some_and(|s| s.contains("--key-file")),
        "{info}"
    );
}

#[test]
fn a_coordinator_with_a_cluster_ca_prints_a_ca_command_that_joins() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    fixtures::run_ok("coordinator", &["ca", ca.to_str().unwrap()]);
    let (hint, info) = run_and_join(
        dir.path(),
        &format!("ca_dir = {:?}\n", ca.display().to_string()),
    );
    let pem = ca.join("ca.pem");
    assert!(
        hint.contains(&format!("--ca {} --server-name localhost", pem.display()))
            && !hint.contains("--pin"),
        "{hint}"
    );
    assert_eq!(info["server_name"], "localhost", "{info}");
    assert_eq!(info["ca"], pem.to_str().unwrap(), "{info}");
    assert_eq!(info["join"], hint.as_str(), "{info}");
}
