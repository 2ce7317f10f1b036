//! The run configuration (`CONFIG.toml`): one file per run, one section per
//! concern. Every section is optional in the file and has defaults, so a
//! section added for a new stage does not break existing configs.
//!
//! Relative paths in the file (the model, corpus sources) are resolved against
//! **the directory of the config file**, never the current directory, so a
//! config means the same thing wherever the command is started from.
//!
//! The config comes first in the data flow: every stage reads its own
//! section from here ([`run`], [`eval`], [`ship`]) and nothing here imports
//! a stage; [`method`] and [`candidate`] are the names those sections use.
//! It may depend on the numbers, the GGUF format, the protocol and the run
//! location's names; never on a stage, the tokenizer or llama.cpp.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod candidate;
pub mod eval;
pub mod method;
pub mod reference;
pub mod respond;
pub mod run;
pub mod ship;
pub mod strict;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole `CONFIG.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[model]`: the GGUF model whose tokenizer and experts are measured.
    #[serde(default)]
    pub model: ModelConfig,
    /// `[corpus]`: calibration domains, targets and the held-out split.
    #[serde(default)]
    pub corpus: CorpusConfig,
    /// `[run]`: leases and evaluation settings.
    #[serde(default)]
    pub run: run::RunSettings,
    /// `[cluster]`: the QUIC endpoint, TLS and join secret.
    #[serde(default)]
    pub cluster: run::ClusterSettings,
    /// `[storage]`: object-store endpoint settings.
    #[serde(default)]
    pub storage: run::StorageSettings,
    /// `[eval]`: pruned candidates `coordinator run` evaluates after scoring.
    #[serde(default)]
    pub eval: eval::EvalSettings,
    /// `[ship]`: files `coordinator run` ships at its end; absent: none (and
    /// absent from the config recorded in the manifest, as before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ship: Option<ship::ShipSettings>,
    /// Directory of the config file; relative paths are resolved against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl Config {
    /// Reads, parses and checks a config file, remembering its directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })?;
        config
            .run
            .validate()
            .and_then(|()| config.cluster.validate())
            .and_then(|()| config.eval.validate())
            .and_then(|()| config.eval.check_noise_ubatch(config.run.n_ubatch))
            .and_then(|()| {
                config
                    .eval
                    .check_merge_traces(config.run.trace_tokens_per_split)
            })
            .and_then(|()| config.ship.as_ref().map_or(Ok(()), |s| s.validate()))
            .and_then(|()| config.corpus.validate_respond())
            .map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            })?;
        config.base_dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        config.resolve_cluster_inputs();
        config.resolve_image_dirs();
        Ok(config)
    }

    /// Resolves every path of `[cluster]` (`ca_dir`, `secret_file`,
    /// `connect_file`, `identity_dir`), a `[run] out` that is a path, not
    /// a URL, and `[ship] out` against the config's directory, so a launch
    /// from any working directory reads and writes the same files.
    fn resolve_cluster_inputs(&mut self) {
        let resolve = |p: &Option<PathBuf>| p.as_deref().map(|p| self.resolve(p));
        let cluster = &self.cluster;
        let (ca_dir, secret_file, connect_file, identity_dir) = (
            resolve(&cluster.ca_dir),
            resolve(&cluster.secret_file),
            resolve(&cluster.connect_file),
            resolve(&cluster.identity_dir),
        );
        let out = match &self.run.out {
            Some(o) if !o.contains("://") => Some(self.resolve(Path::new(o)).display().to_string()),
            other => other.clone(),
        };
        self.cluster.ca_dir = ca_dir;
        self.cluster.secret_file = secret_file;
        self.cluster.connect_file = connect_file;
        self.cluster.identity_dir = identity_dir;
        self.run.out = out;
        let ship_out = self
            .ship
            .as_ref()
            .and_then(|s| s.out.as_deref())
            .map(|p| self.resolve(p));
        if let Some(ship) = &mut self.ship {
            ship.out = ship_out;
        }
    }

    /// Resolves every source's `image_dir` against the config's directory,
    /// as its `path` is.
    fn resolve_image_dirs(&mut self) {
        let base = self.base_dir.clone();
        let corpus = &mut self.corpus;
        let sources = corpus
            .domains
            .iter_mut()
            .flat_map(|d| d.sources.iter_mut())
            .chain(
                corpus
                    .eval_sets
                    .iter_mut()
                    .flat_map(|e| e.sources.iter_mut()),
            );
        for s in sources {
            if let Some(dir) = s.image_dir.as_mut().filter(|d| d.is_relative()) {
                *dir = base.join(&*dir);
            }
        }
    }

    /// Parses config text; relative paths resolve against the current
    /// directory. An unknown section or key is refused with the nearest
    /// valid name ([`strict`]).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            message,
        };
        let doc: toml::Table = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        strict::check(&doc).map_err(invalid)?;
        toml::from_str(text).map_err(|e| invalid(e.to_string()))
    }

    /// Resolves a path from the config file against the config's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// The model path, resolved.
    pub fn model_path(&self) -> PathBuf {
        self.resolve(&self.model.path)
    }

    /// The `[model] mmproj` path, resolved, when the config names one.
    pub fn mmproj_path(&self) -> Option<PathBuf> {
        self.model.mmproj.as_deref().map(|p| self.resolve(p))
    }
}

