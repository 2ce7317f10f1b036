use super::*;
use crate::split::{ChunkRange, Split};
use std::collections::BTreeMap;

fn group(split: Split, domain: u16) -> Group {
    Group::text(split, domain)
}

/// A partial of one chunk whose positions have KL values `kls`, all in
/// (heldout, domain 0) except every third in (fit, domain 1), the chunk its
/// own cluster.
fn partial_of(chunk: u32, kls: &[f64]) -> EvalPartial {
    partial_in(chunk, chunk, kls)
}

/// [`partial_of`] with the chunk's positions in cluster `cluster`.
fn partial_in(chunk: u32, cluster: u32, kls: &[f64]) -> EvalPartial {
    partial_with(chunk, cluster, 0, kls)
}

/// [`partial_in`] with the held-out positions in domain `heldout_domain`.
fn partial_with(chunk: u32, cluster: u32, heldout_domain: u16, kls: &[f64]) -> EvalPartial {
    let mut base = BTreeMap::new();
    let mut sums = BTreeMap::new();
    let mut tokens = Vec::new();
    let mut per_chunk = BTreeMap::new();
    for (pos, &kl) in kls.iter().enumerate() {
        let g = if pos % 3 == 0 {
            group(Split::Fit, 1)
        } else {
            group(Split::Heldout, heldout_domain)
        };
        let b: &mut BaseSums = base.entry(g).or_default();
        b.n += 1;
        b.nll.add_f64(1.0 + kl).unwrap();
        let s: &mut CandidateSums = sums.entry(g).or_default();
        s.n += 1;
        s.kl.add_f64(kl).unwrap();
        s.kl_sq.add_f64(kl * kl).unwrap();
        s.nll.add_f64(1.0 + 2.0 * kl).unwrap();
        s.top1_same += u64::from(kl < 0.5);
        s.dprob.add_f64(-kl / 10.0).unwrap();
        let c: &mut ChunkSums = per_chunk.entry((chunk, cluster, g)).or_default();
        c.add(kl, 1.0 + kl, 1.0 + 2.0 * kl, kl < 0.5, -kl / 10.0)
            .unwrap();
        tokens.push(TokenKl {
            chunk,
            pos: pos as u32,
            cluster,
            group: g,
            kl,
        });
    }
    EvalPartial {
        format_version: EVAL_FORMAT_VERSION,
        base_sha256: "base".into(),
        corpus_sha256: "corpus".into(),
        skip_first: 0,
        splits: Split::ALL.to_vec(),
        generate: (0, 0),
        backends: vec!["cpu".into()],
        chunks: vec![ChunkRange {
            start: chunk,
            end: chunk + 1,
        }],
        base,
        candidates: vec![CandidateResult {
            name: "reap_l2_sum_K4".into(),
            sha256: "cand".into(),
            k: 4,
            groups: sums,
            chunks: per_chunk,
            tokens,
            generations: BTreeMap::new(),
        }],
        noise: BTreeMap::new(),
    }
}

/// Four chunks merged, each its own cluster, chunk `ch`'s held-out
/// positions in domain `domain_of(ch)` and its KL values [`values`] plus
/// `shift * (ch + 1)`.
fn four_chunks(shift: f64, domain_of: impl Fn(u32) -> u16) -> EvalPartial {
    let at = |ch: u32| {
        let v: Vec<f64> = values(ch)
            .iter()
            .map(|v| v + shift * f64::from(ch + 1))
            .collect();
        partial_with(ch, ch, domain_of(ch), &v)
    };
    let mut p = at(0);
    for ch in 1..4 {
        p.merge(&at(ch)).unwrap();
    }
    p
}

/// The summary of [`four_chunks`]'s candidate copied once per `(shift,
/// name, k)`, shifted by `shift * (chunk + 1)`.
fn shifted_candidates(named: &[(f64, &str, u32)]) -> EvalSummary {
    let mut p = four_chunks(0.0, |_| 0);
    p.candidates = named
        .iter()
        .map(|&(shift, name, k)| {
            let mut c = four_chunks(shift, |_| 0).candidates.remove(0);
            (c.name, c.k) = (name.into(), k);
            c
        })
        .collect();
    EvalSummary::of(&p, &["english".into(), "code".into()])
}

