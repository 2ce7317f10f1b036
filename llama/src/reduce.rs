//! On-device reductions of observed graph tensors: small ggml graphs run on
//! the backend that holds the tensor, reading it in place, so only their
//! results cross to the host.
//!
//! Inside the eval callback the scheduler has synchronised its backend, so
//! the observed tensor's buffer holds its values; each reduction here runs
//! to completion (a synchronous graph computation) before the callback
//! returns, while the graph allocator cannot yet reuse that memory. Nothing
//! reads `tensor->data` on the host: the same code runs on CPU and GPU
//! backends. Importance-matrix sums accumulate in device tensors across the
//! micro-batches of one chunk and are read (and zeroed) once per chunk.

use super::backend::{expect_type, CpuThreads, Devices, Graph, Owned, ReduceError};
use super::TensorRef;
use llama_cpp_sys_2 as sys;
use std::collections::BTreeMap;

/// One weight's importance sums over the current chunk, on its device.
struct Accumulator {
    device: usize,
    mem: Owned,
    /// Sums of squares `[n_in, n_mat]`.
    sums2: *mut sys::ggml_tensor,
    /// Sums `[n_in, n_mat]`.
    sums: *mut sys::ggml_tensor,
    counts: *mut sys::ggml_tensor,
    n_in: usize,
    n_mat: usize,
    touched: bool,
}

/// A chunk's importance sums of one weight, read from the device.
pub struct ChunkSquares {
    /// Weight name.
    pub weight: String,
    /// Input width.
    pub n_in: usize,
    /// Matrices (experts) in the weight.
    pub n_mat: usize,
    /// Sums of squared inputs, `[n_mat][n_in]` row-major.
    pub sum2: Vec<f32>,
    /// Sums of inputs, same layout.
    pub sum: Vec<f32>,
    /// Rows (tokens, or token-slots for experts) counted per matrix.
    pub counts: Vec<f32>,
}

/// Where the experts of a stacked-expert matmul come from.
pub struct ExpertIds<'t, 'a> {
    /// The matmul's ids operand `[k, n_tokens]` (i32, values below `n_mat`).
    pub ids: &'t TensorRef<'a>,
    /// Matrices in the stacked weight.
    pub n_mat: usize,
}

/// Runs reductions on the backends of observed tensors; see the module doc.
pub struct Reducer {
    devices: Devices,
    /// `n x n` identity matrices by (device, `n`): one-hot rows for expert ids.
    identities: BTreeMap<(usize, usize), (Owned, *mut sys::ggml_tensor)>,
    accumulators: BTreeMap<String, Accumulator>,
    /// Routers copied to a device for [`Reducer::router_top_n`], by
    /// (device, the caller's key): weight, norm, bias, selection bias.
    routers: BTreeMap<(usize, u32), DeviceRouter>,
}

/// A router's tensors on one device and the memory holding them.
type DeviceRouter = (Owned, Vec<*mut sys::ggml_tensor>);

/// A router in f32 on the host, for [`Reducer::router_top_n`].
pub struct RouterWeights<'a> {
    /// Names this router among the caller's (its copy on a device is kept).
    pub key: u32,
    /// `n_expert` rows of `n_embd` weights.
    pub weight: &'a [f32],
    /// The router input's RMS-norm weight (`n_embd`) and epsilon.
    pub norm: &'a [f32],
    /// The norm's epsilon.
    pub eps: f32,
    /// The router's own bias on its logits (`n_expert`).
    pub bias: Option<&'a [f32]>,
    /// The selection bias added to the gating values before ranking.
    pub selection_bias: Option<&'a [f32]>,
}

/// What [`Reducer::router_top_n`] ranks: which tokens, through which
/// router, how its logits are gated and grouped, and how many experts are
/// kept per token.
pub struct RouterQuery<'a> {
    /// The router.
    pub router: RouterWeights<'a>,
    /// The tokens (rows of the residual stream) ranked.
    pub rows: &'a [i32],
    /// The gating function.
    pub gating: RouterGating,
    /// Grouped selection (`n_group`, `n_group_used`), if the model has it.
    pub groups: Option<(usize, usize)>,
    /// Experts kept per token.
    pub top_n: usize,
}

