//! The importance-matrix invariants, on the run's `imatrix.gguf` (what
//! `llama-quantize` reads) against `saliency.json` and, when the run's
//! model file is readable here, the model's weights
//! ([`gguf::model_weights`]):
//!
//! - entries: each has its `in_sum2`, `in_sum` and `counts`, a name
//!   llama.cpp can read, is a weight of the model, and the router and
//!   stacked expert weights of every MoE layer are there;
//! - shapes: `in_sum2` and `in_sum` `[n_in, n_mat]`, `counts` `[1, n_mat]`,
//!   `[n_in, n_mat]` the model's;
//! - counts: a stacked expert weight's count per expert is the fit split's
//!   `count` of its layer (a token counts once per selected expert), every
//!   other weight's count per matrix is the fit split's tokens;
//! - values: every value finite, `in_sum2 <= count * MAX_ACTIVATION^2`, and
//!   Cauchy-Schwarz per column, `in_sum^2 <= count * in_sum2` (the f32
//!   rounding of the file aside).

use super::{names, Check};
use gguf::model_weights::{expert_stack_layer, ModelWeights, MAX_ENTRY_NAME};
use gguf::read::{GgufHeader, GgufReader};
use numbers::partial_check::MAX_ACTIVATION;
use numbers::peer_text::peer_text;
use numbers::saliency::Saliency;
use numbers::Split;
use std::collections::BTreeMap;

/// Relative slack of the Cauchy-Schwarz check: the file's sums are f32
/// roundings (relative error 2^-24 each) of exact sums.
const F32_RTOL: f64 = 1e-6;

/// One entry of the file, read.
struct Entry {
    shape: (u64, u64),
    counts: Vec<f32>,
    in_sum2: Vec<f32>,
    in_sum: Vec<f32>,
}

/// The four importance-matrix checks of a run whose `imatrix.gguf` holds
/// `bytes` (`None`: the run has none), read as `url`; `weights` are the
/// model's entries when its file could be read (`model_note` says why not).
pub fn check_imatrix(
    bytes: Option<&[u8]>,
    url: &str,
    s: &Saliency,
    weights: Option<&ModelWeights>,
    model_note: &str,
) -> Vec<Check> {
    let all = [
        names::IMATRIX_ENTRIES,
        names::IMATRIX_SHAPES,
        names::IMATRIX_COUNTS,
        names::IMATRIX_VALUES,
    ];
    let Some(bytes) = bytes else {
        return all
            .map(|n| Check::info(n, "no imatrix.gguf in the run".into()))
            .into();
    };
    let entries = match read_entries(bytes, url) {
        Ok(e) => e,
        Err(why) => return all.map(|n| Check::fail(n, why.clone())).into(),
    };
    vec![
        entries_check(&entries, s, weights, model_note),
        shapes_check(&entries, weights),
        counts_check(&entries, s),
        values_check(&entries),
    ]
}

/// The file's entries by name; a tensor of another kind, or an entry
/// lacking one of its three tensors, is an error naming it.
fn read_entries(bytes: &[u8], url: &str) -> Result<BTreeMap<String, Entry>, String> {
    let mut r = GgufReader::new(std::io::Cursor::new(bytes), url).map_err(|e| e.to_string())?;
    let header: GgufHeader = r.header.clone();
    let mut names: Vec<&str> = Vec::new();
    for t in &header.tensors {
        let base = [".in_sum2", ".in_sum", ".counts"]
            .iter()
            .find_map(|suffix| t.name.strip_suffix(suffix))
            .ok_or_else(|| format!("{url}: tensor {:?} is no importance-matrix sum", t.name))?;
        if !names.contains(&base) {
            names.push(base);
        }
    }
    let mut out = BTreeMap::new();
    for name in names {
        let mut f32s = |suffix: &str| -> Result<(Vec<u64>, Vec<f32>), String> {
            let t = format!("{name}{suffix}");
            let dims = header
                .tensor(&t)
                .map(|t| t.dims.clone())
                .ok_or_else(|| format!("{url}: entry {name:?} has no {suffix} tensor"))?;
            let data = r.tensor_bytes(&t).map_err(|e| e.to_string())?;
            let values = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Ok((dims, values))
        };
        let (dims2, in_sum2) = f32s(".in_sum2")?;
        let (dims1, in_sum) = f32s(".in_sum")?;
        let (dimsc, counts) = f32s(".counts")?;
        let shape = match dims2.as_slice() {
            [n_in, n_mat] => (*n_in, *n_mat),
            _ => (0, 0),
        };
        let consistent = dims1 == dims2
            && dimsc == [1, shape.1]
            && in_sum2.len() as u64 == shape.0 * shape.1
            && in_sum.len() == in_sum2.len()
            && counts.len() as u64 == shape.1;
        let shape = if consistent { shape } else { (0, 0) };
        out.insert(
            name.to_string(),
            Entry {
                shape,
                counts,
                in_sum2,
                in_sum,
            },
        );
    }
    Ok(out)
}

