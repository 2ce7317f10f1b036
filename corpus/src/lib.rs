//! `coordinator corpus`: turn per-domain source files into the tokenized,
//! split, deduplicated, balanced and packed corpus that workers read.
//!
//! - [`source`] reads JSONL / Parquet / text records ([`chat`] messages
//!   and images among them, each checked by [`image_file`]); [`tokenizer`] applies the model's chat
//!   template and tokenizes in parallel, images through [`vision`] (mtmd).
//! - [`heldout`] splits by document group; [`dedup`] drops exact copies and
//!   near-duplicates.
//! - [`shares`] measures and checks token shares; [`schedule`] orders and
//!   [`pack`] cuts the chunks; [`prepare`] runs all of it without storage.
//! - [`respond`]: the response phase's prompts, stored responses and the
//!   records rebuilt from them (sources with `respond`).
//! - [`prepare_run`] stores the corpus under a run (its section of
//!   `manifest.json`, whose schema the run location owns), reusing it when
//!   the inputs are unchanged.
//!
//! The only crate besides the worker that links llama.cpp (for the model's
//! tokenizer and mtmd); nothing after it in the data flow depends on it.
#![deny(missing_docs)]
// Unsafe code only in the chat template's metered allocator
// (`template::budget`), which allows it there.
#![deny(unsafe_code)]

pub mod chat;
pub mod dedup;
pub mod doc;
pub mod error;
pub mod files;
pub mod heldout;
pub mod image_file;
pub mod json_array;
pub mod media;
pub mod pack;
pub mod prepare;
pub mod respond;
pub mod sample;
pub mod schedule;
pub mod shares;
pub mod source;
pub mod template;
pub mod tokenizer;
pub mod turns;
pub mod vision;

#[cfg(test)]
mod tests;

use config::Config;
pub use error::CorpusError;
use runfiles::corpus::CHUNKS_FILE;
use runfiles::layout::MANIFEST_JSON;
pub use runfiles::manifest::{self, Manifest};
use runfiles::store::RunStore;
use sha2::{Digest, Sha256};
use std::path::Path;

/// What [`prepare_run`] did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The run's manifest.
    pub manifest: Manifest,
    /// True when the stored corpus was reused as is.
    pub reused: bool,
}

/// The default run location for a config: `runs/<stem>`.
pub fn default_out(config: &Path) -> String {
    let stem = config.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
    format!("runs/{stem}")
}

/// SHA-256 of the model (every file of a split one), with a progress bar
/// on stderr: a model of hundreds of GB takes minutes.
fn model_sha256(model: &Path) -> Result<String, CorpusError> {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "hashing the model {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let sha = gguf::hash::model_sha256_with(model, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    sha.map_err(|source| CorpusError::Io {
        path: model.to_path_buf(),
        source,
    })
}

