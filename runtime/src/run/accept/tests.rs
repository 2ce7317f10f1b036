use super::*;
use gguf::model_check::MoeFacts;
use numbers::{ChunkId, Split};
use runfiles::corpus::Span;
use synth::fake::FakeModel;

const MODEL: &str = "model-sha";

/// Six chunks of 10 tokens: 4 fit tokens of domain `id % 2`, then 6
/// held-out tokens of domain 1.
fn corpus() -> (CorpusIndex, Vec<Chunk>) {
    let chunks: Vec<Chunk> = (0..6u32)
        .map(|id| Chunk {
            id: ChunkId(id),
            tokens: (0..10).map(|t| (id * 10 + t) as i32).collect(),
            spans: vec![
                Span {
                    start: 0,
                    len: 4,
                    split: Split::Fit,
                    domain: (id % 2) as u16,
                    doc: 2 * id,
                    group: 2 * id,
                },
                Span {
                    start: 4,
                    len: 6,
                    split: Split::Heldout,
                    domain: 1,
                    doc: 2 * id + 1,
                    group: 2 * id + 1,
                },
            ],
            images: Vec::new(),
        })
        .collect();
    let index = CorpusIndex {
        n_chunks: 6,
        n_ctx: 10,
        domains: vec!["en".into(), "ja".into()],
        n_tokens: 60,
        chunks_sha256: "corpus-sha".into(),
        eval_sets: Vec::new(),
        groups: Vec::new(),
    };
    (index, chunks)
}

fn units() -> Vec<ChunkRange> {
    vec![r(0, 3), r(3, 6)]
}

fn r(start: u32, end: u32) -> ChunkRange {
    ChunkRange { start, end }
}

fn acceptance(model: Option<MoeFacts>) -> (Acceptance, Vec<Chunk>, CorpusIndex) {
    let (index, chunks) = corpus();
    let a = Acceptance::new(MODEL, &index, &chunks, &units(), model).unwrap();
    (a, chunks, index)
}

fn honest(index: &CorpusIndex, chunks: &[Chunk], unit: ChunkRange) -> Partial {
    FakeModel::new(MODEL)
        .partial(index, &chunks[unit.start as usize..unit.end as usize])
        .unwrap()
}

#[test]
fn honest_partials_are_accepted_as_bytes_and_as_values() {
    let (a, chunks, index) = acceptance(Some(MoeFacts {
        n_expert: 8,
        n_expert_used: 2,
    }));
    for unit in units() {
        let p = honest(&index, &chunks, unit);
        let packed = a.decode_and_check(&[unit], p.to_bytes().into()).unwrap();
        assert_eq!(packed.decode(), p);
    }
}

