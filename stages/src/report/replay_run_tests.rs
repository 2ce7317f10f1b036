//! `replay_run` on a synthetic run directory (real Parquet parts written with
//! `runfiles::trace::write_part`, a keep map and a model GGUF), and the run
//! report's miss-rate figures drawn from what it wrote.

use ::replay::capacity::Capacity;
use ::replay::results::{Mode, TraceKind};
use ::replay::{replay_run, Policy, ReplayArgs, ReplayReport};
use gguf::write::GgufWriter;
use numbers::Split;
use runfiles::trace::{write_part, TraceRow};

/// `--capacity`'s list, as the flag reads it.
fn capacities(list: &str) -> Vec<Capacity> {
    list.split(',')
        .map(|c| Capacity::parse(c).unwrap())
        .collect()
}

/// Trace with a heavy hitter (LRU 6 misses, Belady 4 at capacity 2).
const HEAVY: [u16; 8] = [0, 0, 0, 1, 2, 0, 1, 2];
/// Cycling trace (LRU 8 misses, Belady 6 at capacity 2).
const CYCLE: [u16; 8] = [0, 1, 2, 0, 1, 3, 0, 1];

fn rows(
    split: Split,
    layer: u32,
    experts: &[u16],
    positions: std::ops::Range<usize>,
) -> Vec<TraceRow> {
    positions
        .map(|pos| {
            let e = experts[pos];
            TraceRow {
                split,
                domain: "web".into(),
                chunk: 0,
                pos: pos as u32,
                token_id: 7,
                layer,
                selected: vec![e],
                selected_weight: vec![1.0],
                topn_id: vec![e, (e + 1) % 4],
                topn_prob: vec![0.7, 0.3],
                lookahead: Vec::new(),
            }
        })
        .collect()
}

