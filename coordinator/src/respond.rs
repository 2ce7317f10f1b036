//! The response phase of `coordinator run`, before the corpus is packed
//! (only when a source sets `respond`): the prompts rendered by the corpus
//! crate are stored (`corpus/responses/prompts.json`), leased to the run's
//! workers ([`runtime::run::respond`]), and their responses stored with
//! their text, source record, prompt hash, model SHA-256, settings and
//! seed (`corpus/responses/responses.jsonl`), from which the corpus stage
//! then builds those sources.

use anyhow::Context;
use config::Config;
use corpus::tokenizer::{LlamaTokenizer, Tokenizer};
use gguf::hash::sha256_hex;
use protocol::wire::{RespondJob, Sampling};
use runfiles::respond::{PROMPTS_FILE, RESPONSES_FILE};
use runfiles::store::RunStore;
use runtime::run::crew::Crew;
use runtime::run::respond::{generate_locked, prompt_index, RespondSetup};
use runtime::run::RunSetup;
use std::sync::Arc;

/// Runs the response phase of `config` on `store` (the lock's fenced
/// store) with the run's `crew`; stored responses made under the same
/// settings are reused, others regenerated (named on the way).
pub async fn respond(config: &Config, store: &RunStore, crew: &mut Crew<'_>) -> anyhow::Result<()> {
    let settings = config.corpus.respond_settings();
    let model = std::path::absolute(config.model_path()).context("model path")?;
    let cfg = config.clone();
    let path = model.clone();
    let (file, tokenizer, model_sha256) = tokio::task::spawn_blocking(move || {
        let sha = gguf::hash::model_sha256(&path)
            .with_context(|| format!("hashing {}", path.display()))?;
        let tokenizer = LlamaTokenizer::load(&path, None)?;
        let file = corpus::respond::prompts(&cfg, &tokenizer, &sha)?;
        anyhow::Ok((file, tokenizer, sha))
    })
    .await??;
    if file.prompts.is_empty() {
        anyhow::bail!("the sources that set respond hold no records to answer");
    }
    let bytes = serde_json::to_vec(&file)?;
    let prompts_sha256 = sha256_hex(&bytes);
    put_if_changed(store, PROMPTS_FILE, bytes).await?;
    let n_prompts = u32::try_from(file.prompts.len()).context("more than 2^32 prompts")?;
    let most = u64::from(n_prompts) * u64::from(settings.n) * u64::from(settings.max_tokens);
    let job = RespondJob {
        prompts: PROMPTS_FILE.into(),
        prompts_sha256: prompts_sha256.clone(),
        sampling: Sampling {
            max_tokens: settings.max_tokens,
            n: settings.n,
            seed: settings.seed,
            temperature_bits: settings.temperature.to_bits(),
            top_p_bits: settings.top_p.to_bits(),
        },
    };
    let setup = RespondSetup {
        base: RunSetup {
            store: store.clone(),
            index: prompt_index(n_prompts, most, &prompts_sha256),
            model_sha256,
            model_path: model,
            mmproj: None,
            run: config.run.clone(),
            cluster: config.cluster.clone(),
        },
        job,
        n_vocab: tokenizer.info().n_vocab,
        lease_prompts: settings.lease_prompts,
    };
    let responded = generate_locked(&setup, crew).await?;
    let l = &responded.leases;
    println!(
        "responses: {n_prompts} prompts in {} leases ({} reused from {}, {} generated, {} retried)",
        l.units,
        l.resumed,
        store.url_of(runfiles::layout::RESPONSE_PARTIALS.dir),
        l.computed,
        l.retries
    );
    for (name, why) in &l.rejected {
        println!(
            "  regenerated the responses of {}: {why}",
            store.url_of(name)
        );
    }
    let (file, tokenizer) = (Arc::new(file), Arc::new(tokenizer));
    let stored = tokio::task::spawn_blocking(move || {
        corpus::respond::stored(&file, &responded.merged, &settings, &*tokenizer)
    })
    .await??;
    put_if_changed(
        store,
        RESPONSES_FILE,
        runfiles::respond::responses_jsonl(&stored).into_bytes(),
    )
    .await?;
    print!("{}", corpus::respond::summary(&stored));
    Ok(())
}

/// Writes `bytes` as `name` unless it already holds them (so a resumed run
/// rewrites nothing).
async fn put_if_changed(store: &RunStore, name: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
    if store.get_opt(name).await?.as_deref() != Some(bytes.as_slice()) {
        store.put(name, bytes).await?;
    }
    Ok(())
}
