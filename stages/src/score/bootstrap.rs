//! Keep-map stability: refit every (method, K) on bootstrap resamples of the
//! fit split's clusters of chunks (from the compact per-chunk statistics) and
//! measure the Jaccard overlap with the full-data map.
//!
//! The corpus samples text by document group, and one group's documents may
//! fill several chunks, so chunks of one group are not independent: a
//! resample draws whole clusters ([`clusters_of`]: chunks linked by a shared
//! group are one cluster), with replacement, as many as there are. The
//! groups are those the chunk table names for each chunk's fit spans
//! ([`fit_groups`]); a run without group keys has one group per document,
//! so its clusters are the chunks a document spans.

use super::keep::{rank_layers, LayerRanking};
use super::method::ScoreParams;
use super::source::LayerInput;
use crate::StagesError;
use config::method::Method;
use numbers::stats::ChunkStats;
use numbers::Split;
use rand::{Rng, SeedableRng};
use runfiles::corpus::Chunk;
use serde::{Deserialize, Serialize};

/// Stability of one (method, K).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StabilityRow {
    /// Method name.
    pub method: String,
    /// Experts kept per layer.
    pub k: u32,
    /// Resamples drawn.
    pub resamples: u32,
    /// Mean over resamples and layers of the Jaccard overlap with the full map.
    pub mean_jaccard: f64,
    /// Smallest per-resample mean Jaccard.
    pub min_jaccard: f64,
    /// Clusters each resample draws from (chunks linked by a shared fit
    /// group); 0 in reports written before resamples were clustered.
    #[serde(default)]
    pub clusters: u32,
}

/// Sums a resample (chunk indices, with repetition) into per-layer inputs.
/// `layers` gives the block index of each MoE layer in `ChunkStats` order.
pub fn resample_layers(
    chunks: &[ChunkStats],
    pick: &[usize],
    layers: &[u32],
    n_expert: usize,
) -> Vec<LayerInput> {
    let totals = ChunkStats::totals(chunks, pick, layers.len() * n_expert);
    layers
        .iter()
        .enumerate()
        .map(|(i, &layer)| {
            let r = i * n_expert..(i + 1) * n_expert;
            LayerInput::from_cells(layer, totals.each_ref().map(|t| &t[r.clone()]))
        })
        .collect()
}

fn jaccard(a: &[u32], b: &[u32]) -> f64 {
    let inter = a.iter().filter(|e| b.contains(e)).count();
    let union = a.len() + b.len() - inter;
    if union == 0 {
        1.0
    } else {
        inter as f64 / union as f64
    }
}

/// Full-data rankings of each method, to compare resamples with.
pub struct Reference<'a> {
    /// Method and its full-data rankings.
    pub methods: Vec<(Method, &'a [LayerRanking])>,
    /// Sizes to compare.
    pub ks: &'a [u32],
    /// Routing groups the resampled rankings are balanced over.
    pub groups: Option<numbers::routing::ExpertGroups>,
    /// Per layer, the experts the super-expert guard keeps first (from the
    /// whole fit split, as the full-data rankings had them).
    pub guarded: &'a [Vec<bool>],
}

/// Per chunk of `stats` (in their order), the document groups of its fit
/// spans as the chunk table `table` names them ([`Span::group`]), for
/// [`clusters_of`]; a chunk of `stats` the table lacks is refused by id.
///
/// [`Span::group`]: runfiles::corpus::Span::group
pub fn fit_groups(table: &[Chunk], stats: &[ChunkStats]) -> Result<Vec<Vec<u32>>, String> {
    let by_id: std::collections::BTreeMap<u32, &Chunk> =
        table.iter().map(|c| (c.id.0, c)).collect();
    stats
        .iter()
        .map(|s| {
            let c = by_id.get(&s.chunk).ok_or_else(|| {
                format!(
                    "partials carry statistics of chunk {}, which the chunk table lacks",
                    s.chunk
                )
            })?;
            let mut groups: Vec<u32> = c
                .spans
                .iter()
                .filter(|sp| sp.split == Split::Fit)
                .map(|sp| sp.group)
                .collect();
            groups.sort_unstable();
            groups.dedup();
            Ok(groups)
        })
        .collect()
}

