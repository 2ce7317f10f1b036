//! The eval-callback observer: reads the MoE routing tensors and the inputs of
//! every weight matmul, and turns them into per-chunk sums and trace rows.

use super::device::{DeviceReads, GroupSums};
use super::gating::{ranked, selection_scores, softmax_in_place};
use super::importance::ImportanceCache;
use super::kernels::{add_finite, extend_rows};
use super::lookahead::Routers;
use super::names::{parse_layer_node, parse_moe_node, weight_name, MoeNode};
use super::projector::Projector;
use super::scratch::ChunkScratch;
use super::strata::Strata;
use llama::{f32_at, f32s, i32_at, ElemType, GraphObserver, Op, TensorRef};
use numbers::routing::GateSite;
use numbers::stats::{routed_terms, MoeShape};
use numbers::{Gating, Split};
use runfiles::trace::{Lookahead, TraceRow};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the observer knows about the micro-batch being decoded.
pub struct UbatchInfo {
    /// Chunk id.
    pub chunk: u32,
    /// Position of the first token in the chunk.
    pub pos0: u32,
    /// Token ids of the micro-batch.
    pub tokens: Vec<i32>,
    /// (split, domain index) per token.
    pub labels: Vec<(Split, u16)>,
    /// Whether to write trace rows for these tokens.
    pub traced: bool,
    /// Whether these tokens count in the statistics and the imatrix
    /// (false for prompts and generated tokens of decode traces).
    pub measured: bool,
    /// The one split whose trace rows are kept, when the other's are
    /// dropped after the chunk (lookahead skips those tokens).
    pub trace_only: Option<Split>,
}

/// One MoE layer's routing tensors of the current micro-batch.
struct PendingLayer {
    layer: u32,
    n_tokens: usize,
    /// Per-token probabilities (empty when `group_probs` holds their sums).
    probs: Vec<f32>,
    /// Probability sums per token group, reduced on the device.
    group_probs: Option<GroupSums>,
    topk: Option<Vec<i32>>,
    weights: Option<Vec<f32>>,
    norms: Option<Vec<f32>>,
    /// Largest element of each (token, slot)'s expert output.
    maxima: Option<Vec<f32>>,
    /// Each (token, slot)'s projected expert output (`dim` values), when
    /// `[run] merge_projection` is on.
    projected: Vec<f64>,
}

/// Eval-callback state for one collection run.
pub struct Observer {
    n_expert: usize,
    k: usize,
    top_n: usize,
    moe_layers: Vec<u32>,
    /// `ffn_moe_probs` holds logits that become probabilities here
    /// (softmax over all experts: [`Gating::SoftmaxWeight`]).
    probs_are_logits: bool,
    /// The gate multiplies the expert input: `ffn_moe_down` is already the
    /// gated contribution, so REAP takes its norm without the gate.
    gate_on_input: bool,
    /// Per MoE block, the selection bias the trace's top-N is ranked with.
    selection_bias: BTreeMap<u32, Vec<f32>>,
    strata: Strata,
    ubatch: Option<UbatchInfo>,
    pending: Option<PendingLayer>,
    /// The current chunk's sums.
    pub scratch: ChunkScratch,
    /// Non-finite values dropped, per graph tensor name.
    pub drops: BTreeMap<String, u64>,
    /// Trace rows of traced chunks.
    pub trace: Vec<TraceRow>,
    /// MoE layers seen in the current micro-batch, in order.
    seen_layers: Vec<u32>,
    /// The first inconsistency met inside the callback.
    pub error: Option<String>,
    /// Weight names whose matmul inputs are dumped.
    dump_inputs: Vec<String>,
    /// Dumped inputs per (weight, chunk): rows of `n_in` values, one per token.
    pub dumps: BTreeMap<(String, u32), Vec<f32>>,
    /// Matmul input sums of the current micro-batch, shared by weights.
    inputs: ImportanceCache,
    /// The device path's reductions; `None` on the host path.
    device: Option<DeviceReads>,
    /// One router-probability row, reused for every (token, layer).
    row: Vec<f32>,
    /// Later layers' routers, when traces carry lookahead guesses.
    routers: Option<Arc<Routers>>,
    /// The guesses made from the last `l_out-L` read: (L, per token).
    ahead: Option<(u32, Vec<Vec<Lookahead>>)>,
    /// Projects expert outputs (`[run] merge_projection`); `None`: off.
    projector: Option<Projector>,
}

