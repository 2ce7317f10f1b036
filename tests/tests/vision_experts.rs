//! Vision experts found by image calibration (issue #25): on a generated
//! model whose last two experts of every MoE layer serve image positions
//! only (`worker synth-model --vision-experts 2`, paired with its mmproj),
//! a text-only run of the sample's captions reports them dead and every
//! keep map drops them, while the run with the images reports them as
//! vision experts in every layer and every keep map of the same size keeps
//! them.

use runfiles::keepmap::KeepMap;
use std::path::{Path, PathBuf};
use synth::mmproj::{write_mmproj, MmprojSpec};
use synth::{Overrides, Preset};

/// Experts per layer of the tiny preset, and how many serve images.
const N_EXPERT: u32 = 16;
const N_VISION: u32 = 2;

fn sample_records() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/sample_images")
        .join(synth::images::RECORDS)
}

/// A config of `model` (and `mmproj`) over one domain read from `records`.
fn config(dir: &Path, name: &str, model: &Path, mmproj: Option<&Path>, records: &Path) -> PathBuf {
    let mmproj = mmproj.map_or(String::new(), |m| format!("mmproj = {m:?}\n"));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[model]\npath = {model:?}\n{mmproj}\n[corpus]\nn_ctx = 64\n\n\
             [[corpus.domains]]\nname = \"{name}\"\nsources = [{{ path = {records:?} }}]\n"
        ),
    )
    .unwrap();
    path
}

/// The fit split's count of each expert per layer, for `modality` (`None`:
/// all positions).
fn counts(run: &Path, modality: Option<&str>) -> Vec<Vec<u64>> {
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("saliency.json")).unwrap()).unwrap();
    let fit = &s["splits"]["fit"];
    let stats = match modality {
        Some(m) => &fit["modalities"][m],
        None => fit,
    };
    stats["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l["count"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
                .collect()
        })
        .collect()
}

/// Every keep map of size `k` the run's `score` wrote.
fn keep_maps(run: &Path, k: u32) -> Vec<KeepMap> {
    let suffix = format!("_K{k}.json");
    let mut maps: Vec<KeepMap> = std::fs::read_dir(run.join("keep_maps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(&suffix))
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    maps.sort_by(|a, b| a.method.cmp(&b.method));
    assert!(!maps.is_empty(), "no keep map of size {k}");
    maps
}

#[test]
fn image_calibration_finds_the_experts_text_calls_dead() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let model = dir.join("vision.gguf");
    let o = Overrides {
        vision_experts: Some(N_VISION as usize),
        ..Overrides::default()
    };
    synth::write_model_with(Preset::Tiny, 7, o, &model).unwrap();
    let mmproj = dir.join("mmproj.gguf");
    let spec = MmprojSpec::for_model(&model).unwrap();
    assert!(
        spec.image_channel.is_some(),
        "the mmproj finds the model's image channel"
    );
    write_mmproj(&spec, 0, &mmproj).unwrap();

    // The captions alone, as text records.
    let captions = dir.join("captions.jsonl");
    let text: Vec<String> = std::fs::read_to_string(sample_records())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|r| {
            r["text"]
                .as_str()
                .map(|t| serde_json::json!({ "text": t }).to_string())
        })
        .collect();
    assert!(text.len() >= 5);
    std::fs::write(&captions, text.join("\n") + "\n").unwrap();

    let text_run = dir.join("text");
    let captions = config(dir, "captions", &model, None, &captions);
    fixtures::coordinator_run(&captions, 2, &text_run);
    let image_run = dir.join("images");
    let images = config(dir, "images", &model, Some(&mmproj), &sample_records());
    fixtures::coordinator_run(&images, 2, &image_run);

    let vision = N_EXPERT - N_VISION..N_EXPERT;
    let text_only = counts(&text_run, None);
    let on_text = counts(&image_run, Some("text"));
    let on_images = counts(&image_run, Some("image"));
    for (layer, ((t, it), ii)) in text_only.iter().zip(&on_text).zip(&on_images).enumerate() {
        for e in vision.clone() {
            let e = e as usize;
            assert_eq!(
                t[e], 0,
                "layer {layer} expert {e}: dead in the text-only run"
            );
            assert_eq!(
                it[e], 0,
                "layer {layer} expert {e}: no text position routes to it"
            );
            assert!(
                ii[e] > 0,
                "layer {layer} expert {e}: image positions route to it"
            );
        }
    }
    let (table, rows) = vision_table(&image_run);
    assert_eq!(
        rows.len(),
        text_only.len(),
        "one row per MoE layer:\n{table}"
    );
    for row in rows {
        for e in vision.clone() {
            assert!(
                row.contains(&format!(" {e}: 0.00% / ")),
                "expert {e} in {row}"
            );
        }
    }

    // Every keep map of 12 experts (the largest default size) drops them
    // on text, keeps them with images.
    let k = 3 * N_EXPERT / 4;
    for (text_map, image_map) in keep_maps(&text_run, k).iter().zip(keep_maps(&image_run, k)) {
        assert_eq!(text_map.method, image_map.method);
        for (layer, kept) in &text_map.layers {
            let with_images = &image_map.layers[layer];
            for e in vision.clone() {
                assert!(
                    !kept.contains(&e),
                    "{} drops {e} of layer {layer} on text",
                    text_map.method
                );
                assert!(
                    with_images.contains(&e),
                    "{} keeps {e} of layer {layer} with images",
                    image_map.method
                );
            }
        }
    }
}

/// The "Vision experts" section of `run`'s report and its table's rows
/// (without the header).
fn vision_table(run: &Path) -> (String, Vec<String>) {
    let report = std::fs::read_to_string(run.join("report/report.md")).unwrap();
    let section = report.split("## Vision experts").nth(1).unwrap();
    let table = section.split("\n## ").next().unwrap();
    let rows = table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| layer"))
        .map(str::to_string)
        .collect();
    (table.to_string(), rows)
}

/// `configs/images.toml` runs as shipped: it generates its model and the
/// paired mmproj when they are missing, and the report shows the two
/// vision experts of every layer.
#[test]
fn the_image_config_generates_its_model_and_mmproj_and_finds_the_vision_experts() {
    let dir = tempfile::tempdir().unwrap();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let config = dir.path().join("images.toml");
    std::fs::copy(configs.join("images.toml"), &config).unwrap();
    std::os::unix::fs::symlink(
        configs.join("sample_images"),
        dir.path().join("sample_images"),
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = fixtures::coordinator_run(&config, 1, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    for file in ["tiny-vision.gguf", "tiny-vision-mmproj.gguf"] {
        assert!(
            err.contains(&format!("models/{file} is missing: generating it")),
            "{err}"
        );
        assert!(dir.path().join("models").join(file).exists(), "{file}");
    }
    let (table, rows) = vision_table(&out);
    assert_eq!(rows.len(), 3, "{table}");
    for row in rows {
        assert!(
            row.contains(" 14: 0.00% / ") && row.contains(" 15: 0.00% / "),
            "{row}"
        );
    }
}
