//! The corpus pipeline without storage: read, template, tokenize, split,
//! deduplicate, measure shares, schedule and pack.

use super::chat::ChatKwargs;
use super::doc::Doc;
use super::error::CorpusError;
use super::pack::Piece;
use super::shares::{self, ShareRow};
use super::source::{read_source, Content, ImageRef, Record, SourceData};
use super::tokenizer::{tokenize_all, Tokenizer};
use super::{dedup, heldout, pack, schedule};
use config::{Config, CorpusConfig, SourceConfig};
use numbers::Split;
use rayon::prelude::*;
use runfiles::corpus::{write_chunks, Chunk, CorpusIndex, GroupInfo};
use runfiles::manifest::{
    ChunkPlan, DocRecord, DomainInfo, Dropped, EvalSetInfo, ImagesInfo, Manifest, SourceInfo,
    CORPUS_FORMAT,
};
use runfiles::respond::StoredResponse;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// A prepared corpus, ready to store.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The chunks in schedule order.
    pub chunks: Vec<Chunk>,
    /// Bytes of `corpus/chunks.parquet`.
    pub chunks_parquet: Vec<u8>,
    /// `corpus/index.json`.
    pub index: CorpusIndex,
    /// `manifest.json`.
    pub manifest: Manifest,
    /// Every document read, with its split and fate (`corpus/documents.jsonl`).
    pub documents: Vec<DocRecord>,
    /// The images the chunks carry, one per SHA-256, in hash order
    /// (stored as `corpus/images/<sha256>`).
    pub images: Vec<ImageRef>,
}

/// Checks the `[corpus]` section for contradictions before any work.
pub fn validate(c: &CorpusConfig) -> Result<(), CorpusError> {
    let bad = |m: String| Err(CorpusError::Config(m));
    if c.n_ctx == 0 {
        return bad("n_ctx must be positive".into());
    }
    if c.domains.is_empty() {
        return bad("[corpus] names no domains ([[corpus.domains]])".into());
    }
    if c.domains.len() > usize::from(u16::MAX) {
        return bad(format!(
            "{} domains is more than {}",
            c.domains.len(),
            u16::MAX
        ));
    }
    if !(0.0..=1.0).contains(&c.tolerance) {
        return bad(format!("tolerance {} is not in 0..1", c.tolerance));
    }
    if c.dedup.shingle == 0 || !(c.dedup.threshold > 0.0 && c.dedup.threshold <= 1.0) {
        return bad("dedup needs shingle >= 1 and 0 < threshold <= 1".into());
    }
    let mut names = BTreeSet::new();
    for d in &c.domains {
        if !names.insert(d.name.as_str()) {
            return bad(format!("domain {:?} is named twice", d.name));
        }
        if d.sources.is_empty() {
            return Err(CorpusError::EmptyDomain {
                domain: d.name.clone(),
                reason: "it lists no sources".into(),
            });
        }
        let f = d.heldout_fraction.unwrap_or(c.heldout_fraction);
        if !(0.0..1.0).contains(&f) {
            return bad(format!(
                "domain {:?}: heldout_fraction {f} is not in 0..1",
                d.name
            ));
        }
        if let Some(t) = d.target_share {
            if !(0.0..=1.0).contains(&t) {
                return bad(format!(
                    "domain {:?}: target_share {t} is not in 0..1",
                    d.name
                ));
            }
        }
    }
    for e in &c.eval_sets {
        if !names.insert(e.name.as_str()) {
            return bad(format!(
                "eval set {:?} is named as a domain or another eval set: it gets its own rows in \
                 the statistics and the eval table, so its name must be its own",
                e.name
            ));
        }
    }
    if c.domains.len() + c.eval_sets.len() > usize::from(u16::MAX) {
        return bad(format!(
            "{} domains and eval sets is more than {}",
            c.domains.len() + c.eval_sets.len(),
            u16::MAX
        ));
    }
    let with_target = c
        .domains
        .iter()
        .filter(|d| d.target_share.is_some())
        .count();
    if with_target != 0 && with_target != c.domains.len() {
        return bad("either every domain sets target_share or none does".into());
    }
    let sum: f64 = c.domains.iter().filter_map(|d| d.target_share).sum();
    if with_target != 0 && (sum - 1.0).abs() > 1e-6 {
        return bad(format!("target shares add up to {sum}, not 1"));
    }
    Ok(())
}

/// What a config with `[model] mmproj` adds to the inputs fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInputs {
    /// SHA-256 of the mmproj GGUF.
    pub mmproj_sha256: String,
    /// SHA-256 of every image of every record, in fingerprint order
    /// ([`all_sources`], then record order).
    pub image_sha256: Vec<String>,
}

