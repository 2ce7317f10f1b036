//! Each split gets its own trace stride: fit tokens of every n-th chunk and
//! held-out tokens of every m-th chunk are traced, nothing else, and the
//! partial's traced-token count says exactly that.

use numbers::Split;
use std::collections::BTreeSet;
use synth::Preset;
use worker::collect::{CollectOptions, Collector};

const N_CTX: u32 = 48;
const N_CHUNKS: u32 = 7;

#[test]
fn fit_and_heldout_tokens_are_traced_with_their_own_strides() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let chunks = fixtures::chunks(N_CHUNKS, N_CTX);
    let index = fixtures::write_corpus(dir.path(), &chunks, N_CTX);
    let (fit_every, heldout_every) = (2u32, 3u32);
    let opts = CollectOptions {
        n_ubatch: 16,
        threads: 2,
        trace_every: fit_every,
        trace_every_heldout: Some(heldout_every),
        trace_top_n: 8,
        ..Default::default()
    };
    let mut collector = Collector::load(&model, opts).unwrap();
    let layers = collector.shape().moe_layers.clone();
    let c = collector.run(&index, &chunks, &mut |_, _| {}).unwrap();

    // The oracle: every (chunk, pos) whose split's stride divides the chunk id.
    let mut want = BTreeSet::new();
    for chunk in &chunks {
        for s in &chunk.spans {
            let every = match s.split {
                Split::Fit => fit_every,
                Split::Heldout => heldout_every,
            };
            if chunk.id.0 % every == 0 {
                for pos in s.start..s.start + s.len {
                    want.insert((chunk.id.0, pos, s.split));
                }
            }
        }
    }
    let splits: BTreeSet<Split> = want.iter().map(|w| w.2).collect();
    assert_eq!(splits.len(), 2, "the oracle covers both splits");
    // A chunk traced for one split only must be in the oracle for that one.
    assert!(want.iter().any(|w| w.0 == 2 && w.2 == Split::Fit));
    assert!(!want.iter().any(|w| w.0 == 2 && w.2 == Split::Heldout));
    assert!(want.iter().any(|w| w.0 == 3 && w.2 == Split::Heldout));

    let mut got = BTreeSet::new();
    for layer in &layers {
        let rows: BTreeSet<(u32, u32, Split)> = c
            .trace
            .iter()
            .filter(|r| r.layer == *layer)
            .map(|r| (r.chunk, r.pos, r.split))
            .collect();
        assert_eq!(rows, want, "layer {layer}");
        got.extend(rows);
    }
    assert_eq!(c.trace.len(), want.len() * layers.len(), "no row twice");
    assert_eq!(got, want);
    assert_eq!(c.partial.trace_tokens, want.len() as u64);
    assert_eq!(c.partial.trace_rows, c.trace.len() as u64);
}
