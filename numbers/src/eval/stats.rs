//! Uncertainty of eval figures by clusters of the unit of sampling, and
//! llama-perplexity's percentiles.
//!
//! The held-out split takes whole document groups (`corpus/src/heldout.rs`),
//! and one group's documents share a source, a style and often a topic; a
//! document may run on into the next chunk. Positions of one group are
//! therefore correlated, and groups, not chunks or positions, are the
//! independent units: every interval clusters by the corpus group of the
//! position's span (a document where the corpus has no group key). A
//! figure that is a ratio of sums over positions, `m = sum_g S_g / sum_g
//! n_g` over clusters `g`, gets the cluster-robust (sandwich, CR1) standard
//! error of a mean,
//!
//! `se^2 = G / (G - 1) * sum_g (S_g - m n_g)^2 / N^2`,
//!
//! and a 95% interval `m ± t(0.975, G - 1) se` (Student's t with G - 1
//! degrees of freedom). Below two clusters the uncertainty is unknown: the
//! interval is "n/a" (NaN ends, `null` in JSON), never `[m, m]`.

use serde::{Deserialize, Deserializer, Serialize};

/// A figure's standard error and 95% interval over `clusters` clusters.
/// With fewer than two clusters the uncertainty is unknown: `se`, `lo`
/// and `hi` are NaN (`null` in JSON) and [`Interval::known`] is false.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Interval {
    /// Standard error (cluster-robust); NaN when unknown.
    #[serde(deserialize_with = "nan_if_null")]
    pub se: f64,
    /// Lower end of the 95% interval; NaN when unknown.
    #[serde(deserialize_with = "nan_if_null")]
    pub lo: f64,
    /// Upper end of the 95% interval; NaN when unknown.
    #[serde(deserialize_with = "nan_if_null")]
    pub hi: f64,
    /// Clusters with positions (held-out groups, or documents): the
    /// interval has `clusters - 1` degrees of freedom.
    #[serde(default)]
    pub clusters: u64,
}

impl Default for Interval {
    fn default() -> Interval {
        Interval::unknown(0)
    }
}

/// Equal when every field is, NaN (unknown) equal to NaN.
impl PartialEq for Interval {
    fn eq(&self, o: &Interval) -> bool {
        same(self.se, o.se)
            && same(self.lo, o.lo)
            && same(self.hi, o.hi)
            && self.clusters == o.clusters
    }
}

