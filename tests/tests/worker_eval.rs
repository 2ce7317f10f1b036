//! `worker eval` as users run it: a keep-all candidate costs nothing (KL
//! exactly 0, every top-1 the same), and the worker's KL, NLL and top-1
//! figures (on the f64 host path) equal an independent f64 recomputation
//! from dumped logits.

use fixtures::run_ok;
use numbers::eval::{EvalPartial, EvalSummary, Group};
use numbers::Split;
use runfiles::corpus::Chunk;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use synth::Preset;

const N_CTX: u32 = 40;

fn eval(model: &Path, candidates: &[&Path], corpus: &Path, out: &Path, extra: &[&str]) {
    let threads = ["--threads", "2", "--n-ubatch", "16"];
    let mut args = fixtures::worker_args("eval", model, corpus, "0..3", out, &threads);
    for c in candidates {
        args.extend(["--candidate", c.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    run_ok("worker", &args);
}

fn summary(out: &Path) -> EvalSummary {
    serde_json::from_slice(&std::fs::read(out.join("eval/summary.json")).unwrap()).unwrap()
}

fn partial(out: &Path) -> EvalPartial {
    EvalPartial::from_bytes(
        &std::fs::read(out.join("eval/partials/part-00000000-00000003.bin")).unwrap(),
    )
    .unwrap()
}

#[test]
fn a_keep_all_candidate_has_zero_kl_and_the_same_top1_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let same = dir.path().join("keep_all_K16.gguf");
    std::fs::copy(&model, &same).unwrap();
    let corpus = fixtures::corpus_dir(dir.path(), "run", 3, N_CTX);
    let out = dir.path().join("out");
    eval(&model, &[&same], &corpus, &out, &["--skip-first", "0"]);
    let s = summary(&out);
    let c = &s.candidates[0];
    assert_eq!((c.name.as_str(), c.k), ("keep_all_K16", 16));
    for split in Split::ALL {
        let f = &c.splits[&split].all;
        assert!(f.n > 20, "{split}: {} positions", f.n);
        assert_eq!(f.kl.mean, 0.0, "{split}");
        assert_eq!(f.kl.max, 0.0, "{split}");
        assert_eq!(f.top1_same, 1.0, "{split}");
        assert_eq!(f.ppl_ratio, 1.0, "{split}");
        assert_eq!(f.dprob_mean, 0.0, "{split}");
        assert!(f.ppl_base > 1.0, "{split}: perplexity {}", f.ppl_base);
    }
}

/// Independent definition of the scored positions: the next token exists
/// and lies in the same span.
fn positions(chunk: &Chunk) -> Vec<(u32, Group)> {
    let mut out = Vec::new();
    for s in &chunk.spans {
        for pos in s.start..s.start + s.len - 1 {
            out.push((pos, Group::text(s.split, s.domain)));
        }
    }
    out
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for i in 1..row.len() {
        if row[i] > row[best] {
            best = i;
        }
    }
    best
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-15
}

/// The tiny model, another of its shape (other weights) as the candidate,
/// and a corpus of 3 chunks under `dir/run`, with its chunks.
fn model_and_other(dir: &Path) -> (PathBuf, PathBuf, PathBuf, Vec<Chunk>) {
    let model = fixtures::model(dir, Preset::Tiny);
    let other = dir.join("other_K16.gguf");
    synth::write_model(Preset::Tiny, 8, &other).unwrap();
    let corpus = dir.join("run");
    let chunks = fixtures::chunks(3, N_CTX);
    fixtures::write_corpus(&corpus, &chunks, N_CTX);
    (model, other, corpus, chunks)
}

#[test]
fn worker_figures_equal_an_f64_recomputation_from_dumped_logits() {
    let dir = tempfile::tempdir().unwrap();
    let (model, other, corpus, chunks) = model_and_other(dir.path());
    let (out, dumps) = (dir.path().join("out"), dir.path().join("dumps"));
    eval(
        &model,
        &[&other],
        &corpus,
        &out,
        // The f64 reference path: its figures equal a textbook f64
        // recomputation to 1e-9 (the device path's f32 tolerance is
        // tests/tests/output_head.rs's).
        &[
            "--compare",
            "host",
            "--skip-first",
            "0",
            "--dump-logits",
            dumps.to_str().unwrap(),
        ],
    );
    let p = partial(&out);
    let cand = &p.candidates[0];
    let kl_of: BTreeMap<(u32, u32), f64> = cand
        .tokens
        .iter()
        .map(|t| ((t.chunk, t.pos), t.kl))
        .collect();
    // Expected sums per group: (n, base NLL, candidate NLL, same top-1).
    let mut expected: BTreeMap<Group, (u64, f64, f64, u64)> = BTreeMap::new();
    let mut n_checked = 0;
    let mut kl_positive = 0;
    for chunk in &chunks {
        let base = read_f32(&dumps.join(format!("chunk-{}-model-0.f32", chunk.id.0)));
        let cand_logits = read_f32(&dumps.join(format!("chunk-{}-model-1.f32", chunk.id.0)));
        let n_vocab = base.len() / chunk.tokens.len();
        assert_eq!(base.len(), n_vocab * chunk.tokens.len());
        assert_eq!(cand_logits.len(), base.len());
        for (pos, group) in positions(chunk) {
            let row = |l: &[f32]| l[pos as usize * n_vocab..(pos as usize + 1) * n_vocab].to_vec();
            let (a, b) = (row(&base), row(&cand_logits));
            let (lp, lq) = (fixtures::log_softmax(&a), fixtures::log_softmax(&b));
            let kl: f64 = lp
                .iter()
                .zip(&lq)
                .map(|(p, q)| {
                    if p.exp() > 0.0 {
                        p.exp() * (p - q)
                    } else {
                        0.0
                    }
                })
                .sum();
            let got = kl_of[&(chunk.id.0, pos)];
            assert!(
                close(got, kl),
                "chunk {} pos {pos}: KL {got} vs {kl}",
                chunk.id
            );
            kl_positive += usize::from(kl > 1e-6);
            let next = chunk.tokens[pos as usize + 1] as usize;
            let e = expected.entry(group).or_default();
            e.0 += 1;
            e.1 -= lp[next];
            e.2 -= lq[next];
            e.3 += u64::from(argmax(&a) == argmax(&b));
            n_checked += 1;
        }
    }
    assert_eq!(kl_of.len(), n_checked, "the worker scored other positions");
    assert!(kl_positive > n_checked / 2, "the candidate barely differs");
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        cand.groups.keys().collect::<Vec<_>>()
    );
    for (g, (n, nll_base, nll_cand, same)) in &expected {
        let s = &cand.groups[g];
        assert_eq!((s.n, p.base[g].n), (*n, *n), "{g:?}");
        assert_eq!(s.top1_same, *same, "{g:?}");
        assert!(close(p.base[g].nll.to_f64(), *nll_base), "{g:?} base NLL");
        assert!(close(s.nll.to_f64(), *nll_cand), "{g:?} candidate NLL");
    }
    assert!(expected.keys().any(|g| g.split == Split::Heldout));
}

/// llama-perplexity's percentile: linear interpolation at rank q (n - 1)
/// (its median, the mean of the two middle values, is the same).
fn llama_percentile(sorted: &[f64], q: f64) -> f64 {
    let at = q * (sorted.len() - 1) as f64;
    let i = at as usize;
    let frac = at - i as f64;
    (1.0 - frac) * sorted[i] + frac * sorted[(i + 1).min(sorted.len() - 1)]
}

/// llama-perplexity's setup: chunks of `n_ctx` tokens of one document
/// each, `--kl-divergence` scoring positions `n_ctx / 2 ..= n_ctx - 2` of
/// every chunk. With its default positions, `worker eval`'s figures are
/// llama-perplexity's KL block recomputed in f64 from the dumped logits:
/// `Mean KLD` with its error, the percentiles, RMS Δp, same top p with its
/// error and the perplexity ratio.
#[test]
fn default_positions_and_kl_block_are_llama_perplexitys() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let other = dir.path().join("other_K16.gguf");
    synth::write_model(Preset::Tiny, 8, &other).unwrap();
    let corpus = dir.path().join("run");
    let chunks: Vec<Chunk> = fixtures::chunks(3, N_CTX)
        .into_iter()
        .map(|mut c| {
            c.tokens.resize(N_CTX as usize, 7);
            c.spans = vec![runfiles::corpus::Span {
                start: 0,
                len: N_CTX,
                split: Split::Heldout,
                domain: 0,
                doc: c.id.0,
                group: c.id.0,
            }];
            c
        })
        .collect();
    fixtures::write_corpus(&corpus, &chunks, N_CTX);
    let (out, dumps) = (dir.path().join("out"), dir.path().join("dumps"));
    let dump = [
        "--compare",
        "host",
        "--dump-logits",
        dumps.to_str().unwrap(),
    ];
    eval(&model, &[&other], &corpus, &out, &dump);
    let (mut kld, mut dp2, mut same) = (Vec::new(), Vec::new(), 0usize);
    let (mut nll, mut nll_base) = (0.0, 0.0);
    for chunk in &chunks {
        let base = read_f32(&dumps.join(format!("chunk-{}-model-0.f32", chunk.id.0)));
        let cand = read_f32(&dumps.join(format!("chunk-{}-model-1.f32", chunk.id.0)));
        let n_vocab = base.len() / N_CTX as usize;
        let first = (N_CTX / 2) as usize;
        for j in first..N_CTX as usize - 1 {
            let row = |l: &[f32]| l[j * n_vocab..(j + 1) * n_vocab].to_vec();
            let (a, b) = (row(&base), row(&cand));
            let (lp, lq) = (fixtures::log_softmax(&a), fixtures::log_softmax(&b));
            kld.push(
                lp.iter()
                    .zip(&lq)
                    .map(|(p, q)| p.exp() * (p - q))
                    .sum::<f64>(),
            );
            let next = chunk.tokens[j + 1] as usize;
            dp2.push((lq[next].exp() - lp[next].exp()).powi(2));
            same += usize::from(argmax(&a) == argmax(&b));
            (nll, nll_base) = (nll - lq[next], nll_base - lp[next]);
        }
    }
    let count = kld.len() as f64;
    assert_eq!(kld.len(), 3 * (N_CTX as usize - 1 - N_CTX as usize / 2));
    let f = summary(&out).candidates[0].splits[&Split::Heldout]
        .all
        .clone();
    assert_eq!(f.n, kld.len() as u64);
    let mean = kld.iter().sum::<f64>() / count;
    // llama-perplexity's mean_and_uncertainty.
    let sum2 = kld.iter().map(|v| v * v).sum::<f64>();
    let err = ((sum2 / count - mean * mean) / (count - 1.0)).sqrt();
    assert!(close(f.kl.mean, mean), "Mean KLD {} vs {mean}", f.kl.mean);
    assert!(
        (f.kl.se_positions - err).abs() < 1e-9 * err,
        "{} vs {err}",
        f.kl.se_positions
    );
    kld.sort_by(f64::total_cmp);
    for (q, got) in [
        (0.999, f.kl.p999),
        (0.99, f.kl.p99),
        (0.95, f.kl.p95),
        (0.9, f.kl.p90),
        (0.5, f.kl.p50),
        (0.1, f.kl.p10),
        (0.05, f.kl.p5),
        (0.01, f.kl.p1),
        (0.001, f.kl.p01),
    ] {
        let want = llama_percentile(&kld, q);
        assert!(
            (got - want).abs() <= 1e-9 * want.abs() + 1e-15,
            "{q}: {got} vs {want}"
        );
    }
    assert!(close(f.kl.max, kld[kld.len() - 1]) && close(f.kl.min, kld[0]));
    let rms = (dp2.iter().sum::<f64>() / count).sqrt();
    assert!(close(f.dprob_rms, rms), "RMS Δp {} vs {rms}", f.dprob_rms);
    let top = same as f64 / count;
    assert_eq!(f.top1_same, top);
    assert!(top < 1.0, "same top p {top}: the candidate differs");
    let ratio = ((nll - nll_base) / count).exp();
    assert!(close(f.ppl_ratio, ratio), "{} vs {ratio}", f.ppl_ratio);
    // The interval is by chunk clusters: three chunks, t(0.975, 2).
    assert_eq!(f.chunks, 3);
    assert!((f.kl.hi - f.kl.mean - 4.3027 * f.kl.se).abs() < 1e-12);
}

