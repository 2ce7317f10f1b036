//! Crafted input files (issue 42, findings 4 to 6 and the JSONL line of 8)
//! through the real binaries: each is refused with an error naming the
//! input, by a process that neither aborts nor swells. Every command's peak
//! memory is the kernel's own account of the child (`wait4`'s `ru_maxrss`),
//! and must stay under [`PEAK_LIMIT_KIB`].
//!
//! - A 64 GiB sparse GGUF (4 KiB on disk) whose header claims a 64 GiB
//!   array, or two billion tensors: the reader reserved memory for them
//!   before charging its budget and aborted asking for terabytes
//!   (`coordinator run`, `worker quantize`, `worker collect`).
//! - A vocabulary with one token string twice: llama.cpp's loader aborts
//!   (`GGML_ASSERT`) without a message.
//! - Images: `/dev/zero`, files outside the corpus directory (`..`, an
//!   absolute path, a symbolic link leading out) and a PNG whose header
//!   claims 64 megapixels in a small file.
//! - A JSONL line larger than a line may be, refused before it is parsed.
//! - Chat templates that hang or swell the renderer (issue 53, finding 2):
//!   a doubling string, a nested 10^5 x 10^5 loop, output inside it.
//! - Compressed sources that decompress to 4 GiB (issue 53, finding 3): a
//!   `.txt.gz`, a `.txt.zst` in a directory source, a `.json.gz` holding one
//!   4 GiB string.
//! - An `expert_count` of 2^32 - 1 (issue 53, finding 5): llama.cpp's loader
//!   aborts on `GGML_ASSERT(n_expert <= LLAMA_MAX_EXPERTS)`.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use synth::mmproj::{text_hidden_size, write_mmproj, MmprojSpec};
use synth::Preset;

/// Most memory (peak RSS, KiB) a refusing command may take: 100 MB.
const PEAK_LIMIT_KIB: u64 = 100_000;

/// Most memory a command refusing a file past a budget may take, the budget
/// spent included (issue 53): 200 MB.
const BUDGET_PEAK_LIMIT_KIB: u64 = 200_000;

/// Runs a workspace binary to its end and returns its output with its peak
/// resident memory in KiB, from `wait4` (the kernel's accounting of that
/// child alone, whatever else the test process runs).
// The child is reaped by `wait4` below, not by std's `wait`.
#[allow(clippy::zombie_processes)]
fn run_measured(bin: &str, args: &[&str]) -> (Output, u64) {
    let mut child = fixtures::command(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            v
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, zero is a valid value of every field;
    // wait4 fills it and `status` for our own child, which nothing else
    // reaps (`child` is never waited on through std).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    let output = Output {
        status: ExitStatus::from_raw(status),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (output, usage.ru_maxrss as u64)
}

/// Asserts a refusal: exit code 1 (not a signal: no abort), one stderr line
/// holding every needle, and a peak under the limit. Prints the figure.
fn assert_refused(what: &str, run: (Output, u64), needles: &[&str]) {
    assert_refused_within(what, run, needles, PEAK_LIMIT_KIB)
}

/// [`assert_refused`] with a peak under `limit_kib`.
fn assert_refused_within(what: &str, run: (Output, u64), needles: &[&str], limit_kib: u64) {
    let (out, peak) = run;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: should fail with an error, not {:?}: {err}",
        out.status
    );
    assert!(
        err.lines().any(|l| needles.iter().all(|n| l.contains(n))),
        "{what}: no line of the error holds all of {needles:?}: {err}"
    );
    println!("FIGURE {what}: refused, peak RSS {} MiB", peak >> 10);
    assert!(peak < limit_kib, "{what}: peak RSS {peak} KiB");
}

/// `coordinator COMMAND CONFIG --out OUT`.
fn coordinator(command: &str, config: &Path, out: &Path) -> (Output, u64) {
    let (config, out) = (config.to_str().unwrap(), out.to_str().unwrap());
    run_measured("coordinator", &[command, config, "--out", out])
}

