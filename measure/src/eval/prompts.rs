//! The generation check's prompts ([`numbers::eval::generation`]): per
//! calibration domain and eval set, up to `[eval] generate_prompts` held-out
//! documents, each giving one prompt:
//!
//! - a chat document (one `corpus/documents.jsonl` gives assistant-turn
//!   starts for): its tokens up to the first assistant turn's start that
//!   leaves room for the continuation, so the prompt ends with the
//!   template's generation prompt and the models write the assistant's
//!   answer; a conversation without one gives no prompt;
//! - any other document: its first `n_ctx / 2` tokens; a shorter one gives
//!   no prompt.
//!
//! A document's tokens are read across the chunks it continues into; the
//! chunk where it starts names the lease that continues it. Documents are
//! taken in chunk order, one per group before a group's second, so the
//! prompts spread over the held-out groups; domains take turns until each
//! has its prompts or the job's token budget ([`MAX_PROMPT_TOKENS`], which
//! keeps the job within a control frame) is spent. A domain without a
//! prompt is named in the job with why (the eval table prints it).

use super::EvalRunError;
use crate::MeasureError;
use config::eval::EvalSettings;
use numbers::eval::generation::{GenerateJob, Prompt};
use numbers::split::Split;
use runfiles::corpus::{Chunk, CorpusIndex, CHUNKS_FILE};
use runfiles::manifest::DOCUMENTS_FILE;
use runfiles::store::RunStore;
use std::collections::{BTreeMap, HashMap};

/// Most prompt tokens in a job, over every prompt: 65,536 tokens stay
/// within a third of a control frame (`protocol::wire::MAX_CONTROL_FRAME`)
/// at five bytes a token.
pub const MAX_PROMPT_TOKENS: usize = 1 << 16;

/// The generation job of an evaluation of the run in `store`, whose corpus
/// `index` says.
pub async fn job(
    store: &RunStore,
    settings: &EvalSettings,
    index: &CorpusIndex,
) -> Result<GenerateJob, MeasureError> {
    if settings.generate_prompts == 0 || settings.generate_tokens == 0 {
        return Ok(GenerateJob::default());
    }
    let corpus = store.child("corpus");
    let table = corpus.get(CHUNKS_FILE).await?;
    let documents = corpus.get(DOCUMENTS_FILE).await?;
    let what = corpus.url_of(CHUNKS_FILE);
    let docs_what = corpus.url_of(DOCUMENTS_FILE);
    let picking = Picking {
        per_domain: settings.generate_prompts,
        n_ctx: index.n_ctx,
        new_tokens: settings.generate_tokens,
        noise_ubatch: settings.generate_noise_ubatch,
    };
    let n_domains = index.domains.len();
    let picked = tokio::task::spawn_blocking(move || {
        let chunks =
            runfiles::corpus::read_chunks(table, None).map_err(|e| format!("{what}: {e}"))?;
        let starts = assistant_starts(&documents).map_err(|e| format!("{docs_what}: {e}"))?;
        Ok::<_, String>(pick(&chunks, &starts, n_domains, &picking))
    })
    .await
    .map_err(|e| EvalRunError::Setup(format!("picking generation prompts panicked: {e}")))?
    .map_err(EvalRunError::Setup)?;
    Ok(picked)
}

/// The assistant-turn starts of every chat document of
/// `corpus/documents.jsonl`, by document index (its line).
pub fn assistant_starts(documents: &[u8]) -> Result<HashMap<u32, Vec<u32>>, String> {
    #[derive(serde::Deserialize)]
    struct Starts {
        assistant_starts: Option<Vec<u32>>,
    }
    let mut out = HashMap::new();
    for (i, line) in documents.split(|&b| b == b'\n').enumerate() {
        // Only chat documents carry the key: the rest are not parsed.
        if !line.windows(18).any(|w| w == b"\"assistant_starts\"") {
            continue;
        }
        let s: Starts = serde_json::from_slice(line)
            .map_err(|e| format!("line {} is not a document record ({e})", i + 1))?;
        if let Some(starts) = s.assistant_starts {
            out.insert(i as u32, starts);
        }
    }
    Ok(out)
}

