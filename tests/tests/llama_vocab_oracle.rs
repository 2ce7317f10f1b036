//! The product's `llama` crate against llama-cpp-2, an independent binding
//! of the same llama.cpp: its vocabulary-only load, tokenizer (with and
//! without BOS, special-token text parsed or not), detokenizer, vocabulary
//! facts, chat template and llama.cpp's built-in rendering, and its mtmd
//! tokenization of a prompt with images, on the generated tiny model, its
//! generated mmproj and the committed quickstart model. The corpus stage
//! tokenizes through these (and its own tests use them as their oracle),
//! so corpus/ token ids rest on this agreement.

use fixtures::llama_backend::{backend, mtmd_params};
use llama::{Piece, Vision};
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdInputChunkType, MtmdInputText,
};
use llama_cpp_2::token::LlamaToken;
use std::path::{Path, PathBuf};
use synth::mmproj::{text_hidden_size, write_mmproj, MmprojSpec};
use synth::Preset;

/// Texts that exercise the byte-level BPE: English, Japanese (merged
/// pieces), ChatML markup, stray bytes, spaces and an empty text.
const TEXTS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "日本語のテキストをトークンに分けます。東京は雨です。",
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces, tabs\tand\nnewlines  ",
    "emoji 🦊 and symbols ∑ ≠ ∞",
    "",
];

fn quickstart_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models/quickstart-moe.gguf")
}

fn oracle_model(path: &Path) -> LlamaModel {
    let params = LlamaModelParams::default().with_vocab_only(true);
    LlamaModel::load_from_file(backend(), path, &params).unwrap()
}

/// Every tokenization, piece and vocabulary fact of `path` as both
/// bindings give it.
fn vocabularies_agree(path: &Path) {
    let ours = llama::Model::load_vocab(path).unwrap();
    let theirs = oracle_model(path);
    let vocab = theirs.vocab();
    for text in TEXTS {
        for add in [false, true] {
            for special in [false, true] {
                let expected: Vec<i32> = vocab
                    .tokenize(text.as_bytes(), add, special)
                    .into_iter()
                    .map(|t| t.0)
                    .collect();
                assert_eq!(
                    ours.tokenize(text, add, special),
                    expected,
                    "{text:?} add {add} special {special}"
                );
            }
        }
    }
    // More tokens than the first guess of the output's size (half the
    // bytes): the second call, sized as llama.cpp asks.
    let long = "🦊∑≠".repeat(200);
    let expected: Vec<i32> = vocab
        .tokenize(long.as_bytes(), true, false)
        .into_iter()
        .map(|t| t.0)
        .collect();
    assert!(expected.len() > long.len() / 2 + 8, "{}", expected.len());
    assert_eq!(ours.tokenize(&long, true, false), expected);

    let n_vocab = vocab.n_tokens();
    assert_eq!(ours.n_vocab(), n_vocab as usize);
    for t in 0..n_vocab {
        for special in [false, true] {
            assert_eq!(
                ours.token_to_piece(t, special),
                vocab.token_to_piece(LlamaToken(t), special, None),
                "token {t} special {special}"
            );
        }
    }
    assert_eq!(ours.vocab_type(), format!("{:?}", vocab.vocab_type()));
    assert_eq!(ours.bos(), vocab.bos().0);
    assert_eq!(ours.eos(), vocab.eos().0);
    assert_eq!(ours.add_bos(), vocab.should_add_bos());
    assert_eq!(ours.add_eos(), vocab.should_add_eos());

    let template = ours.chat_template().expect("the model has a chat template");
    let oracle_template = theirs.chat_template(None).unwrap();
    assert_eq!(template.as_c_str(), oracle_template.as_c_str());
    let long_answer = "a long answer ".repeat(50);
    let messages = [
        ("system", "You answer briefly."),
        ("user", "What is 2 + 2?"),
        ("assistant", long_answer.as_str()),
        ("user", "日本語で?"),
    ];
    let chat: Vec<LlamaChatMessage> = messages
        .iter()
        .map(|(r, c)| LlamaChatMessage::new(r.to_string(), c.to_string()).unwrap())
        .collect();
    for add_assistant in [false, true] {
        assert_eq!(
            llama::apply_chat_template(&template, &messages, add_assistant).unwrap(),
            theirs
                .apply_chat_template(&oracle_template, &chat, add_assistant)
                .unwrap(),
            "add_assistant {add_assistant}"
        );
    }
    let err = llama::apply_chat_template(&template, &[("user", "a\0b")], false).unwrap_err();
    assert!(err.to_string().contains("nul byte"), "{err}");
}