/// A 64 GiB sparse file holding `header` at its start and zeros after.
fn sparse(path: &Path, header: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(header).unwrap();
    f.set_len(64 << 30).unwrap();
}

/// A GGUF v3 header start: magic, version, tensor and metadata counts.
fn gguf_start(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut h = b"GGUF".to_vec();
    h.extend(3u32.to_le_bytes());
    h.extend(n_tensors.to_le_bytes());
    h.extend(n_kv.to_le_bytes());
    h
}

#[test]
fn a_sparse_gguf_claiming_terabytes_is_refused_by_name_in_little_memory() {
    let d = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(d.path(), "");
    let model = d.path().join("tiny.gguf");
    // One metadata entry: a u8 array as long as the file (each element
    // would take a 32-byte value: 2.2 TB).
    let mut array = gguf_start(0, 1);
    let key = b"x.bytes";
    array.extend((key.len() as u64).to_le_bytes());
    array.extend(key);
    array.extend(9u32.to_le_bytes());
    array.extend(0u32.to_le_bytes());
    let at = array.len();
    array.extend(((64u64 << 30) - at as u64 - 8).to_le_bytes());
    let tensors = gguf_start(1 << 31, 0);
    let corpus = fixtures::corpus_dir(d.path(), "chunks", 2, 48);
    for (name, header, needle) in [
        (
            "array",
            array,
            format!("array length {}", (64u64 << 30) - at as u64 - 8),
        ),
        ("tensors", tensors, "tensor count 2147483648".to_string()),
    ] {
        sparse(&model, &header);
        let shown = model.display().to_string();
        let needles = [shown.as_str(), needle.as_str(), "a GGUF header may take"];
        let run = d.path().join("run");
        // `coordinator run` reads the header first (`coordinator corpus`
        // hashes the whole model before its tokenizer reads it: 64 GiB of
        // zeros, slow but in little memory).
        let what = format!("sparse GGUF ({name}), coordinator run");
        assert_refused(&what, coordinator("run", &config, &run), &needles);
        assert!(!run.join("corpus").exists());
        let q = d.path().join("q.gguf");
        let args = [
            "quantize",
            "--model",
            shown.as_str(),
            "--type",
            "Q8_0",
            "--out",
            q.to_str().unwrap(),
        ];
        let what = format!("sparse GGUF ({name}), worker quantize");
        let out = run_measured("worker", &args);
        assert_refused(&what, out, &needles);
        assert!(!q.exists());
        let args = fixtures::worker_args("collect", &model, &corpus, "0..2", &corpus, &[]);
        let what = format!("sparse GGUF ({name}), worker collect");
        assert_refused(&what, run_measured("worker", &args), &needles);
    }
}