/// What prompts are picked by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picking {
    /// Prompts per domain.
    pub per_domain: u32,
    /// The corpus's context size.
    pub n_ctx: u32,
    /// Greedy tokens after each prompt (at most half the context).
    pub new_tokens: u32,
    /// The noise floor's micro-batch (0: none).
    pub noise_ubatch: u32,
}

/// A held-out document as the chunks give it.
struct Held {
    domain: u16,
    group: u32,
    doc: u32,
    /// The chunk where it starts.
    chunk: u32,
    /// Its first tokens (at most a context's).
    tokens: Vec<i32>,
    /// Whether any of its positions is an image's.
    image: bool,
}

/// Picks the prompts from `chunks` (every chunk, by id) of a corpus of
/// `n_domains` domains, chat documents' assistant-turn starts in `starts`
/// (see the module doc).
pub fn pick(
    chunks: &[Chunk],
    starts: &HashMap<u32, Vec<u32>>,
    n_domains: usize,
    p: &Picking,
) -> GenerateJob {
    let new_tokens = p.new_tokens.min(p.n_ctx / 2);
    if p.per_domain == 0 || new_tokens == 0 {
        return GenerateJob::default();
    }
    let text_len = (p.n_ctx / 2) as usize;
    let chat_limit = (p.n_ctx - new_tokens) as usize;
    let held = held_out_documents(chunks, p.n_ctx as usize);
    let mut eligible: BTreeMap<u16, Vec<Prompt>> = BTreeMap::new();
    let mut rank_in_group: HashMap<(u16, u32), usize> = HashMap::new();
    let mut ranked: Vec<(usize, usize, Prompt)> = Vec::new();
    for (order, h) in held.iter().enumerate() {
        if h.image {
            continue;
        }
        let end = match starts.get(&h.doc) {
            Some(s) => s
                .iter()
                .map(|&s| s as usize)
                .find(|&s| s > 0 && s <= chat_limit && s <= h.tokens.len()),
            None => (h.tokens.len() >= text_len).then_some(text_len),
        };
        let Some(end) = end else { continue };
        let rank = rank_in_group.entry((h.domain, h.group)).or_default();
        ranked.push((
            *rank,
            order,
            Prompt {
                chunk: h.chunk,
                domain: h.domain,
                doc: h.doc,
                after_user_turn: starts.contains_key(&h.doc),
                tokens: h.tokens[..end].to_vec(),
            },
        ));
        *rank += 1;
    }
    // One document per group before a group's second, in chunk order.
    ranked.sort_by_key(|&(rank, order, _)| (rank, order));
    for (_, _, prompt) in ranked {
        eligible.entry(prompt.domain).or_default().push(prompt);
    }
    // Domains take turns, within the job's token budget.
    let mut taken: BTreeMap<u16, Vec<Prompt>> = BTreeMap::new();
    let mut budget = MAX_PROMPT_TOKENS;
    for round in 0..p.per_domain as usize {
        for (&d, prompts) in &eligible {
            let Some(prompt) = prompts.get(round) else {
                continue;
            };
            if prompt.tokens.len() > budget {
                continue;
            }
            budget -= prompt.tokens.len();
            taken.entry(d).or_default().push(prompt.clone());
        }
    }
    let unprompted = (0..n_domains as u16)
        .filter(|d| !taken.contains_key(d))
        .map(|d| {
            let why = match eligible.contains_key(&d) {
                true => format!(
                    "the job's budget of {MAX_PROMPT_TOKENS} prompt tokens went to other domains"
                ),
                false => why_none(&held, starts, d, text_len, chat_limit),
            };
            (d, why)
        })
        .collect();
    GenerateJob {
        prompts: taken.into_values().flatten().collect(),
        new_tokens,
        noise_ubatch: p.noise_ubatch,
        unprompted,
    }
}

