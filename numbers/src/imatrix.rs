//! The importance matrix: per weight tensor, the sum and the sum of squares
//! of each input column (per expert for stacked expert weights) and token
//! counts, with an exact merge and llama.cpp's GGUF imatrix output format.

use crate::exact::{add_all, ExactError, ExactSum};
use crate::stats::MergeError;
use gguf::write::{GgufWriter, Value};
use rayon::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// One column of exact sums, which tensors whose sums are equal may share
/// (`ffn_gate_exps` and `ffn_up_exps` read the same input): a running total
/// then holds them once (1.6 GB less at the real shape). Writing through it
/// first copies a shared column (copy on write), so sharing never changes a
/// value; it is encoded as the plain sequence of its sums.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sums(Arc<Vec<ExactSum>>);

impl Sums {
    /// Whether `self` and `other` are one column in memory.
    pub fn is_shared_with(&self, other: &Sums) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl From<Vec<ExactSum>> for Sums {
    fn from(v: Vec<ExactSum>) -> Sums {
        Sums(Arc::new(v))
    }
}

impl FromIterator<ExactSum> for Sums {
    fn from_iter<I: IntoIterator<Item = ExactSum>>(iter: I) -> Sums {
        Sums::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Sums {
    type Item = &'a ExactSum;
    type IntoIter = std::slice::Iter<'a, ExactSum>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Deref for Sums {
    type Target = Vec<ExactSum>;

    fn deref(&self) -> &Vec<ExactSum> {
        &self.0
    }
}

impl DerefMut for Sums {
    /// The column, copied first when another tensor shares it.
    fn deref_mut(&mut self) -> &mut Vec<ExactSum> {
        Arc::make_mut(&mut self.0)
    }
}

impl Serialize for Sums {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.as_slice().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Sums {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Sums, D::Error> {
        Vec::deserialize(d).map(Sums::from)
    }
}

/// Adds into the columns `into` (a total's, in order) the columns of
/// another result: column `i` receives source `source_of[i]`, which `add`
/// adds into every column it is given (sources in parallel). Columns of the
/// total that share memory and receive the same source are added once and
/// stay shared; a shared column that receives different sources is copied
/// apart first. So the sums are those of adding column by column, and a
/// total's sharing survives merges of results whose equal columns are equal.
pub fn add_columns<E: Send>(
    mut into: Vec<&mut Sums>,
    source_of: &[usize],
    add: impl Fn(usize, &mut [&mut [ExactSum]]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    assert_eq!(into.len(), source_of.len(), "a source for every column");
    // One owner per (memory, source), written while the other columns of
    // its pair are set aside, then shared again; a memory already owned
    // for another source is copied first. The first column of each memory
    // keeps it, so no memory is freed (and its address reused) meanwhile.
    let mut owner_of: HashMap<(*const Vec<ExactSum>, usize), usize> = HashMap::new();
    let mut owned: HashSet<*const Vec<ExactSum>> = HashSet::new();
    let mut follows: Vec<Option<usize>> = vec![None; into.len()];
    for (i, col) in into.iter_mut().enumerate() {
        let memory = Arc::as_ptr(&col.0);
        match owner_of.entry((memory, source_of[i])) {
            Entry::Occupied(owner) => {
                follows[i] = Some(*owner.get());
                **col = Sums::default();
            }
            Entry::Vacant(slot) => {
                if !owned.insert(memory) {
                    **col = Sums::from(col.to_vec());
                }
                slot.insert(i);
            }
        }
    }
    let n_sources = source_of.iter().max().map_or(0, |m| m + 1);
    let mut targets: Vec<Vec<&mut [ExactSum]>> = (0..n_sources).map(|_| Vec::new()).collect();
    for (i, col) in into.iter_mut().enumerate() {
        if follows[i].is_none() {
            targets[source_of[i]].push(col.as_mut_slice());
        }
    }
    let added = targets
        .par_iter_mut()
        .enumerate()
        .filter(|(_, outs)| !outs.is_empty())
        .try_for_each(|(src, outs)| add(src, outs));
    for i in 0..into.len() {
        if let Some(owner) = follows[i] {
            *into[i] = into[owner].clone();
        }
    }
    added
}

/// Sums for one weight tensor (`blk.N.ffn_down_exps.weight`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImatrixEntry {
    /// Input columns of the weight (`ne[0]`).
    pub n_in: u32,
    /// Matrices in the tensor: experts for `MUL_MAT_ID`, 1 for dense weights.
    pub n_mat: u32,
    /// `sum x_j^2` per (matrix, column), row-major `[n_mat][n_in]`.
    pub in_sum2: Sums,
    /// `sum x_j` per (matrix, column), same layout: llama-imatrix's
    /// `in_sum`, which its statistics (means, cosine similarity) read.
    pub in_sum: Sums,
    /// Tokens (input rows) seen per matrix.
    pub counts: Vec<u64>,
}

impl ImatrixEntry {
    /// An empty entry.
    pub fn new(n_in: u32, n_mat: u32) -> Self {
        ImatrixEntry {
            n_in,
            n_mat,
            in_sum2: vec![ExactSum::ZERO; n_in as usize * n_mat as usize].into(),
            in_sum: vec![ExactSum::ZERO; n_in as usize * n_mat as usize].into(),
            counts: vec![0; n_mat as usize],
        }
    }

    /// The two sum vectors, `in_sum2` then `in_sum`: what the partial
    /// encoding stores as columns, in this order.
    pub fn sums(&self) -> [&Sums; 2] {
        [&self.in_sum2, &self.in_sum]
    }

    /// [`ImatrixEntry::sums`], writable.
    pub fn sums_mut(&mut self) -> [&mut Sums; 2] {
        [&mut self.in_sum2, &mut self.in_sum]
    }

    /// Per (matrix, column), `sqrt(count * in_sum2)`: the Cauchy-Schwarz
    /// bound on `|in_sum|` and at least `sum |x_j|`, so the scale that
    /// rounding errors of the signed `in_sum` are relative to (a sum that
    /// cancels to near zero is compared against it, not against itself).
    pub fn in_sum_scale(&self) -> Vec<f64> {
        let n_in = self.n_in.max(1) as usize;
        self.in_sum2
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let count = self.counts.get(i / n_in).copied().unwrap_or(0);
                (count as f64 * s.to_f64().max(0.0)).sqrt()
            })
            .collect()
    }

    /// Adds the token counts of an entry of the same shape.
    fn add_counts(&mut self, other: &ImatrixEntry) -> Result<(), MergeError> {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.checked_add(*b).ok_or(MergeError::CountOverflow)?;
        }
        Ok(())
    }
}

/// Importance matrix of a partial or merged result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imatrix {
    /// Per weight tensor name.
    pub entries: BTreeMap<String, ImatrixEntry>,
    /// Chunks processed.
    pub chunk_count: u64,
    /// Tokens per chunk (the context size).
    pub chunk_size: u32,
}

