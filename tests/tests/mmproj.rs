//! The generated mmproj through llama.cpp's real mtmd (issue #25): it loads
//! beside a generated MoE text model, a chat prompt with one image tokenizes
//! into the positions the clip geometry implies, and decoding the chunks with
//! mtmd's helper gives finite logits that depend on the image. The bundled
//! image sample is the generator's output and every picture in it decodes
//! through mtmd into those positions. `coordinator run` measures an image
//! corpus with its workers feeding the mmproj's embeddings.

use fixtures::llama_backend::{backend, mtmd_params};
use gguf::read::GgufReader;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdInputChunkType, MtmdInputText,
};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use synth::mmproj::{text_hidden_size, write_mmproj, MmprojSpec};
use synth::Preset;

/// A generated tiny MoE model and its generated mmproj in `dir`.
fn model_and_mmproj(dir: &Path) -> (PathBuf, PathBuf) {
    let model = fixtures::model(dir, Preset::Tiny);
    let spec = MmprojSpec::tiny(text_hidden_size(&model).unwrap());
    let mmproj = dir.join("mmproj.gguf");
    write_mmproj(&spec, 0, &mmproj).unwrap();
    (model, mmproj)
}

/// A deterministic 40x24 RGB picture (not square: mtmd resizes and pads it).
fn picture(seed: u8) -> (u32, u32, Vec<u8>) {
    let (w, h) = (40u32, 24u32);
    let mut rgb = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let v = (x * 6) as u8 ^ (y * 10) as u8;
            rgb.extend([
                v.wrapping_add(seed),
                255 - v,
                seed.wrapping_mul(3) ^ (y as u8),
            ]);
        }
    }
    (w, h, rgb)
}

/// Positions per image from the mmproj file itself (image and patch size),
/// read with this project's GGUF reader, not mtmd.
fn geometry_positions(mmproj: &Path) -> usize {
    let r = GgufReader::open(mmproj).unwrap();
    let key = |k: &str| r.header.get(k).and_then(|v| v.as_u64()).unwrap() as usize;
    let side = key("clip.vision.image_size") / key("clip.vision.patch_size");
    // The position embedding has one row per patch: the encoder's own count.
    let pos = r.header.tensor("v.position_embd.weight").unwrap();
    assert_eq!(pos.dims[1] as usize, side * side);
    side * side
}

#[test]
fn generated_mmproj_runs_through_mtmd_beside_a_moe_model() {
    let dir = tempfile::tempdir().unwrap();
    let (model_path, mmproj) = model_and_mmproj(dir.path());
    let per_image = geometry_positions(&mmproj);
    assert_eq!(per_image, 16);

    let backend = backend();
    let model =
        LlamaModel::load_from_file(backend, &model_path, &LlamaModelParams::default()).unwrap();
    let mut mtmd = MtmdContext::init_from_file(mmproj.to_str().unwrap(), &model, &mtmd_params())
        .expect("mtmd loads the generated mmproj beside the text model");
    assert!(mtmd.support_vision());
    assert!(!mtmd.decode_use_mrope() && !mtmd.decode_use_non_causal());

    let template = model.chat_template(None).unwrap();
    let user = format!("{}\nWhat is in the picture?", mtmd_default_marker());
    let chat = [LlamaChatMessage::new("user".into(), user).unwrap()];
    let prompt = model.apply_chat_template(&template, &chat, true).unwrap();
    assert!(prompt.contains(mtmd_default_marker()), "{prompt}");

    let mut last_logits = Vec::new();
    for seed in [0u8, 101] {
        let (w, h, rgb) = picture(seed);
        let bitmap = MtmdBitmap::from_image_data(w, h, &rgb).unwrap();
        let text = MtmdInputText {
            text: prompt.clone(),
            add_special: true,
            parse_special: true,
        };
        let chunks = mtmd.tokenize(text, &[&bitmap]).unwrap();
        let kinds: Vec<MtmdInputChunkType> = (0..chunks.len())
            .map(|i| chunks.get(i).unwrap().chunk_type())
            .collect();
        assert_eq!(
            kinds,
            [
                MtmdInputChunkType::Text,
                MtmdInputChunkType::Image,
                MtmdInputChunkType::Text
            ]
        );
        let image = chunks.get(1).unwrap();
        assert_eq!(image.n_tokens(), per_image, "image tokens mtmd reports");
        assert_eq!(image.n_positions() as usize, per_image, "image positions");
        let text_tokens: usize = [0, 2]
            .iter()
            .map(|&i| chunks.get(i).unwrap().text_tokens().unwrap().len())
            .sum();
        assert_eq!(chunks.total_tokens(), text_tokens + per_image);
        assert_eq!(chunks.total_positions() as usize, text_tokens + per_image);

        let ctx_params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(256))
            .with_n_batch(64)
            .with_n_threads(2)
            .with_n_threads_batch(2);
        let mut ctx = model.new_context(backend, ctx_params).unwrap();
        let n_past = chunks
            .eval_chunks(&mut mtmd, &mut ctx, 0, 0, 64, true)
            .expect("mtmd's helper encodes the image and decodes every chunk");
        assert_eq!(n_past, chunks.total_positions());
        let logits = ctx.get_logits().to_vec();
        assert!(!logits.is_empty() && logits.iter().all(|v| v.is_finite()));
        last_logits.push(logits);
    }
    // The image reaches the text model: another picture, other logits.
    assert_ne!(last_logits[0], last_logits[1]);
}

