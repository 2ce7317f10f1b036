//! Property tests of the decoders that read peer or stored data: thousands
//! of mutated and random inputs, with a fixed seed and count, must each be
//! decoded or refused with an error; none may panic or make the process
//! allocate beyond the input's size (an abort ends the whole test binary).
//! Each target prints its input count and time (see BENCHMARKS.md).

use config::{Config, SourceConfig};
use corpus::source::read_source;
use fixtures::fake_engine::FakeEngine;
use fixtures::mutate::{mutate, random_bytes, Rng};
use numbers::partial::Partial;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

/// Runs `check` on `n` inputs (mutations of `seeds`, every tenth one random
/// bytes); a panic fails the test naming the input's index and seed.
fn property(target: &str, seeds: &[Vec<u8>], n: usize, mut check: impl FnMut(&[u8])) {
    let t = Instant::now();
    let mut rng = Rng::new(0x5eed ^ target.len() as u64);
    for i in 0..n {
        let input = if i % 10 == 9 {
            let len = rng.below(512);
            random_bytes(&mut rng, len)
        } else {
            mutate(&mut rng, &seeds[i % seeds.len()])
        };
        let r = catch_unwind(AssertUnwindSafe(|| check(&input)));
        assert!(
            r.is_ok(),
            "{target}: input #{i} panicked ({} bytes)",
            input.len()
        );
    }
    println!(
        "{target}: {n} inputs in {:.2} s ({:.0} inputs/s)",
        t.elapsed().as_secs_f64(),
        n as f64 / t.elapsed().as_secs_f64()
    );
}

#[test]
fn partial_decoder_refuses_or_decodes_every_mutated_partial() {
    let chunks = fixtures::chunks(4, 32);
    let d = tempfile::tempdir().unwrap();
    let index = fixtures::write_corpus(d.path(), &chunks, 32);
    let engine = FakeEngine::new("model");
    let seeds: Vec<Vec<u8>> = [0..1, 0..2, 1..4]
        .into_iter()
        .map(|r| engine.partial(&index, &chunks[r]).unwrap().to_bytes())
        .collect();
    let (mut ok, mut refused) = (0, 0);
    property("partial decoder", &seeds, 20_000, |b| {
        match Partial::from_bytes(b) {
            Ok(p) => {
                ok += 1;
                // Whatever decodes is a whole value with nothing after it.
                assert!(p.to_bytes().len() <= b.len());
            }
            Err(_) => refused += 1,
        }
    });
    assert!(
        refused >= 2_000,
        "mutations break partials: {ok} ok, {refused} refused"
    );
}

#[test]
fn corpus_readers_refuse_or_read_every_mutated_source() {
    let d = tempfile::tempdir().unwrap();
    let jsonl = concat!(
        "{\"text\": \"hello world\", \"topic\": \"a\"}\n",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}], \"topic\": 3}\n",
        "{\"text\": \"\\u65e5\\u672c\\u8a9e\"}\n",
    );
    let text = "first paragraph\n\nsecond one, longer\n\n\u{65e5}\u{672c}";
    let parquet = {
        use arrow::array::{ArrayRef, RecordBatch, StringArray};
        let col: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["one doc", "two docs"]));
        let batch = RecordBatch::try_from_iter([("text", col)]).unwrap();
        let mut out = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        out
    };
    for (name, seed, n) in [
        ("a.jsonl", jsonl.as_bytes().to_vec(), 2_000),
        ("a.txt", text.as_bytes().to_vec(), 2_000),
        ("a.parquet", parquet, 1_000),
    ] {
        let path = d.path().join(name);
        let cfg = SourceConfig {
            path: path.clone(),
            separator: name.ends_with(".txt").then(|| "\n\n".to_string()),
            ..Default::default()
        };
        let target = format!("corpus reader ({name})");
        property(&target, &[seed], n, |b| {
            std::fs::write(&path, b).unwrap();
            let _ = read_source(&cfg, &path, Some("topic"));
        });
    }
}

#[test]
fn config_parser_refuses_or_reads_every_mutated_config() {
    let quickstart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/quickstart.toml");
    let seed = std::fs::read(quickstart).unwrap();
    property("config parser", &[seed], 5_000, |b| {
        let _ = Config::parse(&String::from_utf8_lossy(b));
    });
}
