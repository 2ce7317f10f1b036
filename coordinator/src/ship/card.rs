//! The model card of a shipped GGUF: what it was made from and how (base
//! model, keep map, quantisation type and importance matrix, each with its
//! SHA-256), its tensor types, and the commands that make it again; as JSON
//! ([`ModelCard`]) and Markdown ([`ModelCard::to_markdown`]), written beside
//! the file. A card holds only what the inputs determine (no times), so the
//! same inputs give byte-identical cards.

use common::gguf_read::GgufHeader;
use common::peer_text::peer_text;
use common::quant::{ggml_type_name, QuantType};
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

/// The base model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Base {
    /// `general.name`, else the file's stem.
    pub name: String,
    /// The file.
    pub file: FileRef,
    /// `general.architecture`.
    pub architecture: String,
    /// Routed experts per MoE layer (`{arch}.expert_count`).
    pub n_expert: u32,
    /// Experts routed per token (`{arch}.expert_used_count`).
    pub n_expert_used: u32,
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

/// The quantisation of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Quantisation {
    /// The type llama.cpp's quantiser was asked for.
    pub quant: QuantType,
    /// The importance matrix it weighed errors with (sliced to the keep map).
    pub imatrix: FileRef,
}

/// The model card of one shipped GGUF.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelCard {
    /// The file.
    pub file: FileRef,
    /// Its size in bytes.
    pub bytes: u64,
    /// The base model.
    pub base: Base,
    /// The keep map it is sliced to.
    pub keep_map: KeepMapRef,
    /// Its quantisation; `None`: the base model's tensor types.
    pub quantisation: Option<Quantisation>,
    /// Tensors per ggml type name in the file.
    pub tensor_types: BTreeMap<String, usize>,
    /// `moe-census <version>`, which made it.
    pub made_by: String,
    /// Commands that make the file again.
    pub commands: Vec<String>,
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

    /// The card as Markdown.
    pub fn to_markdown(&self) -> String {
        let (b, k) = (&self.base, &self.keep_map);
        let mut s = String::new();
        let _ = writeln!(s, "# {}\n", md(&self.file.file));
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(
            s,
            "| File | `{}`, {} bytes, SHA-256 `{}` |",
            md(&self.file.file),
            self.bytes,
            self.file.sha256
        );
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
        let _ = writeln!(
            s,
            "| Pruning | keep map `{}`: method {}, {} of {} experts kept per MoE layer; SHA-256 `{}`, scored from saliency.json `{}` |",
            md(&k.name),
            md(&k.method),
            k.k,
            b.n_expert,
            k.sha256,
            k.saliency_sha256
        );
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
        let _ = writeln!(s, "\n## Make it again\n\n```sh");
        for c in &self.commands {
            let _ = writeln!(s, "{c}");
        }
        let _ = writeln!(s, "```");
        s
    }
}
