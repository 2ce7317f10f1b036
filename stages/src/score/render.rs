//! The score tables as Markdown (for people and the report) and Parquet.

use super::ScoreReport;
use crate::StagesError;
use arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{Field, Schema};
use std::fmt::Write;
use std::sync::Arc;

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// A short per-(method, K) summary for the terminal.
pub fn summary(r: &ScoreReport) -> String {
    let mut out = format!(
        "scored saliency {} ({})\n",
        &r.saliency_sha256[..12.min(r.saliency_sha256.len())],
        r.params.source.label()
    );
    for t in &r.tables {
        let _ = writeln!(
            out,
            "{:<12} K={:<4} slot replacement mean {} worst {} (layer {}), dead kept {}, kept <100 hits {}",
            t.method,
            t.k,
            pct(t.slot_replacement_mean),
            pct(t.slot_replacement_worst),
            t.worst_layer,
            t.dead_kept,
            t.kept_under_100
        );
    }
    let _ = writeln!(out, "keep maps: {}", r.keep_maps.join(", "));
    if let Some(note) = &r.routing_note {
        let _ = writeln!(out, "{note}");
    }
    out
}

/// All tables as Markdown, sections at level `###`.
pub fn markdown(r: &ScoreReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Scored on `{}` with prior `{:?}` (m={}, z={}, c_min={}, allow_dead={}); saliency.json SHA-256 `{}`.\n",
        r.params.source.label(),
        r.params.prior,
        r.params.m,
        r.params.z,
        r.params.c_min,
        r.params.allow_dead,
        r.saliency_sha256
    );
    if let Some(note) = &r.routing_note {
        let _ = writeln!(o, "Keep maps follow the model's {note}.\n");
    }
    if r.params.guard_super_experts {
        let kept: Vec<String> = r
            .super_experts
            .iter()
            .map(|(layer, ids)| format!("layer {layer}: {ids:?}"))
            .collect();
        let _ = writeln!(
            o,
            "Super experts kept first in every map ({} found in the first 75% of MoE layers: {} (`{}`) above the 99.5th percentile of all experts' and a tenth of the largest): {}.\n",
            r.super_experts.values().map(Vec::len).sum::<usize>(),
            r.params.super_expert_statistic.describe(),
            r.params.super_expert_statistic.field(),
            if kept.is_empty() { "none".to_string() } else { kept.join("; ") }
        );
    }
    o.push_str("### Whole model\n\n| method | K | slot replacement (mean) | worst layer | slot replacement (worst) | dead kept | kept < 100 hits |\n|---|---|---|---|---|---|---|\n");
    for t in &r.tables {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.method,
            t.k,
            pct(t.slot_replacement_mean),
            t.worst_layer,
            pct(t.slot_replacement_worst),
            t.dead_kept,
            t.kept_under_100
        );
    }
    for t in &r.tables {
        let _ = writeln!(
            o,
            "\n### {} K={}\n\n| layer | count kept | reap_l2_sum kept | smallest kept count | dead kept | kept < 100 hits | slot replacement |\n|---|---|---|---|---|---|---|",
            t.method, t.k
        );
        for row in &t.rows {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.layer,
                pct(row.count_share_kept),
                pct(row.reap_share_kept),
                row.min_kept_count,
                row.dead_kept,
                row.kept_under_100,
                pct(row.slot_replacement)
            );
        }
    }
    if !r.overlaps.is_empty() {
        o.push_str("\n### Overlap between methods (shared kept experts / K)\n\n| K | a | b | mean | min | min layer |\n|---|---|---|---|---|---|\n");
        for x in &r.overlaps {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} |",
                x.k,
                x.a,
                x.b,
                pct(x.mean_shared),
                pct(x.min_shared),
                x.min_layer
            );
        }
    }
    o.push_str("\n### Prior: count-weighted layer mean vs median expert mean\n\n| layer | count-weighted mean | median expert mean | live experts below weighted mean | live | dead |\n|---|---|---|---|---|---|\n");
    for p in &r.priors {
        let _ = writeln!(
            o,
            "| {} | {:.6} | {:.6} | {} | {} | {} |",
            p.layer,
            p.count_weighted_mean,
            p.median_expert_mean,
            p.live_below_weighted,
            p.live,
            p.dead
        );
    }
    o.push_str("\n### Substitution screen\n\n");
    if let Some(note) = &r.screen_note {
        let verb = if r.screen.is_empty() {
            "Not run"
        } else {
            "Note"
        };
        let _ = writeln!(o, "{verb}: {note}.\n");
    }
    if !r.screen.is_empty() {
        o.push_str("Mass lost: router probability of pruned selected experts per row (a share of the router mass under softmax gating, a sum of independent probabilities under sigmoid). Weight share lost: the pruned experts' share of the row's gate weight, comparable across gating functions.\n\n");
        o.push_str("| method | K | split | rows | rows changed | mean mass lost | max mass lost | weight share lost | substitutes | mean substitute rank | rank k+1 / <=2k / <=4k / beyond | forced misses |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for s in &r.screen {
            let b = s.substitute_rank_buckets;
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {:.4} | {:.4} | {} | {} | {:.2} | {} / {} / {} / {} | {} |",
                s.method,
                s.k,
                s.split,
                s.rows,
                pct(s.rows_changed_share),
                s.mean_mass_lost,
                s.max_mass_lost,
                pct(s.mean_weight_share_lost),
                s.substitutes,
                s.mean_substitute_rank,
                b[0],
                b[1],
                b[2],
                b[3],
                s.forced_misses
            );
        }
    }
    if !r.domain_floor.is_empty() {
        o.push_str(concat!(
            "\n### The worst-served domain\n\n",
            "Each keep map's smallest retained share of a domain's routed REAP mass ",
            "(`reap_l2_sum`), over layers and the domains with mass in the layer; ",
            "`worst_domain` maximises it per layer (a greedy ranking, the best of every ",
            "method's map of that K, then single swaps: at least every other method's, ",
            "not proven optimal), and its bound is an upper bound on the best any map of ",
            "that K reaches (mean over layers).\n\n",
            "| method | K | smallest share | mean over layers | worst domain (block) | bound |\n",
            "|---|---|---|---|---|---|\n",
        ));
        for f in &r.domain_floor {
            let bound = f
                .bound_mean
                .map_or_else(|| "".into(), |b| format!("{:.4}", b));
            let _ = writeln!(
                o,
                "| {} | {} | {:.4} | {:.4} | {} ({}) | {} |",
                f.method, f.k, f.min_share, f.mean_min_share, f.worst_domain, f.worst_layer, bound
            );
        }
    }
    o.push_str(
        "\n### Keep-map stability (bootstrap over clusters of chunks sharing a fit group)\n\n",
    );
    if let (Some(note), true) = (&r.stability_note, r.stability.is_empty()) {
        let _ = writeln!(o, "Not run: {note}.");
    } else {
        if let Some(note) = &r.stability_note {
            let _ = writeln!(o, "Note: {note}.\n");
        }
        o.push_str(
            "| method | K | resamples | clusters | mean Jaccard | min Jaccard |\n|---|---|---|---|---|---|\n",
        );
        for s in &r.stability {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {:.4} | {:.4} |",
                s.method, s.k, s.resamples, s.clusters, s.mean_jaccard, s.min_jaccard
            );
        }
    }
    o
}

