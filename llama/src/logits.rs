//! Logits compared on the backend that holds them (DESIGN section 12): the
//! base model's scored rows of a micro-batch stay on the device, each
//! candidate's rows are compared with them there, and only per-position
//! figures cross to the host: 4 bytes per scored position for the base
//! model, 16 per position and candidate.
//!
//! Per scored row, with `a` the base logits, `b` the candidate's, `p` and
//! `q` their softmax and `lse` their log-sum-exp (computed as
//! `m + log(sum(exp(x - m)))` with `m` the row max), all in f32:
//! `KL(p || q) = sum_i p_i ((a_i - b_i) - (lse_a - lse_b))` (the form the
//! host's f64 path uses: equal rows give exactly 0), both negative log
//! likelihoods `lse - x_next`, the change `q_next - p_next`, and whether the
//! base model's top token is a maximum of the candidate's row (`gap ==
//! 0`, `gap = max(b) - b[argmax(a)]`; ggml's argmax takes the last of equal
//! maxima, the host path the first: they differ only on exact ties).
//!
//! The graphs run inside the eval callback, reading the logits tensor in
//! place (see [`super::reduce`] for why that is safe); on the CPU backend
//! they compute on the thread pool llama.cpp uses, between its graph pieces.

use super::backend::{expect_type, CpuThreads, Devices, Graph, Owned, ReduceError};
use super::{TensorRef, ThreadPool};
use llama_cpp_sys_2 as sys;
use std::sync::Arc;

/// What the base model's rows give per scored position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BaseFigures {
    /// Negative log likelihood of the next token, per row.
    pub nll: Vec<f32>,
}

/// What a candidate's rows give per scored position, in row order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CandidateFigures {
    /// KL(base || candidate).
    pub kl: Vec<f32>,
    /// The candidate's negative log likelihood of the next token.
    pub nll: Vec<f32>,
    /// q(next) - p(next).
    pub dprob: Vec<f32>,
    /// Whether the base model's top token is the candidate's top token.
    pub top1_same: Vec<bool>,
}

/// The base rows of the current micro-batch, on their device.
struct BaseRows {
    device: usize,
    /// Owns the tensors below.
    _mem: Owned,
    /// Base logits of the scored rows `[n_vocab, cap]`.
    logits: *mut sys::ggml_tensor,
    /// Their probabilities `[n_vocab, cap]`.
    probs: *mut sys::ggml_tensor,
    /// Log-sum-exp per row `[1, cap]`.
    lse: *mut sys::ggml_tensor,
    /// Probability of the next token per row `[1, cap]`.
    p_next: *mut sys::ggml_tensor,
    /// Argmax per row `[1, cap]` (i32).
    argmax: *mut sys::ggml_tensor,
    n_vocab: usize,
    cap: usize,
}

/// The scored rows of a micro-batch (indices into its logits tensor) and
/// the next token of each.
#[derive(Default)]
struct Scored {
    rows: Vec<i32>,
    next: Vec<i32>,
}

impl Scored {
    fn of(rows: &[i32], next: &[i32]) -> Scored {
        Scored {
            rows: rows.to_vec(),
            next: next.to_vec(),
        }
    }
}

/// Compares candidates' logits with the base model's on their backend.
pub struct LogitsCompare {
    devices: Devices,
    base: Option<BaseRows>,
    /// The micro-batch whose base rows are kept.
    scored: Scored,
    /// Seconds spent in `keep_base` and `compare`.
    call_s: f64,
    /// Keeps the CPU backend's thread pool alive.
    _pool: Option<Arc<ThreadPool>>,
}

/// Where a [`LogitsCompare`]'s time went, and what it copied.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CompareCost {
    /// Seconds the backends spent computing the comparison graphs.
    pub backend_s: f64,
    /// Seconds of host work around them: building the graphs, uploading
    /// row indices, copying the figures back.
    pub host_s: f64,
    /// Bytes copied from the backends to the host.
    pub bytes: u64,
}