/// The inputs fingerprint: model, corpus config and every source's content,
/// and with an mmproj its hash and every image's (absent otherwise, so a
/// text corpus keeps its fingerprint).
pub fn fingerprint(
    corpus: &CorpusConfig,
    model_sha256: &str,
    source_sha256: &[String],
    images: Option<&ImageInputs>,
) -> String {
    let mut v = serde_json::json!({
        "corpus_format": CORPUS_FORMAT,
        "model_sha256": model_sha256,
        "corpus": corpus,
        "sources": source_sha256,
    });
    if let Some(im) = images {
        v["mmproj_sha256"] = im.mmproj_sha256.clone().into();
        v["image_sha256"] = im.image_sha256.clone().into();
    }
    hex::encode(Sha256::digest(v.to_string().as_bytes()))
}

/// The SHA-256 of every image the corpus config's sources name, in
/// fingerprint order (the sources are read, and their images checked).
pub fn image_hashes(config: &Config) -> Result<Vec<String>, CorpusError> {
    let mut out = Vec::new();
    for s in all_sources(&config.corpus) {
        let data = read_source(s, &config.resolve(&s.path), None)?;
        out.extend(
            data.records
                .into_iter()
                .flat_map(|r| r.images.into_iter().map(|im| im.sha256)),
        );
    }
    Ok(out)
}

/// Every source of the corpus config in fingerprint order: domains, then eval sets.
pub fn all_sources(corpus: &CorpusConfig) -> impl Iterator<Item = &SourceConfig> {
    corpus
        .domains
        .iter()
        .flat_map(|d| &d.sources)
        .chain(corpus.eval_sets.iter().flat_map(|e| &e.sources))
}

struct Read {
    records: Vec<Record>,
    /// The exact token ids of each record, where the response phase fixed
    /// them (`respond = "continue"`).
    pinned: Vec<Option<Vec<i32>>>,
    sources: Vec<SourceInfo>,
    hashes: Vec<String>,
}

/// What the sources that set `respond` are rebuilt from.
struct Responding<'a> {
    responses: &'a [StoredResponse],
    tokenizer: &'a dyn Tokenizer,
}

fn read_all(
    config: &Config,
    sources: &[SourceConfig],
    group_key: Option<&str>,
    responding: Option<&Responding<'_>>,
) -> Result<Read, CorpusError> {
    let mut out = Read {
        records: Vec::new(),
        pinned: Vec::new(),
        sources: Vec::new(),
        hashes: Vec::new(),
    };
    for s in sources {
        let SourceData {
            sha256,
            bytes,
            records,
            files,
            skipped_binary,
            skipped_large,
            skipped_no_text,
        } = read_source(s, &config.resolve(&s.path), group_key)?;
        let many = files != 1 || skipped_binary + skipped_large > 0;
        out.sources.push(SourceInfo {
            path: s.path.display().to_string(),
            sha256: sha256.clone(),
            bytes,
            records: records.len() as u64,
            files: many.then_some(files),
            skipped_binary,
            skipped_large,
            skipped_no_text,
        });
        out.hashes.push(sha256);
        match (s.respond, responding) {
            (Some(mode), Some(r)) => {
                let name = super::respond::source_name(s);
                let mut map = super::respond::ResponseMap::new();
                for resp in r.responses.iter().filter(|x| x.source == name) {
                    map.entry((resp.at.as_str(), resp.turn))
                        .or_default()
                        .push(resp);
                }
                let settings = config.corpus.respond_settings();
                let made = super::respond::apply(records, mode, &map, &settings, r.tokenizer)?;
                for (rec, tokens) in made {
                    out.records.push(rec);
                    out.pinned.push(tokens);
                }
            }
            _ => {
                out.pinned.extend(records.iter().map(|_| None));
                out.records.extend(records);
            }
        }
    }
    Ok(out)
}

/// Runs the whole pipeline with `tokenizer` on the current rayon pool.
/// `model_sha256` goes into the fingerprint and the manifest.
pub fn prepare(
    config: &Config,
    tokenizer: &dyn Tokenizer,
    model_sha256: &str,
) -> Result<Prepared, CorpusError> {
    prepare_with_responses(config, tokenizer, model_sha256, &[])
}

/// The fingerprint entry of a corpus's stored responses (the SHA-256 of
/// their `responses.jsonl`), among the sources' hashes.
pub fn responses_hash(responses: &[StoredResponse]) -> String {
    let jsonl = runfiles::respond::responses_jsonl(responses);
    format!(
        "responses:{}",
        hex::encode(Sha256::digest(jsonl.as_bytes()))
    )
}

