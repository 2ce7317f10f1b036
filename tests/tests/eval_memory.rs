//! Evaluation within a memory budget (DESIGN section 12, "Memory"): a
//! worker holding one model at a time, or the base and one candidate,
//! writes the eval partial and `eval/summary.json` of the all-at-once path
//! byte for byte, on the f64 host comparison and on the device comparison
//! (CPU backend), with the base model's logits kept in memory or in a
//! scratch file that is gone afterwards.

use numbers::Split;
use std::path::{Path, PathBuf};
use synth::Preset;

const N_CTX: u32 = 40;

/// The bytes of the eval partial and the summary of one `worker eval`.
fn eval(
    model: &Path,
    cands: &[PathBuf],
    corpus: &Path,
    out: &Path,
    extra: &[&str],
) -> [Vec<u8>; 2] {
    let flags = ["--threads", "2", "--n-ubatch", "16", "--skip-first", "5"];
    let mut args = fixtures::worker_args("eval", model, corpus, "0..4", out, &flags);
    for c in cands {
        args.extend(["--candidate", c.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    fixtures::run_ok("worker", &args);
    let read = |p: &str| std::fs::read(out.join(p)).unwrap();
    [
        read("eval/partials/part-00000000-00000004.bin"),
        read("eval/summary.json"),
    ]
}

#[test]
fn one_or_two_models_in_memory_give_the_all_at_once_results_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), Preset::Tiny);
    // Two slices of the base (8 and 12 of 16 experts) and a model with
    // other weights, so every candidate's figures differ.
    let layers = [0, 1, 2];
    let mut cands = Vec::new();
    for k in [8, 12] {
        let path = dir.path().join(format!("test_K{k}.gguf"));
        let mut map = fixtures::keep_map(8, &layers, 16);
        if k == 12 {
            map.k = 12;
            map.layers
                .values_mut()
                .for_each(|ids| *ids = (4..16).collect());
        }
        slicer::slice_model(&base, &map, &path).unwrap();
        cands.push(path);
    }
    let other = dir.path().join("other_K16.gguf");
    synth::write_model(Preset::Tiny, 8, &other).unwrap();
    cands.push(other);
    let corpus = fixtures::corpus_dir(dir.path(), "run", 4, N_CTX);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let mut runs = 0;
    let mut run = |extra: &[&str]| {
        runs += 1;
        let out = dir.path().join(format!("out{runs}"));
        eval(&base, &cands, &corpus, &out, extra)
    };
    for compare in ["host", "device"] {
        let all = run(&["--compare", compare, "--models-in-memory", "all"]);
        let summary: numbers::eval::EvalSummary = serde_json::from_slice(&all[1]).unwrap();
        assert_eq!(summary.candidates.len(), 3);
        let kl = |i: usize| summary.candidates[i].splits[&Split::Fit].all.kl.mean;
        assert!(kl(0) > 0.0 && kl(1) > 0.0 && kl(2) > 0.0, "{compare}");
        for (models, in_memory_mib) in [("1", "1024"), ("2", "1024"), ("2", "0"), ("1", "0")] {
            let got = run(&[
                "--compare",
                compare,
                "--models-in-memory",
                models,
                "--kept-rows-memory-mib",
                in_memory_mib,
                "--scratch-dir",
                scratch.to_str().unwrap(),
            ]);
            let what =
                format!("{compare}, {models} in memory, {in_memory_mib} MiB of rows in memory");
            assert!(got[0] == all[0], "eval partial differs: {what}");
            assert!(got[1] == all[1], "summary differs: {what}");
        }
    }
    // The kept rows' scratch files are gone with their worker.
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
}

#[test]
fn a_scratch_directory_that_does_not_exist_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), Preset::Tiny);
    let other = dir.path().join("other_K16.gguf");
    synth::write_model(Preset::Tiny, 8, &other).unwrap();
    let corpus = fixtures::corpus_dir(dir.path(), "run", 2, N_CTX);
    let missing = dir.path().join("no-such-dir");
    let out = dir.path().join("out");
    let mut args = fixtures::worker_args("eval", &base, &corpus, "0..2", &out, &[]);
    args.extend([
        "--candidate",
        other.to_str().unwrap(),
        "--models-in-memory",
        "1",
        "--kept-rows-memory-mib",
        "0",
        "--scratch-dir",
        missing.to_str().unwrap(),
    ]);
    let o = fixtures::run("worker", &args);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no-such-dir"), "{err}");
    assert!(!out.join("eval/summary.json").exists());
}

