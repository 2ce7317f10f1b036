//! Writing an evaluation's results (under `eval/`, or `ship/eval/` for
//! shipped files): the merged partial, the
//! summary as JSON and as a Parquet table (one row per candidate, split and
//! domain; domain `*` is the whole split; each figure with its 95% interval's
//! ends, `_lo` and `_hi`). `summary.json` is removed first
//! and written last: its presence marks the set complete.

use super::EvalRunError;
use arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use numbers::eval::{EvalPartial, EvalSummary, Figures, GenerateJob};
use runfiles::corpus::CorpusIndex;
use runfiles::layout::EvalLayout;
use runfiles::store::RunStore;
use std::sync::Arc;

/// Writes the merged partial, the Parquet table and the summary where
/// `out` says (`eval/merged.bin`, `eval/summary.parquet`,
/// `eval/summary.json` for `coordinator eval`); the summary carries the
/// candidates' sizes, what `choice`'s KL budget picks and the domains the
/// generation job `generate` has no prompt for.
pub async fn write(
    store: &RunStore,
    out: &EvalLayout,
    merged: &EvalPartial,
    index: &CorpusIndex,
    choice: &super::Choice,
    generate: &GenerateJob,
) -> Result<EvalSummary, EvalRunError> {
    let summary = EvalSummary::of_run(merged, &index.domains, &index.eval_sets)
        .with_unprompted(generate)
        .with_sizes(&choice.sizes)
        .with_budget(choice.kl_budget, choice.budget_scope);
    if store.get_opt(out.summary_json).await?.is_some() {
        store.delete(out.summary_json).await?;
    }
    store.put(out.merged, merged.to_bytes()).await?;
    let table = parquet_table(&summary)
        .map_err(|e| EvalRunError::Setup(format!("encoding {}: {e}", out.summary_parquet)))?;
    store.put(out.summary_parquet, table).await?;
    runfiles::eval_summary::write(store, out, &summary).await?;
    Ok(summary)
}

/// Reads one float column's value from a row's figures.
type Field64 = dyn Fn(&Figures) -> f64;

/// The figures as a Parquet table.
pub fn parquet_table(s: &EvalSummary) -> Result<Vec<u8>, String> {
    let mut rows: Vec<(&str, &str, u32, &str, &str, &Figures)> = Vec::new();
    for c in &s.candidates {
        for (split, f) in &c.splits {
            rows.push((&c.name, &c.method, c.k, split.as_str(), "*", &f.all));
            for (d, fd) in &f.domains {
                rows.push((&c.name, &c.method, c.k, split.as_str(), d, fd));
            }
        }
    }
    let text = |i: usize| -> ArrayRef {
        Arc::new(StringArray::from(
            rows.iter()
                .map(|r| [r.0, r.1, r.3, r.4][i])
                .collect::<Vec<_>>(),
        ))
    };
    let float = |f: &dyn Fn(&Figures) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from(
            rows.iter().map(|r| f(r.5)).collect::<Vec<_>>(),
        ))
    };
    let floats: [(&str, &Field64); 34] = [
        ("kl_mean", &|f| f.kl.mean),
        ("kl_se", &|f| f.kl.se),
        ("kl_lo", &|f| f.kl.lo),
        ("kl_hi", &|f| f.kl.hi),
        ("kl_se_positions", &|f| f.kl.se_positions),
        ("kl_max", &|f| f.kl.max),
        ("kl_p999", &|f| f.kl.p999),
        ("kl_p99", &|f| f.kl.p99),
        ("kl_p95", &|f| f.kl.p95),
        ("kl_p90", &|f| f.kl.p90),
        ("kl_p50", &|f| f.kl.p50),
        ("kl_p10", &|f| f.kl.p10),
        ("kl_p5", &|f| f.kl.p5),
        ("kl_p1", &|f| f.kl.p1),
        ("kl_p01", &|f| f.kl.p01),
        ("kl_min", &|f| f.kl.min),
        ("top1_same", &|f| f.top1_same),
        ("top1_same_lo", &|f| f.top1_same_ci.lo),
        ("top1_same_hi", &|f| f.top1_same_ci.hi),
        ("ppl_base", &|f| f.ppl_base),
        ("ppl_base_lo", &|f| f.ppl_base_ci.lo),
        ("ppl_base_hi", &|f| f.ppl_base_ci.hi),
        ("ppl_candidate", &|f| f.ppl_candidate),
        ("ppl_candidate_lo", &|f| f.ppl_candidate_ci.lo),
        ("ppl_candidate_hi", &|f| f.ppl_candidate_ci.hi),
        ("ppl_ratio", &|f| f.ppl_ratio),
        ("ppl_ratio_lo", &|f| f.ppl_ratio_ci.lo),
        ("ppl_ratio_hi", &|f| f.ppl_ratio_ci.hi),
        ("dprob_mean", &|f| f.dprob_mean),
        ("dprob_mean_lo", &|f| f.dprob_mean_ci.lo),
        ("dprob_mean_hi", &|f| f.dprob_mean_ci.hi),
        ("dprob_rms", &|f| f.dprob_rms),
        ("dprob_rms_lo", &|f| f.dprob_rms_ci.lo),
        ("dprob_rms_hi", &|f| f.dprob_rms_ci.hi),
    ];
    let mut fields = vec![
        Field::new("candidate", DataType::Utf8, false),
        Field::new("method", DataType::Utf8, false),
        Field::new("k", DataType::UInt32, false),
        Field::new("split", DataType::Utf8, false),
        Field::new("domain", DataType::Utf8, false),
        Field::new("n", DataType::UInt64, false),
    ];
    let mut arrays: Vec<ArrayRef> = vec![
        text(0),
        text(1),
        Arc::new(UInt32Array::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )),
        text(2),
        text(3),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.5.n).collect::<Vec<_>>(),
        )),
    ];
    for (name, f) in floats {
        fields.push(Field::new(name, DataType::Float64, false));
        arrays.push(float(f));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema, arrays).map_err(|e| e.to_string())?;
    runfiles::parquet_out::parquet_bytes(&batch)
}