#[test]
fn the_tiny_models_vocabulary_agrees_with_llama_cpp_2() {
    let dir = tempfile::tempdir().unwrap();
    vocabularies_agree(&fixtures::model(dir.path(), Preset::Tiny));
}

#[test]
fn the_quickstart_models_vocabulary_agrees_with_llama_cpp_2() {
    vocabularies_agree(&quickstart_model());
}

/// Pieces of llama-cpp-2's mtmd chunks, in our vocabulary.
fn oracle_pieces(mtmd: &MtmdContext, text: &str, images: &[PathBuf]) -> Vec<Piece> {
    let bitmaps: Vec<MtmdBitmap> = images
        .iter()
        .map(|p| MtmdBitmap::from_file(mtmd, p.to_str().unwrap(), false).unwrap())
        .collect();
    let refs: Vec<&MtmdBitmap> = bitmaps.iter().collect();
    let input = MtmdInputText {
        text: text.to_string(),
        add_special: true,
        parse_special: true,
    };
    let chunks = mtmd.tokenize(input, &refs).unwrap();
    (0..chunks.len())
        .map(|i| {
            let c = chunks.get(i).unwrap();
            match c.chunk_type() {
                MtmdInputChunkType::Text => {
                    Piece::Text(c.text_tokens().unwrap().iter().map(|t| t.0).collect())
                }
                MtmdInputChunkType::Image => Piece::Image(c.n_tokens()),
                MtmdInputChunkType::Audio => Piece::Audio(c.n_tokens()),
            }
        })
        .collect()
}

#[test]
fn the_mtmd_wrapper_tokenizes_images_as_llama_cpp_2_does() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = fixtures::model(dir.path(), Preset::Tiny);
    let mmproj = dir.path().join("mmproj.gguf");
    let spec = MmprojSpec::tiny(text_hidden_size(&model_path).unwrap());
    write_mmproj(&spec, 0, &mmproj).unwrap();

    let ours = llama::Model::load_vocab(&model_path).unwrap();
    let vision = Vision::load(&mmproj, &ours, 2).unwrap();
    let theirs = oracle_model(&model_path);
    let mtmd =
        MtmdContext::init_from_file(mmproj.to_str().unwrap(), &theirs, &mtmd_params()).unwrap();
    assert_eq!(llama::media_marker(), mtmd_default_marker());

    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sample_images/images");
    let images = [
        sample.join("red_square.png"),
        sample.join("checkerboard.png"),
    ];
    let marker = llama::media_marker();
    let text = format!(
        "<|im_start|>user\n{marker}\nand {marker}: which is red?<|im_end|>\n<|im_start|>assistant\n"
    );
    let bitmaps: Vec<llama::Bitmap> = images
        .iter()
        .map(|p| vision.bitmap(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    let refs: Vec<&llama::Bitmap> = bitmaps.iter().collect();
    let pieces = vision.tokenize(&text, true, true, &refs).unwrap();
    assert_eq!(pieces, oracle_pieces(&mtmd, &text, &images));
    assert_eq!(
        pieces
            .iter()
            .filter(|p| matches!(p, Piece::Image(16)))
            .count(),
        2,
        "{pieces:?}"
    );
    // One image short of the markers: mtmd refuses, and says so.
    let err = vision.tokenize(&text, true, true, &refs[..1]).unwrap_err();
    assert!(err.to_string().contains("mmproj.gguf"), "{err}");
    assert!(vision.bitmap(b"not an image").is_none());
}
