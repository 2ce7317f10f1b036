//! `[ship]` of the run config: the files `coordinator run` ships once the
//! run is verified and `[eval]` is done, as `coordinator ship` would with
//! the same candidates, quantisation types and `--allow-requantize`
//! (`eval = false` is its `--no-eval`). Absent, `coordinator run` ships
//! nothing. What can be checked before the run is: with the config
//! ([`ShipSettings::validate`]) and against the model's header
//! ([`ShipSettings::check_model`]), so a typo fails before collection.

use super::candidate;
use super::eval::KeepShape;
use super::method::{CandidateMethod, Method};
use gguf::quant::{check_requantize, QuantType};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[ship]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShipSettings {
    /// Candidates, as `coordinator ship --candidates`: keep maps the run
    /// scores (`<method>_K<k>`; `coordinator run` scores every size named
    /// here) or `base`, either with `_top<N>` (N experts per token), or
    /// merge plans the run scores (`<method>_merge_K<k>`).
    pub candidates: Vec<String>,
    /// Quantisation types (llama-quantize's names: `Q8_0`, `Q4_K_M`, ...);
    /// none ships the unquantised files only.
    #[serde(default)]
    pub quant: Vec<String>,
    /// Quantise a base model that is already quantised.
    #[serde(default)]
    pub allow_requantize: bool,
    /// Evaluate every shipped file against the base model (the figures of
    /// its card and the ship table).
    #[serde(default = "evaluate_by_default")]
    pub eval: bool,
    /// Local directory of the shipped files, relative to the config file's
    /// directory; default: `shipped/` in the run location when that is a
    /// local path.
    #[serde(default)]
    pub out: Option<PathBuf>,
    /// Ship each model file larger than this as llama.cpp's `gguf-split`
    /// files of at most this much tensor data (`48G`, `500M`, `800K`:
    /// decimal units, as `llama-gguf-split --split-max-size`); for hosts
    /// that cap a file's size (Hugging Face: 50 GB). Absent: one file each.
    #[serde(default)]
    pub split_max_size: Option<String>,
}

fn evaluate_by_default() -> bool {
    true
}

/// The directory `[ship]` ships to by default inside a local run location.
pub const DEFAULT_OUT: &str = "shipped";

impl ShipSettings {
    /// The quantisation types; an unknown one is refused naming the key.
    pub fn quants(&self) -> Result<Vec<QuantType>, String> {
        self.quant
            .iter()
            .map(|q| QuantType::parse(q).map_err(|e| format!("[ship] quant: {e}")))
            .collect()
    }

    /// `split_max_size` as written and in bytes; a malformed size is
    /// refused naming the key.
    pub fn split_max(&self) -> Result<Option<(String, u64)>, String> {
        let Some(text) = &self.split_max_size else {
            return Ok(None);
        };
        let bytes = parse_split_size(text).map_err(|e| format!("[ship] split_max_size: {e}"))?;
        Ok(Some((text.clone(), bytes)))
    }

    /// The candidates taken apart; names refused name the key.
    fn named(&self) -> Result<Vec<candidate::Named>, String> {
        candidate::parse(&self.candidates).map_err(|e| format!("[ship] candidates: {e:#}"))
    }

    /// Checks what can be checked without the model: at least one
    /// candidate, each a keep map of a scoring method at a number of
    /// experts (`frequency_K8`) or `base`, `base` only with a quantisation
    /// type, and known quantisation types. Errors name the key and entry.
    pub fn validate(&self) -> Result<(), String> {
        if self.candidates.is_empty() {
            return Err("[ship] candidates: give at least one (a keep map such as \"frequency_K8\", or \"base\")".into());
        }
        let quants = self.quants()?;
        self.split_max()?;
        for c in self.named()? {
            match &c.keep_map {
                None if c.experts_used.is_none() && quants.is_empty() => {
                    return Err(format!("[ship] candidates: {:?} unquantised is the base model itself; give quant to ship it quantised", c.name));
                }
                None => {}
                Some(map) => {
                    map_size(map).map_err(|e| format!("[ship] candidates: {:?}: {e}", c.name))?;
                }
            }
        }
        Ok(())
    }

    /// The keep-map sizes the candidates need (for `score`), sorted.
    pub fn sizes(&self) -> Vec<u32> {
        let mut ks: Vec<u32> = self
            .named()
            .unwrap_or_default()
            .iter()
            .filter_map(|c| map_size(c.keep_map.as_deref()?).ok())
            .collect();
        ks.sort_unstable();
        ks.dedup();
        ks
    }

