//! Lookahead guesses (issue #56, DESIGN section 7): for a traced token at
//! MoE layer `L`, the experts that layer `L + d`'s router would choose on
//! the residual stream after layer `L` (llama.cpp's graph tensor `l_out-L`:
//! the input of block `L + 1`, before its attention, the "pre-attention"
//! signal). The state goes through layer `L + d`'s own router input norm
//! (`rms_norm(x) * w`, the norm whose output the router reads in the graph:
//! `ffn_norm` in most families, `post_attention_norm` in glm4moe and
//! gpt-oss), its router matrix (and bias), its gating function, selection
//! bias and groups ([`super::gating`], as the trace's own top-N), so the
//! first `k` guesses are what the router would select on that state.
//!
//! The router weights are read from the GGUF once, at load, and converted
//! to f32 (`n_expert x n_embd` floats per MoE layer: 4 MiB at 512 x 2,048).

use super::device::DeviceReads;
use super::gating::{activate, Ranker};
use super::probe::RouterInput;
use llama::simd::{block_product, BLOCK};
use llama::{to_f32, RouterGating, RouterQuery, RouterWeights, TensorRef};
use numbers::routing::ExpertGroups;
use numbers::stats::MoeShape;
use numbers::Gating;
use runfiles::trace::Lookahead;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// One MoE layer's router, in f32.
struct LayerRouter {
    /// `n_expert` rows of `n_embd` weights.
    weight: Vec<f32>,
    /// The router's own bias on its logits.
    bias: Option<Vec<f32>>,
    /// The input norm's weight.
    norm: Vec<f32>,
    /// The input norm's epsilon.
    eps: f32,
    /// The selection bias (`exp_probs_b`).
    selection_bias: Option<Vec<f32>>,
}

/// Every MoE layer's router and the distances guessed ahead.
pub struct Routers {
    distances: Vec<u8>,
    layers: BTreeMap<u32, LayerRouter>,
    n_embd: usize,
    n_expert: usize,
    gating: Gating,
    groups: Option<ExpertGroups>,
    top_n: usize,
}

impl Routers {
    /// Reads the routers of the MoE layers some traced layer guesses
    /// (`L + d` for a MoE layer `L` and `d` in `distances`) from the model
    /// file(s) at `path`; `routers` is what the probe saw each router read.
    pub fn load(
        path: &Path,
        shape: &MoeShape,
        routers: &BTreeMap<u32, RouterInput>,
        distances: &[u8],
        top_n: usize,
    ) -> Result<Routers, String> {
        let joined = gguf::split::open_joined(path).map_err(|e| e.to_string())?;
        let mut reader = TensorReader {
            joined,
            files: BTreeMap::new(),
        };
        let n_expert = shape.n_expert as usize;
        let mut layers = BTreeMap::new();
        let mut n_embd = 0;
        let targets = shape
            .moe_layers
            .iter()
            .flat_map(|&l| distances.iter().map(move |&d| l + u32::from(d)))
            .filter(|t| shape.moe_layers.contains(t))
            .collect::<std::collections::BTreeSet<u32>>();
        for target in targets {
            let input = routers.get(&target).ok_or_else(|| {
                format!("lookahead: the graph shows no router (ffn_moe_logits-{target}) for MoE block {target}")
            })?;
            let (norm_name, eps) = input.norm.clone().map_err(|what| {
                format!(
                    "lookahead: the router of block {target} reads {what}, not rms_norm(x) * w; \
                     turn lookahead off ([run] trace_lookahead = [], --trace-lookahead 0)"
                )
            })?;
            let (weight, dims) = reader.f32_tensor(&input.weight)?;
            if dims.len() < 2 || dims[1] as usize != n_expert {
                return Err(format!(
                    "lookahead: router {} has shape {dims:?}, expected [n_embd, {n_expert}]",
                    input.weight
                ));
            }
            let width = dims[0] as usize;
            if n_embd != 0 && width != n_embd {
                return Err(format!(
                    "lookahead: router {} reads {width} values, another block's {n_embd}",
                    input.weight
                ));
            }
            n_embd = width;
            let (norm, norm_dims) = reader.f32_tensor(&norm_name)?;
            if norm.len() != n_embd {
                return Err(format!(
                    "lookahead: norm {norm_name} has shape {norm_dims:?}, expected [{n_embd}]"
                ));
            }
            let bias = match &input.bias {
                None => None,
                Some(name) => {
                    let (b, dims) = reader.f32_tensor(name)?;
                    if b.len() != n_expert {
                        return Err(format!(
                            "lookahead: router bias {name} has shape {dims:?}, expected [{n_expert}]"
                        ));
                    }
                    Some(b)
                }
            };
            layers.insert(
                target,
                LayerRouter {
                    weight,
                    bias,
                    norm,
                    eps,
                    selection_bias: shape.routing.selection_bias.get(&target).cloned(),
                },
            );
        }
        let mut distances = distances.to_vec();
        distances.sort_unstable();
        distances.dedup();
        Ok(Routers {
            distances,
            layers,
            n_embd,
            n_expert,
            gating: shape.gating,
            groups: shape.routing.groups,
            top_n: top_n.min(n_expert),
        })
    }

