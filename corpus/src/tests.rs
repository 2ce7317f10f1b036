//! End-to-end tests of the corpus stage on files written to a temporary
//! directory: with a byte-level stand-in tokenizer here, and with the
//! generated `tiny` GGUF model in [`llama`].

use super::prepare::prepare;
use super::schedule::prefix_deviations;
use super::tokenizer::{ByteTokenizer, Tokenizer};
use super::*;
use numbers::Split;
use runfiles::corpus::read_chunks;
use std::collections::BTreeMap;
use std::fmt::Write as _;

mod dups;
mod fixtures;
mod images;
mod llama;
mod respond;
mod templates;

/// A small corpus: English prose with a `topic` group key, Japanese text
/// (separated by blank lines) and chat records with a `task` group key.
pub(super) struct Fixture {
    pub dir: tempfile::TempDir,
}

const WORDS: [&str; 24] = [
    "router", "expert", "token", "layer", "gate", "weight", "signal", "measure", "domain",
    "sample", "prune", "cache", "keeps", "sends", "counts", "adds", "merges", "reads", "quietly",
    "rarely", "often", "every", "some", "many",
];

const KANA: &str = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん日本語東京専門家川山雨猫本朝夜新古重計算選確認集結果";

/// Deterministic, varied English text of about `n` words.
pub(super) fn prose(seed: usize, n: usize) -> String {
    let mut s = String::new();
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s += WORDS[(x >> 33) % WORDS.len()];
        s += if i % 9 == 8 { ". " } else { " " };
    }
    s.trim_end().to_string()
}

/// Deterministic Japanese-script text of `n` short words.
pub(super) fn japanese(seed: usize, n: usize) -> String {
    let chars: Vec<char> = KANA.chars().collect();
    let mut x = seed.wrapping_mul(40503).wrapping_add(7);
    let mut s = String::new();
    for i in 0..n {
        for _ in 0..2 + i % 3 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s.push(chars[(x >> 33) % chars.len()]);
        }
        s.push(if i % 6 == 5 { '。' } else { '、' });
    }
    s
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut en = String::new();
        for i in 0..40 {
            let line = serde_json::json!({ "text": prose(i, 60 + i % 13), "topic": format!("t{}", i % 10) });
            writeln!(en, "{line}").unwrap();
        }
        std::fs::write(dir.path().join("en.jsonl"), en).unwrap();
        let ja: Vec<String> = (0..20).map(|i| japanese(i, 30 + i % 7)).collect();
        std::fs::write(dir.path().join("ja.txt"), ja.join("\n\n")).unwrap();
        let mut chat = String::new();
        for i in 0..24 {
            let line = serde_json::json!({
                "task": format!("task{}", i % 6),
                "messages": [
                    { "role": "system", "content": "You answer questions about expert routing briefly." },
                    { "role": "user", "content": format!("Question {i}: {}?", prose(i + 100, 12)) },
                    { "role": "assistant", "content": prose(i + 200, 30) },
                ]
            });
            writeln!(chat, "{line}").unwrap();
        }
        std::fs::write(dir.path().join("chat.jsonl"), chat).unwrap();
        std::fs::write(dir.path().join("model.gguf"), b"stand-in model").unwrap();
        Fixture { dir }
    }

    /// Config text with the given targets for (en, ja, chat).
    pub fn config_text(&self, model: &str, targets: [f64; 3]) -> String {
        format!(
            r#"
[model]
path = "{model}"

[corpus]
n_ctx = 128
tolerance = 0.05
heldout_fraction = 0.25
seed = 7
shares = "verify"

[[corpus.domains]]
name = "english"
target_share = {}
group_key = "topic"
sources = [{{ path = "en.jsonl" }}]

[[corpus.domains]]
name = "japanese"
target_share = {}
sources = [{{ path = "ja.txt", separator = "\n\n" }}]

[[corpus.domains]]
name = "chat"
target_share = {}
group_key = "task"
sources = [{{ path = "chat.jsonl" }}]
"#,
            targets[0], targets[1], targets[2]
        )
    }

    pub fn config(&self, model: &str, targets: [f64; 3]) -> Config {
        let path = self.dir.path().join("run.toml");
        std::fs::write(&path, self.config_text(model, targets)).unwrap();
        Config::load(&path).unwrap()
    }

    /// Targets equal to the measured shares (read back from a share-miss table).
    pub fn measured_targets(&self, model: &str, tokenizer: &dyn Tokenizer) -> [f64; 3] {
        let err = prepare(&self.config(model, [0.0, 0.0, 1.0]), tokenizer, "m").unwrap_err();
        let CorpusError::ShareMiss { table, .. } = err else {
            panic!("{err}")
        };
        let shares: Vec<f64> = table
            .lines()
            .skip(1)
            .take(3)
            .map(|l| l.split_whitespace().nth(5).unwrap().parse::<f64>().unwrap() / 100.0)
            .collect();
        let (a, b) = (shares[0], shares[1]);
        [a, b, 1.0 - a - b]
    }

    pub fn store(&self, name: &str) -> RunStore {
        RunStore::open(self.dir.path().join(name).to_str().unwrap()).unwrap()
    }
}