/// [`prepare`] with the response phase's stored `responses`, from which
/// the sources that set `respond` are rebuilt ([`super::respond::apply`]);
/// their hash enters the fingerprint when a source responds.
pub fn prepare_with_responses(
    config: &Config,
    tokenizer: &dyn Tokenizer,
    model_sha256: &str,
    responses: &[StoredResponse],
) -> Result<Prepared, CorpusError> {
    let c = &config.corpus;
    validate(c)?;
    let responding = c.responds().then_some(Responding {
        responses,
        tokenizer,
    });
    let names: Vec<String> = c.domains.iter().map(|d| d.name.clone()).collect();

    // Eval sets are domains of their own after the calibration domains.
    let all_names: Vec<String> = names
        .iter()
        .cloned()
        .chain(c.eval_sets.iter().map(|e| e.name.clone()))
        .collect();

    // Read every source, each record with its domain's index in `all_names`.
    let mut records: Vec<(u16, Record)> = Vec::new();
    let mut pinned: Vec<Option<Vec<i32>>> = Vec::new();
    let mut domain_sources = Vec::new();
    let mut hashes = Vec::new();
    for (i, d) in c.domains.iter().enumerate() {
        let group_key = d.group_key.as_deref().or(c.group_key.as_deref());
        let r = read_all(config, &d.sources, group_key, responding.as_ref())?;
        if r.records.is_empty() {
            return Err(CorpusError::EmptyDomain {
                domain: d.name.clone(),
                reason: "its sources hold no records".into(),
            });
        }
        domain_sources.push(r.sources);
        hashes.extend(r.hashes);
        pinned.extend(r.pinned);
        records.extend(r.records.into_iter().map(|rec| (i as u16, rec)));
    }
    let mut eval_infos = Vec::new();
    for (i, e) in c.eval_sets.iter().enumerate() {
        let r = read_all(config, &e.sources, None, None)?;
        pinned.extend(r.pinned);
        eval_infos.push(EvalSetInfo {
            name: e.name.clone(),
            sources: r.sources,
            ..EvalSetInfo::default()
        });
        hashes.extend(r.hashes);
        let domain = (names.len() + i) as u16;
        records.extend(r.records.into_iter().map(|rec| (domain, rec)));
    }

    // After every source's, as `prepare_run` fingerprints them.
    if responding.is_some() {
        hashes.push(responses_hash(responses));
    }

    // Template and tokenize everything, images through the mmproj.
    let at_of = |rec: &Record| config.resolve(Path::new(&rec.at)).display().to_string();
    let inputs: Vec<(String, bool, &[ImageRef])> = records
        .par_iter()
        .map(|(_, rec)| {
            if let (Some(image), None) = (rec.images.first(), &config.model.mmproj) {
                return Err(CorpusError::Record {
                    at: at_of(rec),
                    message: format!(
                        "carries image {:?}, but [model] mmproj is not set: name the model's \
                         mmproj GGUF there, so that images become the positions the model sees",
                        image.name
                    ),
                });
            }
            render(tokenizer, &rec.content, &c.chat_template_kwargs)
                .map(|(text, special)| (text, special, rec.images.as_slice()))
                .map_err(|message| CorpusError::Record {
                    at: at_of(rec),
                    message,
                })
        })
        .collect::<Vec<_>>()
        // In record order, so the error named is the first bad record's
        // (rayon's own collect into a Result stops at whichever fails first).
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut tokens =
        tokenize_all(tokenizer, &inputs).map_err(|(i, message)| CorpusError::Record {
            at: at_of(&records[i].1),
            message,
        })?;
    // A continued document is its prefix's tokens and the response's
    // exactly, not a new tokenization of their text.
    for (t, pin) in tokens.iter_mut().zip(pinned) {
        if let Some(ids) = pin {
            t.0 = ids;
        }
    }
    check_image_lengths(&records, &tokens, c.n_ctx, at_of)?;
    // Where each chat document's assistant turns start (text: none).
    let eos = {
        let info = tokenizer.info();
        info.add_eos.then_some(info.eos)
    };
    let starts: Vec<Option<Vec<u32>>> = records
        .par_iter()
        .zip(&tokens)
        .map(|((_, rec), (ids, images))| match &rec.content {
            Content::Chat(chat) if images.is_empty() => Some(super::turns::assistant_starts(
                tokenizer,
                chat,
                &c.chat_template_kwargs,
                ids,
                c.n_ctx as usize,
                eos,
            )),
            _ => None,
        })
        .collect();
    let chars: Vec<u64> = inputs
        .iter()
        .map(|(text, _, _)| text.chars().count() as u64)
        .collect();
    drop(inputs);
    let mmproj_sha256 = tokenizer.info().mmproj_sha256;
    let image_inputs = mmproj_sha256.clone().map(|m| ImageInputs {
        mmproj_sha256: m,
        image_sha256: records
            .iter()
            .flat_map(|(_, r)| r.images.iter().map(|im| im.sha256.clone()))
            .collect(),
    });
    let mut image_files: BTreeMap<String, ImageRef> = records
        .iter()
        .flat_map(|(_, r)| r.images.iter())
        .map(|im| (im.sha256.clone(), im.clone()))
        .collect();

    // Eval sets' documents are held out whole, each set a domain of its own
    // after the calibration domains (`all_names`): evaluated, never fitted
    // on, outside the shares, never dropped as duplicates.
    let mut docs = Vec::new();
    let mut eval_docs = Vec::new();
    let read = records.into_iter().zip(chars).zip(tokens);
    for (index, (((domain, rec), chars), (tokens, images))) in read.enumerate() {
        let eval = usize::from(domain) >= names.len();
        let group = match eval {
            true => format!("eval:{}", rec.at),
            false => rec.group.unwrap_or_else(|| format!("doc:{}", rec.at)),
        };
        let doc = Doc {
            index: index as u32,
            domain,
            group,
            at: rec.at,
            chars,
            tokens,
            images,
            split: if eval { Split::Heldout } else { Split::Fit },
        };
        match eval {
            true => eval_docs.push(doc),
            false => docs.push(doc),
        }
    }
    for d in &eval_docs {
        let info = &mut eval_infos[usize::from(d.domain) - names.len()];
        info.docs += 1;
        info.tokens += d.tokens.len() as u64;
    }
    for (i, name) in names.iter().enumerate() {
        if !docs
            .iter()
            .any(|d| d.domain as usize == i && !d.tokens.is_empty())
        {
            return Err(CorpusError::EmptyDomain {
                domain: name.clone(),
                reason: "its records hold no tokens".into(),
            });
        }
    }

    // Held-out split by group, then duplicate removal.
    let fractions: Vec<f64> = c
        .domains
        .iter()
        .map(|d| d.heldout_fraction.unwrap_or(c.heldout_fraction))
        .collect();
    heldout::assign(&mut docs, &names, &fractions, c.seed)?;
    let groups = Groups::of(docs.iter().chain(&eval_docs));
    let mut drops = duplicates(c, &all_names, &docs, &eval_docs);
    let over_share = super::sample::apply(c, &names, &docs, &mut drops);
    // Every document's record: the calibration domains', then the eval
    // sets' (never dropped).
    let documents: Vec<DocRecord> = docs
        .iter()
        .zip(&drops)
        .map(|(d, x)| doc_record(d, &all_names, x.as_ref(), &starts))
        .chain(
            eval_docs
                .iter()
                .map(|d| doc_record(d, &all_names, None, &starts)),
        )
        .collect();
    // The held-out share is a fraction of what duplicate removal keeps,
    // before fit text is left out over a share (which only shrinks the fit
    // split, as sampling intends).
    let after_dedup = docs.iter().zip(&drops).filter_map(|(d, x)| match x {
        Some(x) if x.rule != super::sample::OVER_SHARE => None,
        _ => Some(d),
    });
    heldout::check_shares(after_dedup, &names, &fractions)?;
    let mut drops = drops.into_iter();
    let mut dropped = Vec::new();
    docs.retain(|_| match drops.next().flatten() {
        // Documents left out over a share are listed in documents.jsonl
        // and counted per domain, not in the manifest's list of duplicates.
        Some(x) if x.rule == super::sample::OVER_SHARE => false,
        Some(x) => {
            dropped.push(x);
            false
        }
        None => true,
    });

    // Shares of what is kept, over both splits and over the fit split alone
    // (what the statistics are fitted on): both are checked.
    let totals_of = |fit_only: bool| {
        let mut totals = vec![(0u64, 0u64, 0u64); names.len()];
        for d in docs.iter().filter(|d| !fit_only || d.split == Split::Fit) {
            let t = &mut totals[d.domain as usize];
            t.0 += 1;
            t.1 += d.chars;
            t.2 += d.tokens.len() as u64;
        }
        totals
    };
    let totals = totals_of(false);
    for (i, t) in totals.iter().enumerate() {
        if t.2 == 0 {
            return Err(CorpusError::EmptyDomain {
                domain: names[i].clone(),
                reason: "every document was dropped as a duplicate".into(),
            });
        }
    }
    let targets: Vec<Option<f64>> = c.domains.iter().map(|d| d.target_share).collect();
    let rows = shares::measure(&names, &targets, &totals);
    let missed: Vec<String> = rows
        .iter()
        .filter(|r| !r.within(c.tolerance))
        .map(|r| r.domain.clone())
        .collect();
    // Sampling meets the shares of the fit split (what the statistics are
    // fitted on); the held-out split stays the configured fraction of each
    // domain, so the shares over both splits are checked only under
    // `shares = "verify"`.
    if !missed.is_empty() && c.shares == config::SharesMode::Verify {
        return Err(CorpusError::ShareMiss {
            domains: missed,
            tolerance: c.tolerance,
            table: shares::render(&rows, c.tolerance),
        });
    }
    let fit_rows = shares::measure(&names, &targets, &totals_of(true));
    let fit_missed: Vec<String> = fit_rows
        .iter()
        .filter(|r| !r.within(c.tolerance))
        .map(|r| format!("{} (fit split)", r.domain))
        .collect();
    if !fit_missed.is_empty() {
        return Err(CorpusError::ShareMiss {
            domains: fit_missed,
            tolerance: c.tolerance,
            table: format!(
                "fit split (the held-out split takes the rest):\n{}",
                shares::render(&fit_rows, c.tolerance)
            ),
        });
    }

    // Schedule and pack.
    // The calibration chunks, then each eval set's (never sharing a chunk
    // with calibration text, so adding an eval set leaves the calibration
    // chunks as they were).
    let mut chunks = schedule_and_pack(c, &names, &docs, &groups);
    let mix: Vec<f64> = rows.iter().map(|r| r.token_share).collect();
    let deviations = schedule::prefix_deviations(&chunks, &mix);
    let calibration_tokens: u64 = chunks.iter().map(|ch| ch.tokens.len() as u64).sum();
    pack_eval_sets(&mut chunks, &eval_docs, &groups, c.n_ctx);
    let n_tokens: u64 = chunks.iter().map(|ch| ch.tokens.len() as u64).sum();
    let split_tokens = |s: Split| {
        docs.iter()
            .filter(|d| d.split == s)
            .map(|d| d.tokens.len() as u64)
            .sum::<u64>()
    };
    let mut seen = 0u64;
    let after_10pct = chunks
        .iter()
        .zip(&deviations)
        .filter(|(ch, _)| {
            seen += ch.tokens.len() as u64;
            seen * 10 >= calibration_tokens
        })
        .map(|(_, d)| *d)
        .fold(0.0, f64::max);
    let chunk_plan = ChunkPlan {
        n_ctx: c.n_ctx,
        n_chunks: chunks.len() as u32,
        n_tokens,
        last_chunk_tokens: chunks.last().map_or(0, |ch| ch.tokens.len() as u32),
        fit_tokens: split_tokens(Split::Fit),
        heldout_tokens: split_tokens(Split::Heldout),
        worst_prefix_deviation: deviations.iter().copied().fold(0.0, f64::max),
        worst_prefix_deviation_after_10pct: after_10pct,
        docs: docs.len() as u64,
        seed: c.seed,
    };

    let chunks_parquet = write_chunks(&chunks).map_err(|message| CorpusError::Stored {
        url: runfiles::corpus::CHUNKS_FILE.into(),
        message,
    })?;
    let index = CorpusIndex {
        n_chunks: chunks.len() as u32,
        n_ctx: c.n_ctx,
        domains: all_names.clone(),
        n_tokens,
        chunks_sha256: hex::encode(Sha256::digest(&chunks_parquet)),
        eval_sets: c.eval_sets.iter().map(|e| e.name.clone()).collect(),
        groups: groups.list,
    };
    let mut domains = domain_infos(c, rows, &fit_rows, domain_sources, &docs, &dropped);
    for (info, &(n, tokens)) in domains.iter_mut().zip(&over_share) {
        (info.over_share_docs, info.over_share_tokens) = (n, tokens);
    }
    let in_chunks: BTreeSet<&str> = chunks
        .iter()
        .flat_map(|ch| ch.images.iter().map(|im| im.sha256.as_str()))
        .collect();
    image_files.retain(|sha, _| in_chunks.contains(sha.as_str()));
    let images = (!in_chunks.is_empty()).then(|| ImagesInfo {
        mmproj_sha256: mmproj_sha256.clone().unwrap_or_default(),
        images: in_chunks.len() as u64,
        occurrences: chunks.iter().map(|ch| ch.images.len() as u64).sum(),
        positions: chunks
            .iter()
            .flat_map(|ch| &ch.images)
            .map(|im| u64::from(im.len))
            .sum(),
    });
    let manifest = Manifest {
        corpus_format: CORPUS_FORMAT,
        inputs_sha256: fingerprint(c, model_sha256, &hashes, image_inputs.as_ref()),
        model_sha256: model_sha256.to_string(),
        tokenizer: tokenizer.info(),
        config: serde_json::to_value(config).unwrap_or_default(),
        domains,
        eval_sets: eval_infos,
        dropped,
        chunk_plan,
        chunks_sha256: index.chunks_sha256.clone(),
        index_sha256: hex::encode(Sha256::digest(index.encode().as_bytes())),
        images,
    };
    Ok(Prepared {
        chunks,
        chunks_parquet,
        index,
        manifest,
        documents,
        images: image_files.into_values().collect(),
    })
}

