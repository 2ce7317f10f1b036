//! Families of copies across the held-out split and an eval set: 40 exact
//! copies and 20 near copies of documents of one domain, and an eval-set
//! document repeated 20 times in it (issue 44's done-when).

use super::super::doc::Doc;
use super::super::prepare::{duplicates, prepare, Prepared};
use super::super::tokenizer::ByteTokenizer;
use super::super::{summary, Config};
use super::{check_invariants, prose};
use numbers::Split;
use std::fmt::Write as _;

/// A document of about 150 words.
fn long(seed: usize) -> String {
    prose(seed, 150)
}

/// `text` with three words replaced by words of copy `i` alone.
fn edited(text: &str, i: usize) -> String {
    let mut words: Vec<String> = text.split(' ').map(str::to_string).collect();
    for k in 0..3 {
        let at = (i * 7 + k * 41) % words.len();
        words[at] = format!("zebra{i}x{k}");
    }
    words.join(" ")
}

fn prepared(dir: &std::path::Path) -> Prepared {
    let exact = long(1000);
    let near = long(2000);
    let eval = long(3000);
    let mut lines = String::new();
    let mut push = |text: &str| {
        writeln!(lines, "{}", serde_json::json!({ "text": text })).unwrap();
    };
    for i in 0..200 {
        push(&long(i));
        match i % 10 {
            0 | 5 => push(&exact),
            1 => push(&edited(&near, i)),
            2 => push(&eval),
            _ => {}
        }
    }
    std::fs::write(dir.join("web.jsonl"), lines).unwrap();
    std::fs::write(
        dir.join("eval.jsonl"),
        format!("{}\n", serde_json::json!({ "text": eval })),
    )
    .unwrap();
    std::fs::write(dir.join("model.gguf"), b"stand-in model").unwrap();
    let config = r#"
[model]
path = "model.gguf"

[corpus]
n_ctx = 256
heldout_fraction = 0.2
seed = 11

[[corpus.domains]]
name = "web"
sources = [{ path = "web.jsonl" }]

[[corpus.eval_sets]]
name = "bench"
sources = [{ path = "eval.jsonl" }]
"#;
    std::fs::write(dir.join("run.toml"), config).unwrap();
    let config = Config::load(&dir.join("run.toml")).unwrap();
    prepare(&config, &ByteTokenizer, "m").unwrap()
}