/// Every held-out document of `chunks`, in the order its first token
/// comes, with its first `cap` tokens read across the chunks it spans.
fn held_out_documents(chunks: &[Chunk], cap: usize) -> Vec<Held> {
    let mut held: Vec<Held> = Vec::new();
    let mut at: HashMap<u32, usize> = HashMap::new();
    for c in chunks {
        for s in c.spans.iter().filter(|s| s.split == Split::Heldout) {
            let i = *at.entry(s.doc).or_insert_with(|| {
                held.push(Held {
                    domain: s.domain,
                    group: s.group,
                    doc: s.doc,
                    chunk: c.id.0,
                    tokens: Vec::new(),
                    image: false,
                });
                held.len() - 1
            });
            let h = &mut held[i];
            h.image |= c.image_positions_in(s) > 0;
            let (start, end) = (s.start as usize, (s.start + s.len) as usize);
            let room = cap.saturating_sub(h.tokens.len());
            h.tokens
                .extend_from_slice(&c.tokens[start..end.min(start + room)]);
        }
    }
    held
}

/// Why domain `d` has no eligible document.
fn why_none(
    held: &[Held],
    starts: &HashMap<u32, Vec<u32>>,
    d: u16,
    text_len: usize,
    chat_limit: usize,
) -> String {
    let docs: Vec<&Held> = held.iter().filter(|h| h.domain == d).collect();
    if docs.is_empty() {
        return "no held-out text".into();
    }
    let mut why = Vec::new();
    let images = docs.iter().filter(|h| h.image).count();
    if images > 0 {
        why.push(format!(
            "{images} held-out document(s) carry images (the check continues text only)"
        ));
    }
    let (chat, text): (Vec<&&Held>, Vec<&&Held>) = docs
        .iter()
        .filter(|h| !h.image)
        .partition(|h| starts.contains_key(&h.doc));
    if !chat.is_empty() {
        why.push(format!(
            "no held-out conversation of {} has an assistant turn starting within its first \
             {chat_limit} tokens (the context less the new tokens)",
            chat.len()
        ));
    }
    if let Some(longest) = text.iter().map(|h| h.tokens.len()).max() {
        why.push(format!(
            "no held-out document has >= {text_len} tokens (half the context; the longest has \
             {longest})"
        ));
    }
    why.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::split::ChunkId;
    use runfiles::corpus::Span;

    /// Chunks of `n_ctx` packed from `(domain, group, split, tokens)`
    /// documents as the corpus packs them: in order, a document continued
    /// into the next chunk as a span of the same document.
    fn packed(docs: &[(u16, u32, Split, usize)], n_ctx: usize) -> Vec<Chunk> {
        let tokens: Vec<Vec<i32>> = docs
            .iter()
            .enumerate()
            .map(|(i, &(_, _, _, n))| (0..n as i32).map(|t| 1000 * i as i32 + t).collect())
            .collect();
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut cur: Chunk = Chunk {
            id: ChunkId(0),
            tokens: Vec::new(),
            spans: Vec::new(),
            images: Vec::new(),
        };
        for (i, (&(domain, group, split, _), t)) in docs.iter().zip(&tokens).enumerate() {
            let mut at = 0;
            while at < t.len() {
                let take = (n_ctx - cur.tokens.len()).min(t.len() - at);
                cur.spans.push(Span {
                    start: cur.tokens.len() as u32,
                    len: take as u32,
                    split,
                    domain,
                    doc: i as u32,
                    group,
                });
                cur.tokens.extend_from_slice(&t[at..at + take]);
                at += take;
                if cur.tokens.len() == n_ctx {
                    let next = Chunk {
                        id: ChunkId(cur.id.0 + 1),
                        tokens: Vec::new(),
                        spans: Vec::new(),
                        images: Vec::new(),
                    };
                    chunks.push(std::mem::replace(&mut cur, next));
                }
            }
        }
        if !cur.tokens.is_empty() {
            chunks.push(cur);
        }
        chunks
    }

    const PICK: Picking = Picking {
        per_domain: 2,
        n_ctx: 16,
        new_tokens: 4,
        noise_ubatch: 1,
    };

    #[test]
    fn prompts_start_at_documents_and_read_across_chunks() {
        let (h, f) = (Split::Heldout, Split::Fit);
        let chunks = packed(
            &[
                (0, 0, f, 20),
                // Held out, starting mid-chunk 1 and continued into chunk 2.
                (0, 1, h, 13),
                (0, 1, h, 9),
                (0, 2, h, 8),
                // Too short for a text prompt (8 tokens).
                (1, 3, h, 5),
            ],
            16,
        );
        let job = pick(&chunks, &HashMap::new(), 3, &PICK);
        assert_eq!((job.new_tokens, job.noise_ubatch), (4, 1));
        // Domain 0: one document per group first (doc 1 of group 1, doc 3
        // of group 2), not doc 2.
        let got: Vec<(u32, u16, u32, usize)> = job
            .prompts
            .iter()
            .map(|p| (p.chunk, p.domain, p.doc, p.tokens.len()))
            .collect();
        assert_eq!(got, [(1, 0, 1, 8), (2, 0, 3, 8)]);
        // Doc 1 starts at position 4 of chunk 1: its first 8 tokens.
        assert_eq!(job.prompts[0].tokens, (1000..1008).collect::<Vec<_>>());
        assert!(!job.prompts[0].after_user_turn);
        assert_eq!(
            job.unprompted[&1],
            "no held-out document has >= 8 tokens (half the context; the longest has 5)"
        );
        assert_eq!(job.unprompted[&2], "no held-out text");
        assert_eq!(job.unprompted.len(), 2);
    }

    #[test]
    fn a_chat_prompt_ends_at_an_assistant_turn_that_leaves_room() {
        let h = Split::Heldout;
        // A conversation of 30 tokens over two chunks of 16.
        let chunks = packed(&[(0, 0, h, 30), (1, 1, h, 12)], 16);
        // Doc 0: turns start at 5 and 11 (11 leaves 5 >= 4 for the
        // continuation, 13 would not; 5 is the first). Doc 1: only at 14,
        // past 16 - 4.
        let starts: HashMap<u32, Vec<u32>> = [(0, vec![5, 11]), (1, vec![14])].into();
        let job = pick(&chunks, &starts, 2, &PICK);
        assert_eq!(job.prompts.len(), 1);
        let p = &job.prompts[0];
        assert!(p.after_user_turn);
        assert_eq!(p.tokens, (0..5).collect::<Vec<_>>());
        assert!(job.unprompted[&1].contains("no held-out conversation of 1 has an assistant turn starting within its first 12 tokens"));
        let late: HashMap<u32, Vec<u32>> = [(0, vec![13, 20])].into();
        assert!(pick(&chunks, &late, 2, &PICK).unprompted.contains_key(&0));
    }

    #[test]
    fn no_prompts_no_job() {
        let chunks = packed(&[(0, 0, Split::Heldout, 30)], 16);
        let none = Picking {
            per_domain: 0,
            ..PICK
        };
        assert_eq!(
            pick(&chunks, &HashMap::new(), 1, &none),
            GenerateJob::default()
        );
    }

    #[test]
    fn documents_jsonl_gives_the_chat_documents_starts() {
        let jsonl = b"{\"at\":\"a:1\",\"tokens\":9}\n{\"at\":\"b:1\",\"assistant_starts\":[3,9]}\n{\"at\":\"c:1\",\"assistant_starts\":[]}\n";
        let s = assistant_starts(jsonl).unwrap();
        assert_eq!(s, [(1, vec![3, 9]), (2, vec![])].into());
        assert!(assistant_starts(b"{\"assistant_starts\": 3}\n").is_err());
    }
}