/// SHA-256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String, CorpusError> {
    gguf::hash::sha256_file(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the corpus section of a run's `manifest.json`, if there is one.
pub async fn read_manifest(store: &RunStore) -> Result<Option<Manifest>, CorpusError> {
    use runfiles::manifest::ManifestError;
    match runfiles::manifest::read(store).await {
        Ok(m) => Ok(m.map(|m| m.corpus)),
        Err(ManifestError::Store(e)) => Err(e.into()),
        Err(ManifestError::Corrupt { url, reason }) => Err(CorpusError::Stored {
            url,
            message: format!("not a manifest ({reason})"),
        }),
    }
}

/// Prepares the corpus of `config` under `store`, or reuses the one stored
/// there when it was made from the same inputs (model, corpus config, source
/// contents). A corpus from other inputs is replaced only with `force`.
/// Nothing is written unless the whole corpus was prepared and its shares hold;
/// the manifest is written last.
pub async fn prepare_run(
    config: &Config,
    store: &RunStore,
    force: bool,
) -> Result<Outcome, CorpusError> {
    prepare_run_with(config, store, force, tokenizer::LlamaTokenizer::load).await
}

/// Loads the tokenizer of a model (its path) with its mmproj (when set).
pub type TokenizerLoader<T> = fn(&Path, Option<&Path>) -> Result<T, CorpusError>;

/// [`prepare_run`] with another tokenizer loader (tests use a stand-in).
pub async fn prepare_run_with<T: tokenizer::Tokenizer + Send + 'static>(
    config: &Config,
    store: &RunStore,
    force: bool,
    load: TokenizerLoader<T>,
) -> Result<Outcome, CorpusError> {
    prepare::validate(&config.corpus)?;
    let model = config.model_path();
    if config.model.path.as_os_str().is_empty() {
        return Err(CorpusError::Config("[model] path is not set".into()));
    }
    let model_sha = model_sha256(&model)?;
    let hashes = prepare::all_sources(&config.corpus)
        .map(|s| source::hash_source(s, &config.resolve(&s.path)))
        .collect::<Result<Vec<_>, _>>()?;
    // With an mmproj, the images enter the fingerprint: the sources are
    // read for their images' hashes, so a changed image is a changed input.
    let images = match config.mmproj_path() {
        Some(m) => Some(prepare::ImageInputs {
            mmproj_sha256: sha256_file(&m)?,
            image_sha256: prepare::image_hashes(config)?,
        }),
        None => None,
    };
    let responses = match config.corpus.responds() {
        true => stored_responses(store).await?,
        false => Vec::new(),
    };
    let mut hashes = hashes;
    if config.corpus.responds() {
        hashes.push(prepare::responses_hash(&responses));
    }
    let inputs = prepare::fingerprint(&config.corpus, &model_sha, &hashes, images.as_ref());
    let corpus = store.child(runfiles::layout::CORPUS_DIR);
    // A manifest the response phase started (its records only) holds no corpus yet.
    let existing = read_manifest(store)
        .await?
        .filter(|m| !m.inputs_sha256.is_empty());
    if let Some(m) = &existing {
        if m.inputs_sha256 == inputs {
            let stored = corpus.get_opt(CHUNKS_FILE).await?;
            if stored.is_some_and(|b| hex::encode(Sha256::digest(&b)) == m.chunks_sha256) {
                return Ok(Outcome {
                    manifest: m.clone(),
                    reused: true,
                });
            }
        } else if !force {
            return Err(CorpusError::Exists {
                url: store.url_of(MANIFEST_JSON),
                stored: m.inputs_sha256.clone(),
                now: inputs,
            });
        }
    }
    let cfg = config.clone();
    let prepared = tokio::task::spawn_blocking(move || {
        let tokenizer = load(&cfg.model_path(), cfg.mmproj_path().as_deref())?;
        prepare::prepare_with_responses(&cfg, &tokenizer, &model_sha, &responses)
    })
    .await
    .map_err(|e| CorpusError::Config(format!("corpus preparation panicked: {e}")))??;
    debug_assert_eq!(prepared.manifest.inputs_sha256, inputs);
    corpus.put(CHUNKS_FILE, prepared.chunks_parquet).await?;
    prepared.index.write(&corpus).await?;
    corpus
        .put(
            manifest::DOCUMENTS_FILE,
            prepare::documents_jsonl(&prepared.documents),
        )
        .await?;
    for image in &prepared.images {
        corpus
            .put(
                &runfiles::layout::corpus::image(&image.sha256),
                image_bytes(image)?,
            )
            .await?;
    }
    // A new corpus starts a new manifest: records of results computed from
    // another corpus are dropped with it; those of the responses it was
    // built from are kept.
    let before = runfiles::manifest::read(store).await.ok().flatten();
    let manifest = runfiles::manifest::RunManifest {
        corpus: prepared.manifest.clone(),
        response_partials: before.map(|m| m.response_partials).unwrap_or_default(),
        ..Default::default()
    };
    runfiles::manifest::write(store, &manifest).await?;
    Ok(Outcome {
        manifest: prepared.manifest,
        reused: false,
    })
}