/// The held-out rows of `s.pairs` and their (comparison, a, b).
fn heldout_pairs(s: &EvalSummary) -> (Vec<&PairedRow>, Vec<(Comparison, &str, &str)>) {
    let held: Vec<_> = s
        .pairs
        .iter()
        .filter(|r| r.split == Split::Heldout)
        .collect();
    let names = held
        .iter()
        .map(|r| (r.compares, r.a.as_str(), r.b.as_str()))
        .collect();
    (held, names)
}

/// `row`'s difference is 0.1 x (chunk + 1) at every held-out position (13
/// per chunk of [`four_chunks`]): mean 0.25 over 4 clusters, with [`cr1`]'s
/// standard error.
fn assert_tenth_per_chunk(row: &PairedRow) {
    let clusters: Vec<(f64, f64)> = (0..4)
        .map(|ch| (13.0, 13.0 * 0.1 * f64::from(ch + 1)))
        .collect();
    let (diff, se) = cr1(&clusters);
    assert!((row.diff - diff).abs() < 1e-9 && (diff - 0.25).abs() < 1e-9);
    assert!((row.ci.se - se).abs() < 1e-9);
    assert_eq!(row.ci.clusters, 4);
}

fn values(chunk: u32) -> Vec<f64> {
    (0..20)
        .map(|i| ((chunk * 31 + i * 17) % 23) as f64 / 7.0 + 1e-3 / (i + 1) as f64)
        .collect()
}

#[test]
fn merge_is_exact_in_any_order_and_grouping() {
    let parts: Vec<EvalPartial> = (0..5).map(|c| partial_of(c, &values(c))).collect();
    let mut forward = parts[0].clone();
    for p in &parts[1..] {
        forward.merge(p).unwrap();
    }
    let mut left = parts[4].clone();
    left.merge(&parts[1]).unwrap();
    let mut right = parts[3].clone();
    right.merge(&parts[0]).unwrap();
    right.merge(&parts[2]).unwrap();
    left.merge(&right).unwrap();
    assert_eq!(forward.to_bytes(), left.to_bytes());
    assert_eq!(forward.chunks, vec![ChunkRange { start: 0, end: 5 }]);
    assert_eq!(forward.n_scored(), 100);
}

#[test]
fn merge_refuses_overlaps_and_other_candidates() {
    let a = partial_of(0, &values(0));
    let mut twice = a.clone();
    assert!(matches!(twice.merge(&a), Err(EvalError::Mismatch(m)) if m.contains("chunk 0")));
    let mut other = partial_of(1, &values(1));
    other.candidates[0].sha256 = "another slice".into();
    let mut a2 = a.clone();
    let err = a2.merge(&other).unwrap_err().to_string();
    assert!(err.contains("another slice"), "{err}");
}

#[test]
fn decoder_is_bounded_and_rejects_trailing_bytes() {
    let p = partial_of(2, &values(2));
    let mut bytes = p.to_bytes();
    assert_eq!(EvalPartial::from_bytes(&bytes).unwrap(), p);
    bytes.push(0);
    let err = EvalPartial::from_bytes(&bytes).unwrap_err().to_string();
    assert!(err.contains("1 trailing bytes"), "{err}");
    assert!(EvalPartial::from_bytes(&[0xff; 16]).is_err());
    let mut old = p.clone();
    old.format_version = 0;
    let err = EvalPartial::from_bytes(&old.to_bytes())
        .unwrap_err()
        .to_string();
    assert!(err.contains("format version 0"), "{err}");
}

/// The cluster-robust (CR1) standard error of the mean of per-chunk
/// values, written out: clusters `(n_g, S_g)`.
fn cr1(clusters: &[(f64, f64)]) -> (f64, f64) {
    let n: f64 = clusters.iter().map(|c| c.0).sum();
    let mean = clusters.iter().map(|c| c.1).sum::<f64>() / n;
    let g = clusters.len() as f64;
    let ss: f64 = clusters.iter().map(|(ng, s)| (s - mean * ng).powi(2)).sum();
    (mean, (g / (g - 1.0) * ss / (n * n)).sqrt())
}