/// The model at `path` with the token string of one token overwritten by
/// another's of the same length (llama.cpp's GGUF reader finds the tokens,
/// independently of the project's); returns the repeated token's text.
fn repeat_a_token(path: &Path) -> String {
    let tokens = fixtures::llama_gguf::LlamaGguf::open(path)
        .unwrap()
        .str_array("tokenizer.ggml.tokens")
        .unwrap();
    let (i, j) = (0..tokens.len())
        .flat_map(|j| (0..j).map(move |i| (i, j)))
        .find(|&(i, j)| tokens[i].len() == tokens[j].len() && tokens[i].len() >= 3)
        .expect("two tokens of one length");
    let mut bytes = std::fs::read(path).unwrap();
    let mut encoded = (tokens[j].len() as u64).to_le_bytes().to_vec();
    encoded.extend(tokens[j].as_bytes());
    let list = find(&bytes, b"tokenizer.ggml.tokens").unwrap();
    let at = list + find(&bytes[list..], &encoded).unwrap() + 8;
    bytes[at..at + tokens[i].len()].copy_from_slice(tokens[i].as_bytes());
    std::fs::write(path, bytes).unwrap();
    tokens[i].clone()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn a_repeated_token_string_is_refused_naming_model_and_token() {
    let d = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(d.path(), "");
    let model = d.path().join("tiny.gguf");
    let token = repeat_a_token(&model);
    let shown = model.display().to_string();
    let quoted = format!("{token:?}");
    let needles = [shown.as_str(), quoted.as_str(), "repeats token"];
    let run = d.path().join("run");
    assert_refused(
        "repeated token, coordinator corpus",
        coordinator("corpus", &config, &run),
        &needles,
    );
    assert!(!run.join("corpus").exists());
    let corpus = fixtures::corpus_dir(d.path(), "chunks", 2, 48);
    let args = fixtures::worker_args("collect", &model, &corpus, "0..2", &corpus, &[]);
    assert_refused(
        "repeated token, worker collect",
        run_measured("worker", &args),
        &needles,
    );
    assert!(!corpus.join("partials").exists());
}

/// The tiny model with its mmproj and a config of one domain read from
/// `corpus/records.jsonl`, whose directory holds `ok.png` (a bundled sample
/// image); `outside.png` lies beside the `corpus` directory.
fn image_fixture(dir: &Path) -> PathBuf {
    let model = fixtures::model(dir, Preset::Tiny);
    let spec = MmprojSpec::tiny(text_hidden_size(&model).unwrap());
    write_mmproj(&spec, 0, &dir.join("mmproj.gguf")).unwrap();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sample_images/images");
    std::fs::create_dir_all(dir.join("corpus")).unwrap();
    std::fs::copy(sample.join("red_square.png"), dir.join("corpus/ok.png")).unwrap();
    std::fs::copy(sample.join("blue_circle.png"), dir.join("outside.png")).unwrap();
    let config = dir.join("images.toml");
    std::fs::write(
        &config,
        "[model]\npath = \"tiny.gguf\"\nmmproj = \"mmproj.gguf\"\n[corpus]\nn_ctx = 64\nheldout_fraction = 0\n\
         [[corpus.domains]]\nname = \"pictures\"\n\
         sources = [{ path = \"corpus/records.jsonl\" }]\n",
    )
    .unwrap();
    config
}

/// Three good records, then `extra` (JSONL lines).
fn write_records(dir: &Path, extra: &str) {
    let good: String = ["a red square", "the same square", "red again"]
        .iter()
        .map(|c| format!("{{\"image\": \"ok.png\", \"text\": \"{c}\"}}\n"))
        .collect();
    std::fs::write(dir.join("corpus/records.jsonl"), good + extra).unwrap();
}

/// A PNG of 8000 x 8000 black RGB pixels (192 MB decoded) in a file of a
/// few hundred KiB, written by the `png` crate's encoder.
fn png_bomb(path: &Path) {
    let (w, h) = (8000u32, 8000u32);
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Balanced);
    let mut writer = enc.write_header().unwrap();
    let mut stream = writer.stream_writer().unwrap();
    let row = vec![0u8; w as usize * 3];
    for _ in 0..h {
        stream.write_all(&row).unwrap();
    }
    stream.finish().unwrap();
}

