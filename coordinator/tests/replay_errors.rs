//! Error messages as the coordinator prints them
//! (`runfiles::error_text::with_causes`: the error, then each cause it does
//! not already say): users and scripts read these, so they are pinned here
//! word for word.

use clap::Parser;
use coordinator::replay_cli::ReplayFlags;
use numbers::Split;
use replay::{replay_run, ReplayError, ReplayReport};
use runfiles::store::RunStore;
use runfiles::trace::{write_part, TraceRow};
use std::path::Path;

#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    args: ReplayFlags,
}

/// What `coordinator` prints for an error.
fn printed(e: ReplayError) -> String {
    runfiles::error_text::with_causes(&e)
}

/// The message of a replay of `dir` with extra flags.
fn replay_error(dir: &Path, flags: &[&str]) -> String {
    let mut argv = vec!["replay", dir.to_str().unwrap()];
    argv.extend(flags);
    let args = Wrap::try_parse_from(argv).unwrap().args.into();
    match replay_run(&args) {
        Ok(_) => panic!("replay of {} with {flags:?} succeeded", dir.display()),
        Err(e) => printed(e),
    }
}

/// A `saliency.json` of no statistics for `n_expert` experts, `used` per token.
fn saliency_of(n_expert: usize, used: u32) -> String {
    format!(
        r#"{{"n_expert": {n_expert}, "n_expert_used": {used}, "gating": "softmax", "trace_tokens_written": 0, "nonfinite_drops": 0, "splits": {{}}}}"#
    )
}

/// The URL of `name` in the run at `dir`.
fn url_of(dir: &Path, name: &str) -> String {
    RunStore::open(dir.to_str().unwrap()).unwrap().url_of(name)
}

/// A run of one layer (0) of two tokens with `saliency.json` stating
/// `n_expert`; the tokens select experts 0 and 1, then 2 and `last`.
fn write_run(dir: &Path, n_expert: usize, last: u16) {
    let row = |pos: u32, selected: [u16; 2]| TraceRow {
        split: Split::Fit,
        domain: "web".into(),
        chunk: 0,
        pos,
        token_id: 1,
        layer: 0,
        selected: selected.to_vec(),
        selected_weight: vec![0.5, 0.5],
        topn_id: selected.to_vec(),
        topn_prob: vec![0.5, 0.5],
        lookahead: Vec::new(),
    };
    let mut rows = [row(0, [0, 1]), row(1, [2, last])];
    std::fs::create_dir_all(dir.join("trace")).unwrap();
    let part = write_part(&mut rows, 2, 2).unwrap();
    std::fs::write(dir.join("trace/part-0.parquet"), part).unwrap();
    std::fs::write(dir.join("saliency.json"), saliency_of(n_expert, 2)).unwrap();
}

/// A keep map file `name` in `dir` with `layers` as its JSON layer table.
fn keep_map(dir: &Path, name: &str, layers: &str) -> String {
    let path = dir.join(name);
    let json = format!(
        r#"{{"method": "frequency", "k": 1, "params": {{}}, "saliency_sha256": "", "layers": {layers}}}"#
    );
    std::fs::write(&path, json).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn flags_out_of_range_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    write_run(run, 4, 3);
    assert_eq!(
        replay_error(run, &["--ema-decay", "1.5"]),
        "--ema-decay 1.5 must be in (0, 1)"
    );
    assert_eq!(
        replay_error(run, &["--ubatch", "0"]),
        "--ubatch must be at least 1"
    );
}