    /// Whether a traced row of MoE layer `layer` gets any guess (so its
    /// `l_out` is worth reading).
    pub fn guesses_from(&self, layer: u32) -> bool {
        self.distances
            .iter()
            .any(|&d| self.layers.contains_key(&(layer + u32::from(d))))
    }

    /// Hidden size the routers read.
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// [`Routers::guesses`] computed on the backend holding `l_out` (the
    /// device path): per distance, the norm, router product, gating and
    /// ranking run there and only the top-N ids and gating values cross.
    /// `None` where the host must compute them (a backend that cannot run
    /// the graph).
    pub fn guesses_on_device(
        &self,
        layer: u32,
        t: &TensorRef<'_>,
        wanted: &[bool],
        device: &mut DeviceReads,
    ) -> Result<Option<Vec<Vec<Lookahead>>>, String> {
        let groups = self
            .groups
            .map(|g| (g.n_group as usize, g.n_group_used as usize));
        let gating = match self.gating {
            Gating::Softmax | Gating::SoftmaxWeight => RouterGating::Softmax,
            Gating::Sigmoid => RouterGating::Sigmoid,
            Gating::SqrtSoftplus => RouterGating::SqrtSoftplus,
        };
        let rows: Vec<i32> = (0..wanted.len())
            .filter(|&t| wanted[t])
            .map(|t| t as i32)
            .collect();
        let mut out: Vec<Vec<Lookahead>> = vec![Vec::new(); wanted.len()];
        if rows.is_empty() {
            return Ok(Some(out));
        }
        for &d in &self.distances {
            let target = layer + u32::from(d);
            let Some(r) = self.layers.get(&target) else {
                continue;
            };
            let query = RouterQuery {
                router: RouterWeights {
                    key: target,
                    weight: &r.weight,
                    norm: &r.norm,
                    eps: r.eps,
                    bias: r.bias.as_deref(),
                    selection_bias: r.selection_bias.as_deref(),
                },
                rows: &rows,
                gating,
                groups,
                top_n: self.top_n,
            };
            let Some((ids, probs)) = device.router_top_n(t, &query)? else {
                return Ok(None);
            };
            let n = self.top_n;
            for (j, &row) in rows.iter().enumerate() {
                let ids = &ids[j * n..(j + 1) * n];
                if let Some(e) = ids.iter().find(|&&e| e < 0 || e as usize >= self.n_expert) {
                    return Err(format!(
                        "lookahead: the device ranked expert {e} of {}",
                        self.n_expert
                    ));
                }
                out[row as usize].push(Lookahead {
                    distance: d,
                    ids: ids.iter().map(|&e| e as u16).collect(),
                    probs: probs[j * n..(j + 1) * n].to_vec(),
                });
            }
        }
        Ok(Some(out))
    }