/// Errors reading a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown or ill-typed fields.
    #[error("config {} is invalid: {message}", path.display())]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
}

/// `[model]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Path of the GGUF file (relative to the config file's directory).
    #[serde(default)]
    pub path: PathBuf,
    /// The model's `mmproj` GGUF (vision encoder and projector, relative to
    /// the config file's directory): needed when the corpus has images,
    /// whose positions mtmd computes with it. Absent: text only (and absent
    /// from the config recorded in the manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<PathBuf>,
}

/// `[corpus]`: how the calibration corpus is built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CorpusConfig {
    /// Tokens per chunk (the context each chunk is evaluated in).
    #[serde(default = "default_n_ctx")]
    pub n_ctx: u32,
    /// Largest allowed absolute difference between a domain's measured token
    /// share and its target (0.05 = five percentage points).
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    /// How the domains' `target_share`s are met: `"sample"` keeps whole
    /// groups of each domain's fit split (in the seeded order) until its fit
    /// tokens reach its share of what the scarcest domain allows, leaving
    /// the rest out (`dropped: "over_share"` in `documents.jsonl`), so the
    /// shares hold in the model's own tokens; `"verify"` keeps every
    /// document and fails when a share misses by more than `tolerance`.
    #[serde(default)]
    pub shares: SharesMode,
    /// Held-out fraction for domains that do not set their own (default
    /// 0.1, so the eval budget is chosen on held-out text; a domain needs
    /// two document groups or `heldout_fraction = 0` of its own).
    #[serde(default = "default_heldout_fraction")]
    pub heldout_fraction: f64,
    /// Record field naming a document's group (task, trial, URL) for domains
    /// that do not set their own; documents without it are their own group.
    #[serde(default)]
    pub group_key: Option<String>,
    /// Seed of the split and of the order of documents within a domain.
    #[serde(default)]
    pub seed: u64,
    /// Near-duplicate detection over token shingles.
    #[serde(default)]
    pub dedup: DedupConfig,
    /// The calibration domains.
    #[serde(default)]
    pub domains: Vec<DomainConfig>,
    /// Evaluation sets: held out whole, each a domain of its own packed
    /// after the calibration chunks; evaluated as their own rows, never
    /// fitted on, outside the shares; calibration documents that copy or
    /// near-duplicate them are dropped.
    #[serde(default)]
    pub eval_sets: Vec<EvalSetConfig>,
    /// Variables every chat record's template rendering gets besides the
    /// conversation, as llama-server's `--chat-template-kwargs`
    /// (`{ enable_thinking = false }`, `{ reasoning_effort = "high" }`), so
    /// calibration sees the prompts the model is served with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chat_template_kwargs: BTreeMap<String, serde_json::Value>,
    /// `[corpus.respond]`: how the base model writes the text of the
    /// sources that set `respond` (defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respond: Option<respond::RespondSettings>,
}

impl CorpusConfig {
    /// Whether any source asks the base model to write its text.
    pub fn responds(&self) -> bool {
        self.domains
            .iter()
            .flat_map(|d| &d.sources)
            .any(|s| s.respond.is_some())
    }

    /// `[corpus.respond]`, or its defaults.
    pub fn respond_settings(&self) -> respond::RespondSettings {
        self.respond.clone().unwrap_or_default()
    }