/// The gating function a device ranking applies to router logits.
#[derive(Clone, Copy, Debug)]
pub enum RouterGating {
    /// Softmax over all experts.
    Softmax,
    /// A sigmoid per expert.
    Sigmoid,
    /// `sqrt(softplus(logit))` per expert.
    SqrtSoftplus,
}

// SAFETY: the reducer's ggml objects are used by one thread at a time (every
// method takes &mut self) and ggml backends may move between threads.
unsafe impl Send for Reducer {}

impl Reducer {
    /// A reducer with no device started yet.
    pub fn new() -> Reducer {
        Reducer {
            devices: Devices::new(CpuThreads::One),
            identities: BTreeMap::new(),
            routers: BTreeMap::new(),
            accumulators: BTreeMap::new(),
        }
    }

    /// Bytes copied from backends to the host so far.
    pub fn bytes_read(&self) -> u64 {
        self.devices.bytes_read()
    }

    /// The `n x n` identity on device `d` (made on first use).
    fn identity(&mut self, d: usize, n: usize) -> Result<*mut sys::ggml_tensor, ReduceError> {
        if let Some((_, t)) = self.identities.get(&(d, n)) {
            return Ok(*t);
        }
        let shape = (sys::GGML_TYPE_F32, [n as i64, n as i64]);
        let (mem, tensors) = Owned::alloc(self.devices.backend(d), &[shape])?;
        let mut eye = vec![0f32; n * n];
        for i in 0..n {
            eye[i * n + i] = 1.0;
        }
        // SAFETY: the tensor was just allocated with n*n f32 values.
        unsafe {
            sys::ggml_backend_tensor_set(tensors[0], eye.as_ptr().cast(), 0, n * n * 4);
        }
        self.identities.insert((d, n), (mem, tensors[0]));
        Ok(tensors[0])
    }

    /// The values of an f32 tensor of any strides, compacted on the device
    /// (fastest dimension first).
    pub fn compact_f32(&mut self, t: &TensorRef<'_>) -> Result<Vec<f32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_F32)?;
        let d = self.devices.of(t)?;
        let g = Graph::new()?;
        let out = g.observed(t);
        self.devices.compute(d, &g, &[out])?;
        Ok(self.devices.read_f32(out))
    }

    /// The values of an i32 tensor of any strides (a view such as
    /// `ffn_moe_topk`), compacted on the device.
    pub fn compact_i32(&mut self, t: &TensorRef<'_>) -> Result<Vec<i32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_I32)?;
        let d = self.devices.of(t)?;
        let g = Graph::new()?;
        let out = g.observed(t);
        self.devices.compute(d, &g, &[out])?;
        Ok(self.devices.read_i32(out))
    }

    /// The L2 norm and the largest element of every row (dimension 0) of
    /// an f32 tensor, in one graph: `sqrt(sum_rows(sqr(t)))` and a max pool
    /// over the whole row, one value each per row in row order. The
    /// maximum is an element itself, so it equals the host's bit for bit.
    pub fn row_norms_and_maxima(
        &mut self,
        t: &TensorRef<'_>,
    ) -> Result<(Vec<f32>, Vec<f32>), ReduceError> {
        expect_type(t, sys::GGML_TYPE_F32)?;
        let width = i32::try_from(t.ne()[0])
            .map_err(|_| ReduceError::Shape(format!("{}: rows too wide", t.name())))?;
        let d = self.devices.of(t)?;
        let g = Graph::new()?;
        // SAFETY: unary ops on tensors of our context (`observed` is
        // contiguous, as both backends' max pool requires).
        let (norms, maxima) = unsafe {
            let x = g.observed(t);
            let norms = sys::ggml_sqrt(
                g.ctx(),
                sys::ggml_sum_rows(g.ctx(), sys::ggml_sqr(g.ctx(), x)),
            );
            let maxima = sys::ggml_pool_1d(g.ctx(), x, sys::GGML_OP_POOL_MAX, width, width, 0);
            (norms, maxima)
        };
        self.devices.compute(d, &g, &[norms, maxima])?;
        Ok((self.devices.read_f32(norms), self.devices.read_f32(maxima)))
    }