/// `configs/sample_images` in the repository.
fn sample_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sample_images")
}

#[test]
fn the_bundled_image_sample_is_the_generators_output() {
    for (name, bytes) in synth::images::files().unwrap() {
        let committed = std::fs::read(sample_dir().join(&name)).unwrap();
        assert!(
            committed == bytes,
            "{name} differs from `worker synth-images --out configs/sample_images`"
        );
    }
}

#[test]
fn every_bundled_image_decodes_through_mtmd_into_the_geometry_positions() {
    use config::SourceConfig;
    use corpus::source::{read_source, MEDIA_MARKER};
    let path = sample_dir().join(synth::images::RECORDS);
    let cfg = SourceConfig {
        path: path.clone(),
        ..Default::default()
    };
    let records = read_source(&cfg, &path, Some("topic")).unwrap().records;
    assert_eq!(records.len(), 7);

    let dir = tempfile::tempdir().unwrap();
    let (model_path, mmproj) = model_and_mmproj(dir.path());
    let per_image = geometry_positions(&mmproj);
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(backend(), &model_path, &params).unwrap();
    let mtmd =
        MtmdContext::init_from_file(mmproj.to_str().unwrap(), &model, &mtmd_params()).unwrap();
    let mut n_images = 0;
    for r in &records {
        assert!(!r.images.is_empty(), "{}", r.at);
        for image in &r.images {
            let bitmap = MtmdBitmap::from_file(&mtmd, image.path.to_str().unwrap(), false)
                .unwrap_or_else(|e| panic!("{}: {e}", image.path.display()));
            let text = MtmdInputText {
                text: MEDIA_MARKER.into(),
                add_special: false,
                parse_special: true,
            };
            let chunks = mtmd.tokenize(text, &[&bitmap]).unwrap();
            let image_chunks: Vec<usize> = (0..chunks.len())
                .filter_map(|i| chunks.get(i))
                .filter(|c| c.chunk_type() == MtmdInputChunkType::Image)
                .map(|c| c.n_tokens())
                .collect();
            assert_eq!(image_chunks, [per_image], "{}", image.name);
            n_images += 1;
        }
    }
    assert_eq!(n_images, 8);
}

/// The image sample's config: the generated model and an mmproj of `seed`
/// in `dir`, one lease a chunk, the bundled records as one domain.
fn image_config(dir: &Path, seed: u64) -> PathBuf {
    let model = fixtures::model(dir, Preset::Tiny);
    let spec = MmprojSpec::tiny(text_hidden_size(&model).unwrap());
    let mmproj = dir.join(format!("mmproj-{seed}.gguf"));
    write_mmproj(&spec, seed, &mmproj).unwrap();
    let records = sample_dir().join(synth::images::RECORDS);
    let config = dir.join(format!("images-{seed}.toml"));
    std::fs::write(
        &config,
        format!(
            "[model]\npath = {model:?}\nmmproj = {mmproj:?}\n\n[corpus]\nn_ctx = 64\nheldout_fraction = 0\n\n\
             [run]\nlease_chunks = 1\n\n\
             [eval]\nkeep_maps = [\"frequency_K8\", \"reap_mean_K12\"]\n\n\
             [[corpus.domains]]\nname = \"images\"\nsources = [{{ path = {records:?} }}]\n"
        ),
    )
    .unwrap();
    config
}