#[test]
fn skip_first_and_split_limit_the_scored_positions() {
    let dir = tempfile::tempdir().unwrap();
    let (model, other, corpus, chunks) = model_and_other(dir.path());
    let out = dir.path().join("out");
    let half = (N_CTX / 2).to_string();
    eval(
        &model,
        &[&other],
        &corpus,
        &out,
        &["--skip-first", &half, "--split", "heldout"],
    );
    let p = partial(&out);
    let expected: usize = chunks
        .iter()
        .flat_map(positions)
        .filter(|(pos, g)| *pos >= N_CTX / 2 && g.split == Split::Heldout)
        .count();
    assert_eq!(p.candidates[0].tokens.len(), expected);
    assert!(p.candidates[0].tokens.iter().all(|t| t.pos >= N_CTX / 2));
    assert_eq!(
        summary(&out).candidates[0]
            .splits
            .keys()
            .collect::<Vec<_>>(),
        [&Split::Heldout]
    );
}

#[test]
fn a_candidate_without_experts_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let dense = fixtures::model(dir.path(), Preset::Dense);
    let corpus = fixtures::corpus_dir(dir.path(), "run", 3, N_CTX);
    let (dest, candidate) = (
        dir.path().join("out"),
        ["--candidate", dense.to_str().unwrap()],
    );
    let out = fixtures::run(
        "worker",
        &fixtures::worker_args("eval", &model, &corpus, "0..3", &dest, &candidate),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("dense.gguf") && err.contains("no MoE layers"),
        "{err}"
    );
    assert!(
        !dir.path().join("out/eval").exists(),
        "a failed eval left files"
    );
}