    /// Checks the candidates against the base model `model` of shape
    /// `shape` before the run: each keep map's size is one the model can
    /// run, `_top<N>` is at most its experts per token, and an already
    /// quantised model is only quantised with `allow_requantize`. Routing
    /// groups are checked once `saliency.json` knows them.
    pub fn check_model(&self, model: &Path, shape: &KeepShape) -> Result<(), String> {
        self.validate()?;
        for c in self.named()? {
            if let Some(k) = c.keep_map.as_deref().and_then(|m| map_size(m).ok()) {
                shape
                    .resolve(&k.to_string())
                    .map_err(|e| format!("[ship] candidates: {:?}: {e}", c.name))?;
            }
            if let Some(n) = c.experts_used.filter(|&n| n > shape.n_expert_used) {
                return Err(format!(
                    "[ship] candidates: {:?}: {n} experts per token is more than the {} the model routes each token to (_top<N> lowers it)",
                    c.name, shape.n_expert_used
                ));
            }
        }
        let quants = self.quants()?;
        if !quants.is_empty() {
            let header = gguf::split::open_joined(model)
                .map_err(|e| format!("reading model {}: {e}", model.display()))?
                .header;
            for q in quants {
                check_requantize(
                    &header,
                    &format!("model {}", model.display()),
                    q,
                    self.allow_requantize,
                )
                .map_err(|e| {
                    format!("[ship] quant {q}: {e} (allow_requantize = true in [ship])")
                })?;
            }
        }
        Ok(())
    }

    /// The local directory the files go to: `out`, else [`DEFAULT_OUT`] in
    /// the run location `run` when that is a path; a run at a URL needs `out`.
    pub fn out_dir(&self, run: &str) -> Result<PathBuf, String> {
        match &self.out {
            Some(out) => Ok(out.clone()),
            None if !run.contains("://") => Ok(Path::new(run).join(DEFAULT_OUT)),
            None => Err(format!(
                "[ship] out: the run location {run} is not a local path; give out, a local directory for the shipped files"
            )),
        }
    }
}

/// A file size as `llama-gguf-split --split-max-size` takes it: a whole
/// number followed by `K`, `M` or `G` (10^3, 10^6, 10^9 bytes).
pub fn parse_split_size(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("{text:?} is not a size: expected a whole number and K, M or G (\"48G\", \"500M\")")
    };
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let scale: u64 = match unit {
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(bad()),
    };
    let n: u64 = match digits.bytes().all(|b| b.is_ascii_digit()) {
        true => digits.parse().map_err(|_| bad())?,
        false => return Err(bad()),
    };
    match n.checked_mul(scale) {
        Some(0) => Err(format!("{text:?}: a file must hold at least one byte")),
        Some(bytes) => Ok(bytes),
        None => Err(format!("{text:?} is over 2^64 bytes")),
    }
}

