//! Issue #22 on the generated models: collection never computes or copies
//! logits, and its artifacts are bit for bit those of a collection that
//! computes the output head and copies its logits (what a plain llama.cpp
//! decode does); the evaluation's device comparison agrees with the f64 host
//! path within the tolerance it states.

use numbers::eval::EvalPartial;
use numbers::partial::Partial;
use synth::{Overrides, Preset};
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collected};
use worker::eval::{Candidate, Compare, EvalOptions, Evaluator};

const N_CTX: u32 = 48;
const N_CHUNKS: u32 = 3;

fn collect(
    model: &std::path::Path,
    dir: &std::path::Path,
    reduce: Reduce,
    decode_tokens: usize,
    output_head: bool,
) -> Collected {
    let opts = CollectOptions {
        output_head,
        ..fixtures::traced_collect_options(reduce, decode_tokens, 6)
    };
    fixtures::collect(model, dir, &fixtures::chunks(N_CHUNKS, N_CTX), N_CTX, opts)
}

/// The partial's bytes with its backend-to-host figure left out.
fn without_bytes_figure(p: &Partial) -> Vec<u8> {
    let mut p = p.clone();
    p.backend_to_host = Default::default();
    p.to_bytes()
}

#[test]
fn skipping_the_output_head_changes_no_artifact_and_no_logits_cross() {
    let dir = tempfile::tempdir().unwrap();
    for preset in [Preset::Tiny, Preset::TinyAlt] {
        let model = fixtures::model(dir.path(), preset);
        let n_vocab = llama::Model::load(&model, &llama::Offload::default())
            .unwrap()
            .n_vocab() as u64;
        for reduce in [Reduce::Host, Reduce::Device] {
            let case = format!("{preset:?}, {reduce:?} reductions");
            let corpus = dir.path().join(format!("{preset:?}-{reduce:?}"));
            // Decode traces too: their greedy steps read the last row only.
            let with = collect(&model, &corpus, reduce, 3, true);
            let without = collect(&model, &corpus, reduce, 3, false);
            assert_eq!(
                without_bytes_figure(&without.partial),
                without_bytes_figure(&with.partial),
                "{case}: partial"
            );
            assert_eq!(without.trace, with.trace, "{case}: trace");
            assert!(!without.decode_trace.is_empty(), "{case}: no decode trace");
            assert_eq!(
                without.decode_trace, with.decode_trace,
                "{case}: decode trace"
            );
            // Without decode traces, the head costs exactly llama.cpp's copy
            // of every token's logits row, and nothing else crosses.
            let with = collect(&model, &corpus, reduce, 0, true).partial;
            let without = collect(&model, &corpus, reduce, 0, false).partial;
            assert_eq!(without_bytes_figure(&without), without_bytes_figure(&with));
            let (w, wo) = (with.backend_to_host, without.backend_to_host);
            assert_eq!(w.tokens, wo.tokens);
            assert!(wo.bytes > 0, "{case}: the observer read nothing");
            assert_eq!(
                w.bytes - wo.bytes,
                w.tokens * n_vocab * 4,
                "{case}: bytes with the head {} vs without {}",
                w.bytes,
                wo.bytes
            );
        }
    }
}

/// Per-position agreement the device comparison (f32 on the backend)
/// promises with the host path (f64): KL within 2e-6 + 1e-4 x KL, NLL
/// within 1e-5 x max(1, NLL), the probability change within 1e-6, top-1
/// agreement identical.
fn assert_device_matches_host(host: &EvalPartial, device: &EvalPartial, case: &str) {
    assert_eq!(
        host.base.keys().collect::<Vec<_>>(),
        device.base.keys().collect::<Vec<_>>()
    );
    for (g, h) in &host.base {
        let d = &device.base[g];
        assert_eq!(h.n, d.n, "{case} {g:?}");
        let (hn, dn) = (h.nll.to_f64(), d.nll.to_f64());
        assert!(
            (hn - dn).abs() <= 1e-5 * hn.abs().max(h.n as f64),
            "{case} {g:?}: base NLL {hn} vs {dn}"
        );
    }
    let mut worst = 0f64;
    for (hc, dc) in host.candidates.iter().zip(&device.candidates) {
        assert_eq!(hc.tokens.len(), dc.tokens.len(), "{case}");
        for (h, d) in hc.tokens.iter().zip(&dc.tokens) {
            assert_eq!((h.chunk, h.pos, h.group), (d.chunk, d.pos, d.group));
            let err = (h.kl - d.kl).abs();
            worst = worst.max(err / (2e-6 + 1e-4 * h.kl.abs()));
            assert!(
                err <= 2e-6 + 1e-4 * h.kl.abs(),
                "{case} {}: chunk {} pos {}: KL {} vs {}",
                hc.name,
                h.chunk,
                h.pos,
                h.kl,
                d.kl
            );
        }
        for (g, h) in &hc.groups {
            let d = &dc.groups[g];
            let what = format!("{case} {} {g:?}", hc.name);
            assert_eq!((h.n, h.top1_same), (d.n, d.top1_same), "{what}");
            let (hn, dn) = (h.nll.to_f64(), d.nll.to_f64());
            assert!(
                (hn - dn).abs() <= 1e-5 * hn.abs().max(h.n as f64),
                "{what}: NLL {hn} vs {dn}"
            );
            let (hp, dp) = (h.dprob.to_f64(), d.dprob.to_f64());
            assert!(
                (hp - dp).abs() <= 1e-6 * h.n as f64,
                "{what}: dprob {hp} vs {dp}"
            );
        }
    }
    eprintln!("{case}: worst KL error {worst:.3} of the tolerance");
}