impl Observer {
    /// A fresh observer for a model with the given MoE shape.
    pub fn new(
        shape: &MoeShape,
        top_n: usize,
        strata: Strata,
        dump_inputs: Vec<String>,
        device: Option<DeviceReads>,
        routers: Option<Arc<Routers>>,
        projector: Option<Projector>,
    ) -> Self {
        let n_expert = shape.n_expert as usize;
        let n_layers = shape.moe_layers.len();
        Observer {
            n_expert,
            k: shape.n_expert_used as usize,
            top_n: top_n.min(n_expert),
            moe_layers: shape.moe_layers.clone(),
            probs_are_logits: shape.gating == Gating::SoftmaxWeight,
            gate_on_input: shape.routing.gate == GateSite::Input,
            selection_bias: shape.routing.selection_bias.clone(),
            strata,
            ubatch: None,
            pending: None,
            scratch: ChunkScratch::new(n_layers, n_expert),
            drops: BTreeMap::new(),
            trace: Vec::new(),
            seen_layers: Vec::new(),
            error: None,
            dump_inputs,
            dumps: BTreeMap::new(),
            inputs: ImportanceCache::default(),
            device,
            row: Vec::new(),
            routers,
            ahead: None,
            projector,
        }
    }

    /// Bytes the device path's reductions copied to the host (0 on the host path).
    pub fn device_bytes(&self) -> u64 {
        self.device.as_ref().map_or(0, DeviceReads::bytes_read)
    }

    /// Ends a chunk: moves its device-side importance sums into the scratch.
    pub fn end_chunk(&mut self) -> Result<(), String> {
        match self.device.as_mut() {
            Some(d) => d.finish_chunk(&mut self.scratch),
            None => Ok(()),
        }
    }

    /// Starts a micro-batch; token counts per group are known up front.
    pub fn begin_ubatch(&mut self, info: UbatchInfo) {
        if info.measured {
            for label in &info.labels {
                self.scratch.group(*label).n_tokens += 1;
            }
        }
        self.seen_layers.clear();
        self.ahead = None;
        self.inputs.begin_ubatch();
        if let Some(d) = self.device.as_mut() {
            d.begin_ubatch(&info.labels);
        }
        self.ubatch = Some(info);
    }

