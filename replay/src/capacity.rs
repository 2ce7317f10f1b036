//! Per-layer cache capacities as the user gives them: a number of experts, a
//! fraction of a layer's (kept) experts, or bytes of expert weights (equal
//! memory whatever the keep map).

use serde::Serialize;
use std::fmt;

/// A per-layer capacity: a number of experts, or a fraction of the layer's
/// experts (the kept ones under a keep map).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Capacity {
    /// That many experts.
    Experts(usize),
    /// That fraction of the layer's experts, rounded, at least 1.
    Fraction(f64),
    /// As many experts as fit in that many bytes (per layer, from the
    /// model's expert sizes), at most the layer's experts.
    Bytes(u64),
}

impl Capacity {
    /// Parses `64` (experts), `0.25` or `25%` (fraction), `512MiB`, `2GB`
    /// or `4096B` (bytes per layer; K/M/G are powers of 1000, Ki/Mi/Gi of 1024).
    pub fn parse(s: &str) -> Result<Capacity, String> {
        let bad = || {
            format!("capacity {s:?} is neither a number of experts, a fraction in (0, 1] such as 0.25 or 25%, nor a size in bytes such as 512MiB")
        };
        if let Some(body) = s.trim().strip_suffix('B') {
            let units: [(&str, u64); 7] = [
                ("Ki", 1 << 10),
                ("Mi", 1 << 20),
                ("Gi", 1 << 30),
                ("K", 1_000),
                ("M", 1_000_000),
                ("G", 1_000_000_000),
                ("", 1),
            ];
            let (number, unit) = units
                .iter()
                .find_map(|(suffix, unit)| body.strip_suffix(suffix).map(|n| (n, *unit)))
                .ok_or_else(bad)?;
            let n: f64 = number.trim().parse().map_err(|_| bad())?;
            let bytes = (n * unit as f64).round();
            return (n.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64)
                .then_some(Capacity::Bytes(bytes as u64))
                .ok_or_else(bad);
        }
        if let Some(pct) = s.strip_suffix('%') {
            let f: f64 = pct.trim().parse().map_err(|_| bad())?;
            return Capacity::fraction(f / 100.0).ok_or_else(bad);
        }
        if s.contains('.') {
            let f: f64 = s.trim().parse().map_err(|_| bad())?;
            return Capacity::fraction(f).ok_or_else(bad);
        }
        s.trim().parse().map(Capacity::Experts).map_err(|_| bad())
    }

    fn fraction(f: f64) -> Option<Capacity> {
        (f > 0.0 && f <= 1.0).then_some(Capacity::Fraction(f))
    }

    /// Resident experts for a layer of `experts` experts of `expert_bytes`
    /// bytes each; `None` for a size in bytes without expert sizes or
    /// smaller than one expert.
    pub fn resolve(self, experts: usize, expert_bytes: Option<u64>) -> Option<usize> {
        match self {
            Capacity::Experts(c) => Some(c),
            Capacity::Fraction(f) => {
                Some(((f * experts as f64).round() as usize).clamp(1, experts.max(1)))
            }
            Capacity::Bytes(b) => {
                let fit = b / expert_bytes.filter(|&e| e > 0)?;
                (fit >= 1).then(|| (fit as usize).min(experts.max(1)))
            }
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capacity::Experts(c) => write!(f, "{c}"),
            Capacity::Fraction(x) => write!(f, "{x}"),
            Capacity::Bytes(b) => write!(f, "{b}B"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_bytes_parse_and_resolve_to_the_experts_they_hold() {
        assert_eq!(Capacity::parse("512MiB"), Ok(Capacity::Bytes(512 << 20)));
        assert_eq!(Capacity::parse("1.5GB"), Ok(Capacity::Bytes(1_500_000_000)));
        assert_eq!(Capacity::parse("96B"), Ok(Capacity::Bytes(96)));
        assert_eq!(Capacity::parse("8"), Ok(Capacity::Experts(8)));
        assert_eq!(Capacity::parse("25%"), Ok(Capacity::Fraction(0.25)));
        for bad in ["0B", "xMiB", "12TB", "-3KB"] {
            assert!(Capacity::parse(bad).is_err(), "{bad}");
        }
        let b = Capacity::Bytes(100);
        assert_eq!(b.resolve(8, Some(48)), Some(2));
        assert_eq!(b.resolve(1, Some(48)), Some(1));
        assert_eq!(b.resolve(8, Some(101)), None);
        assert_eq!(b.resolve(8, None), None);
        assert_eq!(Capacity::Fraction(0.5).resolve(6, None), Some(3));
        assert_eq!(b.to_string(), "100B");
    }
}