#[test]
fn summary_figures_match_a_direct_computation() {
    let mut p = partial_of(0, &values(0));
    for chunk in 1..4 {
        p.merge(&partial_of(chunk, &values(chunk))).unwrap();
    }
    let s = EvalSummary::of(&p, &["english".into(), "code".into()]);
    let c = &s.candidates[0];
    assert_eq!((c.method.as_str(), c.k), ("reap_l2_sum", 4));
    // Held-out positions are those with pos % 3 != 0, in every chunk.
    let held = |ch: u32| -> Vec<f64> {
        values(ch)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, v)| v)
            .collect()
    };
    let mut kl: Vec<f64> = (0..4).flat_map(held).collect();
    kl.sort_by(f64::total_cmp);
    let n = kl.len() as f64;
    let mean = kl.iter().sum::<f64>() / n;
    let var = kl.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let h = &c.splits[&Split::Heldout].all;
    assert_eq!((h.n, h.chunks, h.clusters), (kl.len() as u64, 4, 4));
    assert_eq!(h.ppl_ratio_ci.clusters, 4);
    assert!((h.kl.mean - mean).abs() < 1e-12);
    assert!((h.kl.se_positions - (var / n).sqrt()).abs() < 1e-12);
    // Chunk clusters: each chunk's sum.
    let sums = |f: &dyn Fn(f64) -> f64| -> Vec<(f64, f64)> {
        (0..4)
            .map(|ch| (held(ch).len() as f64, held(ch).into_iter().map(f).sum()))
            .collect()
    };
    let (m, se) = cr1(&sums(&|v| v));
    assert!((m - mean).abs() < 1e-12);
    assert!((h.kl.se - se).abs() < 1e-12, "{} vs {se}", h.kl.se);
    // t(0.975, 3) = 3.1824.
    assert!((h.kl.hi - (mean + 3.1824 * se)).abs() < 1e-9);
    assert!((h.kl.lo - (mean - 3.1824 * se)).abs() < 1e-9);
    // llama-perplexity's percentiles: 52 values, rank q * 51 interpolated.
    assert_eq!(kl.len(), 52);
    assert_eq!(h.kl.p50, (kl[25] + kl[26]) / 2.0);
    let p90 = kl[45] + 0.9 * (kl[46] - kl[45]);
    assert!((h.kl.p90 - p90).abs() < 1e-12);
    assert_eq!((h.kl.max, h.kl.min), (kl[51], kl[0]));
    let ppl_ratio = ((kl.iter().map(|v| 1.0 + 2.0 * v).sum::<f64>()
        - kl.iter().map(|v| 1.0 + v).sum::<f64>())
        / n)
        .exp();
    assert!((h.ppl_ratio - ppl_ratio).abs() < 1e-9 * ppl_ratio);
    // The ratio's interval: exp of the log ratio's (per chunk: sum of kl).
    let (_, se_log) = cr1(&sums(&|v| v));
    assert!((h.ppl_ratio_ci.hi - (ppl_ratio.ln() + 3.1824 * se_log).exp()).abs() < 1e-9);
    let top1 = kl.iter().filter(|v| **v < 0.5).count() as f64 / n;
    assert_eq!(h.top1_same, top1);
    let (_, se_top1) = cr1(&sums(&|v| f64::from(u8::from(v < 0.5))));
    assert!((h.top1_same_ci.se - se_top1).abs() < 1e-12);
    let rms = (kl.iter().map(|v| (v / 10.0).powi(2)).sum::<f64>() / n).sqrt();
    assert!((h.dprob_rms - rms).abs() < 1e-12);
    let (_, se_mse) = cr1(&sums(&|v| (v / 10.0).powi(2)));
    assert!((h.dprob_rms_ci.se - 0.5 / rms * se_mse).abs() < 1e-12);
    assert_eq!(
        c.splits[&Split::Heldout].domains.keys().collect::<Vec<_>>(),
        ["english"]
    );
    assert_eq!(
        c.splits[&Split::Fit].domains.keys().collect::<Vec<_>>(),
        ["code"]
    );
    // One candidate: nothing to pair with.
    assert!(c.splits[&Split::Heldout].paired.is_none());
}