#[test]
fn images_outside_the_corpus_devices_and_bombs_are_refused_naming_the_record() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let config = image_fixture(dir);
    let run = dir.join("run");

    // The good records alone make a corpus with their image in it.
    write_records(dir, "");
    let (out, peak) = coordinator("corpus", &config, &run);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "FIGURE images, the good records: corpus peak RSS {} MiB",
        peak >> 10
    );
    assert_eq!(
        std::fs::read_dir(run.join("corpus/images"))
            .unwrap()
            .count(),
        1
    );
    std::fs::remove_dir_all(&run).unwrap();

    let outside = dir.join("outside.png");
    std::os::unix::fs::symlink(&outside, dir.join("corpus/link.png")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("corpus/zero.png")).unwrap();
    png_bomb(&dir.join("corpus/bomb.png"));
    assert!(
        std::fs::metadata(dir.join("corpus/bomb.png"))
            .unwrap()
            .len()
            < 2 << 20
    );
    let absolute = outside.display().to_string();
    let cases: [(&str, &str, &str); 6] = [
        ("/dev/zero", "/dev/zero", "an absolute path is refused"),
        (
            "../outside.png",
            "../outside.png",
            "a path with \"..\" is refused",
        ),
        ("absolute", &absolute, "an absolute path is refused"),
        ("link", "link.png", "through a symbolic link"),
        ("link to /dev/zero", "zero.png", "through a symbolic link"),
        (
            "PNG bomb",
            "bomb.png",
            "8000 x 8000 pixels, more than the 33554432",
        ),
    ];
    for (what, image, why) in cases {
        write_records(dir, &format!("{{\"image\": {image:?}, \"text\": \"x\"}}\n"));
        let quoted = format!("image {image:?}");
        assert_refused(
            &format!("image {what}, coordinator corpus"),
            coordinator("corpus", &config, &run),
            &["records.jsonl:4: ", quoted.as_str(), why],
        );
        assert!(!run.join("corpus/images").exists(), "{what}: images copied");
    }
}

/// A source's `image_dir` names where its images lie (datasets keep them
/// apart from their records): the records' names resolve under it and stay
/// confined to it. Without it, the same records' images are looked for
/// beside the records and not found.
#[test]
fn an_image_dir_holds_a_sources_images_and_confines_them() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let config = image_fixture(dir);
    std::fs::create_dir(dir.join("pictures")).unwrap();
    std::fs::rename(dir.join("corpus/ok.png"), dir.join("pictures/ok.png")).unwrap();
    write_records(dir, "");
    let run = dir.join("run");
    assert_refused(
        "images elsewhere, no image_dir, coordinator corpus",
        coordinator("corpus", &config, &run),
        &["records.jsonl:1: ", "image \"ok.png\"", "cannot read"],
    );
    let toml = std::fs::read_to_string(&config).unwrap().replace(
        "{ path = \"corpus/records.jsonl\" }",
        "{ path = \"corpus/records.jsonl\", image_dir = \"pictures\" }",
    );
    assert!(toml.contains("image_dir"), "{toml}");
    std::fs::write(&config, toml).unwrap();
    let (out, _) = coordinator("corpus", &config, &run);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(run.join("corpus/images"))
            .unwrap()
            .count(),
        1
    );
    std::fs::remove_dir_all(&run).unwrap();
    write_records(dir, "{\"image\": \"../outside.png\", \"text\": \"x\"}\n");
    assert_refused(
        "`..` out of the image_dir, coordinator corpus",
        coordinator("corpus", &config, &run),
        &[
            "records.jsonl:4: ",
            "image \"../outside.png\"",
            "a path with \"..\" is refused",
        ],
    );
    assert!(!run.join("corpus/images").exists());
}

#[test]
fn a_jsonl_line_over_the_limit_is_refused_before_it_is_parsed() {
    let d = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(d.path(), "");
    // The text domain read from JSONL instead: one short record, then one
    // line of 33 MiB (the limit is 32 MiB).
    let toml = std::fs::read_to_string(&config).unwrap().replace(
        "{ path = \"docs.txt\", separator = \"\\n\\n\" }",
        "{ path = \"docs.jsonl\" }",
    );
    assert!(toml.contains("docs.jsonl"), "{toml}");
    std::fs::write(&config, toml).unwrap();
    let long = "a".repeat(33 << 20);
    std::fs::write(
        d.path().join("docs.jsonl"),
        format!("{{\"text\": \"short\"}}\n{{\"text\": \"{long}\"}}\n"),
    )
    .unwrap();
    drop(long);
    assert_refused(
        "33 MiB JSONL line, coordinator corpus",
        coordinator("corpus", &config, &d.path().join("run")),
        &["docs.jsonl:2: line of more than 33554432 bytes exceeds the per-line limit"],
    );
}