    /// Column sums of a `[n, n_tokens]` f32 tensor weighted per token:
    /// `out[c][i] = sum_t t[i, t] * weights[t][c]` for `n_cols` columns
    /// (`weights` row-major by token), `[n_cols][n]` row-major.
    pub fn weighted_sums(
        &mut self,
        t: &TensorRef<'_>,
        weights: &[f32],
        n_cols: usize,
    ) -> Result<Vec<f32>, ReduceError> {
        expect_type(t, sys::GGML_TYPE_F32)?;
        let ne = t.ne();
        if ne[2] != 1 || ne[3] != 1 || weights.len() != ne[1] * n_cols {
            return Err(ReduceError::Shape(format!(
                "{}: weighted sums of shape {ne:?} with {} weights for {n_cols} columns",
                t.name(),
                weights.len()
            )));
        }
        let d = self.devices.of(t)?;
        let mut g = Graph::new()?;
        let w = g.input([n_cols as i64, ne[1] as i64, 1], weights);
        // SAFETY: an outer product of two tensors of our context.
        let out = unsafe { sys::ggml_out_prod(g.ctx(), g.observed(t), w) };
        self.devices.compute(d, &g, &[out])?;
        Ok(self.devices.read_f32(out))
    }

    /// Adds the squares and the values of a matmul input `x` over the tokens
    /// where `mask` is 1 to the device accumulators of `weight`, with row
    /// counts:
    /// for a dense weight `x` is `[n_in, n_tokens]`; for stacked experts `x`
    /// is `[n_in, 1 or k, n_tokens]` and each (token, slot) counts for the
    /// expert its id selects.
    pub fn accumulate_squares(
        &mut self,
        weight: &str,
        x: &TensorRef<'_>,
        experts: Option<ExpertIds<'_, '_>>,
        mask: &[f32],
    ) -> Result<(), ReduceError> {
        expect_type(x, sys::GGML_TYPE_F32)?;
        let (xne, n_tokens) = (x.ne(), mask.len());
        let n_in = xne[0];
        let n_mat = experts.as_ref().map_or(1, |e| e.n_mat);
        let d = self.devices.of(x)?;
        let mut g = Graph::new()?;
        let shape_err = || {
            ReduceError::Shape(format!(
                "{weight}: input {} of shape {xne:?} for {n_tokens} tokens",
                x.name()
            ))
        };
        let (contrib2, contrib, counts) = match &experts {
            None => {
                if xne[1] != n_tokens || xne[2] != 1 || xne[3] != 1 {
                    return Err(shape_err());
                }
                let per_token = g.input([1, n_tokens as i64, 1], mask);
                let as_row = g.input([n_tokens as i64, 1, 1], mask);
                // SAFETY: ops on tensors of our context.
                unsafe {
                    let x = g.observed(x);
                    let sq = sys::ggml_sqr(g.ctx(), x);
                    (
                        sys::ggml_out_prod(g.ctx(), sq, per_token),
                        sys::ggml_out_prod(g.ctx(), x, per_token),
                        sys::ggml_sum_rows(g.ctx(), as_row),
                    )
                }
            }
            Some(e) => {
                expect_type(e.ids, sys::GGML_TYPE_I32)?;
                let ine = e.ids.ne();
                let k = ine[0];
                if ine[1] != n_tokens
                    || ine[2] != 1
                    || xne[2] != n_tokens
                    || xne[3] != 1
                    || (xne[1] != 1 && xne[1] != k)
                {
                    return Err(shape_err());
                }
                if self.devices.of(e.ids)? != d {
                    return Err(ReduceError::Shape(format!(
                        "{weight}: input and expert ids live on different devices"
                    )));
                }
                let eye = self.identity(d, e.n_mat)?;
                let m = g.input([1, 1, n_tokens as i64], mask);
                let (k, t, n, n_in) = (k as i64, n_tokens as i64, e.n_mat as i64, n_in as i64);
                // SAFETY: ops on tensors of our context, the identity and
                // the observed ids (validated by the caller to lie below
                // n_mat, as ggml_get_rows requires).
                unsafe {
                    let c = g.ctx();
                    // One-hot rows [n, k, T] of the selected experts, zero on
                    // masked tokens.
                    let ids = sys::ggml_reshape_1d(c, g.observed(e.ids), k * t);
                    let rows = sys::ggml_reshape_3d(c, sys::ggml_get_rows(c, eye, ids), n, k, t);
                    let hot = sys::ggml_mul(c, rows, m);
                    let xs = g.observed(x);
                    let sq = sys::ggml_sqr(c, xs);
                    let (rows_of_x, b) = if xne[1] == 1 {
                        // One input row per token, shared by its k slots:
                        // sum the one-hot rows over the slots.
                        let per_token = sys::ggml_cont(c, sys::ggml_permute(c, hot, 1, 0, 2, 3));
                        let summed = sys::ggml_sum_rows(c, per_token);
                        (t, sys::ggml_reshape_2d(c, summed, n, t))
                    } else {
                        (k * t, sys::ggml_reshape_2d(c, hot, n, k * t))
                    };
                    let a2 = sys::ggml_reshape_2d(c, sq, n_in, rows_of_x);
                    let a1 = sys::ggml_reshape_2d(c, xs, n_in, rows_of_x);
                    let per_expert = sys::ggml_cont(c, sys::ggml_transpose(c, b));
                    (
                        sys::ggml_out_prod(c, a2, b),
                        sys::ggml_out_prod(c, a1, b),
                        sys::ggml_sum_rows(c, per_expert),
                    )
                }
            }
        };
        let acc = self.accumulator(d, weight, n_in, n_mat)?;
        let (sums2, sums, counts_acc) = (acc.sums2, acc.sums, acc.counts);
        acc.touched = true;
        // SAFETY: in-place adds into the accumulator tensors (same shapes:
        // [n_in, n_mat] twice and [1, n_mat]).
        let outputs = unsafe {
            [
                sys::ggml_add_inplace(g.ctx(), sums2, contrib2),
                sys::ggml_add_inplace(g.ctx(), sums, contrib),
                sys::ggml_add_inplace(g.ctx(), counts_acc, counts),
            ]
        };
        self.devices.compute(d, &g, &outputs)
    }

