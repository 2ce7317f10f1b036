//! The model card of a shipped file: one JSON schema ([`ModelCard`],
//! written as `<name>.json` beside the GGUF and read back when a later
//! `coordinator ship` reuses the file) and its Markdown rendering
//! (`<name>.md`). A card holds only what the inputs determine (no times,
//! no paths of the moment), so the same inputs give byte-identical cards.

use common::eval::summary::SplitFigures;
use common::quant::QuantType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Everything a shipped file's bytes depend on: equal recipes make equal
/// files with the same build, so a file whose card has this recipe and
/// whose bytes still hash to the card's SHA-256 is reused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// SHA-256 of the base GGUF.
    pub base_sha256: String,
    /// The keep map it is sliced to.
    pub keep_map: Option<KeepMapRef>,
    /// Its `expert_used_count`, when lowered (metadata only).
    pub top_k: Option<u32>,
    /// Its quantisation type (none: the base model's tensor types).
    pub quant: Option<QuantType>,
    /// The importance matrix the quantiser weighed errors with.
    pub imatrix: Option<FileRef>,
    /// The moe-census version (and so llama.cpp's) that made it.
    pub moe_census_version: String,
}

/// A keep map by name and content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepMapRef {
    /// `<method>_K<k>`.
    pub name: String,
    /// Scoring method.
    pub method: String,
    /// Experts kept per MoE layer.
    pub k: u32,
    /// SHA-256 of `keep_maps/<name>.json`.
    pub sha256: String,
}

/// A file beside the shipped one, by name and content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// File name in the output directory.
    pub file: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
}

/// The base model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Base {
    /// `general.name`, else the file's stem.
    pub name: String,
    /// Its file name.
    pub file: String,
    /// SHA-256 of the file.
    pub sha256: String,
    /// `general.architecture`.
    pub architecture: String,
    /// Routed experts per MoE layer.
    pub n_expert: u32,
    /// Experts routed per token.
    pub n_expert_used: u32,
}

/// What the keep map did to routing and to dead experts (from `score` and
/// `saliency.json`, fit split).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pruning {
    /// Experts kept per MoE layer.
    pub k: u32,
    /// Mean share of top-k routing slots that went to pruned experts.
    pub slot_replacement_mean: f64,
    /// The worst layer's share.
    pub slot_replacement_worst: f64,
    /// The worst layer.
    pub worst_layer: u32,
    /// Experts never routed to on the fit split, all MoE layers.
    pub dead_experts: u32,
    /// Of those, kept by the map (the rest were pruned).
    pub dead_kept: u32,
    /// Kept experts with under 100 routed tokens.
    pub kept_under_100: u32,
}

/// One domain of the calibration corpus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Domain {
    /// Its name.
    pub name: String,
    /// Tokens.
    pub tokens: u64,
    /// Share of the corpus's tokens.
    pub token_share: f64,
    /// Configured target share.
    pub target: Option<f64>,
    /// Configured held-out fraction.
    pub heldout_fraction: f64,
    /// Fit-split tokens.
    pub fit_tokens: u64,
    /// Held-out tokens.
    pub heldout_tokens: u64,
}

/// The calibration corpus the keep maps, the importance matrix and the
/// evaluation came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Corpus {
    /// SHA-256 of its chunk table.
    pub chunks_sha256: String,
    /// Tokens.
    pub n_tokens: u64,
    /// Chunks of `n_ctx` tokens.
    pub n_chunks: u32,
    /// Context size.
    pub n_ctx: u32,
    /// Per domain.
    pub domains: Vec<Domain>,
}

/// The file measured against the base model (`coordinator ship`'s
/// evaluation, DESIGN section 12).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Chunks evaluated.
    pub n_chunks: u64,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
    /// Backends that computed them.
    pub backends: Vec<String>,
    /// Per split name (`heldout`, `fit`): the whole split and per domain.
    pub splits: BTreeMap<String, SplitFigures>,
}

/// The model card of one shipped file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// Its name (`reap_hybrid_K8.Q8_0`).
    pub name: String,
    /// The GGUF beside this card.
    pub file: FileRef,
    /// Its size in bytes.
    pub bytes: u64,
    /// How it was made.
    pub recipe: Recipe,
    /// Model tensors the quantiser had importance-matrix weights for.
    pub imatrix_tensors: Option<usize>,
    /// The base model.
    pub base: Base,
    /// What the keep map did, for a pruned file.
    pub pruning: Option<Pruning>,
    /// The calibration corpus.
    pub corpus: Corpus,
    /// Its figures against the base model.
    pub measured: Measured,
    /// The commands that make this file again.
    pub commands: Vec<String>,
}