impl Imatrix {
    /// Adds another importance matrix computed with the same chunk size.
    /// Tensors are added in parallel (rayon): each sum is one integer
    /// addition, so the result is the same bits in any order. A tensor of
    /// another shape is refused before anything is added.
    pub fn merge(&mut self, other: &Imatrix) -> Result<(), MergeError> {
        if self.chunk_size != 0 && other.chunk_size != 0 && self.chunk_size != other.chunk_size {
            return Err(MergeError::Shape(format!(
                "imatrix chunk size {} vs {}",
                self.chunk_size, other.chunk_size
            )));
        }
        for (name, e) in &other.entries {
            if let Some(mine) = self.entries.get(name) {
                if (mine.n_in, mine.n_mat) != (e.n_in, e.n_mat) {
                    return Err(MergeError::Shape(format!(
                        "imatrix {name}: [{}, {}] vs [{}, {}]",
                        mine.n_in, mine.n_mat, e.n_in, e.n_mat
                    )));
                }
            }
        }
        self.chunk_size = self.chunk_size.max(other.chunk_size);
        self.chunk_count += other.chunk_count;
        let mut into: Vec<&mut Sums> = Vec::new();
        let mut from: Vec<&Sums> = Vec::new();
        for (name, mine) in self.entries.iter_mut() {
            let Some(e) = other.entries.get(name) else {
                continue;
            };
            mine.add_counts(e)?;
            for (a, b) in mine.sums_mut().into_iter().zip(e.sums()) {
                // A packed partial's header has empty sums (its counts only).
                if !b.is_empty() {
                    into.push(a);
                    from.push(b);
                }
            }
        }
        // `other`'s equal columns, when it shares them, are one source.
        let mut first: HashMap<*const Vec<ExactSum>, usize> = HashMap::new();
        let source_of: Vec<usize> = from
            .iter()
            .enumerate()
            .map(|(i, b)| *first.entry(Arc::as_ptr(&b.0)).or_insert(i))
            .collect();
        add_columns(into, &source_of, |src, outs| {
            for out in outs.iter_mut() {
                add_all(out, from[src]).map_err(|(_, v)| ExactError::Overflow(v))?;
            }
            Ok::<(), MergeError>(())
        })?;
        for (name, e) in &other.entries {
            if !self.entries.contains_key(name) {
                self.entries.insert(name.clone(), e.clone());
            }
        }
        Ok(())
    }