/// Refuses an image that takes more positions than a chunk holds (it could
/// not be packed without cutting it), naming the record and the image.
fn check_image_lengths(
    records: &[(u16, Record)],
    tokens: &[super::vision::ImageTokens],
    n_ctx: u32,
    at_of: impl Fn(&Record) -> String,
) -> Result<(), CorpusError> {
    for ((_, rec), (_, spans)) in records.iter().zip(tokens) {
        if let Some((k, s)) = spans.iter().enumerate().find(|(_, s)| s.len > n_ctx) {
            return Err(CorpusError::Record {
                at: at_of(rec),
                message: format!(
                    "image {:?} takes {} positions, more than n_ctx = {n_ctx} ([corpus]): it \
                     cannot be packed without cutting it (raise n_ctx)",
                    rec.images[k].name, s.len
                ),
            });
        }
    }
    Ok(())
}

/// Text to tokenize for a record, and whether special-token text in it is
/// parsed as special tokens (only for templated chat: the template's markers
/// must become control tokens, while plain text that happens to contain
/// `<|im_end|>` must not).
pub fn render(
    tokenizer: &dyn Tokenizer,
    content: &Content,
    kwargs: &ChatKwargs,
) -> Result<(String, bool), String> {
    match content {
        Content::Text(t) => Ok((t.clone(), false)),
        Content::Chat(chat) => Ok((tokenizer.apply_chat_template(chat, kwargs)?, true)),
    }
}