fn load_bytes(_: &Path, _: Option<&Path>) -> Result<ByteTokenizer, CorpusError> {
    Ok(ByteTokenizer)
}

/// Checks every structural invariant of a prepared corpus.
pub(super) fn check_invariants(p: &prepare::Prepared) {
    let plan = &p.manifest.chunk_plan;
    // Calibration domains, then eval sets (held out whole, packed after
    // the calibration chunks), as the index names them.
    let n_domains = p.manifest.domains.len();
    let tokens: Vec<u64> = p
        .manifest
        .domains
        .iter()
        .map(|d| d.shares.tokens)
        .chain(p.manifest.eval_sets.iter().map(|e| e.tokens))
        .collect();
    assert_eq!(tokens.len(), p.index.domains.len());
    let total: u64 = tokens.iter().sum();
    assert_eq!(
        plan.n_tokens, total,
        "tokens in chunks == tokens of the corpus"
    );
    assert_eq!(
        p.chunks.iter().map(|c| c.tokens.len() as u64).sum::<u64>(),
        total
    );
    // The stream a chunk belongs to: one split of the calibration
    // domains, or one eval set; a chunk holds text of one split only.
    let stream = |c: &runfiles::corpus::Chunk| {
        let (d, split) = (usize::from(c.spans[0].domain), c.spans[0].split);
        assert!(c
            .spans
            .iter()
            .all(|s| (usize::from(s.domain) < n_domains) == (d < n_domains)));
        assert!(
            c.spans.iter().all(|s| s.split == split),
            "chunk {} holds spans of both splits",
            c.id
        );
        (split, (d >= n_domains).then_some(d))
    };
    for (i, c) in p.chunks.iter().enumerate() {
        assert_eq!(c.id.0 as usize, i);
        c.validate(p.index.domains.len()).unwrap();
        // Short only when last of its stream, or when the next image did not fit.
        let next = p.chunks.get(i + 1);
        let next_image = next.and_then(|n| n.images.first());
        if next.is_some_and(|n| stream(n) == stream(c)) && next_image.is_none_or(|im| im.start != 0)
        {
            assert_eq!(c.tokens.len(), plan.n_ctx as usize);
        }
    }
    let calibration: Vec<_> = p
        .chunks
        .iter()
        .take_while(|c| stream(c).1.is_none())
        .cloned()
        .collect();
    let mix: Vec<f64> = p
        .manifest
        .domains
        .iter()
        .map(|d| d.shares.token_share)
        .collect();
    let dev = prefix_deviations(&calibration, &mix);
    assert!(
        dev.iter().all(|&d| d <= plan.worst_prefix_deviation),
        "every prefix within the reported deviation"
    );
    assert!(dev.last().unwrap().abs() < 1e-9);
    let read = read_chunks(bytes::Bytes::from(p.chunks_parquet.clone()), None).unwrap();
    assert_eq!(read, p.chunks);
    check_owners(p);
}