    /// The guesses of every token of `states` (`n_embd` values each, the
    /// residual stream after layer `layer`) whose `wanted` flag is set; the
    /// others get none. One list per token, ascending by distance; a
    /// distance whose layer is not a MoE layer is left out (null).
    pub fn guesses(&self, layer: u32, states: &[f32], wanted: &[bool]) -> Vec<Vec<Lookahead>> {
        let n = self.n_embd;
        let mut out: Vec<Vec<Lookahead>> = vec![Vec::new(); wanted.len()];
        let tokens: Vec<usize> = (0..wanted.len()).filter(|&t| wanted[t]).collect();
        // Mean squares of the states, shared by every distance's norm.
        let mean_sq: Vec<f64> = tokens
            .iter()
            .map(|&t| {
                let x = &states[t * n..(t + 1) * n];
                x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64
            })
            .collect();
        let mut logits = vec![0f32; BLOCK * self.n_expert];
        let mut xt = vec![0f32; n * BLOCK];
        let mut row = vec![0f32; self.n_expert];
        let mut scores = vec![0f32; self.n_expert];
        let mut ranker = Ranker::default();
        for &d in &self.distances {
            let Some(r) = self.layers.get(&(layer + u32::from(d))) else {
                continue;
            };
            for (block, ms) in tokens.chunks(BLOCK).zip(mean_sq.chunks(BLOCK)) {
                // The block's normed states, interleaved: xt[i * BLOCK + j].
                xt.fill(0.0);
                for (j, (&t, &ms)) in block.iter().zip(ms).enumerate() {
                    let x = &states[t * n..(t + 1) * n];
                    let scale = (1.0 / (ms + f64::from(r.eps)).sqrt()) as f32;
                    for (i, (&v, &w)) in x.iter().zip(&r.norm).enumerate() {
                        xt[i * BLOCK + j] = v * scale * w;
                    }
                }
                block_product(&r.weight, &xt, n, &mut logits);
                for (j, &t) in block.iter().enumerate() {
                    for (v, l) in row.iter_mut().zip(logits.chunks_exact(BLOCK)) {
                        *v = l[j];
                    }
                    if let Some(b) = &r.bias {
                        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                    }
                    activate(self.gating, &mut row);
                    // The selection scores: probabilities plus the selection
                    // bias (added in f32, as ggml does).
                    let ranked_on = match &r.selection_bias {
                        Some(b) => {
                            for ((s, &p), &b) in scores.iter_mut().zip(&row).zip(b) {
                                *s = p + b;
                            }
                            &scores
                        }
                        None => &row,
                    };
                    let ids = ranker.ranked(ranked_on, self.groups, self.top_n);
                    let probs = ids.iter().map(|&e| row[e as usize]).collect();
                    out[t].push(Lookahead {
                        distance: d,
                        ids,
                        probs,
                    });
                }
            }
        }
        out
    }
}

/// Tensor data of a model in one or several files, read on demand.
struct TensorReader {
    joined: gguf::split::Joined,
    files: BTreeMap<usize, std::fs::File>,
}

impl TensorReader {
    /// Tensor `name` converted to f32, with its dimensions.
    fn f32_tensor(&mut self, name: &str) -> Result<(Vec<f32>, Vec<u64>), String> {
        let h = &self.joined.header;
        let Some(i) = h.tensors.iter().position(|t| t.name == name) else {
            return Err(format!("lookahead: the model has no tensor {name}"));
        };
        let (info, place) = (h.tensors[i].clone(), self.joined.places[i]);
        let path = &self.joined.files[place.file];
        let io =
            |e: std::io::Error| format!("lookahead: reading {name} from {}: {e}", path.display());
        let file = match self.files.entry(place.file) {
            std::collections::btree_map::Entry::Occupied(f) => f.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(std::fs::File::open(path).map_err(io)?)
            }
        };
        file.seek(SeekFrom::Start(place.offset)).map_err(io)?;
        let mut bytes = vec![0u8; info.n_bytes as usize];
        file.read_exact(&mut bytes).map_err(io)?;
        let values = to_f32(info.ggml_type, &bytes, info.n_elements() as usize)
            .map_err(|e| format!("lookahead: tensor {name}: {e}"))?;
        Ok((values, info.dims))
    }
}
