//! The generation check (issue #44, #52): teacher-forced KL can miss what
//! a pruned model does when it generates (REAP's own finding), so each
//! candidate also continues held-out prompts greedily, and its tokens are
//! compared with the base model's continuation of the same prompt.
//!
//! The coordinator picks the prompts ([`GenerateJob`]): per domain, held-out
//! documents long enough, each prompt a document's first tokens or, in a
//! chat document, its tokens up to the start of an assistant turn (so the
//! models generate an assistant's answer); a document continued across
//! chunks is read across them. The worker whose lease holds the chunk
//! where a prompt's document starts decodes the prompt in the base model
//! and in every candidate and takes `new_tokens` greedy tokens from each
//! (the argmax, first of equal maxima, without stopping at an end token),
//! and records per candidate and prompt one [`Generation`]: the matched
//! prefix, the tokens before the first difference. Past that position the
//! two continuations no longer share a context, so nothing after it is
//! compared: token agreement counts positions up to and at the first
//! difference.
//!
//! A noise floor: the base model continues every prompt a second time with
//! its prompt decoded in micro-batches of another size
//! ([`GenerateJob::noise_ubatch`]), a change that should not matter; where
//! near-tied logits flip an argmax, the base model disagrees with itself,
//! and a candidate's figures read against that row.

use super::stats::{estimate, Interval};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One prompt of the generation check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    /// The chunk whose eval lease continues it: the chunk where its
    /// document starts.
    pub chunk: u32,
    /// Domain index of its document.
    pub domain: u16,
    /// Its document (its line in `corpus/documents.jsonl`).
    pub doc: u32,
    /// Whether it ends at an assistant turn's start (a chat document);
    /// otherwise it is the document's first tokens.
    pub after_user_turn: bool,
    /// Its tokens.
    pub tokens: Vec<i32>,
}

/// What the workers generate: the prompts (a prompt's id is its index),
/// the continuation's length and the noise floor's micro-batch. No
/// prompts: no generation check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerateJob {
    /// The prompts, by id.
    pub prompts: Vec<Prompt>,
    /// Greedy tokens generated after each prompt by each model.
    pub new_tokens: u32,
    /// Tokens per micro-batch of the base model's second decode of each
    /// prompt (the noise floor); 0: no noise floor.
    pub noise_ubatch: u32,
    /// Domains (by index) with held-out text but no prompt, and why.
    pub unprompted: BTreeMap<u16, String>,
}

impl GenerateJob {
    /// Whether the job generates anything.
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty() || self.new_tokens == 0
    }

    /// (new tokens, noise micro-batch) as every eval partial of the job
    /// records them: (0, 0) when the job generates nothing.
    pub fn settings(&self) -> (u32, u32) {
        match self.is_empty() {
            true => (0, 0),
            false => (self.new_tokens, self.noise_ubatch),
        }
    }

    /// The prompts (with their ids) continued by the lease of the chunks
    /// `holds` names; none when the job generates nothing.
    pub fn prompts_of(&self, holds: impl Fn(u32) -> bool) -> Vec<(u32, &Prompt)> {
        let all = if self.is_empty() {
            0
        } else {
            self.prompts.len()
        };
        self.prompts[..all]
            .iter()
            .enumerate()
            .filter(|(_, p)| holds(p.chunk))
            .map(|(i, p)| (i as u32, p))
            .collect()
    }
}

/// One model's greedy continuation of one prompt against the base
/// model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// Domain index of the prompt's document.
    pub domain: u16,
    /// Tokens of the prompt.
    pub prompt_tokens: u32,
    /// The matched prefix: generated tokens before the first position
    /// where the continuations differ (all of them when they never do).
    pub matched: u32,
}

impl Generation {
    /// Compares two continuations of a prompt of `prompt_tokens` tokens,
    /// position by position, up to the first difference.
    pub fn of(domain: u16, prompt_tokens: u32, base: &[i32], other: &[i32]) -> Generation {
        let matched = base.iter().zip(other).take_while(|(a, b)| a == b).count();
        Generation {
            domain,
            prompt_tokens,
            matched: matched as u32,
        }
    }

    /// Positions compared of continuations of `new_tokens`: every one up
    /// to and at the first difference (after it the two no longer share a
    /// context).
    pub fn compared(&self, new_tokens: u32) -> u32 {
        self.matched.saturating_add(1).min(new_tokens)
    }