impl ModelCard {
    /// Pretty JSON with shortest round-trip floats.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a card serialises");
        v.push(b'\n');
        v
    }

    /// What the file is, in words.
    pub fn describe(&self) -> String {
        let r = &self.recipe;
        let mut parts = Vec::new();
        match &r.keep_map {
            Some(m) => parts.push(format!(
                "pruned to {} of {} experts per MoE layer by the {} keep map",
                m.k, self.base.n_expert, m.method
            )),
            None => parts.push("all experts kept".to_string()),
        }
        if let Some(t) = r.top_k {
            parts.push(format!(
                "routing {t} experts per token instead of {} (expert_used_count edited, metadata only)",
                self.base.n_expert_used
            ));
        }
        match r.quant {
            Some(q) => parts.push(format!(
                "quantised to {q} by llama.cpp's quantiser with {}",
                r.imatrix
                    .as_ref()
                    .map_or("no importance matrix".into(), |m| format!(
                        "the importance matrix {}",
                        m.file
                    ))
            )),
            None => parts.push("tensor types of the base model".into()),
        }
        parts.join("; ")
    }

    /// The card as Markdown.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# {}\n", self.name);
        let _ = writeln!(md, "{} ({}), {}.\n", self.base.name, self.base.architecture, self.describe());
        md.push_str("| | |\n|---|---|\n");
        let rows = [
            ("file", format!("`{}`", self.file.file)),
            ("size", format!("{} bytes ({:.2} MiB)", self.bytes, self.bytes as f64 / 1048576.0)),
            ("SHA-256", format!("`{}`", self.file.sha256)),
            ("base model", format!("{} (`{}`, SHA-256 `{}`)", self.base.name, self.base.file, self.base.sha256)),
            ("method", self.recipe.keep_map.as_ref().map_or("none (unpruned)".into(), |m| m.method.clone())),
            ("K (experts per MoE layer)", self.recipe.keep_map.as_ref().map_or(self.base.n_expert, |m| m.k).to_string()),
            ("experts per token (top-k)", self.recipe.top_k.unwrap_or(self.base.n_expert_used).to_string()),
            ("quantisation", self.recipe.quant.map_or("none".into(), |q| q.to_string())),
            ("importance matrix", match (&self.recipe.imatrix, self.imatrix_tensors) {
                (Some(m), Some(n)) => format!("`{}` (SHA-256 `{}`), weights for {n} tensors", m.file, m.sha256),
                (Some(m), None) => format!("`{}` (SHA-256 `{}`)", m.file, m.sha256),
                _ => "none".into(),
            }),
            ("moe-census", self.recipe.moe_census_version.clone()),
        ];
        for (k, v) in rows {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        md.push_str("\n## Measured against the base model\n\n");
        let m = &self.measured;
        let _ = writeln!(
            md,
            "KL(base ‖ this file) per scored position over the whole vocabulary (nats), {} chunks, first {} positions of each chunk skipped; percentiles exact (nearest rank); Δp is the change in the probability of the actual next token. Backends: {}.\n",
            m.n_chunks,
            m.skip_first,
            m.backends.join(", ")
        );
        md.push_str("| split | domain | positions | KL mean ± se | KL p50 / p90 / p99 / p99.9 / max | same top-1 | RMS Δp | mean Δp | ppl base / file / ratio |\n|---|---|---|---|---|---|---|---|---|\n");
        for split in ["heldout", "fit"] {
            let Some(s) = m.splits.get(split) else { continue };
            let all = std::iter::once(("*", &s.all));
            for (domain, f) in all.chain(s.domains.iter().map(|(d, f)| (d.as_str(), f))) {
                let _ = writeln!(
                    md,
                    "| {split} | {domain} | {} | {:.4} ± {:.4} | {:.4} / {:.4} / {:.4} / {:.4} / {:.4} | {:.2}% | {:.3}% | {:+.3}% | {:.3} / {:.3} / {:.4} |",
                    f.n, f.kl.mean, f.kl.se, f.kl.p50, f.kl.p90, f.kl.p99, f.kl.p999, f.kl.max,
                    100.0 * f.top1_same, 100.0 * f.dprob_rms, 100.0 * f.dprob_mean,
                    f.ppl_base, f.ppl_candidate, f.ppl_ratio
                );
            }
        }
        md.push_str("\n## Experts\n\n");
        match &self.pruning {
            Some(p) => {
                let _ = writeln!(
                    md,
                    "{} of {} experts kept per MoE layer. Slot replacement (share of the base model's top-{} routing slots that went to pruned experts, fit split): mean {:.1}%, worst {:.1}% (layer {}). Dead experts (never routed to on the fit split): {} over all MoE layers, of which the map kept {} and pruned {}. Kept experts with under 100 routed tokens: {}.",
                    p.k,
                    self.base.n_expert,
                    self.base.n_expert_used,
                    100.0 * p.slot_replacement_mean,
                    100.0 * p.slot_replacement_worst,
                    p.worst_layer,
                    p.dead_experts,
                    p.dead_kept,
                    p.dead_experts - p.dead_kept,
                    p.kept_under_100
                );
            }
            None => {
                let _ = writeln!(md, "No expert pruned: all {} experts of every MoE layer are in the file.", self.base.n_expert);
            }
        }
        if let Some(t) = self.recipe.top_k {
            let _ = writeln!(
                md,
                "\nTop-k candidate: `expert_used_count` is {t} (the base model routes {} experts per token); only that metadata entry differs from its source, the weights are the same.",
                self.base.n_expert_used
            );
        }
        md.push_str("\n## Calibration corpus\n\n");
        let c = &self.corpus;
        let _ = writeln!(
            md,
            "{} tokens in {} chunks of {} (chunk table SHA-256 `{}`); keep maps and the importance matrix are fitted on the fit split, the held-out split is split off by document group.\n",
            c.n_tokens, c.n_chunks, c.n_ctx, c.chunks_sha256
        );
        md.push_str("| domain | tokens | share (target) | held-out fraction | fit / held-out tokens |\n|---|---|---|---|---|\n");
        for d in &c.domains {
            let _ = writeln!(
                md,
                "| {} | {} | {:.1}% ({}) | {:.2} | {} / {} |",
                d.name,
                d.tokens,
                100.0 * d.token_share,
                d.target.map_or("-".into(), |t| format!("{:.1}%", 100.0 * t)),
                d.heldout_fraction,
                d.fit_tokens,
                d.heldout_tokens
            );
        }
        md.push_str("\n## Reproduce\n\n```sh\n");
        for c in &self.commands {
            let _ = writeln!(md, "{c}");
        }
        md.push_str("```\n");
        md
    }
}
