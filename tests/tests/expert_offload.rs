//! `--cpu-moe` and `--n-cpu-moe`: the routed experts a worker keeps in host
//! memory reach llama.cpp's loader (its own log names each tensor it
//! places), and where the weights live changes no artifact.

use fixtures::llama_gguf::LlamaGguf;
use std::collections::BTreeSet;
use std::path::Path;
use synth::Preset;

const N_CTX: u32 = 48;

/// `worker collect` of the whole corpus with `placement` flags, llama.cpp's
/// debug log on: the tensors llama.cpp says it overrode to the CPU.
fn collect(model: &Path, corpus: &Path, out: &Path, placement: &[&str]) -> BTreeSet<String> {
    let mut extra = vec!["--threads", "2", "--n-ubatch", "32", "--reduce", "host"];
    extra.extend_from_slice(placement);
    let args = fixtures::worker_args("collect", model, corpus, "0..4", out, &extra);
    let o = fixtures::command("worker")
        .args(&args)
        .env("RUST_LOG", "info,llama.cpp=debug")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "worker {args:?} failed:\n{log}");
    log.lines()
        .filter(|l| l.contains("buffer type overridden to CPU"))
        .map(|l| {
            let after = &l[l.find("tensor ").expect("names a tensor") + "tensor ".len()..];
            after.split_whitespace().next().unwrap().to_string()
        })
        .collect()
}

#[test]
fn experts_kept_on_the_cpu_are_llama_cpps_to_place_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let corpus = fixtures::corpus_dir(dir.path(), "corpus-run", 4, N_CTX);
    // The routed-expert tensors, as llama.cpp's own GGUF reader lists them.
    let experts: BTreeSet<String> = LlamaGguf::open(&model)
        .unwrap()
        .tensor_names()
        .into_iter()
        .filter(|n| n.contains("_exps."))
        .collect();
    let first_block: BTreeSet<String> = experts
        .iter()
        .filter(|n| n.starts_with("blk.0."))
        .cloned()
        .collect();
    assert!(experts.len() > first_block.len() && !first_block.is_empty());

    let runs = [
        ("plain", vec![], BTreeSet::new()),
        ("all", vec!["--ngl", "999", "--cpu-moe"], experts),
        (
            "first",
            vec!["--ngl", "999", "--n-cpu-moe", "1"],
            first_block,
        ),
    ];
    let mut outputs = Vec::new();
    for (name, flags, expected) in &runs {
        let out = dir.path().join(name);
        let overridden = collect(&model, &corpus, &out, flags);
        assert_eq!(
            &overridden, expected,
            "{name}: tensors llama.cpp kept on the CPU"
        );
        outputs.push(out);
    }
    for name in [
        "saliency.json",
        "imatrix.gguf",
        "partials/part-00000000-00000004.bin",
    ] {
        let plain = std::fs::read(outputs[0].join(name)).unwrap();
        for (out, (label, ..)) in outputs.iter().zip(&runs).skip(1) {
            assert!(
                std::fs::read(out.join(name)).unwrap() == plain,
                "{name} differs with the experts placed as `{label}`"
            );
        }
    }
}

#[test]
fn contradicting_placement_flags_are_refused_by_name() {
    let o = fixtures::run(
        "worker",
        &[
            "collect",
            "--model",
            "m.gguf",
            "--corpus",
            "c",
            "--chunks",
            "0..1",
            "--out",
            "o",
            "--cpu-moe",
            "--n-cpu-moe",
            "2",
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--cpu-moe") && err.contains("--n-cpu-moe"),
        "{err}"
    );
}