#[test]
fn candidates_are_paired_against_the_best_by_chunk_sums_of_differences() {
    // A second candidate whose KL is the first's plus 0.1 * (chunk + 1) at
    // every position: the difference is constant within a chunk.
    let mut p = partial_of(0, &values(0));
    for chunk in 1..4 {
        p.merge(&partial_of(chunk, &values(chunk))).unwrap();
    }
    let shifted: Vec<EvalPartial> = (0..4)
        .map(|ch| {
            let v: Vec<f64> = values(ch)
                .iter()
                .map(|x| x + 0.1 * f64::from(ch + 1))
                .collect();
            partial_of(ch, &v)
        })
        .collect();
    let mut worse = shifted[0].clone();
    for s in &shifted[1..] {
        worse.merge(s).unwrap();
    }
    let mut second = worse.candidates.remove(0);
    second.name = "frequency_K4".into();
    p.candidates.insert(0, second);
    let s = EvalSummary::of(&p, &["english".into(), "code".into()]);
    let (first, best) = (&s.candidates[0], &s.candidates[1]);
    let pair = first.splits[&Split::Heldout].paired.as_ref().unwrap();
    assert_eq!(pair.against, "reap_l2_sum_K4");
    let mine = best.splits[&Split::Heldout].paired.as_ref().unwrap();
    assert_eq!((mine.diff, mine.ci.se), (0.0, 0.0));
    // Held-out positions per chunk: 13; the difference's clusters.
    let clusters: Vec<(f64, f64)> = (0..4)
        .map(|ch| (13.0, 13.0 * 0.1 * f64::from(ch + 1)))
        .collect();
    let (diff, se) = cr1(&clusters);
    assert!((pair.diff - diff).abs() < 1e-9, "{} vs {diff}", pair.diff);
    assert!((pair.ci.se - se).abs() < 1e-9, "{} vs {se}", pair.ci.se);
    // The interval is centred on the difference and holds the true shift
    // (the mean of 0.1, 0.2, 0.3, 0.4 over equal clusters).
    assert!(pair.ci.lo < 0.25 && 0.25 < pair.ci.hi, "{:?}", pair.ci);
    assert!((pair.ci.lo + pair.ci.hi - 2.0 * pair.diff).abs() < 1e-9);
}

#[test]
fn split_names() {
    let parse = |s| crate::Splits::parse(s).map(crate::Splits::splits);
    assert_eq!(parse("both"), Ok(Split::ALL.to_vec()));
    assert_eq!(parse("heldout"), Ok(vec![Split::Heldout]));
    assert!(parse("all").is_err());
}

#[test]
fn modalities_appear_only_when_image_conditioned_positions_were_scored() {
    let text = partial_of(0, &values(0));
    let s = EvalSummary::of(&text, &["english".into(), "code".into()]);
    assert!(s.candidates[0]
        .splits
        .values()
        .all(|f| f.modalities.is_empty()));
    let json = String::from_utf8(s.to_json_bytes()).unwrap();
    assert!(!json.contains("modalities"), "{json}");

    // The held-out positions after position 10 become image-conditioned.
    let mut p = partial_of(0, &values(0));
    let image = |g: Group| Group {
        modality: crate::Modality::Image,
        ..g
    };
    let c = &mut p.candidates[0];
    for t in c
        .tokens
        .iter_mut()
        .filter(|t| t.pos > 10 && t.group.split == Split::Heldout)
    {
        t.group = image(t.group);
    }
    let (mut base, mut sums, mut per_chunk) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (t, v) in c.tokens.iter().zip(values(0)) {
        let b: &mut BaseSums = base.entry(t.group).or_default();
        b.n += 1;
        b.nll.add_f64(1.0 + v).unwrap();
        let s: &mut CandidateSums = sums.entry(t.group).or_default();
        s.n += 1;
        s.kl.add_f64(v).unwrap();
        s.kl_sq.add_f64(v * v).unwrap();
        s.nll.add_f64(1.0 + 2.0 * v).unwrap();
        s.top1_same += u64::from(v < 0.5);
        s.dprob.add_f64(-v / 10.0).unwrap();
        let k: &mut ChunkSums = per_chunk.entry((t.chunk, t.chunk, t.group)).or_default();
        k.add(v, 1.0 + v, 1.0 + 2.0 * v, v < 0.5, -v / 10.0)
            .unwrap();
    }
    (p.base, c.groups, c.chunks) = (base, sums, per_chunk);
    let s = EvalSummary::of(&p, &["english".into(), "code".into()]);
    let held = &s.candidates[0].splits[&Split::Heldout];
    let kl_of = |keep: &dyn Fn(usize) -> bool| -> Vec<f64> {
        values(0)
            .into_iter()
            .enumerate()
            .filter(|&(i, _)| i % 3 != 0 && keep(i))
            .map(|(_, v)| v)
            .collect()
    };
    for (name, want) in [("text", kl_of(&|i| i <= 10)), ("image", kl_of(&|i| i > 10))] {
        let f = &held.modalities[name];
        assert_eq!(f.n, want.len() as u64, "{name}");
        let mean = want.iter().sum::<f64>() / want.len() as f64;
        assert!((f.kl.mean - mean).abs() < 1e-12, "{name}");
        assert_eq!(f.kl.max, want.iter().copied().fold(0.0, f64::max), "{name}");
    }
    assert_eq!(
        held.modalities["text"].n + held.modalities["image"].n,
        held.all.n
    );
    // The fit split had no image-conditioned position: its image row is empty.
    assert_eq!(s.candidates[0].splits[&Split::Fit].modalities["image"].n, 0);
    let json = String::from_utf8(s.to_json_bytes()).unwrap();
    assert!(json.contains("\"modalities\""), "{json}");
}