    /// Ends a micro-batch: flushes the last layer and checks that every MoE
    /// layer reported on every token.
    pub fn end_ubatch(&mut self) -> Result<(), String> {
        let flushed = self.flush();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        flushed?;
        if self.seen_layers != self.moe_layers {
            return Err(format!(
                "the graph reported MoE layers {:?}, the model metadata says {:?}",
                self.seen_layers, self.moe_layers
            ));
        }
        self.ubatch = None;
        Ok(())
    }

    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
    }

    fn moe(&mut self, node: MoeNode, layer: u32, t: &TensorRef<'_>) -> Result<(), String> {
        let Some((n_tokens, sums_only)) = self
            .ubatch
            .as_ref()
            .map(|u| (u.tokens.len(), u.measured && !u.traced))
        else {
            return Ok(());
        };
        if node == MoeNode::Probs {
            self.flush()?;
            let ne = t.ne();
            if ne[0] != self.n_expert || ne[1] != n_tokens || t.elem() != ElemType::F32 {
                return Err(format!(
                    "ffn_moe_probs-{layer} has shape {ne:?}, expected [{}, {n_tokens}] f32",
                    self.n_expert
                ));
            }
            let group_probs = match self.device.as_mut() {
                Some(d) if sums_only && !self.probs_are_logits => d.probs_by_group(t)?,
                _ => None,
            };
            let probs = match group_probs {
                Some(_) => Vec::new(),
                None if sums_only => {
                    self.add_prob_rows(t, layer, n_tokens);
                    Vec::new()
                }
                None => {
                    let mut probs = read_f32_2d(t, self.n_expert, n_tokens);
                    if self.probs_are_logits {
                        probs.chunks_mut(self.n_expert).for_each(softmax_in_place);
                    }
                    probs
                }
            };
            self.pending = Some(PendingLayer {
                layer,
                n_tokens,
                probs,
                group_probs,
                topk: None,
                weights: None,
                norms: None,
                maxima: None,
                projected: Vec::new(),
            });
            return Ok(());
        }
        let (k, n_expert) = (self.k, self.n_expert);
        let device = self.device.as_mut();
        let projector = self
            .projector
            .as_mut()
            .filter(|_| self.ubatch.as_ref().is_some_and(|u| u.measured));
        let Some(p) = self.pending.as_mut().filter(|p| p.layer == layer) else {
            return Err(format!(
                "{} arrived without ffn_moe_probs-{layer}",
                t.name()
            ));
        };
        let ne = t.ne();
        match node {
            MoeNode::TopK => {
                if ne[0] != k || ne[1] != p.n_tokens || t.elem() != ElemType::I32 {
                    return Err(format!(
                        "ffn_moe_topk-{layer} has shape {ne:?}, expected [{k}, {}] i32",
                        p.n_tokens
                    ));
                }
                if let Some(ids) = device.map(|d| d.expert_ids(t, n_expert)).transpose()? {
                    p.topk = ids;
                }
                if p.topk.is_none() {
                    let (bytes, nb) = (t.bytes(), t.nb());
                    let ids = (0..p.n_tokens)
                        .flat_map(|row| (0..k).map(move |j| (row, j)))
                        .map(|(row, j)| i32_at(&bytes, row * nb[1] + j * nb[0]))
                        .collect();
                    p.topk = Some(ids);
                }
            }
            MoeNode::Weights => {
                // [1, k, n_tokens] or [k, n_tokens]: k * n_tokens values either way.
                if ne.iter().product::<usize>() != k * p.n_tokens || t.elem() != ElemType::F32 {
                    return Err(format!(
                        "{} has shape {ne:?}, expected k*n_tokens = {}",
                        t.name(),
                        k * p.n_tokens
                    ));
                }
                if let Some(Some(w)) = device.map(|d| d.values(t)).transpose()? {
                    p.weights = Some(w);
                    return Ok(());
                }
                let (bytes, nb) = (t.bytes(), t.nb());
                let three_d = ne[0] == 1 && ne[1] == k && ne[2] == p.n_tokens;
                let (s_k, s_t) = if three_d {
                    (nb[1], nb[2])
                } else {
                    (nb[0], nb[1])
                };
                p.weights = Some(
                    (0..p.n_tokens)
                        .flat_map(|row| (0..k).map(move |j| row * s_t + j * s_k))
                        .map(|off| f32_at(&bytes, off))
                        .collect(),
                );
            }
            MoeNode::Down => {
                if ne[1] != k || ne[2] != p.n_tokens || t.elem() != ElemType::F32 {
                    return Err(format!(
                        "{} has shape {ne:?}, expected [n_embd, {k}, {}]",
                        t.name(),
                        p.n_tokens
                    ));
                }
                // The projection reads every row on the host, so it takes
                // the norms and maxima from them too.
                if projector.is_none() {
                    if let Some(Some((n, m))) =
                        device.map(|d| d.output_norms_and_maxima(t)).transpose()?
                    {
                        (p.norms, p.maxima) = (Some(n), Some(m));
                        return Ok(());
                    }
                }
                let (bytes, nb) = (t.bytes(), t.nb());
                let mut norms = Vec::with_capacity(k * p.n_tokens);
                let mut maxima = Vec::with_capacity(k * p.n_tokens);
                let mut projector = projector;
                // The last of `ffn_moe_down`, `_scaled` and `_biased` wins.
                p.projected.clear();
                if let Some(x) = projector.as_ref() {
                    p.projected.reserve(k * p.n_tokens * x.dim());
                }
                for row in 0..p.n_tokens {
                    for j in 0..k {
                        let base = row * nb[2] + j * nb[1];
                        let (sq, max) = squares_and_max(&bytes, base, nb[0], ne[0]);
                        norms.push(sq.sqrt() as f32);
                        maxima.push(max);
                        if let Some(x) = projector.as_mut() {
                            x.project_row(&bytes[base..], nb[0], ne[0], &mut p.projected);
                        }
                    }
                }
                (p.norms, p.maxima) = (Some(norms), Some(maxima));
            }
            MoeNode::Probs => unreachable!("handled above"),
        }
        Ok(())
    }

    /// Adds the router probabilities of a measured, untraced micro-batch
    /// straight into the chunk's sums, one row at a time through a reused
    /// buffer: only a traced micro-batch needs its rows again at the flush,
    /// so the others skip a copy of the whole tensor (1 MiB per layer at 512
    /// experts x 512 tokens). Every sum gets its addends in the same order
    /// as at the flush, so the results are the same bits.
    fn add_prob_rows(&mut self, t: &TensorRef<'_>, layer: u32, n_tokens: usize) {
        let (Some(li), Some(u)) = (
            self.moe_layers.iter().position(|&l| l == layer),
            self.ubatch.as_ref(),
        ) else {
            // The flush reports the unknown layer.
            return;
        };
        let (bytes, nb) = (t.bytes(), t.nb());
        let mut dropped = 0;
        for (tok, label) in u.labels.iter().enumerate().take(n_tokens) {
            self.row.clear();
            extend_rows(&mut self.row, &bytes[tok * nb[1]..], nb, self.n_expert, 1);
            if self.probs_are_logits {
                softmax_in_place(&mut self.row);
            }
            let sums = &mut self.scratch.group(*label).layers[li].prob;
            dropped += add_finite(sums, &self.row);
        }
        if dropped > 0 {
            *self
                .drops
                .entry(format!("ffn_moe_probs-{layer}"))
                .or_default() += dropped;
        }
    }

    /// Turns the pending layer into sums and trace rows.
    fn flush(&mut self) -> Result<(), String> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let Some(u) = self.ubatch.as_ref() else {
            return Ok(());
        };
        let (Some(topk), Some(weights), Some(norms), Some(maxima)) =
            (p.topk, p.weights, p.norms, p.maxima)
        else {
            return Err(format!(
                "MoE layer {} lacks topk, weights or expert outputs in the graph",
                p.layer
            ));
        };
        let Some(li) = self.moe_layers.iter().position(|&l| l == p.layer) else {
            return Err(format!(
                "graph has MoE layer {} that the model metadata does not list",
                p.layer
            ));
        };
        self.seen_layers.push(p.layer);
        let (n_expert, k) = (self.n_expert, self.k);
        if let Some(e) = topk.iter().find(|&&e| e < 0 || e as usize >= n_expert) {
            return Err(format!(
                "ffn_moe_topk-{} selected expert {e} of {n_expert}",
                p.layer
            ));
        }
        if u.traced {
            let bias = self.selection_bias.get(&p.layer).map(Vec::as_slice);
            let mut ahead = match self.routers.as_ref() {
                Some(r) if r.guesses_from(p.layer) => match self.ahead.take() {
                    Some((l, g)) if l == p.layer && g.len() == p.n_tokens => g,
                    _ => {
                        return Err(format!(
                            "lookahead: the graph gave no l_out-{} (the residual stream after \
                             MoE layer {}) before the layer's end",
                            p.layer, p.layer
                        ))
                    }
                },
                _ => Vec::new(),
            };
            for t in 0..p.n_tokens {
                let probs = &p.probs[t * n_expert..(t + 1) * n_expert];
                let (sel, w) = (&topk[t * k..(t + 1) * k], &weights[t * k..(t + 1) * k]);
                let picked = Picked {
                    selected: sel,
                    weights: w,
                    probs,
                    bias,
                };
                let mut row = trace_row(u, t, p.layer, &self.strata, &picked, self.top_n);
                if let Some(g) = ahead.get_mut(t) {
                    row.lookahead = std::mem::take(g);
                }
                self.trace.push(row);
            }
        }
        if !u.measured {
            return Ok(());
        }
        for (label, sums) in p.group_probs.iter().flatten() {
            let l = &mut self.scratch.group(*label).layers[li];
            for (a, &v) in l.prob.iter_mut().zip(sums) {
                *a += f64::from(v);
            }
        }
        // (expert, token x slot) of the routed outputs the projection adds.
        let mut projected: Vec<(usize, usize)> = Vec::new();
        for t in 0..p.n_tokens {
            let label = u.labels[t];
            let probs = p.probs.get(t * n_expert..(t + 1) * n_expert).unwrap_or(&[]);
            let group = self.scratch.group(label);
            let l = &mut group.layers[li];
            let dropped = add_finite(&mut l.prob, probs);
            if dropped > 0 {
                *self
                    .drops
                    .entry(format!("ffn_moe_probs-{}", p.layer))
                    .or_default() += dropped;
            }
            for j in 0..k {
                let e = topk[t * k + j] as usize;
                let (g, n) = (weights[t * k + j] as f64, norms[t * k + j] as f64);
                l.count[e] += 1;
                if !g.is_finite() {
                    *self
                        .drops
                        .entry(format!("ffn_moe_weights-{}", p.layer))
                        .or_default() += 1;
                    continue;
                }
                if !n.is_finite() {
                    *self
                        .drops
                        .entry(format!("ffn_moe_down-{}", p.layer))
                        .or_default() += 1;
                    continue;
                }
                // With the gate on the input, `n` is the norm of E(g x),
                // the expert's whole contribution: the gate is inside it.
                let r = if self.gate_on_input { n } else { g * n };
                for (sum, v) in l.routed.iter_mut().zip(routed_terms(g, n, r)) {
                    sum[e] += v;
                }
                l.ean_max[e] = l.ean_max[e].max(n);
                // A finite norm means every element is finite.
                l.act_max[e] = l.act_max[e].max(f64::from(maxima[t * k + j]));
                projected.push((e, t * k + j));
            }
            if let Some(dim) = self.projector.as_ref().map(Projector::dim) {
                let sums = self.scratch.projected(label.0, dim);
                for (e, slot) in projected.drain(..) {
                    let cell = (li * n_expert + e) * dim;
                    let row = &p.projected[slot * dim..(slot + 1) * dim];
                    for (a, v) in sums[cell..cell + dim].iter_mut().zip(row) {
                        *a += v;
                    }
                }
            }
            projected.clear();
        }
        Ok(())
    }

    /// The layer whose residual stream `name` is (`l_out-L`), when the
    /// current micro-batch is traced and a row of that MoE layer gets a
    /// guess: the only `l_out` tensors asked for.
    fn wanted_l_out(&self, name: &str) -> Option<u32> {
        let routers = self.routers.as_ref()?;
        self.ubatch.as_ref().filter(|u| u.traced)?;
        let (base, layer) = parse_layer_node(name)?;
        (base == "l_out" && self.moe_layers.contains(&layer) && routers.guesses_from(layer))
            .then_some(layer)
    }

    /// Reads `l_out-L` and makes the guesses of the micro-batch's kept tokens.
    fn l_out(&mut self, layer: u32, t: &TensorRef<'_>) -> Result<(), String> {
        let (Some(routers), Some(u)) = (self.routers.as_ref(), self.ubatch.as_ref()) else {
            return Ok(());
        };
        let (n, n_tokens) = (routers.n_embd(), u.tokens.len());
        let ne = t.ne();
        if ne[0] != n || ne[1] != n_tokens || t.elem() != ElemType::F32 {
            return Err(format!(
                "l_out-{layer} has shape {ne:?}, expected [{n}, {n_tokens}] f32"
            ));
        }
        let wanted: Vec<bool> = u
            .labels
            .iter()
            .map(|l| u.trace_only.is_none_or(|s| s == l.0))
            .collect();
        if let Some(device) = self.device.as_mut() {
            if let Some(g) = routers.guesses_on_device(layer, t, &wanted, device)? {
                self.ahead = Some((layer, g));
                return Ok(());
            }
        }
        let states = read_f32_2d(t, n, n_tokens);
        self.ahead = Some((layer, routers.guesses(layer, &states, &wanted)));
        Ok(())
    }

    fn imatrix(&mut self, t: &TensorRef<'_>) {
        let (Some(w), Some(x)) = (t.src(0), t.src(1)) else {
            return;
        };
        let name = weight_name(w.name()).to_string();
        let Some(u) = self.ubatch.as_ref().filter(|u| u.measured) else {
            return;
        };
        let fit: Vec<bool> = u.labels.iter().map(|l| l.0 == Split::Fit).collect();
        let chunk = u.chunk;
        if x.elem() != ElemType::F32 {
            return self.fail(format!("{name}: matmul input is not f32"));
        }
        let (xne, wne) = (x.ne(), w.ne());
        let n_mat = match t.op() {
            Op::MulMatId => wne[2],
            _ => wne[2] * wne[3],
        };
        if t.op() == Op::MulMat && self.dump_inputs.contains(&name) && xne[2] == 1 && xne[3] == 1 {
            let (xnb, bytes) = (x.nb(), x.bytes());
            let dump = self.dumps.entry((name.clone(), chunk)).or_default();
            for r in 0..xne[1] {
                dump.extend(f32s(&bytes[r * xnb[1]..r * xnb[1] + 4 * xne[0]]));
            }
        }
        if let Some(d) = self.device.as_mut() {
            match d.importance(&name, t, &x, n_mat, &fit) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => return self.fail(e),
            }
        }
        let entry = self.scratch.imatrix_entry(&name, xne[0], n_mat);
        self.inputs.add(t, &w, &x, &fit, entry);
    }
}

