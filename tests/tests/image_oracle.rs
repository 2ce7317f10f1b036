//! An independent check of the image positions' statistics (issue #25): one
//! image record runs through mtmd's own helper (`mtmd_helper_eval_chunks`:
//! mtmd tokenizes the prompt, encodes the image and decodes the text and
//! the embeddings itself) on a plain llama.cpp context whose eval callback
//! dumps the router output of the first MoE layer; the test recomputes each
//! expert's count and prob_sum from that dump and compares them with what
//! the collector measures on the same positions (text ids and the image's
//! marker ids, its span where mtmd put it). Nothing of the collector's
//! feeding code runs on the oracle's side.

use fixtures::mtmd_record::{as_chunk, sample_image, MtmdRecord, Piece};
use llama_cpp_sys_2 as sys;
use numbers::stats::GroupKey;
use numbers::{Modality, Split};
use std::ffi::{c_void, CStr};
use std::path::Path;
use synth::mmproj::{text_hidden_size, write_mmproj, MmprojSpec};
use synth::Preset;
use worker::collect::{CollectOptions, Collector};
use worker::images::ImageBytes;

/// Context size and micro-batch of both sides: every piece of the record
/// (text, image, text) is decoded in one batch by each.
const N_CTX: u32 = 128;

/// The router output of one layer, as the eval callback saw it.
#[derive(Default)]
struct Dump {
    probs_name: String,
    topk_name: String,
    /// Per position: the router's probability of every expert.
    probs: Vec<Vec<f32>>,
    /// Per position: the selected experts.
    topk: Vec<Vec<i32>>,
}

/// Reads the element at byte offset `offset` of a host tensor.
///
/// # Safety
/// `t` is a live tensor whose data is in host memory, holding a `T` there.
unsafe fn at<T: Copy>(t: &sys::ggml_tensor, offset: usize) -> T {
    std::ptr::read_unaligned((t.data as *const u8).add(offset) as *const T)
}

unsafe extern "C" fn dump_router(t: *mut sys::ggml_tensor, ask: bool, user: *mut c_void) -> bool {
    let dump = &mut *(user as *mut Dump);
    let t = &*t;
    let name = CStr::from_ptr(t.name.as_ptr()).to_string_lossy();
    let (probs, topk) = (name == dump.probs_name, name == dump.topk_name);
    if ask {
        return probs || topk;
    }
    let (ne, nb) = (t.ne, t.nb);
    if probs {
        // [n_expert, n_tokens]
        for j in 0..ne[1] as usize {
            let row = (0..ne[0] as usize).map(|i| at::<f32>(t, i * nb[0] + j * nb[1]));
            dump.probs.push(row.collect());
        }
    } else if topk {
        // [k, n_tokens], or [1, k, n_tokens]: token j's i-th choice.
        let (k, n, (si, sj)) = match ne[0] {
            1 => (ne[1], ne[2], (nb[1], nb[2])),
            _ => (ne[0], ne[1], (nb[0], nb[1])),
        };
        for j in 0..n as usize {
            let row = (0..k as usize).map(|i| at::<i32>(t, i * si + j * sj));
            dump.topk.push(row.collect());
        }
    }
    true
}

/// What mtmd made of the record, and the router dump of its decode.
struct Oracle {
    /// Text token ids and the image's positions at its place, in order.
    pieces: Vec<Piece>,
    dump: Dump,
}

/// Runs `prompt` (one media marker) with `image` through mtmd's helper on
/// `model` and `mmproj`, dumping block `layer`'s router output.
fn oracle(model: &Path, mmproj: &Path, prompt: &str, image: &[u8], layer: u32) -> Oracle {
    let mut dump = Box::new(Dump {
        probs_name: format!("ffn_moe_probs-{layer}"),
        topk_name: format!("ffn_moe_topk-{layer}"),
        ..Dump::default()
    });
    let record = MtmdRecord::load(model, mmproj, prompt, image);
    // SAFETY: a plain llama.cpp context of the record's model, freed before
    // the record; the dump outlives the context whose callback writes it;
    // tensors the callback reads are host tensors (CPU build).
    unsafe {
        let mut cp = fixtures::llama_logits::oracle_context_params(N_CTX, N_CTX, 2, false);
        cp.cb_eval = Some(dump_router);
        cp.cb_eval_user_data = (&mut *dump as *mut Dump).cast();
        let ctx = sys::llama_init_from_model(record.model(), cp);
        assert!(!ctx.is_null(), "a context");
        record.eval_with_helper(ctx, N_CTX as i32);
        sys::llama_free(ctx);
    }
    Oracle {
        pieces: record.pieces(false),
        dump: *dump,
    }
}