/// The response phase's stored responses (`corpus/responses/responses.jsonl`);
/// a config with responding sources and none stored is an error naming the file.
async fn stored_responses(
    store: &RunStore,
) -> Result<Vec<runfiles::respond::StoredResponse>, CorpusError> {
    let name = runfiles::respond::RESPONSES_FILE;
    let url = store.url_of(name);
    let bytes = store
        .get_opt(name)
        .await?
        .ok_or_else(|| CorpusError::Stored {
            url: url.clone(),
            message: "absent: sources with respond are built from the responses the response \
                      phase of `coordinator run` stores there"
                .into(),
        })?;
    runfiles::respond::read_responses(&bytes)
        .map_err(|message| CorpusError::Stored { url, message })
}

/// The bytes of an image the chunks carry, checked against the hash they
/// were tokenized with (a file changed since is an error, not a stale object).
fn image_bytes(image: &media::ImageRef) -> Result<Vec<u8>, CorpusError> {
    let bytes = image_file::read_bounded(&image.path).map_err(|message| CorpusError::Source {
        path: image.path.clone(),
        message,
    })?;
    if hex::encode(Sha256::digest(&bytes)) != image.sha256 {
        return Err(CorpusError::Source {
            path: image.path.clone(),
            message: "the image changed while the corpus was prepared".into(),
        });
    }
    Ok(bytes)
}

/// The summary printed after the share table.
pub fn summary(m: &Manifest) -> String {
    let p = &m.chunk_plan;
    let mut s = format!(
        "{} tokens in {} chunks of n_ctx {} (last chunk {} tokens); fit {} tokens, held-out {} tokens\n\
         worst prefix deviation from the corpus mix: {:.4} (from 10% of the tokens on: {:.4})\n",
        p.n_tokens,
        p.n_chunks,
        p.n_ctx,
        p.last_chunk_tokens,
        p.fit_tokens,
        p.heldout_tokens,
        p.worst_prefix_deviation,
        p.worst_prefix_deviation_after_10pct
    );
    if let Some(im) = &m.images {
        s += &format!(
            "{} image occurrences ({} distinct images) take {} positions (mmproj {})\n",
            im.occurrences,
            im.images,
            im.positions,
            &im.mmproj_sha256[..im.mmproj_sha256.len().min(12)]
        );
    }
    for d in &m.domains {
        let target = d
            .shares
            .target
            .map_or(String::new(), |t| format!(" (target {:.2}%)", 100.0 * t));
        s += &format!(
            "{}: fit {} tokens in {} groups ({:.2}% of the fit split{target}), held-out {} tokens in {} groups ({:.2}% of the domain, fraction {:.2}%)\n",
            d.shares.domain,
            d.fit_tokens,
            d.fit_groups,
            100.0 * d.fit_share,
            d.heldout_tokens,
            d.heldout_groups,
            100.0 * d.heldout_share,
            100.0 * d.heldout_fraction,
        );
        s += &format!(
            "{}: dropped {} exact copies and {} near-duplicates of held-out, {} exact copies and {} near-duplicates of eval sets, {} repeated exact copies within a split\n",
            d.shares.domain,
            d.dropped_exact_heldout,
            d.dropped_near_heldout,
            d.dropped_exact_eval,
            d.dropped_near_eval,
            d.dropped_exact_within,
        );
        if d.over_share_docs > 0 {
            s += &format!(
                "{}: left out {} fit tokens in {} documents over its target share (shares = \"sample\")\n",
                d.shares.domain, d.over_share_tokens, d.over_share_docs,
            );
        }
        for src in d.sources.iter().filter(|src| src.files.is_some()) {
            s += &format!(
                "  {}: {} files read ({} records), {} binary and {} over max_file_bytes skipped\n",
                src.path,
                src.files.unwrap_or(0),
                src.records,
                src.skipped_binary,
                src.skipped_large
            );
        }
        for src in d.sources.iter().filter(|src| src.skipped_no_text > 0) {
            s += &format!(
                "  {}: {} records without text skipped (null, empty or absent text or messages)\n",
                src.path, src.skipped_no_text
            );
        }
    }
    s
}