/// The bootstrap's clusters: `groups_of[i]` lists the document groups of
/// chunk `i`'s spans, and chunks that share a group, directly or through
/// other chunks, get one cluster id (the smallest chunk index among them).
pub fn clusters_of(groups_of: &[Vec<u32>]) -> Vec<usize> {
    let mut parent: Vec<usize> = (0..groups_of.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut first_of: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
    for (i, groups) in groups_of.iter().enumerate() {
        for &g in groups {
            let j = *first_of.entry(g).or_insert(i);
            let (a, b) = (root(&mut parent, i), root(&mut parent, j));
            parent[a.max(b)] = a.min(b);
        }
    }
    (0..groups_of.len()).map(|i| root(&mut parent, i)).collect()
}

/// Runs `n` seeded resamples of the clusters `clusters` (one id per chunk,
/// [`clusters_of`]); one row per (method, K).
#[allow(clippy::too_many_arguments)]
pub fn stability(
    chunks: &[ChunkStats],
    clusters: &[usize],
    layers: &[u32],
    n_expert: usize,
    p: &ScoreParams,
    reference: &Reference<'_>,
    n: u32,
    seed: u64,
) -> Result<Vec<StabilityRow>, StagesError> {
    let cells = layers.len() * n_expert;
    if let Some(bad) = chunks.iter().find(|c| c.cells() != Some(cells)) {
        return Err(StagesError::ChunkShape {
            chunk: bad.chunk,
            cells: bad.count.len(),
            layers: layers.len(),
            n_expert,
        });
    }
    if chunks.is_empty() || n == 0 {
        return Err(StagesError::NothingToBootstrap);
    }
    assert_eq!(clusters.len(), chunks.len(), "one cluster id per chunk");
    let mut members: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, &c) in clusters.iter().enumerate() {
        members.entry(c).or_default().push(i);
    }
    let members: Vec<Vec<usize>> = members.into_values().collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let nm = reference.methods.len() * reference.ks.len();
    let mut per_resample: Vec<Vec<f64>> = vec![Vec::new(); nm];
    for _ in 0..n {
        let pick: Vec<usize> = (0..members.len())
            .flat_map(|_| members[rng.random_range(0..members.len())].iter().copied())
            .collect();
        let mut sample = resample_layers(chunks, &pick, layers, n_expert);
        super::super_experts::mark(&mut sample, reference.guarded);
        for (mi, (method, full)) in reference.methods.iter().enumerate() {
            let boot = rank_layers(*method, p, &sample, reference.groups);
            for (ki, &k) in reference.ks.iter().enumerate() {
                let j: f64 = full
                    .iter()
                    .zip(&boot)
                    .map(|(f, b)| jaccard(&f.kept(k), &b.kept(k)))
                    .sum::<f64>()
                    / full.len().max(1) as f64;
                per_resample[mi * reference.ks.len() + ki].push(j);
            }
        }
    }
    let mut out = Vec::new();
    for (mi, (method, _)) in reference.methods.iter().enumerate() {
        for (ki, &k) in reference.ks.iter().enumerate() {
            let v = &per_resample[mi * reference.ks.len() + ki];
            out.push(StabilityRow {
                method: method.as_str().to_string(),
                k,
                resamples: n,
                mean_jaccard: v.iter().sum::<f64>() / v.len() as f64,
                min_jaccard: v.iter().copied().fold(f64::INFINITY, f64::min),
                clusters: members.len() as u32,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: u32, counts: &[u32]) -> ChunkStats {
        ChunkStats {
            chunk: id,
            n_tokens: 10,
            count: counts.to_vec(),
            reap_l2_sum: counts.iter().map(|&c| c as f32).collect(),
            reap_l2_sq_sum: counts.iter().map(|&c| c as f32).collect(),
        }
    }

    /// Frequency rankings of layer 0 over the `pick`ed chunks of 4 experts.
    fn frequency_ranks(
        p: &ScoreParams,
        chunks: &[ChunkStats],
        pick: &[usize],
    ) -> Vec<LayerRanking> {
        let input = resample_layers(chunks, pick, &[0], 4);
        rank_layers(Method::Frequency, p, &input, None)
    }

    /// Frequency at K = 2 against `full`, without routing groups.
    fn at_k2(full: &[LayerRanking]) -> Reference<'_> {
        Reference {
            methods: vec![(Method::Frequency, full)],
            ks: &[2],
            groups: None,
            guarded: &[],
        }
    }

    #[test]
    fn identical_chunks_give_perfect_stability_and_noisy_ones_less() {
        let p = ScoreParams::default();
        let layers = [0u32];
        let steady: Vec<ChunkStats> = (0..8).map(|i| chunk(i, &[9, 5, 1, 0])).collect();
        let full = frequency_ranks(&p, &steady, &[0]);
        let reference = at_k2(&full);
        let own: Vec<usize> = (0..8).collect();
        let rows = stability(&steady, &own, &layers, 4, &p, &reference, 5, 7).unwrap();
        assert_eq!((rows[0].mean_jaccard, rows[0].min_jaccard), (1.0, 1.0));
        // Each chunk favours a different pair of experts.
        let noisy: Vec<ChunkStats> = (0..8)
            .map(|i| {
                if i % 2 == 0 {
                    chunk(i, &[9, 8, 0, 0])
                } else {
                    chunk(i, &[0, 0, 9, 8])
                }
            })
            .collect();
        let all: Vec<usize> = (0..8).collect();
        let full = frequency_ranks(&p, &noisy, &all);
        let reference = at_k2(&full);
        let a = stability(&noisy, &own, &layers, 4, &p, &reference, 20, 7).unwrap();
        let b = stability(&noisy, &own, &layers, 4, &p, &reference, 20, 7).unwrap();
        assert_eq!(a, b, "seeded resampling is reproducible");
        assert!(a[0].mean_jaccard < 0.9 && a[0].min_jaccard < 1.0, "{a:?}");
        // Chunks 2i and 2i + 1 of one group: every cluster holds both
        // patterns, so every resample ranks like the full data.
        let pairs = clusters_of(&(0..8).map(|i| vec![i / 2]).collect::<Vec<_>>());
        assert_eq!(pairs, [0, 0, 2, 2, 4, 4, 6, 6]);
        let c = stability(&noisy, &pairs, &layers, 4, &p, &reference, 20, 7).unwrap();
        assert_eq!((c[0].mean_jaccard, c[0].min_jaccard), (1.0, 1.0), "{c:?}");
        assert!(stability(&noisy, &own, &[0, 1], 4, &p, &reference, 1, 0)
            .unwrap_err()
            .to_string()
            .contains("chunk 0"));
    }

    /// The chunk table's fit groups feed the clusters: chunks 2i and 2i + 1
    /// share a fit group (their held-out spans, of other groups, do not
    /// link anything), so each resample draws both or neither, and every
    /// resample of the noisy chunks ranks like the full data; chunk by
    /// chunk it does not.
    #[test]
    fn chunks_sharing_a_fit_group_resample_together() {
        use runfiles::corpus::Span;
        let span = |start, split, group| Span {
            start,
            len: 4,
            split,
            domain: 0,
            doc: group,
            group,
        };
        let table: Vec<Chunk> = (0..8u32)
            .map(|i| Chunk {
                id: numbers::ChunkId(i),
                tokens: vec![1; 8],
                spans: vec![span(0, Split::Fit, i / 2), span(4, Split::Heldout, 100 + i)],
                images: Vec::new(),
            })
            .collect();
        // Held-out group 100 + i in chunks of two fit groups would link
        // them; it must not.
        let mut linked = table.clone();
        linked[3].spans[1].group = 100;
        let noisy: Vec<ChunkStats> = (0..8)
            .map(|i| match i % 2 {
                0 => chunk(i, &[9, 8, 0, 0]),
                _ => chunk(i, &[0, 0, 9, 8]),
            })
            .collect();
        for t in [&table, &linked] {
            let groups = fit_groups(t, &noisy).unwrap();
            assert_eq!(groups[3], [1]);
            assert_eq!(clusters_of(&groups), [0, 0, 2, 2, 4, 4, 6, 6]);
        }
        let p = ScoreParams::default();
        let all: Vec<usize> = (0..8).collect();
        let full = frequency_ranks(&p, &noisy, &all);
        let reference = at_k2(&full);
        let clusters = clusters_of(&fit_groups(&table, &noisy).unwrap());
        let by_group = stability(&noisy, &clusters, &[0], 4, &p, &reference, 20, 7).unwrap();
        assert_eq!(by_group[0].clusters, 4);
        assert_eq!(
            (by_group[0].mean_jaccard, by_group[0].min_jaccard),
            (1.0, 1.0),
            "{by_group:?}"
        );
        let by_chunk = stability(&noisy, &all, &[0], 4, &p, &reference, 20, 7).unwrap();
        assert_eq!(by_chunk[0].clusters, 8);
        assert!(by_chunk[0].min_jaccard < 1.0, "{by_chunk:?}");
        // Statistics of a chunk the table lacks are refused by id.
        let e = fit_groups(&table[..5], &noisy).unwrap_err();
        assert!(e.contains("chunk 5, which the chunk table lacks"), "{e}");
    }

    #[test]
    fn chunks_linked_by_a_group_are_one_cluster() {
        // 0-1 share group 7, 1-3 share 8, 2 alone, 4 has no group.
        let groups = [vec![7], vec![7, 8], vec![9], vec![8], vec![]];
        assert_eq!(clusters_of(&groups), [0, 0, 2, 0, 4]);
    }
}
