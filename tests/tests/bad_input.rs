//! Bad input is refused with an error naming the input and the problem, and
//! nothing is written or replaced: an empty micro-batch (in the run config,
//! on `worker collect` and on `worker eval`), decode traces without a
//! prompt, a corrupt `manifest.json`, `[eval]` keep-map sizes that do not
//! parse or that the model cannot run, a model or importance matrix that is
//! not a GGUF.

use std::path::Path;
use std::process::Output;
use synth::Preset;

const N_CTX: u32 = 48;

fn assert_refused(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {err}");
    for n in needles {
        assert!(err.contains(n), "error should mention {n:?}: {err}");
    }
}

fn collect(dir: &Path, extra: &[&str]) -> Output {
    let model = fixtures::model(dir, Preset::Tiny);
    let run = fixtures::corpus_dir(dir, "run", 2, N_CTX);
    fixtures::run(
        "worker",
        &fixtures::worker_args("collect", &model, &run, "0..2", &run, extra),
    )
}

#[test]
fn worker_collect_refuses_an_empty_micro_batch_and_an_empty_decode_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let out = collect(dir.path(), &["--n-ubatch", "0"]);
    assert_refused(&out, &["--n-ubatch", "'0'"]);
    let out = collect(
        dir.path(),
        &["--decode-tokens", "4", "--decode-prompt", "0"],
    );
    assert_refused(&out, &["--decode-prompt", "'0'"]);
    assert!(!dir.path().join("run/saliency.json").exists());
    assert!(!dir.path().join("run/partials").exists());
}

#[test]
fn worker_eval_refuses_an_empty_micro_batch() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let run = fixtures::corpus_dir(dir.path(), "run", 2, N_CTX);
    let candidate = ["--candidate", model.to_str().unwrap(), "--n-ubatch", "0"];
    let args = fixtures::worker_args("eval", &model, &run, "0..2", &run, &candidate);
    assert_refused(&fixtures::run("worker", &args), &["--n-ubatch", "'0'"]);
    assert!(!dir.path().join("run/eval").exists());
}

/// `coordinator COMMAND CONFIG --out OUT` (`run`, `corpus`).
fn stage(command: &str, config: &Path, out: &Path) -> Output {
    let (config, out) = (config.to_str().unwrap(), out.to_str().unwrap());
    fixtures::run("coordinator", &[command, config, "--out", out])
}

#[test]
fn a_run_config_with_an_empty_micro_batch_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("zero.toml");
    std::fs::write(&config, "[run]\nn_ubatch = 0\n").unwrap();
    let out_dir = dir.path().join("run");
    for command in ["run", "corpus"] {
        let out = stage(command, &config, &out_dir);
        assert_refused(
            &out,
            &[
                config.to_str().unwrap(),
                "[run] n_ubatch = 0",
                "at least one token",
            ],
        );
    }
    assert!(!out_dir.exists(), "a refused config left a run behind");
}

#[test]
fn a_corrupt_manifest_is_an_error_naming_it_and_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(dir.path(), "");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let corrupt = b"{\"corpus_format\": 1, \"inputs_sha".to_vec();
    std::fs::write(run.join("manifest.json"), &corrupt).unwrap();
    for command in ["corpus", "run"] {
        let out = stage(command, &config, &run);
        assert_refused(&out, &["manifest.json", "not a manifest"]);
        assert_eq!(std::fs::read(run.join("manifest.json")).unwrap(), corrupt);
        assert!(!run.join("corpus").exists(), "{command} wrote a corpus");
    }
}

#[test]
fn eval_sizes_that_do_not_parse_or_cannot_run_are_refused_before_any_corpus_work() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cases: [(&str, &[&str]); 2] = [
        // Refused when the config is read, by every command that reads it.
        (
            "methods = [\"frequency\"]\nk = [\"5O%\"]",
            &["text.toml", "[eval] k \"5O%\"", "a number in (0, 100]"],
        ),
        // The tiny model has 16 experts and routes each token to 4: 10% is 1.
        (
            "methods = [\"frequency\"]\nk = [\"50%\", \"10%\"]",
            &["[eval] k \"10%\"", "16 experts is 1", "fewer than the 4"],
        ),
    ];
    for (eval, needles) in cases {
        let config = fixtures::text_config(dir.path(), &format!("[eval]\n{eval}\n"));
        let (config, out_dir) = (config.to_str().unwrap(), run.to_str().unwrap());
        let out = fixtures::run("coordinator", &["run", config, "--out", out_dir]);
        assert_refused(&out, needles);
        assert!(!run.exists(), "a refused [eval] left a run behind");
    }
}

/// `worker quantize` given a file that is not a GGUF, as the model or as
/// the importance matrix: the error says which and names the file once, and
/// nothing is written.
#[test]
fn worker_quantize_names_a_file_that_is_not_a_gguf_once() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"not a model at all, nor an imatrix").unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let out = dir.path().join("q.gguf");
    let quantize = |model: &Path, extra: &[&str]| {
        let mut args = vec!["quantize", "--model", model.to_str().unwrap()];
        args.extend(["--type", "Q8_0", "--out", out.to_str().unwrap()]);
        args.extend_from_slice(extra);
        fixtures::run("worker", &args)
    };
    let shown = garbage.to_str().unwrap();
    for (o, role) in [
        (quantize(&garbage, &[]), "model"),
        (quantize(&model, &["--imatrix", shown]), "imatrix"),
    ] {
        assert_refused(&o, &[&format!("{role} {shown}: "), "not a GGUF file"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.matches(shown).count(), 1, "the file named once: {err}");
    }
    assert!(!out.exists());
}