/// Every span names its document (by its line in `documents.jsonl`) and
/// its group (by its entry in the index's groups), and both agree with the
/// span's domain and split; every kept document's tokens are in the chunks.
pub(super) fn check_owners(p: &prepare::Prepared) {
    let mut placed = vec![0u64; p.documents.len()];
    for c in &p.chunks {
        for s in &c.spans {
            let doc = &p.documents[s.doc as usize];
            let group = &p.index.groups[s.group as usize];
            let domain = &p.index.domains[usize::from(s.domain)];
            assert_eq!(&doc.domain, domain, "chunk {}: {s:?}", c.id);
            assert_eq!(doc.split, s.split, "chunk {}: {s:?}", c.id);
            assert!(doc.dropped.is_none(), "a dropped document is packed");
            assert_eq!(
                (group.domain, group.split, group.key.as_str()),
                (s.domain, s.split, doc.group.as_str())
            );
            placed[s.doc as usize] += u64::from(s.len);
        }
    }
    for (d, n) in p.documents.iter().zip(&placed) {
        let expected = if d.dropped.is_some() { 0 } else { d.tokens };
        assert_eq!(*n, expected, "{}: tokens in chunks", d.at);
    }
}

#[test]
fn corpus_packs_every_token_and_measures_shares_in_tokens() {
    let f = Fixture::new();
    let targets = f.measured_targets("model.gguf", &ByteTokenizer);
    let p = prepare(&f.config("model.gguf", targets), &ByteTokenizer, "m").unwrap();
    check_invariants(&p);
    let ja = &p.manifest.domains[1].shares;
    assert!(ja.token_share > ja.char_share * 1.5, "{ja:?}");
    assert_eq!(p.manifest.domains[1].shares.docs, 20);
}

#[test]
fn off_targets_fail_with_the_share_table() {
    let f = Fixture::new();
    let err = prepare(
        &f.config("model.gguf", [0.6, 0.2, 0.2]),
        &ByteTokenizer,
        "m",
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CorpusError::ShareMiss { .. }), "{msg}");
    for needle in ["english", "japanese", "chat", "target%", "MISS"] {
        assert!(msg.contains(needle), "{needle} missing from:\n{msg}");
    }
}

#[test]
fn sampled_shares_meet_targets_the_files_miss_and_list_what_is_left_out() {
    let f = Fixture::new();
    let text = f
        .config_text("model.gguf", [0.6, 0.2, 0.2])
        .replace("shares = \"verify\"", "shares = \"sample\"");
    let path = f.dir.path().join("sample.toml");
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let p = prepare(&config, &ByteTokenizer, "m").unwrap();
    check_invariants(&p);
    // The fit split's shares, counted here from documents.jsonl's kept fit
    // documents, are within the tolerance of the targets.
    let kept = |domain: &str| -> u64 {
        p.documents
            .iter()
            .filter(|d| d.domain == domain && d.split == Split::Fit && d.dropped.is_none())
            .map(|d| d.tokens)
            .sum()
    };
    let total: u64 = ["english", "japanese", "chat"]
        .iter()
        .map(|d| kept(d))
        .sum();
    for (domain, target) in [("english", 0.6), ("japanese", 0.2), ("chat", 0.2)] {
        let share = kept(domain) as f64 / total as f64;
        assert!(
            (share - target).abs() <= 0.05,
            "{domain}: {share} against {target}"
        );
    }
    // What was left out is listed and counted per domain, and only fit
    // documents are left out.
    let mut left = 0u64;
    for (i, d) in p.manifest.domains.iter().enumerate() {
        let name = &d.shares.domain;
        let listed: Vec<_> = p
            .documents
            .iter()
            .filter(|x| &x.domain == name && x.dropped.as_deref() == Some("over_share"))
            .collect();
        assert!(listed.iter().all(|x| x.split == Split::Fit), "{name}");
        assert_eq!(
            listed.len() as u64,
            d.over_share_docs,
            "{name} (domain {i})"
        );
        assert_eq!(
            listed.iter().map(|x| x.tokens).sum::<u64>(),
            d.over_share_tokens,
            "{name}"
        );
        left += d.over_share_tokens;
    }
    assert!(
        left > 0,
        "the targets miss the files' shares: something is left out"
    );
    assert!(p.manifest.dropped.iter().all(|x| x.rule != "over_share"));
    assert!(crate::summary(&p.manifest).contains("over its target share"));
}