/// Per-layer rows of every (method, K) as one Parquet table.
pub fn parquet(r: &ScoreReport) -> Result<Vec<u8>, StagesError> {
    let rows: Vec<(&str, u32, &super::tables::LayerRow)> = r
        .tables
        .iter()
        .flat_map(|t| t.rows.iter().map(move |row| (t.method.as_str(), t.k, row)))
        .collect();
    let f = |g: fn(&super::tables::LayerRow) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|x| g(x.2))))
    };
    let u = |g: fn(&super::tables::LayerRow) -> u32| -> ArrayRef {
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|x| g(x.2))))
    };
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "method",
            Arc::new(StringArray::from_iter_values(rows.iter().map(|x| x.0))),
        ),
        (
            "k",
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|x| x.1))),
        ),
        ("layer", u(|r| r.layer)),
        ("count_share_kept", f(|r| r.count_share_kept)),
        ("reap_share_kept", f(|r| r.reap_share_kept)),
        ("min_kept_count", f(|r| r.min_kept_count)),
        ("dead_kept", u(|r| r.dead_kept)),
        ("kept_under_100", u(|r| r.kept_under_100)),
        ("slot_replacement", f(|r| r.slot_replacement)),
    ];
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let encode = |source: Box<dyn std::error::Error + Send + Sync>| StagesError::Encode {
        what: runfiles::layout::score::TABLES_PARQUET.to_string(),
        source,
    };
    let batch = RecordBatch::try_new(schema, columns.into_iter().map(|c| c.1).collect())
        .map_err(|e| encode(e.into()))?;
    runfiles::parquet_out::parquet_bytes(&batch).map_err(|e| encode(e.into()))
}