fn write_run(dir: &std::path::Path) {
    let trace = dir.join("trace");
    std::fs::create_dir_all(trace.join("decode")).unwrap();
    // Two parts, each holding half of every sequence, written out of order.
    let mut a = [
        rows(Split::Fit, 0, &HEAVY, 4..8),
        rows(Split::Fit, 3, &CYCLE, 4..8),
        rows(Split::Heldout, 0, &CYCLE, 0..8),
    ]
    .concat();
    let mut b = [
        rows(Split::Fit, 3, &CYCLE, 0..4),
        rows(Split::Fit, 0, &HEAVY, 0..4),
        rows(Split::Heldout, 3, &HEAVY, 0..8),
    ]
    .concat();
    let put = |name: &str, rows: &mut [TraceRow]| {
        std::fs::write(trace.join(name), write_part(rows, 1, 2).unwrap()).unwrap()
    };
    put("part-a.parquet", &mut a);
    put("part-b.parquet", &mut b);
    put(
        "decode/part-0.parquet",
        &mut rows(Split::Heldout, 0, &HEAVY, 0..8),
    );
    std::fs::write(
        dir.join("saliency.json"),
        br#"{"n_expert": 4, "n_expert_used": 1, "gating": "softmax", "trace_tokens_written": 0, "nonfinite_drops": 0, "splits": {}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("keep_maps")).unwrap();
    std::fs::write(
        dir.join("keep_maps/frequency_K2.json"),
        br#"{"method":"frequency","k":2,"params":{},"saliency_sha256":"","layers":{"0":[0,1],"3":[0,1]}}"#,
    )
    .unwrap();
    // 4 experts of 2x2 f32 per projection: 16 bytes each, 48 per expert.
    let mut g = GgufWriter::new();
    for layer in [0, 3] {
        for proj in ["gate", "up", "down"] {
            g.tensor_f32(
                &format!("blk.{layer}.ffn_{proj}_exps.weight"),
                &[2, 2, 4],
                &[0.0; 16],
            );
        }
    }
    let model = dir.join("model.gguf");
    std::fs::write(&model, g.to_bytes()).unwrap();
}

#[test]
fn replay_run_reads_parts_keep_maps_and_model_and_writes_results() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let run = dir.path().to_str().unwrap();
    let model = dir.path().join("model.gguf");
    let args = ReplayArgs {
        model: Some(model.clone()),
        policies: vec![Policy::Lru, Policy::Belady],
        capacity: capacities("2"),
        keep_map: vec!["none".into(), "frequency_K2".into()],
        mode: vec![Mode::Token, Mode::Ubatch],
        ubatch: 4,
        ..ReplayArgs::for_run(run)
    };
    let report = replay_run(&args).unwrap();
    let get = |split, trace, mode, policy, keep| {
        report
            .row(split, trace, mode, policy, "2", keep)
            .unwrap_or_else(|| panic!("no row {split} {trace:?} {mode:?} {policy} {keep}"))
    };
    use Mode::{Token, Ubatch};
    use Split::{Fit, Heldout};
    use TraceKind::{Decode, Prefill};
    let lru = get(Fit, Prefill, Token, Policy::Lru, "none");
    assert_eq!(
        (lru.tokens, lru.layers, lru.misses, lru.forced_misses),
        (8, 2, 6 + 8, 0)
    );
    assert_eq!(lru.bytes_moved, Some(14 * 48));
    assert_eq!(lru.misses_per_token, 14.0 / 8.0);
    assert_eq!(
        get(Fit, Prefill, Token, Policy::Belady, "none").misses,
        4 + 6
    );
    assert_eq!(
        get(Heldout, Prefill, Token, Policy::Lru, "none").misses,
        8 + 6
    );
    // Ubatches of 4: HEAVY misses 2 + 1, CYCLE 3 + 2.
    let ub = get(Fit, Prefill, Ubatch, Policy::Lru, "none");
    assert_eq!((ub.misses, ub.steps, ub.overflow_steps), (3 + 5, 4, 3));
    // Decode traces: per token only.
    assert_eq!(get(Heldout, Decode, Token, Policy::Lru, "none").misses, 6);
    assert!(report
        .row(Heldout, Decode, Ubatch, Policy::Lru, "2", "none")
        .is_none());
    assert!(report
        .row(Fit, Decode, Token, Policy::Lru, "2", "none")
        .is_none());
    // Keep map {0, 1}: expert 2 (top-2 [2, 3]) has no kept expert: forced;
    // expert 3 (top-2 [3, 0]) becomes 0. Fit: 2 forced in layer 0, 1 in layer 3.
    let kept = get(Fit, Prefill, Token, Policy::Lru, "frequency_K2");
    assert_eq!((kept.forced_misses, kept.misses, kept.requests), (3, 4, 13));
    assert_eq!(kept.hit_rate, (13.0 - 4.0) / 16.0);
    assert_eq!(kept.bytes_moved, Some(7 * 48));
    // The one-pass curve agrees with the capacity-2 run.
    let curve = report
        .lru_curves
        .iter()
        .find(|c| {
            (c.split, c.trace_mode, c.mode, c.keep_map.as_str()) == (Fit, Prefill, Token, "none")
        })
        .unwrap();
    assert_eq!((curve.points[1].capacity, curve.points[1].misses), (2, 14));
    assert_eq!(curve.points.len(), 4);
    let written = std::fs::read(dir.path().join("replay/results.json")).unwrap();
    // The stored results read back through the same schema, and the run
    // report draws LRU in each (split, trace, mode) panel of each keep map's
    // figure at every integer capacity (its one-pass curve), through the
    // replayed row, forced misses counted as the rows count them.
    let read = ReplayReport::from_json(&written, "replay/results.json").unwrap();
    assert_eq!(
        (&read.rows, &read.lru_curves),
        (&report.rows, &report.lru_curves)
    );
    let rates = super::replay::miss_rates(&read);
    let maps: Vec<&str> = rates.figures.iter().map(|f| f.keep_map.as_str()).collect();
    assert_eq!(maps, ["none", "frequency_K2"]);
    for (figure, keep) in rates.figures.iter().zip(["none", "frequency_K2"]) {
        let panel = figure
            .panels
            .iter()
            .find(|p| (p.split, p.trace_mode, p.mode) == (Fit, Prefill, Token))
            .unwrap();
        let lru = panel
            .curves
            .iter()
            .find(|c| c.policy == Policy::Lru)
            .unwrap();
        let xs: Vec<f64> = lru.points.iter().map(|p| p.0).collect();
        assert_eq!(xs, [1.0, 2.0, 3.0, 4.0], "{keep}");
        let row = get(Fit, Prefill, Token, Policy::Lru, keep);
        assert_eq!(lru.points[1].1, 1.0 - row.hit_rate, "{keep}");
        assert!(
            lru.points.windows(2).all(|w| w[1].1 <= w[0].1),
            "LRU misses never grow with capacity: {:?}",
            lru.points
        );
    }
    let none_lru = get(Fit, Prefill, Token, Policy::Lru, "none");
    assert_eq!(
        rates.figures[0].panels[0].curves[0].points[1],
        (2.0, 14.0 / none_lru.requests as f64)
    );
    assert!(
        report
            .markdown
            .contains("| frequency_K2 | prefill | token | lru | 2 |"),
        "{}",
        report.markdown
    );
    assert!(dir.path().join("replay/report.md").exists());
}

