//! The device path (`--reduce device`, issue #14): observed tensors reduced
//! on their own backend (here llama.cpp's CPU backend, which runs the same
//! ggml graphs a GPU would) give the host path's counts exactly and its
//! sums within 1e-5 relative, with fewer bytes crossing to the host.

use numbers::exact::ExactSum;
use numbers::partial::Partial;
use numbers::stats::LayerAccum;
use runfiles::trace::TraceRow;
use synth::Preset;
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collected, Collector};

const N_CTX: u32 = 64;
const N_CHUNKS: u32 = 4;
/// The tolerance issue #14 allows between f32 device sums and the host's.
const REL: f64 = 1e-5;

/// Collects the test corpus with `decode_tokens` generated per held-out
/// prompt of a traced chunk.
fn collect(
    model: &std::path::Path,
    dir: &std::path::Path,
    reduce: Reduce,
    decode_tokens: usize,
) -> Collected {
    // Two micro-batches per chunk of 64.
    let opts = CollectOptions {
        f32_kv: true,
        ..fixtures::traced_collect_options(reduce, decode_tokens, 8)
    };
    fixtures::collect(model, dir, &fixtures::chunks(N_CHUNKS, N_CTX), N_CTX, opts)
}

fn assert_close(what: &str, host: f64, device: f64) {
    assert_close_to(what, host, device, 0.0);
}

/// [`assert_close`] relative to at least `floor` (the magnitude of a signed
/// sum's terms).
fn assert_close_to(what: &str, host: f64, device: f64, floor: f64) {
    let scale = host.abs().max(device.abs()).max(floor);
    assert!(
        (host - device).abs() <= REL * scale,
        "{what}: host {host} vs device {device} (relative {:e})",
        (host - device).abs() / scale
    );
}

fn assert_sums_close(what: &str, host: &[ExactSum], device: &[ExactSum]) {
    assert_eq!(host.len(), device.len(), "{what}: length");
    for (i, (h, d)) in host.iter().zip(device).enumerate() {
        assert_close(&format!("{what}[{i}]"), h.to_f64(), d.to_f64());
    }
}

fn assert_layers_match(group: &str, host: &LayerAccum, device: &LayerAccum) {
    let what = format!("{group} layer {}", host.layer);
    assert_eq!(host.layer, device.layer);
    assert_eq!(host.count, device.count, "{what}: count");
    assert!(
        host.count.iter().sum::<u64>() > 0,
        "{what}: no routed token"
    );
    let pairs = [
        ("prob_sum", &host.prob_sum, &device.prob_sum),
        ("weight_sum", &host.weight_sum, &device.weight_sum),
        ("ean_sum", &host.ean_sum, &device.ean_sum),
        ("reap_l2_sum", &host.reap_l2_sum, &device.reap_l2_sum),
        (
            "reap_l2_sq_sum",
            &host.reap_l2_sq_sum,
            &device.reap_l2_sq_sum,
        ),
    ];
    for (name, h, d) in pairs {
        assert_sums_close(&format!("{what} {name}"), h, d);
    }
}

fn assert_partials_match(host: &Partial, device: &Partial) {
    let (h, d) = (&host.experts, &device.experts);
    assert_eq!(h.shape, d.shape);
    assert_eq!(
        h.groups.keys().collect::<Vec<_>>(),
        d.groups.keys().collect::<Vec<_>>()
    );
    for (key, hg) in &h.groups {
        let dg = &d.groups[key];
        let name = format!("{:?}/{}", key.split, key.domain);
        assert_eq!(hg.n_tokens, dg.n_tokens, "{name}: n_tokens");
        for (hl, dl) in hg.layers.iter().zip(&dg.layers) {
            assert_layers_match(&name, hl, dl);
        }
    }
    let (hi, di) = (&host.imatrix, &device.imatrix);
    assert_eq!(
        hi.entries.keys().collect::<Vec<_>>(),
        di.entries.keys().collect::<Vec<_>>(),
        "imatrix weights"
    );
    assert!(hi.entries.keys().any(|n| n.contains("_exps")));
    for (name, he) in &hi.entries {
        let de = &di.entries[name];
        assert_eq!((he.n_in, he.n_mat), (de.n_in, de.n_mat), "{name}: shape");
        assert_eq!(he.counts, de.counts, "{name}: counts");
        assert_sums_close(name, &he.in_sum2, &de.in_sum2);
        assert_eq!(he.in_sum.len(), de.in_sum.len(), "{name}: in_sum length");
        let scale = he.in_sum_scale();
        for (i, (h, d)) in he.in_sum.iter().zip(&de.in_sum).enumerate() {
            let what = format!("{name} in_sum[{i}]");
            assert_close_to(&what, h.to_f64(), d.to_f64(), scale[i]);
        }
        assert!(
            he.in_sum.iter().any(|s| !s.is_zero()),
            "{name}: in_sum all zero"
        );
    }
    assert_eq!(
        (hi.chunk_count, hi.chunk_size),
        (di.chunk_count, di.chunk_size)
    );
    assert_eq!(host.nonfinite_drops, device.nonfinite_drops);
    assert_eq!(host.trace_tokens, device.trace_tokens);
    assert_eq!(host.chunk_stats.len(), device.chunk_stats.len());
    for (hc, dc) in host.chunk_stats.iter().zip(&device.chunk_stats) {
        assert_eq!((hc.chunk, hc.n_tokens), (dc.chunk, dc.n_tokens));
        assert_eq!(hc.count, dc.count, "chunk {} counts", hc.chunk);
    }
}