    /// Refuses `[corpus.respond]` settings no generation can run with, and
    /// `respond` on an evaluation set's source (evaluation text is never
    /// generated), naming the source.
    pub fn validate_respond(&self) -> Result<(), String> {
        if let Some(r) = &self.respond {
            r.validate()?;
        }
        for e in &self.eval_sets {
            if let Some(s) = e.sources.iter().find(|s| s.respond.is_some()) {
                return Err(format!(
                    "eval set {:?}, source {}: respond is for calibration domains only \
                     (an evaluation set is text as written)",
                    e.name,
                    s.path.display()
                ));
            }
        }
        Ok(())
    }
}

/// `[corpus] shares`: how target shares are met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SharesMode {
    /// Leave fit documents out, whole groups at a time, until every
    /// domain's fit tokens reach its target share.
    #[default]
    Sample,
    /// Keep every document; fail when a share misses its target.
    Verify,
}

fn default_n_ctx() -> u32 {
    512
}

fn default_tolerance() -> f64 {
    0.05
}

fn default_heldout_fraction() -> f64 {
    0.1
}

impl Default for CorpusConfig {
    fn default() -> Self {
        CorpusConfig {
            n_ctx: default_n_ctx(),
            tolerance: default_tolerance(),
            shares: SharesMode::default(),
            heldout_fraction: default_heldout_fraction(),
            group_key: None,
            seed: 0,
            dedup: DedupConfig::default(),
            domains: Vec::new(),
            eval_sets: Vec::new(),
            chat_template_kwargs: BTreeMap::new(),
            respond: None,
        }
    }
}

/// `[corpus.dedup]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// Tokens per shingle.
    #[serde(default = "default_shingle")]
    pub shingle: usize,
    /// A document is a near-duplicate of another when at least this fraction
    /// of the smaller one's shingles occur in the other (overlap coefficient).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// Shingles found in more than this many documents are boilerplate (chat
    /// template markup, a shared system prompt) and ignored.
    #[serde(default = "default_max_df")]
    pub max_doc_freq: usize,
}

fn default_shingle() -> usize {
    8
}

fn default_threshold() -> f64 {
    0.5
}

fn default_max_df() -> usize {
    16
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            shingle: default_shingle(),
            threshold: default_threshold(),
            max_doc_freq: default_max_df(),
        }
    }
}

/// One `[[corpus.domains]]` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// Domain name, as used in reports and per-domain statistics.
    pub name: String,
    /// Target share of the corpus's tokens (0..1); all domains set one or none.
    #[serde(default)]
    pub target_share: Option<f64>,
    /// Held-out fraction of this domain's tokens (default: the corpus's).
    #[serde(default)]
    pub heldout_fraction: Option<f64>,
    /// Group key field for this domain (default: the corpus's).
    #[serde(default)]
    pub group_key: Option<String>,
    /// Files of this domain.
    pub sources: Vec<SourceConfig>,
}

/// One `[[corpus.eval_sets]]` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalSetConfig {
    /// Its name: a domain name of its own in the statistics, the drop
    /// report and the eval table (not a calibration domain's).
    pub name: String,
    /// Files of the evaluation set.
    pub sources: Vec<SourceConfig>,
}