#[test]
fn an_eval_sets_positions_are_its_own_and_outside_the_splits_whole() {
    let mut p = partial_of(0, &values(0));
    p.merge(&partial_of(1, &values(1))).unwrap();
    let names = ["english".to_string(), "code".to_string()];
    let whole = EvalSummary::of(&p, &names);
    // Held-out positions are all domain 0's: named an eval set, it leaves
    // the held-out whole and keeps its own figures, equal to before.
    let apart = EvalSummary::of_run(&p, &names, &["english".into()]);
    assert_eq!(apart.eval_sets, ["english"]);
    let (w, a) = (&whole.candidates[0].splits, &apart.candidates[0].splits);
    assert!(w[&Split::Heldout].all.n > 0);
    assert_eq!(a[&Split::Heldout].all.n, 0);
    assert_eq!(
        a[&Split::Heldout].domains["english"],
        w[&Split::Heldout].domains["english"]
    );
    assert_eq!(a[&Split::Fit].all, w[&Split::Fit].all);
}

#[test]
fn intervals_cluster_by_group_not_by_chunk() {
    // Two held-out groups of 20 chunks each, the example: KL 0.02
    // at every position of one, 0.10 of the other. By chunk the interval is
    // tight; by group it is the interval of two values (t at 1 df).
    let mut p = partial_in(0, 0, &[0.02; 30]);
    for chunk in 1..40 {
        let (cluster, kl) = if chunk < 20 { (0, 0.02) } else { (1, 0.10) };
        p.merge(&partial_in(chunk, cluster, &[kl; 30])).unwrap();
    }
    let s = EvalSummary::of(&p, &["english".into(), "code".into()]);
    let h = &s.candidates[0].splits[&Split::Heldout].all;
    assert_eq!((h.chunks, h.clusters), (40, 2));
    assert!((h.kl.mean - 0.06).abs() < 1e-12);
    // CR1 over two equal clusters of 0.02 and 0.10: se = 0.04, and
    // t(0.975, 1) = 12.7062.
    assert!((h.kl.se - 0.04).abs() < 1e-12, "{}", h.kl.se);
    assert!(
        (h.kl.hi - (0.06 + 12.7062 * 0.04)).abs() < 1e-9,
        "{}",
        h.kl.hi
    );
    assert!(h.kl.lo < 0.0 && h.kl.hi > 0.5, "{:?}", h.kl);
    // One group alone has no interval: n/a (null in JSON), never [m, m].
    let one = EvalSummary::of(&partial_in(0, 7, &[0.02; 30]), &["english".into()]);
    let f = &one.candidates[0].splits[&Split::Heldout].all;
    assert_eq!(f.clusters, 1);
    assert!(f.kl.lo.is_nan() && f.kl.hi.is_nan() && !f.ppl_ratio_ci.known());
    let json = String::from_utf8(one.to_json_bytes()).unwrap();
    assert!(json.contains("\"hi\": null"), "{json}");
    let back: EvalSummary = serde_json::from_slice(json.as_bytes()).unwrap();
    assert_eq!(back, one);
}