/// Sum of the squares of `n` f32 values at `base + i * stride`, in f64,
/// and their largest value (`-inf` for none; NaN is passed over, and the
/// sum, then not finite, drops the row).
///
/// Eight interleaved partial sums: one running sum is a chain of dependent
/// additions, and this runs for every (token, selected expert) of every
/// layer on the thread that ggml waits for.
fn squares_and_max(bytes: &[u8], base: usize, stride: usize, n: usize) -> (f64, f32) {
    let mut acc = [0f64; 8];
    let mut max = [f32::NEG_INFINITY; 8];
    let square = |v: f32| f64::from(v) * f64::from(v);
    if stride == 4 {
        let mut blocks = bytes[base..base + 4 * n].chunks_exact(4 * acc.len());
        for block in blocks.by_ref() {
            for ((a, m), v) in acc.iter_mut().zip(&mut max).zip(f32s(block)) {
                *a += square(v);
                *m = m.max(v);
            }
        }
        for v in f32s(blocks.remainder()) {
            acc[0] += square(v);
            max[0] = max[0].max(v);
        }
    } else {
        for i in 0..n {
            let v = f32_at(bytes, base + i * stride);
            acc[i % 8] += square(v);
            max[i % 8] = max[i % 8].max(v);
        }
    }
    (
        acc.iter().sum(),
        max.into_iter().fold(f32::NEG_INFINITY, f32::max),
    )
}