impl CompareCost {
    /// What was spent after `earlier` (an earlier reading of the same
    /// comparer's cumulative cost).
    pub fn since(&self, earlier: &CompareCost) -> CompareCost {
        CompareCost {
            backend_s: self.backend_s - earlier.backend_s,
            host_s: self.host_s - earlier.host_s,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

// SAFETY: the ggml objects are used by one thread at a time (every method
// takes &mut self) and ggml backends may move between threads.
unsafe impl Send for LogitsCompare {}

impl LogitsCompare {
    /// A comparer whose CPU graphs compute on `pool` (llama.cpp's, shared
    /// by the contexts whose logits it reads) with `threads` threads, or on
    /// the calling thread without a pool.
    pub fn new(pool: Option<Arc<ThreadPool>>, threads: u32) -> LogitsCompare {
        let cpu = match &pool {
            Some(p) => CpuThreads::Pool(p.raw, threads.max(1)),
            None => CpuThreads::One,
        };
        LogitsCompare {
            devices: Devices::new(cpu),
            base: None,
            scored: Scored::default(),
            call_s: 0.0,
            _pool: pool,
        }
    }

    /// The time and bytes of every comparison so far.
    pub fn cost(&self) -> CompareCost {
        let backend_s = self.devices.compute_seconds();
        CompareCost {
            backend_s,
            host_s: self.call_s - backend_s,
            bytes: self.devices.bytes_read(),
        }
    }

    /// Keeps rows `rows` of the base model's logits `[n_vocab, n_outputs]`
    /// on their device, with the next token of each (`next`, below
    /// `n_vocab`), and returns the base figures of those rows.
    pub fn keep_base(
        &mut self,
        logits: &TensorRef<'_>,
        rows: &[i32],
        next: &[i32],
    ) -> Result<BaseFigures, ReduceError> {
        self.timed(|c| {
            assert_eq!(rows.len(), next.len(), "one next token per row");
            let (n_vocab, n_rows) = check_logits(logits, rows, next)?;
            let d = c.devices.of(logits)?;
            let nll = c.keep_rows(d, n_vocab, n_rows, next, |g| selected(g, logits, rows))?;
            c.scored = Scored::of(rows, next);
            Ok(nll)
        })
    }

    /// `f`'s result, its time added to the calls' time.
    fn timed<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let started = std::time::Instant::now();
        let out = f(self);
        self.call_s += started.elapsed().as_secs_f64();
        out
    }

    /// [`keep_base`](LogitsCompare::keep_base) from base rows kept on the
    /// host (`kept`: `n_vocab` values per scored row, in the order of
    /// `rows`), uploaded to the device of `like`, a candidate's logits
    /// tensor whose rows `rows` are compared next. The base rows go through
    /// the same graph as in place, so the figures are the same bit for bit
    /// (the base model and its candidates in turn, DESIGN section 12
    /// "Memory").
    pub fn restore_base(
        &mut self,
        like: &TensorRef<'_>,
        rows: &[i32],
        kept: &[f32],
        next: &[i32],
    ) -> Result<BaseFigures, ReduceError> {
        self.timed(|c| {
            assert_eq!(rows.len(), next.len(), "one next token per row");
            let (n_vocab, n_rows) = check_logits(like, rows, next)?;
            if kept.len() != n_vocab * n_rows {
                return Err(ReduceError::Shape(format!(
                    "{} kept base logits for {n_rows} rows of {n_vocab}",
                    kept.len()
                )));
            }
            let d = c.devices.of(like)?;
            let shape = [n_vocab as i64, n_rows as i64, 1];
            let nll = c.keep_rows(d, n_vocab, n_rows, next, |g| g.input(shape, kept))?;
            c.scored = Scored::of(rows, next);
            Ok(nll)
        })
    }

    /// Computes the base figures of `n_rows` rows of `n_vocab` logits on
    /// device `d`, the rows being what `source` puts in the graph, and keeps
    /// them there for [`compare`](LogitsCompare::compare).
    fn keep_rows(
        &mut self,
        d: usize,
        n_vocab: usize,
        n_rows: usize,
        next: &[i32],
        source: impl FnOnce(&mut Graph) -> *mut sys::ggml_tensor,
    ) -> Result<BaseFigures, ReduceError> {
        let base = self.base_rows(d, n_vocab, n_rows)?;
        let (b_logits, b_probs, b_lse, b_pnext, b_argmax) =
            (base.logits, base.probs, base.lse, base.p_next, base.argmax);
        let mut g = Graph::new()?;
        let r = n_rows as i64;
        let x = source(&mut g);
        let idx_next = g.input_i32([1, r, 1], next);
        // SAFETY: ops on tensors of our graph and views of the base rows'
        // own tensors (allocated for `cap >= n_rows` rows of n_vocab).
        let (copies, nll) = unsafe {
            let c = g.ctx();
            let s = RowStats::of(c, x, n_vocab as i64, r);
            let probs = sys::ggml_div(c, s.exps, s.sum);
            let nll = sys::ggml_sub(c, s.lse, gather(c, x, idx_next, n_vocab as i64, r));
            let p_next = sys::ggml_exp(c, sys::ggml_neg(c, nll));
            let copies = [
                sys::ggml_cpy(c, x, columns(c, b_logits, r)),
                sys::ggml_cpy(c, probs, columns(c, b_probs, r)),
                sys::ggml_cpy(c, s.lse, columns(c, b_lse, r)),
                sys::ggml_cpy(c, p_next, columns(c, b_pnext, r)),
                sys::ggml_cpy(c, s.argmax_2d, columns(c, b_argmax, r)),
            ];
            (copies, nll)
        };
        let mut outputs = copies.to_vec();
        outputs.push(nll);
        self.devices.compute(d, &g, &outputs)?;
        Ok(BaseFigures {
            nll: self.devices.read_f32(nll),
        })
    }

    /// Compares the same rows of a candidate's logits (same vocabulary,
    /// same device) with the base rows kept by the last [`keep_base`].
    ///
    /// [`keep_base`]: LogitsCompare::keep_base
    pub fn compare(&mut self, logits: &TensorRef<'_>) -> Result<CandidateFigures, ReduceError> {
        self.timed(|c| {
            let scored = std::mem::take(&mut c.scored);
            let result = c.compare_rows(logits, &scored);
            c.scored = scored;
            result
        })
    }

    fn compare_rows(
        &mut self,
        logits: &TensorRef<'_>,
        scored: &Scored,
    ) -> Result<CandidateFigures, ReduceError> {
        let (rows, next) = (scored.rows.as_slice(), scored.next.as_slice());
        let (n_vocab, n_rows) = check_logits(logits, rows, next)?;
        let d = self.devices.of(logits)?;
        let Some(base) = self.base.as_ref() else {
            return Err(ReduceError::Shape(
                "no base rows kept to compare with".into(),
            ));
        };
        if base.device != d || base.n_vocab != n_vocab {
            return Err(ReduceError::Shape(format!(
                "{}: {n_vocab} logits per row on device {d}, the base rows {} on device {}",
                logits.name(),
                base.n_vocab,
                base.device
            )));
        }
        let mut g = Graph::new()?;
        let (v, r) = (n_vocab as i64, n_rows as i64);
        let b = selected(&mut g, logits, rows);
        let idx_next = g.input_i32([1, r, 1], next);
        // SAFETY: ops on tensors of our graph and views of the base rows'
        // tensors, which the last keep_base filled for these rows.
        let out = unsafe {
            let c = g.ctx();
            let s = RowStats::of(c, b, v, r);
            let shift = sys::ggml_sub(c, columns(c, base.lse, r), s.lse);
            let diff = sys::ggml_sub(c, sys::ggml_sub(c, columns(c, base.logits, r), b), shift);
            let kl = sys::ggml_sum_rows(c, sys::ggml_mul(c, columns(c, base.probs, r), diff));
            let nll = sys::ggml_sub(c, s.lse, gather(c, b, idx_next, v, r));
            let q_next = sys::ggml_exp(c, sys::ggml_neg(c, nll));
            let dprob = sys::ggml_sub(c, q_next, columns(c, base.p_next, r));
            let at_base_top = gather(c, b, columns(c, base.argmax, r), v, r);
            let gap = sys::ggml_sub(c, s.max, at_base_top);
            sys::ggml_concat(
                c,
                sys::ggml_concat(c, kl, nll, 0),
                sys::ggml_concat(c, dprob, gap, 0),
                0,
            )
        };
        self.devices.compute(d, &g, &[out])?;
        let figures = self.devices.read_f32(out);
        let column = |k: usize| figures.iter().skip(k).step_by(4).copied();
        Ok(CandidateFigures {
            kl: column(0).collect(),
            nll: column(1).collect(),
            dprob: column(2).collect(),
            top1_same: column(3).map(|gap| gap == 0.0).collect(),
        })
    }

    /// The base rows' tensors on device `d`, (re)allocated when the
    /// vocabulary or device changes or more rows than before are kept.
    fn base_rows(
        &mut self,
        d: usize,
        n_vocab: usize,
        n_rows: usize,
    ) -> Result<&BaseRows, ReduceError> {
        let fits = self
            .base
            .as_ref()
            .is_some_and(|b| b.device == d && b.n_vocab == n_vocab && b.cap >= n_rows);
        if !fits {
            self.base = None;
            let cap = n_rows.max(1);
            let (v, k) = (n_vocab as i64, cap as i64);
            let (f32, i32) = (sys::GGML_TYPE_F32, sys::GGML_TYPE_I32);
            let shapes = [
                (f32, [v, k]),
                (f32, [v, k]),
                (f32, [1, k]),
                (f32, [1, k]),
                (i32, [1, k]),
            ];
            let (mem, t) = Owned::alloc(self.devices.backend(d), &shapes)?;
            self.base = Some(BaseRows {
                device: d,
                _mem: mem,
                logits: t[0],
                probs: t[1],
                lse: t[2],
                p_next: t[3],
                argmax: t[4],
                n_vocab,
                cap,
            });
        }
        Ok(self.base.as_ref().expect("set above"))
    }
}

impl Drop for LogitsCompare {
    fn drop(&mut self) {
        // The base rows live in a device buffer: free it before the
        // devices (dropped after this, as a field).
        self.base = None;
    }
}

/// Checks a logits tensor and row selection: f32 `[n_vocab, n_outputs]`,
/// rows below `n_outputs`, next tokens below `n_vocab`; returns
/// `(n_vocab, rows)`.
fn check_logits(
    logits: &TensorRef<'_>,
    rows: &[i32],
    next: &[i32],
) -> Result<(usize, usize), ReduceError> {
    expect_type(logits, sys::GGML_TYPE_F32)?;
    let ne = logits.ne();
    let in_range = |v: &[i32], n: usize| v.iter().all(|&i| usize::try_from(i).is_ok_and(|i| i < n));
    if ne[2] != 1
        || ne[3] != 1
        || rows.is_empty()
        || !in_range(rows, ne[1])
        || !in_range(next, ne[0])
    {
        return Err(ReduceError::Shape(format!(
            "{}: logits of shape {ne:?}, rows {rows:?}, next tokens {next:?}",
            logits.name()
        )));
    }
    Ok((ne[0], rows.len()))
}

/// The rows `rows` of an observed logits tensor, contiguous `[n_vocab, rows]`
/// (the tensor itself, read in place, when `rows` are all of its rows in order).
fn selected(g: &mut Graph, logits: &TensorRef<'_>, rows: &[i32]) -> *mut sys::ggml_tensor {
    let all = rows.len() == logits.ne()[1] && rows.iter().enumerate().all(|(i, &r)| r == i as i32);
    if all {
        return g.observed(logits);
    }
    let ids = g.input_i32([rows.len() as i64, 1, 1], rows);
    // SAFETY: a row gather of an observed tensor with indices checked to
    // lie below its row count.
    unsafe { sys::ggml_get_rows(g.ctx(), g.observed(logits), ids) }
}

/// The first `r` columns (rows of dimension 1) of a kept tensor.
///
/// # Safety
/// `t` is a live 2-D tensor with at least `r` rows; `c` a live context.
unsafe fn columns(
    c: *mut sys::ggml_context,
    t: *mut sys::ggml_tensor,
    r: i64,
) -> *mut sys::ggml_tensor {
    // SAFETY: guaranteed by the caller.
    unsafe { sys::ggml_view_2d(c, t, (*t).ne[0], r, (*t).nb[1], 0) }
}

/// One element per row of a contiguous `[v, r]` f32 tensor: `x[idx[j], j]`
/// for i32 indices `idx` of shape `[1, r]`, as `[1, r]`.
///
/// # Safety
/// `x` is contiguous `[v, r]`, `idx` holds values below `v`; `c` is live.
unsafe fn gather(
    c: *mut sys::ggml_context,
    x: *mut sys::ggml_tensor,
    idx: *mut sys::ggml_tensor,
    v: i64,
    r: i64,
) -> *mut sys::ggml_tensor {
    // SAFETY: guaranteed by the caller; as rows of one element, batched
    // by column, `ggml_get_rows` picks one element per column.
    unsafe {
        let rows = sys::ggml_reshape_3d(c, x, 1, v, r);
        let picked = sys::ggml_get_rows(c, rows, sys::ggml_reshape_2d(c, idx, 1, r));
        sys::ggml_reshape_2d(c, picked, 1, r)
    }
}

/// Softmax parts of each row of a contiguous `[v, r]` f32 tensor.
struct RowStats {
    /// Argmax per row, `[1, r]` i32.
    argmax_2d: *mut sys::ggml_tensor,
    /// Row max `[1, r]`.
    max: *mut sys::ggml_tensor,
    /// `exp(x - max)`, `[v, r]`.
    exps: *mut sys::ggml_tensor,
    /// Their sum `[1, r]`.
    sum: *mut sys::ggml_tensor,
    /// `max + log(sum)`, `[1, r]`.
    lse: *mut sys::ggml_tensor,
}

impl RowStats {
    /// # Safety
    /// `x` is contiguous `[v, r]` f32; `c` is live.
    unsafe fn of(c: *mut sys::ggml_context, x: *mut sys::ggml_tensor, v: i64, r: i64) -> RowStats {
        // SAFETY: guaranteed by the caller; the argmax indices lie below v.
        unsafe {
            let argmax_2d = sys::ggml_reshape_2d(c, sys::ggml_argmax(c, x), 1, r);
            let max = gather(c, x, argmax_2d, v, r);
            let exps = sys::ggml_exp(c, sys::ggml_sub(c, x, max));
            let sum = sys::ggml_sum_rows(c, exps);
            let lse = sys::ggml_add(c, max, sys::ggml_log(c, sum));
            RowStats {
                argmax_2d,
                max,
                exps,
                sum,
                lse,
            }
        }
    }
}