/// The base model alone (no candidates: what `bench_eval_memory` measures
/// a context's buffers with) runs at every setting of models in memory;
/// with one model it was dropped before its pass ("every model is loaded").
#[test]
fn the_base_model_alone_runs_with_any_number_of_models_in_memory() {
    use numbers::eval::ModelsInMemory;
    use worker::eval::{EvalOptions, Evaluator};
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), Preset::Tiny);
    let (index, chunks) = synth::chunks::bench_chunks(2, N_CTX, 600);
    for mode in [
        ModelsInMemory::Count(1),
        ModelsInMemory::Count(2),
        ModelsInMemory::All,
    ] {
        let opts = EvalOptions {
            n_ubatch: N_CTX,
            threads: 2,
            skip_first: 5,
            models_in_memory: mode,
            scratch_dir: dir.path().to_path_buf(),
            ..EvalOptions::default()
        };
        let mut e = Evaluator::load(&base, &[], opts).unwrap();
        let evaluated = e.run(&index, &chunks, &mut |_, _| {}).unwrap();
        // Per chunk, the positions after the skipped 5 that have a next token.
        assert_eq!(
            evaluated.partial.n_scored(),
            2 * u64::from(N_CTX - 5 - 1),
            "{mode:?}"
        );
        assert!(evaluated.partial.candidates.is_empty(), "{mode:?}");
    }
}

/// The generation check: a candidate that is a copy of the base model
/// continues every prompt exactly as it does; a model with other weights
/// does not; and the generations are the same whether the models are all
/// in memory or run in turn, on either comparison path.
#[test]
fn generations_match_a_copy_of_the_base_and_every_memory_mode() {
    use numbers::eval::{GenerateJob, ModelsInMemory, Prompt};
    use worker::eval::{candidates, Compare, EvalOptions, Evaluator};
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), Preset::Tiny);
    let copy = dir.path().join("copy_K16.gguf");
    std::fs::copy(&base, &copy).unwrap();
    let other = dir.path().join("other_K16.gguf");
    synth::write_model(Preset::Tiny, 8, &other).unwrap();
    let cands = candidates::from_files(&[copy, other]).unwrap();
    let (index, chunks) = synth::chunks::bench_chunks(4, N_CTX, 600);
    // Prompts of 20 tokens from chunks 0, 2 and 3, the last two from one
    // chunk's two places (a lease continues every prompt whose document
    // starts in its chunks).
    let prompt = |chunk: usize, at: usize| Prompt {
        chunk: chunk as u32,
        domain: 0,
        doc: chunk as u32,
        after_user_turn: false,
        tokens: chunks[chunk].tokens[at..at + 20].to_vec(),
    };
    let generate = GenerateJob {
        prompts: vec![prompt(0, 0), prompt(2, 0), prompt(3, 0), prompt(3, 7)],
        new_tokens: 12,
        noise_ubatch: 1,
        unprompted: Default::default(),
    };
    let mut seen = Vec::new();
    for compare in [Compare::Host, Compare::Device] {
        for mode in [
            ModelsInMemory::All,
            ModelsInMemory::Count(2),
            ModelsInMemory::Count(1),
        ] {
            let opts = EvalOptions {
                n_ubatch: 16,
                threads: 2,
                skip_first: 5,
                compare,
                models_in_memory: mode,
                scratch_dir: dir.path().to_path_buf(),
                generate: generate.clone(),
                ..EvalOptions::default()
            };
            let mut e = Evaluator::load(&base, &cands, opts).unwrap();
            let p = e.run(&index, &chunks, &mut |_, _| {}).unwrap().partial;
            assert_eq!(p.generate, (12, 1));
            let gens: Vec<_> = p.candidates.iter().map(|c| c.generations.clone()).collect();
            for g in gens.iter().chain([&p.noise]) {
                assert_eq!(g.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
                assert!(g.values().all(|g| g.prompt_tokens == 20 && g.matched <= 12));
            }
            // The copy of the base model generates what the base does.
            assert!(gens[0].values().all(|g| g.matched == 12));
            // Other weights generate other tokens.
            assert!(gens[1].values().any(|g| g.matched < 12), "{gens:?}");
            let gens = (gens, p.noise);
            seen.push(((compare, mode), gens));
        }
    }
    for (how, gens) in &seen[1..] {
        assert_eq!(gens, &seen[0].1, "{how:?} against {:?}", seen[0].0);
    }
}