/// Issue 53, finding 5: `qwen3moe.expert_count = 2^32 - 1` in the tiny
/// model's header is refused by name by the coordinator and by the worker,
/// each before llama.cpp (which aborts on it) loads the file.
#[test]
fn an_expert_count_past_llama_cpps_limit_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(d.path(), "");
    let model = d.path().join("tiny.gguf");
    let mut bytes = std::fs::read(&model).unwrap();
    let key = b"qwen3moe.expert_count";
    let at = find(&bytes, key).expect("the key is in the header") + key.len();
    // The key, then its value type (u32 = 4), then the value.
    assert_eq!(&bytes[at..at + 4], &4u32.to_le_bytes(), "a u32 value");
    bytes[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&model, bytes).unwrap();
    let shown = model.display().to_string();
    let needles = [
        shown.as_str(),
        "qwen3moe.expert_count is 4294967295, more than llama.cpp's LLAMA_MAX_EXPERTS (1024)",
    ];
    let run = d.path().join("run");
    assert_refused(
        "expert_count 2^32 - 1, coordinator run",
        coordinator("run", &config, &run),
        &needles,
    );
    assert!(!run.join("corpus").exists());
    let corpus = fixtures::corpus_dir(d.path(), "chunks", 2, 48);
    let args = fixtures::worker_args("collect", &model, &corpus, "0..2", &corpus, &[]);
    assert_refused(
        "expert_count 2^32 - 1, worker collect",
        run_measured("worker", &args),
        &needles,
    );
    assert!(!corpus.join("partials").exists());
}

/// Issue 53, finding 2: the quickstart model with a chat template that
/// doubles a string (exponential heap for linear fuel), one that loops
/// 10^5 x 10^5 times, and one that writes 100 kB per inner iteration of
/// that loop: `coordinator corpus` refuses each naming the model file and
/// the limit it crossed, within 10 s and in little memory.
#[test]
fn chat_templates_past_their_budget_are_refused_quickly_in_little_memory() {
    let d = tempfile::tempdir().unwrap();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models/quickstart-moe.gguf");
    std::fs::write(
        d.path().join("chat.jsonl"),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}, \
         {\"role\": \"assistant\", \"content\": \"hi there\"}]}\n",
    )
    .unwrap();
    let config = d.path().join("chat.toml");
    std::fs::write(
        &config,
        "[model]\npath = \"hostile.gguf\"\n[corpus]\nn_ctx = 64\n\
         [[corpus.domains]]\nname = \"chat\"\nsources = [{ path = \"chat.jsonl\" }]\n",
    )
    .unwrap();
    let model = d.path().join("hostile.gguf");
    let shown = model.display().to_string();
    let cases = [
        (
            "doubling string",
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}\
             {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
            "asked for more than its heap budget of 100663296 bytes per rendering",
        ),
        (
            "nested 10^5 x 10^5 loop",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "ran more than its fuel of 20000000 minijinja instructions per rendering",
        ),
        (
            "output in the loop",
            "{% for i in range(100000) %}{% for j in range(100000) %}\
             {{ 'x' * 100000 }}{% endfor %}{% endfor %}",
            "wrote more than its output cap of 33554432 bytes per rendering",
        ),
    ];
    for (what, template, why) in cases {
        fixtures::chat_template_swap::with_chat_template(&base, &model, template);
        let run = d.path().join("run");
        let start = std::time::Instant::now();
        let out = coordinator("corpus", &config, &run);
        let took = start.elapsed();
        println!("FIGURE template {what}: refused in {took:.2?}");
        assert_refused_within(
            &format!("template {what}, coordinator corpus"),
            out,
            &[&format!("model {shown}: "), why],
            BUDGET_PEAK_LIMIT_KIB,
        );
        assert!(took.as_secs_f64() < 10.0, "{what}: {took:?}");
        assert!(!run.join("corpus").exists(), "{what}");
    }
}

