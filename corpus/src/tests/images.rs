//! Image records through the corpus stage with the real mtmd: the generated
//! `tiny` model, its generated mmproj and the bundled image sample beside a
//! text domain. The oracle tokenizes every record again through the llama
//! crate's mtmd wrapper directly (not the corpus's tokenizer), rendering chat
//! records with llama.cpp's built-in template; that wrapper is checked
//! against llama-cpp-2's mtmd API in tests/tests/llama_vocab_oracle.rs.

use super::*;
use crate::source::{read_source, Record};
use crate::tokenizer::LlamaTokenizer;
use ::llama::{Piece, Vision};
use runfiles::corpus::CHUNKS_FILE;
use std::collections::BTreeMap;
use synth::mmproj::{text_hidden_size, write_mmproj, MmprojSpec};
use synth::{write_model, Preset};

/// The image sample's records file, relative to the fixture's directory.
const IMAGES: &str = "sample_images/images.jsonl";

/// The text fixture with the generated tiny model, its mmproj and a copy of
/// `configs/sample_images`.
fn image_fixture() -> Fixture {
    let f = Fixture::new();
    let dir = f.dir.path();
    write_model(Preset::Tiny, 1, &dir.join("model.gguf")).unwrap();
    let spec = MmprojSpec::tiny(text_hidden_size(&dir.join("model.gguf")).unwrap());
    write_mmproj(&spec, 0, &dir.join("mmproj.gguf")).unwrap();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sample_images");
    std::fs::create_dir_all(dir.join("sample_images/images")).unwrap();
    for name in [
        "images.jsonl",
        "images/red_square.png",
        "images/blue_circle.png",
    ]
    .into_iter()
    .chain([
        "images/green_stripes.png",
        "images/sunset_gradient.png",
        "images/checkerboard.png",
    ]) {
        std::fs::copy(sample.join(name), dir.join("sample_images").join(name)).unwrap();
    }
    f
}

/// A config with an English text domain and the image domain.
fn image_config(f: &Fixture, n_ctx: u32, mmproj: bool) -> Config {
    let mmproj = if mmproj {
        "mmproj = \"mmproj.gguf\""
    } else {
        ""
    };
    let text = format!(
        r#"
[model]
path = "model.gguf"
{mmproj}

[corpus]
n_ctx = {n_ctx}
heldout_fraction = 0.2
seed = 7

[[corpus.domains]]
name = "english"
group_key = "topic"
sources = [{{ path = "en.jsonl" }}]

[[corpus.domains]]
name = "images"
group_key = "topic"
sources = [{{ path = "{IMAGES}" }}]
"#
    );
    let path = f.dir.path().join("images.toml");
    std::fs::write(&path, text).unwrap();
    Config::load(&path).unwrap()
}

/// The image sample's records, as the corpus reads them.
fn image_records(f: &Fixture) -> Vec<Record> {
    let path = f.dir.path().join(IMAGES);
    let cfg = config::SourceConfig {
        path: IMAGES.into(),
        ..Default::default()
    };
    read_source(&cfg, &path, Some("topic")).unwrap().records
}

/// What mtmd itself says, through the llama crate's wrapper: every image's
/// positions (by SHA-256), and every record's total tokens (by `at`).
struct Oracle {
    positions: BTreeMap<String, u32>,
    record_tokens: BTreeMap<String, u64>,
}

fn oracle(f: &Fixture, records: &[Record]) -> Oracle {
    let dir = f.dir.path();
    let model = ::llama::Model::load_vocab(&dir.join("model.gguf")).unwrap();
    let mtmd = Vision::load(&dir.join("mmproj.gguf"), &model, 1).unwrap();
    let template = model.chat_template().unwrap();
    let mut positions = BTreeMap::new();
    let mut record_tokens = BTreeMap::new();
    for r in records {
        let bitmaps: Vec<::llama::Bitmap> = r
            .images
            .iter()
            .map(|im| mtmd.bitmap(&std::fs::read(&im.path).unwrap()).unwrap())
            .collect();
        let (text, special) = match &r.content {
            crate::source::Content::Text(t) => (t.clone(), false),
            crate::source::Content::Chat(crate::chat::Chat { messages: m, .. }) => {
                let chat: Vec<(&str, &str)> = m
                    .iter()
                    .map(|m| (m.role.as_str(), m.content.as_str()))
                    .collect();
                (
                    ::llama::apply_chat_template(&template, &chat, false).unwrap(),
                    true,
                )
            }
        };
        let refs: Vec<&::llama::Bitmap> = bitmaps.iter().collect();
        let pieces = mtmd.tokenize(&text, true, special, &refs).unwrap();
        let images: Vec<usize> = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Image(n) => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(images.len(), r.images.len(), "{}", r.at);
        for (im, n) in r.images.iter().zip(images) {
            positions.insert(im.sha256.clone(), n as u32);
        }
        let total: usize = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.len(),
                Piece::Image(n) | Piece::Audio(n) => *n,
            })
            .sum();
        record_tokens.insert(r.at.clone(), total as u64);
    }
    Oracle {
        positions,
        record_tokens,
    }
}

