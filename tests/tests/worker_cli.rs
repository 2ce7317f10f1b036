//! `worker collect` and `coordinator merge` as users run them: exact merge
//! (byte-identical artifacts however chunks are grouped), the imatrix read
//! back by llama.cpp's own GGUF reader, and clear errors on bad input.

use fixtures::llama_gguf::LlamaGguf;
use fixtures::run;
use numbers::partial::Partial;
use std::path::Path;
use std::process::Output;
use synth::Preset;

const N_CTX: u32 = 48;

fn collect(model: &Path, corpus: &Path, chunks: &str, out: &Path) -> Output {
    collect_reducing(model, corpus, chunks, out, "host")
}

/// `worker collect` with `--reduce REDUCE`.
fn collect_reducing(model: &Path, corpus: &Path, chunks: &str, out: &Path, reduce: &str) -> Output {
    let extra = [
        "--threads",
        "2",
        "--n-ubatch",
        "32",
        "--trace-top-n",
        "8",
        "--reduce",
        reduce,
    ];
    run(
        "worker",
        &fixtures::worker_args("collect", model, corpus, chunks, out, &extra),
    )
}

#[test]
fn one_call_and_two_merged_calls_give_identical_artifacts() {
    one_call_and_two_merged_calls("host");
}

/// The same with device reductions (issue #14).
#[test]
fn one_call_and_two_merged_calls_give_identical_artifacts_with_device_reductions() {
    one_call_and_two_merged_calls("device");
}

fn one_call_and_two_merged_calls(reduce: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let corpus = fixtures::corpus_dir(dir.path(), "corpus-run", 8, N_CTX);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));

    for (chunks, out) in [("0..8", &a), ("4..=7", &b), ("0..4", &b)] {
        let o = collect_reducing(&model, &corpus, chunks, out, reduce);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let merged = run("coordinator", &["merge", b.to_str().unwrap()]);
    assert!(merged.status.success());

    for name in ["saliency.json", "imatrix.gguf", "saliency.parquet"] {
        let (x, y) = (
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap(),
        );
        assert!(x == y, "{name} differs between one call and a merge of two");
    }
    let saliency: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("saliency.json")).unwrap()).unwrap();
    assert_eq!(saliency["n_chunks"], 8);
    assert_eq!(saliency["trace_tokens_written"], 7 * N_CTX + N_CTX * 5 / 8);

    // imatrix.gguf through llama.cpp's reader: upstream names, shapes and metadata.
    let partial =
        Partial::from_bytes(&std::fs::read(a.join("partials/part-00000000-00000008.bin")).unwrap())
            .unwrap();
    assert_eq!(
        partial.backends[0].ends_with(", device reductions"),
        reduce == "device",
        "{:?}",
        partial.backends
    );
    let g = LlamaGguf::open(&a.join("imatrix.gguf")).unwrap();
    assert_eq!(g.str("general.type").as_deref(), Some("imatrix"));
    assert_eq!(g.u32("imatrix.chunk_count"), Some(8));
    assert_eq!(g.u32("imatrix.chunk_size"), Some(N_CTX));
    assert_eq!(g.str_array("imatrix.datasets").map(|d| d.len()), Some(1));
    let names = g.tensor_names();
    assert_eq!(names.len(), 3 * partial.imatrix.entries.len());
    for (name, e) in &partial.imatrix.entries {
        let sums = g
            .f32_tensor(&format!("{name}.in_sum2"))
            .unwrap_or_else(|| panic!("{name}.in_sum2 missing"));
        let counts = g
            .f32_tensor(&format!("{name}.counts"))
            .unwrap_or_else(|| panic!("{name}.counts missing"));
        assert_eq!(
            sums.ne,
            [e.n_in as usize, e.n_mat as usize, 1, 1],
            "{name}.in_sum2 shape"
        );
        assert_eq!(
            counts.ne,
            [1, e.n_mat as usize, 1, 1],
            "{name}.counts shape"
        );
        assert!(sums
            .data
            .iter()
            .zip(&e.in_sum2)
            .all(|(f, x)| *f == x.to_f64() as f32));
        assert!(counts
            .data
            .iter()
            .zip(&e.counts)
            .all(|(f, c)| *f == *c as f32));
        // llama-imatrix's loader takes `in_sum` of as many values as
        // `in_sum2`; ours has its shape.
        let sums1 = g
            .f32_tensor(&format!("{name}.in_sum"))
            .unwrap_or_else(|| panic!("{name}.in_sum missing"));
        assert_eq!(sums1.ne, sums.ne, "{name}.in_sum shape");
        assert!(sums1
            .data
            .iter()
            .zip(&e.in_sum)
            .all(|(f, x)| *f == x.to_f64() as f32));
        assert!(
            e.in_sum.iter().any(|s| s.0 < 0),
            "{name}: in_sum holds no negative sum"
        );
    }
    for expected in [
        "blk.0.ffn_gate_inp.weight",
        "blk.2.ffn_down_exps.weight",
        "blk.1.attn_q.weight",
    ] {
        assert!(
            partial.imatrix.entries.contains_key(expected),
            "imatrix lacks {expected}"
        );
    }
}

fn assert_fails_cleanly(out: Output, out_dir: &Path, needles: &[&str]) {
    assert!(!out.status.success(), "the command should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "error should mention {n:?}: {err}");
    }
    for artifact in ["saliency.json", "imatrix.gguf", "partials"] {
        assert!(
            !out_dir.join(artifact).exists(),
            "{artifact} was left behind after a failure"
        );
    }
}

#[test]
fn bad_models_and_ranges_fail_with_clear_errors_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = fixtures::corpus_dir(dir.path(), "corpus-run", 4, N_CTX);
    let out = dir.path().join("out");

    let dense = fixtures::model(dir.path(), Preset::Dense);
    let dense_s = dense.to_str().unwrap();
    assert_fails_cleanly(
        collect(&dense, &corpus, "0..2", &out),
        &out,
        &[dense_s, "no MoE layers"],
    );

    let tiny = fixtures::model(dir.path(), Preset::Tiny);
    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(&tiny).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_fails_cleanly(
        collect(&truncated, &corpus, "0..2", &out),
        &out,
        &[truncated.to_str().unwrap(), "truncated"],
    );

    assert_fails_cleanly(
        collect(&tiny, &corpus, "2..9", &out),
        &out,
        &["2..9", "out of bounds", "4 chunks"],
    );
    assert_fails_cleanly(
        collect(&tiny, &dir.path().join("nowhere"), "0..1", &out),
        &out,
        &["nowhere", "index.json"],
    );
}