/// `corpus/documents.jsonl`: one JSON line per document.
pub fn documents_jsonl(docs: &[DocRecord]) -> String {
    docs.iter()
        .map(|d| serde_json::to_string(d).unwrap_or_default() + "\n")
        .collect()
}

/// Finds the documents to drop, one entry per document, in passes:
///
/// 1. Exact copies, by [`dedup::exact_key`]: every copy of an eval-set
///    document (`exact_duplicate_of_eval`); every fit copy of a held-out
///    document (`exact_duplicate_of_heldout`); and within one split, every
///    copy after the first in read order (`exact_duplicate_within_split`),
///    so a repeated document weighs once in the statistics and in held-out
///    figures.
/// 2. Near-duplicates of eval-set documents, then fit documents that
///    near-duplicate a held-out one (`near_duplicate_of_eval`,
///    `near_duplicate_of_heldout`), every pass at the configured threshold:
///    on boilerplate-free shingles; for documents that are mostly
///    boilerplate shingles on whole shingle sets (the family pass); and on
///    shingles stripped only of what is common among the references
///    ([`dedup::strip_common_to`]), so a fit document that contains a
///    held-out or eval-set document (or most of it) is dropped however many
///    others contain it too.
pub(crate) fn duplicates(
    c: &CorpusConfig,
    names: &[String],
    docs: &[Doc],
    evals: &[Doc],
) -> Vec<Option<Dropped>> {
    let mut drop: Vec<Option<Dropped>> = vec![None; docs.len()];
    let dropped = |i: usize, rule: &str, of: String, overlap: f64| Dropped {
        at: docs[i].at.clone(),
        domain: names[docs[i].domain as usize].clone(),
        rule: rule.into(),
        duplicate_of: of,
        overlap,
    };
    let eval_name = |r: usize| format!("{}: {}", names[evals[r].domain as usize], evals[r].at);

    // Exact copies.
    let keys: Vec<[u8; 32]> = docs
        .par_iter()
        .map(|d| dedup::exact_key(&d.tokens))
        .collect();
    let mut eval_keys: HashMap<[u8; 32], usize> = HashMap::new();
    for (r, e) in evals.iter().enumerate() {
        if !e.tokens.is_empty() {
            eval_keys.entry(dedup::exact_key(&e.tokens)).or_insert(r);
        }
    }
    let mut first: HashMap<(Split, [u8; 32]), usize> = HashMap::new();
    for split in [Split::Heldout, Split::Fit] {
        for i in (0..docs.len()).filter(|&i| docs[i].split == split && !docs[i].tokens.is_empty()) {
            if let Some(&r) = eval_keys.get(&keys[i]) {
                drop[i] = Some(dropped(i, "exact_duplicate_of_eval", eval_name(r), 1.0));
            } else if let (Split::Fit, Some(&h)) = (split, first.get(&(Split::Heldout, keys[i]))) {
                let of = docs[h].at.clone();
                drop[i] = Some(dropped(i, "exact_duplicate_of_heldout", of, 1.0));
            } else if let Some(&j) = first.get(&(split, keys[i])) {
                let of = docs[j].at.clone();
                drop[i] = Some(dropped(i, "exact_duplicate_within_split", of, 1.0));
            } else {
                first.insert((split, keys[i]), i);
            }
        }
    }

    // Near-duplicates among what is left.
    let w = c.dedup.shingle;
    let live: Vec<usize> = (0..docs.len()).filter(|&i| drop[i].is_none()).collect();
    let whole: Vec<Vec<u64>> = live
        .par_iter()
        .map(|&i| docs[i].tokens.as_slice())
        .chain(evals.par_iter().map(|e| e.tokens.as_slice()))
        .map(|t| dedup::shingles(t, w))
        .collect();
    let stripped = dedup::strip_boilerplate(&whole, c.dedup.max_doc_freq);
    let n = live.len();
    let references: Vec<usize> = (0..n)
        .filter(|&x| docs[live[x]].split == Split::Heldout)
        .chain(n..whole.len())
        .collect();
    let contained = dedup::strip_common_to(&whole, &references, c.dedup.max_doc_freq);
    // (candidate positions in `live`, reference positions in `whole`, rule).
    let find =
        |drop: &mut Vec<Option<Dropped>>, cands: Vec<usize>, refs: Vec<usize>, rule: &str| {
            for (sets, family) in [(&stripped.sets, false), (&whole, true), (&contained, false)] {
                let pick = |v: &[usize]| -> Vec<usize> {
                    v.iter()
                        .copied()
                        .filter(|&x| !family || stripped.mostly_common[x])
                        .collect()
                };
                let cands: Vec<usize> = pick(&cands)
                    .into_iter()
                    .filter(|&x| drop[live[x]].is_none())
                    .collect();
                let refs = pick(&refs);
                if cands.is_empty() || refs.is_empty() {
                    continue;
                }
                let cs: Vec<&[u64]> = cands.iter().map(|&x| sets[x].as_slice()).collect();
                let rs: Vec<&[u64]> = refs.iter().map(|&x| sets[x].as_slice()).collect();
                for (k, m) in dedup::near_dups(&cs, &rs, c.dedup.threshold)
                    .into_iter()
                    .enumerate()
                {
                    if let Some(m) = m {
                        let i = live[cands[k]];
                        let r = refs[m.reference];
                        let of = if r >= n {
                            eval_name(r - n)
                        } else {
                            docs[live[r]].at.clone()
                        };
                        drop[i] = Some(dropped(i, rule, of, m.overlap));
                    }
                }
            }
        };
    find(
        &mut drop,
        (0..n).collect(),
        (n..whole.len()).collect(),
        "near_duplicate_of_eval",
    );
    let on = |s: Split| -> Vec<usize> { (0..n).filter(|&x| docs[live[x]].split == s).collect() };
    let held: Vec<usize> = on(Split::Heldout)
        .into_iter()
        .filter(|&x| drop[live[x]].is_none())
        .collect();
    find(&mut drop, on(Split::Fit), held, "near_duplicate_of_heldout");
    drop
}