#[test]
fn a_partial_of_another_range_model_or_corpus_is_refused() {
    let (a, chunks, index) = acceptance(None);
    let p = honest(&index, &chunks, r(0, 3));
    let e = a.check(&[r(3, 6)], &p).unwrap_err();
    assert!(e.contains("the lease was 3..6"), "{e}");
    let mut other = p.clone();
    other.model_sha256 = "evil\n\u{1b}[31m".into();
    let e = a.check(&[r(0, 3)], &other).unwrap_err();
    assert!(e.contains(r#"evil\n\u{1b}[31m"#), "escaped: {e}");
    assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e:?}");
    let mut other = p;
    other.corpus_sha256 = "x".repeat(5000);
    let e = a.check(&[r(0, 3)], &other).unwrap_err();
    assert!(
        e.len() < 300,
        "long claims are shortened: {} chars",
        e.len()
    );
}

#[test]
fn fabricated_token_counts_are_refused_even_when_counts_agree_with_them() {
    let (a, chunks, index) = acceptance(None);
    let mut p = honest(&index, &chunks, r(0, 3));
    // One more fit "en" token, with its k selections, so sum(count) still
    // equals n_tokens * k: only the corpus knows it is wrong.
    let key = GroupKey {
        split: Split::Fit,
        domain: "en".into(),
        modality: numbers::Modality::Text,
    };
    let g = p.experts.groups.get_mut(&key).unwrap();
    g.n_tokens += 1;
    for l in &mut g.layers {
        l.count[0] += 1;
        l.count[1] += 1;
    }
    let e = a.check(&[r(0, 3)], &p).unwrap_err();
    // Chunks 0..3: fit tokens 4 (en, chunk 0) + 4 (ja) + 4 (en, chunk 2).
    assert!(
        e.contains("fit/en: 9")
            && e.contains("the corpus has [fit/en: 8, fit/ja: 4, heldout/ja: 18]"),
        "{e}"
    );
}

#[test]
fn a_layer_whose_counts_do_not_add_to_tokens_times_k_is_refused() {
    let (a, chunks, index) = acceptance(None);
    let mut p = honest(&index, &chunks, r(3, 6));
    let g = p.experts.groups.values_mut().next().unwrap();
    g.layers[1].count[3] += 1;
    let e = a.check(&[r(3, 6)], &p).unwrap_err();
    assert!(e.contains("layer 1: sum(count) = "), "{e}");
    let mut p = honest(&index, &chunks, r(3, 6));
    let g = p.experts.groups.values_mut().next().unwrap();
    let n = g.n_tokens;
    let l = &mut g.layers[0];
    // Same sum (n x k with k = 2), but one expert counted more often than
    // there are tokens.
    l.count.iter_mut().for_each(|c| *c = 0);
    l.count[0] = n + 1;
    l.count[1] = n - 1;
    let e = a.check(&[r(3, 6)], &p).unwrap_err();
    assert!(e.contains("layer 0: expert 0 counted"), "{e}");
}

#[test]
fn shapes_are_checked_against_the_model_and_the_first_accepted_partial() {
    let (a, chunks, index) = acceptance(Some(MoeFacts {
        n_expert: 16,
        n_expert_used: 2,
    }));
    let e = a
        .check(&[r(0, 3)], &honest(&index, &chunks, r(0, 3)))
        .unwrap_err();
    assert!(e.contains("the model has 16 experts, top-2"), "{e}");

    let (a, chunks, index) = acceptance(None);
    a.check(&[r(0, 3)], &honest(&index, &chunks, r(0, 3)))
        .unwrap();
    let mut fake = FakeModel::new(MODEL);
    fake.layers = vec![0, 1, 2];
    let other = fake.partial(&index, &chunks[3..6]).unwrap();
    let e = a.check(&[r(3, 6)], &other).unwrap_err();
    assert!(e.contains("differs from the run's"), "{e}");
}

#[test]
fn decoding_refuses_trailing_bytes_and_lying_lengths() {
    let (a, chunks, index) = acceptance(None);
    let p = honest(&index, &chunks, r(0, 3));
    let mut bytes = p.to_bytes();
    bytes.extend_from_slice(&[0u8; 700]);
    let e = a.decode_and_check(&[r(0, 3)], bytes.into()).unwrap_err();
    assert!(e.contains("700 trailing bytes"), "{e}");
}

#[test]
fn a_checkpoint_of_several_units_is_checked_as_their_union() {
    let (a, chunks, index) = acceptance(None);
    let mut p = honest(&index, &chunks, r(0, 3));
    p.merge(&honest(&index, &chunks, r(3, 6))).unwrap();
    assert_eq!(p.chunks, [r(0, 6)]);
    a.decode_and_check(&units(), p.to_bytes().into()).unwrap();
    let e = a.check(&[r(0, 3)], &p).unwrap_err();
    assert!(e.contains("covers 0..6, the lease was 0..3"), "{e}");
    // The same chunks claimed for one unit of the plan that is no unit.
    let e = a.check(&[r(0, 6)], &p).unwrap_err();
    assert!(e.contains("0..6 is not a unit of the lease plan"), "{e}");
    // The tokens of both units, the chunks of one: refused.
    let mut short = p.clone();
    short.chunks = vec![r(0, 3)];
    let e = a.check(&[r(0, 3)], &short).unwrap_err();
    assert!(!e.is_empty());
}

#[test]
fn importance_matrix_sums_are_checked_in_their_packed_bytes_and_a_refused_partial_pins_nothing() {
    let (a, chunks, index) = acceptance(None);
    let mut p = honest(&index, &chunks, r(0, 3));
    let (name, e) = p
        .imatrix
        .entries
        .iter_mut()
        .find(|(_, e)| e.counts.iter().any(|&c| c > 0) && !e.in_sum2.is_empty())
        .expect("a tensor that saw rows");
    let name = name.clone();
    let n_in = e.n_in;
    let m = e.counts.iter().position(|&c| c > 0).unwrap();
    e.in_sum2[m * n_in as usize + 1] = numbers::exact::ExactSum(-3);
    let from_bytes = a
        .decode_and_check(&[r(0, 3)], p.to_bytes().into())
        .unwrap_err();
    let decoded = a.check(&[r(0, 3)], &p).unwrap_err();
    assert_eq!(from_bytes, decoded);
    assert!(
        from_bytes.contains(&format!("{name}: matrix {m} column 1: sum of squares")),
        "{from_bytes}"
    );
    // Refused, so it fixed no tensor shape: a partial where that tensor has
    // another shape is accepted, and fixes that shape for the next.
    let mut other = honest(&index, &chunks, r(0, 3));
    let e = other.imatrix.entries.get_mut(&name).unwrap();
    (e.n_in, e.in_sum2, e.in_sum) = (
        e.n_in * 2,
        [e.in_sum2.as_slice(), e.in_sum2.as_slice()].concat().into(),
        [e.in_sum.as_slice(), e.in_sum.as_slice()].concat().into(),
    );
    a.decode_and_check(&[r(0, 3)], other.to_bytes().into())
        .unwrap();
    let e = a
        .decode_and_check(
            &[r(0, 3)],
            honest(&index, &chunks, r(0, 3)).to_bytes().into(),
        )
        .unwrap_err();
    assert!(e.contains("earlier partials had"), "{e}");
}

/// Issue 42, finding 1: with the model's headers, every entry is one of the
/// model's weights with its shape, and each MoE layer's router is there;
/// the refusal comes from the partial's header, before any sum is unpacked.
#[test]
fn importance_matrix_entries_are_the_models_weights() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("fake.gguf");
    std::fs::write(&path, FakeModel::new(MODEL).model_gguf()).unwrap();
    let weights = ModelWeights::read(&path).unwrap();
    let facts = gguf::model_check::moe_facts(&path).unwrap();
    let (index, chunks) = corpus();
    let a = Acceptance::new(MODEL, &index, &chunks, &units(), Some(facts))
        .unwrap()
        .with_weights(weights);
    let unit = r(0, 3);
    let honest_one = honest(&index, &chunks, unit);
    a.decode_and_check(&[unit], honest_one.to_bytes().into())
        .unwrap();
    let refused = |poison: &dyn Fn(&mut Partial)| {
        let mut p = honest(&index, &chunks, unit);
        poison(&mut p);
        let e = a
            .decode_and_check(&[unit], p.to_bytes().into())
            .unwrap_err();
        assert_eq!(e, a.check(&[unit], &p).unwrap_err());
        e
    };
    let e = refused(&|p| {
        let mut big = numbers::imatrix::ImatrixEntry::new(1 << 10, 1 << 6);
        big.counts = vec![0; 1 << 6];
        p.imatrix
            .entries
            .insert("blk.0.ffn_hoard.weight".into(), big);
    });
    assert!(
        e.contains("blk.0.ffn_hoard.weight is not a weight of the model"),
        "{e}"
    );
    let e = refused(&|p| {
        let e = p
            .imatrix
            .entries
            .get_mut("blk.1.ffn_gate_inp.weight")
            .unwrap();
        let mut wide = numbers::imatrix::ImatrixEntry::new(8, 1);
        wide.counts = e.counts.clone();
        *e = wide;
    });
    assert!(e.contains("is [8, 1], the model's weight is [4, 1]"), "{e}");
    let e = refused(&|p| {
        p.imatrix.entries.remove("blk.0.ffn_gate_inp.weight");
    });
    assert!(
        e.contains("importance matrix lacks blk.0.ffn_gate_inp.weight"),
        "{e}"
    );
    // Counts are checked as before: a router's count is the fit tokens.
    let e = refused(&|p| {
        p.imatrix
            .entries
            .get_mut("blk.1.ffn_gate_inp.weight")
            .unwrap()
            .counts[0] += 1;
    });
    assert!(e.contains("the lease's fit split has"), "{e}");
}