fn check(preset: Preset) {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), preset);
    // Decode traces on the small models only: on `wide` they triple the
    // test's time and exercise nothing the small ones do not.
    let decode_tokens = if preset == Preset::Wide { 0 } else { 3 };
    let host = collect(
        &model,
        &dir.path().join("host"),
        Reduce::Host,
        decode_tokens,
    );
    let device = collect(
        &model,
        &dir.path().join("device"),
        Reduce::Device,
        decode_tokens,
    );
    assert_partials_match(&host.partial, &device.partial);
    // Trace rows hold ids, gate weights and probabilities copied unchanged;
    // the lookahead guesses are ranked on the device in f32, so their
    // values may differ in the last bits (and a near tie swap).
    assert!(!host.trace.is_empty());
    assert_rows_match(&host.trace, &device.trace, "trace rows");
    assert_eq!(host.decode_trace.is_empty(), decode_tokens == 0);
    assert_rows_match(
        &host.decode_trace,
        &device.decode_trace,
        "decode trace rows",
    );
    assert!(
        device.partial.backends[0].ends_with(", device reductions"),
        "{:?}",
        device.partial.backends
    );
    let (h, d) = (host.partial.backend_to_host, device.partial.backend_to_host);
    // The measured tokens, plus the decode traces' prompts and generations.
    let measured = u64::from(N_CTX) * 3 + u64::from(N_CTX) * 5 / 8;
    assert_eq!(
        h.tokens > measured,
        decode_tokens > 0,
        "{} tokens",
        h.tokens
    );
    assert_eq!(h.tokens, d.tokens);
    eprintln!(
        "{preset:?}: backend-to-host bytes per token: host {:.0}, device {:.0}",
        h.per_token(),
        d.per_token()
    );
    // Fewer bytes even here, where a chunk is only 64 tokens and the
    // per-chunk importance sums weigh on every token (BENCHMARKS.md shows
    // the 1/20 goal at 2,048-token chunks).
    assert!(
        d.bytes < h.bytes,
        "device path read {} bytes, host path {}",
        d.bytes,
        h.bytes
    );
}

#[test]
fn device_reductions_match_the_host_path_on_tiny() {
    check(Preset::Tiny);
}

#[test]
fn device_reductions_match_the_host_path_on_tiny_alt() {
    check(Preset::TinyAlt);
}

#[test]
fn device_reductions_match_the_host_path_on_wide() {
    check(Preset::Wide);
}

/// The exact merge holds on the device path: one call over all chunks and
/// two calls merged give the same bytes, because device sums accumulate
/// within one chunk only and chunks are folded exactly.
#[test]
fn device_path_one_call_and_two_merged_calls_are_identical() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let chunks = fixtures::chunks(N_CHUNKS, N_CTX);
    let index = fixtures::write_corpus(dir.path(), &chunks, N_CTX);
    let opts = CollectOptions {
        n_ubatch: 32,
        threads: 2,
        trace_every: 0,
        reduce: Reduce::Device,
        ..Default::default()
    };
    let mut collector = Collector::load(&model, opts).unwrap();
    let mut run =
        |c: &[runfiles::corpus::Chunk]| collector.run(&index, c, &mut |_, _| {}).unwrap().partial;
    let one = run(&chunks);
    let mut merged = run(&chunks[2..]);
    merged.merge(&run(&chunks[..2])).unwrap();
    assert_eq!(one.to_bytes(), merged.to_bytes());
}

/// `[run] local_worker_reduce = "device"` reaches the workers that
/// `coordinator run --local-workers` starts, and the run verifies.
#[test]
fn the_run_config_key_puts_local_workers_on_the_device_path() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(dir.path(), "[run]\nlocal_worker_reduce = \"device\"\n");
    let out = dir.path().join("run");
    fixtures::coordinator_run(&config, 1, &out);
    let merged = std::fs::read(out.join("partials/merged.bin")).unwrap();
    let partial = Partial::from_bytes(&merged).unwrap();
    assert_eq!(partial.backends.len(), 1, "{:?}", partial.backends);
    assert!(
        partial.backends[0].ends_with(", device reductions"),
        "{:?}",
        partial.backends
    );
    assert!(partial.backend_to_host.bytes > 0);
    assert_eq!(
        partial.backend_to_host.tokens,
        partial
            .experts
            .groups
            .values()
            .map(|g| g.n_tokens)
            .sum::<u64>()
    );
    fixtures::run_ok("coordinator", &["verify", out.to_str().unwrap()]);
}

/// Trace rows equal but for the lookahead guesses, which agree within f32
/// rounding: probabilities within 1e-5 absolute, ids equal except where
/// their probabilities are that close.
fn assert_rows_match(host: &[TraceRow], device: &[TraceRow], what: &str) {
    assert_eq!(host.len(), device.len(), "{what}");
    let strip = |r: &TraceRow| TraceRow {
        lookahead: Vec::new(),
        ..r.clone()
    };
    for (h, d) in host.iter().zip(device) {
        assert_eq!(strip(h), strip(d), "{what}");
        assert_eq!(h.lookahead.len(), d.lookahead.len(), "{what}");
        for (a, b) in h.lookahead.iter().zip(&d.lookahead) {
            assert_eq!(a.distance, b.distance, "{what}");
            assert_eq!(a.ids.len(), b.ids.len(), "{what}");
            for i in 0..a.ids.len() {
                let (pa, pb) = (a.probs[i], b.probs[i]);
                assert!((pa - pb).abs() <= 1e-5, "{what}: rank {i}: {pa} vs {pb}");
                if a.ids[i] != b.ids[i] {
                    // A swap only between near-equal host values.
                    let j = a.ids.iter().position(|&e| e == b.ids[i]);
                    let near = j.is_some_and(|j| (a.probs[j] - pa).abs() <= 1e-5);
                    assert!(near, "{what}: rank {i}: {:?} vs {:?}", a.ids, b.ids);
                }
            }
        }
    }
}