/// Equal, or both NaN: how figures whose unknown ends are NaN compare.
pub fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Reads a float that JSON stores as `null` when it is NaN (serde_json
/// writes non-finite floats as `null`).
pub fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl Interval {
    /// An interval of unknown width over `clusters` (fewer than two) clusters.
    pub fn unknown(clusters: u64) -> Interval {
        Interval {
            se: f64::NAN,
            lo: f64::NAN,
            hi: f64::NAN,
            clusters,
        }
    }

    /// The symmetric interval `value ± t se` over `clusters` clusters;
    /// unknown below two.
    pub fn around(value: f64, se: f64, clusters: u64) -> Interval {
        if clusters < 2 {
            return Interval::unknown(clusters);
        }
        let half = t975((clusters - 1) as usize) * se;
        Interval {
            se,
            lo: value - half,
            hi: value + half,
            clusters,
        }
    }

    /// Whether the interval is known (two clusters or more).
    pub fn known(&self) -> bool {
        self.clusters >= 2 && !self.lo.is_nan() && !self.hi.is_nan()
    }

    /// The interval mapped through an increasing function (`exp` for a
    /// perplexity from its log), its standard error by the delta method
    /// (`derivative` at the value); an unknown one stays unknown.
    pub fn map(&self, f: impl Fn(f64) -> f64, derivative: f64) -> Interval {
        if !self.known() {
            return Interval::unknown(self.clusters);
        }
        Interval {
            se: self.se * derivative.abs(),
            lo: f(self.lo),
            hi: f(self.hi),
            clusters: self.clusters,
        }
    }
}

/// A cluster's count and sum: `(n_g, S_g)`.
pub type Cluster = (u64, f64);

/// The clusters of `items`, `(cluster id, n, S)` summed by id (ids of any
/// ordered type: a group index, a document, a chunk).
pub fn clusters_by<K: Ord>(items: impl IntoIterator<Item = (K, u64, f64)>) -> Vec<Cluster> {
    let mut by: std::collections::BTreeMap<K, Cluster> = std::collections::BTreeMap::new();
    for (k, n, s) in items {
        let c = by.entry(k).or_default();
        c.0 += n;
        c.1 += s;
    }
    by.into_values().collect()
}

/// The mean `sum S_g / sum n_g` of `clusters` with its cluster-robust
/// standard error (NaN below two clusters; 0 and NaN without positions).
pub fn mean_se(clusters: &[Cluster]) -> (f64, f64) {
    let n: u64 = clusters.iter().map(|c| c.0).sum();
    if n == 0 {
        return (0.0, f64::NAN);
    }
    let total = n as f64;
    let mean = clusters.iter().map(|c| c.1).sum::<f64>() / total;
    let g = clusters.iter().filter(|c| c.0 > 0).count();
    if g < 2 {
        return (mean, f64::NAN);
    }
    let ss: f64 = clusters
        .iter()
        .map(|&(ng, s)| (s - mean * ng as f64).powi(2))
        .sum();
    let g = g as f64;
    let var = g / (g - 1.0) * ss / (total * total);
    (mean, var.max(0.0).sqrt())
}

/// The mean of `clusters` with its 95% interval over them.
pub fn estimate(clusters: &[Cluster]) -> (f64, Interval) {
    let (mean, se) = mean_se(clusters);
    let g = clusters.iter().filter(|c| c.0 > 0).count() as u64;
    (mean, Interval::around(mean, se, g))
}

/// Two-sided 95% quantile of Student's t with `df` degrees of freedom:
/// tabulated to 30, then the Cornish-Fisher expansion (error below 1e-5).
pub fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010,
        2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739,
        2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
    ];
    if df == 0 {
        return f64::INFINITY;
    }
    if df <= TABLE.len() {
        return TABLE[df - 1];
    }
    let (z, v) = (1.959_963_984_540_054_f64, df as f64);
    z + (z.powi(3) + z) / (4.0 * v)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v)
        + (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / (384.0 * v.powi(3))
}