/// The only split each group's documents landed in; panics if a group straddles.
pub(super) fn group_sides(docs: &[manifest::DocRecord]) -> BTreeMap<(String, String), Split> {
    let mut side = BTreeMap::new();
    for d in docs {
        let s = *side
            .entry((d.domain.clone(), d.group.clone()))
            .or_insert(d.split);
        assert_eq!(
            s, d.split,
            "group {} of {} is in both splits",
            d.group, d.domain
        );
    }
    side
}

/// Appends an edited copy of a held-out English document under a fit group
/// and checks that it is dropped from the fit split.
pub(super) fn inserted_near_duplicate_is_dropped(
    f: &Fixture,
    config: &Config,
    tokenizer: &dyn Tokenizer,
) {
    let p = prepare(config, tokenizer, "m").unwrap();
    let sides = group_sides(&p.documents);
    let en = &p.manifest.domains[0];
    assert!(en.heldout_groups > 0 && en.fit_groups > 0);
    let side = |t: usize| sides[&("english".to_string(), format!("t{t}"))];
    let held = (0..10).find(|&t| side(t) == Split::Heldout).unwrap();
    let fit = (0..10).find(|&t| side(t) == Split::Fit).unwrap();
    let i = (0..40).find(|i| i % 10 == held).unwrap();
    let copy = prose(i, 60 + i % 13).replacen("router", "routers", 1) + " and one more sentence";
    let mut en_text = std::fs::read_to_string(f.dir.path().join("en.jsonl")).unwrap();
    writeln!(
        en_text,
        "{}",
        serde_json::json!({ "text": copy, "topic": format!("t{fit}") })
    )
    .unwrap();
    std::fs::write(f.dir.path().join("en.jsonl"), en_text).unwrap();

    let p2 = prepare(config, tokenizer, "m").unwrap();
    let sides2 = group_sides(&p2.documents);
    let key = |t: usize| ("english".to_string(), format!("t{t}"));
    assert_eq!(
        (sides2[&key(held)], sides2[&key(fit)]),
        (Split::Heldout, Split::Fit),
        "precondition: the split did not move"
    );
    let copy_doc = p2
        .documents
        .iter()
        .find(|d| d.at.ends_with("en.jsonl:41"))
        .unwrap();
    assert_eq!(
        copy_doc.dropped.as_deref(),
        Some("near_duplicate_of_heldout")
    );
    let dropped: Vec<_> = p2
        .manifest
        .dropped
        .iter()
        .filter(|d| d.at.ends_with("en.jsonl:41"))
        .collect();
    assert_eq!(dropped.len(), 1, "{:?}", p2.manifest.dropped);
    assert!(
        dropped[0]
            .duplicate_of
            .ends_with(&format!("en.jsonl:{}", i + 1)),
        "{:?}",
        dropped[0]
    );
    assert_eq!(p2.manifest.domains[0].dropped_near_heldout, 1);
    check_invariants(&p2);
}

#[test]
fn no_group_lands_in_both_splits_and_near_duplicates_of_heldout_are_dropped() {
    let f = Fixture::new();
    let targets = f.measured_targets("model.gguf", &ByteTokenizer);
    let config = f.config("model.gguf", targets);
    let p = prepare(&config, &ByteTokenizer, "m").unwrap();
    let sides = group_sides(&p.documents);
    assert!(sides.values().any(|s| *s == Split::Heldout));
    assert!(
        p.documents.iter().all(|d| d.dropped.is_none()),
        "the fixture has no near-duplicates"
    );
    inserted_near_duplicate_is_dropped(&f, &config, &ByteTokenizer);
}

