//! Comparing two partials of the same chunks computed by different workers
//! (redundant leases, DESIGN section 8): bitwise when both ran on the same
//! backends, otherwise token counts, expert counts and imatrix counts exact
//! and every sum within a relative tolerance (mixed GPU types may differ in
//! the last bits of a chunk's values, never in what was routed where).

use crate::exact::ExactSum;
use crate::partial::Partial;
use crate::stats::SUM_NAMES;

/// Relative tolerance of sums between partials from different backends.
pub const MIXED_BACKEND_TOLERANCE: f64 = 1e-3;

/// Checks that `b` agrees with `a`; the error names the first difference.
pub fn agree(a: &Partial, b: &Partial) -> Result<(), String> {
    let bitwise = a.backends == b.backends;
    if bitwise && a == b {
        return Ok(());
    }
    same(&a.chunks, &b.chunks, "chunks")?;
    same(&a.model_sha256, &b.model_sha256, "model")?;
    same(&a.corpus_sha256, &b.corpus_sha256, "corpus")?;
    same(&a.experts.shape, &b.experts.shape, "MoE shape")?;
    let keys_a: Vec<_> = a.experts.groups.keys().collect();
    let keys_b: Vec<_> = b.experts.groups.keys().collect();
    same(&keys_a, &keys_b, "(split, domain) groups")?;
    let tolerance = if bitwise {
        0.0
    } else {
        MIXED_BACKEND_TOLERANCE
    };
    for (key, ga) in &a.experts.groups {
        let gb = &b.experts.groups[key];
        let at = format!("{}/{}", key.split, crate::peer_text::peer_text(&key.domain));
        same(&ga.n_tokens, &gb.n_tokens, &format!("{at} tokens"))?;
        same(&ga.layers.len(), &gb.layers.len(), &format!("{at} layers"))?;
        for (la, lb) in ga.layers.iter().zip(&gb.layers) {
            let at = format!("{at} layer {}", la.layer);
            same(&la.count, &lb.count, &format!("{at} count"))?;
            for ((name, xa), xb) in SUM_NAMES.iter().zip(la.sums()).zip(lb.sums()) {
                close(xa, xb, tolerance, &[], &format!("{at} {name}"))?;
            }
            let exact = |v: &[f64]| -> Vec<ExactSum> {
                v.iter()
                    .map(|&x| ExactSum::from_f64(x).unwrap_or_default())
                    .collect()
            };
            for (name, va, vb) in [
                ("ean_max", &la.ean_max, &lb.ean_max),
                ("act_max", &la.act_max, &lb.act_max),
            ] {
                close(
                    &exact(va),
                    &exact(vb),
                    tolerance,
                    &[],
                    &format!("{at} {name}"),
                )?;
            }
        }
    }
    let names_a: Vec<_> = a.imatrix.entries.keys().collect();
    let names_b: Vec<_> = b.imatrix.entries.keys().collect();
    same(&names_a, &names_b, "imatrix tensors")?;
    for (name, ea) in &a.imatrix.entries {
        let eb = &b.imatrix.entries[name];
        same(&ea.counts, &eb.counts, &format!("imatrix {name} counts"))?;
        close(
            &ea.in_sum2,
            &eb.in_sum2,
            tolerance,
            &[],
            &format!("imatrix {name}"),
        )?;
        close(
            &ea.in_sum,
            &eb.in_sum,
            tolerance,
            &ea.in_sum_scale(),
            &format!("imatrix {name} in_sum"),
        )?;
    }
    same(&a.nonfinite_drops, &b.nonfinite_drops, "non-finite drops")?;
    same(&a.trace_rows, &b.trace_rows, "trace rows")?;
    if bitwise {
        // Everything compared above agrees; what is left is bitwise.
        return Err("the partials differ in their remaining fields".into());
    }
    Ok(())
}

fn same<T: PartialEq + std::fmt::Debug>(a: &T, b: &T, what: &str) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what} differ"))
    }
}

/// Sums agree when `|a - b| <= tolerance * max(|a|, |b|, scale)` (exactly
/// equal when the tolerance is 0), `scale` per value where given (signed sums
/// that cancel are compared against the magnitude of their terms).
fn close(
    a: &[ExactSum],
    b: &[ExactSum],
    tolerance: f64,
    scale: &[f64],
    what: &str,
) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{what}: {} vs {} values", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x == y {
            continue;
        }
        let (x, y) = (x.to_f64(), y.to_f64());
        let floor = scale.get(i).copied().unwrap_or(0.0);
        if tolerance == 0.0 || (x - y).abs() > tolerance * x.abs().max(y.abs()).max(floor) {
            return Err(format!("{what}[{i}]: {x} vs {y}"));
        }
    }
    Ok(())
}