/// Workers measure an image corpus through the mmproj (issue #25, slice
/// 4): `coordinator run` on the bundled sample exits 0 with verify passing,
/// every image position counted as a token of its domain, the same bytes
/// with 1 and 3 workers, and other statistics with another mmproj (the
/// image positions decode the projector's embeddings, not marker ids).
/// `worker collect`, one process without a coordinator, still refuses image
/// chunks by name.
#[test]
fn workers_measure_an_image_corpus_through_the_mmproj() {
    let dir = tempfile::tempdir().unwrap();
    let config = image_config(dir.path(), 0);
    let one = dir.path().join("one");
    fixtures::coordinator_run(&config, 1, &one);
    let images: Vec<_> = std::fs::read_dir(one.join("corpus/images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(images.len(), 5, "{images:?}");
    // `coordinator run` exits 0 only when every verify invariant holds.

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(one.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["images"]["positions"], 128, "{manifest}");
    let saliency = |run: &Path| std::fs::read(run.join("saliency.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_slice(&saliency(&one)).unwrap();
    let chunks: Vec<runfiles::corpus::Chunk> = runfiles::corpus::read_chunks(
        std::fs::read(one.join("corpus/chunks.parquet"))
            .unwrap()
            .into(),
        None,
    )
    .unwrap();
    let positions: u64 = chunks.iter().map(|c| c.tokens.len() as u64).sum();
    let image_positions: u64 = chunks
        .iter()
        .flat_map(|c| &c.images)
        .map(|im| u64::from(im.len))
        .sum();
    assert_eq!(image_positions, 128);
    let measured: u64 = parsed["splits"]
        .as_object()
        .unwrap()
        .values()
        .map(|split| split["n_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(measured, positions, "every position, image ones included");
    // Per modality: the image positions of each split are its image group,
    // and the report lists the experts rare on text and live on images.
    for (split, stats) in parsed["splits"].as_object().unwrap() {
        let split = numbers::Split::parse(split).unwrap();
        let of_split: u64 = chunks
            .iter()
            .flat_map(|c| {
                c.spans
                    .iter()
                    .filter(|s| s.split == split)
                    .map(move |s| (c, s))
            })
            .map(|(c, s)| u64::from(c.image_positions_in(s)))
            .sum();
        let modalities = &stats["modalities"];
        let image = modalities["image"]["n_tokens"].as_u64().unwrap_or(0);
        let text = modalities["text"]["n_tokens"].as_u64().unwrap();
        assert_eq!(image, of_split, "{split} image positions");
        assert_eq!(text + image, stats["n_tokens"].as_u64().unwrap());
    }
    let report = std::fs::read_to_string(one.join("report/report.md")).unwrap();
    assert!(report.contains("## Vision experts"), "{report}");

    let three = dir.path().join("three");
    fixtures::coordinator_run(&config, 3, &three);
    for name in ["saliency.json", "imatrix.gguf", "eval/summary.json"] {
        assert!(
            std::fs::read(one.join(name)).unwrap() == std::fs::read(three.join(name)).unwrap(),
            "{name} differs between 1 and 3 workers"
        );
    }
    // Evaluation feeds the images too: both keep maps have KL per modality,
    // text and image-conditioned positions adding up to each split's.
    let summary: numbers::eval::EvalSummary =
        serde_json::from_slice(&std::fs::read(one.join("eval/summary.json")).unwrap()).unwrap();
    assert_eq!(summary.candidates.len(), 2);
    for c in &summary.candidates {
        let mut scored = [0u64; 2];
        for (split, f) in &c.splits {
            let (text, image) = (&f.modalities["text"], &f.modalities["image"]);
            assert_eq!(text.n + image.n, f.all.n, "{} {split}", c.name);
            scored[0] += text.n;
            scored[1] += image.n;
        }
        assert!(scored.iter().all(|&n| n > 0), "{}: {scored:?}", c.name);
    }
    let report = std::fs::read_to_string(one.join("report/report.md")).unwrap();
    assert!(report.contains("KL per modality"), "{report}");

    let other = dir.path().join("other");
    fixtures::coordinator_run(&image_config(dir.path(), 1), 1, &other);
    assert_ne!(
        saliency(&one),
        saliency(&other),
        "another projector must change what the image positions route to"
    );

    let model = dir.path().join("tiny.gguf");
    let range = format!("0..{}", chunks.len());
    let out = fixtures::run(
        "worker",
        &fixtures::worker_args("collect", &model, &one, &range, &dir.path().join("c"), &[]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(" carries ") && err.contains("a one-process worker command"),
        "{err}"
    );
}