/// One source of a domain or evaluation set: a file, a directory (every
/// file under it) or a glob (`code/**/*.rs`). Each file's format is
/// `format`, else told from its name: `.jsonl`/`.ndjson` (JSON lines),
/// `.json` (a JSON array of records), `.parquet`, `.txt`/`.text`/`.md`/
/// `.raw` (text), each but Parquet also compressed (`.gz`, `.zst`); a file
/// whose format its name does not tell is refused. Records hold text in
/// `text_field` (default `text`, else `content`) or chat in
/// `messages_field` (default `messages`, else ShareGPT's `conversations`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// File, directory or glob (relative to the config file's directory).
    /// A directory is walked in name order, hidden entries and symbolic
    /// links skipped; in a glob, `*` stays within a directory, `**/`
    /// spans any depth.
    pub path: PathBuf,
    /// Format of every file of the source; default: each file's told from
    /// its name (`.jsonl`, `.json`, `.parquet`, `.txt`, compressed `.gz` /
    /// `.zst`), refused when its name does not tell.
    #[serde(default)]
    pub format: Option<SourceFormat>,
    /// Field (JSON) or column (Parquet) holding plain text; with the
    /// default, `text`, a record without one is read from `content`.
    #[serde(default = "default_text_field")]
    pub text_field: String,
    /// Field or column holding chat messages: OpenAI's `[{role, content,
    /// tool_calls}]` or ShareGPT's `[{from, value}]`; with the default,
    /// `messages`, a record without one is read from `conversations`.
    #[serde(default = "default_messages_field")]
    pub messages_field: String,
    /// Field of a chat message naming its author; default: `role`, else
    /// `from` (ShareGPT). Author names: `system`, `developer`, `user`,
    /// `assistant`, `tool`, and ShareGPT's `human`, `gpt`, `observation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_field: Option<String>,
    /// Field of a chat message holding its text; default: `content`, else
    /// `value` (ShareGPT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_field: Option<String>,
    /// Field or column of a chat record holding its tool definitions
    /// (OpenAI's `[{type: function, function: {...}}]`, or JSON text of
    /// them), which the model's chat template writes; default: `tools`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_field: Option<String>,
    /// Plain text only: split the file into documents at this string
    /// (e.g. `"\n\n"`); default: the whole file is one document.
    #[serde(default)]
    pub separator: Option<String>,
    /// Directory and glob sources: only files whose path relative to the
    /// directory (or the glob's fixed prefix) matches one of these globs;
    /// a pattern without `/` matches the file name (`*.rs`). Empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Directory and glob sources: files and directories matching any of
    /// these globs are skipped (`target`, `tests/**`, `*.lock`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Directory and glob sources: files larger than this many bytes are
    /// skipped and counted (default 1048576), as are binary files (a NUL
    /// byte or invalid UTF-8) of a text source; a compressed file that
    /// decompresses to more bytes is refused, naming it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_bytes: Option<u64>,
    /// JSON sources with images: the directory their records' image paths
    /// are relative to (relative to the config file's directory), for
    /// datasets that keep images apart from their records; default: each
    /// source file's own directory. Paths still stay under it: no `..`, not
    /// absolute, no symbolic link leading out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_dir: Option<PathBuf>,
    /// Have the base model write this source's text in the response phase
    /// (`[corpus.respond]`): `"assistant"` (chat records: the answer after
    /// the last user turn), `"every_turn"` (chat: every assistant turn) or
    /// `"continue"` (text: the rest of each document after its first
    /// `prefix_tokens`). Absent: the text as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respond: Option<respond::RespondMode>,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            path: PathBuf::new(),
            format: None,
            text_field: default_text_field(),
            messages_field: default_messages_field(),
            role_field: None,
            content_field: None,
            tools_field: None,
            separator: None,
            include: Vec::new(),
            exclude: Vec::new(),
            max_file_bytes: None,
            image_dir: None,
            respond: None,
        }
    }
}

/// The default of [`SourceConfig::max_file_bytes`]: 1 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 20;

fn default_text_field() -> String {
    "text".into()
}

fn default_messages_field() -> String {
    "messages".into()
}