#[test]
fn eval_set_near_duplicates_are_dropped_from_the_corpus() {
    let f = Fixture::new();
    let targets = f.measured_targets("model.gguf", &ByteTokenizer);
    // Not an exact copy (those leave by hash): the eval text adds a sentence.
    let eval = serde_json::json!({ "text": prose(3, 60 + 3) + " and one more sentence" });
    std::fs::write(f.dir.path().join("eval.jsonl"), format!("{eval}\n")).unwrap();
    let mut text = f.config_text("model.gguf", targets);
    text += "\n[[corpus.eval_sets]]\nname = \"bench\"\nsources = [{ path = \"eval.jsonl\" }]\n";
    let path = f.dir.path().join("eval.toml");
    std::fs::write(&path, text).unwrap();
    let p = prepare(&Config::load(&path).unwrap(), &ByteTokenizer, "m").unwrap();
    let d: Vec<_> = p
        .manifest
        .dropped
        .iter()
        .filter(|d| d.rule == "near_duplicate_of_eval")
        .collect();
    assert_eq!(d.len(), 1, "{:?}", p.manifest.dropped);
    assert!(
        d[0].at.ends_with("en.jsonl:4") && d[0].duplicate_of.starts_with("bench: "),
        "{:?}",
        d[0]
    );
    assert_eq!(p.manifest.eval_sets[0].docs, 1);
    // The eval set is a domain of its own after the calibration domains,
    // held out whole: evaluated, never fitted on, outside the shares.
    check_invariants(&p);
    let n = p.manifest.domains.len();
    assert_eq!(p.index.domains[n], "bench");
    let spans: Vec<_> = p
        .chunks
        .iter()
        .flat_map(|c| &c.spans)
        .filter(|s| usize::from(s.domain) == n)
        .collect();
    assert_eq!(
        spans.iter().map(|s| u64::from(s.len)).sum::<u64>(),
        p.manifest.eval_sets[0].tokens
    );
    assert!(spans.iter().all(|s| s.split == Split::Heldout));
    let doc = p.documents.iter().find(|d| d.domain == "bench").unwrap();
    assert_eq!((doc.split, doc.dropped.as_ref()), (Split::Heldout, None));
    let share_sum: f64 = p
        .manifest
        .domains
        .iter()
        .map(|d| d.shares.token_share)
        .sum();
    assert!(
        (share_sum - 1.0).abs() < 1e-9,
        "shares are the calibration domains'"
    );
}

#[test]
fn an_eval_set_named_as_a_domain_is_refused() {
    let f = Fixture::new();
    let mut text = f.config_text("model.gguf", [0.0; 3]);
    std::fs::write(f.dir.path().join("eval.jsonl"), "{\"text\": \"x\"}\n").unwrap();
    let domain = text
        .lines()
        .find_map(|l| l.strip_prefix("name = "))
        .unwrap()
        .to_string();
    text += &format!(
        "\n[[corpus.eval_sets]]\nname = {domain}\nsources = [{{ path = \"eval.jsonl\" }}]\n"
    );
    let path = f.dir.path().join("clash.toml");
    std::fs::write(&path, text).unwrap();
    let err = prepare(&Config::load(&path).unwrap(), &ByteTokenizer, "m")
        .unwrap_err()
        .to_string();
    assert!(err.contains("is named as a domain"), "{err}");
}

async fn manifest_absent(store: &RunStore) -> bool {
    read_manifest(store).await.unwrap().is_none()
}

/// A bad-input case: name, how to break the fixture, config text, expected message.
type BadCase = (&'static str, Box<dyn Fn(&Path)>, String, &'static str);