/// What `documents.jsonl` records of a document: `names` its domain's
/// name, `dropped` the rule that dropped it, `starts` every document's
/// assistant-turn starts by index.
fn doc_record(
    d: &Doc,
    names: &[String],
    dropped: Option<&Dropped>,
    starts: &[Option<Vec<u32>>],
) -> DocRecord {
    DocRecord {
        at: d.at.clone(),
        domain: names[d.domain as usize].clone(),
        group: d.group.clone(),
        split: d.split,
        tokens: d.tokens.len() as u64,
        chars: d.chars,
        dropped: dropped.map(|x| x.rule.clone()),
        assistant_starts: starts.get(d.index as usize).cloned().flatten(),
    }
}

/// The corpus's document groups ([`CorpusIndex::groups`]), ordered by
/// (domain, key), and each one's index.
struct Groups {
    list: Vec<GroupInfo>,
    ids: HashMap<(u16, String), u32>,
}

impl Groups {
    /// The groups of `docs`, each split as assigned.
    fn of<'a>(docs: impl IntoIterator<Item = &'a Doc>) -> Groups {
        let sides: BTreeMap<(u16, &str), Split> = docs
            .into_iter()
            .map(|d| ((d.domain, d.group.as_str()), d.split))
            .collect();
        let list: Vec<GroupInfo> = sides
            .into_iter()
            .map(|((domain, key), split)| GroupInfo {
                domain,
                split,
                key: key.to_string(),
            })
            .collect();
        let ids = list
            .iter()
            .enumerate()
            .map(|(i, g)| ((g.domain, g.key.clone()), i as u32))
            .collect();
        Groups { list, ids }
    }

    /// What packing takes of `d`: its tokens and images with its labels.
    fn piece<'a>(&self, d: &'a Doc) -> Piece<'a> {
        Piece {
            tokens: &d.tokens,
            images: &d.images,
            split: d.split,
            domain: d.domain,
            doc: d.index,
            group: self.ids[&(d.domain, d.group.clone())],
        }
    }
}