    /// The accumulator of `weight`, made on device `d` on first use.
    fn accumulator(
        &mut self,
        d: usize,
        weight: &str,
        n_in: usize,
        n_mat: usize,
    ) -> Result<&mut Accumulator, ReduceError> {
        if !self.accumulators.contains_key(weight) {
            let f32 = sys::GGML_TYPE_F32;
            let sums = (f32, [n_in as i64, n_mat as i64]);
            let (mem, t) = Owned::alloc(
                self.devices.backend(d),
                &[sums, sums, (f32, [1, n_mat as i64])],
            )?;
            self.accumulators.insert(
                weight.to_string(),
                Accumulator {
                    device: d,
                    mem,
                    sums2: t[0],
                    sums: t[1],
                    counts: t[2],
                    n_in,
                    n_mat,
                    touched: false,
                },
            );
        }
        let acc = self.accumulators.get_mut(weight).expect("inserted above");
        if acc.device != d || acc.n_in != n_in || acc.n_mat != n_mat {
            return Err(ReduceError::Shape(format!(
                "{weight}: input [{n_in}] x {n_mat} matrices on device {d}, earlier [{}] x {} on device {}",
                acc.n_in, acc.n_mat, acc.device
            )));
        }
        Ok(acc)
    }

    /// Reads and zeroes every accumulator touched since the last call (one
    /// chunk's sums), in weight-name order.
    pub fn take_chunk(&mut self) -> Vec<ChunkSquares> {
        let touched: Vec<String> = self
            .accumulators
            .iter()
            .filter(|(_, a)| a.touched)
            .map(|(name, _)| name.clone())
            .collect();
        let mut out = Vec::with_capacity(touched.len());
        for weight in touched {
            let (sums2, sums, counts, n_in, n_mat) = {
                let a = &self.accumulators[&weight];
                (a.sums2, a.sums, a.counts, a.n_in, a.n_mat)
            };
            let sum2 = self.devices.read_f32(sums2);
            let sum = self.devices.read_f32(sums);
            let counts = self.devices.read_f32(counts);
            let a = self.accumulators.get_mut(&weight).expect("listed above");
            a.touched = false;
            // SAFETY: the accumulator's own buffer; no graph is in flight.
            unsafe { sys::ggml_backend_buffer_clear(a.mem.buffer.as_ptr(), 0) };
            out.push(ChunkSquares {
                weight,
                n_in,
                n_mat,
                sum2,
                sum,
                counts,
            });
        }
        out
    }

