//! Domain shares measured in tokens (and, for contrast, characters), checked
//! against the configured targets.

pub use runfiles::manifest::ShareRow;
use std::fmt::Write;

/// Builds the rows from per-domain (docs, chars, tokens) totals.
pub fn measure(
    names: &[String],
    targets: &[Option<f64>],
    totals: &[(u64, u64, u64)],
) -> Vec<ShareRow> {
    let chars: u64 = totals.iter().map(|t| t.1).sum();
    let tokens: u64 = totals.iter().map(|t| t.2).sum();
    let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    names
        .iter()
        .zip(targets)
        .zip(totals)
        .map(|((name, target), &(d, c, t))| ShareRow {
            domain: name.clone(),
            target: *target,
            docs: d,
            chars: c,
            tokens: t,
            char_share: share(c, chars),
            token_share: share(t, tokens),
        })
        .collect()
}

/// The share table as printed (and embedded in a share-miss error).
pub fn render(rows: &[ShareRow], tolerance: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<16} {:>7} {:>8} {:>10} {:>8} {:>8} {:>8}  status",
        "domain", "docs", "chars", "tokens", "char%", "token%", "target%"
    );
    for r in rows {
        let target = r
            .target
            .map_or("-".to_string(), |t| format!("{:.2}", 100.0 * t));
        let status = match r.target {
            None => "no target",
            Some(_) if r.within(tolerance) => "ok",
            Some(_) => "MISS",
        };
        let _ = writeln!(
            s,
            "{:<16} {:>7} {:>8} {:>10} {:>8.2} {:>8.2} {:>8}  {status}",
            r.domain,
            r.docs,
            r.chars,
            r.tokens,
            100.0 * r.char_share,
            100.0 * r.token_share,
            target
        );
    }
    let _ = write!(
        s,
        "tolerance: +/-{:.2} percentage points of token share",
        100.0 * tolerance
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_in_tokens_and_misses_are_marked() {
        let names = vec!["en".to_string(), "ja".to_string()];
        let rows = measure(
            &names,
            &[Some(0.5), Some(0.5)],
            &[(2, 100, 100), (2, 100, 300)],
        );
        assert_eq!(rows[0].char_share, 0.5);
        assert_eq!(rows[1].token_share, 0.75);
        assert!(!rows[1].within(0.2) && rows[1].within(0.25));
        let table = render(&rows, 0.05);
        assert!(
            table.lines().nth(2).unwrap().starts_with("ja") && table.contains("MISS"),
            "{table}"
        );
    }
}
