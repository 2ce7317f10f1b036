//! The model card of a shipped GGUF: what it was made from and how (base
//! model, keep map or merge plan, experts per token, quantisation type and
//! importance matrix, each with its SHA-256), its tensor types, what it measured
//! against the base model, and the commands that make it again; as JSON
//! ([`ModelCard`]) and Markdown ([`ModelCard::to_markdown`]), written beside
//! the file. A card holds only what the inputs determine (no times), so the
//! same inputs give byte-identical cards.

use super::ShipError;
use gguf::quant::{ggml_type_name, QuantType};
use gguf::read::GgufHeader;
use numbers::eval::summary::SplitFigures;
use numbers::eval::{EvalSummary, GenerationSummary};
use numbers::peer_text::peer_text;
use numbers::Split;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// A file by name and content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileRef {
    /// File name (in the output directory, or the base model's own name).
    pub file: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
}

/// One of the files a model is shipped split into.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SplitFile {
    /// File name in the output directory.
    pub file: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
}

impl SplitFile {
    /// The shipped file `s`.
    pub(super) fn of(s: &super::Shipped) -> SplitFile {
        SplitFile {
            file: s.name.clone(),
            sha256: s.placed.sha256.clone(),
            bytes: s.placed.bytes,
        }
    }
}

/// The base model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Base {
    /// `general.name`, else the file's stem.
    pub name: String,
    /// The file; of a split model, its first file, with the SHA-256 of
    /// all its files' bytes in order (the run's `model_sha256`).
    pub file: FileRef,
    /// `general.architecture`.
    pub architecture: String,
    /// Routed experts per MoE layer (`{arch}.expert_count`).
    pub n_expert: u32,
    /// Experts routed per token (`{arch}.expert_used_count`).
    pub n_expert_used: u32,
    /// `general.license`, when the base names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// `general.source.huggingface.repository`: the Hugging Face repository
    /// the base was converted from, when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
}

impl Base {
    /// The base model described by its header.
    pub fn of(header: &GgufHeader, file: FileRef, stem: &str) -> Base {
        let text = |k: &str| header.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let architecture = text("general.architecture").unwrap_or_default();
        let number = |k: &str| {
            header
                .get(&format!("{architecture}.{k}"))
                .and_then(|v| v.as_u64())
                .map_or(0, |n| n as u32)
        };
        Base {
            name: text("general.name").unwrap_or_else(|| stem.to_string()),
            n_expert: number("expert_count"),
            n_expert_used: number("expert_used_count"),
            license: text("general.license"),
            repository: text("general.source.huggingface.repository"),
            architecture,
            file,
        }
    }
}

/// The keep map a file is sliced to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeepMapRef {
    /// Its name under the run's `keep_maps/`.
    pub name: String,
    /// Scoring method.
    pub method: String,
    /// Experts kept per MoE layer.
    pub k: u32,
    /// SHA-256 of its stored bytes.
    pub sha256: String,
    /// SHA-256 of the `saliency.json` it was scored from.
    pub saliency_sha256: String,
}

/// The merge plan a file is merged to (issue #57): which experts became
/// which, by what rule, and the plan's bytes by SHA-256.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MergeRef {
    /// Its name under the run's `merge_plans/` (`<method>_merge_K<k>`).
    pub name: String,
    /// The scoring method whose keep map the centres are.
    pub centres: String,
    /// Centres (experts that stay) per MoE layer.
    pub k: u32,
    /// SHA-256 of the plan file's bytes.
    pub sha256: String,
    /// SHA-256 of the `saliency.json` it was scored from.
    pub saliency_sha256: String,
    /// MoE layers merged.
    pub layers: usize,
    /// Members per centre (the centre among them) over every layer's
    /// centres: smallest, median, largest.
    pub members: [usize; 3],
    /// Experts merged into a centre other than themselves.
    pub merged: usize,
    /// Centres that merge nothing (kept as they are).
    pub alone: usize,
    /// Experts in no centre (dropped, as pruning drops them).
    pub dropped: usize,
    /// The plan's `params.recipe` (the clustering), when it names one.
    pub recipe: Option<String>,
    /// The plan's `params.weights`: what each member's weight is.
    pub weights: Option<String>,
    /// The plan's `params.similarity`: what closeness assigned members.
    pub similarity: Option<String>,
}

