//! Importance-matrix sums (of squares and of values) from the inputs of
//! weight matmuls.
//!
//! Several matmuls of a layer read the same input: `attn_q`, `attn_k` and
//! `attn_v` the normed hidden state, `ffn_gate_exps` and `ffn_up_exps` the
//! same state with the same expert ids. Their sums are equal, so each input's
//! sums are computed once per micro-batch and added to every weight that
//! reads it. An input is recognised by its graph node (not its data address,
//! which the graph allocator reuses across layers), and the cache is dropped
//! with the graph at the end of each micro-batch.

use super::scratch::ImatrixScratch;
use llama::{as_f32s, f32s, i32_at, Op, TensorRef};

/// What makes two matmuls contribute the same sums: the same input node (and
/// ids node), read against the same stack of matrices (a weight's output
/// width does not enter its importance sums, so `attn_q` and a narrower
/// grouped-query `attn_k` share theirs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InputKey {
    input: usize,
    ids: usize,
    n_in: usize,
    matrices: [usize; 2],
}

/// One input's sums over the current micro-batch.
struct InputSums {
    key: InputKey,
    sum2: Vec<f64>,
    sum: Vec<f64>,
    counts: Vec<u64>,
}

/// Per-micro-batch sums of the matmul inputs seen so far.
#[derive(Default)]
pub struct ImportanceCache {
    seen: Vec<InputSums>,
    /// Buffers of earlier micro-batches, reused.
    spare: Vec<InputSums>,
}

impl ImportanceCache {
    /// Forgets the inputs of the previous micro-batch: its graph is gone.
    pub fn begin_ubatch(&mut self) {
        self.spare.append(&mut self.seen);
    }

    /// Adds the sums of matmul `t` (weight `w`, f32 input `x`, for `MUL_MAT_ID`
    /// expert ids in source 2) over the tokens where `fit` holds into `entry`,
    /// computing them only for an input not seen in this micro-batch.
    pub fn add(
        &mut self,
        t: &TensorRef<'_>,
        w: &TensorRef<'_>,
        x: &TensorRef<'_>,
        fit: &[bool],
        entry: &mut ImatrixScratch,
    ) {
        let ids = match (t.op(), t.src(2)) {
            (Op::MulMatId, None) => return,
            (Op::MulMatId, ids) => ids,
            _ => None,
        };
        let key = InputKey {
            input: x.node_id(),
            ids: ids.as_ref().map_or(0, TensorRef::node_id),
            n_in: x.ne()[0],
            matrices: [w.ne()[2], w.ne()[3]],
        };
        let i = match self.seen.iter().position(|s| s.key == key) {
            Some(i) => i,
            None => {
                let mut sums = self.spare.pop().unwrap_or(InputSums {
                    key,
                    sum2: Vec::new(),
                    sum: Vec::new(),
                    counts: Vec::new(),
                });
                sums.key = key;
                sums.sum2.clear();
                sums.sum2.resize(entry.sum2.len(), 0.0);
                sums.sum.clear();
                sums.sum.resize(entry.sum.len(), 0.0);
                sums.counts.clear();
                sums.counts.resize(entry.counts.len(), 0);
                match &ids {
                    Some(ids) => expert_sums(x, ids, fit, &mut sums),
                    None => dense_sums(x, w, fit, &mut sums),
                }
                self.seen.push(sums);
                self.seen.len() - 1
            }
        };
        let sums = &self.seen[i];
        for (a, b) in entry.sum2.iter_mut().zip(&sums.sum2) {
            *a += b;
        }
        for (a, b) in entry.sum.iter_mut().zip(&sums.sum) {
            *a += b;
        }
        for (a, b) in entry.counts.iter_mut().zip(&sums.counts) {
            *a += b;
        }
    }
}

/// Adds the squares and the values of the f32 row at byte `off` of `bytes`
/// to matrix `mat`'s sums in `out`.
///
/// An aligned row is read as `&[f32]`, which LLVM vectorises (converts,
/// multiplies and adds four lanes at a time); decoding four bytes at a time
/// does not vectorise. Both paths do the same f64 operations per element, so
/// the sums are the same bits.
#[inline]
fn add_row(out: &mut InputSums, mat: usize, n_in: usize, bytes: &[u8], off: usize) {
    let cells = mat * n_in..(mat + 1) * n_in;
    let (sum2, sum) = (&mut out.sum2[cells.clone()], &mut out.sum[cells]);
    let row = &bytes[off..off + 4 * n_in];
    let add = |(s2, s): (&mut f64, &mut f64), v: f32| {
        let v = f64::from(v);
        *s2 += v * v;
        *s += v;
    };
    if let Some(values) = as_f32s(row) {
        for (s, &v) in sum2.iter_mut().zip(sum.iter_mut()).zip(values) {
            add(s, v);
        }
        return;
    }
    for (s, v) in sum2.iter_mut().zip(sum.iter_mut()).zip(f32s(row)) {
        add(s, v);
    }
}

/// `MUL_MAT_ID`: each token's input row counts for every expert it selected.
fn expert_sums(x: &TensorRef<'_>, ids: &TensorRef<'_>, fit: &[bool], out: &mut InputSums) {
    let (xne, xnb, bytes) = (x.ne(), x.nb(), x.bytes());
    let (ine, inb, ibytes) = (ids.ne(), ids.nb(), ids.bytes());
    let n_in = xne[0];
    let n_mat = out.counts.len();
    for tok in 0..ine[1] {
        if !fit.get(tok).copied().unwrap_or(true) {
            continue;
        }
        for idx in 0..ine[0] {
            let ex = i32_at(&ibytes, tok * inb[1] + idx * inb[0]);
            if ex < 0 || ex as usize >= n_mat {
                continue;
            }
            let ex = ex as usize;
            out.counts[ex] += 1;
            let off = (idx % xne[1]) * xnb[1] + tok * xnb[2];
            add_row(out, ex, n_in, &bytes, off);
        }
    }
}

/// `MUL_MAT`: every input row counts for the weight matrix it is multiplied
/// with (broadcast over dimensions 2 and 3). Only fit tokens count: the
/// token axis is dimension 1 (llama.cpp's layout for matmuls, also of MLA's
/// per-head `attn_k_b` / `attn_v_b` inputs `[d, n_tokens, n_head]`), else
/// the first of dimensions 2 and 3 that is as long as the micro-batch.
fn dense_sums(x: &TensorRef<'_>, w: &TensorRef<'_>, fit: &[bool], out: &mut InputSums) {
    let (xne, xnb, bytes) = (x.ne(), x.nb(), x.bytes());
    let wne = w.ne();
    let n_in = xne[0];
    let token_axis = (1..4).find(|&a| xne[a] == fit.len());
    let counted = |idx: [usize; 4]| token_axis.is_none_or(|a| fit[idx[a]]);
    for i3 in 0..xne[3] {
        for i2 in 0..xne[2] {
            let mat = (i3 % wne[3]) * wne[2] + (i2 % wne[2]);
            for r in (0..xne[1]).filter(|&r| counted([0, r, i2, i3])) {
                let off = r * xnb[1] + i2 * xnb[2] + i3 * xnb[3];
                add_row(out, mat, n_in, &bytes, off);
                out.counts[mat] += 1;
            }
        }
    }
}