/// llama-perplexity's percentile of sorted values: linear interpolation
/// at rank `q (n - 1)`, so the median of an even count is the mean of the
/// two middle values; 0 for no values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return 0.0;
    };
    if q <= 0.0 {
        return first;
    }
    if q >= 1.0 {
        return last;
    }
    let at = q * (sorted.len() - 1) as f64;
    let i = at.floor() as usize;
    let frac = at - i as f64;
    let next = sorted[(i + 1).min(sorted.len() - 1)];
    (1.0 - frac) * sorted[i] + frac * next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_position_per_cluster_is_the_textbook_standard_error() {
        // Clusters of one position: CR1 is s / sqrt(n) with the sample
        // variance (n - 1 in its denominator).
        let x = [1.0, 2.0, 4.0, 7.0, 11.0];
        let clusters: Vec<Cluster> = x.iter().map(|&v| (1, v)).collect();
        let (mean, se) = mean_se(&clusters);
        let n = x.len() as f64;
        let var = x.iter().map(|v| (v - 5.0f64).powi(2)).sum::<f64>() / (n - 1.0);
        assert_eq!(mean, 5.0);
        assert!((se - (var / n).sqrt()).abs() < 1e-12, "{se}");
    }

    #[test]
    fn correlated_positions_widen_the_interval() {
        // Two chunks whose positions are all alike: 50 positions of 1 and
        // 50 of 3. Treated as independent, se would be about 0.1; as two
        // clusters, it is the se of two values, 1.
        let clusters = [(50, 50.0), (50, 150.0)];
        let (mean, iv) = estimate(&clusters);
        assert_eq!(mean, 2.0);
        assert!((iv.se - 1.0).abs() < 1e-12, "{}", iv.se);
        assert!((iv.hi - (2.0 + 12.7062)).abs() < 1e-9, "{iv:?}");
        assert_eq!(iv.clusters, 2);
        // A single cluster has no known uncertainty: no interval, not [m, m].
        let (m, one) = estimate(&[(50, 50.0)]);
        assert_eq!((m, one.clusters), (1.0, 1));
        assert!(
            !one.known() && one.lo.is_nan() && one.hi.is_nan(),
            "{one:?}"
        );
        // An unknown interval stays unknown through a map, and is `null`
        // in JSON and NaN again when read back.
        assert!(!one.map(f64::exp, 1.0).known());
        let json = serde_json::to_string(&one).unwrap();
        assert_eq!(json, r#"{"se":null,"lo":null,"hi":null,"clusters":1}"#);
        let back: Interval = serde_json::from_str(&json).unwrap();
        assert_eq!(back, one);
    }

    /// A standard normal draw (Box-Muller).
    fn normal(r: &mut crate::splitmix::SplitMix64) -> f64 {
        let u = 1.0 - r.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * r.unit()).cos()
    }

    #[test]
    fn intervals_by_group_cover_the_truth_and_by_chunk_do_not() {
        // Held-out text as the corpus samples it: 12 groups drawn at random,
        // each with its own level (sd 1 around the true mean 0.5), packed
        // into 4 chunks of 25 positions each (position noise sd 1). The mean
        // over all positions estimates 0.5; its variance is mostly the
        // group levels', which chunks of one group share.
        let (groups, chunks, positions, truth) = (12usize, 4usize, 25usize, 0.5);
        let mut r = crate::splitmix::SplitMix64::new(52);
        let (mut by_group, mut by_chunk) = (0u32, 0u32);
        let draws = 1_000;
        for _ in 0..draws {
            let mut items: Vec<(usize, usize, u64, f64)> = Vec::new();
            for g in 0..groups {
                let level = truth + normal(&mut r);
                for c in 0..chunks {
                    let s: f64 = (0..positions).map(|_| level + normal(&mut r)).sum();
                    items.push((g, g * chunks + c, positions as u64, s));
                }
            }
            let covers = |clusters: Vec<Cluster>| {
                let (_, iv) = estimate(&clusters);
                iv.lo <= truth && truth <= iv.hi
            };
            by_group += u32::from(covers(clusters_by(
                items.iter().map(|&(g, _, n, s)| (g, n, s)),
            )));
            by_chunk += u32::from(covers(clusters_by(
                items.iter().map(|&(_, c, n, s)| (c, n, s)),
            )));
        }
        let share = |k: u32| f64::from(k) / f64::from(draws);
        println!(
            "95% intervals covering the true mean in {draws} draws: by group {:.1}%, by chunk {:.1}%",
            100.0 * share(by_group),
            100.0 * share(by_chunk)
        );
        assert!(share(by_group) >= 0.92, "by group: {}", share(by_group));
        assert!(share(by_chunk) <= 0.85, "by chunk: {}", share(by_chunk));
    }

    #[test]
    fn t_quantiles_meet_the_normal_one() {
        assert_eq!(t975(1), 12.7062);
        assert_eq!(t975(30), 2.0423);
        // Published: t(0.975, 40) = 2.0211, t(0.975, 120) = 1.9799.
        assert!((t975(40) - 2.0211).abs() < 1e-4, "{}", t975(40));
        assert!((t975(120) - 1.9799).abs() < 1e-4, "{}", t975(120));
        assert!((t975(1_000_000) - 1.959_964).abs() < 1e-5);
        assert!(t975(0).is_infinite());
    }

    #[test]
    fn percentiles_interpolate_like_llama_perplexity() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.5);
        assert_eq!(percentile(&[1.0, 2.0, 9.0], 0.5), 2.0);
        // Rank 0.9 * 3 = 2.7: 3 + 0.7 * (4 - 3).
        assert!((percentile(&v, 0.9) - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