/// The first few of `bad`, and how many there are, for a figure.
fn listed(bad: &[String]) -> String {
    numbers::peer_text::summarise(bad)
}

fn entries_check(
    entries: &BTreeMap<String, Entry>,
    s: &Saliency,
    weights: Option<&ModelWeights>,
    model_note: &str,
) -> Check {
    let mut bad: Vec<String> = entries
        .keys()
        .filter(|n| n.len() > MAX_ENTRY_NAME)
        .map(|n| format!("\"{}\" (over {MAX_ENTRY_NAME} characters)", peer_text(n)))
        .collect();
    let Some(w) = weights else {
        let figure = format!("{} entries; {model_note}", entries.len());
        return if bad.is_empty() {
            Check::warn(names::IMATRIX_ENTRIES, figure)
        } else {
            Check::fail(
                names::IMATRIX_ENTRIES,
                format!("{figure}: {}", listed(&bad)),
            )
        };
    };
    bad.extend(
        entries
            .keys()
            .filter(|n| w.shape(n).is_none())
            .map(|n| format!("\"{}\" (not a weight of the model)", peer_text(n))),
    );
    let layers: Vec<u32> = s
        .split(Split::Fit)
        .or_else(|| s.split(Split::Heldout))
        .map(|x| x.layers.iter().map(|l| l.layer).collect())
        .unwrap_or_default();
    let required = w.required(&layers);
    bad.extend(
        required
            .iter()
            .filter(|n| !entries.contains_key(*n))
            .map(|n| format!("{n} (missing)")),
    );
    let figure = format!(
        "{} entries, all weights of the model; {} router and expert weights of {} MoE layers present",
        entries.len(),
        required.len(),
        layers.len()
    );
    if bad.is_empty() {
        Check::pass(names::IMATRIX_ENTRIES, figure)
    } else {
        Check::fail(
            names::IMATRIX_ENTRIES,
            format!("{} bad: {}", bad.len(), listed(&bad)),
        )
    }
}

fn shapes_check(entries: &BTreeMap<String, Entry>, weights: Option<&ModelWeights>) -> Check {
    let mut bad = Vec::new();
    for (name, e) in entries {
        if e.shape == (0, 0) {
            bad.push(format!(
                "{} (in_sum2, in_sum and counts disagree)",
                peer_text(name)
            ));
            continue;
        }
        if let Some(want) = weights.and_then(|w| w.shape(name)) {
            let want = (u64::from(want.n_in), u64::from(want.n_mat));
            if want != e.shape {
                bad.push(format!(
                    "{} [{}, {}], the model's [{}, {}]",
                    peer_text(name),
                    e.shape.0,
                    e.shape.1,
                    want.0,
                    want.1
                ));
            }
        }
    }
    let against = if weights.is_some() {
        ", each the model's"
    } else {
        ""
    };
    if bad.is_empty() {
        Check::pass(
            names::IMATRIX_SHAPES,
            format!(
                "{} entries: [n_in, n_mat] sums and [1, n_mat] counts{against}",
                entries.len()
            ),
        )
    } else {
        Check::fail(
            names::IMATRIX_SHAPES,
            format!("{} bad: {}", bad.len(), listed(&bad)),
        )
    }
}