/// The size of a keep map or merge plan `score` writes, `<method>_K<k>` or
/// `<method>_merge_K<k>`; another name is refused with what is expected.
fn map_size(name: &str) -> Result<u32, String> {
    let (method, k) = numbers::keep_name::split(name).ok_or_else(|| {
        format!(
            "expected a keep map <method>_K<k> or merge plan <method>_merge_K<k> that the run scores ({}), or \"base\"",
            Method::names()
        )
    })?;
    CandidateMethod::named(method)?;
    k.parse::<u32>()
        .ok()
        .filter(|&k| k > 0)
        .ok_or_else(|| format!("K {k:?} is not a positive number of experts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ship(candidates: &[&str], quant: &[&str]) -> ShipSettings {
        ShipSettings {
            candidates: candidates.iter().map(|c| c.to_string()).collect(),
            quant: quant.iter().map(|q| q.to_string()).collect(),
            allow_requantize: false,
            eval: true,
            out: None,
            split_max_size: None,
        }
    }

    fn refused(s: ShipSettings) -> String {
        s.validate().expect_err("refused")
    }

    #[test]
    fn candidates_and_types_are_checked_before_any_model_is_known() {
        let good = ship(
            &["frequency_K8", "reap_hybrid_K12_top2", "base_top2", "base"],
            &["q4_k_m", "Q8_0"],
        );
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(good.sizes(), vec![8, 12]);
        let e = refused(ship(&["frequency_K8"], &["Q4_KM"]));
        assert!(
            e.starts_with("[ship] quant: ") && e.contains("\"Q4_KM\"") && e.contains("Q4_K_M"),
            "{e}"
        );
        let e = refused(ship(&["frequncy_K8"], &[]));
        assert!(
            e.starts_with("[ship] candidates: \"frequncy_K8\"") && e.contains("reap_hybrid"),
            "{e}"
        );
        let e = refused(ship(&["frequency"], &[]));
        assert!(e.contains("<method>_K<k>"), "{e}");
        assert!(refused(ship(&["frequency_Kx"], &[])).contains("\"x\""));
        assert!(refused(ship(&["base"], &[])).contains("give quant"));
        assert!(refused(ship(&["base_top0"], &["Q8_0"])).contains("at least 1"));
        assert!(refused(ship(&["frequency_K8", "frequency_K8"], &[])).contains("named twice"));
        assert!(refused(ship(&[], &[])).contains("at least one"));
        // A merge plan ships like a keep map, never with _top<N>.
        let merged = ship(&["reap_hybrid_merge_K12", "frequency_K8"], &["Q8_0"]);
        assert_eq!(merged.validate(), Ok(()));
        assert_eq!(merged.sizes(), vec![8, 12]);
        assert!(refused(ship(&["reap_merge_K8"], &[]))
            .contains("\"reap_merge\" is not a scoring method"));
        assert!(refused(ship(&["reap_hybrid_merge_K8_top2"], &[])).contains("merged candidate"));
    }

    #[test]
    fn sizes_and_experts_per_token_are_checked_against_the_model() {
        let shape = KeepShape {
            n_expert: 16,
            n_expert_used: 4,
            groups: None,
        };
        let model = Path::new("/nonexistent.gguf");
        // Without quant the header is not read.
        assert_eq!(
            ship(&["frequency_K8_top4", "base_top2"], &[]).check_model(model, &shape),
            Ok(())
        );
        let e = ship(&["frequency_K17"], &[])
            .check_model(model, &shape)
            .unwrap_err();
        assert!(
            e.contains("\"frequency_K17\"") && e.contains("more than the model's 16"),
            "{e}"
        );
        let e = ship(&["frequency_K3"], &[])
            .check_model(model, &shape)
            .unwrap_err();
        assert!(e.contains("fewer than the 4"), "{e}");
        let e = ship(&["base_top5"], &[])
            .check_model(model, &shape)
            .unwrap_err();
        assert!(
            e.contains("\"base_top5\"") && e.contains("the 4 the model routes"),
            "{e}"
        );
    }

    #[test]
    fn split_sizes_read_as_llama_gguf_split_reads_them() {
        assert_eq!(parse_split_size("48G"), Ok(48_000_000_000));
        assert_eq!(parse_split_size("500M"), Ok(500_000_000));
        assert_eq!(parse_split_size("800K"), Ok(800_000));
        for bad in ["48", "G", "4.5G", "-1G", "48GB", "48g", ""] {
            let e = parse_split_size(bad).unwrap_err();
            assert!(
                e.contains("expected a whole number and K, M or G"),
                "{bad}: {e}"
            );
        }
        assert!(parse_split_size("0M")
            .unwrap_err()
            .contains("at least one byte"));
        assert!(parse_split_size("99999999999999G")
            .unwrap_err()
            .contains("2^64"));
        let mut s = ship(&["frequency_K8"], &[]);
        assert_eq!(s.split_max(), Ok(None));
        s.split_max_size = Some("48G".into());
        assert_eq!(s.split_max(), Ok(Some(("48G".into(), 48_000_000_000))));
        s.split_max_size = Some("48 G".into());
        assert!(refused(s).starts_with("[ship] split_max_size: \"48 G\""));
    }

    #[test]
    fn files_go_to_out_or_into_a_local_run() {
        let mut s = ship(&["frequency_K8"], &[]);
        assert_eq!(s.out_dir("runs/q"), Ok(PathBuf::from("runs/q/shipped")));
        assert!(s
            .out_dir("s3://b/r")
            .unwrap_err()
            .starts_with("[ship] out:"));
        s.out = Some(PathBuf::from("/cfg/shipped"));
        assert_eq!(s.out_dir("s3://b/r"), Ok(PathBuf::from("/cfg/shipped")));
    }
}
