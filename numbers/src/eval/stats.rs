//! Uncertainty of eval figures by chunk clusters, and llama-perplexity's
//! percentiles.
//!
//! Positions of one chunk share their context (each chunk is decoded
//! alone), so their figures are correlated; chunks are the clusters. A
//! figure that is a ratio of sums over positions, `m = sum_g S_g / sum_g
//! n_g` over chunks `g`, gets the cluster-robust (sandwich, CR1) standard
//! error of a mean,
//!
//! `se^2 = G / (G - 1) * sum_g (S_g - m n_g)^2 / N^2`,
//!
//! and a 95% interval `m ± t(0.975, G - 1) se` (Student's t with G - 1
//! degrees of freedom). Correlation between chunks (a document packed over
//! two chunks) is not modelled.

use serde::{Deserialize, Serialize};

/// A figure's standard error and 95% interval. With fewer than two
/// clusters the uncertainty is unknown: `se` is 0 and the interval the
/// value itself (the figures' `chunks` says how many clusters there were).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Standard error (cluster-robust).
    pub se: f64,
    /// Lower end of the 95% interval.
    pub lo: f64,
    /// Upper end of the 95% interval.
    pub hi: f64,
}

impl Interval {
    /// The symmetric interval `value ± t se` over `clusters` clusters.
    pub fn around(value: f64, se: f64, clusters: usize) -> Interval {
        if clusters < 2 {
            return Interval {
                se: 0.0,
                lo: value,
                hi: value,
            };
        }
        let half = t975(clusters - 1) * se;
        Interval {
            se,
            lo: value - half,
            hi: value + half,
        }
    }

    /// The interval mapped through an increasing function (`exp` for a
    /// perplexity from its log), its standard error by the delta method
    /// (`derivative` at the value).
    pub fn map(&self, f: impl Fn(f64) -> f64, derivative: f64) -> Interval {
        Interval {
            se: self.se * derivative.abs(),
            lo: f(self.lo),
            hi: f(self.hi),
        }
    }
}

/// A cluster's count and sum: `(n_g, S_g)`.
pub type Cluster = (u64, f64);

/// The mean `sum S_g / sum n_g` of `clusters` with its cluster-robust
/// standard error (0 below two clusters or without positions).
pub fn mean_se(clusters: &[Cluster]) -> (f64, f64) {
    let n: u64 = clusters.iter().map(|c| c.0).sum();
    if n == 0 {
        return (0.0, 0.0);
    }
    let total = n as f64;
    let mean = clusters.iter().map(|c| c.1).sum::<f64>() / total;
    let g = clusters.iter().filter(|c| c.0 > 0).count();
    if g < 2 {
        return (mean, 0.0);
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
    let g = clusters.iter().filter(|c| c.0 > 0).count();
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
        // A single cluster has no known uncertainty.
        let (m, one) = estimate(&[(50, 50.0)]);
        assert_eq!((m, one.se, one.lo, one.hi), (1.0, 0.0, 1.0, 1.0));
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