    /// llama.cpp's GGUF imatrix file: `general.type = imatrix`, per tensor
    /// `<name>.in_sum2` `[n_in, n_mat]`, `<name>.counts` `[1, n_mat]` and
    /// `<name>.in_sum` `[n_in, n_mat]` (f32, in llama-imatrix's order),
    /// `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`.
    pub fn to_gguf(&self, datasets: &[String]) -> Vec<u8> {
        self.gguf(datasets).to_bytes()
    }

    /// [`Imatrix::to_gguf`] in pieces ([`GgufWriter::into_parts`]), for a
    /// store to write without joining them.
    pub fn to_gguf_parts(&self, datasets: &[String]) -> Vec<bytes::Bytes> {
        self.gguf(datasets).into_parts()
    }

    fn gguf(&self, datasets: &[String]) -> GgufWriter {
        let mut g = GgufWriter::new();
        g.kv("general.type", Value::Str("imatrix".into()))
            .kv("imatrix.datasets", Value::StrArray(datasets.to_vec()))
            .kv("imatrix.chunk_count", Value::U32(self.chunk_count as u32))
            .kv("imatrix.chunk_size", Value::U32(self.chunk_size));
        let f32s =
            |sums: &[ExactSum]| -> Vec<f32> { sums.iter().map(|s| s.to_f64() as f32).collect() };
        for (name, e) in &self.entries {
            let shape = [e.n_in as u64, e.n_mat as u64];
            let counts: Vec<f32> = e.counts.iter().map(|&c| c as f32).collect();
            g.tensor_f32(&format!("{name}.in_sum2"), &shape, &f32s(&e.in_sum2));
            g.tensor_f32(&format!("{name}.counts"), &[1, e.n_mat as u64], &counts);
            g.tensor_f32(&format!("{name}.in_sum"), &shape, &f32s(&e.in_sum));
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way three columns may share memory (a partition of them).
    const PARTITIONS: [[usize; 3]; 5] = [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [0, 1, 2]];

    #[test]
    fn shared_columns_add_as_separate_ones_and_stay_shared_only_where_their_sources_agree() {
        let sources: Vec<Vec<ExactSum>> = (0..3)
            .map(|s| (0..4).map(|i| ExactSum(10 * s + i + 1)).collect())
            .collect();
        for partition in PARTITIONS {
            for code in 0..27 {
                let source_of = [code % 3, code / 3 % 3, code / 9];
                // The columns before: those of one part share memory.
                let parts: Vec<Sums> = (0..3)
                    .map(|p| {
                        (0..4)
                            .map(|i| ExactSum(100 * (p as i128 + 1) + i))
                            .collect()
                    })
                    .collect();
                let mut cols: Vec<Sums> = partition.iter().map(|&p| parts[p].clone()).collect();
                let before: Vec<Vec<ExactSum>> = cols.iter().map(|c| c.to_vec()).collect();
                add_columns(cols.iter_mut().collect(), &source_of, |src, outs| {
                    for out in outs.iter_mut() {
                        for (a, b) in out.iter_mut().zip(&sources[src]) {
                            a.add(*b)?;
                        }
                    }
                    Ok::<(), MergeError>(())
                })
                .unwrap();
                for i in 0..3 {
                    let want: Vec<ExactSum> = before[i]
                        .iter()
                        .zip(&sources[source_of[i]])
                        .map(|(a, b)| ExactSum(a.0 + b.0))
                        .collect();
                    assert_eq!(*cols[i], want, "{partition:?} {source_of:?} column {i}");
                    for j in 0..3 {
                        let stay = partition[i] == partition[j] && source_of[i] == source_of[j];
                        assert_eq!(
                            cols[i].is_shared_with(&cols[j]),
                            stay,
                            "{partition:?} {source_of:?} columns {i}, {j}"
                        );
                    }
                }
                // Memory outside the total (a clone of a part) is never written.
                for (p, part) in parts.iter().enumerate() {
                    let untouched: Vec<ExactSum> = (0..4)
                        .map(|i| ExactSum(100 * (p as i128 + 1) + i))
                        .collect();
                    assert_eq!(**part, untouched);
                }
            }
        }
    }

    #[test]
    fn writing_a_shared_column_copies_it_first() {
        let a: Sums = vec![ExactSum(1), ExactSum(2)].into();
        let mut b = a.clone();
        assert!(a.is_shared_with(&b));
        b[0] = ExactSum(7);
        assert!(!a.is_shared_with(&b));
        assert_eq!((a[0], b[0]), (ExactSum(1), ExactSum(7)));
    }
}