#[test]
fn run_inputs_at_fault_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    std::fs::create_dir_all(run.join("trace")).unwrap();
    assert_eq!(
        replay_error(run, &[]),
        format!(
            "{} is missing and no model is known (--model): cannot tell the number of experts",
            url_of(run, "saliency.json")
        )
    );
    std::fs::write(run.join("saliency.json"), saliency_of(0, 0)).unwrap();
    assert_eq!(replay_error(run, &[]), "n_expert = 0 is out of range");
    std::fs::write(run.join("saliency.json"), "{").unwrap();
    assert_eq!(
        replay_error(run, &[]),
        format!(
            "parsing {}: EOF while parsing an object at line 1 column 1",
            url_of(run, "saliency.json")
        )
    );
    std::fs::write(run.join("saliency.json"), saliency_of(4, 0)).unwrap();
    assert_eq!(
        replay_error(run, &[]),
        format!("{} holds no trace parts", url_of(run, "trace"))
    );
    let missing = run.join("missing.gguf");
    std::fs::remove_file(run.join("saliency.json")).unwrap();
    let model = missing.to_str().unwrap();
    assert_eq!(
        replay_error(run, &["--model", model]),
        format!("model {model}: No such file or directory (os error 2)")
    );
}

#[test]
fn trace_parts_at_fault_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    write_run(run, 4, 5);
    let part = url_of(run, "trace/part-0.parquet");
    assert_eq!(
        replay_error(run, &[]),
        format!(
            "trace part {part} layer 0: \
             chunk 0 pos 1: expert id 5 is not below n_expert = 4"
        )
    );
    std::fs::write(run.join("trace/part-0.parquet"), b"not parquet").unwrap();
    assert_eq!(
        replay_error(run, &[]),
        format!(
            "reading the footer of trace part {part}: \
             Parquet error: Invalid Parquet file. Corrupt footer"
        )
    );
}

#[test]
fn keep_maps_at_fault_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    write_run(run, 4, 3);
    let bad_key = keep_map(run, "bad_key.json", r#"{"x": [0]}"#);
    assert_eq!(
        replay_error(run, &["--keep-map", &bad_key]),
        format!(
            "{bad_key} is not a valid keep map: not a keep map \
             (layer \"x\" is not a block index at line 1 column 90); \
             expected {{\"layers\": {{\"0\": [expert ids], ...}}}}"
        )
    );
    // The keep map's own rules hold in replay as everywhere (KeepMap::decode).
    let unsorted = keep_map(run, "unsorted.json", r#"{"0": [2, 1]}"#);
    assert_eq!(
        replay_error(run, &["--keep-map", &unsorted]),
        format!(
            "{unsorted} is not a valid keep map: \
             layer 0: expert ids [2, 1] are not sorted and unique"
        )
    );
    let bad_expert = keep_map(run, "bad_expert.json", r#"{"0": [9]}"#);
    assert_eq!(
        replay_error(run, &["--keep-map", &bad_expert]),
        format!("keep map {bad_expert}: layer 0 keeps expert 9, but n_expert = 4")
    );
    let no_layer = keep_map(run, "no_layer.json", r#"{"1": [0]}"#);
    assert_eq!(
        replay_error(run, &["--keep-map", &no_layer]),
        "keep map no_layer has no layer 0"
    );
    assert_eq!(
        replay_error(run, &["--keep-map", "absent_K1"]),
        format!("{} does not exist", url_of(run, "keep_maps/absent_K1.json"))
    );
    std::fs::write(run.join("broken.json"), "[]").unwrap();
    let broken = run.join("broken.json");
    let broken = broken.to_str().unwrap();
    assert_eq!(
        replay_error(run, &["--keep-map", broken]),
        format!(
            "{broken} is not a valid keep map: not a keep map (invalid length 4, \
             expected struct KeepMap with 5 elements at line 1 column 2); \
             expected {{\"layers\": {{\"0\": [expert ids], ...}}}}"
        )
    );
}

#[test]
fn stored_results_that_do_not_decode_are_named() {
    let e = ReplayReport::from_json(b"{}", "memory:///run/replay/results.json").unwrap_err();
    assert_eq!(
        printed(e),
        "memory:///run/replay/results.json is not replay results: \
         missing field `n_expert` at line 1 column 2"
    );
}
