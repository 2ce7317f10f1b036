//! What replay reads from a run before touching a trace layer: the number of
//! experts, expert sizes from the model, keep maps and the trace parts.

use super::results::TraceKind;
use super::trace_io::TraceSet;
use crate::ReplayError;
use numbers::routing::Routing;
use numbers::Gating;
use runfiles::file_error::FileError;
use runfiles::keepmap::{KeepMap, KeepMapRef};
use runfiles::layout;
use runfiles::store::RunStore;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A keep map with its label and a per-layer bitmap.
pub struct KeepInput {
    /// `none` or the map's name.
    pub label: String,
    /// Block index to `kept[expert]`; `None` for no keep map.
    pub kept: Option<BTreeMap<u32, Vec<bool>>>,
}

/// Everything replay reads from the run, before touching a trace layer.
pub struct Inputs {
    /// Routed experts per layer.
    pub n_expert: usize,
    /// The model's routing, from `saliency.json` (plain top-k without it).
    pub routing: Routing,
    /// The model's gating function, from `saliency.json` (softmax without it).
    pub gating: Gating,
    /// Bytes per expert load, per layer, when the model is known.
    pub expert_bytes: Option<BTreeMap<u32, u64>>,
    /// Where the expert sizes came from.
    pub model: Option<PathBuf>,
    /// Keep maps, in flag order.
    pub keep: Vec<KeepInput>,
    /// Trace parts by kind.
    pub traces: Vec<(TraceKind, TraceSet)>,
}

/// Reads what a replay of `store` needs: `model` gives the expert sizes
/// (none: no bytes moved); `keep_maps` are the `--keep-map` specs.
pub async fn load_inputs(
    store: &RunStore,
    model: Option<&Path>,
    keep_maps: &[String],
) -> Result<Inputs, ReplayError> {
    let model = model.map(Path::to_path_buf);
    let expert_bytes = model
        .as_deref()
        .map(super::model::expert_bytes)
        .transpose()?;
    let head = match runfiles::saliency::read_opt(store).await {
        Ok(file) => file.map(|f| f.saliency),
        Err(FileError::Invalid { file, problem, .. }) => {
            return Err(ReplayError::Saliency { url: file, problem })
        }
        Err(e) => return Err(e.into()),
    };
    let routing = head.as_ref().map(|h| h.routing.clone()).unwrap_or_default();
    let gating = head.as_ref().map_or(Gating::Softmax, |h| h.gating);
    let n_expert = match &head {
        Some(h) => u64::from(h.n_expert),
        None => match model.as_deref() {
            Some(m) => {
                super::model::expert_count(m)?.ok_or_else(|| ReplayError::NoExpertCount {
                    model: m.to_path_buf(),
                })?
            }
            None => {
                return Err(ReplayError::UnknownExpertCount {
                    saliency: store.url_of(layout::SALIENCY_JSON),
                })
            }
        },
    } as usize;
    if !(1..=u16::MAX as usize).contains(&n_expert) {
        return Err(ReplayError::ExpertCount { n_expert });
    }
    let mut keep = Vec::new();
    for spec in keep_maps {
        keep.push(load_keep_map(store, spec, n_expert).await?);
    }
    let (prefill, decode) = runfiles::trace::stored_parts(store).await?;
    let mut traces = Vec::new();
    for (kind, names) in [(TraceKind::Prefill, prefill), (TraceKind::Decode, decode)] {
        if let Some(set) = TraceSet::open(store, &names).await? {
            traces.push((kind, set));
        }
    }
    if traces.is_empty() {
        return Err(ReplayError::NoTraces {
            url: store.url_of(layout::TRACE_DIR),
        });
    }
    Ok(Inputs {
        n_expert,
        routing,
        gating,
        expert_bytes,
        model,
        keep,
        traces,
    })
}

async fn load_keep_map(
    store: &RunStore,
    spec: &str,
    n_expert: usize,
) -> Result<KeepInput, ReplayError> {
    if spec == "none" {
        return Ok(KeepInput {
            label: "none".into(),
            kept: None,
        });
    }
    let (label, where_, map) = match KeepMapRef::parse(spec) {
        KeepMapRef::File(path) => {
            let bytes = std::fs::read(&path).map_err(|source| ReplayError::KeepMapRead {
                path: spec.to_string(),
                source,
            })?;
            let label = path
                .file_stem()
                .map_or(spec.to_string(), |s| s.to_string_lossy().into_owned());
            (label, spec.to_string(), KeepMap::decode(&bytes, spec)?)
        }
        KeepMapRef::Run(name) => {
            let (map, _) = KeepMap::read(store, &name).await?;
            let url = store.url_of(&KeepMap::object_name(&name));
            (name, url, map)
        }
    };
    let mut kept = BTreeMap::new();
    for (&layer, ids) in &map.layers {
        let mut bits = vec![false; n_expert];
        for &e in ids {
            if e as usize >= n_expert {
                return Err(ReplayError::KeepMapExpert {
                    keep_map: where_,
                    layer,
                    expert: e,
                    n_expert,
                });
            }
            bits[e as usize] = true;
        }
        kept.insert(layer, bits);
    }
    Ok(KeepInput {
        label,
        kept: Some(kept),
    })
}