#[tokio::test]
async fn bad_inputs_fail_clearly_and_write_no_manifest() {
    let f = Fixture::new();
    let targets = f.measured_targets("model.gguf", &ByteTokenizer);
    let base = f.config_text("model.gguf", targets);
    let cases: Vec<BadCase> = vec![
        (
            "empty domain",
            Box::new(|d: &Path| std::fs::write(d.join("ja.txt"), "\n\n").unwrap()),
            base.clone(),
            "domain \"japanese\" is empty",
        ),
        (
            "malformed JSONL",
            Box::new(|d: &Path| {
                let mut t = std::fs::read_to_string(d.join("en.jsonl")).unwrap();
                t = t.replacen("}\n", "}\n{\"text\": \"unterminated\n", 1);
                std::fs::write(d.join("en.jsonl"), t).unwrap();
            }),
            base.clone(),
            "en.jsonl:2: malformed JSON",
        ),
        (
            "Parquet without the text column",
            Box::new(|d: &Path| {
                use arrow::array::{ArrayRef, RecordBatch, StringArray};
                let batch = RecordBatch::try_from_iter([(
                    "body",
                    std::sync::Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
                )])
                .unwrap();
                let file = std::fs::File::create(d.join("en.parquet")).unwrap();
                let mut w =
                    parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
                w.write(&batch).unwrap();
                w.close().unwrap();
            }),
            base.replace("en.jsonl", "en.parquet"),
            "no text column \"text\"",
        ),
        (
            "unknown chat role",
            Box::new(|d: &Path| {
                let t = std::fs::read_to_string(d.join("chat.jsonl"))
                    .unwrap()
                    .replacen("\"assistant\"", "\"bot\"", 1);
                std::fs::write(d.join("chat.jsonl"), t).unwrap();
            }),
            base.clone(),
            "chat.jsonl:1: message 3: unknown chat role \"bot\"",
        ),
        (
            "missing file",
            Box::new(|_: &Path| {}),
            base.replace("ja.txt", "nope.txt"),
            "cannot read",
        ),
    ];
    for (name, break_it, text, needle) in cases {
        let f = Fixture::new();
        break_it(f.dir.path());
        let path = f.dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let config = Config::load(&path).unwrap();
        let store = f.store("run");
        let err = prepare_run_with(&config, &store, false, load_bytes)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{name}: {err}");
        assert!(
            manifest_absent(&store).await,
            "{name}: a manifest was written"
        );
        assert!(
            store.list("").await.unwrap().is_empty(),
            "{name}: something was written"
        );
    }
}

#[tokio::test]
async fn same_inputs_reuse_the_corpus_and_changed_inputs_refuse_to_overwrite() {
    let f = Fixture::new();
    let targets = f.measured_targets("model.gguf", &ByteTokenizer);
    let config = f.config("model.gguf", targets);
    let store = f.store("run");
    let first = prepare_run_with(&config, &store, false, load_bytes)
        .await
        .unwrap();
    assert!(!first.reused);
    let index = runfiles::corpus::CorpusIndex::read(&store.child("corpus"))
        .await
        .unwrap();
    assert_eq!(index.n_tokens, first.manifest.chunk_plan.n_tokens);
    let again = prepare_run_with(&config, &store, false, load_bytes)
        .await
        .unwrap();
    assert!(again.reused);
    assert_eq!(again.manifest, first.manifest);

    let mut changed = config.clone();
    changed.corpus.n_ctx = 64;
    let err = prepare_run_with(&changed, &store, false, load_bytes)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--force") && err.contains("another --out"),
        "{err}"
    );
    assert_eq!(
        read_manifest(&store).await.unwrap().unwrap(),
        first.manifest
    );

    // A changed source file is a changed input too.
    let mut ja = std::fs::read_to_string(f.dir.path().join("ja.txt")).unwrap();
    ja += "\n\n追加の文です。";
    std::fs::write(f.dir.path().join("ja.txt"), ja).unwrap();
    assert!(prepare_run_with(&config, &store, false, load_bytes)
        .await
        .is_err());

    let forced = prepare_run_with(&changed, &store, true, load_bytes)
        .await
        .unwrap();
    assert_eq!(forced.manifest.chunk_plan.n_ctx, 64);
    assert_eq!(
        read_manifest(&store).await.unwrap().unwrap(),
        forced.manifest
    );
}

#[test]
fn an_image_record_needs_the_models_mmproj() {
    let f = Fixture::new();
    let en = f.dir.path().join("en.jsonl");
    let mut text = std::fs::read_to_string(&en).unwrap();
    text += "{\"image\": \"pic.jpg\", \"text\": \"a picture\", \"topic\": \"t0\"}\n";
    std::fs::write(&en, text).unwrap();
    std::fs::write(f.dir.path().join("pic.jpg"), [0xff, 0xd8, 0xff, 0xe0]).unwrap();
    let err = prepare(
        &f.config("model.gguf", [0.4, 0.2, 0.4]),
        &ByteTokenizer,
        "m",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("en.jsonl:41: carries image \"pic.jpg\"")
            && err.contains("[model] mmproj is not set"),
        "{err}"
    );
}