#[test]
fn pairs_compare_methods_at_one_k_and_each_k_with_the_next_larger() {
    // Three candidates over 4 chunks (4 clusters): frequency_K4 and
    // reap_hybrid_K4 at one K, reap_hybrid_K8 the next K of reap_hybrid.
    let s = shifted_candidates(&[
        (0.1, "frequency_K4", 4),
        (0.0, "reap_hybrid_K4", 4),
        (-0.05, "reap_hybrid_K8", 8),
    ]);
    let (held, names) = heldout_pairs(&s);
    assert_eq!(
        names,
        [
            (Comparison::SameK, "frequency_K4", "reap_hybrid_K4"),
            (Comparison::SmallerK, "reap_hybrid_K4", "reap_hybrid_K8"),
        ]
    );
    // frequency_K4 - reap_hybrid_K4: 0.1 * (chunk + 1) at every held-out
    // position.
    assert_tenth_per_chunk(held[0]);
    // reap_hybrid_K4 - reap_hybrid_K8: +0.05 * (chunk + 1).
    assert!((held[1].diff - 0.125).abs() < 1e-9, "{}", held[1].diff);
    // The "against the best" figure stays.
    let best = s.candidates[0].splits[&Split::Heldout]
        .paired
        .as_ref()
        .unwrap();
    assert_eq!(best.against, "reap_hybrid_K8");
}

#[test]
fn paired_rows_carry_each_domains_own_difference_and_clusters() {
    // Four chunks, each its own cluster; chunk ch's held-out positions are
    // in domain ch % 2 (english: chunks 0 and 2, code: 1 and 3), and a is b
    // plus 0.1 * (ch + 1) at every position.
    let candidate = |shift: f64, name: &str| {
        let mut p = four_chunks(shift, |ch| (ch % 2) as u16);
        p.candidates[0].name = name.into();
        p
    };
    let mut p = candidate(0.0, "frequency_K4");
    p.candidates
        .push(candidate(0.1, "reap_hybrid_K4").candidates.remove(0));
    let s = EvalSummary::of(&p, &["english".into(), "code".into()]);
    let row = s.pairs.iter().find(|r| r.split == Split::Heldout).unwrap();
    assert_eq!(
        (row.a.as_str(), row.b.as_str()),
        ("frequency_K4", "reap_hybrid_K4")
    );
    // 13 held-out positions per chunk; the differences are -0.1 * (ch + 1).
    let by_hand = |chunks: &[u32]| {
        let clusters: Vec<(f64, f64)> = chunks
            .iter()
            .map(|&ch| (13.0, -13.0 * 0.1 * f64::from(ch + 1)))
            .collect();
        cr1(&clusters)
    };
    for (name, chunks, mean) in [("english", [0, 2], -0.2), ("code", [1, 3], -0.3)] {
        let d = &row.domains[name];
        let (diff, se) = by_hand(&chunks);
        assert!(
            (d.diff - diff).abs() < 1e-9 && (diff - mean).abs() < 1e-9,
            "{name}: {d:?}"
        );
        assert!((d.ci.se - se).abs() < 1e-9, "{name}: {d:?}");
        assert_eq!(d.ci.clusters, 2, "{name}");
    }
    // The pooled row keeps all four clusters.
    assert!(
        (row.diff + 0.25).abs() < 1e-9 && row.ci.clusters == 4,
        "{row:?}"
    );
    // The fit split's positions are all code's (one per three).
    let fit = s.pairs.iter().find(|r| r.split == Split::Fit).unwrap();
    assert_eq!(fit.domains.keys().collect::<Vec<_>>(), ["code"]);
}

#[test]
fn a_merged_candidate_is_paired_with_the_pruned_one_of_its_method_and_k() {
    // Job order: pruned, merged, another method, all at K = 4; the merged
    // one is 0.1 x (chunk + 1) further from the base at every position.
    let s = shifted_candidates(&[
        (0.0, "reap_hybrid_K4", 4),
        (0.1, "reap_hybrid_merge_K4", 4),
        (0.05, "frequency_K4", 4),
    ]);
    let (held, names) = heldout_pairs(&s);
    assert_eq!(
        names,
        [
            (
                Comparison::MergedPruned,
                "reap_hybrid_merge_K4",
                "reap_hybrid_K4"
            ),
            (Comparison::SameK, "reap_hybrid_K4", "frequency_K4"),
            (Comparison::SameK, "reap_hybrid_merge_K4", "frequency_K4"),
        ]
    );
    // KL(merged) - KL(pruned) = 0.1 x (chunk + 1).
    assert_tenth_per_chunk(held[0]);
}