#[test]
fn replay_run_names_a_missing_keep_map() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let args = ReplayArgs {
        keep_map: vec!["reap_mean_K3".into()],
        ..ReplayArgs::for_run(dir.path().to_str().unwrap())
    };
    let err = format!("{:#}", replay_run(&args).unwrap_err());
    assert!(
        err.contains("keep_maps/reap_mean_K3.json does not exist"),
        "{err}"
    );
}

/// The model of [`write_run`] with each layer's gate and up projections
/// fused into one `ffn_gate_up_exps` tensor (2x4 per expert): the same 48
/// bytes per expert.
fn write_fused_twin(path: &std::path::Path) {
    let mut g = GgufWriter::new();
    for layer in [0, 3] {
        g.tensor_f32(
            &format!("blk.{layer}.ffn_gate_up_exps.weight"),
            &[2, 4, 4],
            &[0.0; 32],
        );
        g.tensor_f32(
            &format!("blk.{layer}.ffn_down_exps.weight"),
            &[2, 2, 4],
            &[0.0; 16],
        );
    }
    std::fs::write(path, g.to_bytes()).unwrap();
}

#[test]
fn a_fused_gate_up_model_moves_the_bytes_of_its_unfused_twin_and_bytes_capacities_match() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path());
    let run = dir.path().to_str().unwrap();
    let fused = dir.path().join("fused.gguf");
    write_fused_twin(&fused);
    let replay = |model: &std::path::Path| {
        let args = ReplayArgs {
            model: Some(model.to_path_buf()),
            policies: vec![Policy::Lru, Policy::Belady],
            capacity: capacities("2,96B,1KiB"),
            keep_map: vec!["none".into(), "frequency_K2".into()],
            ..ReplayArgs::for_run(run)
        };
        replay_run(&args).unwrap()
    };
    let plain = replay(&dir.path().join("model.gguf"));
    let twin = replay(&fused);
    assert_eq!(plain.rows, twin.rows);
    let row = |r: &ReplayReport, cap: &str, keep: &str| {
        r.row(
            Split::Fit,
            TraceKind::Prefill,
            Mode::Token,
            Policy::Lru,
            cap,
            keep,
        )
        .unwrap()
        .clone()
    };
    let lru = row(&twin, "2", "none");
    assert_eq!(lru.bytes_moved, Some(14 * 48));
    // Two experts of 48 bytes in each of the two layers.
    assert_eq!(lru.resident_bytes, Some(2 * 2 * 48));
    // 96 bytes hold the same two experts per layer: the same misses.
    let by_bytes = row(&twin, "96B", "none");
    assert_eq!((by_bytes.capacity, by_bytes.misses), (2.0, lru.misses));
    assert_eq!(by_bytes.resident_bytes, lru.resident_bytes);
    // 1 KiB holds every expert: 4 without a keep map, the 2 kept with one,
    // and the table says so in experts and bytes.
    assert_eq!(row(&twin, "1024B", "none").resident_bytes, Some(2 * 4 * 48));
    let kept = row(&twin, "1024B", "frequency_K2");
    assert_eq!(
        (kept.capacity, kept.resident_bytes),
        (2.0, Some(2 * 2 * 48))
    );
    assert!(
        twin.markdown
            .contains("| frequency_K2 | prefill | token | lru | 1024B | 2 experts, 0.00 MB |"),
        "{}",
        twin.markdown
    );
    let rates = super::replay::miss_rates(&twin);
    let line = super::replay::resident_line(&rates.figures[0]);
    assert!(
        line.contains("capacity 1024B: 4 experts per layer"),
        "{line}"
    );
    // A size in bytes smaller than one expert is refused, naming the size.
    let args = ReplayArgs {
        model: Some(fused.clone()),
        capacity: capacities("40B"),
        ..ReplayArgs::for_run(run)
    };
    let err = replay_run(&args).unwrap_err().to_string();
    assert!(err.contains("40B") && err.contains("48 bytes"), "{err}");
}