/// Source file formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// One JSON object per line.
    Jsonl,
    /// A JSON array of objects, one record each.
    Json,
    /// A Parquet table, one record per row.
    Parquet,
    /// UTF-8 text.
    Text,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respond_parses_per_source_and_is_refused_on_an_eval_set() {
        let text = r#"
            [corpus.respond]
            max_tokens = 8
            temperature = 0.8
            seed = 3
            [[corpus.domains]]
            name = "chat"
            sources = [{ path = "chat.jsonl", respond = "assistant" }, { path = "t.txt", respond = "continue" }]
        "#;
        let c = Config::parse(text).unwrap();
        let modes: Vec<_> = c.corpus.domains[0]
            .sources
            .iter()
            .map(|s| s.respond)
            .collect();
        use respond::RespondMode::*;
        assert_eq!(modes, vec![Some(Assistant), Some(Continue)]);
        assert!(c.corpus.responds());
        assert_eq!(c.corpus.respond_settings().max_tokens, 8);
        c.corpus.validate_respond().unwrap();
        let typo = text.replace("\"continue\"", "\"continu\"");
        assert!(Config::parse(&typo).is_err());
        let eval = format!(
            "{text}\n[[corpus.eval_sets]]\nname = \"e\"\nsources = [{{ path = \"e.jsonl\", respond = \"assistant\" }}]\n"
        );
        let err = Config::parse(&eval)
            .unwrap()
            .corpus
            .validate_respond()
            .unwrap_err();
        assert!(
            err.contains("eval set \"e\"") && err.contains("e.jsonl"),
            "{err}"
        );
    }

    #[test]
    fn corpus_section_parses_with_defaults_and_paths_resolve_against_config_dir() {
        let text = r#"
            [model]
            path = "models/tiny.gguf"
            [corpus]
            n_ctx = 128
            [[corpus.domains]]
            name = "en"
            target_share = 1.0
            sources = [{ path = "en.jsonl" }, { path = "a.txt", separator = "\n\n" }]
        "#;
        let mut c = Config::parse(text).unwrap();
        c.base_dir = PathBuf::from("/cfg");
        assert_eq!(c.model_path(), PathBuf::from("/cfg/models/tiny.gguf"));
        assert_eq!(c.corpus.n_ctx, 128);
        assert_eq!(c.corpus.tolerance, 0.05);
        // A tenth held out unless asked otherwise, so the eval budget is
        // chosen on text the keep maps were not fitted on.
        assert_eq!(c.corpus.heldout_fraction, 0.1);
        assert_eq!(CorpusConfig::default().heldout_fraction, 0.1);
        assert_eq!(c.corpus.dedup, DedupConfig::default());
        let d = &c.corpus.domains[0];
        assert_eq!(d.sources[1].separator.as_deref(), Some("\n\n"));
        assert_eq!(d.sources[0].text_field, "text");
    }

    #[test]
    fn cluster_files_resolve_against_the_config_dir_not_the_working_dir() {
        let dir = std::env::temp_dir().join(format!("cfg-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.toml");
        let text =
            "[model]\npath = \"m.gguf\"\n[run]\nout = \"runs/r\"\n[cluster]\nca_dir = \"ca\"\n\
                    secret_file = \"/abs/secret\"\nconnect_file = \"run.connect.json\"\n\
                    identity_dir = \"id\"\n";
        std::fs::write(&path, text).unwrap();
        let c = Config::load(&path).unwrap();
        std::fs::write(&path, "[run]\nout = \"s3://b/r\"\n").unwrap();
        let url = Config::load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            url.run.out.as_deref(),
            Some("s3://b/r"),
            "a URL stays as it is"
        );
        assert_eq!(c.cluster.ca_dir, Some(dir.join("ca")));
        assert_eq!(c.cluster.secret_file, Some(PathBuf::from("/abs/secret")));
        assert_eq!(c.cluster.connect_file, Some(dir.join("run.connect.json")));
        assert_eq!(c.cluster.identity_dir, Some(dir.join("id")));
        assert_eq!(c.run.out, Some(dir.join("runs/r").display().to_string()));
    }

    #[test]
    fn a_ship_section_is_checked_on_load_and_absent_from_the_record_when_absent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Config::load(&path)
        };
        // No [ship]: nothing of it in the config a run records.
        let plain = load("[model]\npath = \"m.gguf\"\n").unwrap();
        assert_eq!(plain.ship, None);
        let recorded = serde_json::to_value(&plain).unwrap();
        assert!(recorded.get("ship").is_none(), "{recorded}");
        let c = load("[ship]\ncandidates = [\"frequency_K8\", \"base\"]\nquant = [\"Q4_K_M\"]\nout = \"shipped\"\n").unwrap();
        let ship = c.ship.as_ref().unwrap();
        assert!(ship.eval && !ship.allow_requantize);
        assert_eq!(ship.out, Some(dir.path().join("shipped")));
        let back: Config = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back.ship, c.ship);
        // Bad values name the file and the key.
        let e = load("[ship]\ncandidates = [\"frequency_K8\"]\nquant = [\"Q4_KM\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("[ship] quant")
                && e.contains("\"Q4_KM\""),
            "{e}"
        );
        let e = load("[ship]\ncandidates = [\"frequncy_K8\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("[ship] candidates"),
            "{e}"
        );
        let e = load("[ship]\ncandidates = [\"frequency_K8\"]\nevaluate = true\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("evaluate"),
            "{e}"
        );
    }

    #[test]
    fn unknown_corpus_fields_are_refused() {
        let err = Config::parse("[corpus]\nn_ctxx = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("n_ctxx"), "{err}");
    }
}