/// Reads a contiguous-rows `[cols, rows]` f32 tensor honouring its strides.
fn read_f32_2d(t: &TensorRef<'_>, cols: usize, rows: usize) -> Vec<f32> {
    let mut out = Vec::new();
    extend_rows(&mut out, &t.bytes(), t.nb(), cols, rows);
    out
}

/// One token's routing at one block, as the trace records it.
struct Picked<'a> {
    /// Selected expert ids (`ffn_moe_topk`).
    selected: &'a [i32],
    /// Their gate weights.
    weights: &'a [f32],
    /// Router probabilities of every expert.
    probs: &'a [f32],
    /// The block's selection bias, if it has one.
    bias: Option<&'a [f32]>,
}

/// One trace row: the selection, its gate weights and the router's top-N
/// in the order llama.cpp selects on (probability plus selection bias).
fn trace_row(
    u: &UbatchInfo,
    t: usize,
    layer: u32,
    strata: &Strata,
    p: &Picked<'_>,
    top_n: usize,
) -> TraceRow {
    let order = ranked(&selection_scores(p.probs, p.bias), None, top_n);
    TraceRow {
        split: u.labels[t].0,
        domain: strata.domain(u.labels[t].1).to_string(),
        chunk: u.chunk,
        pos: u.pos0 + t as u32,
        token_id: u.tokens[t],
        layer,
        selected: p.selected.iter().map(|&e| e as u16).collect(),
        selected_weight: p.weights.to_vec(),
        topn_prob: order.iter().map(|&e| p.probs[e as usize]).collect(),
        lookahead: Vec::new(),
        topn_id: order,
    }
}

impl GraphObserver for Observer {
    fn wants(&mut self, t: &TensorRef<'_>) -> bool {
        match t.op() {
            Op::MulMatId => true,
            Op::MulMat => t
                .src(0)
                .is_some_and(|w| weight_name(w.name()).starts_with("blk.")),
            Op::Other => {
                parse_moe_node(t.name()).is_some() || self.wanted_l_out(t.name()).is_some()
            }
        }
    }

    fn observe(&mut self, t: &TensorRef<'_>) {
        if let Some(layer) = self.wanted_l_out(t.name()) {
            if let Err(e) = self.l_out(layer, t) {
                self.fail(e);
            }
        }
        if let Some((node, layer)) = parse_moe_node(t.name()) {
            if let Err(e) = self.moe(node, layer, t) {
                self.fail(e);
            }
        }
        if matches!(t.op(), Op::MulMat | Op::MulMatId) {
            self.imatrix(t);
        }
    }
}