/// Appends the eval sets' chunks after `chunks`: each set's documents in
/// file order, packed alone, numbered on from the last chunk.
fn pack_eval_sets(chunks: &mut Vec<Chunk>, eval_docs: &[Doc], groups: &Groups, n_ctx: u32) {
    // The documents come set by set, in read order.
    for set in eval_docs.chunk_by(|a, b| a.domain == b.domain) {
        let first = chunks.len() as u32;
        let packed = pack::pack(
            set.iter()
                .filter(|d| !d.tokens.is_empty())
                .map(|d| groups.piece(d)),
            n_ctx as usize,
        );
        chunks.extend(packed.into_iter().map(|mut ch| {
            ch.id = numbers::ChunkId(first + ch.id.0);
            ch
        }));
    }
}

/// Orders documents per (split, domain) stream and interleaves the streams;
/// then packs each split's documents, in that order, into chunks of their
/// own (so held-out positions never attend to fit text, nor fit positions
/// to held-out text) and interleaves the two splits' chunks by tokens, so
/// every prefix of the schedule keeps both splits' shares.
fn schedule_and_pack(
    c: &CorpusConfig,
    names: &[String],
    docs: &[Doc],
    groups: &Groups,
) -> Vec<Chunk> {
    let mut streams: Vec<Vec<usize>> = Vec::new();
    for split in Split::ALL {
        for domain in 0..names.len() {
            let mut s: Vec<usize> = (0..docs.len())
                .filter(|&i| {
                    docs[i].split == split
                        && docs[i].domain as usize == domain
                        && !docs[i].tokens.is_empty()
                })
                .collect();
            if !s.is_empty() {
                schedule::shuffle(&mut s, |i| docs[i].at.clone(), c.seed);
                streams.push(s);
            }
        }
    }
    let order = schedule::interleave(&streams, |i| docs[i].tokens.len() as u64);
    let mut packed: Vec<Option<Chunk>> = Vec::new();
    let mut chunk_streams: Vec<Vec<usize>> = Vec::new();
    for split in Split::ALL {
        let chunks = pack::pack(
            order
                .iter()
                .filter(|&&i| docs[i].split == split)
                .map(|&i| groups.piece(&docs[i])),
            c.n_ctx as usize,
        );
        chunk_streams.push((packed.len()..packed.len() + chunks.len()).collect());
        packed.extend(chunks.into_iter().map(Some));
    }
    let tokens = |i: usize| packed[i].as_ref().map_or(0, |ch| ch.tokens.len() as u64);
    let chunk_order = schedule::interleave(&chunk_streams, tokens);
    chunk_order
        .into_iter()
        .enumerate()
        .filter_map(|(id, i)| {
            let mut ch = packed[i].take()?;
            ch.id = numbers::ChunkId(id as u32);
            Some(ch)
        })
        .collect()
}