/// The text config of [`fixtures::text_config`] with its source replaced by
/// `source` (a TOML inline table).
fn config_with_source(dir: &Path, source: &str) -> PathBuf {
    let config = fixtures::text_config(dir, "");
    let toml = std::fs::read_to_string(&config)
        .unwrap()
        .replace("{ path = \"docs.txt\", separator = \"\\n\\n\" }", source);
    assert!(toml.contains(source), "{toml}");
    std::fs::write(&config, toml).unwrap();
    config
}

/// 64 MiB of the letter `a`: 64 of them make 4 GiB.
const BLOCK: usize = 64 << 20;

/// Writes `head`, 4 GiB of `a`, then `tail`, gzip-compressed as
/// concatenated members (one compressed block written 64 times), so the
/// file is a few MB and cheap to make.
fn gzip_bomb(path: &Path, head: &str, tail: &str) {
    use flate2::{write::GzEncoder, Compression};
    let gz = |bytes: &[u8]| {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    let block = gz(&vec![b'a'; BLOCK]);
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&gz(head.as_bytes())).unwrap();
    for _ in 0..64 {
        f.write_all(&block).unwrap();
    }
    f.write_all(&gz(tail.as_bytes())).unwrap();
    f.flush().unwrap();
}

/// Issue 53, finding 3: compressed sources of 4 GiB decompressed are
/// refused naming the file and the limit, within little memory: a
/// `.txt.gz` (one document grows past the per-document limit), a `.txt.zst`
/// in a directory source (past `max_file_bytes`, applied to the
/// decompressed size) and a `.json.gz` array holding one 4 GiB string (past
/// the per-record limit).
#[test]
fn compressed_sources_of_gigabytes_are_refused_in_little_memory() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();

    let txt = dir.join("bomb.txt.gz");
    gzip_bomb(&txt, "", "");
    let size = std::fs::metadata(&txt).unwrap().len();
    println!("FIGURE .txt.gz of 4 GiB: {size} bytes on disk");
    assert!(size < 32 << 20, "{size}");
    let config = config_with_source(dir, "{ path = \"bomb.txt.gz\", separator = \"\\n\\n\" }");
    assert_refused_within(
        ".txt.gz of 4 GiB, coordinator corpus",
        coordinator("corpus", &config, &dir.join("run")),
        &[
            "bomb.txt.gz (document 1): document of more than 8388608 bytes exceeds the \
             per-document limit of 8388608 bytes",
        ],
        BUDGET_PEAK_LIMIT_KIB,
    );

    std::fs::create_dir(dir.join("texts")).unwrap();
    std::fs::write(dir.join("texts/a.txt"), "A short document.").unwrap();
    let zst = dir.join("texts/bomb.txt.zst");
    {
        let block = zstd::encode_all(&vec![b'a'; BLOCK][..], 3).unwrap();
        let mut f = std::io::BufWriter::new(std::fs::File::create(&zst).unwrap());
        for _ in 0..64 {
            f.write_all(&block).unwrap();
        }
    }
    assert!(std::fs::metadata(&zst).unwrap().len() < 1 << 20);
    let config = config_with_source(dir, "{ path = \"texts\" }");
    let shown = zst.display().to_string();
    assert_refused_within(
        ".txt.zst of 4 GiB in a directory source, coordinator corpus",
        coordinator("corpus", &config, &dir.join("run")),
        &[
            &format!("cannot read {shown}: "),
            "decompresses to more than 1048576 bytes, the source's max_file_bytes",
        ],
        BUDGET_PEAK_LIMIT_KIB,
    );

    let json = dir.join("bomb.json.gz");
    gzip_bomb(&json, "[{\"text\": \"", "\"}]");
    let config = config_with_source(dir, "{ path = \"bomb.json.gz\" }");
    let shown = json.display().to_string();
    assert_refused_within(
        ".json.gz holding a 4 GiB string, coordinator corpus",
        coordinator("corpus", &config, &dir.join("run")),
        &[
            &format!("{shown}: "),
            "record 1: more than 33554432 bytes of JSON exceeds the per-record limit",
        ],
        BUDGET_PEAK_LIMIT_KIB,
    );
    assert!(!dir.join("run/corpus").exists());
}