    /// Whether the figures are possible for continuations of `new_tokens`:
    /// a prompt, and a matched prefix no longer than a continuation.
    pub fn check(&self, new_tokens: u32) -> Result<(), String> {
        match self.prompt_tokens > 0 && self.matched <= new_tokens {
            true => Ok(()),
            false => Err(format!(
                "generation figures (prompt of {} tokens, matched prefix {}) are impossible for {new_tokens} new tokens",
                self.prompt_tokens, self.matched
            )),
        }
    }
}

/// The generation check's figures over a set of prompts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationFigures {
    /// Prompts continued.
    pub prompts: u64,
    /// Mean matched prefix: generated tokens before the first difference
    /// (`new_tokens` for identical continuations).
    pub matched_prefix: f64,
    /// Its 95% interval, each prompt a cluster (n/a below two prompts).
    pub matched_prefix_ci: Interval,
    /// Prompts whose continuations are identical.
    pub identical: u64,
    /// Their share of the prompts.
    pub identical_share: f64,
    /// Token agreement up to and at the first difference: matched tokens
    /// over the positions compared ([`Generation::compared`]).
    pub agreement: f64,
}

impl GenerationFigures {
    /// The figures of `gens`, continuations of `new_tokens` each.
    pub fn of<'a>(gens: impl Iterator<Item = &'a Generation>, new_tokens: u32) -> Self {
        let gens: Vec<&Generation> = gens.collect();
        if gens.is_empty() {
            return GenerationFigures::default();
        }
        let prompts = gens.len() as u64;
        let clusters: Vec<(u64, f64)> = gens.iter().map(|g| (1, f64::from(g.matched))).collect();
        let (matched_prefix, matched_prefix_ci) = estimate(&clusters);
        let identical = gens.iter().filter(|g| g.matched >= new_tokens).count() as u64;
        let matched: u64 = gens.iter().map(|g| u64::from(g.matched)).sum();
        let compared: u64 = gens.iter().map(|g| u64::from(g.compared(new_tokens))).sum();
        GenerationFigures {
            prompts,
            matched_prefix,
            matched_prefix_ci,
            identical,
            identical_share: identical as f64 / prompts as f64,
            agreement: match compared {
                0 => 0.0,
                c => matched as f64 / c as f64,
            },
        }
    }
}

/// A model's generation check in `eval/summary.json`: over every prompt,
/// and per domain name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationSummary {
    /// Tokens of the shortest and the longest prompt.
    pub prompt_tokens: (u32, u32),
    /// Greedy tokens generated after each prompt.
    pub new_tokens: u32,
    /// Every prompt.
    pub all: GenerationFigures,
    /// Per domain name.
    pub domains: BTreeMap<String, GenerationFigures>,
}

impl GenerationSummary {
    /// The summary of a model's generations (by prompt id) of `new_tokens`
    /// each; `None` without any. `domains` names the domain indices.
    pub fn of(
        gens: &BTreeMap<u32, Generation>,
        new_tokens: u32,
        domains: &[String],
    ) -> Option<GenerationSummary> {
        let shortest = gens.values().map(|g| g.prompt_tokens).min()?;
        let longest = gens.values().map(|g| g.prompt_tokens).max()?;
        let mut by_domain: BTreeMap<u16, Vec<&Generation>> = BTreeMap::new();
        for g in gens.values() {
            by_domain.entry(g.domain).or_default().push(g);
        }
        let domains = by_domain
            .into_iter()
            .map(|(d, gs)| {
                let name = domains
                    .get(d as usize)
                    .cloned()
                    .unwrap_or_else(|| format!("domain {d}"));
                (name, GenerationFigures::of(gs.into_iter(), new_tokens))
            })
            .collect();
        Some(GenerationSummary {
            prompt_tokens: (shortest, longest),
            new_tokens,
            all: GenerationFigures::of(gens.values(), new_tokens),
            domains,
        })
    }
}