    /// The top `q.top_n` experts of router `q.router` and their gating
    /// values for the tokens `q.rows` of the residual stream `t`
    /// (`[n_embd, n_tokens]` f32), computed on `t`'s backend: RMS norm,
    /// router product, bias, gating, selection bias, a descending argsort;
    /// only the ids `[top_n, rows]` and values `[top_n, rows]` are copied to
    /// the host. With `q.groups` (`n_group`, `n_group_used`), the experts of
    /// the groups whose two best selection scores add up highest rank first,
    /// then the others, as the host's ranking and llama.cpp's grouped
    /// selection do.
    pub fn router_top_n(
        &mut self,
        t: &TensorRef<'_>,
        q: &RouterQuery<'_>,
    ) -> Result<(Vec<i32>, Vec<f32>), ReduceError> {
        let (r, rows, gating) = (&q.router, q.rows, q.gating);
        expect_type(t, sys::GGML_TYPE_F32)?;
        let (n_embd, n_tokens) = (t.ne()[0], t.ne()[1]);
        let n_expert = r.weight.len() / n_embd.max(1);
        if r.weight.len() != n_expert * n_embd || r.norm.len() != n_embd || q.top_n == 0 {
            return Err(ReduceError::Shape(format!(
                "{}: router of {} weights and norm of {} for [{n_embd}, {n_tokens}]",
                t.name(),
                r.weight.len(),
                r.norm.len()
            )));
        }
        if rows.iter().any(|&i| i < 0 || i as usize >= n_tokens) {
            return Err(ReduceError::Shape(format!(
                "{}: a row past {n_tokens}",
                t.name()
            )));
        }
        let top_n = q.top_n.min(n_expert);
        let groups = q.groups.filter(|&(n, used)| n > 1 && used > 0);
        if let Some((n, _)) = groups.filter(|&(n, _)| !n_expert.is_multiple_of(n)) {
            return Err(ReduceError::Shape(format!(
                "{}: {n_expert} experts do not split into {n} routing groups",
                t.name()
            )));
        }
        let d = self.devices.of(t)?;
        let w = self.router_on(d, r, n_embd, n_expert)?;
        let mut g = Graph::new()?;
        let idx = g.input_i32([rows.len() as i64, 1, 1], rows);
        let x = g.observed(t);
        // SAFETY: nodes of our graph context over tensors that live until
        // the computation below ends (the observed tensor during the
        // callback, the router copies in `self.routers`).
        let ranked = unsafe {
            let ctx = g.ctx();
            let xs = sys::ggml_get_rows(ctx, x, idx);
            let xn = sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, xs, r.eps), w[1]);
            let mut logits = sys::ggml_mul_mat(ctx, w[0], xn);
            if r.bias.is_some() {
                logits = sys::ggml_add(ctx, logits, w[2]);
            }
            let probs = match gating {
                RouterGating::Softmax => sys::ggml_soft_max(ctx, logits),
                RouterGating::Sigmoid => sys::ggml_sigmoid(ctx, logits),
                RouterGating::SqrtSoftplus => sys::ggml_sqrt(ctx, sys::ggml_softplus(ctx, logits)),
            };
            let sel = match r.selection_bias {
                Some(_) => sys::ggml_add(ctx, probs, w[3]),
                None => probs,
            };
            let n_rows = rows.len() as i64;
            let p3 = sys::ggml_reshape_3d(ctx, probs, 1, n_expert as i64, n_rows);
            // (scores to rank, how many) per part: the chosen groups' experts
            // first, then the others, each its own argsort.
            let parts = match groups {
                None => vec![(sel, top_n)],
                Some((n_group, used)) => {
                    let per = n_expert / n_group;
                    let (n_g, per_i) = (n_group as i64, per as i64);
                    let sg = sys::ggml_reshape_3d(ctx, sel, per_i, n_g, n_rows);
                    let two = per.min(2);
                    let best = sys::ggml_cont(ctx, sys::ggml_argsort_top_k(ctx, sg, two as i32));
                    let one_col = sys::ggml_reshape_4d(ctx, sg, 1, per_i, n_g, n_rows);
                    let best = sys::ggml_get_rows(ctx, one_col, best);
                    let best = sys::ggml_reshape_3d(ctx, best, two as i64, n_g, n_rows);
                    let sums =
                        sys::ggml_reshape_2d(ctx, sys::ggml_sum_rows(ctx, best), n_g, n_rows);
                    let used = used.min(n_group);
                    let chosen =
                        sys::ggml_cont(ctx, sys::ggml_argsort_top_k(ctx, sums, used as i32));
                    // Each set_rows writes into its own fresh destination
                    // (-inf everywhere, or a copy of the scores), so no
                    // tensor another node reads is changed in place.
                    let all_out = sys::ggml_scale_bias(ctx, sg, 0.0, f32::NEG_INFINITY);
                    let kept = sys::ggml_get_rows(ctx, sg, chosen);
                    let inside = sys::ggml_set_rows(ctx, all_out, kept, chosen);
                    let scores = sys::ggml_scale_bias(ctx, sg, 1.0, 0.0);
                    let erased = sys::ggml_get_rows(
                        ctx,
                        sys::ggml_scale_bias(ctx, sg, 0.0, f32::NEG_INFINITY),
                        chosen,
                    );
                    let outside = sys::ggml_set_rows(ctx, scores, erased, chosen);
                    let n_in = (used * per).min(top_n);
                    let flat = |x| sys::ggml_reshape_2d(ctx, x, n_expert as i64, n_rows);
                    let mut parts = vec![(flat(inside), n_in)];
                    if top_n > n_in {
                        parts.push((flat(outside), top_n - n_in));
                    }
                    parts
                }
            };
            parts
                .into_iter()
                .map(|(scores, n)| {
                    let ids = sys::ggml_cont(ctx, sys::ggml_argsort_top_k(ctx, scores, n as i32));
                    (n, ids, sys::ggml_get_rows(ctx, p3, ids))
                })
                .collect::<Vec<_>>()
        };
        let outputs: Vec<_> = ranked.iter().flat_map(|&(_, i, p)| [i, p]).collect();
        self.devices.compute(d, &g, &outputs)?;
        let read: Vec<(usize, Vec<i32>, Vec<f32>)> = ranked
            .iter()
            .map(|&(n, i, p)| (n, self.devices.read_i32(i), self.devices.read_f32(p)))
            .collect();
        // Row by row, the chosen groups' part and then the others'.
        let (mut out_ids, mut out_probs) = (Vec::new(), Vec::new());
        for row in 0..rows.len() {
            for (n, i, p) in &read {
                out_ids.extend_from_slice(&i[row * n..(row + 1) * n]);
                out_probs.extend_from_slice(&p[row * n..(row + 1) * n]);
            }
        }
        Ok((out_ids, out_probs))
    }

    /// Router `r`'s tensors on device `d` (copied on first use): weight
    /// `[n_embd, n_expert]`, norm, bias and selection bias (zeros if none).
    fn router_on(
        &mut self,
        d: usize,
        r: &RouterWeights<'_>,
        n_embd: usize,
        n_expert: usize,
    ) -> Result<Vec<*mut sys::ggml_tensor>, ReduceError> {
        if let Some((_, t)) = self.routers.get(&(d, r.key)) {
            return Ok(t.clone());
        }
        let f32s = sys::GGML_TYPE_F32;
        let shapes = [
            (f32s, [n_embd as i64, n_expert as i64]),
            (f32s, [n_embd as i64, 1]),
            (f32s, [n_expert as i64, 1]),
            (f32s, [n_expert as i64, 1]),
        ];
        let (mem, tensors) = Owned::alloc(self.devices.backend(d), &shapes)?;
        let zeros = vec![0f32; n_expert];
        let values = [
            r.weight,
            r.norm,
            r.bias.unwrap_or(&zeros),
            r.selection_bias.unwrap_or(&zeros),
        ];
        for (t, v) in tensors.iter().zip(values) {
            // SAFETY: each tensor was just allocated with `v.len()` f32s.
            unsafe { sys::ggml_backend_tensor_set(*t, v.as_ptr().cast(), 0, v.len() * 4) };
        }
        self.routers.insert((d, r.key), (mem, tensors.clone()));
        Ok(tensors)
    }
}

impl Default for Reducer {
    fn default() -> Self {
        Reducer::new()
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // Accumulators and identities live in device buffers: free them
        // before the devices (dropped after this, as a field).
        self.accumulators.clear();
        self.identities.clear();
    }
}
