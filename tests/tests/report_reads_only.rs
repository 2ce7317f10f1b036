//! `coordinator report` reads what the stages stored and writes only
//! `report/`: it never scores, so `keep_maps/` stay exactly as `score` left
//! them (not rewritten, even with the same bytes), and a stage that has not
//! run is named as missing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;
use synth::Preset;

const N_CTX: u32 = 48;

/// Every file under `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (std::fs::read(e.path()).unwrap(), meta.modified().unwrap()),
            )
        })
        .collect()
}

#[test]
fn report_never_writes_keep_maps_and_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let run = fixtures::corpus_dir(dir.path(), "run", 6, N_CTX);
    let run_s = run.to_str().unwrap();
    let extra = ["--trace-every", "0"];
    fixtures::run_ok(
        "worker",
        &fixtures::worker_args("collect", &model, &run, "0..6", &run, &extra),
    );

    // Before `score`: the report says so and scores nothing itself.
    let out = fixtures::run_ok("coordinator", &["report", run_s]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("score/score.json is missing") && stdout.contains("coordinator score"),
        "{stdout}"
    );
    assert!(
        stdout.contains("replay/results.json is missing"),
        "{stdout}"
    );
    assert!(!run.join("keep_maps").exists(), "report wrote keep maps");
    assert!(!run.join("score").exists(), "report wrote score results");
    assert!(run.join("report/report.md").exists());

    fixtures::run_ok("coordinator", &["score", run_s]);
    let keep_maps = run.join("keep_maps");
    // A trailing newline that `score` would not write: a rewrite shows.
    let first = std::fs::read_dir(&keep_maps)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&first).unwrap();
    bytes.extend_from_slice(b"\n\n");
    std::fs::write(&first, bytes).unwrap();
    let before = snapshot(&keep_maps);
    assert!(before.len() > 1, "{:?}", before.keys());

    let out = fixtures::run_ok("coordinator", &["report", run_s]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("score/score.json"), "{stdout}");
    let after = snapshot(&keep_maps);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (name, (bytes, modified)) in &before {
        assert!(after[name].0 == *bytes, "keep_maps/{name} changed");
        assert_eq!(after[name].1, *modified, "keep_maps/{name} was rewritten");
    }
    let md = std::fs::read_to_string(run.join("report/report.md")).unwrap();
    assert!(md.contains("## Scoring and keep maps"), "{md}");
}