fn counts_check(entries: &BTreeMap<String, Entry>, s: &Saliency) -> Check {
    let Some(fit) = s.split(Split::Fit) else {
        return Check::info(
            names::IMATRIX_COUNTS,
            "no fit split in saliency.json: nothing to count against".into(),
        );
    };
    let mut bad = Vec::new();
    let (mut dense, mut stacked) = (0, 0);
    for (name, e) in entries {
        let routed = expert_stack_layer(name)
            .and_then(|l| fit.layers.iter().find(|x| x.layer == l))
            .filter(|l| l.count.len() as u64 == e.shape.1);
        let expected: Vec<u64> = match routed {
            Some(l) => {
                stacked += 1;
                l.count.clone()
            }
            None => {
                dense += 1;
                vec![fit.n_tokens; e.counts.len()]
            }
        };
        let off = e
            .counts
            .iter()
            .zip(&expected)
            .position(|(&got, &want)| got != want as f32);
        if let Some(m) = off {
            bad.push(format!(
                "{} matrix {m}: {} (expected {})",
                peer_text(name),
                e.counts[m],
                expected[m]
            ));
        }
    }
    let figure = format!(
        "{dense} weights count the {} fit tokens, {stacked} expert stacks the tokens routed to each expert",
        fit.n_tokens
    );
    if bad.is_empty() {
        Check::pass(names::IMATRIX_COUNTS, figure)
    } else {
        Check::fail(
            names::IMATRIX_COUNTS,
            format!("{} bad: {}", bad.len(), listed(&bad)),
        )
    }
}

fn values_check(entries: &BTreeMap<String, Entry>) -> Check {
    let square_limit = (MAX_ACTIVATION * MAX_ACTIVATION) as f64;
    let mut bad = Vec::new();
    let mut largest_ratio = 0f64;
    let mut columns = 0u64;
    for (name, e) in entries {
        let n_in = e.shape.0.max(1) as usize;
        for (i, (&sq, &sum)) in e.in_sum2.iter().zip(&e.in_sum).enumerate() {
            let count = f64::from(e.counts.get(i / n_in).copied().unwrap_or(0.0));
            let (sq, sum) = (f64::from(sq), f64::from(sum));
            columns += 1;
            let at = || {
                format!(
                    "{} matrix {} column {}",
                    peer_text(name),
                    i / n_in,
                    i % n_in
                )
            };
            if !(sq.is_finite() && sum.is_finite() && count.is_finite()) {
                bad.push(format!("{}: not finite", at()));
                continue;
            }
            if sq < 0.0 || sq > count * square_limit * (1.0 + F32_RTOL) {
                bad.push(format!("{}: in_sum2 {sq} over {count} rows", at()));
                continue;
            }
            // How far in_sum^2 lies below count * in_sum2, relative to it
            // (0: equality, every input of the column alike; < 0: impossible).
            let bound = count * sq;
            let margin = if bound > 0.0 {
                1.0 - sum * sum / bound
            } else if sum == 0.0 {
                1.0
            } else {
                f64::NEG_INFINITY
            };
            if margin < -4.0 * F32_RTOL {
                bad.push(format!(
                    "{}: in_sum^2 = {} above count x in_sum2 = {bound}",
                    at(),
                    sum * sum
                ));
            }
            largest_ratio = largest_ratio.max(1.0 - margin);
        }
    }
    if bad.is_empty() {
        Check::pass(
            names::IMATRIX_VALUES,
            format!(
                "{columns} columns finite, in_sum2 <= count x {square_limit}, largest in_sum^2 / (count x in_sum2) {largest_ratio:.6}"
            ),
        )
    } else {
        Check::fail(
            names::IMATRIX_VALUES,
            format!("{} bad: {}", bad.len(), listed(&bad)),
        )
    }
}