impl MergeRef {
    /// The card's account of `plan` (its file's SHA-256 `sha256`) on a
    /// base of `n_expert` experts per MoE layer.
    pub fn of(plan: &runfiles::mergeplan::MergePlan, sha256: &str, n_expert: u32) -> MergeRef {
        let mut sizes: Vec<usize> = plan
            .layers
            .values()
            .flatten()
            .map(|c| c.members.len())
            .collect();
        sizes.sort_unstable();
        let total: usize = sizes.iter().sum();
        let text = |key: &str| {
            plan.params
                .get(key)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        MergeRef {
            name: plan.name(),
            centres: plan.method.clone(),
            k: plan.k,
            sha256: sha256.to_string(),
            saliency_sha256: plan.saliency_sha256.clone(),
            layers: plan.layers.len(),
            members: [
                sizes.first().copied().unwrap_or(0),
                sizes.get(sizes.len() / 2).copied().unwrap_or(0),
                sizes.last().copied().unwrap_or(0),
            ],
            merged: total - sizes.len(),
            alone: sizes.iter().filter(|&&n| n == 1).count(),
            dropped: (n_expert as usize * plan.layers.len()).saturating_sub(total),
            recipe: text("recipe"),
            weights: text("weights"),
            similarity: text("similarity"),
        }
    }

    /// The card's Markdown rows of the merge.
    fn to_markdown(&self, s: &mut String, n_expert: u32) {
        let stated = |v: &Option<String>| {
            v.as_deref()
                .map_or("not stated in the plan".to_string(), md)
        };
        let _ = writeln!(
            s,
            "| Merging | merge plan `{}` (recipe {}): the centres are method {}'s keep map, {} of {} experts per MoE layer, each centre's expert tensors the weighted mean of its members' (re-encoded in the base's types); router rows are the centres'; SHA-256 `{}`, scored from saliency.json `{}` |",
            md(&self.name),
            stated(&self.recipe),
            md(&self.centres),
            self.k,
            n_expert,
            self.sha256,
            self.saliency_sha256
        );
        let [lo, median, hi] = self.members;
        let _ = writeln!(
            s,
            "| Members per centre | {lo} to {hi} (median {median}) over {} centres in {} MoE layers: {} experts merged into a centre, {} centres alone, {} experts dropped |",
            self.k as usize * self.layers,
            self.layers,
            self.merged,
            self.alone,
            self.dropped
        );
        let _ = writeln!(
            s,
            "| Merge weights | {}, normalised over each centre's members |",
            stated(&self.weights)
        );
        let _ = writeln!(
            s,
            "| Merge similarity | {} (which centre an expert joins) |",
            stated(&self.similarity)
        );
    }
}

/// The quantisation of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Quantisation {
    /// The type llama.cpp's quantiser was asked for.
    pub quant: QuantType,
    /// The importance matrix it weighed errors with (sliced to the keep map).
    pub imatrix: FileRef,
}

/// What a shipped file measured against the base model (DESIGN section 12).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    /// SHA-256 of the corpus chunk table it was measured on.
    pub corpus_sha256: String,
    /// Chunks evaluated.
    pub n_chunks: u64,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
    /// Per split (`fit`, `heldout`): the whole split and each domain.
    pub splits: BTreeMap<Split, SplitFigures>,
    /// The generation check: its greedy continuations of held-out prompts
    /// against the base model's, when the evaluation generated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationSummary>,
}

/// The model card of one shipped GGUF.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelCard {
    /// The file.
    pub file: FileRef,
    /// Its size in bytes.
    pub bytes: u64,
    /// The llama.cpp `gguf-split` files it is shipped as, in order (the
    /// first is the one to give llama.cpp); empty: shipped as one file.
    /// `file` and `bytes` then describe the model as one file, which is
    /// what was evaluated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub split_files: Vec<SplitFile>,
    /// The base model.
    pub base: Base,
    /// The keep map it is sliced to; `None`: every expert kept, or merged.
    pub keep_map: Option<KeepMapRef>,
    /// The merge plan it is merged to, when it is merged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeRef>,
    /// Experts routed per token, when lowered from the base model's.
    pub experts_used: Option<u32>,
    /// Its quantisation; `None`: the base model's tensor types.
    pub quantisation: Option<Quantisation>,
    /// Tensors per ggml type name in the file.
    pub tensor_types: BTreeMap<String, usize>,
    /// `moe-census <version>`, which made it.
    pub made_by: String,
    /// Commands that make the file again.
    pub commands: Vec<String>,
    /// Its figures against the base model; `None`: shipped without
    /// evaluation (`--no-eval`).
    pub measured: Option<Measured>,
}

/// The figures of the shipped file `file` (`<stem>.gguf`) in the summary of
/// their evaluation; `Err` when it was not evaluated.
pub fn measured(s: &EvalSummary, file: &str) -> Result<Measured, ShipError> {
    let stem = file.strip_suffix(".gguf").unwrap_or(file);
    let c = s
        .candidates
        .iter()
        .find(|c| c.name == stem)
        .ok_or_else(|| ShipError::Unmeasured {
            file: file.to_string(),
        })?;
    Ok(Measured {
        corpus_sha256: s.corpus_sha256.clone(),
        n_chunks: s.n_chunks,
        skip_first: s.skip_first,
        splits: c.splits.clone(),
        generation: c.generation.clone(),
    })
}