/// The noise floor in `eval/summary.json`: the base model's greedy
/// continuations with each prompt decoded in micro-batches of `n_ubatch`
/// against its own with the run's micro-batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationNoise {
    /// Tokens per micro-batch of the second decode.
    pub n_ubatch: u32,
    /// Its figures, as a candidate's.
    pub figures: GenerationSummary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matched_prefix_ends_at_the_first_difference() {
        let g = Generation::of(1, 9, &[5, 6, 7, 8], &[5, 6, 9, 8]);
        assert_eq!((g.domain, g.prompt_tokens, g.matched), (1, 9, 2));
        // Positions 0, 1 and the first difference at 2; position 3 agrees
        // again, but after a different token: not compared.
        assert_eq!(g.compared(4), 3);
        assert!(g.check(4).is_ok());
        let same = Generation::of(0, 3, &[1, 2, 3], &[1, 2, 3]);
        assert_eq!((same.matched, same.compared(3)), (3, 3));
        let at_once = Generation::of(0, 3, &[1, 2, 3], &[4, 2, 3]);
        assert_eq!((at_once.matched, at_once.compared(3)), (0, 1));
    }

    #[test]
    fn impossible_figures_are_refused() {
        for (prompt_tokens, matched) in [(4, 5), (0, 2)] {
            let g = Generation {
                domain: 0,
                prompt_tokens,
                matched,
            };
            assert!(g.check(4).is_err(), "{prompt_tokens} {matched}");
        }
    }

    #[test]
    fn figures_count_agreement_only_up_to_the_first_difference() {
        let base = [1, 2, 3, 4, 5, 6, 7, 8];
        let gens: BTreeMap<u32, Generation> = [
            // Identical: 8 matched of 8 compared.
            (0, Generation::of(0, 20, &base, &base)),
            // Differs at 2, then agrees again (4 of 8 positions agree, but
            // only 2 of the 3 compared count).
            (1, Generation::of(0, 12, &base, &[1, 2, 9, 4, 5, 9, 9, 9])),
            // Differs at 5: 5 of 6.
            (2, Generation::of(1, 30, &base, &[1, 2, 3, 4, 5, 0, 7, 8])),
            // Differs at once: 0 of 1.
            (3, Generation::of(1, 16, &base, &[0, 2, 3, 4, 5, 6, 7, 8])),
        ]
        .into();
        let names = ["english".to_string(), "code".to_string()];
        let s = GenerationSummary::of(&gens, 8, &names).unwrap();
        assert_eq!((s.prompt_tokens, s.new_tokens), ((12, 30), 8));
        assert_eq!((s.all.prompts, s.all.identical), (4, 1));
        assert_eq!(s.all.identical_share, 0.25);
        assert!((s.all.agreement - 15.0 / 18.0).abs() < 1e-12);
        // Matched prefixes 8, 2, 5, 0: mean 3.75, sample sd by hand
        // sqrt(((4.25)^2 + 1.75^2 + 1.25^2 + 3.75^2) / 3) = 3.5; the
        // interval is 3.75 +- t(0.975, 3) 3.5 / 2.
        assert!((s.all.matched_prefix - 3.75).abs() < 1e-12);
        let ci = s.all.matched_prefix_ci;
        assert_eq!(ci.clusters, 4);
        assert!((ci.se - 1.75).abs() < 1e-12, "{ci:?}");
        assert!((ci.lo - (3.75 - 3.1824 * 1.75)).abs() < 1e-9, "{ci:?}");
        assert!((ci.hi - (3.75 + 3.1824 * 1.75)).abs() < 1e-9, "{ci:?}");
        assert_eq!(s.domains["english"].prompts, 2);
        assert!((s.domains["english"].agreement - 10.0 / 11.0).abs() < 1e-12);
        assert!((s.domains["code"].agreement - 5.0 / 7.0).abs() < 1e-12);
        assert!(GenerationSummary::of(&BTreeMap::new(), 8, &names).is_none());
    }

    #[test]
    fn one_prompt_has_no_interval() {
        let gens: BTreeMap<u32, Generation> = [(0, Generation::of(0, 4, &[1, 2], &[1, 3]))].into();
        let s = GenerationSummary::of(&gens, 2, &["english".to_string()]).unwrap();
        assert_eq!(s.all.matched_prefix, 1.0);
        assert!(!s.all.matched_prefix_ci.known());
        assert_eq!(s.all.matched_prefix_ci.clusters, 1);
    }

    #[test]
    fn a_lease_continues_the_prompts_of_its_chunks() {
        let prompt = |chunk| Prompt {
            chunk,
            domain: 0,
            doc: chunk,
            after_user_turn: false,
            tokens: vec![1, 2],
        };
        let mut job = GenerateJob {
            prompts: vec![prompt(3), prompt(7), prompt(3)],
            new_tokens: 4,
            noise_ubatch: 1,
            unprompted: BTreeMap::new(),
        };
        let ids: Vec<u32> = job.prompts_of(|c| c < 5).iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, [0, 2]);
        assert_eq!(job.settings(), (4, 1));
        job.new_tokens = 0;
        assert!(job.prompts_of(|_| true).is_empty());
        assert_eq!(job.settings(), (0, 0));
    }
}