#[tokio::test]
async fn image_spans_are_mtmd_positions_never_cut_and_count_as_tokens() {
    let f = image_fixture();
    let config = image_config(&f, 40, true);
    let records = image_records(&f);
    let oracle = oracle(&f, &records);
    assert_eq!(oracle.positions.len(), 5);
    assert!(oracle.positions.values().all(|&n| n == 16));

    let dir = f.dir.path();
    let tok =
        LlamaTokenizer::load(&dir.join("model.gguf"), Some(&dir.join("mmproj.gguf"))).unwrap();
    let p = prepare(&config, &tok, "m").unwrap();
    check_invariants(&p);

    // Every image span is whole and has mtmd's length for its image.
    let spans: Vec<_> = p.chunks.iter().flat_map(|c| &c.images).collect();
    for im in &spans {
        assert_eq!(im.len, oracle.positions[&im.sha256], "{}", im.sha256);
    }
    // Every image of every kept record is in some chunk, whole.
    let kept: Vec<&manifest::DocRecord> = p
        .documents
        .iter()
        .filter(|d| d.domain == "images" && d.dropped.is_none())
        .collect();
    let kept_images: usize = kept
        .iter()
        .map(|d| records.iter().find(|r| r.at == d.at).unwrap().images.len())
        .sum();
    assert!(kept_images >= 4, "{kept:?}");
    assert_eq!(spans.len(), kept_images);
    assert!(
        p.chunks
            .iter()
            .any(|c| c.tokens.len() < 40 && c.id.0 + 1 < p.chunks.len() as u32),
        "with n_ctx 40 some chunk closes early before an image"
    );
    // Shares are in tokens, image positions included: each kept record has
    // exactly mtmd's total, and the domain's tokens are their sum.
    for d in &kept {
        assert_eq!(d.tokens, oracle.record_tokens[&d.at], "{}", d.at);
    }
    let share = &p.manifest.domains[1].shares;
    assert_eq!(share.tokens, kept.iter().map(|d| d.tokens).sum::<u64>());
    let im = p.manifest.images.as_ref().unwrap();
    assert_eq!(im.occurrences as usize, spans.len());
    assert_eq!(im.positions, 16 * spans.len() as u64);
    assert_eq!(
        p.manifest.tokenizer.mmproj_sha256.as_deref(),
        Some(im.mmproj_sha256.as_str())
    );

    // Stored: the chunk table with its spans, and each image by content.
    let store = f.store("run");
    let first = prepare_run_with(&config, &store, false, LlamaTokenizer::load)
        .await
        .unwrap();
    assert!(!first.reused);
    let corpus = store.child(runfiles::layout::CORPUS_DIR);
    let table = corpus.get(CHUNKS_FILE).await.unwrap();
    assert_eq!(read_chunks(table, None).unwrap(), p.chunks);
    for r in &records {
        for image in &r.images {
            if spans.iter().any(|s| s.sha256 == image.sha256) {
                let stored = corpus
                    .get(&runfiles::layout::corpus::image(&image.sha256))
                    .await
                    .unwrap();
                assert_eq!(
                    stored.as_ref(),
                    std::fs::read(&image.path).unwrap().as_slice()
                );
            }
        }
    }
    let again = prepare_run_with(&config, &store, false, LlamaTokenizer::load)
        .await
        .unwrap();
    assert!(again.reused);
    // Another picture under the same name is another input.
    let blue = std::fs::read(dir.join("sample_images/images/blue_circle.png")).unwrap();
    std::fs::write(dir.join("sample_images/images/checkerboard.png"), blue).unwrap();
    let err = prepare_run_with(&config, &store, false, LlamaTokenizer::load)
        .await
        .unwrap_err();
    assert!(matches!(err, CorpusError::Exists { .. }), "{err}");
}

#[test]
fn bad_image_inputs_fail_clearly() {
    let f = image_fixture();
    let dir = f.dir.path();
    let (model, mmproj) = (dir.join("model.gguf"), dir.join("mmproj.gguf"));
    let tok = LlamaTokenizer::load(&model, Some(&mmproj)).unwrap();

    // An image longer than a chunk.
    let err = prepare(&image_config(&f, 12, true), &tok, "m")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("images.jsonl:1: image \"images/red_square.png\" takes 16 positions, more than n_ctx = 12"),
        "{err}"
    );

    // Image records without an mmproj.
    let text_only = LlamaTokenizer::load(&model, None).unwrap();
    let err = prepare(&image_config(&f, 64, false), &text_only, "m")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("images.jsonl:1: carries image \"images/red_square.png\"")
            && err.contains("[model] mmproj is not set"),
        "{err}"
    );

    // An mmproj made for another text model's width.
    let other = dir.join("mmproj-32.gguf");
    write_mmproj(&MmprojSpec::tiny(32), 0, &other).unwrap();
    let err = LlamaTokenizer::load(&model, Some(&other))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("mmproj-32.gguf")
            && err.contains("projects images to width 32")
            && err.contains("hidden size 64"),
        "{err}"
    );

    // An mmproj path that is not there.
    let err = LlamaTokenizer::load(&model, Some(&dir.join("gone.gguf")))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("gone.gguf"), "{err}");
}

#[test]
fn the_corpus_media_marker_is_mtmds() {
    assert_eq!(crate::media::MEDIA_MARKER, ::llama::media_marker());
}