/// Tensors per ggml type name of a header.
pub fn tensor_types(header: &GgufHeader) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for t in &header.tensors {
        *out.entry(ggml_type_name(t.ggml_type)).or_insert(0) += 1;
    }
    out
}

/// Text from the run (a keep map's method) made safe inside a Markdown
/// table: control characters escaped, length capped, `|` and `` ` ``
/// escaped.
fn md(s: &str) -> String {
    peer_text(s).replace('|', "\\|").replace('`', "'")
}

impl ModelCard {
    /// The card as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a card serialises");
        out.push(b'\n');
        out
    }

    /// Hugging Face's model card metadata, a YAML block between `---`
    /// lines: the library and tags that list the file among GGUF models,
    /// and the base's licence and repository when its GGUF names them.
    /// Values are JSON strings, which YAML reads as double-quoted scalars.
    fn front_matter(base: &Base, merged: bool) -> String {
        let quoted = |v: &str| serde_json::to_string(v).expect("a string serialises");
        let mut s = String::from("---\nlibrary_name: gguf\ntags:\n");
        let how = match merged {
            true => "expert-merging",
            false => "expert-pruning",
        };
        for tag in ["gguf", "mixture-of-experts", how, "moe-census"] {
            let _ = writeln!(s, "- {tag}");
        }
        if let Some(license) = &base.license {
            let _ = writeln!(s, "license: {}", quoted(license));
        }
        if let Some(repository) = &base.repository {
            let _ = writeln!(s, "base_model: {}", quoted(repository));
        }
        s.push_str("---\n\n");
        s
    }

    /// The card as Markdown, after its Hugging Face metadata.
    pub fn to_markdown(&self) -> String {
        let (b, k) = (&self.base, self.keep_map.as_ref());
        let mut s = Self::front_matter(b, self.merge.is_some());
        let _ = writeln!(s, "# {}\n", md(&self.file.file));
        let _ = writeln!(s, "| | |\n|---|---|");
        let what = match self.split_files.is_empty() {
            true => "File",
            false => "Model as one file (what was evaluated)",
        };
        let _ = writeln!(
            s,
            "| {what} | `{}`, {} bytes, SHA-256 `{}` |",
            md(&self.file.file),
            self.bytes,
            self.file.sha256
        );
        if !self.split_files.is_empty() {
            let files: Vec<String> = self
                .split_files
                .iter()
                .map(|f| {
                    format!(
                        "`{}` ({} bytes, SHA-256 `{}`)",
                        md(&f.file),
                        f.bytes,
                        f.sha256
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "| Shipped as | {} llama.cpp `gguf-split` files, of which llama.cpp is given the first; they hold the file above: {} |",
                files.len(),
                files.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "| Base model | {} (`{}`, {}, {} experts per MoE layer, {} per token), SHA-256 `{}` |",
            md(&b.name),
            md(&b.file.file),
            md(&b.architecture),
            b.n_expert,
            b.n_expert_used,
            b.file.sha256
        );
        let pruning = match k {
            Some(k) => format!(
                "keep map `{}`: method {}, {} of {} experts kept per MoE layer; SHA-256 `{}`, scored from saliency.json `{}`",
                md(&k.name),
                md(&k.method),
                k.k,
                b.n_expert,
                k.sha256,
                k.saliency_sha256
            ),
            None => format!("none: all {} experts per MoE layer kept", b.n_expert),
        };
        match &self.merge {
            Some(m) => m.to_markdown(&mut s, b.n_expert),
            None => {
                let _ = writeln!(s, "| Pruning | {pruning} |");
            }
        }
        let routing = match self.experts_used {
            Some(n) => format!(
                "{n} experts per token (`expert_used_count` lowered from the base model's {})",
                b.n_expert_used
            ),
            None => format!("{} experts per token, as the base model", b.n_expert_used),
        };
        let _ = writeln!(s, "| Routing | {routing} |");
        let quant = match &self.quantisation {
            Some(q) => format!(
                "{} by llama.cpp's quantiser, weighted by importance matrix `{}` (SHA-256 `{}`)",
                q.quant,
                md(&q.imatrix.file),
                q.imatrix.sha256
            ),
            None => "none: the base model's tensor types".into(),
        };
        let _ = writeln!(s, "| Quantisation | {quant} |");
        let types: Vec<String> = self
            .tensor_types
            .iter()
            .map(|(t, n)| format!("{t} × {n}"))
            .collect();
        let _ = writeln!(s, "| Tensor types | {} |", types.join(", "));
        let _ = writeln!(s, "| Made by | {} |", self.made_by);
        if let Some(m) = &self.measured {
            m.to_markdown(&mut s);
        }
        let _ = writeln!(s, "\n## Make it again\n\n```sh");
        for c in &self.commands {
            let _ = writeln!(s, "{c}");
        }
        let _ = writeln!(s, "```");
        s
    }
}

impl Measured {
    /// The figures as a Markdown section: one row per split and domain.
    fn to_markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## Measured against the base model\n\nKL(base || this file) and the other figures over {} chunks of the run's corpus (chunk table SHA-256 `{}`, first {} positions of each chunk skipped):\n",
            self.n_chunks, self.corpus_sha256, self.skip_first
        );
        let _ = writeln!(
            s,
            "| split | domain | positions | KL mean ± se [95% interval] (clusters: document groups) | KL p50 / p90 / p95 / p99 / p99.9 / max | same top-1 | ppl base / file / ratio | mean change of p(next) |\n|---|---|---|---|---|---|---|---|"
        );
        for (split, f) in &self.splits {
            let rows = std::iter::once(("all", &f.all))
                .chain(f.domains.iter().map(|(d, f)| (d.as_str(), f)));
            for (domain, f) in rows {
                let k = &f.kl;
                let _ = writeln!(
                    s,
                    "| {split} | {} | {} | {:.6} ± {:.6} [{:.6}, {:.6}] | {:.6} / {:.6} / {:.6} / {:.6} / {:.6} / {:.6} | {:.2}% | {:.4} / {:.4} / {:.6} | {:+.6} |",
                    md(domain),
                    f.n,
                    k.mean,
                    k.se,
                    k.lo,
                    k.hi,
                    k.p50,
                    k.p90,
                    k.p95,
                    k.p99,
                    k.p999,
                    k.max,
                    100.0 * f.top1_same,
                    f.ppl_base,
                    f.ppl_candidate,
                    f.ppl_ratio,
                    f.dprob_mean
                );
            }
        }
        if let Some(g) = &self.generation {
            let ci = &g.all.matched_prefix_ci;
            let interval = match ci.known() {
                true => format!(" (95% interval by prompt {:.1} to {:.1})", ci.lo, ci.hi),
                false => String::new(),
            };
            let _ = writeln!(
                s,
                "\nGreedy continuations of {} held-out prompts ({} to {} tokens each, {} new tokens) against the base model's: the first difference comes after {:.1} tokens on average{interval}, {} continuations are identical, and {:.1}% of the tokens up to and at the first difference agree.",
                g.all.prompts,
                g.prompt_tokens.0,
                g.prompt_tokens.1,
                g.new_tokens,
                g.all.matched_prefix,
                g.all.identical,
                100.0 * g.all.agreement,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yaml_rust2::YamlLoader;

    /// The front matter parses as YAML (yaml-rust2, a YAML 1.2 parser) to
    /// the values given, whatever characters the base's metadata holds.
    #[test]
    fn the_front_matter_is_yaml_holding_the_bases_licence_and_repository() {
        let odd = "a: \"b\" # c\n- d\\ \u{7} é";
        let base = Base {
            name: "m".into(),
            file: FileRef {
                file: "m.gguf".into(),
                sha256: "0".into(),
            },
            architecture: "qwen3moe".into(),
            n_expert: 4,
            n_expert_used: 2,
            license: Some(odd.into()),
            repository: Some("org/Model-30B-A3B".into()),
        };
        let text = ModelCard::front_matter(&base, false);
        let yaml = text
            .strip_prefix("---\n")
            .and_then(|t| t.strip_suffix("---\n\n"))
            .unwrap_or_else(|| panic!("{text}"));
        let doc = &YamlLoader::load_from_str(yaml).unwrap()[0];
        assert_eq!(doc["library_name"].as_str(), Some("gguf"));
        assert_eq!(doc["license"].as_str(), Some(odd));
        assert_eq!(doc["base_model"].as_str(), Some("org/Model-30B-A3B"));
        let tags: Vec<&str> = doc["tags"]
            .as_vec()
            .unwrap()
            .iter()
            .filter_map(|t| t.as_str())
            .collect();
        assert!(
            tags.contains(&"gguf") && tags.contains(&"moe-census"),
            "{tags:?}"
        );

        let plain = ModelCard::front_matter(
            &Base {
                license: None,
                repository: None,
                ..base
            },
            true,
        );
        let doc =
            &YamlLoader::load_from_str(plain.trim_matches(|c| c == '-' || c == '\n')).unwrap()[0];
        assert!(
            doc["license"].is_badvalue() && doc["base_model"].is_badvalue(),
            "{plain}"
        );
        assert!(plain.contains("- expert-merging\n") && !plain.contains("expert-pruning"));
    }
}