fn domain_infos(
    c: &CorpusConfig,
    rows: Vec<ShareRow>,
    fit_rows: &[ShareRow],
    sources: Vec<Vec<SourceInfo>>,
    docs: &[Doc],
    dropped: &[Dropped],
) -> Vec<DomainInfo> {
    rows.into_iter()
        .zip(sources)
        .enumerate()
        .map(|(i, (shares, sources))| {
            let d = &c.domains[i];
            let mine = || docs.iter().filter(|doc| doc.domain as usize == i);
            let tokens = |s: Split| {
                mine()
                    .filter(|doc| doc.split == s)
                    .map(|doc| doc.tokens.len() as u64)
                    .sum::<u64>()
            };
            let groups = |s: Split| {
                mine()
                    .filter(|doc| doc.split == s)
                    .map(|doc| &doc.group)
                    .collect::<BTreeSet<_>>()
                    .len() as u64
            };
            let drops = |rule: &str| {
                dropped
                    .iter()
                    .filter(|x| x.domain == d.name && x.rule == rule)
                    .count() as u64
            };
            let (fit_tokens, heldout_tokens) = (tokens(Split::Fit), tokens(Split::Heldout));
            DomainInfo {
                shares,
                fit_share: fit_rows[i].token_share,
                heldout_share: heldout_tokens as f64 / (fit_tokens + heldout_tokens).max(1) as f64,
                sources,
                heldout_fraction: d.heldout_fraction.unwrap_or(c.heldout_fraction),
                group_key: d.group_key.clone().or(c.group_key.clone()),
                fit_tokens,
                heldout_tokens,
                fit_groups: groups(Split::Fit),
                heldout_groups: groups(Split::Heldout),
                dropped_near_heldout: drops("near_duplicate_of_heldout"),
                dropped_near_eval: drops("near_duplicate_of_eval"),
                dropped_exact_heldout: drops("exact_duplicate_of_heldout"),
                dropped_exact_eval: drops("exact_duplicate_of_eval"),
                dropped_exact_within: drops("exact_duplicate_within_split"),
                // Counted by the share sampling ([`super::sample::apply`]).
                over_share_docs: 0,
                over_share_tokens: 0,
            }
        })
        .collect()
}