#[test]
fn the_device_comparison_agrees_with_the_f64_host_path() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = fixtures::chunks(N_CHUNKS, N_CTX);
    let index = fixtures::write_corpus(&dir.path().join("run"), &chunks, N_CTX);
    // The tiny models, and `tiny` at Qwen3's real vocabulary of 151,936
    // (its KL and log-softmax sum over every entry, in f32 on the backend).
    let real_vocab = Overrides {
        n_vocab: Some(151_936),
        ..Overrides::default()
    };
    for (preset, o) in [
        (Preset::Tiny, Overrides::default()),
        (Preset::TinyAlt, Overrides::default()),
        (Preset::Tiny, real_vocab),
    ] {
        let name = format!("{preset:?}-{}", o.n_vocab.unwrap_or(0));
        let base = dir.path().join(format!("{name}.gguf"));
        synth::write_model_with(preset, 7, o, &base).unwrap();
        let other = dir.path().join(format!("{name}-other_K16.gguf"));
        synth::write_model_with(preset, 8, o, &other).unwrap();
        let same = dir.path().join(format!("{name}-same_K16.gguf"));
        std::fs::copy(&base, &same).unwrap();
        let cands = worker::eval::candidates::from_files(&[other, same]).unwrap();
        let run = |compare: Compare, skip_first: u32| -> EvalPartial {
            let opts = EvalOptions {
                n_ubatch: 16,
                threads: 2,
                f32_kv: true,
                skip_first,
                compare,
                ..EvalOptions::default()
            };
            let cands: Vec<Candidate> = cands.clone();
            Evaluator::load(&base, &cands, opts)
                .unwrap()
                .run(&index, &chunks, &mut |_, _| {})
                .unwrap()
                .partial
        };
        // Skipping 20 positions leaves a micro-batch with no scored row.
        for skip_first in [0, 20] {
            let (host, device) = (
                run(Compare::Host, skip_first),
                run(Compare::Device, skip_first),
            );
            let case = format!("{name}, skip_first {skip_first}");
            assert!(
                host.candidates[0].tokens.iter().any(|t| t.kl > 1e-3),
                "{case}: KL all tiny"
            );
            assert_device_matches_host(&host, &device, &case);
            // A byte copy of the base model: exactly zero on both paths.
            for p in [&host, &device] {
                let same = &p.candidates[1];
                assert!(same.tokens.iter().all(|t| t.kl == 0.0), "{case}");
                assert!(same
                    .groups
                    .values()
                    .all(|g| g.top1_same == g.n && g.dprob.to_f64() == 0.0));
            }
            assert!(
                device.backends[0].ends_with(", device comparison"),
                "{:?}",
                device.backends
            );
            assert!(
                host.backends[0].ends_with(", host comparison (f64)"),
                "{:?}",
                host.backends
            );
        }
    }
}

/// A worker keeps its llama.cpp context from one lease to the next (so its
/// vocabulary-wide output buffers are allocated once): its next lease gives
/// what a fresh collector or evaluator gives for the same chunks, bit for
/// bit, and counts only its own backend-to-host bytes.
#[test]
fn a_workers_next_lease_on_its_kept_context_equals_a_fresh_one() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = fixtures::chunks(4, N_CTX);
    let index = fixtures::write_corpus(&dir.path().join("run"), &chunks, N_CTX);
    let (first, next) = chunks.split_at(2);
    let model = fixtures::model(dir.path(), Preset::Tiny);
    for reduce in [Reduce::Host, Reduce::Device] {
        let opts = CollectOptions {
            n_ubatch: 32,
            threads: 2,
            trace_every: 1,
            trace_top_n: 8,
            decode_tokens: 3,
            decode_prompt: 6,
            reduce,
            ..Default::default()
        };
        let load = || worker::collect::Collector::load(&model, opts.clone()).unwrap();
        let mut worker = load();
        worker.run(&index, first, &mut |_, _| {}).unwrap();
        let kept = worker.run(&index, next, &mut |_, _| {}).unwrap();
        let fresh = load().run(&index, next, &mut |_, _| {}).unwrap();
        assert_eq!(
            kept.partial.to_bytes(),
            fresh.partial.to_bytes(),
            "{reduce:?}"
        );
        let (k, f) = (kept.partial.backend_to_host, fresh.partial.backend_to_host);
        assert_eq!(
            (k.tokens, k.bytes),
            (f.tokens, f.bytes),
            "{reduce:?}: bytes"
        );
        assert!(k.bytes > 0, "{reduce:?}");
        assert_eq!(kept.trace, fresh.trace, "{reduce:?}: trace");
        assert!(!kept.decode_trace.is_empty(), "{reduce:?}: no decode trace");
        assert_eq!(kept.decode_trace, fresh.decode_trace, "{reduce:?}");
    }
    let other = dir.path().join("other_K8.gguf");
    synth::write_model(Preset::Tiny, 8, &other).unwrap();
    let cands = worker::eval::candidates::from_files(&[other]).unwrap();
    for compare in [Compare::Host, Compare::Device] {
        let opts = EvalOptions {
            n_ubatch: 16,
            threads: 2,
            compare,
            ..EvalOptions::default()
        };
        let load = || Evaluator::load(&model, &cands, opts.clone()).unwrap();
        let mut worker = load();
        worker.run(&index, first, &mut |_, _| {}).unwrap();
        let kept = worker.run(&index, next, &mut |_, _| {}).unwrap();
        let fresh = load().run(&index, next, &mut |_, _| {}).unwrap();
        assert_eq!(kept.partial, fresh.partial, "{compare:?}");
        assert!(kept.partial.candidates[0].tokens.iter().any(|t| t.kl > 0.0));
        assert_eq!(kept.cost.bytes, fresh.cost.bytes, "{compare:?}: bytes");
        assert_eq!(kept.cost.comparisons, fresh.cost.comparisons);
    }
}
