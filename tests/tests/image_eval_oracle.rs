//! An independent check of evaluation on images (issue #25): one image
//! record of a model whose last two experts serve image positions only, and
//! a candidate sliced without them. mtmd tokenizes the record and encodes
//! its image; plain llama.cpp contexts then decode it one position at a time
//! (a token, or one row of the image's embedding), and the test computes
//! each scored position's KL(base || candidate) in f64 from those logits and
//! its modality from the record's layout. The evaluator, decoding the same
//! record in micro-batches cut at the image's edges, must score the same
//! positions in the same modalities with the same KL. None of the worker's
//! feeding, scoring or grouping code runs on the oracle's side.

use fixtures::mtmd_record::{as_chunk, sample_image, MtmdRecord, Piece};
use llama_cpp_sys_2 as sys;
use numbers::eval::{EvalSummary, TokenKl};
use numbers::Modality;
use numbers::Split;
use runfiles::keepmap::KeepMap;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::Path;
use synth::mmproj::{write_mmproj, MmprojSpec};
use synth::{Overrides, Preset};
use worker::eval::{Candidate, Compare, EvalOptions, Evaluator};
use worker::images::ImageBytes;

/// Context size of both sides.
const N_CTX: u32 = 128;
/// The evaluator's micro-batch: smaller than the image, so its positions
/// span several micro-batches.
const N_UBATCH: u32 = 6;
/// Experts of the tiny preset, and how many of them serve images.
const N_EXPERT: u32 = 16;
const N_VISION: u32 = 2;

/// Every position's logits of `model` on `pieces`, each position decoded
/// alone (f32 KV cache, one sequence, causal attention).
fn logits(model: &Path, pieces: &[Piece], n_embd: usize) -> Vec<Vec<f32>> {
    let c_model = CString::new(model.to_str().unwrap()).unwrap();
    let mut out = Vec::new();
    // SAFETY: plain llama.cpp C calls on handles this function creates and
    // frees; each batch holds one entry, filled before its decode.
    unsafe {
        let m =
            sys::llama_model_load_from_file(c_model.as_ptr(), sys::llama_model_default_params());
        assert!(!m.is_null(), "{} loads", model.display());
        let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(m)) as usize;
        let cp = fixtures::llama_logits::oracle_context_params(N_CTX, N_CTX, 2, true);
        let ctx = sys::llama_init_from_model(m, cp);
        assert!(!ctx.is_null(), "a context");
        let tok = sys::llama_batch_init(1, 0, 1);
        let emb = sys::llama_batch_init(1, n_embd as i32, 1);
        let mut pos = 0;
        let mut decode = |b: sys::llama_batch, pos: i32| {
            *b.pos = pos;
            *b.n_seq_id = 1;
            **b.seq_id = 0;
            *b.logits = 1;
            let mut b = b;
            b.n_tokens = 1;
            assert_eq!(sys::llama_decode(ctx, b), 0, "position {pos} decodes");
            let row = std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx, -1), n_vocab);
            out.push(row.to_vec());
        };
        for piece in pieces {
            match piece {
                Piece::Text(ids) => {
                    for &id in ids {
                        *tok.token = id;
                        decode(tok, pos);
                        pos += 1;
                    }
                }
                Piece::Image { rows, .. } => {
                    let rows = rows.as_ref().expect("the image is encoded");
                    for row in rows.chunks_exact(n_embd) {
                        std::ptr::copy_nonoverlapping(row.as_ptr(), emb.embd, n_embd);
                        decode(emb, pos);
                        pos += 1;
                    }
                }
            }
        }
        sys::llama_batch_free(tok);
        sys::llama_batch_free(emb);
        sys::llama_free(ctx);
        sys::llama_model_free(m);
    }
    out
}

fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (fixtures::log_softmax(p), fixtures::log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// Keeps experts `0..N_EXPERT - N_VISION` of every MoE layer of `base`.
fn without_vision_experts(base: &Path, dir: &Path) -> Candidate {
    let k = N_EXPERT - N_VISION;
    let oracle = fixtures::oracle::Oracle::load(base);
    assert_eq!(oracle.n_expert(), N_EXPERT as usize);
    let layers = oracle
        .moe_layers()
        .into_iter()
        .map(|l| (l, (0..k).collect()))
        .collect();
    let map = KeepMap {
        method: "text_only".into(),
        k,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers,
    };
    let path = dir.join(format!("text_only_K{k}.gguf"));
    let sliced = slicer::slice_model(base, &map, &path).unwrap();
    Candidate {
        name: format!("text_only_K{k}"),
        path,
        sha256: sliced.sha256,
    }
}

#[test]
fn image_conditioned_kl_equals_a_position_by_position_recomputation() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("vision.gguf");
    let o = Overrides {
        vision_experts: Some(N_VISION as usize),
        ..Overrides::default()
    };
    synth::write_model_with(Preset::Tiny, 0, o, &model).unwrap();
    let mmproj = dir.path().join("mmproj.gguf");
    write_mmproj(&MmprojSpec::for_model(&model).unwrap(), 0, &mmproj).unwrap();
    let candidate = without_vision_experts(&model, dir.path());
    let (image, sha) = sample_image();

    let prompt = "Look at this: <__media__> It is a red square on white.";
    let record = MtmdRecord::load(&model, &mmproj, prompt, &image);
    let (pieces, n_embd) = (record.pieces(true), record.n_embd());
    let base_logits = logits(&model, &pieces, n_embd);
    let cand_logits = logits(&candidate.path, &pieces, n_embd);

    // The record as a chunk: mtmd's text ids, the image's marker ids.
    let chunk = as_chunk(&pieces, &sha);
    let (tokens, images) = (&chunk.tokens, &chunk.images);
    assert_eq!(images.len(), 1);
    let (start, len) = (images[0].start as usize, images[0].len as usize);
    assert!(
        start > 1 && start + len + 1 < tokens.len(),
        "text before and after the image"
    );
    assert!(len > N_UBATCH as usize, "the image spans micro-batches");

    // The oracle: a position is scored when its next position is text; it
    // is image-conditioned from the image's first position on.
    let oracle: Vec<(u32, Modality, f64)> = (0..tokens.len() - 1)
        .filter(|&p| !(start..start + len).contains(&(p + 1)))
        .map(|p| {
            let m = if p >= start {
                Modality::Image
            } else {
                Modality::Text
            };
            (p as u32, m, kl(&base_logits[p], &cand_logits[p]))
        })
        .collect();

    let index = fixtures::write_corpus(dir.path(), std::slice::from_ref(&chunk), N_CTX);
    let opts = EvalOptions {
        n_ubatch: N_UBATCH,
        threads: 2,
        f32_kv: true,
        compare: Compare::Host,
        ..EvalOptions::default()
    };
    let mut evaluator = Evaluator::load(&model, std::slice::from_ref(&candidate), opts).unwrap();
    let err = evaluator
        .run(&index, std::slice::from_ref(&chunk), &mut |_, _| {})
        .err()
        .expect("an image chunk needs the mmproj");
    assert!(err.to_string().contains("no mmproj loaded"), "{err}");
    evaluator.load_mmproj(&mmproj).unwrap();
    let bytes: ImageBytes = [(sha.clone(), bytes::Bytes::from(image))].into();
    let evaluated = evaluator
        .run_with_images(&index, &[chunk], &bytes, &mut |_, _| {})
        .unwrap();
    let tokens: &[TokenKl] = &evaluated.partial.candidates[0].tokens;
    let got: Vec<(u32, Modality)> = tokens.iter().map(|t| (t.pos, t.group.modality)).collect();
    let want: Vec<(u32, Modality)> = oracle.iter().map(|&(p, m, _)| (p, m)).collect();
    assert_eq!(got, want, "scored positions and their modalities");
    for (t, &(pos, _, kl)) in tokens.iter().zip(&oracle) {
        assert!(
            (t.kl - kl).abs() <= 1e-3 * kl.abs() + 1e-6,
            "position {pos}: KL {} vs the oracle's {kl}",
            t.kl
        );
    }

    // Per modality in the summary: the oracle's counts and means; dropping
    // the vision experts costs the image-conditioned positions more.
    let s = EvalSummary::of(&evaluated.partial, &["en".into()]);
    let fit = &s.candidates[0].splits[&Split::Fit];
    let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for &(_, m, kl) in &oracle {
        by.entry(m.as_str()).or_default().push(kl);
    }
    for (m, kls) in &by {
        let f = &fit.modalities[*m];
        let mean = kls.iter().sum::<f64>() / kls.len() as f64;
        assert_eq!(f.n, kls.len() as u64, "{m}");
        assert!(
            (f.kl.mean - mean).abs() <= 1e-3 * mean + 1e-6,
            "{m}: {} vs {mean}",
            f.kl.mean
        );
    }
    assert!(
        fit.modalities["image"].kl.mean > 10.0 * fit.modalities["text"].kl.mean,
        "{:?}",
        fit.modalities
    );
}