#[test]
fn every_copy_of_a_heldout_or_eval_document_leaves_fit_and_the_summary_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = prepared(dir.path());
    let texts: Vec<String> = std::fs::read_to_string(dir.path().join("web.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(texts.len(), 200 + 40 + 20 + 20);
    // The web domain's documents, in file order, then the eval set's
    // (held out whole as a domain of its own).
    assert_eq!(
        p.documents.iter().filter(|d| d.domain == "web").count(),
        texts.len()
    );
    assert!(p.documents[texts.len()..]
        .iter()
        .all(|d| d.domain == "bench" && d.split == Split::Heldout && d.dropped.is_none()));
    let family = |of: &str| -> Vec<usize> {
        (0..texts.len())
            .filter(|&i| match of {
                "near" => texts[i].contains("zebra"),
                seed => texts[i] == long(seed.parse().unwrap()),
            })
            .collect()
    };
    let (exact, near, eval) = (family("1000"), family("near"), family("3000"));
    assert_eq!((exact.len(), near.len(), eval.len()), (40, 20, 20));
    let d = &p.documents;
    let count = |v: &[usize], split: Split, kept: bool| {
        v.iter()
            .filter(|&&i| d[i].split == split && d[i].dropped.is_none() == kept)
            .count()
    };

    // Exact family: copies landed on both sides; held-out keeps one copy,
    // fit keeps none.
    let held = count(&exact, Split::Heldout, true) + count(&exact, Split::Heldout, false);
    assert!(
        held > 0 && held < exact.len(),
        "precondition: {held} held out"
    );
    assert_eq!(count(&exact, Split::Heldout, true), 1);
    assert_eq!(count(&exact, Split::Fit, true), 0);
    let exact_fit = count(&exact, Split::Fit, false);
    assert!(exact
        .iter()
        .filter(|&&i| d[i].split == Split::Fit)
        .all(|&i| d[i].dropped.as_deref() == Some("exact_duplicate_of_heldout")));

    // Near family: copies on both sides; none stays in fit.
    let near_held = count(&near, Split::Heldout, true);
    assert!(near_held > 0, "precondition: a near copy is held out");
    assert!(count(&near, Split::Fit, false) > 0);
    assert_eq!(count(&near, Split::Fit, true), 0);
    assert!(near
        .iter()
        .filter(|&&i| d[i].split == Split::Fit)
        .all(|&i| d[i].dropped.as_deref() == Some("near_duplicate_of_heldout")));

    // The eval set's document: every one of its copies leaves, on both sides.
    assert!(eval
        .iter()
        .all(|&i| d[i].dropped.as_deref() == Some("exact_duplicate_of_eval")));
    // The distinct documents stay.
    let others: Vec<usize> = (0..texts.len())
        .filter(|i| !exact.contains(i) && !near.contains(i) && !eval.contains(i))
        .collect();
    assert!(others.iter().all(|&i| d[i].dropped.is_none()));

    let web = &p.manifest.domains[0];
    assert_eq!(web.dropped_exact_heldout, exact_fit as u64);
    assert_eq!(web.dropped_exact_within, held as u64 - 1);
    assert_eq!(
        web.dropped_near_heldout,
        count(&near, Split::Fit, false) as u64
    );
    assert_eq!(web.dropped_exact_eval, 20);
    let text = summary(&p.manifest);
    let line = format!(
        "web: dropped {} exact copies and {} near-duplicates of held-out, 20 exact copies and 0 near-duplicates of eval sets, {} repeated exact copies within a split",
        exact_fit,
        web.dropped_near_heldout,
        held - 1
    );
    assert!(text.contains(&line), "{text}\nwanted: {line}");
    check_invariants(&p);
}

/// A document of `n` tokens from a generator seeded by `seed`.
fn random_tokens(seed: u64, n: usize) -> Vec<i32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 5000) as i32
        })
        .collect()
}

fn doc(index: usize, tokens: Vec<i32>, split: Split) -> Doc {
    Doc {
        index: index as u32,
        domain: 0,
        at: format!("web.jsonl:{}", index + 1),
        group: format!("doc:{index}"),
        chars: tokens.len() as u64,
        tokens,
        images: Vec::new(),
        split,
    }
}

#[test]
fn fit_documents_containing_a_heldout_or_eval_document_are_all_dropped_whatever_their_number() {
    let c = config::CorpusConfig::default();
    let names = vec!["web".to_string(), "bench".to_string()];
    for family in [20usize, 100] {
        let held = random_tokens(1, 120);
        let eval = random_tokens(2, 120);
        // The held-out document, 40 unrelated documents (20 held out), and
        // `family` fit documents each the held-out one plus 300 tokens of
        // their own, then as many containing the eval-set document.
        let mut docs = vec![doc(0, held.clone(), Split::Heldout)];
        for i in 0..40 {
            let split = [Split::Fit, Split::Heldout][i % 2];
            docs.push(doc(docs.len(), random_tokens(100 + i as u64, 300), split));
        }
        for (i, inner) in [&held, &eval].into_iter().enumerate() {
            for k in 0..family {
                let mut t = random_tokens(10_000 + (i * family + k) as u64, 150);
                t.extend(inner.iter());
                t.extend(random_tokens(20_000 + (i * family + k) as u64, 150));
                docs.push(doc(docs.len(), t, Split::Fit));
            }
        }
        let mut evals = vec![doc(docs.len(), eval.clone(), Split::Heldout)];
        evals[0].domain = 1;
        let drops = duplicates(&c, &names, &docs, &evals);
        let rule = |i: usize| drops[i].as_ref().map(|x| x.rule.as_str());
        for i in 0..41 {
            assert_eq!(
                rule(i),
                None,
                "family {family}: unrelated document {i} dropped"
            );
        }
        for k in 0..family {
            assert_eq!(
                rule(41 + k),
                Some("near_duplicate_of_heldout"),
                "family {family}"
            );
            assert_eq!(
                rule(41 + family + k),
                Some("near_duplicate_of_eval"),
                "family {family}"
            );
        }
    }
}