#[test]
fn image_positions_route_as_mtmds_own_helper_decodes_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let mmproj = dir.path().join("mmproj.gguf");
    write_mmproj(
        &MmprojSpec::tiny(text_hidden_size(&model).unwrap()),
        0,
        &mmproj,
    )
    .unwrap();
    let (image, sha) = sample_image();

    let opts = CollectOptions {
        n_ubatch: N_CTX,
        threads: 2,
        trace_every: 0,
        ..CollectOptions::default()
    };
    let mut collector = Collector::load(&model, opts).unwrap();
    let layers = collector.shape().moe_layers.clone();
    // The first MoE block: not the last block, where llama.cpp keeps only
    // the rows with outputs (the helper asks for the last token's alone).
    let layer = layers[0];
    assert!(layers.len() > 1, "{layers:?}");

    let prompt = "Look at this: <__media__> It is a red square on white.";
    let o = oracle(&model, &mmproj, prompt, &image, layer);

    // The record as a chunk: mtmd's text ids, the image's marker ids where
    // mtmd put it.
    let chunk = as_chunk(&o.pieces, &sha);
    let (tokens, images) = (&chunk.tokens, &chunk.images);
    assert_eq!(images.len(), 1);
    let (image_len, chunk_image_start) = (images[0].len, images[0].start);
    assert_eq!(
        o.dump.probs.len(),
        tokens.len(),
        "one router row per position"
    );
    assert_eq!(o.dump.topk.len(), tokens.len());
    let index = fixtures::write_corpus(dir.path(), std::slice::from_ref(&chunk), N_CTX);
    collector.load_mmproj(&mmproj).unwrap();
    let bytes: ImageBytes = [(sha.clone(), bytes::Bytes::from(image))].into();
    let collected = collector
        .run_with_images(&index, &[chunk], &bytes, &mut |_, _| {})
        .unwrap();
    let experts = &collected.partial.experts;
    // The image's positions are their own group: one per modality.
    let keys: Vec<_> = experts.groups.keys().map(|k| k.modality).collect();
    assert_eq!(keys, [Modality::Text, Modality::Image]);
    let image_group = &experts.groups[&GroupKey {
        modality: Modality::Image,
        ..GroupKey::text(Split::Fit, "en")
    }];
    assert_eq!(image_group.n_tokens, image_len as u64);
    let total = experts.split_total(Split::Fit).unwrap().unwrap();
    let measured = total.layers.iter().find(|l| l.layer == layer).unwrap();

    let n_expert = measured.count.len();
    // The image rows of the dump alone give the image group's counts.
    let start = chunk_image_start as usize;
    let mut image_count = vec![0u64; n_expert];
    for topk in &o.dump.topk[start..start + image_len as usize] {
        for &e in topk {
            image_count[e as usize] += 1;
        }
    }
    let image_layer = image_group
        .layers
        .iter()
        .find(|l| l.layer == layer)
        .unwrap();
    assert_eq!(
        image_layer.count, image_count,
        "image positions' counts, layer {layer}"
    );
    let mut count = vec![0u64; n_expert];
    let mut prob_sum = vec![0f64; n_expert];
    for (probs, topk) in o.dump.probs.iter().zip(&o.dump.topk) {
        for &e in topk {
            count[e as usize] += 1;
        }
        for (s, &p) in prob_sum.iter_mut().zip(probs) {
            *s += f64::from(p);
        }
    }
    assert_eq!(measured.count, count, "counts per expert, layer {layer}");
    for (e, (m, o)) in measured.prob_sum.iter().zip(&prob_sum).enumerate() {
        let m = m.to_f64();
        assert!(
            (m - o).abs() <= 1e-9 * o.abs().max(1.0),
            "expert {e}: prob_sum {m} vs {o}"
        );
    }
}
